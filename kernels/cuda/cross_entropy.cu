// Vocab cross entropy on CUDA (CPU oracle: kernels/cpu/cross_entropy.cpp): the vocab-parallel
// stages (row max, stats, loss, backward; the caller all-reduces between them), the unfused
// single-partition reference that materializes softmax probs, and the fused loss+grad in place
// over the logits.
// logits, probs, dlogits: [T, Vl] rows (Vl = V for the single-partition ops); targets, rowMax,
// targetLogit, sumExp, loss, dloss: [T].
//
// One block per row (rows grid-strided), threads stride the row; block reductions are a warp
// butterfly then the warp partials added in warp order, so results are deterministic.
// A target is owned when target - vStart lies in [0, Vl) (single partition: target in [0, V));
// rows with a target outside get targetLogit 0 / loss log(sumExp) / no -dloss term, as on the CPU.
// In-place use (dlogits == logits, crossEntropyFused) is safe: each element is read and written
// by the same thread, and the fused kernel reads the target logit before any thread writes.
//
// Differences from the CPU, within float rounding: exp is CUDA's expf (the CPU uses a Cephes
// polynomial, ~2 ulp; it returns exactly 0 below -87.3 where expf gives a denormal), log is logf,
// and sums are taken in a different order. Max ignores NaN on both sides.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <string>

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGrid = 1 << 20;

// Block-wide sum / max of v, returned to every thread. sh: kWarps floats of shared memory; the
// leading barrier lets a caller reuse sh right after the previous reduction.
__device__ float blockSum(float v, float* sh) {
    v = detail::warpSum(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < kWarps; ++i) s += sh[i];
    return s;
}

// Max that ignores NaN like the CPU's `x > m ? x : m` (fmaxf returns the non-NaN operand).
__device__ float blockMax(float v, float* sh) {
    v = detail::warpMax(v);
    __syncthreads();
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float m = sh[0];
    for (int i = 1; i < kWarps; ++i) m = fmaxf(m, sh[i]);
    return m;
}

__device__ float rowMaxOf(const float* row, int n, float* sh) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += kThreads) m = fmaxf(m, row[j]);
    return blockMax(m, sh);
}

int gridFor(int T) { return T < kMaxGrid ? T : kMaxGrid; }

__global__ void crossEntropyRowMaxKernel(const float* __restrict__ logits, float* __restrict__ rowMax, int T,
                                         int Vl) {
    __shared__ float sh[kWarps];
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        const float m = rowMaxOf(logits + static_cast<int64_t>(t) * Vl, Vl, sh);
        if (threadIdx.x == 0) rowMax[t] = m;
    }
}

__global__ void crossEntropyStatsKernel(const float* __restrict__ logits, const int32_t* __restrict__ targets,
                                        const float* __restrict__ rowMax, float* __restrict__ targetLogit,
                                        float* __restrict__ sumExp, int T, int Vl, int vStart) {
    __shared__ float sh[kWarps];
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        const float* row = logits + static_cast<int64_t>(t) * Vl;
        const float m = rowMax[t];
        float s = 0.0f;
        for (int j = threadIdx.x; j < Vl; j += kThreads) s += expf(row[j] - m);
        s = blockSum(s, sh);
        if (threadIdx.x == 0) {
            sumExp[t] = s;
            const int64_t local = static_cast<int64_t>(targets[t]) - vStart;
            targetLogit[t] = (local >= 0 && local < Vl) ? row[local] - m : 0.0f;
        }
    }
}

__global__ void crossEntropyLossKernel(const float* __restrict__ targetLogit, const float* __restrict__ sumExp,
                                       float* __restrict__ loss, int T) {
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < T; t += gridDim.x * blockDim.x)
        loss[t] = logf(sumExp[t]) - targetLogit[t];
}

// dlogits = exp(z - max) * (dloss / sumExp), minus dloss at the owned target. dlogits may be
// logits: no __restrict__ on the pair.
__global__ void crossEntropyBackwardKernel(const float* logits, const int32_t* __restrict__ targets,
                                           const float* __restrict__ rowMax, const float* __restrict__ sumExp,
                                           const float* __restrict__ dloss, float* dlogits, int T, int Vl,
                                           int vStart) {
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        const int64_t off = static_cast<int64_t>(t) * Vl;
        const float m = rowMax[t];
        const float d = dloss[t];
        const float sc = d / sumExp[t];
        const int64_t local = static_cast<int64_t>(targets[t]) - vStart;
        for (int j = threadIdx.x; j < Vl; j += kThreads) {
            const float g = __fmul_rn(expf(logits[off + j] - m), sc);
            dlogits[off + j] = j == local ? g - d : g;
        }
    }
}

// probs = softmax(z) (exp(z - max) * (1 / sum)); loss = -log(probs[target]), or log(sum) for a
// target outside [0, V).
__global__ void crossEntropyForwardUnfusedKernel(const float* __restrict__ logits,
                                                 const int32_t* __restrict__ targets, float* probs,
                                                 float* __restrict__ loss, int T, int V) {
    __shared__ float sh[kWarps];
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        const int64_t off = static_cast<int64_t>(t) * V;
        const float* row = logits + off;
        float* pr = probs + off;
        const float m = rowMaxOf(row, V, sh);
        float s = 0.0f;
        for (int j = threadIdx.x; j < V; j += kThreads) {
            const float e = expf(row[j] - m);
            pr[j] = e;
            s += e;
        }
        s = blockSum(s, sh);
        const float inv = 1.0f / s;
        for (int j = threadIdx.x; j < V; j += kThreads) pr[j] *= inv;
        __syncthreads();  // probs[target] was written by some thread of this block
        if (threadIdx.x == 0) {
            const int32_t y = targets[t];
            loss[t] = (y >= 0 && y < V) ? -logf(pr[y]) : logf(s);
        }
    }
}

__global__ void crossEntropyBackwardUnfusedKernel(const float* probs, const int32_t* __restrict__ targets,
                                                  const float* __restrict__ dloss, float* dlogits, int T,
                                                  int V) {
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        const int64_t off = static_cast<int64_t>(t) * V;
        const float g = dloss[t];
        const int32_t y = targets[t];
        for (int j = threadIdx.x; j < V; j += kThreads) {
            const float p = __fmul_rn(probs[off + j], g);
            dlogits[off + j] = j == y ? p - g : p;
        }
    }
}

// In place: row <- exp(z - max) * (dloss / sum), minus dloss at the target; loss = log(sum) -
// (z_target - max).
__global__ void crossEntropyFusedKernel(float* logits, const int32_t* __restrict__ targets,
                                        const float* __restrict__ dloss, float* __restrict__ loss, int T,
                                        int V) {
    __shared__ float sh[kWarps];
    for (int t = blockIdx.x; t < T; t += gridDim.x) {
        float* row = logits + static_cast<int64_t>(t) * V;
        const int32_t y = targets[t];
        const bool owned = y >= 0 && y < V;
        // Read before the block reductions' barriers: after them other threads overwrite the row.
        const float zy = (threadIdx.x == 0 && owned) ? row[y] : 0.0f;
        const float m = rowMaxOf(row, V, sh);
        float s = 0.0f;
        for (int j = threadIdx.x; j < V; j += kThreads) {
            const float e = expf(row[j] - m);
            row[j] = e;
            s += e;
        }
        s = blockSum(s, sh);
        const float d = dloss[t];
        if (threadIdx.x == 0) loss[t] = logf(s) - (owned ? zy - m : 0.0f);
        const float sc = d / s;
        for (int j = threadIdx.x; j < V; j += kThreads) {
            const float g = __fmul_rn(row[j], sc);
            row[j] = j == y ? g - d : g;
        }
        __syncthreads();  // the next row's reductions reuse sh; keep rows apart
    }
}

Status checkRows(const char* op, int T, int V) {
    if (T < 0 || V < 0)
        return Status::invalid(std::string(op) + ": need T >= 0 and a vocab size >= 0 (got T=" +
                               std::to_string(T) + ", V=" + std::to_string(V) + ")");
    return Status::ok();
}

}  // namespace

Status crossEntropyRowMax(const float* logits, float* rowMax, int T, int Vl, void* stream) {
    TS_RETURN_IF_ERROR(checkRows("crossEntropyRowMax", T, Vl));
    if (T == 0) return Status::ok();
    crossEntropyRowMaxKernel<<<gridFor(T), kThreads, 0, detail::asStream(stream)>>>(logits, rowMax, T, Vl);
    return detail::launchStatus("crossEntropyRowMax");
}

Status crossEntropyStats(const float* logits, const int32_t* targets, const float* rowMax,
                         float* targetLogit, float* sumExp, int T, int Vl, int vStart,
                         void* stream) {
    TS_RETURN_IF_ERROR(checkRows("crossEntropyStats", T, Vl));
    if (T == 0) return Status::ok();
    crossEntropyStatsKernel<<<gridFor(T), kThreads, 0, detail::asStream(stream)>>>(
        logits, targets, rowMax, targetLogit, sumExp, T, Vl, vStart);
    return detail::launchStatus("crossEntropyStats");
}

Status crossEntropyLoss(const float* targetLogit, const float* sumExp, float* loss, int T,
                        void* stream) {
    TS_RETURN_IF_ERROR(checkRows("crossEntropyLoss", T, 0));
    if (T == 0) return Status::ok();
    crossEntropyLossKernel<<<detail::blocksFor(T, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        targetLogit, sumExp, loss, T);
    return detail::launchStatus("crossEntropyLoss");
}

Status crossEntropyBackward(const float* logits, const int32_t* targets, const float* rowMax,
                            const float* sumExp, const float* dloss, float* dlogits, int T,
                            int Vl, int vStart, void* stream) {
    TS_RETURN_IF_ERROR(checkRows("crossEntropyBackward", T, Vl));
    if (T == 0 || Vl == 0) return Status::ok();
    crossEntropyBackwardKernel<<<gridFor(T), kThreads, 0, detail::asStream(stream)>>>(
        logits, targets, rowMax, sumExp, dloss, dlogits, T, Vl, vStart);
    return detail::launchStatus("crossEntropyBackward");
}

Status crossEntropyForwardUnfused(const float* logits, const int32_t* targets, float* probs,
                                  float* loss, int T, int V, void* stream) {
    TS_RETURN_IF_ERROR(checkRows("crossEntropyForwardUnfused", T, V));
    if (T == 0) return Status::ok();
    crossEntropyForwardUnfusedKernel<<<gridFor(T), kThreads, 0, detail::asStream(stream)>>>(
        logits, targets, probs, loss, T, V);
    return detail::launchStatus("crossEntropyForwardUnfused");
}

Status crossEntropyBackwardUnfused(const float* probs, const int32_t* targets,
                                   const float* dloss, float* dlogits, int T, int V,
                                   void* stream) {
    TS_RETURN_IF_ERROR(checkRows("crossEntropyBackwardUnfused", T, V));
    if (T == 0 || V == 0) return Status::ok();
    crossEntropyBackwardUnfusedKernel<<<gridFor(T), kThreads, 0, detail::asStream(stream)>>>(
        probs, targets, dloss, dlogits, T, V);
    return detail::launchStatus("crossEntropyBackwardUnfused");
}

Status crossEntropyFused(float* logitsInGradOut, const int32_t* targets, const float* dloss,
                         float* loss, int T, int V, void* stream) {
    TS_RETURN_IF_ERROR(checkRows("crossEntropyFused", T, V));
    if (T == 0) return Status::ok();
    crossEntropyFusedKernel<<<gridFor(T), kThreads, 0, detail::asStream(stream)>>>(logitsInGradOut, targets,
                                                                                   dloss, loss, T, V);
    return detail::launchStatus("crossEntropyFused");
}

}  // namespace ts::kernels::cuda
