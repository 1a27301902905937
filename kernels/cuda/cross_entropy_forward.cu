// Row-wise cross entropy forward: one block per token row; block max, block sum of
// exp(z - max), loss = log(sum) - (z_target - max). logits: [T, V], targets: [T], loss: [T].
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// Block-wide reduction through shared memory, result broadcast to all threads.
template <bool kMax>
__device__ float blockReduce(float v, float* shared) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = kMax ? detail::warpMax(v) : detail::warpSum(v);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int nWarps = blockDim.x / 32;
    float r = threadIdx.x < nWarps ? shared[threadIdx.x] : (kMax ? -INFINITY : 0.0f);
    if (warp == 0) r = kMax ? detail::warpMax(r) : detail::warpSum(r);
    if (threadIdx.x == 0) shared[0] = r;
    __syncthreads();
    r = shared[0];
    __syncthreads();  // shared is reused by the next reduction
    return r;
}

__global__ void crossEntropyForwardKernel(const float* __restrict__ logits,
                                          const int32_t* __restrict__ targets,
                                          float* __restrict__ loss, int V) {
    __shared__ float shared[32];
    const int row = blockIdx.x;
    const float* z = logits + static_cast<int64_t>(row) * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, z[j]);
    m = blockReduce<true>(m, shared);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(z[j] - m);
    s = blockReduce<false>(s, shared);
    if (threadIdx.x == 0) {
        const int32_t y = targets[row];
        const float zt = (y >= 0 && y < V) ? z[y] - m : 0.0f;
        loss[row] = logf(s) - zt;
    }
}

}  // namespace

Status crossEntropyForward(const float* logits, const int32_t* targets, float* loss, int T,
                           int V, void* stream) {
    if (T < 0 || V <= 0) return Status::invalid("crossEntropyForward: need T >= 0 and V > 0");
    if (T == 0) return Status::ok();
    crossEntropyForwardKernel<<<T, kThreads, 0, detail::asStream(stream)>>>(logits, targets, loss,
                                                                             V);
    return detail::launchStatus("crossEntropyForward launch");
}

}  // namespace ts::kernels::cuda
