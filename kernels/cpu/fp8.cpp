// FP8 emulation (REFERENCE.md §6.1): E4M3 ("fn": no infinities, max 448, NaN = S.1111.111) and
// E5M2 (IEEE-like: infinities, NaNs, max 57344), encoded from fp32 with round-to-nearest-even,
// subnormals, and saturation of finite overflow and of infinities to +-max (the saturating
// cast Transformer Engine uses); NaN stays NaN.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

namespace {

struct Fp8Spec {
    int mbits, bias;
    uint8_t maxCode;  // largest finite magnitude code
    uint8_t nanCode;
};

Fp8Spec spec(Fp8Format f) {
    return f == Fp8Format::E4M3 ? Fp8Spec{3, 7, 0x7E, 0x7F} : Fp8Spec{2, 15, 0x7B, 0x7F};
}

}  // namespace

float fp8Max(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }

float fp8Decode(uint8_t code, Fp8Format f) {
    const Fp8Spec s = spec(f);
    const bool neg = code & 0x80;
    const int mag = code & 0x7F;
    const int e = mag >> s.mbits, m = mag & ((1 << s.mbits) - 1);
    float v;
    if (f == Fp8Format::E4M3 && mag == 0x7F) return std::nanf("");
    if (f == Fp8Format::E5M2 && e == 31) {
        if (m != 0) return std::nanf("");
        v = INFINITY;
    } else if (e == 0) {
        v = std::ldexp(float(m), 1 - s.bias - s.mbits);
    } else {
        v = std::ldexp(float((1 << s.mbits) + m), e - s.bias - s.mbits);
    }
    return neg ? -v : v;
}

uint8_t fp8Encode(float x, Fp8Format f) {
    const Fp8Spec s = spec(f);
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return uint8_t(sign | s.nanCode);
    const float a = std::fabs(x);
    if (!(a < fp8Max(f))) return uint8_t(sign | s.maxCode);  // >= max or inf: saturate
    const int emin = 1 - s.bias;                               // exponent of the smallest normal
    int e2 = 0;
    std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1): floor(log2 a) = e2 - 1
    int E = e2 - 1;
    if (a == 0.0f) return sign;
    if (E < emin) E = emin;  // subnormal: the quantum is 2^(emin - mbits)
    // q = a / quantum, rounded half to even; exact in fp32 (a power-of-two scaling).
    const float q = std::ldexp(a, s.mbits - E);
    float r = std::nearbyint(q);  // default rounding mode: to nearest, ties to even
    int M = int(r);
    int code;
    if (E == emin && M < (1 << s.mbits)) {
        code = M;  // subnormal (or zero)
    } else {
        if (M == (2 << s.mbits)) {  // rounded up to the next binade
            M = 1 << s.mbits;
            ++E;
        }
        code = ((E + s.bias) << s.mbits) | (M - (1 << s.mbits));
    }
    if (code > s.maxCode) code = s.maxCode;  // cannot happen below max; kept as a guard
    return uint8_t(sign | code);
}

float amaxOf(const float* x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float a = std::fabs(x[i]);
        if (std::isnan(a)) return a;
        m = std::max(m, a);
    }
    return m;
}

namespace {

struct Fp8Rounder {
    int mbits, bias;
    float mx, minNormal, magic;
    uint32_t shift;
    explicit Fp8Rounder(Fp8Format f) {
        const Fp8Spec s = spec(f);
        mbits = s.mbits;
        bias = s.bias;
        mx = fp8Max(f);
        minNormal = std::ldexp(1.0f, 1 - s.bias);
        // fp32 addition of 2^(emin - mbits + 23) rounds to the subnormal quantum, to nearest even.
        magic = std::ldexp(1.0f, 1 - s.bias - s.mbits + 23);
        shift = uint32_t(23 - s.mbits);
    }
    // The value of the FP8 number nearest to v (ties to even; +-max beyond it; NaN stays NaN),
    // from the fp32 bits: equal to fp8Decode(fp8Encode(v)) and branch-free (vectorizes).
    float round(float v) const {
        const float a = std::fabs(v);
        uint32_t b;
        std::memcpy(&b, &a, 4);
        b = (b + ((1u << (shift - 1)) - 1u) + ((b >> shift) & 1u)) & ~((1u << shift) - 1u);
        float normal;
        std::memcpy(&normal, &b, 4);
        const float sub = (a + magic) - magic;
        float r = a < minNormal ? sub : normal;
        r = a < mx ? r : mx;
        r = std::copysign(r, v);
        return v != v ? v : r;
    }
    // The code of an FP8 value r (from round()).
    uint8_t code(float r, uint8_t nanCode) const {
        const uint8_t sign = std::signbit(r) ? 0x80 : 0;
        if (r != r) return uint8_t(sign | nanCode);
        const float a = std::fabs(r);
        if (a < minNormal) return uint8_t(sign | int(a * std::ldexp(1.0f, mbits + bias - 1)));
        uint32_t b;
        std::memcpy(&b, &a, 4);
        const int e = int((b >> 23) & 0xFF) - 127 + bias;
        const int m = int((b >> shift) & ((1u << mbits) - 1u));
        return uint8_t(sign | (e << mbits) | m);
    }
};

}  // namespace

void fp8QuantizeDequantize(const float* x, float* y, uint8_t* codes, int64_t n, float scale, Fp8Format f) {
    const float inv = 1.0f / scale;
    const Fp8Rounder r(f);
    if (codes) {
        const uint8_t nanCode = spec(f).nanCode;
        for (int64_t i = 0; i < n; ++i) {
            const float v = r.round(x[i] * scale);
            codes[i] = r.code(v, nanCode);
            y[i] = v * inv;
        }
        return;
    }
    for (int64_t i = 0; i < n; ++i) y[i] = r.round(x[i] * scale) * inv;
}

}  // namespace ts::kernels::cpu
