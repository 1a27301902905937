// Block-scaled FP8 emulation (see fp8_block.h).
#include "kernels/cpu/fp8_block.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace ts::kernels::cpu {

uint8_t e8m0FromFloat(float v) {
    if (std::isnan(v)) return 0xFF;
    if (std::isinf(v)) return 0xFE;
    if (v == 0.0f) return 0x00;
    uint32_t u = 0;
    std::memcpy(&u, &v, sizeof(u));
    uint32_t e = (u >> 23) & 0xFF;  // TE reads the bits of a non-negative amax ratio
    const uint32_t m = u & 0x7FFFFF;
    if (m > 0 && e != 0xFE && !(e == 0 && m <= 0x400000)) ++e;
    return uint8_t(e);
}

float e8m0ToFloat(uint8_t e) {
    if (e == 0xFF) return std::nanf("");
    return std::ldexp(1.0f, int(e) - 127);
}

namespace {

int blockLen(Fp8BlockKind kind) { return kind == Fp8BlockKind::Mx1x32 ? 32 : 128; }

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t fp8BlockScaleCount(int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows) {
    const int64_t b = blockLen(kind);
    if (kind == Fp8BlockKind::Block128x128) return ceilDiv(rows, b) * ceilDiv(cols, b);
    return alongRows ? rows * ceilDiv(cols, b) : ceilDiv(rows, b) * cols;
}

int64_t fp8BlockBytes(int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows) {
    const int64_t scaleBytes = kind == Fp8BlockKind::Mx1x32 ? 1 : 4;
    return rows * cols + scaleBytes * fp8BlockScaleCount(rows, cols, kind, alongRows);
}

float fp8BlockScale(float amax, float fp8Max, bool pow2) {
    float s = 1.0f;
    if (std::isfinite(amax) && amax > 0.0f) {
        s = fp8Max / amax;
        if (std::isinf(s)) s = FLT_MAX;
    }
    if (pow2) {
        uint32_t u = 0;
        std::memcpy(&u, &s, sizeof(u));
        u &= 0xFF800000u;  // sign and exponent: rounds the scale down to a power of two
        std::memcpy(&s, &u, sizeof(u));
    }
    return s;
}

void fp8BlockQuantizeDequantize(const float* x, float* y, uint8_t* codes, void* scales, int64_t rows, int64_t cols,
                                Fp8BlockKind kind, bool alongRows, Fp8Format f, bool pow2) {
    const int64_t b = blockLen(kind);
    const float mx = fp8Max(f);
    // A block: rows [r0, r1) x cols [c0, c1).
    auto block = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t idx) {
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) {
                const float a = std::fabs(x[r * cols + c]);
                amax = (std::isnan(a) || std::isnan(amax)) ? NAN : std::max(amax, a);
            }
        float q, dq;  // multiply before encoding, after decoding
        if (kind == Fp8BlockKind::Mx1x32) {
            const uint8_t e = e8m0FromFloat(amax * (1.0f / mx));
            // TE's exp2f_rcp: 2^(127 - e), and 1 for e = 0.
            q = e == 0 ? 1.0f : std::ldexp(1.0f, 127 - int(e));
            dq = e8m0ToFloat(e);
            if (scales) static_cast<uint8_t*>(scales)[idx] = e;
        } else {
            q = fp8BlockScale(amax, mx, pow2);
            dq = 1.0f / q;
            if (scales) static_cast<float*>(scales)[idx] = dq;
        }
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) {
                const int64_t i = r * cols + c;
                const uint8_t code = fp8Encode(x[i] * q, f);
                if (codes) codes[i] = code;
                y[i] = fp8Decode(code, f) * dq;
            }
    };
    int64_t idx = 0;
    if (kind == Fp8BlockKind::Block128x128) {
        for (int64_t r0 = 0; r0 < rows; r0 += b)
            for (int64_t c0 = 0; c0 < cols; c0 += b) block(r0, std::min(rows, r0 + b), c0, std::min(cols, c0 + b), idx++);
    } else if (alongRows) {
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c0 = 0; c0 < cols; c0 += b) block(r, r + 1, c0, std::min(cols, c0 + b), idx++);
    } else {
        for (int64_t r0 = 0; r0 < rows; r0 += b)
            for (int64_t c = 0; c < cols; ++c) block(r0, std::min(rows, r0 + b), c, c + 1, idx++);
    }
}

}  // namespace ts::kernels::cpu
