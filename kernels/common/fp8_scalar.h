// The scalar FP8 and E8M0 conversions, written once for the CPU oracle (kernels/cpu/fp8.cpp,
// fp8_block.cpp) and the CUDA kernels (kernels/cuda/fp8.cu), so both backends produce the same
// codes and values bit for bit (REFERENCE.md §6.1, §6.4). Every function is TS_HD: plain inline
// C++ for the host compiler, __host__ __device__ under nvcc.
//
// Host code keeps the exact std:: calls the oracle always made (frexp, ldexp, nearbyint,
// copysign, memcpy: the bit casts of float_bits.h); device code uses their CUDA counterparts,
// which are exact for every input these functions pass (frexpf/ldexpf: power-of-two scaling of
// representable values, rintf: round half to even, the bit casts). tests/kernels/test_fp8_scalar.cpp pins the results to the
// oracle's pre-sharing outputs over a million float bit patterns.
//
// Not to be included by engine code: use kernels/cpu/ops.h (fp8Encode, fp8Decode, ...) there.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/float_bits.h"

namespace ts::kernels::fp8s {

// Format numbers: 0 = E4M3 ("fn": no infinities, NaN = S.1111.111, max 448), 1 = E5M2
// (IEEE-like, max 57344): the values of kernels::cpu::Fp8Format.
struct Fp8Spec {
    int mbits, bias;
    uint8_t maxCode;  // largest finite magnitude code
    uint8_t nanCode;
};

TS_HD inline Fp8Spec fp8Spec(int format) {
    return format == 0 ? Fp8Spec{3, 7, 0x7E, 0x7F} : Fp8Spec{2, 15, 0x7B, 0x7F};
}

TS_HD inline float fp8MaxOf(int format) { return format == 0 ? 448.0f : 57344.0f; }

// The quiet NaN std::nanf("") gives (0x7FC00000), on both sides.
TS_HD inline float quietNaN() { return hd::floatFromBits(0x7FC00000u); }
TS_HD inline float posInf() { return hd::floatFromBits(0x7F800000u); }
TS_HD inline bool isNaN(float x) { return (hd::floatBits(x) & 0x7FFFFFFFu) > 0x7F800000u; }
TS_HD inline bool isInf(float x) { return (hd::floatBits(x) & 0x7FFFFFFFu) == 0x7F800000u; }
TS_HD inline bool signBit(float x) { return (hd::floatBits(x) >> 31) != 0; }

// Current (tensorwise) scaling's scale (REFERENCE.md §6.3): fp8Max / amax; 1 when amax is 0 or not
// finite; the largest float when the quotient overflows. The division is IEEE (host and nvcc's
// default -prec-div=true), so the host and the device agree bit for bit.
TS_HD inline float currentScaleOf(float amax, float fp8Max) {
    if (isNaN(amax) || isInf(amax) || amax == 0.0f) return 1.0f;
    const float s = fp8Max / amax;
    return isInf(s) ? hd::floatFromBits(0x7F7FFFFFu) : s;
}

// The scale fp8QuantizeCurrent quantizes with, from a tensor's amax over the ranks that hold it
// and the divisor of its magnitudes: currentScaleOf(amax / divisor) / divisor.
TS_HD inline float currentScaleDivided(float amax, float divisor, float fp8Max) {
    return currentScaleOf(amax / divisor, fp8Max) / divisor;
}

TS_HD inline float absF(float x) {
#ifdef __CUDA_ARCH__
    return fabsf(x);
#else
    return std::fabs(x);
#endif
}

TS_HD inline float ldexpF(float x, int e) {
#ifdef __CUDA_ARCH__
    return ldexpf(x, e);
#else
    return std::ldexp(x, e);
#endif
}

TS_HD inline float frexpF(float x, int* e) {
#ifdef __CUDA_ARCH__
    return frexpf(x, e);
#else
    return std::frexp(x, e);
#endif
}

// Round to nearest integer, ties to even (the default rounding mode on the host).
TS_HD inline float rintF(float x) {
#ifdef __CUDA_ARCH__
    return rintf(x);
#else
    return std::nearbyint(x);
#endif
}

TS_HD inline float copySignF(float mag, float sgn) {
#ifdef __CUDA_ARCH__
    return copysignf(mag, sgn);
#else
    return std::copysign(mag, sgn);
#endif
}

// Code -> fp32, exactly (NaN codes give quietNaN(), E5M2 infinities +-inf).
TS_HD inline float fp8Decode(uint8_t code, int format) {
    const Fp8Spec s = fp8Spec(format);
    const bool neg = code & 0x80;
    const int mag = code & 0x7F;
    const int e = mag >> s.mbits, m = mag & ((1 << s.mbits) - 1);
    float v;
    if (format == 0 && mag == 0x7F) return quietNaN();
    if (format != 0 && e == 31) {
        if (m != 0) return quietNaN();
        v = posInf();
    } else if (e == 0) {
        v = ldexpF(float(m), 1 - s.bias - s.mbits);
    } else {
        v = ldexpF(float((1 << s.mbits) + m), e - s.bias - s.mbits);
    }
    return neg ? -v : v;
}

// fp32 -> code: round to nearest even, subnormals, finite overflow and +-inf saturate to +-max,
// NaN -> NaN (sign kept).
TS_HD inline uint8_t fp8Encode(float x, int format) {
    const Fp8Spec s = fp8Spec(format);
    const uint8_t sign = signBit(x) ? 0x80 : 0x00;
    if (isNaN(x)) return uint8_t(sign | s.nanCode);
    const float a = absF(x);
    if (!(a < fp8MaxOf(format))) return uint8_t(sign | s.maxCode);  // >= max or inf: saturate
    const int emin = 1 - s.bias;  // exponent of the smallest normal
    int e2 = 0;
    frexpF(a, &e2);  // a = f * 2^e2, f in [0.5, 1): floor(log2 a) = e2 - 1
    int E = e2 - 1;
    if (a == 0.0f) return sign;
    if (E < emin) E = emin;  // subnormal: the quantum is 2^(emin - mbits)
    // q = a / quantum, rounded half to even; exact in fp32 (a power-of-two scaling).
    const float q = ldexpF(a, s.mbits - E);
    const float r = rintF(q);
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

// Bulk rounding on the fp32 bits (fp8QuantizeDequantize): round(v) equals
// fp8Decode(fp8Encode(v)) and is branch-free, so the CPU loop over it vectorizes. Build it with
// make() (on the host for a kernel argument); it is a plain aggregate so it passes by value.
struct Fp8Rounder {
    int mbits, bias;
    float mx, minNormal, magic, subScale;
    uint32_t shift;
    uint8_t nanCode;

    TS_HD static Fp8Rounder make(int format) {
        const Fp8Spec s = fp8Spec(format);
        Fp8Rounder r{};
        r.mbits = s.mbits;
        r.bias = s.bias;
        r.mx = fp8MaxOf(format);
        r.minNormal = ldexpF(1.0f, 1 - s.bias);
        // fp32 addition of 2^(emin - mbits + 23) rounds to the subnormal quantum, to nearest even.
        r.magic = ldexpF(1.0f, 1 - s.bias - s.mbits + 23);
        r.subScale = ldexpF(1.0f, s.mbits + s.bias - 1);  // subnormal value -> its code
        r.shift = uint32_t(23 - s.mbits);
        r.nanCode = s.nanCode;
        return r;
    }
    // The value of the FP8 number nearest to v (ties to even; +-max beyond it; NaN stays NaN).
    TS_HD float round(float v) const {
        const float a = absF(v);
        uint32_t b = hd::floatBits(a);
        b = (b + ((1u << (shift - 1)) - 1u) + ((b >> shift) & 1u)) & ~((1u << shift) - 1u);
        const float normal = hd::floatFromBits(b);
        const float sub = (a + magic) - magic;
        float r = a < minNormal ? sub : normal;
        r = a < mx ? r : mx;
        r = copySignF(r, v);
        return v != v ? v : r;
    }
    // The code of an FP8 value r (from round()).
    TS_HD uint8_t code(float r) const {
        const uint8_t sign = signBit(r) ? 0x80 : 0;
        if (r != r) return uint8_t(sign | nanCode);
        const float a = absF(r);
        if (a < minNormal) return uint8_t(sign | int(a * subScale));
        const uint32_t b = hd::floatBits(a);
        const int e = int((b >> 23) & 0xFF) - 127 + bias;
        const int m = int((b >> shift) & ((1u << mbits) - 1u));
        return uint8_t(sign | (e << mbits) | m);
    }
};

// E8M0 (TE float_to_e8m0 without cvt.rp): NaN -> 0xFF, inf -> 0xFE, 0 -> 0x00; else the fp32
// biased exponent, plus one when any mantissa bit is set, except at 0xFE (satfinite) and for
// subnormals up to 2^-127 (exponent 0, mantissa <= 0x400000).
TS_HD inline uint8_t e8m0FromFloat(float v) {
    if (isNaN(v)) return 0xFF;
    if (isInf(v)) return 0xFE;
    if (v == 0.0f) return 0x00;
    const uint32_t u = hd::floatBits(v);
    uint32_t e = (u >> 23) & 0xFF;  // TE reads the bits of a non-negative amax ratio
    const uint32_t m = u & 0x7FFFFF;
    if (m > 0 && e != 0xFE && !(e == 0 && m <= 0x400000)) ++e;
    return uint8_t(e);
}

// 2^(e - 127) (0x00 = 2^-127, a subnormal; 0xFF = NaN).
TS_HD inline float e8m0ToFloat(uint8_t e) {
    if (e == 0xFF) return quietNaN();
    return ldexpF(1.0f, int(e) - 127);
}

// The factor an MXFP8 block multiplies by before encoding: TE's exp2f_rcp, 2^(127 - e), and 1
// for e = 0.
TS_HD inline float e8m0EncodeFactor(uint8_t e) { return e == 0 ? 1.0f : ldexpF(1.0f, 127 - int(e)); }

// Blockwise scale from a block's amax: fp8Max / amax, 1 when amax is 0 or not finite, FLT_MAX
// on overflow; pow2: the mantissa bits zeroed (rounded down to a power of two).
TS_HD inline float fp8BlockScale(float amax, float fp8Max, bool pow2) {
    float s = 1.0f;
    if (!isNaN(amax) && !isInf(amax) && amax > 0.0f) {
        s = fp8Max / amax;
        if (isInf(s)) s = 3.40282346638528859812e+38f;  // FLT_MAX
    }
    if (pow2) s = hd::floatFromBits(hd::floatBits(s) & 0xFF800000u);  // sign and exponent
    return s;
}

// max for amax reductions where a NaN anywhere makes the result NaN (order-independent on
// non-negative inputs: every NaN with a clear sign bit compares above +inf as an integer).
TS_HD inline float amaxCombine(float amax, float absValue) {
    return (isNaN(absValue) || isNaN(amax)) ? quietNaN() : (absValue > amax ? absValue : amax);
}

}  // namespace ts::kernels::fp8s
