// CUDA rotary embedding and core attention vs the CPU oracle (kernels/cpu/rope.cpp,
// attention.cpp, attention_cp.cpp) on small random shapes: s not a multiple of 16, GQA with
// nq/nkv = 2 and 1, b = 2, fused and unfused softmax and flash attention, attention dropout 0 and 0.1 (the keep bits
// must be the CPU's exactly, else the values differ by far more than the tolerance), the
// context-parallel all-gather op, and ring blocks of every kind (fully visible, diagonal,
// invisible, mixed) merged with first=true/false. Each failure names the op, the case, the
// array and the element's index in its shape. Skips without a CUDA build or device.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"

#ifdef TS_HAVE_CUDA

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops_cuda.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ts::kernels {
namespace {

using namespace gputest;

// |gpu - cpu| <= atol + rtol |cpu| element-wise; equal infinities match, NaN never does (no output
// of these ops may be NaN). Names `what` and the element's index in `shape`.
void expectNear(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol,
                const std::string& what, const std::vector<int>& shape) {
    expectClose(got, want, rtol, atol, what, shape, {}, /*nanMatchesNan=*/false);
}

class CudaAttention : public CudaStreamTest {};

std::string caseName(const char* op, bool fused, int rep, float p) {
    std::ostringstream os;
    os << op << (fused ? " fused" : " unfused") << " rep=" << rep << " dropout=" << p << " ";
    return os.str();
}

// --- rotary embedding -------------------------------------------------------------------------

TEST_F(CudaAttention, RopeInPlaceOpsMatchCpu) {
    const int s = 13, b = 2, n = 3;
    for (int d : {8, 7})
        for (int posOffset : {5, 1000}) {
            const size_t N = size_t(s) * b * n * d;
            const auto x = randomVec(N, 100 + d + posOffset, -2, 2);
            const std::vector<int> shape{s, b, n, d};
            const std::string tag = " d=" + std::to_string(d) + " pos=" + std::to_string(posOffset) + " x";
            {
                DeviceVec<float> g(x);
                TS_ASSERT_OK(g.status);
                TS_ASSERT_OK(cuda::ropeForward(g.ptr, s, b, n, d, 10000.f, posOffset, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                auto c = x;
                cpu::ropeForward(c.data(), s, b, n, d, 10000.f, posOffset);
                expectNear(g.download(), c, 1e-5, 1e-6, "ropeForward" + tag, shape);
            }
            {
                DeviceVec<float> g(x);
                TS_ASSERT_OK(cuda::ropeForwardFused(g.ptr, s, b, n, d, 10000.f, posOffset, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                auto c = x;
                cpu::ropeForwardFused(c.data(), s, b, n, d, 10000.f, posOffset);
                expectNear(g.download(), c, 1e-5, 1e-6, "ropeForwardFused" + tag, shape);
            }
            {
                DeviceVec<float> g(x);
                TS_ASSERT_OK(cuda::ropeBackward(g.ptr, s, b, n, d, 10000.f, posOffset, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                auto c = x;
                cpu::ropeBackward(c.data(), s, b, n, d, 10000.f, posOffset);
                expectNear(g.download(), c, 1e-5, 1e-6, "ropeBackward" + tag, shape);
            }
        }
}

TEST_F(CudaAttention, QkvSplitAndMergeRopeMatchCpu) {
    const int s = 13, b = 2, nq = 4, posOffset = 7;
    for (int ng : {2, 4, 1})
        for (int d : {8, 7}) {
            const int r = nq / ng;
            const size_t T = size_t(s) * b;
            const size_t nQkv = T * ng * (r + 2) * d, nQ = T * nq * d, nK = T * ng * d;
            const std::string tag = " ng=" + std::to_string(ng) + " d=" + std::to_string(d) + " ";
            const std::vector<int> qShape{s, b, nq, d}, kShape{s, b, ng, d}, qkvShape{s, b, ng, r + 2, d};
            const auto qkv = randomVec(nQkv, 200 + ng * 10 + d, -2, 2);
            DeviceVec<float> gQkv(qkv), gq(nQ), gk(nK), gv(nK);
            TS_ASSERT_OK(gQkv.status);
            TS_ASSERT_OK(cuda::splitQkvRopeForward(gQkv.ptr, gq.ptr, gk.ptr, gv.ptr, s, b, nq, ng, d, 10000.f,
                                                   posOffset, false, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> q(nQ), k(nK), v(nK);
            cpu::splitQkvRopeForward(qkv.data(), q.data(), k.data(), v.data(), s, b, nq, ng, d, 10000.f,
                                     posOffset);
            expectNear(gq.download(), q, 1e-5, 1e-6, "splitQkvRopeForward" + tag + "q", qShape);
            expectNear(gk.download(), k, 1e-5, 1e-6, "splitQkvRopeForward" + tag + "k", kShape);
            expectNear(gv.download(), v, 0, 0, "splitQkvRopeForward" + tag + "v", kShape);
            {
                // roundBf16: q and k the bf16 rounding of the kernel's own fp32 results, v as copied
                auto bf = [](std::vector<float> x) {
                    cpu::roundToBf16(x.data(), int64_t(x.size()));
                    return x;
                };
                DeviceVec<float> rq(nQ), rk(nK), rv(nK);
                TS_ASSERT_OK(cuda::splitQkvRopeForward(gQkv.ptr, rq.ptr, rk.ptr, rv.ptr, s, b, nq, ng, d, 10000.f,
                                                       posOffset, true, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                expectNear(rq.download(), bf(gq.download()), 0, 0, "splitQkvRopeForward bf16" + tag + "q", qShape);
                expectNear(rk.download(), bf(gk.download()), 0, 0, "splitQkvRopeForward bf16" + tag + "k", kShape);
                expectNear(rv.download(), v, 0, 0, "splitQkvRopeForward bf16" + tag + "v", kShape);
            }

            const auto dq = randomVec(nQ, 300 + ng, -2, 2), dk = randomVec(nK, 301 + ng, -2, 2),
                       dv = randomVec(nK, 302 + ng, -2, 2);
            DeviceVec<float> gdq(dq), gdk(dk), gdv(dv), gdqkv(randomVec(nQkv, 303));  // overwritten
            TS_ASSERT_OK(cuda::ropeBackwardMergeQkv(gdq.ptr, gdk.ptr, gdv.ptr, gdqkv.ptr, s, b, nq, ng, d,
                                                    10000.f, posOffset, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> dqkv(nQkv);
            cpu::ropeBackwardMergeQkv(dq.data(), dk.data(), dv.data(), dqkv.data(), s, b, nq, ng, d, 10000.f,
                                      posOffset);
            expectNear(gdqkv.download(), dqkv, 1e-5, 1e-6, "ropeBackwardMergeQkv" + tag + "dqkv", qkvShape);
        }
}

TEST_F(CudaAttention, QkvSplitAndMergeWithoutRopeAreTheCpuCopies) {
    const int T = 26, nq = 4;
    for (int ng : {2, 4, 1})
        for (int d : {8, 7}) {
            const int r = nq / ng;
            const size_t nQkv = size_t(T) * ng * (r + 2) * d, nQ = size_t(T) * nq * d, nK = size_t(T) * ng * d;
            const std::string tag = " ng=" + std::to_string(ng) + " d=" + std::to_string(d) + " ";
            const auto qkv = randomVec(nQkv, 400 + ng * 10 + d, -2, 2);
            DeviceVec<float> gQkv(qkv), gq(nQ), gk(nK), gv(nK);
            TS_ASSERT_OK(gQkv.status);
            TS_ASSERT_OK(cuda::splitQkv(gQkv.ptr, gq.ptr, gk.ptr, gv.ptr, T, nq, ng, d, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> q(nQ), k(nK), v(nK);
            cpu::splitQkv(qkv.data(), q.data(), k.data(), v.data(), T, nq, ng, d);
            expectSameBits(gq.download(), q, "splitQkv" + tag + "q");
            expectSameBits(gk.download(), k, "splitQkv" + tag + "k");
            expectSameBits(gv.download(), v, "splitQkv" + tag + "v");

            const auto dq = randomVec(nQ, 500 + ng, -2, 2), dk = randomVec(nK, 501 + ng, -2, 2),
                       dv = randomVec(nK, 502 + ng, -2, 2);
            DeviceVec<float> gdq(dq), gdk(dk), gdv(dv), gdqkv(randomVec(nQkv, 503));  // overwritten
            TS_ASSERT_OK(cuda::mergeQkv(gdq.ptr, gdk.ptr, gdv.ptr, gdqkv.ptr, T, nq, ng, d, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> dqkv(nQkv);
            cpu::mergeQkv(dq.data(), dk.data(), dv.data(), dqkv.data(), T, nq, ng, d);
            expectSameBits(gdqkv.download(), dqkv, "mergeQkv" + tag + "dqkv");
        }
}

// --- core attention ---------------------------------------------------------------------------

struct AttnCase {
    cpu::AttnDims dims;
    std::vector<float> q, k, v, dout;
};

AttnCase makeAttnCase(int nkv, float p, int s = 13, int d = 16) {
    AttnCase c;
    auto& dm = c.dims;
    dm.s = s;
    dm.b = 2;
    dm.nq = 4;
    dm.nkv = nkv;
    dm.d = d;
    dm.scale = 1.0f / std::sqrt(static_cast<float>(d));  // 0.25 at d = 16
    dm.dropout = p;
    dm.dropoutSeed = 1234;
    // a TP rank's heads: exercises the mask numbering over [b, nqTotal, s, s]
    dm.headOffset = p > 0 ? 1 : 0;
    dm.nqTotal = p > 0 ? 6 : 0;
    const size_t nQ = size_t(dm.s) * dm.b * dm.nq * dm.d, nK = size_t(dm.s) * dm.b * nkv * dm.d;
    c.q = randomVec(nQ, 11 + nkv, -2, 2);
    c.k = randomVec(nK, 12 + nkv, -2, 2);
    c.v = randomVec(nK, 13 + nkv);
    c.dout = randomVec(nQ, 14 + nkv);
    return c;
}

TEST_F(CudaAttention, AttentionForwardMatchesCpu) {
    for (int s : {13, 300})  // 300: the fused path's causal row blocks
    for (int nkv : {2, 4})
        for (float p : {0.0f, 0.1f})
            for (bool fused : {true, false}) {
                const AttnCase c = makeAttnCase(nkv, p, s);
                const auto& dm = c.dims;
                const std::string tag = caseName("attentionForward", fused, dm.nq / nkv, p) + "s=" + std::to_string(s) + " ";
                DeviceVec<float> gq(c.q), gk(c.k), gv(c.v);
                DeviceVec<float> gP(randomVec(cpu::attentionProbsSize(dm), 1)), gO(c.q.size());
                TS_ASSERT_OK(gq.status);
                TS_ASSERT_OK(cuda::attentionForward(dm, gq.ptr, gk.ptr, gv.ptr, gP.ptr, gO.ptr, fused, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                std::vector<float> P(cpu::attentionProbsSize(dm)), O(c.q.size());
                cpu::attentionForward(dm, c.q.data(), c.k.data(), c.v.data(), P.data(), O.data(), fused);
                expectNear(gP.download(), P, 1e-5, 1e-6, tag + "probs", {dm.b, dm.nq, dm.s, dm.s});
                expectNear(gO.download(), O, 1e-4, 1e-5, tag + "out", {dm.s, dm.b, dm.nq, dm.d});
            }
}

TEST_F(CudaAttention, AttentionBackwardMatchesCpu) {
    for (int s : {13, 300})
    for (int nkv : {2, 4})
        for (float p : {0.0f, 0.1f})
            for (bool fused : {true, false}) {
                const AttnCase c = makeAttnCase(nkv, p, s);
                const auto& dm = c.dims;
                const std::string tag = caseName("attentionBackward", fused, dm.nq / nkv, p) + "s=" + std::to_string(s) + " ";
                // the CPU's saved probs feed both backward passes
                std::vector<float> P(cpu::attentionProbsSize(dm)), O(c.q.size());
                cpu::attentionForward(dm, c.q.data(), c.k.data(), c.v.data(), P.data(), O.data(), fused);
                DeviceVec<float> gq(c.q), gk(c.k), gv(c.v), gP(P), gdo(c.dout);
                // gradients are overwritten: start from garbage
                DeviceVec<float> gdq(randomVec(c.q.size(), 2)), gdk(randomVec(c.k.size(), 3)),
                    gdv(randomVec(c.k.size(), 4)), gScratch(cpu::attentionScratchSize(dm));
                TS_ASSERT_OK(gq.status);
                TS_ASSERT_OK(cuda::attentionBackward(dm, gq.ptr, gk.ptr, gv.ptr, gP.ptr, gdo.ptr, gdq.ptr, gdk.ptr,
                                                     gdv.ptr, gScratch.ptr, fused, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                std::vector<float> dq(c.q.size()), dk(c.k.size()), dv(c.k.size()),
                    scratch(cpu::attentionScratchSize(dm));
                cpu::attentionBackward(dm, c.q.data(), c.k.data(), c.v.data(), P.data(), c.dout.data(), dq.data(),
                                       dk.data(), dv.data(), scratch.data(), fused);
                expectNear(gdq.download(), dq, 1e-4, 2e-5, tag + "dq", {dm.s, dm.b, dm.nq, dm.d});
                expectNear(gdk.download(), dk, 1e-4, 2e-5, tag + "dk", {dm.s, dm.b, dm.nkv, dm.d});
                expectNear(gdv.download(), dv, 1e-4, 2e-5, tag + "dv", {dm.s, dm.b, dm.nkv, dm.d});
            }
}

// Flash attention: the forward's out and stats (row max, 1/sum) against the CPU's, and the
// backward from the CPU's stats (so only the backward's own error is measured) against the
// CPU's flash backward; the GPU's own forward stats then drive its backward to the same result.
// s = 300: the causal row blocks (kernels/common/causal_gemms.h) of the fused square's GEMMs.
TEST_F(CudaAttention, FlashAttentionMatchesCpu) {
    for (int s : {13, 300})
        for (int nkv : {2, 4})
        for (float p : {0.0f, 0.1f}) {
            const AttnCase c = makeAttnCase(nkv, p, s);
            const auto& dm = c.dims;
            const std::string tag = caseName("attentionFlash", true, dm.nq / nkv, p) + "s=" + std::to_string(s) + " ";
            std::vector<float> St(cpu::attentionStatsSize(dm)), O(c.q.size());
            cpu::attentionFlashForward(dm, c.q.data(), c.k.data(), c.v.data(), St.data(), O.data());
            DeviceVec<float> gq(c.q), gk(c.k), gv(c.v), gdo(c.dout);
            DeviceVec<float> gSt(randomVec(St.size(), 1)), gO(randomVec(c.q.size(), 5));
            TS_ASSERT_OK(gq.status);
            TS_ASSERT_OK(cuda::attentionFlashForward(dm, gq.ptr, gk.ptr, gv.ptr, gSt.ptr, gO.ptr, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            expectNear(gSt.download(), St, 1e-5, 1e-6, tag + "stats", {dm.b, dm.nq, dm.s, 2});
            expectNear(gO.download(), O, 1e-4, 1e-5, tag + "out", {dm.s, dm.b, dm.nq, dm.d});

            std::vector<float> dq(c.q.size()), dk(c.k.size()), dv(c.k.size()),
                scratch(cpu::attentionFlashScratchSize(dm));
            cpu::attentionFlashBackward(dm, c.q.data(), c.k.data(), c.v.data(), St.data(), c.dout.data(), dq.data(),
                                        dk.data(), dv.data(), scratch.data());
            for (bool ownStats : {false, true}) {
                const std::string t = tag + (ownStats ? "(GPU stats) " : "(CPU stats) ");
                DeviceVec<float> gStCpu(St);
                DeviceVec<float> gdq(randomVec(c.q.size(), 2)), gdk(randomVec(c.k.size(), 3)),
                    gdv(randomVec(c.k.size(), 4)), gScratch(cpu::attentionFlashScratchSize(dm));
                TS_ASSERT_OK(cuda::attentionFlashBackward(dm, gq.ptr, gk.ptr, gv.ptr, ownStats ? gSt.ptr : gStCpu.ptr,
                                                          gdo.ptr, gdq.ptr, gdk.ptr, gdv.ptr, gScratch.ptr, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                expectNear(gdq.download(), dq, 1e-4, 2e-5, t + "dq", {dm.s, dm.b, dm.nq, dm.d});
                expectNear(gdk.download(), dk, 1e-4, 2e-5, t + "dk", {dm.s, dm.b, dm.nkv, dm.d});
                expectNear(gdv.download(), dv, 1e-4, 2e-5, t + "dv", {dm.s, dm.b, dm.nkv, dm.d});
            }
        }
}

// --- bf16 GEMMs (a bf16 model's attention) ------------------------------------------------------

// makeAttnCase with bf16-valued inputs, what a bf16 model stores.
AttnCase makeBf16AttnCase(int nkv, float p, int s, int d = 16) {
    AttnCase c = makeAttnCase(nkv, p, s, d);
    for (std::vector<float>* x : {&c.q, &c.k, &c.v, &c.dout}) cpu::roundToBf16(x->data(), int64_t(x->size()));
    return c;
}

// The GPU's out, dq, dk, dv against the CPU's on the same bf16-valued inputs: the GPU also rounds
// P and dS to bf16 (as Megatron's bf16 attention does), so the tolerance is bf16's; a stale or
// misplaced bit array is off by far more. Every twin is unbound once the calls have returned.
struct AttnResult {
    std::vector<float> out, dq, dk, dv;
};
void expectBf16Close(const AttnResult& gpu, const AttnResult& cpu, const AttnCase& c, const float* gq,
                     const std::string& tag) {
    const auto& dm = c.dims;
    expectNear(gpu.out, cpu.out, 2e-2, 5e-3, tag + "out", {dm.s, dm.b, dm.nq, dm.d});
    expectNear(gpu.dq, cpu.dq, 3e-2, 1e-2, tag + "dq", {dm.s, dm.b, dm.nq, dm.d});
    expectNear(gpu.dk, cpu.dk, 3e-2, 1e-2, tag + "dk", {dm.s, dm.b, dm.nkv, dm.d});
    expectNear(gpu.dv, cpu.dv, 3e-2, 1e-2, tag + "dv", {dm.s, dm.b, dm.nkv, dm.d});
    EXPECT_EQ(cuda::boundBf16Twin(gq, 1), nullptr) << tag;
}

// The CPU's flash attention of a case: out, dq, dk, dv, and the forward's stats in St.
AttnResult cpuFlash(const AttnCase& c, std::vector<float>& St) {
    const auto& dm = c.dims;
    AttnResult r{std::vector<float>(c.q.size()), std::vector<float>(c.q.size()), std::vector<float>(c.k.size()),
                 std::vector<float>(c.k.size())};
    St.assign(cpu::attentionStatsSize(dm), 0.0f);
    std::vector<float> scratch(cpu::attentionFlashScratchSize(dm));
    cpu::attentionFlashForward(dm, c.q.data(), c.k.data(), c.v.data(), St.data(), r.out.data());
    cpu::attentionFlashBackward(dm, c.q.data(), c.k.data(), c.v.data(), St.data(), c.dout.data(), r.dq.data(),
                                r.dk.data(), r.dv.data(), scratch.data());
    return r;
}

// Flash attention: q, k, v and dout converted once per call, the row kernels writing the bf16
// bits of the probabilities, dropout(P) and dS for the GEMMs after them.
TEST_F(CudaAttention, Bf16FlashAttentionMatchesCpu) {
    struct Restore {
        ~Restore() { cuda::setBf16Gemms(false); }
    } restore;
    for (int s : {13, 300})
        for (int nkv : {2, 4})
            for (float p : {0.0f, 0.1f}) {
                const AttnCase c = makeBf16AttnCase(nkv, p, s);
                const auto& dm = c.dims;
                const std::string tag = caseName("attentionFlash bf16", true, dm.nq / nkv, p) + "s=" + std::to_string(s) + " ";
                std::vector<float> St;
                const AttnResult want = cpuFlash(c, St);
                DeviceVec<float> gq(c.q), gk(c.k), gv(c.v), gdo(c.dout);
                DeviceVec<float> gSt(randomVec(St.size(), 1)), gO(randomVec(c.q.size(), 5));
                DeviceVec<float> gdq(randomVec(c.q.size(), 2)), gdk(randomVec(c.k.size(), 3)),
                    gdv(randomVec(c.k.size(), 4)), gScratch(cpu::attentionFlashScratchSize(dm));
                TS_ASSERT_OK(gq.status);
                cuda::setBf16Gemms(true);
                TS_ASSERT_OK(cuda::attentionFlashForward(dm, gq.ptr, gk.ptr, gv.ptr, gSt.ptr, gO.ptr, m_stream));
                TS_ASSERT_OK(cuda::attentionFlashBackward(dm, gq.ptr, gk.ptr, gv.ptr, gSt.ptr, gdo.ptr, gdq.ptr, gdk.ptr,
                                                          gdv.ptr, gScratch.ptr, m_stream));
                cuda::setBf16Gemms(false);
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                // The scores' GEMM has exact bf16 products: the stats are fp32-close.
                expectNear(gSt.download(), St, 1e-4, 1e-5, tag + "stats", {dm.b, dm.nq, dm.s, 2});
                expectBf16Close({gO.download(), gdq.download(), gdk.download(), gdv.download()}, want, c, gq.ptr, tag);
            }
}

// The tiled flash kernels (flash_attention.cu, setFlashTiles): no [s, s] square, bf16 tensor
// cores. Against the CPU's flash attention on bf16-valued inputs at bf16's tolerance, as the GEMM
// path: s below, at and past one 64-row tile and not a multiple of it; head dims that fill the
// 16/32/64/128 kernels and ones padded to them (40, 100); GQA and dropout. The stats cross both
// ways: the tiled backward from the CPU's stats, and the GEMM path's backward from the tiled
// forward's stats (they share the format).
TEST_F(CudaAttention, TiledFlashAttentionMatchesCpu) {
    struct Restore {
        ~Restore() {
            cuda::setBf16Gemms(false);
            cuda::setFlashTiles(false);
        }
    } restore;
    for (int d : {16, 32, 40, 64, 100, 128})
        ASSERT_TRUE(cuda::flashTilesSupported(d)) << "this GPU cannot run the tiled flash kernels at head dim " << d;
    struct Shape {
        int s, d;
    };
    for (const Shape sh : {Shape{13, 16}, Shape{64, 32}, Shape{130, 40}, Shape{300, 64}, Shape{200, 100},
                           Shape{257, 128}})
        for (int nkv : {2, 4})
            for (float p : {0.0f, 0.1f}) {
                const AttnCase c = makeBf16AttnCase(nkv, p, sh.s, sh.d);
                const auto& dm = c.dims;
                const std::string tag = caseName("attentionFlash tiles", true, dm.nq / nkv, p) + "s=" +
                                        std::to_string(sh.s) + " d=" + std::to_string(sh.d) + " ";
                std::vector<float> St;
                const AttnResult want = cpuFlash(c, St);
                DeviceVec<float> gq(c.q), gk(c.k), gv(c.v), gdo(c.dout), gStCpu(St);
                DeviceVec<float> gSt(randomVec(St.size(), 1)), gO(randomVec(c.q.size(), 5));
                TS_ASSERT_OK(gq.status);
                cuda::setBf16Gemms(true);
                cuda::setFlashTiles(true);
                TS_ASSERT_OK(cuda::attentionFlashForward(dm, gq.ptr, gk.ptr, gv.ptr, gSt.ptr, gO.ptr, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                // The scores' products are exact in bf16: the stats are fp32-close.
                expectNear(gSt.download(), St, 1e-4, 1e-5, tag + "stats", {dm.b, dm.nq, dm.s, 2});
                const std::vector<float> out = gO.download();
                // 0: the tiled backward from its own forward's stats; 1: from the CPU's; 2: the GEMM
                // path's backward from the tiled forward's stats.
                for (int run : {0, 1, 2}) {
                    const std::string t = tag + (run == 0 ? "(tiles) " : run == 1 ? "(tiles, CPU stats) " : "(GEMMs after tiles) ");
                    DeviceVec<float> gdq(randomVec(c.q.size(), 2)), gdk(randomVec(c.k.size(), 3)),
                        gdv(randomVec(c.k.size(), 4)), gScratch(cpu::attentionFlashScratchSize(dm));
                    cuda::setBf16Gemms(true);
                    cuda::setFlashTiles(run != 2);
                    TS_ASSERT_OK(cuda::attentionFlashBackward(dm, gq.ptr, gk.ptr, gv.ptr, run == 1 ? gStCpu.ptr : gSt.ptr,
                                                              gdo.ptr, gdq.ptr, gdk.ptr, gdv.ptr, gScratch.ptr, m_stream));
                    cuda::setBf16Gemms(false);
                    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                    expectBf16Close({out, gdq.download(), gdk.download(), gdv.download()}, want, c, gq.ptr, t);
                }
                cuda::setFlashTiles(false);
            }
}

// The attention that keeps its probabilities (fused and unfused softmax, dropout on and off): q,
// k, v, dout twinned once per call, the fused row kernels writing the bits of dropout(P) and dS,
// the unfused ones none (their GEMMs convert per call). The saved probabilities come from the
// exact bf16 products of the scores, so they are fp32-close.
TEST_F(CudaAttention, Bf16AttentionMatchesCpu) {
    struct Restore {
        ~Restore() { cuda::setBf16Gemms(false); }
    } restore;
    for (int nkv : {2, 4})
        for (float p : {0.0f, 0.1f})
            for (bool fused : {true, false}) {
                const AttnCase c = makeBf16AttnCase(nkv, p, 300);
                const auto& dm = c.dims;
                const std::string tag = caseName("attention bf16", fused, dm.nq / nkv, p);
                AttnResult want{std::vector<float>(c.q.size()), std::vector<float>(c.q.size()),
                                std::vector<float>(c.k.size()), std::vector<float>(c.k.size())};
                std::vector<float> P(cpu::attentionProbsSize(dm)), scratch(cpu::attentionScratchSize(dm));
                cpu::attentionForward(dm, c.q.data(), c.k.data(), c.v.data(), P.data(), want.out.data(), fused);
                cpu::attentionBackward(dm, c.q.data(), c.k.data(), c.v.data(), P.data(), c.dout.data(), want.dq.data(),
                                       want.dk.data(), want.dv.data(), scratch.data(), fused);
                DeviceVec<float> gq(c.q), gk(c.k), gv(c.v), gdo(c.dout);
                DeviceVec<float> gP(randomVec(P.size(), 1)), gO(randomVec(c.q.size(), 5));
                DeviceVec<float> gdq(randomVec(c.q.size(), 2)), gdk(randomVec(c.k.size(), 3)),
                    gdv(randomVec(c.k.size(), 4)), gScratch(cpu::attentionScratchSize(dm));
                TS_ASSERT_OK(gq.status);
                cuda::setBf16Gemms(true);
                TS_ASSERT_OK(cuda::attentionForward(dm, gq.ptr, gk.ptr, gv.ptr, gP.ptr, gO.ptr, fused, m_stream));
                TS_ASSERT_OK(cuda::attentionBackward(dm, gq.ptr, gk.ptr, gv.ptr, gP.ptr, gdo.ptr, gdq.ptr, gdk.ptr,
                                                     gdv.ptr, gScratch.ptr, fused, m_stream));
                cuda::setBf16Gemms(false);
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                expectNear(gP.download(), P, 1e-4, 1e-5, tag + "probs", {dm.b, dm.nq, dm.s, dm.s});
                expectBf16Close({gO.download(), gdq.download(), gdk.download(), gdv.download()}, want, c, gq.ptr, tag);
            }
}

// --- context parallel ---------------------------------------------------------------------------

// The query rows of a cp=2 rank with load-balanced chunks: positions [8, 13) and [20, 25).
const std::vector<int> kQPos{8, 9, 10, 11, 12, 20, 21, 22, 23, 24};

cpu::CpAttnDims cpDims(int skv, int nkv, float p, int sTotal) {
    cpu::CpAttnDims a;
    a.sq = static_cast<int>(kQPos.size());
    a.skv = skv;
    a.b = 2;
    a.nq = 4;
    a.nkv = nkv;
    a.d = 16;
    a.scale = 0.25f;
    a.dropout = p;
    a.dropoutSeed = 99;
    a.headOffset = p > 0 ? 2 : 0;
    a.nqTotal = p > 0 ? 8 : 0;
    a.sTotal = sTotal;
    return a;
}

TEST_F(CudaAttention, CpAttentionForwardAndBackwardMatchCpu) {
    // skv = 23 < the last query positions 23, 24: those rows see every key (the oracle's clamp)
    for (int nkv : {2, 4})
        for (float p : {0.0f, 0.1f}) {
            const cpu::CpAttnDims a = cpDims(23, nkv, p, 0);
            const std::string tag = caseName("cpAttention", true, a.nq / nkv, p);
            const size_t nQ = size_t(a.sq) * a.b * a.nq * a.d, nK = size_t(a.skv) * a.b * nkv * a.d;
            const size_t nP = size_t(a.b) * a.nq * a.sq * a.skv;
            const auto q = randomVec(nQ, 21, -2, 2), k = randomVec(nK, 22, -2, 2), v = randomVec(nK, 23),
                       dout = randomVec(nQ, 24);
            DeviceVec<int> gPos(kQPos);
            DeviceVec<float> gq(q), gk(k), gv(v), gdo(dout), gP(randomVec(nP, 5)), gO(nQ);
            TS_ASSERT_OK(gq.status);
            TS_ASSERT_OK(cuda::cpAttentionForward(a, gPos.ptr, gq.ptr, gk.ptr, gv.ptr, gP.ptr, gO.ptr, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> P(nP), O(nQ);
            cpu::cpAttentionForward(a, kQPos.data(), q.data(), k.data(), v.data(), P.data(), O.data());
            expectNear(gP.download(), P, 1e-5, 1e-6, tag + "forward probs", {a.b, a.nq, a.sq, a.skv});
            expectNear(gO.download(), O, 1e-4, 1e-5, tag + "forward out", {a.sq, a.b, a.nq, a.d});

            DeviceVec<float> gPc(P), gdq(randomVec(nQ, 6)), gdk(randomVec(nK, 7)), gdv(randomVec(nK, 8));
            TS_ASSERT_OK(cuda::cpAttentionBackward(a, gPos.ptr, gq.ptr, gk.ptr, gv.ptr, gPc.ptr, gdo.ptr, gdq.ptr,
                                                   gdk.ptr, gdv.ptr, m_stream));
            TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
            std::vector<float> dq(nQ), dk(nK), dv(nK);
            cpu::cpAttentionBackward(a, kQPos.data(), q.data(), k.data(), v.data(), P.data(), dout.data(), dq.data(),
                                     dk.data(), dv.data());
            expectNear(gdq.download(), dq, 1e-4, 2e-5, tag + "backward dq", {a.sq, a.b, a.nq, a.d});
            expectNear(gdk.download(), dk, 1e-4, 2e-5, tag + "backward dk", {a.skv, a.b, nkv, a.d});
            expectNear(gdv.download(), dv, 1e-4, 2e-5, tag + "backward dv", {a.skv, a.b, nkv, a.d});
        }
}

// Ring blocks against the query rows kQPos (sequence of 32): every section kind.
struct RingBlock {
    const char* kind;
    std::vector<int> kPos;
};
std::vector<RingBlock> ringBlocks() {
    return {{"invisible", {26, 27, 28, 29, 30, 31}},
            {"diagonal", kQPos},
            {"visible", {0, 1, 2, 3, 4, 5, 6, 7}},
            {"mixed", {13, 14, 15, 16, 17, 18, 19}}};
}

TEST_F(CudaAttention, RingAttentionForwardMergesLikeCpu) {
    const int sTotal = 32;
    for (int nkv : {2, 4})
        for (float p : {0.0f, 0.1f})
            for (int order : {0, 1}) {  // 0: starts on the invisible block (lse -inf rows), 1: on the diagonal
                auto blocks = ringBlocks();
                if (order == 1) std::swap(blocks[0], blocks[1]);
                const cpu::CpAttnDims a0 = cpDims(1, nkv, p, sTotal);
                const size_t nQ = size_t(a0.sq) * a0.b * a0.nq * a0.d, nL = size_t(a0.b) * a0.nq * a0.sq;
                const auto q = randomVec(nQ, 31, -2, 2);
                DeviceVec<int> gQPos(kQPos);
                DeviceVec<float> gq(q), gO(randomVec(nQ, 9)), gL(randomVec(nL, 10));  // first=true overwrites
                TS_ASSERT_OK(gq.status);
                std::vector<float> O(nQ), L(nL);
                for (size_t bl = 0; bl < blocks.size(); ++bl) {
                    const bool first = bl == 0;
                    const cpu::CpAttnDims a = cpDims(static_cast<int>(blocks[bl].kPos.size()), nkv, p, sTotal);
                    const size_t nK = size_t(a.skv) * a.b * nkv * a.d;
                    const auto k = randomVec(nK, 40 + uint32_t(bl) * 3 + order, -2, 2),
                               v = randomVec(nK, 41 + uint32_t(bl) * 3 + order);
                    DeviceVec<int> gKPos(blocks[bl].kPos);
                    DeviceVec<float> gk(k), gv(v);
                    TS_ASSERT_OK(cuda::cpRingAttentionForward(a, gQPos.ptr, gKPos.ptr, gq.ptr, gk.ptr, gv.ptr, gO.ptr,
                                                              gL.ptr, first, m_stream));
                    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                    cpu::cpRingAttentionForward(a, kQPos.data(), blocks[bl].kPos.data(), q.data(), k.data(), v.data(),
                                                O.data(), L.data(), first);
                    const std::string tag = caseName("cpRingAttentionForward", true, a.nq / nkv, p) + "block " +
                                            std::to_string(bl) + " (" + blocks[bl].kind +
                                            (first ? ", first) " : ") ");
                    expectNear(gO.download(), O, 1e-4, 1e-5, tag + "out", {a.sq, a.b, a.nq, a.d});
                    expectNear(gL.download(), L, 1e-5, 1e-5, tag + "lse", {a.b, a.nq, a.sq});
                }
            }
}

TEST_F(CudaAttention, RingAttentionDeltaMatchesCpu) {
    const cpu::CpAttnDims a = cpDims(1, 2, 0.0f, 32);
    const size_t nQ = size_t(a.sq) * a.b * a.nq * a.d, nL = size_t(a.b) * a.nq * a.sq;
    const auto out = randomVec(nQ, 51), dout = randomVec(nQ, 52);
    DeviceVec<float> gO(out), gdo(dout), gD(nL);
    TS_ASSERT_OK(gO.status);
    TS_ASSERT_OK(cuda::cpRingAttentionDelta(a, gO.ptr, gdo.ptr, gD.ptr, m_stream));
    TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
    std::vector<float> delta(nL);
    cpu::cpRingAttentionDelta(a, out.data(), dout.data(), delta.data());
    expectNear(gD.download(), delta, 1e-6, 1e-7, "cpRingAttentionDelta delta", {a.b, a.nq, a.sq});
}

TEST_F(CudaAttention, RingAttentionBackwardMatchesCpu) {
    const int sTotal = 32;
    for (int nkv : {2, 4})
        for (float p : {0.0f, 0.1f}) {
            const auto blocks = ringBlocks();
            const cpu::CpAttnDims a0 = cpDims(1, nkv, p, sTotal);
            const size_t nQ = size_t(a0.sq) * a0.b * a0.nq * a0.d, nL = size_t(a0.b) * a0.nq * a0.sq;
            const auto q = randomVec(nQ, 61, -2, 2), dout = randomVec(nQ, 62);
            // the final out and lse of all blocks (CPU), then delta: the inputs of every block's backward
            std::vector<std::vector<float>> ks, vs;
            std::vector<float> O(nQ), L(nL), delta(nL);
            for (size_t bl = 0; bl < blocks.size(); ++bl) {
                const cpu::CpAttnDims a = cpDims(static_cast<int>(blocks[bl].kPos.size()), nkv, p, sTotal);
                const size_t nK = size_t(a.skv) * a.b * nkv * a.d;
                ks.push_back(randomVec(nK, 70 + uint32_t(bl) * 2, -2, 2));
                vs.push_back(randomVec(nK, 71 + uint32_t(bl) * 2));
                cpu::cpRingAttentionForward(a, kQPos.data(), blocks[bl].kPos.data(), q.data(), ks.back().data(),
                                            vs.back().data(), O.data(), L.data(), bl == 0);
            }
            cpu::cpRingAttentionDelta(a0, O.data(), dout.data(), delta.data());
            L[0] = -INFINITY;  // a row that saw no key anywhere: skipped by every block
            const auto dq0 = randomVec(nQ, 63);  // dq accumulates onto what is there
            DeviceVec<int> gQPos(kQPos);
            DeviceVec<float> gq(q), gdo(dout), gL(L), gD(delta);
            TS_ASSERT_OK(gq.status);
            for (size_t bl = 0; bl < blocks.size(); ++bl) {
                const cpu::CpAttnDims a = cpDims(static_cast<int>(blocks[bl].kPos.size()), nkv, p, sTotal);
                const size_t nK = ks[bl].size();
                DeviceVec<int> gKPos(blocks[bl].kPos);
                DeviceVec<float> gk(ks[bl]), gv(vs[bl]), gdq(dq0), gdk(randomVec(nK, 64)), gdv(randomVec(nK, 65));
                TS_ASSERT_OK(cuda::cpRingAttentionBackward(a, gQPos.ptr, gKPos.ptr, gq.ptr, gk.ptr, gv.ptr, gL.ptr,
                                                           gD.ptr, gdo.ptr, gdq.ptr, gdk.ptr, gdv.ptr, m_stream));
                TS_ASSERT_OK(cuda::streamSynchronize(m_stream));
                std::vector<float> dq = dq0, dk(nK), dv(nK);
                cpu::cpRingAttentionBackward(a, kQPos.data(), blocks[bl].kPos.data(), q.data(), ks[bl].data(),
                                             vs[bl].data(), L.data(), delta.data(), dout.data(), dq.data(), dk.data(),
                                             dv.data());
                const std::string tag = caseName("cpRingAttentionBackward", true, a.nq / nkv, p) + "block " +
                                        std::to_string(bl) + " (" + blocks[bl].kind + ") ";
                expectNear(gdq.download(), dq, 1e-4, 2e-5, tag + "dq", {a.sq, a.b, a.nq, a.d});
                expectNear(gdk.download(), dk, 1e-4, 2e-5, tag + "dk", {a.skv, a.b, nkv, a.d});
                expectNear(gdv.download(), dv, 1e-4, 2e-5, tag + "dv", {a.skv, a.b, nkv, a.d});
            }
        }
}

}  // namespace
}  // namespace ts::kernels

#else  // !TS_HAVE_CUDA

TEST(CudaAttention, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif
