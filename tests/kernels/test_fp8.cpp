// FP8 emulation (kernels/cpu/fp8.cpp) against references written here: the OCP FP8 values
// known by heart, a brute-force nearest-value search over all 256 codes (ties to the even
// code), and the saturation rule of Transformer Engine's cast (REFERENCE.md §6.1).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {
namespace {

// Independent decode: sign, exponent field, mantissa field, by the OCP spec's formula in double.
double refValue(uint8_t c, Fp8Format f) {
    const int mbits = f == Fp8Format::E4M3 ? 3 : 2, ebits = 7 - mbits, bias = f == Fp8Format::E4M3 ? 7 : 15;
    const int s = c >> 7, e = (c >> mbits) & ((1 << ebits) - 1), m = c & ((1 << mbits) - 1);
    double v;
    if (f == Fp8Format::E4M3 && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
    if (f == Fp8Format::E5M2 && e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : (s ? -INFINITY : INFINITY);
    if (e == 0) v = std::pow(2.0, 1 - bias) * (m / double(1 << mbits));
    else v = std::pow(2.0, e - bias) * (1.0 + m / double(1 << mbits));
    return s ? -v : v;
}

// Nearest finite code by search (ties: the code with an even mantissa LSB); beyond max: max.
uint8_t refEncode(float x, Fp8Format f) {
    const double mx = f == Fp8Format::E4M3 ? 448.0 : 57344.0;
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const double a = std::fabs(double(x));
    if (a >= mx) return uint8_t(sign | (f == Fp8Format::E4M3 ? 0x7E : 0x7B));
    int best = -1;
    double bestD = INFINITY;
    for (int c = 0; c < 128; ++c) {
        const double v = refValue(uint8_t(c), f);
        if (!std::isfinite(v)) continue;
        const double d = std::fabs(v - a);
        if (d < bestD || (d == bestD && (c & 1) == 0)) {
            bestD = d;
            best = c;
        }
    }
    return uint8_t(sign | best);
}

class Fp8Codes : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(Fp8Codes, All256CodesDecodeToTheSpecValueAndReEncodeToThemselves) {
    const Fp8Format f = GetParam();
    int nans = 0;
    for (int c = 0; c < 256; ++c) {
        const double want = refValue(uint8_t(c), f);
        const float got = fp8Decode(uint8_t(c), f);
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got)) << c;
            EXPECT_TRUE(std::isnan(fp8Decode(fp8Encode(got, f), f))) << c;
            ++nans;
            continue;
        }
        EXPECT_EQ(double(got), want) << "code " << c;
        if (std::isinf(want)) {  // E5M2 infinities saturate (TE's cast)
            EXPECT_EQ(fp8Encode(got, f), uint8_t((c & 0x80) | 0x7B)) << c;
            continue;
        }
        EXPECT_EQ(fp8Encode(got, f), uint8_t(c)) << "code " << c << " value " << got;
    }
    EXPECT_EQ(nans, f == Fp8Format::E4M3 ? 2 : 6);
}

TEST_P(Fp8Codes, RoundingIsToTheNearestValueTiesToEven) {
    const Fp8Format f = GetParam();
    // Every midpoint between neighbouring codes (ties), and points just around them.
    for (int c = 0; c < 0x7E; ++c) {
        const double lo = refValue(uint8_t(c), f), hi = refValue(uint8_t(c + 1), f);
        if (!std::isfinite(hi)) break;
        const float mid = float((lo + hi) / 2);  // exact in fp32
        ASSERT_EQ(double(mid), (lo + hi) / 2);
        const uint8_t even = (c & 1) == 0 ? uint8_t(c) : uint8_t(c + 1);
        EXPECT_EQ(fp8Encode(mid, f), even) << "tie between codes " << c << " and " << c + 1;
        EXPECT_EQ(fp8Encode(-mid, f), uint8_t(0x80 | even));
        EXPECT_EQ(fp8Encode(std::nextafter(mid, 0.0f), f), uint8_t(c));
        EXPECT_EQ(fp8Encode(std::nextafter(mid, INFINITY), f), uint8_t(c + 1));
    }
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> lg(-20.0f, 17.0f);
    for (int i = 0; i < 20000; ++i) {
        const float x = (i & 1 ? -1.0f : 1.0f) * std::exp2(lg(rng));
        ASSERT_EQ(fp8Encode(x, f), refEncode(x, f)) << x;
    }
}

TEST_P(Fp8Codes, OverflowAndInfinitySaturateNaNStaysNaN) {
    const Fp8Format f = GetParam();
    const float mx = f == Fp8Format::E4M3 ? 448.0f : 57344.0f;
    EXPECT_EQ(fp8Max(f), mx);
    const uint8_t maxCode = f == Fp8Format::E4M3 ? 0x7E : 0x7B;
    for (float x : {mx, std::nextafter(mx, INFINITY), mx * 1.07f, mx * 1000.0f, INFINITY, 3.0e38f}) {
        EXPECT_EQ(fp8Encode(x, f), maxCode) << x;
        EXPECT_EQ(fp8Encode(-x, f), uint8_t(0x80 | maxCode)) << x;
    }
    EXPECT_EQ(fp8Decode(maxCode, f), mx);
    EXPECT_TRUE(std::isnan(fp8Decode(fp8Encode(std::nanf(""), f), f)));
    // Below the smallest subnormal's half: zero (with sign); the half itself ties to even (zero).
    const float tiny = f == Fp8Format::E4M3 ? std::ldexp(1.0f, -9) : std::ldexp(1.0f, -16);
    EXPECT_EQ(fp8Encode(tiny, f), 0x01);
    EXPECT_EQ(fp8Encode(tiny / 2, f), 0x00);
    EXPECT_EQ(fp8Encode(-tiny / 2, f), 0x80);
    EXPECT_EQ(fp8Encode(std::nextafter(tiny / 2, 1.0f), f), 0x01);
}

TEST_P(Fp8Codes, BulkQuantizeEqualsEncodeThenDecode) {
    // fp8QuantizeDequantize rounds on the fp32 bits; with and without codes it must give the
    // encoder's codes and values for every input: all midpoints, subnormals, overflow, NaN,
    // random values.
    const Fp8Format f = GetParam();
    std::vector<float> x;
    for (int c = 0; c < 0x7E; ++c) {
        const double lo = refValue(uint8_t(c), f), hi = refValue(uint8_t(c + 1), f);
        if (!std::isfinite(hi)) break;
        const float mid = float((lo + hi) / 2);
        for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), float(lo)}) {
            x.push_back(v);
            x.push_back(-v);
        }
    }
    for (float v : {0.0f, -0.0f, 1e-30f, INFINITY, -INFINITY, 1e6f, -3e38f}) x.push_back(v);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> lg(-24.0f, 18.0f);
    for (int i = 0; i < 20000; ++i) x.push_back((i & 1 ? -1.0f : 1.0f) * std::exp2(lg(rng)));
    for (float scale : {1.0f, 37.5f, 0.125f}) {
        std::vector<float> a(x.size()), b(x.size());
        std::vector<uint8_t> codes(x.size());
        fp8QuantizeDequantize(x.data(), a.data(), codes.data(), int64_t(x.size()), scale, f);
        fp8QuantizeDequantize(x.data(), b.data(), nullptr, int64_t(x.size()), scale, f);
        for (size_t i = 0; i < x.size(); ++i) {
            ASSERT_EQ(a[i], b[i]) << "x=" << x[i] << " scale " << scale;
            const float xs = x[i] * scale;
            // The codes are the encoder's (infinities saturate, as fp8Encode does).
            ASSERT_EQ(codes[i], fp8Encode(xs, f)) << "x=" << x[i] << " scale " << scale;
            ASSERT_EQ(a[i], fp8Decode(fp8Encode(xs, f), f) * (1.0f / scale)) << "x=" << x[i];
        }
    }
    std::vector<float> nan = {std::nanf("")}, out(1);
    fp8QuantizeDequantize(nan.data(), out.data(), nullptr, 1, 1.0f, f);
    EXPECT_TRUE(std::isnan(out[0]));
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Codes, ::testing::Values(Fp8Format::E4M3, Fp8Format::E5M2),
                         [](const auto& info) { return info.param == Fp8Format::E4M3 ? "E4M3" : "E5M2"; });

TEST(Fp8, QuantizeDequantizeAppliesTheScaleAndItsInverse) {
    const float scale = 448.0f / 3.0f;  // amax 3 maps to E4M3's max
    std::vector<float> x = {3.0f, -3.0f, 1.0f, 0.01f, -2.5f, 0.0f, 7.0f};
    std::vector<float> y(x.size());
    std::vector<uint8_t> codes(x.size());
    fp8QuantizeDequantize(x.data(), y.data(), codes.data(), int64_t(x.size()), scale, Fp8Format::E4M3);
    for (size_t i = 0; i < x.size(); ++i) {
        const uint8_t c = refEncode(x[i] * scale, Fp8Format::E4M3);
        EXPECT_EQ(codes[i], c) << i;
        EXPECT_EQ(y[i], float(refValue(c, Fp8Format::E4M3)) * (1.0f / scale)) << i;
    }
    EXPECT_NEAR(y[0], 3.0f, 1e-6);   // amax is exact
    EXPECT_NEAR(y[6], 3.0f, 1e-6);   // beyond amax: saturated to it
    EXPECT_EQ(amaxOf(x.data(), int64_t(x.size())), 7.0f);
}

// Current scaling with the amax in memory: the same codes and values as quantizing with the scale
// fp8Max / (amax / divisor) divided by the divisor, computed here; amax 0 gives scale 1.
TEST(Fp8, QuantizeCurrentTakesItsScaleFromTheAmaxElement) {
    const std::vector<float> x = {0.3f, -1.7f, 2.9f, -0.01f, 5.5f};
    for (const float divisor : {1.0f, 4.0f})
        for (const Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
            const float amax = 5.5f * 2.0f;  // the tensor's amax over all its ranks (here: larger)
            std::vector<float> y(x.size()), want(x.size());
            std::vector<uint8_t> codes(x.size()), wantCodes(x.size());
            float observed = -1.f;
            fp8QuantizeCurrent(x.data(), y.data(), codes.data(), int64_t(x.size()), &amax, divisor, f, &observed);
            const float a = amax / divisor, scale = fp8Max(f) / a;
            EXPECT_EQ(observed, a);
            fp8QuantizeDequantize(x.data(), want.data(), wantCodes.data(), int64_t(x.size()), scale / divisor, f);
            EXPECT_EQ(y, want) << "divisor " << divisor;
            EXPECT_EQ(codes, wantCodes);
        }
    const float zero = 0.f;
    std::vector<float> y(x.size()), want(x.size());
    fp8QuantizeCurrent(x.data(), y.data(), nullptr, int64_t(x.size()), &zero, 1.f, Fp8Format::E4M3, nullptr);
    fp8QuantizeDequantize(x.data(), want.data(), nullptr, int64_t(x.size()), 1.f, Fp8Format::E4M3);
    EXPECT_EQ(y, want) << "amax 0: scale 1";
}

// Delayed scaling's observation: the running max of amax / divisor over the calls, NaN sticking
// from either side (Fp8Meta::observe's rule, which the device pack replaces).
TEST(Fp8, AmaxAccumulateKeepsTheRunningMaxAndNaNSticks) {
    const std::vector<float> a = {1.f, -6.f, 2.f}, b = {-3.f, 0.5f}, nan = {1.f, NAN};
    float slot = 0.f;
    amaxAccumulate(a.data(), 3, 2.f, &slot);
    EXPECT_EQ(slot, 3.f);
    amaxAccumulate(b.data(), 2, 1.f, &slot);
    EXPECT_EQ(slot, 3.f);  // 3 is not above it
    amaxAccumulate(b.data(), 2, 0.5f, &slot);
    EXPECT_EQ(slot, 6.f);
    amaxAccumulate(a.data(), 0, 1.f, &slot);  // nothing observed: amax 0
    EXPECT_EQ(slot, 6.f);
    amaxAccumulate(nan.data(), 2, 1.f, &slot);
    EXPECT_TRUE(std::isnan(slot));
    amaxAccumulate(a.data(), 3, 1.f, &slot);
    EXPECT_TRUE(std::isnan(slot)) << "NaN must stick";
    float fresh = NAN;
    amaxAccumulate(a.data(), 3, 1.f, &fresh);
    EXPECT_TRUE(std::isnan(fresh));
}

}  // namespace
}  // namespace ts::kernels::cpu
