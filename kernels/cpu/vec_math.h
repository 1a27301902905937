// Internal helpers for the CPU kernels: vectorizable math (exp, sigmoid) and lane-split
// reductions. GCC only vectorizes float reductions when it may reassociate, which we do not
// allow globally (results must not depend on flags), so reductions keep kLanes independent
// partial sums explicitly; the fixed-length inner loops become one SIMD op each under -O3.
// Not part of the public contract (ops.h); include only from kernels/cpu/*.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace ts::kernels::cpu::detail {

inline constexpr int kLanes = 16;  // two AVX2 registers of floats: enough ILP for adds/FMAs

inline float bitsToFloat(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
inline uint32_t floatToBits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

// The Cephes exp core shared by the exp variants below: for a clamped argument xc, writes
// x = n*ln2 + r with |r| <= ln2/2 and returns the degree-6 polynomial exp(r); `ns` receives
// xc*log2e + 1.5*2^23, whose low mantissa bits hold n (valid since |xc*log2e| < 2^22).
inline float expPoly(float xc, float& ns) {
    constexpr float kLog2e = 1.44269504088896341f;
    constexpr float kLn2Hi = 0.693359375f;
    constexpr float kLn2Lo = -2.12194440e-4f;
    constexpr float kShifter = 12582912.0f;  // 1.5*2^23: rounds to nearest
    ns = xc * kLog2e + kShifter;
    const float n = ns - kShifter;
    float r = xc - n * kLn2Hi;
    r = r - n * kLn2Lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

// 2^n from expPoly's `ns` (n in [-126, 127]): bits(ns) = 0x4B400000 + n; adding
// 127 - 0x400000 gives 0x4B000000 + (n + 127), and the shift by 23 drops the 0x4B000000 part,
// leaving the biased exponent n + 127.
inline float pow2FromShifted(float ns) { return bitsToFloat((floatToBits(ns) + (127u - 0x400000u)) << 23); }

// exp(x) for float, branch-free so loops over it vectorize. Cephes-style: x = n*ln2 + r with
// |r| <= ln2/2, a degree-6 polynomial for exp(r), 2^n built in the exponent bits. Relative error
// about 2 ulp over the normal range. Inputs below -87.3 (incl. -inf) give exactly 0 (results
// there would be denormal), inputs above ln(FLT_MAX) give +inf; NaN propagates.
inline float expApprox(float x) {
    const float xc = x < -87.3f ? -87.3f : (x > 88.7228f ? 88.7228f : x);
    float ns;
    const float p = expPoly(xc, ns);
    // 2^n: n in [-126, 128]; for n = 128 split as 2^127 * 2 to stay a normal scale factor
    const int ni = static_cast<int>(ns - 12582912.0f);
    const int n1 = ni > 127 ? 127 : ni;
    const float s1 = bitsToFloat(static_cast<uint32_t>(n1 + 127) << 23);
    const float s2 = ni > 127 ? 2.0f : 1.0f;
    float y = p * s1 * s2;
    y = x < -87.3f ? 0.0f : y;
    y = x > 88.7228f ? std::numeric_limits<float>::infinity() : y;
    y = x != x ? x : y;
    return y;
}

// exp(x) for the shifted arguments of softmax-like sums (x - rowmax <= 0): bit-identical to
// expApprox for x <= 88.3 (same reduction and polynomial; 2^n from the shifter's mantissa bits,
// n <= 127, so the split scale of expApprox is never needed), x below -87.3 (incl. -inf) gives
// exactly 0, x above 88.3 gives exp(88.3) instead of inf (callers never pass x > 0), NaN
// propagates. Drops expApprox's overflow and NaN selects: ~6 vector ops per element fewer.
inline float expShifted(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.3f ? 88.3f : xc;
    float ns;
    const float y = expPoly(xc, ns) * pow2FromShifted(ns);
    return x < -87.3f ? 0.0f : y;
}

// exp(x) with the argument clamped to [-80, 80] and no special-value handling, for callers
// that only need exp inside that range (or its limit behaviour, as the GeLU sigmoid in activation.cpp): ~5 vector
// ops per element cheaper than expApprox. Same Cephes polynomial as expApprox, so the same
// ~2 ulp inside the range; |x| > 80 gives exp(+-80); NaN propagates (the clamps keep NaN,
// the polynomial then yields NaN whatever the scale bits are). 2^n comes straight from the
// rounding shifter's low mantissa bits (n in [-116, 116], so no exponent overflow).
inline float expClamped80(float x) {
    float xc = x < -80.0f ? -80.0f : x;
    xc = xc > 80.0f ? 80.0f : xc;
    float ns;
    const float p = expPoly(xc, ns);
    return p * pow2FromShifted(ns);  // n in [-116, 116]
}

inline float sigmoidApprox(float z) { return 1.0f / (1.0f + expApprox(-z)); }

// Sum of x[0..n) with kLanes partial sums (deterministic order for a given n).
inline float sumLanes(const float* x, int64_t n) {
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += x[j + l];
    float s = 0.0f;
    for (; j < n; ++j) s += x[j];
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    return s;
}

inline float dotLanes(const float* a, const float* b, int64_t n) {
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += a[j + l] * b[j + l];
    float s = 0.0f;
    for (; j < n; ++j) s += a[j] * b[j];
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    return s;
}

// Max of x[0..n), n >= 1. NaN inputs are not propagated reliably (callers check finiteness of
// the loss instead).
inline float maxLanes(const float* x, int64_t n) {
    float acc[kLanes];
    for (int l = 0; l < kLanes; ++l) acc[l] = -std::numeric_limits<float>::infinity();
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] = x[j + l] > acc[l] ? x[j + l] : acc[l];
    float m = -std::numeric_limits<float>::infinity();
    for (; j < n; ++j) m = x[j] > m ? x[j] : m;
    for (int l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
    return m;
}

// y[j] = exp(x[j] - shift) for j < n, returns the sum of y (lane-split). shift is the row max
// (so arguments are <= 0); values equal expApprox's bit for bit.
inline float expShiftSum(const float* x, float* y, float shift, int64_t n) {
    float acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
        for (int l = 0; l < kLanes; ++l) {
            const float e = expShifted(x[j + l] - shift);
            y[j + l] = e;
            acc[l] += e;
        }
    float s = 0.0f;
    for (; j < n; ++j) {
        y[j] = expShifted(x[j] - shift);
        s += y[j];
    }
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    return s;
}

}  // namespace ts::kernels::cpu::detail
