// Bias + tanh-GeLU (Megatron bias_gelu, fused and unfused) and SwiGLU, forward and backward.
// gelu(u) = 0.5 u (1 + tanh(k0 u (1 + k1 u^2))), k0 = sqrt(2/pi), k1 = 0.044715, evaluated as
// u * sigmoid(2 k0 u (1 + k1 u^2)) (same function, less work; see gelu below).
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

namespace ts::kernels::cpu {

namespace {

constexpr float kK0 = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kK1 = 0.044715f;

// z is formed exactly as in the tanh form (and torch's kernel), z2 = 2z is exact.
// gelu(u) = 0.5 u (1 + tanh(z)) = u sigmoid(2z) = u / (1 + exp(-2z)), z = k0 u (1 + k1 u^2):
// one exp and one division, and no 1 + tanh cancellation for negative u (relative error stays
// ~1e-6 where the tanh form loses digits). For 2z < -80 the sigmoid is set to exactly 0, so
// gelu(u) = u * 0 = -0 for u below about -10.4 (the float limit), gelu(-inf) = NaN and
// gelu(+inf) = +inf as in the tanh form; NaN propagates.
inline float geluSigmoid(float z2) {
    const float sg = 1.0f / (1.0f + detail::expClamped80(-z2));
    return z2 < -80.0f ? 0.0f : sg;
}

inline float gelu(float u) {
    const float z2 = 2.0f * (kK0 * u * (1.0f + kK1 * u * u));
    return u * geluSigmoid(z2);
}

// d gelu / du = sg + u sg (1 - sg) dz2/du, sg = sigmoid(2z), dz2/du = 2 k0 (1 + 3 k1 u^2);
// 1 - sg = sg exp(-2z) avoids the cancellation of 1 - sg near 1. Outside |2z| <= 80 the
// derivative is its float limit: 1 above, 0 below (also for u = +-inf, where the product
// form would give inf * 0); NaN propagates.
inline float geluGrad(float u) {
    const float z2 = 2.0f * (kK0 * u * (1.0f + kK1 * u * u));
    const float e = detail::expClamped80(-z2);
    const float sg = 1.0f / (1.0f + e);
    float g = sg + u * (sg * (e * sg)) * (2.0f * kK0 + (6.0f * kK0 * kK1) * u * u);
    g = z2 > 80.0f ? 1.0f : g;
    return z2 < -80.0f ? 0.0f : g;
}

}  // namespace

void biasGeluForward(const float* x, const float* b, float* y, int T, int C, bool roundBf16) {
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        if (b)
            for (int c = 0; c < C; ++c) y[off + c] = gelu(x[off + c] + b[c]);
        else
            for (int c = 0; c < C; ++c) y[off + c] = gelu(x[off + c]);
        if (roundBf16) roundToBf16(y + off, C);
    }
}

void biasGeluForwardUnfused(const float* x, const float* b, float* y, int T, int C) {
    const int64_t n = static_cast<int64_t>(T) * C;
    if (b) {
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < C; ++c)
                y[static_cast<int64_t>(t) * C + c] = x[static_cast<int64_t>(t) * C + c] + b[c];
        for (int64_t i = 0; i < n; ++i) y[i] = gelu(y[i]);
    } else {
        for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
    }
}

void biasGeluBackward(const float* dy, const float* x, const float* b, float* dx, float* db,
                      int T, int C) {
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        if (b)
            for (int c = 0; c < C; ++c) dx[off + c] = dy[off + c] * geluGrad(x[off + c] + b[c]);
        else
            for (int c = 0; c < C; ++c) dx[off + c] = dy[off + c] * geluGrad(x[off + c]);
        if (db)
            for (int c = 0; c < C; ++c) db[c] += dx[off + c];
    }
}

// y = silu(gate) * up, silu(g) = g * sigmoid(g)
void swigluForward(const float* x, float* y, int T, int F, bool roundBf16) {
    for (int t = 0; t < T; ++t) {
        const float* gate = x + static_cast<int64_t>(t) * 2 * F;
        const float* up = gate + F;
        float* yr = y + static_cast<int64_t>(t) * F;
        for (int f = 0; f < F; ++f) yr[f] = gate[f] * detail::sigmoidApprox(gate[f]) * up[f];
        if (roundBf16) roundToBf16(yr, F);
    }
}

// dgate = dy * up * sig * (1 + g (1 - sig)), dup = dy * silu(g)
void swigluBackward(const float* dy, const float* x, float* dx, int T, int F) {
    for (int t = 0; t < T; ++t) {
        const float* gate = x + static_cast<int64_t>(t) * 2 * F;
        const float* up = gate + F;
        const float* dyr = dy + static_cast<int64_t>(t) * F;
        float* dgate = dx + static_cast<int64_t>(t) * 2 * F;
        float* dup = dgate + F;
        for (int f = 0; f < F; ++f) {
            const float g = gate[f];
            const float sg = detail::sigmoidApprox(g);
            dgate[f] = dyr[f] * up[f] * sg * (1.0f + g * (1.0f - sg));
            dup[f] = dyr[f] * g * sg;
        }
    }
}

}  // namespace ts::kernels::cpu
