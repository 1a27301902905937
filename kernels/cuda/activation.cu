// Bias + tanh-GeLU (Megatron bias_gelu, fused and unfused) and SwiGLU, forward and backward, as
// kernels/cpu/activation.cpp. Grid-stride elementwise kernels; x, y: [T, C], b: [C] or null.
//
// Same formulas as the CPU: gelu(u) = u * sigmoid(2z), z = k0 u (1 + k1 u^2) (the tanh form
// 0.5 u (1 + tanh(z)) rewritten; no 1 + tanh cancellation for negative u), with the CPU's limits:
// the exp argument clamped to [-80, 80], sigmoid exactly 0 where 2z < -80 (so gelu = -0 below
// u ~ -10.4, gelu(-inf) = NaN), the derivative exactly 1 where 2z > 80 and 0 where 2z < -80; NaN
// propagates. SwiGLU: silu(g) = g / (1 + exp(-g)).
// What differs from the CPU: exp is CUDA's expf (~1 ulp) where the CPU uses its vectorizable
// Cephes polynomial (~2 ulp), and nvcc may contract a*b+c into FMAs, so values agree to a few
// ulp, not bitwise. The bias gradient is biasGradAccumulate's (deterministic, summation order
// differs from the CPU's: see elementwise.cu).
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kK0 = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kK1 = 0.044715f;

using detail::globalThread;
using detail::gridThreads;

// exp with the argument clamped to [-80, 80]; the selects (not fminf/fmaxf) keep NaN.
__device__ inline float expClamped80(float x) {
    float xc = x < -80.0f ? -80.0f : x;
    xc = xc > 80.0f ? 80.0f : xc;
    return expf(xc);
}

__device__ inline float gelu(float u) {
    const float z2 = 2.0f * (kK0 * u * (1.0f + kK1 * u * u));
    const float sg = 1.0f / (1.0f + expClamped80(-z2));
    return u * (z2 < -80.0f ? 0.0f : sg);
}

// d gelu / du = sg + u sg (1 - sg) dz2/du with 1 - sg = sg exp(-2z) (no cancellation).
__device__ inline float geluGrad(float u) {
    const float z2 = 2.0f * (kK0 * u * (1.0f + kK1 * u * u));
    const float e = expClamped80(-z2);
    const float sg = 1.0f / (1.0f + e);
    float g = sg + u * (sg * (e * sg)) * (2.0f * kK0 + (6.0f * kK0 * kK1) * u * u);
    g = z2 > 80.0f ? 1.0f : g;
    return z2 < -80.0f ? 0.0f : g;
}

// Overflow of exp(-z) to inf gives sigmoid 0, as the CPU's expApprox; NaN propagates.
__device__ inline float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// An output element as stored: its bf16 value under roundBf16.
__device__ inline float stored(float v, bool roundBf16) { return roundBf16 ? hd::bf16RoundFloat(v) : v; }

// y = gelu(x + b); n = T * C, b may be null; y may alias x.
__global__ void biasGeluKernel(const float* x, const float* __restrict__ b, float* y, int64_t n, int C,
                               bool roundBf16) {
    for (int64_t i = globalThread(); i < n; i += gridThreads())
        y[i] = stored(gelu(b ? x[i] + b[i % C] : x[i]), roundBf16);
}

// Unfused passes: y = x + b, then y = gelu(y) in place.
__global__ void biasAddKernel(const float* x, const float* __restrict__ b, float* y, int64_t n, int C) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = x[i] + b[i % C];
}

__global__ void geluInPlaceKernel(float* y, int64_t n) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = gelu(y[i]);
}

// dx = dy * gelu'(x + b); dx may alias dy.
__global__ void biasGeluBackwardKernel(const float* dy, const float* __restrict__ x,
                                       const float* __restrict__ b, float* dx, int64_t n, int C) {
    for (int64_t i = globalThread(); i < n; i += gridThreads())
        dx[i] = dy[i] * geluGrad(b ? x[i] + b[i % C] : x[i]);
}

// x: [T, 2F] rows of [gate(F) | up(F)], y: [T, F]; n = T * F.
__global__ void swigluForwardKernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, int F,
                                    bool roundBf16) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) {
        const int64_t t = i / F, f = i % F;
        const float g = x[t * 2 * F + f], u = x[t * 2 * F + F + f];
        y[i] = stored(g * sigmoid(g) * u, roundBf16);
    }
}

// dgate = dy * up * sig * (1 + g (1 - sig)), dup = dy * silu(g); dx: [T, 2F].
__global__ void swigluBackwardKernel(const float* __restrict__ dy, const float* __restrict__ x,
                                     float* __restrict__ dx, int64_t n, int F) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) {
        const int64_t t = i / F, f = i % F;
        const int64_t gi = t * 2 * F + f;
        const float g = x[gi], u = x[gi + F], d = dy[i];
        const float sg = sigmoid(g);
        dx[gi] = d * u * sg * (1.0f + g * (1.0f - sg));
        dx[gi + F] = d * g * sg;
    }
}

Status checkShape(int T, int C, const char* what) {
    if (T < 0 || C < 0) return Status::invalid(std::string(what) + ": need T >= 0 and C >= 0");
    return Status::ok();
}

}  // namespace

Status biasGeluForward(const float* x, const float* b, float* y, int T, int C, bool roundBf16, void* stream) {
    TS_RETURN_IF_ERROR(checkShape(T, C, "biasGeluForward"));
    const int64_t n = static_cast<int64_t>(T) * C;
    if (n == 0) return Status::ok();
    biasGeluKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(x, b, y, n, C,
                                                                                            roundBf16);
    return detail::launchStatus("biasGeluForward launch");
}

Status biasGeluForwardUnfused(const float* x, const float* b, float* y, int T, int C, void* stream) {
    TS_RETURN_IF_ERROR(checkShape(T, C, "biasGeluForwardUnfused"));
    const int64_t n = static_cast<int64_t>(T) * C;
    if (n == 0) return Status::ok();
    cudaStream_t s = detail::asStream(stream);
    if (!b) {
        biasGeluKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, s>>>(x, nullptr, y, n, C, false);
        return detail::launchStatus("biasGeluForwardUnfused launch");
    }
    biasAddKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, s>>>(x, b, y, n, C);
    TS_RETURN_IF_ERROR(detail::launchStatus("biasGeluForwardUnfused bias launch"));
    geluInPlaceKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, s>>>(y, n);
    return detail::launchStatus("biasGeluForwardUnfused gelu launch");
}

Status biasGeluBackward(const float* dy, const float* x, const float* b, float* dx, float* db, int T, int C,
                        void* stream) {
    TS_RETURN_IF_ERROR(checkShape(T, C, "biasGeluBackward"));
    const int64_t n = static_cast<int64_t>(T) * C;
    if (n == 0) return Status::ok();
    biasGeluBackwardKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        dy, x, b, dx, n, C);
    TS_RETURN_IF_ERROR(detail::launchStatus("biasGeluBackward launch"));
    if (db) return biasGradAccumulate(dx, db, T, C, stream);
    return Status::ok();
}

Status swigluForward(const float* x, float* y, int T, int F, bool roundBf16, void* stream) {
    TS_RETURN_IF_ERROR(checkShape(T, F, "swigluForward"));
    const int64_t n = static_cast<int64_t>(T) * F;
    if (n == 0) return Status::ok();
    swigluForwardKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(x, y, n, F,
                                                                                                 roundBf16);
    return detail::launchStatus("swigluForward launch");
}

Status swigluBackward(const float* dy, const float* x, float* dx, int T, int F, void* stream) {
    TS_RETURN_IF_ERROR(checkShape(T, F, "swigluBackward"));
    const int64_t n = static_cast<int64_t>(T) * F;
    if (n == 0) return Status::ok();
    swigluBackwardKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        dy, x, dx, n, F);
    return detail::launchStatus("swigluBackward launch");
}

}  // namespace ts::kernels::cuda
