// AdamW step with torch.optim.AdamW semantics (see kernels/cpu/optimizer.cpp): scalars are
// formed on the host in double and applied in float per element.
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cmath>

namespace ts::kernels::cuda {

namespace {

struct AdamScalars {
    float decay, negStep, bc2Sqrt, w, oneMinusB2, beta2, eps, gradScale;
    bool decayOn;
};

__global__ void adamwKernel(float* __restrict__ p, const float* __restrict__ g,
                            float* __restrict__ m, float* __restrict__ v, int64_t n,
                            AdamScalars s, uint16_t* __restrict__ bits) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        // Every product and sum rounded as written (the oracle is compiled with
        // -ffp-contract=off; nvcc would fuse these into FMAs and round once), so the params, the
        // moments and the model copy's bits are the oracle's.
        float pi = p[i];
        if (s.decayOn) pi = __fmul_rn(pi, s.decay);
        const float gi = __fmul_rn(g[i], s.gradScale);  // clipping folded in, as on the CPU
        float mi = m[i];
        const float diff = __fsub_rn(gi, mi);
        mi = s.w < 0.5f ? __fadd_rn(mi, __fmul_rn(s.w, diff))
                        : __fsub_rn(gi, __fmul_rn(diff, __fsub_rn(1.0f, s.w)));  // torch lerp
        const float vi = __fadd_rn(__fmul_rn(v[i], s.beta2), __fmul_rn(__fmul_rn(gi, gi), s.oneMinusB2));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2Sqrt), s.eps);
        const float np = __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.negStep, mi), denom));
        p[i] = np;
        if (bits) bits[i] = hd::bf16FromFloat(np);  // the bf16 model copy, in the same pass
        m[i] = mi;
        v[i] = vi;
    }
}

}  // namespace

Status adamwStep(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamParams& hp, uint16_t* bits, void* stream) {
    if (n < 0) return Status::invalid("adamwStep: negative element count");
    if (n == 0) return Status::ok();
    const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2;
    const double step = static_cast<double>(hp.step < 1 ? 1 : hp.step);
    AdamScalars s;
    s.decay = static_cast<float>(1.0 - lr * static_cast<double>(hp.weightDecay));
    s.negStep = static_cast<float>(-(lr / (1.0 - std::pow(b1, step))));
    s.bc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, step)));
    s.w = static_cast<float>(1.0 - b1);
    s.oneMinusB2 = static_cast<float>(1.0 - b2);
    s.beta2 = hp.beta2;
    s.eps = hp.eps;
    s.gradScale = hp.gradScale;
    s.decayOn = hp.weightDecay != 0.0f;
    constexpr int kThreads = 256;
    adamwKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
        param, grad, m, v, n, s, bits);
    return detail::launchStatus("adamwStep launch");
}

}  // namespace ts::kernels::cuda
