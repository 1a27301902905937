// The shared FP8 / E8M0 scalar functions (kernels/common/fp8_scalar.h), which the CUDA kernels
// run too, against the CPU oracle's results from before they were shared: FNV-1a hashes of the
// codes and values over 2^20 float bit patterns spread over the whole 32-bit space (i * a
// golden-ratio constant, a bijection mod 2^32), recorded with the oracle's previous fp8.cpp and
// fp8_block.cpp (which also agreed on all 2^32 patterns). A change in any rounding path changes
// a hash; the message says which function. Direct checks of the shared rounder follow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/fp8_scalar.h"
#include "kernels/cpu/fp8_block.h"

namespace ts::kernels::cpu {
namespace {

float fromBits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
uint32_t toBits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

struct Fnv {
    uint64_t h = 1469598103934665603ull;
    void add(uint64_t v, int bytes) {
        for (int i = 0; i < bytes; ++i) {
            h ^= (v >> (8 * i)) & 0xFF;
            h *= 1099511628211ull;
        }
    }
};

constexpr uint32_t kSpread = 0x9E3779B1u;
constexpr uint32_t kPatterns = 1u << 20;

TEST(Fp8Scalar, EncodeDecodeAndBulkRoundingMatchTheOraclesPreviousResults) {
    Fnv enc[2], rnd[2], e8;
    const size_t chunk = 1 << 16;
    std::vector<float> x(chunk), y(chunk);
    std::vector<uint8_t> codes(chunk);
    for (uint32_t base = 0; base < kPatterns; base += chunk) {
        for (size_t k = 0; k < chunk; ++k) x[k] = fromBits((base + uint32_t(k)) * kSpread);
        for (int f = 0; f < 2; ++f) {
            const Fp8Format ff = f ? Fp8Format::E5M2 : Fp8Format::E4M3;
            for (size_t k = 0; k < chunk; ++k) enc[f].add(fp8Encode(x[k], ff), 1);
            fp8QuantizeDequantize(x.data(), y.data(), codes.data(), int64_t(chunk), 1.0f, ff);
            for (size_t k = 0; k < chunk; ++k) {
                rnd[f].add(codes[k], 1);
                rnd[f].add(toBits(y[k]), 4);
            }
        }
        for (size_t k = 0; k < chunk; ++k) e8.add(e8m0FromFloat(x[k]), 1);
    }
    Fnv dec, e8d, bs;
    for (int c = 0; c < 256; ++c) {
        dec.add(toBits(fp8Decode(uint8_t(c), Fp8Format::E4M3)), 4);
        dec.add(toBits(fp8Decode(uint8_t(c), Fp8Format::E5M2)), 4);
        e8d.add(toBits(e8m0ToFloat(uint8_t(c))), 4);
    }
    for (uint32_t i = 0; i < kPatterns; ++i) {
        const float a = fromBits(i * kSpread);
        bs.add(toBits(fp8BlockScale(a, 448.0f, true)), 4);
        bs.add(toBits(fp8BlockScale(a, 57344.0f, false)), 4);
    }
    EXPECT_EQ(enc[0].h, 0xbe41e7d027193107ull) << "fp8Encode E4M3";
    EXPECT_EQ(enc[1].h, 0x5941402897e82506ull) << "fp8Encode E5M2";
    EXPECT_EQ(rnd[0].h, 0x70101e00cf21951eull) << "fp8QuantizeDequantize E4M3 (codes, values)";
    EXPECT_EQ(rnd[1].h, 0x455c4fc990216174ull) << "fp8QuantizeDequantize E5M2 (codes, values)";
    EXPECT_EQ(e8.h, 0x179393fc0bf9f9baull) << "e8m0FromFloat";
    EXPECT_EQ(dec.h, 0x5295d93f0fd36363ull) << "fp8Decode (all 256 codes, both formats)";
    EXPECT_EQ(e8d.h, 0x6ce17ab6fa9bfd83ull) << "e8m0ToFloat (all 256)";
    EXPECT_EQ(bs.h, 0xa0d244cba8f053e0ull) << "fp8BlockScale (pow2 and fp32)";
}

// The pieces the CUDA kernels call directly: the rounder's value and code equal the encoder's
// for every pattern of the sweep, and the MXFP8 encode factor is TE's exp2f_rcp.
TEST(Fp8Scalar, SharedRounderEqualsEncodeThenDecode) {
    for (int f = 0; f < 2; ++f) {
        const auto r = fp8s::Fp8Rounder::make(f);
        for (uint32_t i = 0; i < kPatterns; ++i) {
            const float x = fromBits(i * kSpread);
            const float v = r.round(x);
            const uint8_t want = fp8s::fp8Encode(x, f);
            ASSERT_EQ(r.code(v), want) << "format " << f << " x bits 0x" << std::hex << toBits(x);
            const float d = fp8s::fp8Decode(want, f);
            if (std::isnan(d)) {
                ASSERT_TRUE(std::isnan(v)) << std::hex << toBits(x);
            } else {
                ASSERT_EQ(toBits(v), toBits(d)) << "format " << f << " x bits 0x" << std::hex << toBits(x);
            }
        }
    }
    EXPECT_EQ(fp8s::e8m0EncodeFactor(0), 1.0f);
    EXPECT_EQ(fp8s::e8m0EncodeFactor(127), 1.0f);
    EXPECT_EQ(fp8s::e8m0EncodeFactor(130), 0.125f);
    EXPECT_EQ(fp8s::e8m0EncodeFactor(0xFE), std::ldexp(1.0f, -127));
    EXPECT_TRUE(std::isnan(fp8s::amaxCombine(1.0f, NAN)));
    EXPECT_TRUE(std::isnan(fp8s::amaxCombine(NAN, 1.0f)));
    EXPECT_EQ(fp8s::amaxCombine(2.0f, 3.0f), 3.0f);
    EXPECT_EQ(fp8s::amaxCombine(3.0f, INFINITY), INFINITY);
}

}  // namespace
}  // namespace ts::kernels::cpu
