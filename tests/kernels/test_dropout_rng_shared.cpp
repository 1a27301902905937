// The host/device functions that the CUDA kernels run for the bit-exact ops (the dropout RNG in
// kernels/common/dropout_rng.h, the bf16 rounding in kernels/common/bf16.h), checked on the CPU
// against the oracle: element by element the way a GPU thread computes them (one element or one
// pair at a time, any offset), and against fingerprints of the masks the oracle produced before
// the RNG moved into the shared header, so neither side can drift.
#include <gtest/gtest.h>

#include "kernels/common/bf16.h"
#include "kernels/common/dropout_rng.h"
#include "kernels/cpu/ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace ts::kernels {
namespace {

uint64_t fnv1a(const void* data, size_t bytes) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < bytes; ++i) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

// Mask element i of a call (seed, offset, p) as one GPU thread per element computes it.
std::vector<uint8_t> perElementMask(int64_t n, float p, uint64_t seed, uint64_t offset) {
    const uint64_t key = hd::dropoutStreamKey(seed), thr = hd::dropoutThreshold(p);
    std::vector<uint8_t> m(n);
    for (int64_t i = 0; i < n; ++i) m[i] = hd::dropoutKeep(key, offset + static_cast<uint64_t>(i), thr);
    return m;
}

// As kernels/cuda/dropout.cu does it: one hash per pair of stream elements, pairs counted from
// offset / 2, the first element of the call being the low half when offset is odd.
std::vector<uint8_t> perPairMask(int64_t n, float p, uint64_t seed, uint64_t offset) {
    const uint64_t key = hd::dropoutStreamKey(seed), thr = hd::dropoutThreshold(p);
    std::vector<uint8_t> m(n, 7);
    const int64_t odd = static_cast<int64_t>(offset & 1);
    const int64_t pairs = (n + odd + 1) / 2;
    for (int64_t k = 0; k < pairs; ++k) {
        const uint64_t bits = hd::dropoutPairBits(key, (offset >> 1) + static_cast<uint64_t>(k));
        const int64_t i = 2 * k - odd;
        if (i >= 0) m[i] = hd::dropoutKeepHigh(bits, thr);
        if (i + 1 < n) m[i + 1] = hd::dropoutKeepLow(bits, thr);
    }
    return m;
}

struct MaskCase {
    uint64_t seed, offset;
    float p;
    int64_t n;
    int keeps;
    uint64_t fingerprint;  // fnv1a of the oracle's mask bytes (recorded before the refactor)
};

constexpr MaskCase kCases[] = {
    {0ull, 0ull, 0.1f, 4099, 3735, 0xc5b461de9a9f0feeull},
    {1234ull, 1ull, 0.5f, 5000, 2497, 0x36d2bcfd4b147e04ull},
    {3735928559ull, 77777ull, 0.3f, 2049, 1439, 0x9c8ee63b0f0baaccull},
    {42ull, 1099511627779ull, 0.9f, 3001, 312, 0xa5f9c34e2fd050d9ull},
    {7ull, 5ull, 0.0f, 100, 100, 0x9aa9aa99520538b7ull},
    {7ull, 5ull, 1.0f, 100, 0, 0x6494cc221d5e7db3ull},
    {99ull, 2ull, 1e-6f, 10000, 10000, 0x46971c13f59c6353ull},
};

TEST(KernelsSharedHd, DropoutMaskMatchesRecordedOracleMasks) {
    for (const auto& c : kCases) {
        std::vector<uint8_t> m(c.n);
        cpu::dropoutMask(m.data(), c.n, c.p, c.seed, c.offset);
        int keeps = 0;
        for (uint8_t v : m) keeps += v;
        EXPECT_EQ(keeps, c.keeps) << "seed " << c.seed << " offset " << c.offset << " p " << c.p;
        EXPECT_EQ(fnv1a(m.data(), m.size()), c.fingerprint)
            << "seed " << c.seed << " offset " << c.offset << " p " << c.p;
    }
}

// A seed with a step key reads the key when the kernel runs (a graph's kernels keep the pointer
// and see each step's key): the mask of DropoutSeed{&key, site} is the plain seed
// dropoutCombine(key, site)'s, whatever the key holds at the call.
TEST(KernelsSharedHd, ASeedWithAStepKeyReadsTheKeyAtTheCall) {
    constexpr int64_t n = 999;
    uint64_t key = 17;
    const hd::DropoutSeed seed(&key, 5);
    std::vector<uint8_t> first(n), second(n), plain(n);
    cpu::dropoutMask(first.data(), n, 0.4f, seed, 3);
    cpu::dropoutMask(plain.data(), n, 0.4f, hd::dropoutCombine(17, 5), 3);
    EXPECT_EQ(first, plain);
    key = 18;
    cpu::dropoutMask(second.data(), n, 0.4f, seed, 3);
    cpu::dropoutMask(plain.data(), n, 0.4f, hd::dropoutCombine(18, 5), 3);
    EXPECT_EQ(second, plain);
    EXPECT_NE(first, second);
    EXPECT_EQ(hd::DropoutSeed(1234).value(), 1234u) << "a plain seed is itself";
}

void expectSameMask(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                    const char* what, uint64_t seed, uint64_t offset, float p) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i]) {
            ADD_FAILURE() << what << ": mask[" << i << "] = " << int(got[i]) << ", oracle "
                          << int(want[i]) << " (seed " << seed << ", offset " << offset << ", p " << p
                          << ")";
            return;
        }
}

TEST(KernelsSharedHd, PerElementAndPerPairKeepBitsReproduceTheOracle) {
    for (const auto& c : kCases) {
        std::vector<uint8_t> want(c.n);
        cpu::dropoutMask(want.data(), c.n, c.p, c.seed, c.offset);
        expectSameMask(perElementMask(c.n, c.p, c.seed, c.offset), want, "per element", c.seed,
                       c.offset, c.p);
        expectSameMask(perPairMask(c.n, c.p, c.seed, c.offset), want, "per pair", c.seed, c.offset,
                       c.p);
    }
    // Small and odd lengths at odd and even offsets (1 element, a lone low half, ...).
    for (int64_t n : {1, 2, 3, 4, 5, 33})
        for (uint64_t off : {0ull, 1ull, 2ull, 3ull, 1001ull})
            for (float p : {0.25f, 0.5f}) {
                std::vector<uint8_t> want(n);
                cpu::dropoutMask(want.data(), n, p, 17, off);
                expectSameMask(perElementMask(n, p, 17, off), want, "per element", 17, off, p);
                expectSameMask(perPairMask(n, p, 17, off), want, "per pair", 17, off, p);
            }
}

// The masks dropoutForward and the fused bias-dropout-add write (chunked internally by 2048,
// rows of C at t*C) are the same stream elements offset + flat index.
TEST(KernelsSharedHd, ForwardAndFusedMasksAreTheStreamAtTheFlatIndex) {
    const int T = 3, C = 2500;  // C > the CPU's 2048-element chunk
    const int64_t n = static_cast<int64_t>(T) * C;
    const uint64_t seed = 5, offset = 12345;
    const float p = 0.4f;
    std::vector<float> x(n, 1.0f), y(n), r(n, 0.0f), b(C, 0.0f);
    std::vector<uint8_t> m1(n), m2(n);
    cpu::dropoutForward(x.data(), y.data(), m1.data(), n, p, seed, offset);
    cpu::biasDropoutAddFused(x.data(), b.data(), r.data(), y.data(), m2.data(), T, C, p, seed, offset);
    const auto want = perElementMask(n, p, seed, offset);
    expectSameMask(m1, want, "dropoutForward", seed, offset, p);
    expectSameMask(m2, want, "biasDropoutAddFused", seed, offset, p);
}

TEST(KernelsSharedHd, ThresholdAndScale) {
    EXPECT_EQ(hd::dropoutThreshold(0.0f), 0u);
    EXPECT_EQ(hd::dropoutThreshold(-1.0f), 0u);
    EXPECT_EQ(hd::dropoutThreshold(std::numeric_limits<float>::quiet_NaN()), 0u);
    EXPECT_EQ(hd::dropoutThreshold(1.0f), uint64_t{1} << 32);
    EXPECT_EQ(hd::dropoutThreshold(0.5f), uint64_t{1} << 31);
    EXPECT_EQ(hd::dropoutKeepScale(0.5f), 2.0f);
    EXPECT_EQ(hd::dropoutKeepScale(1.0f), 0.0f);
}

float fromBits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

uint32_t toBits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

TEST(KernelsSharedHd, Bf16MatchesTheOracleOnRandomBitPatternsAndSpecials) {
    std::vector<float> xs;
    uint32_t s = 12345;
    for (int i = 0; i < 100000; ++i) {
        s = s * 1664525u + 1013904223u;
        xs.push_back(fromBits(s));
    }
    std::vector<uint16_t> y(xs.size());
    cpu::floatToBf16(xs.data(), y.data(), static_cast<int64_t>(xs.size()));
    // Recorded from the oracle before the conversion moved into kernels/common/bf16.h.
    EXPECT_EQ(fnv1a(y.data(), y.size() * 2), 0xdc2ffd39a0862223ull);
    for (uint32_t u : {0x00000000u, 0x80000000u, 0x3F800000u, 0x3F808000u, 0x3F818000u, 0x3F808001u,
                       0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFF800001u,
                       0x7F800001u, 0x00000001u, 0x807FFFFFu})
        xs.push_back(fromBits(u));
    y.resize(xs.size());
    cpu::floatToBf16(xs.data(), y.data(), static_cast<int64_t>(xs.size()));
    std::vector<float> back(xs.size()), rounded = xs;
    cpu::bf16ToFloat(y.data(), back.data(), static_cast<int64_t>(y.size()));
    cpu::roundToBf16(rounded.data(), static_cast<int64_t>(rounded.size()));
    for (size_t i = 0; i < xs.size(); ++i) {
        ASSERT_EQ(hd::bf16FromFloat(xs[i]), y[i]) << "bits 0x" << std::hex << toBits(xs[i]);
        ASSERT_EQ(toBits(hd::bf16ToFloatValue(y[i])), toBits(back[i])) << "bf16 0x" << std::hex << y[i];
        ASSERT_EQ(toBits(hd::bf16RoundFloat(xs[i])), toBits(rounded[i]))
            << "bits 0x" << std::hex << toBits(xs[i]);
    }
    // Ties go to even, overflow goes to inf, NaN stays NaN.
    EXPECT_EQ(hd::bf16FromFloat(fromBits(0x3F808000u)), 0x3F80u);
    EXPECT_EQ(hd::bf16FromFloat(fromBits(0x3F818000u)), 0x3F82u);
    EXPECT_EQ(hd::bf16FromFloat(fromBits(0x7F7FFFFFu)), 0x7F80u);
    EXPECT_TRUE(std::isnan(hd::bf16RoundFloat(fromBits(0x7F800001u))));
}

}  // namespace
}  // namespace ts::kernels
