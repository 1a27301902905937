// Causal GQA attention: forward against a scalar-loop reference in double, fused vs unfused
// softmax, backward against finite differences (sequence longer than the kernel's causal
// block so the block-triangle bookkeeping is exercised).
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

// out[s, b, nq, d] and probs[b, nq, s, s] by the definition, with explicit loops.
void refAttention(const AttnDims& dm, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, std::vector<double>& probs,
                  std::vector<double>& out) {
    const int s = dm.s, b = dm.b, nq = dm.nq, nkv = dm.nkv, d = dm.d;
    probs.assign(static_cast<size_t>(b) * nq * s * s, 0.0);
    out.assign(static_cast<size_t>(s) * b * nq * d, 0.0);
    auto qi = [&](int si, int bi, int h, int c) { return q[((static_cast<size_t>(si) * b + bi) * nq + h) * d + c]; };
    auto ki = [&](int si, int bi, int g, int c) { return k[((static_cast<size_t>(si) * b + bi) * nkv + g) * d + c]; };
    auto vi = [&](int si, int bi, int g, int c) { return v[((static_cast<size_t>(si) * b + bi) * nkv + g) * d + c]; };
    for (int bi = 0; bi < b; ++bi)
        for (int h = 0; h < nq; ++h) {
            const int g = h * nkv / nq;  // query group of head h
            for (int i = 0; i < s; ++i) {
                std::vector<double> sc(i + 1);
                double mx = -1e300;
                for (int j = 0; j <= i; ++j) {
                    double acc = 0;
                    for (int c = 0; c < d; ++c) acc += static_cast<double>(qi(i, bi, h, c)) * ki(j, bi, g, c);
                    sc[j] = acc * dm.scale;
                    mx = std::max(mx, sc[j]);
                }
                double sum = 0;
                for (int j = 0; j <= i; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
                double* prow = &probs[((static_cast<size_t>(bi) * nq + h) * s + i) * s];
                for (int j = 0; j <= i; ++j) prow[j] = sc[j] / sum;
                for (int c = 0; c < d; ++c) {
                    double acc = 0;
                    for (int j = 0; j <= i; ++j) acc += prow[j] * vi(j, bi, g, c);
                    out[((static_cast<size_t>(i) * b + bi) * nq + h) * d + c] = acc;
                }
            }
        }
}

AttnDims dims(int s, int b, int nq, int nkv, int d) {
    AttnDims dm;
    dm.s = s;
    dm.b = b;
    dm.nq = nq;
    dm.nkv = nkv;
    dm.d = d;
    dm.scale = 1.0f / std::sqrt(static_cast<float>(d));
    return dm;
}

TEST(KernelsAttention, ForwardMatchesScalarReferenceGqaFusedAndUnfused) {
    const AttnDims dm = dims(70, 2, 4, 2, 8);  // 70 > one causal block of 64
    const auto q = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nq * dm.d, 50, -2, 2);
    const auto k = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nkv * dm.d, 51, -2, 2);
    const auto v = randomVector(k.size(), 52);
    std::vector<double> wantP, wantO;
    refAttention(dm, q, k, v, wantP, wantO);
    for (bool fused : {true, false}) {
        std::vector<float> probs(attentionProbsSize(dm), 7.0f), out(q.size(), 7.0f);
        attentionForward(dm, q.data(), k.data(), v.data(), probs.data(), out.data(), fused);
        testing::expectClose(probs, wantP, 1e-5, 1e-6, fused ? "fused probs" : "probs");
        testing::expectClose(out, wantO, 1e-5, 1e-5, fused ? "fused out" : "out");
    }
}

TEST(KernelsAttention, FusedSoftmaxEqualsUnfusedPath) {
    const AttnDims dm = dims(130, 2, 4, 1, 16);  // 3 causal blocks, MQA
    const auto q = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nq * dm.d, 53, -3, 3);
    const auto k = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nkv * dm.d, 54, -3, 3);
    const auto v = randomVector(k.size(), 55);
    std::vector<float> p1(attentionProbsSize(dm)), p2(p1.size()), o1(q.size()), o2(q.size());
    attentionForward(dm, q.data(), k.data(), v.data(), p1.data(), o1.data(), false);
    attentionForward(dm, q.data(), k.data(), v.data(), p2.data(), o2.data(), true);
    testing::expectClose(p2, p1, 1e-5, 1e-7, "probs");
    testing::expectClose(o2, o1, 1e-5, 1e-6, "out");
    // the causal upper triangle is exactly zero in both
    for (int h = 0; h < dm.b * dm.nq; ++h)
        for (int i = 0; i < dm.s; ++i)
            for (int j = i + 1; j < dm.s; ++j) {
                const size_t at = (static_cast<size_t>(h) * dm.s + i) * dm.s + j;
                ASSERT_EQ(p1[at], 0.0f);
                ASSERT_EQ(p2[at], 0.0f);
            }
}

TEST(KernelsAttention, BackwardMatchesFiniteDifferencesGqa) {
    const AttnDims dm = dims(67, 2, 4, 2, 4);
    auto q = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nq * dm.d, 56, -1.5, 1.5);
    auto k = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nkv * dm.d, 57, -1.5, 1.5);
    auto v = randomVector(k.size(), 58);
    const auto r = randomVector(q.size(), 59);
    std::vector<float> probs(attentionProbsSize(dm)), out(q.size());
    auto loss = [&] {
        attentionForward(dm, q.data(), k.data(), v.data(), probs.data(), out.data(), true);
        return testing::dotD(r, out);
    };
    loss();
    // garbage in the outputs must be overwritten (dk/dv accumulate across a group internally)
    std::vector<float> dq(q.size(), 5.f), dk(k.size(), 5.f), dv(v.size(), 5.f);
    std::vector<float> scratch(static_cast<size_t>(dm.s) * dm.s, 3.f);
    attentionBackward(dm, q.data(), k.data(), v.data(), probs.data(), r.data(), dq.data(),
                      dk.data(), dv.data(), scratch.data());
    // sample indices, always including the first and last rows (block edges)
    auto idx = [&](size_t n, uint32_t seed) {
        auto v2 = testing::sampleIndices(n, 300, seed);
        v2.push_back(0);
        v2.push_back(n - 1);
        return v2;
    };
    testing::checkGradient(q, dq, loss, idx(q.size(), 1), 1e-2, 3e-3, "dq");
    testing::checkGradient(k, dk, loss, idx(k.size(), 2), 1e-2, 3e-3, "dk");
    testing::checkGradient(v, dv, loss, idx(v.size(), 3), 1e-2, 3e-3, "dv");
}

// Model-sized heads (d = 64, and 72 for a column tail past the 16-wide strips), sequence
// lengths that end mid-tile and mid-block, GQA: the fused path (smallGemm panels, tile-level
// causality) against the scalar reference forward and the naive OpenBLAS backward. Outputs
// start as garbage so that every element must be written.
TEST(KernelsAttention, FusedForwardAndBackwardAtModelHeadDimsWithTails) {
    for (const AttnDims& dm : {dims(100, 1, 4, 2, 64), dims(203, 2, 2, 1, 72)}) {
        SCOPED_TRACE(::testing::Message() << "s=" << dm.s << " d=" << dm.d);
        const auto q = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nq * dm.d, 60, -2, 2);
        const auto k = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nkv * dm.d, 61, -2, 2);
        const auto v = randomVector(k.size(), 62);
        const auto dout = randomVector(q.size(), 63);
        std::vector<double> wantP, wantO;
        refAttention(dm, q, k, v, wantP, wantO);
        std::vector<float> probs(attentionProbsSize(dm), 7.0f), out(q.size(), 7.0f);
        attentionForward(dm, q.data(), k.data(), v.data(), probs.data(), out.data(), true);
        testing::expectClose(probs, wantP, 1e-5, 1e-6, "fused probs");
        testing::expectClose(out, wantO, 1e-5, 1e-5, "fused out");
        std::vector<float> grads[2][3];
        for (int fused = 0; fused < 2; ++fused) {
            auto& g = grads[fused];
            g[0].assign(q.size(), 5.f);
            g[1].assign(k.size(), 5.f);
            g[2].assign(v.size(), 5.f);
            std::vector<float> scratch(attentionScratchSize(dm), 3.f);
            attentionBackward(dm, q.data(), k.data(), v.data(), probs.data(), dout.data(),
                              g[0].data(), g[1].data(), g[2].data(), scratch.data(),
                              fused == 1);
        }
        testing::expectClose(grads[1][0], grads[0][0], 1e-4, 1e-5, "dq fused vs naive");
        testing::expectClose(grads[1][1], grads[0][1], 1e-4, 1e-5, "dk fused vs naive");
        testing::expectClose(grads[1][2], grads[0][2], 1e-4, 1e-5, "dv fused vs naive");
    }
}

// With more than one kernel thread the fused path splits the batch over threads: forward and
// backward are bit-identical to the 1-thread run (b = 3 splits unevenly).
TEST(KernelsAttention, BatchSplitOverThreadsIsBitIdentical) {
    const AttnDims dm = dims(70, 3, 4, 2, 16);
    const auto q = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nq * dm.d, 70, -2, 2);
    const auto k = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nkv * dm.d, 71, -2, 2);
    const auto v = randomVector(k.size(), 72);
    const auto dout = randomVector(q.size(), 73);
    const int before = numThreads();
    std::vector<float> res[2][5];
    for (int run = 0; run < 2; ++run) {
        setNumThreads(run == 0 ? 1 : 2);
        EXPECT_EQ(numThreads(), run == 0 ? 1 : 2) << "the split path must actually run";
        auto& r = res[run];
        r[0].assign(attentionProbsSize(dm), 7.f);
        r[1].assign(q.size(), 7.f);
        attentionForward(dm, q.data(), k.data(), v.data(), r[0].data(), r[1].data(), true);
        r[2].assign(q.size(), 5.f);
        r[3].assign(k.size(), 5.f);
        r[4].assign(v.size(), 5.f);
        std::vector<float> scratch(attentionScratchSize(dm), 3.f);
        attentionBackward(dm, q.data(), k.data(), v.data(), r[0].data(), dout.data(), r[2].data(),
                          r[3].data(), r[4].data(), scratch.data(), true);
    }
    setNumThreads(before);
    const char* names[5] = {"probs", "out", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i) EXPECT_EQ(res[0][i], res[1][i]) << names[i];
}

// Flash attention keeps only each row's max and 1/sum; its forward is the fused path's and its
// backward rebuilds the fused path's probabilities bit for bit, so every output equals the
// fused path's exactly: GQA, several row blocks with a tail, dropout, one and two threads.
TEST(KernelsAttention, FlashEqualsTheFusedPathBitForBit) {
    const int before = numThreads();
    for (float p : {0.0f, 0.2f}) {
        for (int threads : {1, 2}) {
            AttnDims dm = dims(150, 3, 4, 2, 24);
            dm.dropout = p;
            dm.dropoutSeed = 91;
            SCOPED_TRACE(::testing::Message() << "dropout=" << p << " threads=" << threads);
            setNumThreads(threads);
            const auto q = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nq * dm.d, 80, -2, 2);
            const auto k = randomVector(static_cast<size_t>(dm.s) * dm.b * dm.nkv * dm.d, 81, -2, 2);
            const auto v = randomVector(k.size(), 82);
            const auto dout = randomVector(q.size(), 83);
            std::vector<float> probs(attentionProbsSize(dm), 7.f), out(q.size(), 7.f);
            attentionForward(dm, q.data(), k.data(), v.data(), probs.data(), out.data(), true);
            std::vector<float> dq(q.size(), 5.f), dk(k.size(), 5.f), dv(v.size(), 5.f);
            std::vector<float> scratch(attentionScratchSize(dm), 3.f);
            attentionBackward(dm, q.data(), k.data(), v.data(), probs.data(), dout.data(), dq.data(), dk.data(),
                              dv.data(), scratch.data(), true);

            ASSERT_EQ(attentionStatsSize(dm), size_t(2) * dm.b * dm.nq * dm.s);
            std::vector<float> stats(attentionStatsSize(dm), 7.f), fout(q.size(), 9.f);
            attentionFlashForward(dm, q.data(), k.data(), v.data(), stats.data(), fout.data());
            EXPECT_EQ(fout, out) << "flash forward";
            // the stats are each probs row's max score and 1/sum: row 0 sees one key (p = 1)
            for (int64_t hd = 0; hd < int64_t(dm.b) * dm.nq; ++hd) {
                EXPECT_EQ(stats[size_t(2 * hd * dm.s + 1)], 1.0f) << "head " << hd;
                EXPECT_EQ(probs[size_t(hd * dm.s * dm.s)], 1.0f) << "head " << hd;
            }
            std::vector<float> fdq(q.size(), 6.f), fdk(k.size(), 6.f), fdv(v.size(), 6.f);
            std::vector<float> fscratch(attentionFlashScratchSize(dm), 4.f);
            attentionFlashBackward(dm, q.data(), k.data(), v.data(), stats.data(), dout.data(), fdq.data(),
                                   fdk.data(), fdv.data(), fscratch.data());
            EXPECT_EQ(fdq, dq) << "dq";
            EXPECT_EQ(fdk, dk) << "dk";
            EXPECT_EQ(fdv, dv) << "dv";
        }
    }
    setNumThreads(before);
}

}  // namespace
}  // namespace ts::kernels::cpu
