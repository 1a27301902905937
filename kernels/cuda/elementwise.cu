// Elementwise helpers of ops_cuda.h: add, addInPlace, scale, addBias, biasGradAccumulate, and the
// reductions whose CPU versions return a value (sumSquares, allFinite, countInvalidIds), which
// write it to a device scalar here instead (nothing synchronizes).
//
// What differs from the CPU oracle (kernels/cpu/elementwise.cpp) and why:
// - add, addInPlace, scale, addBias: one rounding per element, so bit-identical.
// - biasGradAccumulate: each block owns 32 columns; its 32 row lanes sum every 32nd row, then one
//   thread per column adds the 32 lane sums in lane order and does db[c] += total. Deterministic
//   (the order depends only on T and C), but not the CPU's row-by-row order: equal within float
//   summation error. Used by the bias gradients of activation.cu and dropout.cu too.
// - sumSquares: double accumulation as the CPU, in a fixed grid (the block count depends only on
//   n) plus a second one-block pass over the block partials (scratch from the stream-ordered
//   allocator), so it is deterministic; the order differs from the CPU's 8-lane loop (equal to
//   ~1e-15 relative).
// - allFinite, countInvalidIds: exact (flags and integer counts).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;

using detail::globalThread;
using detail::gridThreads;

// a, b, y: [n]; y may alias a or b.
__global__ void elementwiseAddKernel(const float* a, const float* b, float* y, int64_t n) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = __fadd_rn(a[i], b[i]);
}

__global__ void elementwiseAddInPlaceKernel(float* y, const float* x, int64_t n) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void scaleKernel(float* __restrict__ y, float alpha, int64_t n) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = __fmul_rn(y[i], alpha);
}

// y: [T, C] += b[C] per row; n = T * C.
__global__ void addBiasKernel(float* __restrict__ y, const float* __restrict__ b, int64_t n, int C) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = __fadd_rn(y[i], b[i % C]);
}

// db[c] += sum_t dy[t, c]. Block (32, kColLanes): threadIdx.x picks the column inside the block's
// 32 (coalesced 128-byte rows), threadIdx.y the row lane.
constexpr int kColLanes = 32;
__global__ void columnSumReduceKernel(const float* __restrict__ dy, float* __restrict__ db, int T, int C) {
    __shared__ float part[kColLanes][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < C)
        for (int t = threadIdx.y; t < T; t += kColLanes) s += dy[static_cast<int64_t>(t) * C + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int l = 0; l < kColLanes; ++l) total += part[l][threadIdx.x];
        db[c] += total;
    }
}

// Block sum of a double (blockDim.x a multiple of 32, at most 1024); the result is valid in
// thread 0. Fixed shuffle tree, so deterministic.
__device__ double blockSumDouble(double v) {
    __shared__ double warpSums[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warpSums[warp] = v;
    __syncthreads();
    const int warps = blockDim.x / 32;
    if (warp == 0) {
        v = lane < warps ? warpSums[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

// Per-block partial sums of x^2 in double; out[blockIdx.x] (out = the result when gridDim is 1).
__global__ void sumSquaresReduceKernel(const float* __restrict__ x, int64_t n, double* __restrict__ out) {
    double acc = 0.0;
    for (int64_t i = globalThread(); i < n; i += gridThreads()) {
        const double v = x[i];
        acc += v * v;
    }
    acc = blockSumDouble(acc);
    if (threadIdx.x == 0) out[blockIdx.x] = acc;
}

// One block: *sum = sum of partial[0..count) (count <= blockDim.x).
__global__ void sumPartialsReduceKernel(const double* __restrict__ partial, int count, double* __restrict__ sum) {
    double v = static_cast<int>(threadIdx.x) < count ? partial[threadIdx.x] : 0.0;
    v = blockSumDouble(v);
    if (threadIdx.x == 0) *sum = v;
}

__global__ void fillIntKernel(int* p, int value) { *p = value; }

// *acc += *v; *accAsFloat = float(*acc) when set.
__global__ void sumSquaresTotalReduceKernel(const double* __restrict__ v, double* __restrict__ acc,
                                            float* __restrict__ accAsFloat) {
    const double a = __dadd_rn(*acc, *v);
    *acc = a;
    if (accAsFloat) *accAsFloat = static_cast<float>(a);
}

// Every thread that sees a non-finite element stores 0 (same value: a benign race).
__global__ void allFiniteReduceKernel(const float* __restrict__ x, int64_t n, int* __restrict__ finite) {
    bool bad = false;
    for (int64_t i = globalThread(); i < n; i += gridThreads()) bad |= !isfinite(x[i]);
    if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) *finite = 0;
}

// *invalid (zeroed before) += number of ids outside [0, vocabSize); integer atomics, so exact.
__global__ void countInvalidIdsReduceKernel(const int32_t* __restrict__ ids, int T, int vocabSize,
                                            int* __restrict__ invalid) {
    int bad = 0;
    for (int64_t t = globalThread(); t < T; t += gridThreads())
        bad += (ids[t] < 0 || ids[t] >= vocabSize) ? 1 : 0;
    for (int o = 16; o > 0; o >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, o);
    if (threadIdx.x % 32 == 0 && bad) atomicAdd(invalid, bad);
}

// Grid for sumSquares: a function of n only (never of the device), so the result is
// reproducible across GPUs; at most kSumMaxBlocks (the one-block second pass).
constexpr int kSumThreads = 256;
constexpr int kSumMaxBlocks = 1024;
constexpr int64_t kSumPerThread = 16;

// Block partials into `partial`, then one block adds them into *sum.
Status sumSquaresTwoPass(const float* x, int64_t n, int blocks, double* partial, double* sum, cudaStream_t s) {
    sumSquaresReduceKernel<<<blocks, kSumThreads, 0, s>>>(x, n, partial);
    TS_RETURN_IF_ERROR(detail::launchStatus("sumSquares launch"));
    sumPartialsReduceKernel<<<1, kSumMaxBlocks, 0, s>>>(partial, blocks, sum);
    return detail::launchStatus("sumSquares final launch");
}

}  // namespace

Status add(const float* a, const float* b, float* y, int64_t n, void* stream) {
    if (n < 0) return Status::invalid("add: negative element count");
    if (n == 0) return Status::ok();
    elementwiseAddKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(a, b, y, n);
    return detail::launchStatus("add launch");
}

Status addInPlace(float* y, const float* x, int64_t n, void* stream) {
    if (n < 0) return Status::invalid("addInPlace: negative element count");
    if (n == 0) return Status::ok();
    elementwiseAddInPlaceKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(y, x, n);
    return detail::launchStatus("addInPlace launch");
}

Status scale(float* y, float alpha, int64_t n, void* stream) {
    if (n < 0) return Status::invalid("scale: negative element count");
    if (n == 0) return Status::ok();
    scaleKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(y, alpha, n);
    return detail::launchStatus("scale launch");
}

Status addBias(float* y, const float* b, int T, int C, void* stream) {
    if (T < 0 || C < 0) return Status::invalid("addBias: need T >= 0 and C >= 0");
    const int64_t n = static_cast<int64_t>(T) * C;
    if (n == 0) return Status::ok();
    addBiasKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(y, b, n, C);
    return detail::launchStatus("addBias launch");
}

Status biasGradAccumulate(const float* dy, float* db, int T, int C, void* stream) {
    if (T < 0 || C < 0) return Status::invalid("biasGradAccumulate: need T >= 0 and C >= 0");
    if (T == 0 || C == 0) return Status::ok();
    const dim3 block(32, kColLanes);
    columnSumReduceKernel<<<(C + 31) / 32, block, 0, detail::asStream(stream)>>>(dy, db, T, C);
    return detail::launchStatus("biasGradAccumulate launch");
}

Status sumSquares(const float* x, int64_t n, double* sum, void* stream) {
    if (n < 0) return Status::invalid("sumSquares: negative element count");
    if (!sum) return Status::invalid("sumSquares: null result pointer");
    cudaStream_t s = detail::asStream(stream);
    if (n == 0) return detail::fromCuda(cudaMemsetAsync(sum, 0, sizeof(double), s), "sumSquares zero");
    const int64_t want = (n + kSumThreads * kSumPerThread - 1) / (kSumThreads * kSumPerThread);
    const int blocks = static_cast<int>(want < kSumMaxBlocks ? want : kSumMaxBlocks);
    if (blocks == 1) {
        sumSquaresReduceKernel<<<1, kSumThreads, 0, s>>>(x, n, sum);
        return detail::launchStatus("sumSquares launch");
    }
    void* partial = nullptr;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMallocAsync(&partial, sizeof(double) * blocks, s),
                                        "sumSquares scratch (cudaMallocAsync)"));
    const Status st = sumSquaresTwoPass(x, n, blocks, static_cast<double*>(partial), sum, s);
    const Status freed = detail::fromCuda(cudaFreeAsync(partial, s), "sumSquares scratch (cudaFreeAsync)");
    return st.isOk() ? freed : st;
}

Status sumSquaresAccumulate(const float* x, int64_t n, double* acc, float* accAsFloat, void* stream) {
    if (n < 0) return Status::invalid("sumSquaresAccumulate: negative element count");
    if (!acc) return Status::invalid("sumSquaresAccumulate: null accumulator");
    cudaStream_t s = detail::asStream(stream);
    void* sum = nullptr;
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMallocAsync(&sum, sizeof(double), s),
                                        "sumSquaresAccumulate scratch (cudaMallocAsync)"));
    Status st = sumSquares(x, n, static_cast<double*>(sum), stream);
    if (st.isOk()) {
        sumSquaresTotalReduceKernel<<<1, 1, 0, s>>>(static_cast<const double*>(sum), acc, accAsFloat);
        (void)(st = detail::launchStatus("sumSquaresAccumulate launch"));  // (nvcc warns on a bare assignment of a nodiscard type)
    }
    const Status freed = detail::fromCuda(cudaFreeAsync(sum, s), "sumSquaresAccumulate scratch (cudaFreeAsync)");
    return st.isOk() ? freed : st;
}

Status allFinite(const float* x, int64_t n, int* finite, void* stream) {
    if (n < 0) return Status::invalid("allFinite: negative element count");
    if (!finite) return Status::invalid("allFinite: null result pointer");
    cudaStream_t s = detail::asStream(stream);
    fillIntKernel<<<1, 1, 0, s>>>(finite, 1);
    TS_RETURN_IF_ERROR(detail::launchStatus("allFinite init launch"));
    if (n == 0) return Status::ok();
    allFiniteReduceKernel<<<detail::blocksFor(n, kThreads, 4096), kThreads, 0, s>>>(x, n, finite);
    return detail::launchStatus("allFinite launch");
}

Status countInvalidIds(const int32_t* ids, int T, int vocabSize, int* invalid, void* stream) {
    if (T < 0) return Status::invalid("countInvalidIds: negative token count");
    if (!invalid) return Status::invalid("countInvalidIds: null result pointer");
    cudaStream_t s = detail::asStream(stream);
    TS_RETURN_IF_ERROR(detail::fromCuda(cudaMemsetAsync(invalid, 0, sizeof(int), s), "countInvalidIds zero"));
    if (T == 0) return Status::ok();
    countInvalidIdsReduceKernel<<<detail::blocksFor(T, kThreads, 1024), kThreads, 0, s>>>(ids, T, vocabSize, invalid);
    return detail::launchStatus("countInvalidIds launch");
}

}  // namespace ts::kernels::cuda
