// Dropout and bias-dropout-add (fused and unfused) with the CPU oracle's counter-based RNG
// (kernels/common/dropout_rng.h, the same functions the CPU runs), so masks are bit-identical to
// kernels/cpu/dropout.cpp: element i of a call is stream element offset + i.
//
// Each thread owns one PAIR of stream elements (one 64-bit hash, high half for the even element,
// low half for the odd one), as the CPU's loop does; pairs are counted from offset / 2, so with
// an odd offset the call's first element is the low half of the first pair.
// Values: kept = x * (1 / (1 - p)) and residual + that, each rounded once as on the CPU
// (__fmul_rn / __fadd_rn keep nvcc from contracting them into an FMA), so outputs are
// bit-identical too. The bias gradient of biasDropoutAddBackward is biasGradAccumulate's
// (deterministic, summation order differs from the CPU: see elementwise.cu).
#include "kernels/common/bf16.h"
#include "kernels/common/dropout_rng.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;

using detail::globalThread;
using detail::gridThreads;

// Number of stream pairs touched by elements offset .. offset + n - 1.
inline int64_t pairCount(int64_t n, uint64_t offset) { return (n + static_cast<int64_t>(offset & 1) + 1) / 2; }

// Calls apply(i, keep) for every element i < n of the call.
// The stream key comes from `seed` on the device (its step key is read when the kernel runs, so a
// captured graph draws each step's masks).
template <class Apply>
__global__ void dropoutPairsKernel(Apply apply, int64_t n, hd::DropoutSeed seed, uint64_t threshold,
                                   uint64_t offset) {
    const uint64_t key = hd::dropoutStreamKey(seed.value());
    const int64_t odd = static_cast<int64_t>(offset & 1);
    const int64_t pairs = (n + odd + 1) / 2;
    const uint64_t firstPair = offset >> 1;
    for (int64_t k = globalThread(); k < pairs; k += gridThreads()) {
        const uint64_t bits = hd::dropoutPairBits(key, firstPair + static_cast<uint64_t>(k));
        const int64_t i = 2 * k - odd;
        if (i >= 0) apply(i, hd::dropoutKeepHigh(bits, threshold));
        if (i + 1 < n) apply(i + 1, hd::dropoutKeepLow(bits, threshold));
    }
}

struct MaskOnly {
    uint8_t* mask;
    __device__ void operator()(int64_t i, bool keep) const { mask[i] = keep ? 1 : 0; }
};

// y = keep ? x * scale : 0 (y may alias x); mask optional.
struct DropoutApply {
    const float* x;
    float* y;
    uint8_t* mask;
    float scale;
    __device__ void operator()(int64_t i, bool keep) const {
        y[i] = keep ? __fmul_rn(x[i], scale) : 0.0f;
        if (mask) mask[i] = keep ? 1 : 0;
    }
};

// An output element as stored: its bf16 value under roundBf16.
__device__ inline float stored(float v, bool roundBf16) { return roundBf16 ? hd::bf16RoundFloat(v) : v; }

// out = residual + (keep ? (x + b[c]) * scale : 0); b optional, out may alias x or residual.
struct BiasDropoutAddApply {
    const float* x;
    const float* b;
    const float* residual;
    float* out;
    uint8_t* mask;
    float scale;
    int C;
    bool roundBf16;
    __device__ void operator()(int64_t i, bool keep) const {
        const float v = b ? __fadd_rn(x[i], b[i % C]) : x[i];
        out[i] = stored(__fadd_rn(residual[i], keep ? __fmul_rn(v, scale) : 0.0f), roundBf16);
        if (mask) mask[i] = keep ? 1 : 0;
    }
};

template <class Apply>
Status launchPairs(const Apply& apply, int64_t n, float p, hd::DropoutSeed seed, uint64_t offset, void* stream,
                   const char* what) {
    const int64_t pairs = pairCount(n, offset);
    dropoutPairsKernel<<<detail::blocksFor(pairs, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        apply, n, seed, hd::dropoutThreshold(p), offset);
    return detail::launchStatus(what);
}

// dx = mask ? dy * scale : 0.
__global__ void dropoutBackwardKernel(const float* dy, const uint8_t* __restrict__ mask, float* dx,
                                      int64_t n, float scale) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) dx[i] = mask[i] ? __fmul_rn(dy[i], scale) : 0.0f;
}

// p = 0 path of the fused op: out = residual + (x + b) (or residual + x).
__global__ void biasAddResidualKernel(const float* x, const float* b, const float* residual, float* out,
                                      int64_t n, int C, bool roundBf16) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) {
        const float v = b ? __fadd_rn(x[i], b[i % C]) : x[i];
        out[i] = stored(__fadd_rn(residual[i], v), roundBf16);
    }
}

// out = x + b per row (the unfused path's first pass).
__global__ void biasAddKernel(const float* x, const float* __restrict__ b, float* out, int64_t n, int C) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) out[i] = __fadd_rn(x[i], b[i % C]);
}

// cudaMemcpyDefault: the buffers may be managed memory (ranks sharing a GPU, cuda_share_gpus).
Status copyIfDistinct(float* dst, const float* src, int64_t n, void* stream, const char* what) {
    if (dst == src) return Status::ok();
    return detail::fromCuda(cudaMemcpyAsync(dst, src, sizeof(float) * n, cudaMemcpyDefault,
                                            detail::asStream(stream)),
                            what);
}

Status fillMaskOnes(uint8_t* mask, int64_t n, void* stream, const char* what) {
    if (!mask) return Status::ok();
    return detail::fromCuda(cudaMemsetAsync(mask, 1, static_cast<size_t>(n), detail::asStream(stream)), what);
}

}  // namespace

Status dropoutMask(uint8_t* mask, int64_t n, float p, hd::DropoutSeed seed, uint64_t offset, void* stream) {
    if (n < 0) return Status::invalid("dropoutMask: negative element count");
    if (n == 0) return Status::ok();
    return launchPairs(MaskOnly{mask}, n, p, seed, offset, stream, "dropoutMask launch");
}

Status dropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p, hd::DropoutSeed seed,
                      uint64_t offset, void* stream) {
    if (n < 0) return Status::invalid("dropoutForward: negative element count");
    if (n == 0) return Status::ok();
    if (!(p > 0.0f)) {
        TS_RETURN_IF_ERROR(copyIfDistinct(y, x, n, stream, "dropoutForward copy"));
        return fillMaskOnes(mask, n, stream, "dropoutForward mask");
    }
    return launchPairs(DropoutApply{x, y, mask, hd::dropoutKeepScale(p)}, n, p, seed, offset, stream,
                       "dropoutForward launch");
}

Status dropoutBackward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float p, void* stream) {
    if (n < 0) return Status::invalid("dropoutBackward: negative element count");
    if (n == 0) return Status::ok();
    // p == 0 keeps everything (a null mask only makes sense then), as on the CPU.
    if (!(p > 0.0f) || !mask) return copyIfDistinct(dx, dy, n, stream, "dropoutBackward copy");
    constexpr int threads = kThreads;
    dropoutBackwardKernel<<<detail::blocksFor(n, threads), threads, 0, detail::asStream(stream)>>>(
        dy, mask, dx, n, hd::dropoutKeepScale(p));
    return detail::launchStatus("dropoutBackward launch");
}

Status biasDropoutAddFused(const float* x, const float* b, const float* residual, float* out, uint8_t* mask,
                           int T, int C, float p, hd::DropoutSeed seed, uint64_t offset, bool roundBf16, void* stream) {
    if (T < 0 || C < 0) return Status::invalid("biasDropoutAddFused: need T >= 0 and C >= 0");
    const int64_t n = static_cast<int64_t>(T) * C;
    if (n == 0) return Status::ok();
    if (!(p > 0.0f)) {
        biasAddResidualKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
            x, b, residual, out, n, C, roundBf16);
        TS_RETURN_IF_ERROR(detail::launchStatus("biasDropoutAddFused launch"));
        return fillMaskOnes(mask, n, stream, "biasDropoutAddFused mask");
    }
    return launchPairs(BiasDropoutAddApply{x, b, residual, out, mask, hd::dropoutKeepScale(p), C, roundBf16}, n, p, seed,
                       offset, stream, "biasDropoutAddFused launch");
}

Status biasDropoutAddUnfused(const float* x, const float* b, const float* residual, float* out, uint8_t* mask,
                             int T, int C, float p, hd::DropoutSeed seed, uint64_t offset, void* stream) {
    if (T < 0 || C < 0) return Status::invalid("biasDropoutAddUnfused: need T >= 0 and C >= 0");
    const int64_t n = static_cast<int64_t>(T) * C;
    if (n == 0) return Status::ok();
    // Three passes, as the CPU's unfused path: bias add, dropout (in place), residual add.
    if (b) {
        biasAddKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(x, b, out, n, C);
        TS_RETURN_IF_ERROR(detail::launchStatus("biasDropoutAddUnfused bias launch"));
        TS_RETURN_IF_ERROR(dropoutForward(out, out, mask, n, p, seed, offset, stream));
    } else {
        TS_RETURN_IF_ERROR(dropoutForward(x, out, mask, n, p, seed, offset, stream));
    }
    return add(residual, out, out, n, stream);
}

Status biasDropoutAddBackward(const float* dout, const uint8_t* mask, float* dx, float* db, int T, int C,
                              float p, void* stream) {
    if (T < 0 || C < 0) return Status::invalid("biasDropoutAddBackward: need T >= 0 and C >= 0");
    TS_RETURN_IF_ERROR(dropoutBackward(dout, mask, dx, static_cast<int64_t>(T) * C, p, stream));
    if (db) return biasGradAccumulate(dx, db, T, C, stream);
    return Status::ok();
}

}  // namespace ts::kernels::cuda
