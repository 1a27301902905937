// Block-scaled FP8 (kernels/cpu/fp8_block.h; REFERENCE.md §6.4): E8M0 edge cases, a block whose
// amax is or is not a power of two times fp8_max, and MXFP8 / blockwise quantization of a matrix
// along rows and along columns against a reference written here from the definitions (the power
// of two from frexp, the FP8 rounding from fp8Encode/fp8Decode, tested in test_fp8.cpp).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/fp8_block.h"

namespace ts::kernels::cpu {
namespace {

TEST(Fp8Block, E8m0EncodeAndDecodeEdgeCases) {
    EXPECT_EQ(e8m0FromFloat(0.0f), 0x00);
    EXPECT_EQ(e8m0FromFloat(INFINITY), 0xFE);
    EXPECT_EQ(e8m0FromFloat(std::nanf("")), 0xFF);
    EXPECT_EQ(e8m0FromFloat(1.0f), 127);            // exactly 2^0
    EXPECT_EQ(e8m0FromFloat(0.25f), 125);           // exactly 2^-2
    EXPECT_EQ(e8m0FromFloat(1.5f), 128);            // mantissa bits set: rounds up to 2^1
    EXPECT_EQ(e8m0FromFloat(std::nextafter(1.0f, 2.0f)), 128);  // one mantissa bit
    EXPECT_EQ(e8m0FromFloat(std::nextafter(1.0f, 0.0f)), 127);  // just below 1: 2^0
    EXPECT_EQ(e8m0FromFloat(FLT_MAX), 0xFE);        // satfinite: no rounding past 2^127
    EXPECT_EQ(e8m0FromFloat(std::ldexp(1.0f, -127)), 0x00);          // subnormal 2^-127 (mantissa 0x400000)
    EXPECT_EQ(e8m0FromFloat(std::ldexp(1.5f, -127)), 0x01);          // above it: rounds up
    EXPECT_EQ(e8m0FromFloat(std::ldexp(1.0f, -126)), 0x01);          // smallest normal
    EXPECT_EQ(e8m0ToFloat(127), 1.0f);
    EXPECT_EQ(e8m0ToFloat(0xFE), std::ldexp(1.0f, 127));
    EXPECT_EQ(e8m0ToFloat(0x00), std::ldexp(1.0f, -127));
    EXPECT_TRUE(std::isnan(e8m0ToFloat(0xFF)));
    for (int e = 1; e < 0xFF; ++e) EXPECT_EQ(e8m0FromFloat(e8m0ToFloat(uint8_t(e))), e) << e;
}

// A block whose amax / 448 is a power of two is scaled so its amax lands exactly on 448; one
// whose amax is not gets the next power of two up, so nothing saturates.
TEST(Fp8Block, Mxfp8BlockAmaxRepresentableOrNot) {
    std::vector<float> x(32, 1.0f), y(32);
    uint8_t e = 0;
    x[5] = 448.0f * 4;  // amax / 448 = 2^2 exactly
    x[6] = -3.0f;
    fp8BlockQuantizeDequantize(x.data(), y.data(), nullptr, &e, 1, 32, Fp8BlockKind::Mx1x32, true, Fp8Format::E4M3);
    EXPECT_EQ(e, 129);
    EXPECT_EQ(y[5], 448.0f * 4);
    EXPECT_EQ(y[6], -3.0f);   // -0.75 is an E4M3 value
    EXPECT_EQ(y[0], 1.0f);
    x[5] = 500.0f;            // 500 / 448 = 1.116: 2^1, scaled amax 250 (< 448)
    x[7] = 0.3f;              // 0.15 -> 0.15625 (E4M3 step 2^-6 in [2^-3, 2^-2)) -> 0.3125
    fp8BlockQuantizeDequantize(x.data(), y.data(), nullptr, &e, 1, 32, Fp8BlockKind::Mx1x32, true, Fp8Format::E4M3);
    EXPECT_EQ(e, 128);
    EXPECT_EQ(y[5], 512.0f);  // 250 -> 256 (E4M3 step 16 in [128, 256)), times 2
    EXPECT_EQ(y[7], 0.3125f);
    // An all-zero block: scale code 0, zeros out.
    std::vector<float> z(32, 0.0f);
    fp8BlockQuantizeDequantize(z.data(), y.data(), nullptr, &e, 1, 32, Fp8BlockKind::Mx1x32, true, Fp8Format::E4M3);
    EXPECT_EQ(e, 0);
    for (float v : y) EXPECT_EQ(v, 0.0f);
}

// Reference: the block's power of two, ceil(log2(amax / fp8_max)), from frexp.
int refE8m0(float amax, float fp8Max) {
    if (amax == 0.0f) return 0;
    int k = 0;
    const float m = std::frexp(amax * (1.0f / fp8Max), &k);  // r = m * 2^k, m in [0.5, 1)
    return 127 + (m == 0.5f ? k - 1 : k);
}

std::vector<float> randomMatrix(int64_t rows, int64_t cols, uint32_t seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    std::uniform_int_distribution<int> mag(-12, 12);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    // Magnitudes vary by row and by column so row blocks and column blocks get different scales.
    std::vector<int> rowMag(static_cast<size_t>(rows)), colMag(static_cast<size_t>(cols));
    for (auto& m : rowMag) m = mag(gen);
    for (auto& m : colMag) m = mag(gen) / 2;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
            x[size_t(r * cols + c)] = std::ldexp(n(gen), rowMag[size_t(r)] + colMag[size_t(c)]);
    return x;
}

// Reference quantization of one block [r0, r1) x [c0, c1) with multiplier q, inverse dq.
void refBlock(const std::vector<float>& x, std::vector<float>& y, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
              int64_t c1, float q, float dq, Fp8Format f) {
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
            const size_t i = size_t(r * cols + c);
            y[i] = fp8Decode(fp8Encode(x[i] * q, f), f) * dq;
        }
}

float refAmax(const std::vector<float>& x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    float a = 0;
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) a = std::max(a, std::fabs(x[size_t(r * cols + c)]));
    return a;
}

TEST(Fp8Block, Mxfp8QuantizeAlongRowsAndAlongColumns) {
    const int64_t rows = 70, cols = 72;  // partial blocks at the end of both dimensions
    const std::vector<float> x = randomMatrix(rows, cols, 7);
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
        for (bool alongRows : {true, false}) {
            std::vector<float> got(x.size()), want(x.size());
            std::vector<uint8_t> scales(size_t(fp8BlockScaleCount(rows, cols, Fp8BlockKind::Mx1x32, alongRows)));
            fp8BlockQuantizeDequantize(x.data(), got.data(), nullptr, scales.data(), rows, cols, Fp8BlockKind::Mx1x32,
                                       alongRows, f);
            size_t idx = 0;
            auto one = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
                const int e = refE8m0(refAmax(x, cols, r0, r1, c0, c1), fp8Max(f));
                EXPECT_EQ(scales[idx++], e);
                refBlock(x, want, cols, r0, r1, c0, c1, std::ldexp(1.0f, 127 - e), std::ldexp(1.0f, e - 127), f);
            };
            if (alongRows) {
                for (int64_t r = 0; r < rows; ++r)
                    for (int64_t c0 = 0; c0 < cols; c0 += 32) one(r, r + 1, c0, std::min(cols, c0 + 32));
            } else {
                for (int64_t r0 = 0; r0 < rows; r0 += 32)
                    for (int64_t c = 0; c < cols; ++c) one(r0, std::min(rows, r0 + 32), c, c + 1);
            }
            EXPECT_EQ(idx, scales.size());
            EXPECT_EQ(got, want) << "along " << (alongRows ? "rows" : "columns");
        }
    // Rowwise and columnwise are different quantizations of the same tensor (both from it).
    std::vector<float> r(x.size()), c(x.size());
    fp8BlockQuantizeDequantize(x.data(), r.data(), nullptr, nullptr, rows, cols, Fp8BlockKind::Mx1x32, true, Fp8Format::E4M3);
    fp8BlockQuantizeDequantize(x.data(), c.data(), nullptr, nullptr, rows, cols, Fp8BlockKind::Mx1x32, false, Fp8Format::E4M3);
    EXPECT_NE(r, c);
}

TEST(Fp8Block, BlockwiseScalesPowerOfTwoOrFp32) {
    EXPECT_EQ(fp8BlockScale(448.0f, 448.0f, true), 1.0f);
    EXPECT_EQ(fp8BlockScale(500.0f, 448.0f, false), 448.0f / 500.0f);
    EXPECT_EQ(fp8BlockScale(500.0f, 448.0f, true), 0.5f);   // 0.896 rounded down
    EXPECT_EQ(fp8BlockScale(3.0f, 448.0f, true), 128.0f);   // 149.3 -> 128
    EXPECT_EQ(fp8BlockScale(0.0f, 448.0f, true), 1.0f);
    EXPECT_EQ(fp8BlockScale(NAN, 448.0f, false), 1.0f);
    EXPECT_EQ(fp8BlockScale(1e-40f, 448.0f, false), FLT_MAX);
    EXPECT_EQ(fp8BlockScale(1e-40f, 448.0f, true), std::ldexp(1.0f, 127));
}

TEST(Fp8Block, BlockwiseQuantize1x128And128x128) {
    const int64_t rows = 130, cols = 200;
    const std::vector<float> x = randomMatrix(rows, cols, 11);
    const Fp8Format f = Fp8Format::E4M3;
    for (bool pow2 : {true, false})
        for (Fp8BlockKind kind : {Fp8BlockKind::Block1x128, Fp8BlockKind::Block128x128})
            for (bool alongRows : {true, false}) {
                std::vector<float> got(x.size()), want(x.size());
                std::vector<float> inv(size_t(fp8BlockScaleCount(rows, cols, kind, alongRows)));
                fp8BlockQuantizeDequantize(x.data(), got.data(), nullptr, inv.data(), rows, cols, kind, alongRows, f, pow2);
                size_t idx = 0;
                auto one = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
                    float s = 448.0f / refAmax(x, cols, r0, r1, c0, c1);
                    if (pow2) s = std::ldexp(1.0f, std::ilogb(s));  // the power of two at or below
                    EXPECT_EQ(inv[idx++], 1.0f / s);
                    refBlock(x, want, cols, r0, r1, c0, c1, s, 1.0f / s, f);
                };
                if (kind == Fp8BlockKind::Block128x128) {
                    for (int64_t r0 = 0; r0 < rows; r0 += 128)
                        for (int64_t c0 = 0; c0 < cols; c0 += 128) one(r0, std::min(rows, r0 + 128), c0, std::min(cols, c0 + 128));
                } else if (alongRows) {
                    for (int64_t r = 0; r < rows; ++r)
                        for (int64_t c0 = 0; c0 < cols; c0 += 128) one(r, r + 1, c0, std::min(cols, c0 + 128));
                } else {
                    for (int64_t r0 = 0; r0 < rows; r0 += 128)
                        for (int64_t c = 0; c < cols; ++c) one(r0, std::min(rows, r0 + 128), c, c + 1);
                }
                EXPECT_EQ(idx, inv.size());
                EXPECT_EQ(got, want) << int(kind) << " rows " << alongRows << " pow2 " << pow2;
            }
    // A 2D tile is one quantization whatever the direction (TE: no separate columnwise pass).
    std::vector<float> a(x.size()), b(x.size());
    fp8BlockQuantizeDequantize(x.data(), a.data(), nullptr, nullptr, rows, cols, Fp8BlockKind::Block128x128, true, f);
    fp8BlockQuantizeDequantize(x.data(), b.data(), nullptr, nullptr, rows, cols, Fp8BlockKind::Block128x128, false, f);
    EXPECT_EQ(a, b);
}

TEST(Fp8Block, MemoryIsOneBytePerElementPlusTheScales) {
    EXPECT_EQ(fp8BlockBytes(64, 96, Fp8BlockKind::Mx1x32, true), 64 * 96 + 64 * 3);
    EXPECT_EQ(fp8BlockBytes(64, 96, Fp8BlockKind::Mx1x32, false), 64 * 96 + 2 * 96);
    EXPECT_EQ(fp8BlockBytes(64, 200, Fp8BlockKind::Block1x128, true), 64 * 200 + 4 * 64 * 2);
    EXPECT_EQ(fp8BlockBytes(256, 200, Fp8BlockKind::Block128x128, true), 256 * 200 + 4 * 2 * 2);
}

}  // namespace
}  // namespace ts::kernels::cpu
