// CUDA kernels of ops_cuda.h's elementwise helpers, bf16, dropout / residual, activations and
// embedding sections, each against the CPU oracle of the same name on random data with odd sizes
// (never a multiple of a block size), null-pointer options (no bias, no mask), p = 0 and p > 0.
// Bit-exact ops are compared bit for bit (masks, dropout and bias-dropout-add values, bf16,
// gathers, the embedding and position-embedding gradients); the others within a tolerance scaled
// to the magnitude (expf vs the CPU's polynomial exp, summation order). Device-scalar results
// (sums, flags, counts) are checked too, including their n = 0 values. Every failure names the op,
// the case and the first wrong elements. Skips without a CUDA build or without a device.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

#ifdef TS_HAVE_CUDA

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops_cuda.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ts::kernels {
namespace {

using namespace gputest;

// Column sums of [T, C] with scale_c = |init_c| + sum_t |dy[t, c]|: a summation-order tolerance.
std::vector<double> columnAbsSums(const std::vector<float>& init, const std::vector<float>& dy, int T, int C) {
    std::vector<double> s(C);
    for (int c = 0; c < C; ++c) {
        double a = std::fabs(init[c]);
        for (int t = 0; t < T; ++t) a += std::fabs(dy[static_cast<size_t>(t) * C + c]);
        s[c] = static_cast<float>(a);  // the fp32 sum's value, as the test always used
    }
    return s;
}

class CudaElementwise : public CudaStreamTest {};

// --- Elementwise helpers ----------------------------------------------------------------------

TEST_F(CudaElementwise, AddAddInPlaceScaleAddBiasAreBitExact) {
    const int T = 391, C = 257;  // n = 100487, odd
    const int64_t n = static_cast<int64_t>(T) * C;
    const auto a = randomVec(n, 1, -3, 3), b = randomVec(n, 2, -3, 3), bias = randomVec(C, 3);
    {
        DeviceVec<float> da(a), db(b), dy(n);
        TS_ASSERT_OK(cuda::add(da.ptr, db.ptr, dy.ptr, n, m_stream));
        sync();
        std::vector<float> y(n);
        cpu::add(a.data(), b.data(), y.data(), n);
        expectSameBits(dy.download(), y, "add");
    }
    {
        DeviceVec<float> dy(a), dx(b);
        TS_ASSERT_OK(cuda::addInPlace(dy.ptr, dx.ptr, n, m_stream));
        sync();
        auto y = a;
        cpu::addInPlace(y.data(), b.data(), n);
        expectSameBits(dy.download(), y, "addInPlace");
    }
    {
        DeviceVec<float> dy(a);
        TS_ASSERT_OK(cuda::scale(dy.ptr, -0.37f, n, m_stream));
        sync();
        auto y = a;
        cpu::scale(y.data(), -0.37f, n);
        expectSameBits(dy.download(), y, "scale");
    }
    {
        DeviceVec<float> dy(a), dbias(bias);
        TS_ASSERT_OK(cuda::addBias(dy.ptr, dbias.ptr, T, C, m_stream));
        sync();
        auto y = a;
        cpu::addBias(y.data(), bias.data(), T, C);
        expectSameBits(dy.download(), y, "addBias", {T, C});
    }
    // Empty calls are no-ops; negative sizes are rejected.
    TS_ASSERT_OK(cuda::add(nullptr, nullptr, nullptr, 0, m_stream));
    TS_ASSERT_OK(cuda::addBias(nullptr, nullptr, 0, C, m_stream));
    EXPECT_FALSE(cuda::add(nullptr, nullptr, nullptr, -1, m_stream).isOk());
    EXPECT_FALSE(cuda::addBias(nullptr, nullptr, -1, C, m_stream).isOk());
}

TEST_F(CudaElementwise, BiasGradAccumulateMatchesCpu) {
    for (const auto& [T, C] : {std::pair{333, 257}, std::pair{5, 31}, std::pair{1000, 33}}) {
        const auto dy = randomVec(static_cast<size_t>(T) * C, 4 + T, -2, 2), db0 = randomVec(C, 5 + C);
        DeviceVec<float> ddy(dy), ddb(db0);
        TS_ASSERT_OK(cuda::biasGradAccumulate(ddy.ptr, ddb.ptr, T, C, m_stream));
        sync();
        auto db = db0;
        cpu::biasGradAccumulate(dy.data(), db.data(), T, C);
        // fp32 sums in another order: error well inside 1e-6 of the sum of magnitudes
        expectClose(ddb.download(), db, 1e-6, 0,
                    "biasGradAccumulate T=" + std::to_string(T) + " C=" + std::to_string(C), {},
                    columnAbsSums(db0, dy, T, C), /*nanMatchesNan=*/false);
    }
}

TEST_F(CudaElementwise, SumSquaresIsDeterministicAndMatchesCpu) {
    for (int64_t n : {int64_t{1000003}, int64_t{4097}, int64_t{1000}, int64_t{1}, int64_t{0}}) {
        const auto x = randomVec(static_cast<size_t>(n), 7, -5, 5);
        DeviceVec<float> dx(x);
        DeviceVec<double> dsum(std::vector<double>{12345.0});
        TS_ASSERT_OK(cuda::sumSquares(dx.ptr, n, dsum.ptr, m_stream));
        sync();
        const double got = dsum.scalar(), want = cpu::sumSquares(x.data(), n);
        EXPECT_NEAR(got, want, 1e-12 * want) << "sumSquares n=" << n;
        TS_ASSERT_OK(cuda::sumSquares(dx.ptr, n, dsum.ptr, m_stream));
        sync();
        EXPECT_EQ(dsum.scalar(), got) << "sumSquares n=" << n << " differs between two calls";
    }
}

// Several tensors' sums of squares added where they are, in order, and the float of the total
// for an all-reduce: as the CPU adds sumSquares in double.
TEST_F(CudaElementwise, SumSquaresAccumulateAddsInOrderAndWritesTheFloat) {
    const std::vector<int64_t> sizes = {1000003, 4097, 0, 1};
    DeviceVec<double> dacc(std::vector<double>{0.5});
    DeviceVec<float> dflt(std::vector<float>{-1.f});
    double want = 0.5;
    for (size_t i = 0; i < sizes.size(); ++i) {
        const auto x = randomVec(static_cast<size_t>(sizes[i]), 31 + uint32_t(i), -3, 3);
        DeviceVec<float> dx(x);
        TS_ASSERT_OK(cuda::sumSquaresAccumulate(dx.ptr, sizes[i], dacc.ptr, i + 1 == sizes.size() ? dflt.ptr : nullptr,
                                                m_stream));
        sync();
        want += cpu::sumSquares(x.data(), sizes[i]);
        EXPECT_NEAR(dacc.scalar(), want, 1e-12 * want) << "after tensor " << i;
    }
    EXPECT_EQ(dflt.scalar(), static_cast<float>(dacc.scalar())) << "the float of the total";
}

TEST_F(CudaElementwise, AllFiniteWritesTheFlag) {
    const int64_t n = 100001;
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    struct Case {
        const char* name;
        int64_t at;
        float v;
    };
    for (const Case& c : {Case{"all finite", -1, 0.f}, Case{"NaN last", n - 1, nan}, Case{"inf middle", n / 2, inf},
                          Case{"-inf first", 0, -inf}}) {
        auto x = randomVec(n, 8, -1e30f, 1e30f);
        if (c.at >= 0) x[c.at] = c.v;
        DeviceVec<float> dx(x);
        DeviceVec<int> flag(std::vector<int>{7});
        TS_ASSERT_OK(cuda::allFinite(dx.ptr, n, flag.ptr, m_stream));
        sync();
        EXPECT_EQ(flag.scalar(), cpu::allFinite(x.data(), n) ? 1 : 0) << "allFinite, " << c.name;
    }
    DeviceVec<int> flag(std::vector<int>{7});
    TS_ASSERT_OK(cuda::allFinite(nullptr, 0, flag.ptr, m_stream));
    sync();
    EXPECT_EQ(flag.scalar(), 1) << "allFinite n=0";
}

TEST_F(CudaElementwise, CountInvalidIdsWritesTheCount) {
    const int T = 1001, V = 500;
    std::mt19937 rng(9);
    std::uniform_int_distribution<int> d(-20, V + 20);
    std::vector<int32_t> ids(T);
    for (auto& id : ids) id = d(rng);
    ids[0] = std::numeric_limits<int32_t>::min();
    ids[T - 1] = std::numeric_limits<int32_t>::max();
    DeviceVec<int32_t> did(ids);
    DeviceVec<int> cnt(std::vector<int>{-5});
    TS_ASSERT_OK(cuda::countInvalidIds(did.ptr, T, V, cnt.ptr, m_stream));
    sync();
    const int want = cpu::countInvalidIds(ids.data(), T, V);
    EXPECT_GT(want, 0);
    EXPECT_EQ(cnt.scalar(), want) << "countInvalidIds";
    TS_ASSERT_OK(cuda::countInvalidIds(did.ptr, 0, V, cnt.ptr, m_stream));
    sync();
    EXPECT_EQ(cnt.scalar(), 0) << "countInvalidIds T=0";
}

// --- bf16 -------------------------------------------------------------------------------------

TEST_F(CudaElementwise, Bf16ConversionsAreBitExact) {
    std::vector<float> x;
    uint32_t s = 77;
    for (int i = 0; i < 100003; ++i) {
        s = s * 1664525u + 1013904223u;
        x.push_back(floatFromBits(s));  // every exponent, NaNs with payloads, denormals
    }
    for (uint32_t u : {0x00000000u, 0x80000000u, 0x3F808000u, 0x3F818000u, 0x3F808001u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                       0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFF800001u, 0x7F800001u, 0x00000001u, 0x807FFFFFu})
        x.push_back(floatFromBits(u));
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<uint16_t> h(n);
    cpu::floatToBf16(x.data(), h.data(), n);
    DeviceVec<float> dx(x), dback(n);
    DeviceVec<uint16_t> dh(n);
    TS_ASSERT_OK(cuda::floatToBf16(dx.ptr, dh.ptr, n, m_stream));
    sync();
    expectEqualInts(dh.download(), h, "floatToBf16");

    std::vector<uint16_t> all(65536 + 3);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i * 40503u);
    std::vector<float> back(all.size());
    cpu::bf16ToFloat(all.data(), back.data(), static_cast<int64_t>(all.size()));
    DeviceVec<uint16_t> dall(all);
    DeviceVec<float> dbf(all.size());
    TS_ASSERT_OK(cuda::bf16ToFloat(dall.ptr, dbf.ptr, static_cast<int64_t>(all.size()), m_stream));
    sync();
    std::vector<uint32_t> gotBits, wantBits;
    for (float f : dbf.download()) gotBits.push_back(floatBits(f));
    for (float f : back) wantBits.push_back(floatBits(f));
    expectEqualInts(gotBits, wantBits, "bf16ToFloat (bit patterns)");

    auto r = x;
    cpu::roundToBf16(r.data(), n);
    TS_ASSERT_OK(cuda::roundToBf16(dx.ptr, n, m_stream));
    sync();
    std::vector<uint32_t> gr, wr;
    for (float f : dx.download()) gr.push_back(floatBits(f));
    for (float f : r) wr.push_back(floatBits(f));
    expectEqualInts(gr, wr, "roundToBf16 (bit patterns)");
}

// --- Dropout / residual -----------------------------------------------------------------------

std::string dropoutCase(const char* op, float p, uint64_t offset, const char* variant = "") {
    std::ostringstream o;
    o << op << " p=" << p << " offset=" << offset << variant;
    return o.str();
}

TEST_F(CudaElementwise, DropoutForwardMaskAndBackwardAreBitExact) {
    const int64_t n = 10007;
    const uint64_t seed = 0x5EEDull;
    const auto x = randomVec(n, 10, -4, 4), dy = randomVec(n, 11, -4, 4);
    for (float p : {0.0f, 0.1f, 0.5f, 1.0f})
        for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, (uint64_t{1} << 33) + 7}) {
            std::vector<float> y(n);
            std::vector<uint8_t> m(n);
            cpu::dropoutForward(x.data(), y.data(), m.data(), n, p, seed, offset);
            DeviceVec<float> dx(x), dyv(n);
            DeviceVec<uint8_t> dm(std::vector<uint8_t>(n, 9));
            TS_ASSERT_OK(cuda::dropoutForward(dx.ptr, dyv.ptr, dm.ptr, n, p, seed, offset, m_stream));
            sync();
            expectEqualInts(dm.download(), m, dropoutCase("dropoutForward mask", p, offset));
            expectSameBits(dyv.download(), y, dropoutCase("dropoutForward y", p, offset));

            // no mask; in place (y == x)
            DeviceVec<float> dy2(n);
            TS_ASSERT_OK(cuda::dropoutForward(dx.ptr, dy2.ptr, nullptr, n, p, seed, offset, m_stream));
            TS_ASSERT_OK(cuda::dropoutForward(dx.ptr, dx.ptr, nullptr, n, p, seed, offset, m_stream));
            sync();
            expectSameBits(dy2.download(), y, dropoutCase("dropoutForward y", p, offset, " (null mask)"));
            expectSameBits(dx.download(), y, dropoutCase("dropoutForward y", p, offset, " (in place)"));

            std::vector<uint8_t> m2(n);
            cpu::dropoutMask(m2.data(), n, p, seed, offset);
            DeviceVec<uint8_t> dm2(n);
            TS_ASSERT_OK(cuda::dropoutMask(dm2.ptr, n, p, seed, offset, m_stream));
            sync();
            expectEqualInts(dm2.download(), m2, dropoutCase("dropoutMask", p, offset));

            std::vector<float> dx1(n), dx0(n);
            cpu::dropoutBackward(dy.data(), m.data(), dx1.data(), n, p);
            cpu::dropoutBackward(dy.data(), nullptr, dx0.data(), n, p);
            DeviceVec<float> ddy(dy), gdx(n), gdx0(n);
            TS_ASSERT_OK(cuda::dropoutBackward(ddy.ptr, dm.ptr, gdx.ptr, n, p, m_stream));
            TS_ASSERT_OK(cuda::dropoutBackward(ddy.ptr, nullptr, gdx0.ptr, n, p, m_stream));
            sync();
            expectSameBits(gdx.download(), dx1, dropoutCase("dropoutBackward", p, offset));
            expectSameBits(gdx0.download(), dx0, dropoutCase("dropoutBackward", p, offset, " (null mask)"));
        }
    // Masks are a pure function of (seed, offset + i): a slice regenerated alone matches.
    DeviceVec<uint8_t> whole(n), part(n - 101);
    TS_ASSERT_OK(cuda::dropoutMask(whole.ptr, n, 0.3f, seed, 1000, m_stream));
    TS_ASSERT_OK(cuda::dropoutMask(part.ptr, n - 101, 0.3f, seed, 1101, m_stream));
    sync();
    const auto w = whole.download();
    expectEqualInts(part.download(), std::vector<uint8_t>(w.begin() + 101, w.end()), "dropoutMask slice");
}

// A seed with a step key in device memory (what the model hands the kernels, so a CUDA graph
// draws each step's masks): the mask of DropoutSeed{&key, site} is the CPU's for the plain seed
// dropoutCombine(key, site), for the key the device holds when the kernel runs.
TEST_F(CudaElementwise, DropoutReadsTheStepKeyFromDeviceMemory) {
    const int64_t n = 4099;
    const uint64_t site = 77;
    DeviceVec<uint64_t> key(std::vector<uint64_t>{123});
    for (const uint64_t k : {uint64_t{123}, uint64_t{124}}) {
        TS_ASSERT_OK(cuda::copyToDevice(key.ptr, &k, sizeof k));
        DeviceVec<uint8_t> dm(n);
        TS_ASSERT_OK(cuda::dropoutMask(dm.ptr, n, 0.3f, hd::DropoutSeed(key.ptr, site), 5, m_stream));
        sync();
        std::vector<uint8_t> want(n);
        cpu::dropoutMask(want.data(), n, 0.3f, hd::dropoutCombine(k, site), 5);
        expectEqualInts(dm.download(), want, "dropoutMask with step key " + std::to_string(k));
    }
}

// (The fused op's bf16 outputs, roundBf16, with the second offset: bit-exact too.)
TEST_F(CudaElementwise, BiasDropoutAddFusedAndUnfusedAreBitExact) {
    const int T = 7, C = 2501;  // C > the CPU's 2048-element mask chunk, odd
    const int64_t n = static_cast<int64_t>(T) * C;
    const uint64_t seed = 99;
    const auto x = randomVec(n, 12, -3, 3), b = randomVec(C, 13), r = randomVec(n, 14, -3, 3);
    for (bool fused : {true, false})
        for (float p : {0.0f, 0.3f})
            for (uint64_t offset : {uint64_t{0}, uint64_t{777}})
                for (bool bias : {true, false})
                    for (bool withMask : {true, false}) {
                        const char* op = fused ? "biasDropoutAddFused" : "biasDropoutAddUnfused";
                        const bool round = fused && offset != 0;
                        const std::string what = dropoutCase(op, p, offset, bias ? " bias" : " no bias") +
                                                 (withMask ? " mask" : " no mask") + (round ? " bf16" : "");
                        std::vector<float> out(n);
                        std::vector<uint8_t> m(n);
                        const float* bp = bias ? b.data() : nullptr;
                        uint8_t* mp = withMask ? m.data() : nullptr;
                        if (fused)
                            cpu::biasDropoutAddFused(x.data(), bp, r.data(), out.data(), mp, T, C, p, seed, offset,
                                                     round);
                        else
                            cpu::biasDropoutAddUnfused(x.data(), bp, r.data(), out.data(), mp, T, C, p, seed,
                                                       offset);
                        DeviceVec<float> dx(x), db(b), dr(r), dout(n);
                        DeviceVec<uint8_t> dm(std::vector<uint8_t>(n, 9));
                        const float* gb = bias ? db.ptr : nullptr;
                        uint8_t* gm = withMask ? dm.ptr : nullptr;
                        if (fused)
                            TS_ASSERT_OK(cuda::biasDropoutAddFused(dx.ptr, gb, dr.ptr, dout.ptr, gm, T, C, p, seed,
                                                                   offset, round, m_stream));
                        else
                            TS_ASSERT_OK(cuda::biasDropoutAddUnfused(dx.ptr, gb, dr.ptr, dout.ptr, gm, T, C, p,
                                                                     seed, offset, m_stream));
                        sync();
                        expectSameBits(dout.download(), out, what + " out", {T, C});
                        if (withMask) expectEqualInts(dm.download(), m, what + " mask", {T, C});
                    }
}

TEST_F(CudaElementwise, BiasDropoutAddBackwardMatchesCpu) {
    const int T = 65, C = 301;
    const int64_t n = static_cast<int64_t>(T) * C;
    const auto dout = randomVec(n, 15, -2, 2), db0 = randomVec(C, 16);
    for (float p : {0.0f, 0.4f}) {
        std::vector<uint8_t> m(n);
        cpu::dropoutMask(m.data(), n, p, 3, 11);
        std::vector<float> dx(n), db = db0;
        cpu::biasDropoutAddBackward(dout.data(), m.data(), dx.data(), db.data(), T, C, p);
        DeviceVec<float> gout(dout), gdx(n), gdb(db0), gdx2(n);
        DeviceVec<uint8_t> gm(m);
        TS_ASSERT_OK(cuda::biasDropoutAddBackward(gout.ptr, gm.ptr, gdx.ptr, gdb.ptr, T, C, p, m_stream));
        TS_ASSERT_OK(cuda::biasDropoutAddBackward(gout.ptr, gm.ptr, gdx2.ptr, nullptr, T, C, p, m_stream));
        sync();
        const std::string what = dropoutCase("biasDropoutAddBackward", p, 11);
        expectSameBits(gdx.download(), dx, what + " dx", {T, C});
        expectSameBits(gdx2.download(), dx, what + " dx (null db)", {T, C});
        expectClose(gdb.download(), db, 1e-6, 0, what + " db", {}, columnAbsSums(db0, dx, T, C),
                    /*nanMatchesNan=*/false);
    }
}

// --- Activations ------------------------------------------------------------------------------

// x in [-14, 14] reaches both clamps of the GeLU's exp (2z = +-80 near |u| = 10.4); the first
// elements are the special values whose limits the CPU defines.
std::vector<float> activationInput(size_t n, uint32_t seed) {
    auto x = randomVec(n, seed, -14, 14);
    const float inf = std::numeric_limits<float>::infinity();
    const float specials[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 10.4f, -10.4f, 1e-30f};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0] && i < n; ++i) x[i] = specials[i];
    return x;
}

TEST_F(CudaElementwise, BiasGeluForwardFusedAndUnfusedMatchCpu) {
    const int T = 37, C = 1001;
    const int64_t n = static_cast<int64_t>(T) * C;
    const auto x = activationInput(n, 17), b = randomVec(C, 18);
    for (bool fused : {true, false})
        for (bool bias : {true, false}) {
            const std::string what = std::string(fused ? "biasGeluForward" : "biasGeluForwardUnfused") +
                                     (bias ? " bias" : " no bias");
            std::vector<float> y(n);
            if (fused) cpu::biasGeluForward(x.data(), bias ? b.data() : nullptr, y.data(), T, C);
            else cpu::biasGeluForwardUnfused(x.data(), bias ? b.data() : nullptr, y.data(), T, C);
            DeviceVec<float> dx(x), db(b), dy(n);
            if (fused) TS_ASSERT_OK(cuda::biasGeluForward(dx.ptr, bias ? db.ptr : nullptr, dy.ptr, T, C, false, m_stream));
            else TS_ASSERT_OK(cuda::biasGeluForwardUnfused(dx.ptr, bias ? db.ptr : nullptr, dy.ptr, T, C, m_stream));
            sync();
            expectClose(dy.download(), y, 1e-5, 1e-6, what, {T, C});
        }
}

TEST_F(CudaElementwise, BiasGeluBackwardMatchesCpu) {
    const int T = 37, C = 1001;
    const int64_t n = static_cast<int64_t>(T) * C;
    auto x = randomVec(n, 19, -14, 14);
    x[0] = std::numeric_limits<float>::infinity();
    x[1] = -std::numeric_limits<float>::infinity();
    const auto b = randomVec(C, 20), dy = randomVec(n, 21, -2, 2), db0 = randomVec(C, 22);
    for (bool bias : {true, false})
        for (bool withDb : {true, false}) {
            const std::string what = std::string("biasGeluBackward") + (bias ? " bias" : " no bias") +
                                     (withDb ? " db" : " null db");
            std::vector<float> dx(n), db = db0;
            cpu::biasGeluBackward(dy.data(), x.data(), bias ? b.data() : nullptr, dx.data(),
                                  withDb ? db.data() : nullptr, T, C);
            DeviceVec<float> gdy(dy), gx(x), gb(b), gdx(n), gdb(db0);
            TS_ASSERT_OK(cuda::biasGeluBackward(gdy.ptr, gx.ptr, bias ? gb.ptr : nullptr, gdx.ptr,
                                                withDb ? gdb.ptr : nullptr, T, C, m_stream));
            sync();
            expectClose(gdx.download(), dx, 1e-5, 1e-6, what + " dx", {T, C});
            if (withDb)
                expectClose(gdb.download(), db, 1e-5, 0, what + " db", {}, columnAbsSums(db0, dx, T, C),
                            /*nanMatchesNan=*/false);
            else
                expectSameBits(gdb.download(), db0, what + " db untouched");
        }
}

TEST_F(CudaElementwise, SwigluForwardAndBackwardMatchCpu) {
    const int T = 37, F = 1001;
    const int64_t n = static_cast<int64_t>(T) * F;
    auto x = randomVec(2 * n, 23, -12, 12);
    x[0] = 100.0f;   // exp(-g) underflows: sigmoid 1
    x[1] = -100.0f;  // exp(-g) overflows: sigmoid 0
    const auto dy = randomVec(n, 24, -2, 2);
    std::vector<float> y(n), dx(2 * n);
    cpu::swigluForward(x.data(), y.data(), T, F);
    cpu::swigluBackward(dy.data(), x.data(), dx.data(), T, F);
    DeviceVec<float> gx(x), gy(n), gdy(dy), gdx(2 * n);
    TS_ASSERT_OK(cuda::swigluForward(gx.ptr, gy.ptr, T, F, false, m_stream));
    TS_ASSERT_OK(cuda::swigluBackward(gdy.ptr, gx.ptr, gdx.ptr, T, F, m_stream));
    sync();
    expectClose(gy.download(), y, 1e-5, 1e-6, "swigluForward y", {T, F});
    // dgate's 1 + g (1 - sig) cancels near g = -1.28 where |dy up sig| is up to ~5: absolute
    // error of a few ulp of that scale.
    expectClose(gdx.download(), dx, 1e-5, 2e-5, "swigluBackward dx", {T, 2 * F});
}

// --- Embedding --------------------------------------------------------------------------------

std::vector<int32_t> tokenIds(int T, int lo, int hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<int32_t> ids(T);
    for (auto& id : ids) id = d(rng);
    return ids;
}

TEST_F(CudaElementwise, EmbeddingForwardGathersAndCountsInvalidIds) {
    const int T = 4099, C = 67, V = 1000;
    auto ids = tokenIds(T, -5, V + 5, 25);  // some invalid on both sides
    for (const auto& [start, end] : {std::pair{0, V}, std::pair{250, 700}}) {
        const auto table = randomVec(static_cast<size_t>(end - start) * C, 26);
        std::vector<float> out(static_cast<size_t>(T) * C);
        const int invalid = cpu::embeddingForward(ids.data(), table.data(), out.data(), T, C, start, end, V);
        ASSERT_GT(invalid, 0);
        DeviceVec<int32_t> gids(ids);
        DeviceVec<float> gtable(table), gout(std::vector<float>(out.size(), 5.0f)), gout2(out.size());
        DeviceVec<int> gcount(std::vector<int>{-1});
        TS_ASSERT_OK(cuda::embeddingForward(gids.ptr, gtable.ptr, gout.ptr, T, C, start, end, V, gcount.ptr,
                                            m_stream));
        TS_ASSERT_OK(cuda::embeddingForward(gids.ptr, gtable.ptr, gout2.ptr, T, C, start, end, V, nullptr,
                                            m_stream));
        sync();
        const std::string what = "embeddingForward vocab [" + std::to_string(start) + ", " + std::to_string(end) + ")";
        expectSameBits(gout.download(), out, what, {T, C});
        expectSameBits(gout2.download(), out, what + " (null count)", {T, C});
        EXPECT_EQ(gcount.scalar(), invalid) << what << " invalid count";
    }
}

// The engine's lookups: embeddingLookup (no count, nothing synchronizes) and the Bf16 variants
// reading a bf16 model copy's bits, bit for bit the CPU's.
TEST_F(CudaElementwise, EmbeddingLookupsAndTheirBf16VariantsAreBitExact) {
    const int T = 4099, C = 67, V = 1000;
    const auto ids = tokenIds(T, -5, V + 5, 34);
    for (const auto& [start, end] : {std::pair{0, V}, std::pair{250, 700}}) {
        const auto table = randomVec(static_cast<size_t>(end - start) * C, 35);
        std::vector<uint16_t> bits(table.size());
        cpu::floatToBf16(table.data(), bits.data(), static_cast<int64_t>(table.size()));
        std::vector<float> want(static_cast<size_t>(T) * C), wantBits(want.size());
        cpu::embeddingLookup(ids.data(), table.data(), want.data(), T, C, start, end, V);
        cpu::embeddingLookupBf16(ids.data(), bits.data(), wantBits.data(), T, C, start, end, V);
        DeviceVec<int32_t> gids(ids);
        DeviceVec<float> gtable(table), gout(std::vector<float>(want.size(), 5.0f)),
            goutBits(std::vector<float>(want.size(), 5.0f));
        DeviceVec<uint16_t> gbits(bits);
        TS_ASSERT_OK(cuda::embeddingLookup(gids.ptr, gtable.ptr, gout.ptr, T, C, start, end, V, m_stream));
        TS_ASSERT_OK(cuda::embeddingLookupBf16(gids.ptr, gbits.ptr, goutBits.ptr, T, C, start, end, V, m_stream));
        sync();
        const std::string what = "vocab [" + std::to_string(start) + ", " + std::to_string(end) + ")";
        expectSameBits(gout.download(), want, "embeddingLookup " + what, {T, C});
        expectSameBits(goutBits.download(), wantBits, "embeddingLookupBf16 " + what, {T, C});
    }
    const int s = 37, b = 3, C2 = 129;
    const auto table = randomVec(static_cast<size_t>(s) * C2, 36), out0 = randomVec(static_cast<size_t>(s) * b * C2, 37);
    std::vector<uint16_t> bits(table.size());
    cpu::floatToBf16(table.data(), bits.data(), static_cast<int64_t>(table.size()));
    auto out = out0;
    cpu::positionEmbeddingForwardBf16(bits.data(), out.data(), s, b, C2);
    DeviceVec<uint16_t> gbits(bits);
    DeviceVec<float> gout(out0);
    TS_ASSERT_OK(cuda::positionEmbeddingForwardBf16(gbits.ptr, gout.ptr, s, b, C2, m_stream));
    sync();
    expectSameBits(gout.download(), out, "positionEmbeddingForwardBf16 out", {s * b, C2});
}

TEST_F(CudaElementwise, EmbeddingBackwardIsDeterministicAndBitExact) {
    const int T = 4099, C = 67;
    // Many tokens per row (ids from a small range) so rows take several additions in token order.
    for (const auto& [lo, hi, start, end] : {std::array{240, 270, 250, 700}, std::array{0, 999, 0, 1000},
                                             std::array{-3, 40, 0, 1}}) {
        const auto ids = tokenIds(T, lo, hi, 27 + lo);
        const auto dout = randomVec(static_cast<size_t>(T) * C, 28, -2, 2);
        const auto dtable0 = randomVec(static_cast<size_t>(end - start) * C, 29);
        auto dtable = dtable0;
        cpu::embeddingBackward(ids.data(), dout.data(), dtable.data(), T, C, start, end);
        DeviceVec<int32_t> gids(ids);
        DeviceVec<float> gdout(dout), gtable(dtable0);
        TS_ASSERT_OK(cuda::embeddingBackward(gids.ptr, gdout.ptr, gtable.ptr, T, C, start, end, m_stream));
        sync();
        expectSameBits(gtable.download(), dtable,
                       "embeddingBackward ids [" + std::to_string(lo) + ", " + std::to_string(hi) + "] vocab [" +
                           std::to_string(start) + ", " + std::to_string(end) + ") dtable",
                       {end - start, C});
    }
    TS_ASSERT_OK(cuda::embeddingBackward(nullptr, nullptr, nullptr, 0, C, 0, 10, m_stream));
}

TEST_F(CudaElementwise, PositionEmbeddingForwardAndBackwardAreBitExact) {
    const int s = 37, b = 3, C = 129;
    const int64_t rows = static_cast<int64_t>(s) * b;
    const auto table = randomVec(static_cast<size_t>(s) * C, 30), out0 = randomVec(rows * C, 31),
               dout = randomVec(rows * C, 32), dtable0 = randomVec(static_cast<size_t>(s) * C, 33);
    auto out = out0, dtable = dtable0;
    cpu::positionEmbeddingForward(table.data(), out.data(), s, b, C);
    cpu::positionEmbeddingBackward(dout.data(), dtable.data(), s, b, C);
    DeviceVec<float> gtable(table), gout(out0), gdout(dout), gdtable(dtable0);
    TS_ASSERT_OK(cuda::positionEmbeddingForward(gtable.ptr, gout.ptr, s, b, C, m_stream));
    TS_ASSERT_OK(cuda::positionEmbeddingBackward(gdout.ptr, gdtable.ptr, s, b, C, m_stream));
    sync();
    expectSameBits(gout.download(), out, "positionEmbeddingForward out", {s * b, C});
    expectSameBits(gdtable.download(), dtable, "positionEmbeddingBackward dtable", {s, C});
}

}  // namespace
}  // namespace ts::kernels

#else  // !TS_HAVE_CUDA

TEST(CudaElementwise, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif
