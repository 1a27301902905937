// AdamW, exactly torch.optim.AdamW's single-tensor path (amsgrad=False, maximize=False):
//   g = grad * gradScale (clipping);  p *= 1 - lr*wd;  m = lerp(m, g, 1-beta1);  v = beta2 v + (1-beta2) g^2;
//   p += -(lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps),  bc_i = 1 - beta_i^step.
// Scalars are formed in double (Python floats in torch) and applied in float like torch's
// CPU kernels do. With `bits`, the new params' bf16 bits too (the bf16 model copy, Megatron's
// bf16 params), in the same pass instead of a second one over the params.
#include "kernels/cpu/ops.h"

#include <cmath>

#include "kernels/common/bf16.h"

namespace ts::kernels::cpu {

namespace {

// The element loop, with the bf16 bits of the new params written beside them or not (two
// instantiations, so the plain one loses nothing to a branch per element).
template <bool kBits>
void adamwLoop(float* param, const float* grad, float* m, float* v, int64_t n, const AdamParams& hp,
               uint16_t* bits) {
    const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2;
    const double step = static_cast<double>(hp.step < 1 ? 1 : hp.step);
    const float decay = static_cast<float>(1.0 - lr * static_cast<double>(hp.weightDecay));
    const double bc1 = 1.0 - std::pow(b1, step);
    const double bc2 = 1.0 - std::pow(b2, step);
    const float negStep = static_cast<float>(-(lr / bc1));
    const float bc2Sqrt = static_cast<float>(std::sqrt(bc2));
    const float w = static_cast<float>(1.0 - b1);  // lerp weight
    const float oneMinusB2 = static_cast<float>(1.0 - b2);
    const float beta2 = hp.beta2;
    const float eps = hp.eps;
    const bool decayOn = hp.weightDecay != 0.0f;
    const float gradScale = hp.gradScale;
    for (int64_t i = 0; i < n; ++i) {
        float p = param[i];
        if (decayOn) p *= decay;
        const float g = grad[i] * gradScale;  // x * 1 == x: no change without clipping
        // torch lerp: weight < 0.5 ? a + w (b - a) : b - (b - a)(1 - w)
        float mi = m[i];
        mi = w < 0.5f ? mi + w * (g - mi) : g - (g - mi) * (1.0f - w);
        const float vi = v[i] * beta2 + g * g * oneMinusB2;
        const float denom = std::sqrt(vi) / bc2Sqrt + eps;
        p = p + negStep * mi / denom;
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
        if constexpr (kBits) bits[i] = hd::bf16FromFloat(p);
    }
}

}  // namespace

void adamwStep(float* param, const float* grad, float* m, float* v, int64_t n, const AdamParams& hp,
               uint16_t* bits) {
    if (bits) adamwLoop<true>(param, grad, m, v, n, hp, bits);
    else adamwLoop<false>(param, grad, m, v, n, hp, nullptr);
}

}  // namespace ts::kernels::cpu
