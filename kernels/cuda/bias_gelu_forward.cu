// Bias + tanh-GeLU forward (Megatron bias_gelu): y = 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715
// u^3))), u = x + b. Grid-stride elementwise kernel; x, y: [T, C], b: [C] or null.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

__global__ void biasGeluForwardKernel(const float* __restrict__ x, const float* __restrict__ b,
                                      float* __restrict__ y, int64_t n, int C) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float u = b ? x[i] + b[i % C] : x[i];
        const float t = tanhf(0.7978845608028654f * u * (1.0f + 0.044715f * u * u));
        y[i] = 0.5f * u * (1.0f + t);
    }
}

}  // namespace

Status biasGeluForward(const float* x, const float* b, float* y, int T, int C, void* stream) {
    if (T < 0 || C <= 0) return Status::invalid("biasGeluForward: need T >= 0 and C > 0");
    const int64_t n = static_cast<int64_t>(T) * C;
    if (n == 0) return Status::ok();
    constexpr int kThreads = 256;
    biasGeluForwardKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        x, b, y, n, C);
    return detail::launchStatus("biasGeluForward launch");
}

}  // namespace ts::kernels::cuda
