// Rotary position embedding, rotate-half (GPT-NeoX / Megatron rotary_interleaved=False).
// x: [s, b, n, d]; for pair i < d/2 the angle is pos * inv_freq[i], inv_freq[i] =
// theta^(-2i/d) computed in float exactly as torch does (1 / theta ** (arange(0,d,2)/d)).
#include "kernels/cpu/ops.h"

#include <cmath>
#include <vector>

namespace ts::kernels::cpu {

namespace {

inline float invFreq(int i, int d, float theta) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(d);
    return 1.0f / std::pow(theta, expo);
}

// cosT, sinT: [half] for one position. sign = +1 forward, -1 backward (rotation by -angle).
inline void rotateRows(float* x, int rows, int d, const float* cosT, const float* sinT,
                       float sign) {
    const int half = d / 2;
    for (int r = 0; r < rows; ++r) {
        float* x1 = x + static_cast<int64_t>(r) * d;
        float* x2 = x1 + half;
        for (int i = 0; i < half; ++i) {
            const float c = cosT[i], sn = sign * sinT[i];
            const float a = x1[i], bb = x2[i];
            x1[i] = a * c - bb * sn;
            x2[i] = bb * c + a * sn;
        }
    }
}

// The fused kernel: per position, the half-width cos/sin once, then rotate all b*n heads.
void ropeApply(float* x, int s, int b, int n, int d, float theta, int posOffset, float sign) {
    const int half = d / 2;
    if (half == 0) return;
    // d is a head dim (<= 256 in practice); one small buffer per call.
    std::vector<float> buf(static_cast<size_t>(3) * half);
    float* inv = buf.data();
    float* cosT = inv + half;
    float* sinT = cosT + half;
    for (int i = 0; i < half; ++i) inv[i] = invFreq(i, d, theta);
    const int64_t rowsPerPos = static_cast<int64_t>(b) * n;
    for (int si = 0; si < s; ++si) {
        const float pos = static_cast<float>(posOffset + si);
        for (int i = 0; i < half; ++i) {
            const float ang = pos * inv[i];
            cosT[i] = std::cos(ang);
            sinT[i] = std::sin(ang);
        }
        rotateRows(x + si * rowsPerPos * d, static_cast<int>(rowsPerPos), d, cosT, sinT, sign);
    }
}

}  // namespace

void ropeForwardFused(float* x, int s, int b, int n, int d, float theta, int posOffset) {
    ropeApply(x, s, b, n, d, theta, posOffset, 1.0f);
}

void ropeBackward(float* dx, int s, int b, int n, int d, float theta, int posOffset) {
    ropeApply(dx, s, b, n, d, theta, posOffset, -1.0f);
}

void ropeForward(float* x, int s, int b, int n, int d, float theta, int posOffset) {
    // As the PyTorch reference: emb = cat(freqs, freqs) -> cos/sin tables [s, d], then
    // out = x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1], as separate passes.
    const int half = d / 2;
    if (half == 0) return;
    std::vector<float> cosT(static_cast<size_t>(s) * d), sinT(static_cast<size_t>(s) * d);
    std::vector<float> rot(static_cast<size_t>(d));
    for (int si = 0; si < s; ++si) {
        const float pos = static_cast<float>(posOffset + si);
        for (int i = 0; i < half; ++i) {
            const float ang = pos * invFreq(i, d, theta);
            cosT[static_cast<size_t>(si) * d + i] = cosT[static_cast<size_t>(si) * d + half + i] =
                std::cos(ang);
            sinT[static_cast<size_t>(si) * d + i] = sinT[static_cast<size_t>(si) * d + half + i] =
                std::sin(ang);
        }
    }
    const int64_t rowsPerPos = static_cast<int64_t>(b) * n;
    for (int si = 0; si < s; ++si) {
        const float* c = cosT.data() + static_cast<size_t>(si) * d;
        const float* sn = sinT.data() + static_cast<size_t>(si) * d;
        for (int64_t r = 0; r < rowsPerPos; ++r) {
            float* xr = x + (si * rowsPerPos + r) * d;
            for (int i = 0; i < half; ++i) {
                rot[i] = -xr[half + i];
                rot[half + i] = xr[i];
            }
            for (int i = 0; i < d; ++i) rot[i] *= sn[i];
            for (int i = 0; i < d; ++i) xr[i] = xr[i] * c[i] + rot[i];
        }
    }
}

}  // namespace ts::kernels::cpu
