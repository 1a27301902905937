// FP8 emulation on CUDA (CPU oracle: kernels/cpu/fp8.cpp, fp8_block.cpp; REFERENCE.md §6.1,
// §6.4): amax, tensor-scaled quantize-dequantize, and block-scaled (MXFP8 1x32 with E8M0 scales,
// blockwise 1x128 and 128x128 with fp32 scales) quantize-dequantize along rows or columns.
//
// Codes, values and scales are bit-identical to the CPU's: the scalar conversions are the same
// TS_HD functions (kernels/common/fp8_scalar.h), every product feeding or leaving them is an
// explicitly rounded __fmul_rn (never contracted into an FMA) that lets a NaN input through
// with its sign as the CPU's multiply does (mulAsCpu), divisions are IEEE (nvcc's
// default -prec-div=true), denormals are kept (no -ftz), and the host computes the constants
// the CPU computes (1 / scale, 1 / fp8_max). A block's amax is a max, which does not depend on
// the order it is taken in. Dequantized NaNs match in NaN-ness, not payload (the GPU's NaN
// arithmetic returns its canonical NaN).
//
// Layout of the block kernels (x [rows, cols] row-major; y may alias x, so no __restrict__):
// - along rows (1x32, 1x128): one warp per block of a row, lanes stride the block;
// - along columns (1x32, 1x128): one thread per (row block, column), walking down the column,
//   so a warp reads 32 neighbouring columns of a row at a time;
// - 128x128 tiles: one thread block per tile.
// Scales in the CPU's order (fp8_block.h): along rows idx = r * ceil(cols / b) + cb, along
// columns idx = rb * cols + c, tiles idx = rb * ceil(cols / 128) + cb.
#include "kernels/common/fp8_scalar.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_codes.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <string>

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// x * q as the CPU computes it: an x86 or Arm multiply by a finite factor returns a NaN
// operand itself (quieted, sign kept), where the GPU returns its canonical NaN (sign clear); the
// sign of a NaN's FP8 code comes from it, so pass NaN through. q, scale are never NaN here
// (a NaN tensor scale would make the CPU's NaN differ as well; the values stay NaN either way).
__device__ inline float mulAsCpu(float x, float q) { return fp8s::isNaN(x) ? x : __fmul_rn(x, q); }

// |x| as bits: for non-negative floats the unsigned order is the float order, and every NaN
// (sign cleared) is above +inf, so an unsigned max propagates NaN in any order.
__device__ inline uint32_t absBits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

__device__ inline uint32_t warpMaxU(uint32_t v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ uint32_t blockMaxU(uint32_t v, uint32_t* sh) {
    v = warpMaxU(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    uint32_t m = sh[0];
    for (int i = 1; i < kWarps; ++i) m = max(m, sh[i]);
    return m;
}

// *amax (pre-zeroed) = max |x| over all blocks.
__global__ void amaxKernel(const float* __restrict__ x, int64_t n, uint32_t* amaxBits) {
    __shared__ uint32_t sh[kWarps];
    uint32_t m = 0;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        m = max(m, absBits(x[i]));
    m = blockMaxU(m, sh);
    if (threadIdx.x == 0 && m != 0) atomicMax(amaxBits, m);
}

__global__ void quantizeKernel(const float* x, float* y, uint8_t* codes, int64_t n, float scale,
                               float inv, fp8s::Fp8Rounder r) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float v = r.round(mulAsCpu(x[i], scale));
        if (codes) codes[i] = r.code(v);
        y[i] = __fmul_rn(v, inv);
    }
}

// The codes of a [rows, cols] matrix of FP8 values stored at `scale` (row stride ld) into y,
// [rows, cols] or transposed [cols, rows]: 32 x 32 tiles through shared memory, so that reads
// and writes both walk rows (a block of 32 x 8 threads, each taking 4 rows of its tile).
constexpr int kCastTile = 32, kCastRows = 8;
__global__ void castFp8CodesToFp8Kernel(const float* __restrict__ x, int64_t rows, int64_t cols, int64_t ld,
                                        bool transpose, fp8codes::Binding codes, fp8s::Fp8Rounder r,
                                        uint8_t* __restrict__ y) {
    __shared__ uint8_t tile[kCastTile][kCastTile + 4];
    const float scale = detail::codesScale(codes);
    const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kCastTile, c0 = static_cast<int64_t>(blockIdx.x) * kCastTile;
    for (int i = threadIdx.y; i < kCastTile; i += kCastRows) {
        const int64_t rr = r0 + i, cc = c0 + threadIdx.x;
        if (rr < rows && cc < cols) tile[i][threadIdx.x] = r.code(r.round(mulAsCpu(x[rr * ld + cc], scale)));
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kCastTile; i += kCastRows) {
        if (transpose) {  // y[c, r]: this thread writes row c0 + i, column r0 + threadIdx.x
            const int64_t cc = c0 + i, rr = r0 + threadIdx.x;
            if (rr < rows && cc < cols) y[cc * rows + rr] = tile[threadIdx.x][i];
        } else {
            const int64_t rr = r0 + i, cc = c0 + threadIdx.x;
            if (rr < rows && cc < cols) y[rr * cols + cc] = tile[i][threadIdx.x];
        }
    }
}

// What every block kernel needs besides the pointers.
struct BlockParams {
    int64_t rows, cols;
    int format;     // fp8s format number (Fp8Format)
    bool mx;        // MXFP8 (E8M0 scales) or blockwise (fp32 inverse scales)
    bool pow2;      // blockwise: scale rounded down to a power of two
    float fp8Max;   // 448 / 57344
    float invMax;   // 1 / fp8Max, as the CPU computes it
};

// The block's multiplier before encoding (q) and after decoding (dq), and its stored scale.
__device__ inline void blockScales(const BlockParams& p, uint32_t amaxBits, void* scales,
                                   int64_t idx, float& q, float& dq) {
    const float amax = __uint_as_float(amaxBits);
    if (p.mx) {
        const uint8_t e = fp8s::e8m0FromFloat(__fmul_rn(amax, p.invMax));
        q = fp8s::e8m0EncodeFactor(e);
        dq = fp8s::e8m0ToFloat(e);
        if (scales) static_cast<uint8_t*>(scales)[idx] = e;
    } else {
        q = fp8s::fp8BlockScale(amax, p.fp8Max, p.pow2);
        dq = __fdiv_rn(1.0f, q);
        if (scales) static_cast<float*>(scales)[idx] = dq;
    }
}

__device__ inline void quantizeOne(const float* x, float* y, uint8_t* codes, int64_t i, float q,
                                   float dq, int format) {
    const uint8_t code = fp8s::fp8Encode(mulAsCpu(x[i], q), format);
    if (codes) codes[i] = code;
    y[i] = __fmul_rn(fp8s::fp8Decode(code, format), dq);
}

// Along rows: one warp per block of `len` (32 or 128) consecutive elements of a row.
__global__ void quantizeBlockRowsKernel(const float* x, float* y, uint8_t* codes, void* scales,
                                        BlockParams p, int len) {
    const int64_t blocksPerRow = (p.cols + len - 1) / len;
    const int64_t total = p.rows * blocksPerRow;
    const int lane = threadIdx.x % 32;
    const int64_t warpStride = static_cast<int64_t>(gridDim.x) * kWarps;
    for (int64_t blk = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; blk < total;
         blk += warpStride) {
        const int64_t r = blk / blocksPerRow, cb = blk % blocksPerRow;
        const int64_t c0 = cb * len;
        const int64_t n = p.cols - c0 < len ? p.cols - c0 : len;
        const int64_t base = r * p.cols + c0;
        uint32_t m = 0;
        for (int64_t k = lane; k < n; k += 32) m = max(m, absBits(x[base + k]));
        m = warpMaxU(m);
        float q, dq;
        blockScales(p, m, lane == 0 ? scales : nullptr, blk, q, dq);
        for (int64_t k = lane; k < n; k += 32) quantizeOne(x, y, codes, base + k, q, dq, p.format);
    }
}

// Along columns: one thread per (row block, column), blocks of `len` rows.
__global__ void quantizeBlockColsKernel(const float* x, float* y, uint8_t* codes, void* scales,
                                        BlockParams p, int len) {
    const int64_t rowBlocks = (p.rows + len - 1) / len;
    const int64_t total = rowBlocks * p.cols;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += stride) {
        const int64_t rb = idx / p.cols, c = idx % p.cols;
        const int64_t r0 = rb * len;
        const int64_t r1 = p.rows < r0 + len ? p.rows : r0 + len;
        uint32_t m = 0;
        for (int64_t r = r0; r < r1; ++r) m = max(m, absBits(x[r * p.cols + c]));
        float q, dq;
        blockScales(p, m, scales, idx, q, dq);
        for (int64_t r = r0; r < r1; ++r) quantizeOne(x, y, codes, r * p.cols + c, q, dq, p.format);
    }
}

// 128x128 tiles: one thread block per tile (tiles grid-strided).
__global__ void quantizeBlockTilesKernel(const float* x, float* y, uint8_t* codes, void* scales,
                                         BlockParams p) {
    constexpr int kTile = 128;
    __shared__ uint32_t sh[kWarps];
    const int64_t tileRows = (p.rows + kTile - 1) / kTile;
    const int64_t tileCols = (p.cols + kTile - 1) / kTile;
    const int64_t total = tileRows * tileCols;
    for (int64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const int64_t r0 = (tile / tileCols) * kTile, c0 = (tile % tileCols) * kTile;
        const int h = static_cast<int>(p.rows - r0 < kTile ? p.rows - r0 : kTile);
        const int w = static_cast<int>(p.cols - c0 < kTile ? p.cols - c0 : kTile);
        const int n = h * w;
        uint32_t m = 0;
        for (int k = threadIdx.x; k < n; k += kThreads)
            m = max(m, absBits(x[(r0 + k / w) * p.cols + c0 + k % w]));
        m = blockMaxU(m, sh);  // every thread has read its elements before anyone writes y
        float q, dq;
        blockScales(p, m, threadIdx.x == 0 ? scales : nullptr, tile, q, dq);
        for (int k = threadIdx.x; k < n; k += kThreads)
            quantizeOne(x, y, codes, (r0 + k / w) * p.cols + c0 + k % w, q, dq, p.format);
    }
}

int gridCap(int64_t work, int per) {
    const int64_t b = (work + per - 1) / per;
    constexpr int64_t kCap = 1 << 20;
    return static_cast<int>(b < 1 ? 1 : (b > kCap ? kCap : b));
}

}  // namespace

Status amaxOf(const float* x, int64_t n, float* amax, void* stream) {
    if (n < 0) return Status::invalid("amaxOf: n < 0 (got " + std::to_string(n) + ")");
    cudaStream_t s = detail::asStream(stream);
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMemsetAsync(amax, 0, sizeof(float), s), "amaxOf memset"));
    if (n == 0) return Status::ok();
    const int blocks = detail::blocksFor(n, kThreads, 4096);
    amaxKernel<<<blocks, kThreads, 0, s>>>(x, n, reinterpret_cast<uint32_t*>(amax));
    return detail::launchStatus("amaxOf");
}

namespace {
// The scale from the device amax, computed by every thread as the CPU computes it once.
__global__ void quantizeCurrentKernel(const float* x, float* y, uint8_t* codes, int64_t n, const float* amax,
                                      float divisor, float fp8Max, float* observed, fp8s::Fp8Rounder r) {
    const float a = __fdiv_rn(*amax, divisor);
    const float scale = fp8s::currentScaleDivided(*amax, divisor, fp8Max), inv = __fdiv_rn(1.0f, scale);
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (observed && first == 0) *observed = a;
    for (int64_t i = first; i < n; i += stride) {
        const float v = r.round(mulAsCpu(x[i], scale));
        if (codes) codes[i] = r.code(v);
        y[i] = __fmul_rn(v, inv);
    }
}

// Delayed scaling: the step's scale from the device, divided by every thread as the CPU divides it once.
__global__ void quantizeDelayedKernel(const float* x, float* y, uint8_t* codes, int64_t n, const float* scaleAt,
                                      float divisor, fp8s::Fp8Rounder r) {
    const float scale = __fdiv_rn(*scaleAt, divisor), inv = __fdiv_rn(1.0f, scale);
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = r.round(mulAsCpu(x[i], scale));
        if (codes) codes[i] = r.code(v);
        y[i] = __fmul_rn(v, inv);
    }
}

__global__ void amaxCombineKernel(const float* amax, float divisor, float* slot) {
    const float a = __fdiv_rn(*amax, divisor), s = *slot;
    *slot = (isnan(a) || isnan(s)) ? __int_as_float(0x7fc00000) : fmaxf(s, a);
}
}  // namespace

Status fp8QuantizeCurrent(const float* x, float* y, uint8_t* codes, int64_t n, const float* amax, float divisor,
                          Fp8Format f, float* observed, void* stream) {
    if (n < 0) return Status::invalid("fp8QuantizeCurrent: n < 0 (got " + std::to_string(n) + ")");
    const fp8s::Fp8Rounder r = fp8s::Fp8Rounder::make(static_cast<int>(f));
    const float mx = fp8s::fp8MaxOf(static_cast<int>(f));
    // at least one thread (the observed write) even for n = 0
    quantizeCurrentKernel<<<detail::blocksFor(n > 0 ? n : 1, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        x, y, codes, n, amax, divisor, mx, observed, r);
    return detail::launchStatus("fp8QuantizeCurrent");
}

Status fp8QuantizeDelayed(const float* x, float* y, uint8_t* codes, int64_t n, const float* scale, float divisor,
                          Fp8Format f, void* stream) {
    if (n < 0) return Status::invalid("fp8QuantizeDelayed: n < 0 (got " + std::to_string(n) + ")");
    if (n == 0) return Status::ok();
    const fp8s::Fp8Rounder r = fp8s::Fp8Rounder::make(static_cast<int>(f));
    quantizeDelayedKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        x, y, codes, n, scale, divisor, r);
    return detail::launchStatus("fp8QuantizeDelayed");
}

Status amaxAccumulate(const float* x, int64_t n, float divisor, float* slot, void* stream) {
    if (n < 0) return Status::invalid("amaxAccumulate: n < 0 (got " + std::to_string(n) + ")");
    cudaStream_t s = detail::asStream(stream);
    void* scratch = nullptr;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMallocAsync(&scratch, sizeof(float), s), "amaxAccumulate scratch"));
    const Status amax = amaxOf(x, n, static_cast<float*>(scratch), stream);
    if (amax.isOk()) amaxCombineKernel<<<1, 1, 0, s>>>(static_cast<const float*>(scratch), divisor, slot);
    const Status launched = amax.isOk() ? detail::launchStatus("amaxAccumulate") : amax;
    const Status freed = detail::fromCuda(cudaFreeAsync(scratch, s), "amaxAccumulate scratch (cudaFreeAsync)");
    return launched.isOk() ? freed : launched;
}

Status fp8QuantizeDequantize(const float* x, float* y, uint8_t* codes, int64_t n, float scale,
                             Fp8Format f, void* stream) {
    if (n < 0) return Status::invalid("fp8QuantizeDequantize: n < 0 (got " + std::to_string(n) + ")");
    if (n == 0) return Status::ok();
    const float inv = 1.0f / scale;  // on the host, as the CPU does
    const fp8s::Fp8Rounder r = fp8s::Fp8Rounder::make(static_cast<int>(f));
    quantizeKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        x, y, codes, n, scale, inv, r);
    return detail::launchStatus("fp8QuantizeDequantize");
}

Status fp8CodesToFp8(const float* x, int64_t rows, int64_t cols, int64_t ld, bool transpose,
                     fp8codes::Binding codes, uint8_t* y, void* stream) {
    if (rows < 0 || cols < 0 || ld < cols)
        return Status::invalid("fp8CodesToFp8: need rows, cols >= 0 and ld >= cols (got " + std::to_string(rows) +
                               " x " + std::to_string(cols) + ", ld " + std::to_string(ld) + ")");
    if (!fp8codes::hasCodes(codes))
        return Status::invalid("fp8CodesToFp8: the operand is not bound as FP8 codes at a scale");
    if (rows == 0 || cols == 0) return Status::ok();
    if ((rows + kCastTile - 1) / kCastTile > 65535)
        return Status::invalid("fp8CodesToFp8: " + std::to_string(rows) + " rows, more than the grid takes");
    const dim3 grid(static_cast<unsigned>((cols + kCastTile - 1) / kCastTile),
                    static_cast<unsigned>((rows + kCastTile - 1) / kCastTile));
    castFp8CodesToFp8Kernel<<<grid, dim3(kCastTile, kCastRows), 0, detail::asStream(stream)>>>(
        x, rows, cols, ld, transpose, codes, fp8s::Fp8Rounder::make(codes.format), y);
    return detail::launchStatus("fp8CodesToFp8");
}

Status fp8BlockQuantizeDequantize(const float* x, float* y, uint8_t* codes, void* scales,
                                  int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows,
                                  Fp8Format f, bool pow2, void* stream) {
    if (rows < 0 || cols < 0)
        return Status::invalid("fp8BlockQuantizeDequantize: need rows, cols >= 0 (got " +
                               std::to_string(rows) + " x " + std::to_string(cols) + ")");
    if (rows == 0 || cols == 0) return Status::ok();
    BlockParams p;
    p.rows = rows;
    p.cols = cols;
    p.format = static_cast<int>(f);
    p.mx = kind == Fp8BlockKind::Mx1x32;
    p.pow2 = pow2;
    p.fp8Max = fp8s::fp8MaxOf(p.format);
    p.invMax = 1.0f / p.fp8Max;
    cudaStream_t s = detail::asStream(stream);
    const int len = kind == Fp8BlockKind::Mx1x32 ? 32 : 128;
    if (kind == Fp8BlockKind::Block128x128) {
        const int64_t tiles = ((rows + 127) / 128) * ((cols + 127) / 128);
        quantizeBlockTilesKernel<<<gridCap(tiles, 1), kThreads, 0, s>>>(x, y, codes, scales, p);
    } else if (alongRows) {
        const int64_t blocks = rows * ((cols + len - 1) / len);
        quantizeBlockRowsKernel<<<gridCap(blocks, kWarps), kThreads, 0, s>>>(x, y, codes, scales, p, len);
    } else {
        const int64_t threads = ((rows + len - 1) / len) * cols;
        quantizeBlockColsKernel<<<gridCap(threads, kThreads), kThreads, 0, s>>>(x, y, codes, scales, p,
                                                                                len);
    }
    return detail::launchStatus("fp8BlockQuantizeDequantize");
}

}  // namespace ts::kernels::cuda
