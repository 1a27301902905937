// Rotary position embedding, rotate-half (GPT-NeoX / Megatron rotary_interleaved=False).
// x: [s, b, n, d]; for pair i < d/2 the angle is pos * inv_freq[i], inv_freq[i] =
// theta^(-2i/d) computed in float exactly as torch does (1 / theta ** (arange(0,d,2)/d)).
#include "kernels/cpu/ops.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace ts::kernels::cpu {

namespace {

inline float invFreq(int i, int d, float theta) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(d);
    return 1.0f / std::pow(theta, expo);
}

// cosT, sinT: [half] for one position. sign = +1 forward, -1 backward (rotation by -angle).
// dst may equal src (in place); otherwise they must not overlap.
inline void rotateRows(const float* src, float* dst, int rows, int d, const float* cosT,
                       const float* sinT, float sign) {
    const int half = d / 2;
    for (int r = 0; r < rows; ++r) {
        const float* x1 = src + static_cast<int64_t>(r) * d;
        const float* x2 = x1 + half;
        float* y1 = dst + static_cast<int64_t>(r) * d;
        float* y2 = y1 + half;
        for (int i = 0; i < half; ++i) {
            const float c = cosT[i], sn = sign * sinT[i];
            const float a = x1[i], bb = x2[i];
            y1[i] = a * c - bb * sn;
            y2[i] = bb * c + a * sn;
        }
        if (2 * half < d) y1[d - 1] = x1[d - 1];  // odd d: the last element is not rotated
    }
}

// Per-position cos/sin tables of the fused kernels (the same float math for every caller, so
// the split+rope and rope+merge kernels equal split-then-rope and rope-then-merge bitwise).
struct RopeTables {
    std::vector<float> buf;
    int half;
    RopeTables(int d, float theta) : buf(static_cast<size_t>(3) * (d / 2)), half(d / 2) {
        for (int i = 0; i < half; ++i) buf[i] = invFreq(i, d, theta);
    }
    const float* cosT() const { return buf.data() + half; }
    const float* sinT() const { return buf.data() + 2 * half; }
    void setPosition(float pos) {
        for (int i = 0; i < half; ++i) {
            const float ang = pos * buf[i];
            buf[half + i] = std::cos(ang);
            buf[2 * half + i] = std::sin(ang);
        }
    }
};

// The fused kernel: per position, the half-width cos/sin once, then rotate all b*n heads.
void ropeApply(float* x, int s, int b, int n, int d, float theta, int posOffset, float sign) {
    if (d / 2 == 0) return;
    RopeTables tab(d, theta);  // d is a head dim (<= 256 in practice): one small buffer
    const int64_t rowsPerPos = static_cast<int64_t>(b) * n;
    for (int si = 0; si < s; ++si) {
        tab.setPosition(static_cast<float>(posOffset + si));
        float* xs = x + si * rowsPerPos * d;
        rotateRows(xs, xs, static_cast<int>(rowsPerPos), d, tab.cosT(), tab.sinT(), sign);
    }
}

}  // namespace

void ropeForwardFused(float* x, int s, int b, int n, int d, float theta, int posOffset) {
    ropeApply(x, s, b, n, d, theta, posOffset, 1.0f);
}

void ropeBackward(float* dx, int s, int b, int n, int d, float theta, int posOffset) {
    ropeApply(dx, s, b, n, d, theta, posOffset, -1.0f);
}

namespace {

// The walk both QKV layout kernels share: per position the cos/sin tables, then per token and
// query group the group's slice of qkv ([r query heads, k, v] x d) and the matching rows of
// q, k, v, handed to visit(grp, qg, kg, vg, tab).
template <class Qkv, class Heads, class Visit>
void forEachQkvGroup(Qkv* qkv, Heads* q, Heads* k, Heads* v, int s, int b, int nq, int ng, int d,
                     float theta, int posOffset, Visit&& visit) {
    const int r = nq / ng;
    const int64_t row = static_cast<int64_t>(ng) * (r + 2) * d;  // one token of qkv
    RopeTables tab(d, theta);
    for (int si = 0; si < s; ++si) {
        if (d / 2 > 0) tab.setPosition(static_cast<float>(posOffset + si));
        for (int bi = 0; bi < b; ++bi) {
            const int64_t t = static_cast<int64_t>(si) * b + bi;
            for (int g = 0; g < ng; ++g)
                visit(qkv + t * row + static_cast<int64_t>(g) * (r + 2) * d,
                      q + (t * nq + static_cast<int64_t>(g) * r) * d, k + (t * ng + g) * d,
                      v + (t * ng + g) * d, tab);
        }
    }
}

// dst = the rotation of src (sign +1 forward, -1 backward) for `rows` heads, or a copy when d
// has no pair to rotate.
inline void rotateOrCopy(const float* src, float* dst, int rows, int d, const RopeTables& tab,
                         float sign) {
    if (d / 2 > 0)
        rotateRows(src, dst, rows, d, tab.cosT(), tab.sinT(), sign);
    else
        std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(rows) * d);
}

}  // namespace

void splitQkvRopeForward(const float* qkv, float* q, float* k, float* v, int s, int b, int nq,
                         int ng, int d, float theta, int posOffset, bool roundBf16) {
    const int r = nq / ng;
    forEachQkvGroup(qkv, q, k, v, s, b, nq, ng, d, theta, posOffset,
                    [&](const float* grp, float* qg, float* kg, float* vg, const RopeTables& tab) {
                        rotateOrCopy(grp, qg, r, d, tab, 1.0f);
                        rotateOrCopy(grp + static_cast<int64_t>(r) * d, kg, 1, d, tab, 1.0f);
                        if (roundBf16) {
                            roundToBf16(qg, static_cast<int64_t>(r) * d);
                            roundToBf16(kg, d);
                        }
                        std::memcpy(vg, grp + static_cast<int64_t>(r + 1) * d, sizeof(float) * d);
                    });
}

void ropeBackwardMergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int s,
                          int b, int nq, int ng, int d, float theta, int posOffset) {
    const int r = nq / ng;
    forEachQkvGroup(dqkv, dq, dk, dv, s, b, nq, ng, d, theta, posOffset,
                    [&](float* grp, const float* qg, const float* kg, const float* vg,
                        const RopeTables& tab) {
                        rotateOrCopy(qg, grp, r, d, tab, -1.0f);
                        rotateOrCopy(kg, grp + static_cast<int64_t>(r) * d, 1, d, tab, -1.0f);
                        std::memcpy(grp + static_cast<int64_t>(r + 1) * d, vg, sizeof(float) * d);
                    });
}

void splitQkv(const float* qkv, float* q, float* k, float* v, int T, int nq, int ng, int d) {
    const int r = nq / ng;
    const size_t bytes = sizeof(float) * static_cast<size_t>(d);
    const int64_t row = static_cast<int64_t>(ng) * (r + 2) * d;  // one token of qkv
    for (int64_t t = 0; t < T; ++t)
        for (int g = 0; g < ng; ++g) {
            const float* grp = qkv + t * row + static_cast<int64_t>(g) * (r + 2) * d;
            std::memcpy(q + (t * nq + static_cast<int64_t>(g) * r) * d, grp, bytes * static_cast<size_t>(r));
            std::memcpy(k + (t * ng + g) * d, grp + static_cast<int64_t>(r) * d, bytes);
            std::memcpy(v + (t * ng + g) * d, grp + static_cast<int64_t>(r + 1) * d, bytes);
        }
}

void mergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int T, int nq, int ng, int d) {
    const int r = nq / ng;
    const size_t bytes = sizeof(float) * static_cast<size_t>(d);
    const int64_t row = static_cast<int64_t>(ng) * (r + 2) * d;
    for (int64_t t = 0; t < T; ++t)
        for (int g = 0; g < ng; ++g) {
            float* grp = dqkv + t * row + static_cast<int64_t>(g) * (r + 2) * d;
            std::memcpy(grp, dq + (t * nq + static_cast<int64_t>(g) * r) * d, bytes * static_cast<size_t>(r));
            std::memcpy(grp + static_cast<int64_t>(r) * d, dk + (t * ng + g) * d, bytes);
            std::memcpy(grp + static_cast<int64_t>(r + 1) * d, dv + (t * ng + g) * d, bytes);
        }
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
