// LayerNorm forward: one warp per row (llm.c layernorm_forward_kernel3 layout), two passes
// over the row from L1/L2 for mean and biased variance, then normalize.
// x, y: [T, C]; w, b: [C] (b may be null); mean, rstd: [T].
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

__global__ void layerNormForwardKernel(const float* __restrict__ x, const float* __restrict__ w,
                                       const float* __restrict__ b, float* __restrict__ y,
                                       float* __restrict__ mean, float* __restrict__ rstd, int T,
                                       int C, float eps) {
    const int warpsPerBlock = blockDim.x / 32;
    const int row = blockIdx.x * warpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= T) return;
    const float* xr = x + static_cast<int64_t>(row) * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += xr[c];
    const float mu = detail::warpSum(s) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float d = xr[c] - mu;
        v += d * d;
    }
    const float rs = rsqrtf(detail::warpSum(v) / C + eps);
    float* yr = y + static_cast<int64_t>(row) * C;
    for (int c = lane; c < C; c += 32) {
        const float n = (xr[c] - mu) * rs;
        yr[c] = b ? n * w[c] + b[c] : n * w[c];
    }
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

}  // namespace

Status layerNormForward(const float* x, const float* w, const float* b, float* y, float* mean,
                        float* rstd, int T, int C, float eps, void* stream) {
    if (T < 0 || C <= 0) return Status::invalid("layerNormForward: need T >= 0 and C > 0");
    if (T == 0) return Status::ok();
    constexpr int kThreads = 256;
    const int rowsPerBlock = kThreads / 32;
    const int blocks = (T + rowsPerBlock - 1) / rowsPerBlock;
    layerNormForwardKernel<<<blocks, kThreads, 0, detail::asStream(stream)>>>(x, w, b, y, mean,
                                                                              rstd, T, C, eps);
    return detail::launchStatus("layerNormForward launch");
}

}  // namespace ts::kernels::cuda
