// Attention dropout (AttnDims::dropout > 0): forward against a double reference that applies
// the documented mask (dropoutMask with the element numbering of ops.h), fused == unfused,
// the keep rate, TP head slices drawing the single-device mask, and the backward (which
// regenerates the mask) against finite differences.
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"

#include <cmath>

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

AttnDims dims(int s, int b, int nq, int nkv, int d, float p, uint64_t seed) {
    AttnDims dm;
    dm.s = s;
    dm.b = b;
    dm.nq = nq;
    dm.nkv = nkv;
    dm.d = d;
    dm.scale = 1.0f / std::sqrt(static_cast<float>(d));
    dm.dropout = p;
    dm.dropoutSeed = seed;
    return dm;
}

size_t qSize(const AttnDims& dm) { return static_cast<size_t>(dm.s) * dm.b * dm.nq * dm.d; }
size_t kSize(const AttnDims& dm) { return static_cast<size_t>(dm.s) * dm.b * dm.nkv * dm.d; }

// out = dropout(softmax(scale QK^T + causal)) V by explicit loops in double; the keep bit of
// (bi, h, i, j) is element ((bi*nq + h)*s + i)*s + j of dropoutMask's stream.
std::vector<double> refOut(const AttnDims& dm, const std::vector<float>& q,
                           const std::vector<float>& k, const std::vector<float>& v) {
    const int s = dm.s, b = dm.b, nq = dm.nq, nkv = dm.nkv, d = dm.d;
    std::vector<double> out(qSize(dm), 0.0);
    std::vector<uint8_t> mask(static_cast<size_t>(s));
    const double keepScale = 1.0 / (1.0 - dm.dropout);
    for (int bi = 0; bi < b; ++bi)
        for (int h = 0; h < nq; ++h) {
            const int g = h * nkv / nq;
            for (int i = 0; i < s; ++i) {
                std::vector<double> p(static_cast<size_t>(i) + 1);
                double mx = -1e300, sum = 0;
                for (int j = 0; j <= i; ++j) {
                    double acc = 0;
                    for (int c = 0; c < d; ++c)
                        acc += double(q[((size_t(i) * b + bi) * nq + h) * d + c]) *
                               k[((size_t(j) * b + bi) * nkv + g) * d + c];
                    p[size_t(j)] = acc * dm.scale;
                    mx = std::max(mx, p[size_t(j)]);
                }
                for (double& x : p) sum += (x = std::exp(x - mx));
                const uint64_t row = ((uint64_t(bi) * nq + h) * s + i) * uint64_t(s);
                dropoutMask(mask.data(), s, dm.dropout, dm.dropoutSeed, row);
                for (int c = 0; c < d; ++c) {
                    double acc = 0;
                    for (int j = 0; j <= i; ++j)
                        if (mask[size_t(j)])
                            acc += p[size_t(j)] / sum * keepScale *
                                   v[((size_t(j) * b + bi) * nkv + g) * d + c];
                    out[((size_t(i) * b + bi) * nq + h) * d + c] = acc;
                }
            }
        }
    return out;
}

TEST(KernelsAttentionDropout, ForwardMatchesReferenceFusedAndUnfused) {
    const AttnDims dm = dims(70, 2, 4, 2, 8, 0.3f, 77);  // 70 > one causal block of 64
    const auto q = randomVector(qSize(dm), 60, -2, 2);
    const auto k = randomVector(kSize(dm), 61, -2, 2);
    const auto v = randomVector(kSize(dm), 62);
    const auto want = refOut(dm, q, k, v);
    AttnDims noDrop = dm;
    noDrop.dropout = 0;
    std::vector<float> p0(attentionProbsSize(dm)), o0(q.size());
    attentionForward(noDrop, q.data(), k.data(), v.data(), p0.data(), o0.data(), true);
    for (bool fused : {true, false}) {
        std::vector<float> probs(attentionProbsSize(dm), 7.0f), out(q.size(), 7.0f);
        attentionForward(dm, q.data(), k.data(), v.data(), probs.data(), out.data(), fused);
        testing::expectClose(out, want, 1e-5, 1e-5, fused ? "fused out" : "unfused out");
        // probs are saved BEFORE dropout (the backward needs the softmax itself)
        testing::expectClose(probs, p0, 1e-5, 1e-7, "saved probs");
    }
}

TEST(KernelsAttentionDropout, FusedEqualsUnfusedAndSeedMatters) {
    const AttnDims dm = dims(130, 2, 4, 1, 16, 0.1f, 5);  // 3 causal blocks, MQA
    const auto q = randomVector(qSize(dm), 63, -3, 3);
    const auto k = randomVector(kSize(dm), 64, -3, 3);
    const auto v = randomVector(kSize(dm), 65);
    std::vector<float> p1(attentionProbsSize(dm)), p2(p1.size()), o1(q.size()), o2(q.size());
    attentionForward(dm, q.data(), k.data(), v.data(), p1.data(), o1.data(), false);
    attentionForward(dm, q.data(), k.data(), v.data(), p2.data(), o2.data(), true);
    testing::expectClose(o2, o1, 1e-5, 1e-6, "out");
    // another seed gives another mask (so the seed is really used)
    AttnDims other = dm;
    other.dropoutSeed = 6;
    std::vector<float> o3(q.size());
    attentionForward(other, q.data(), k.data(), v.data(), p2.data(), o3.data(), true);
    double diff = 0;
    for (size_t i = 0; i < o1.size(); ++i) diff = std::max(diff, double(std::fabs(o3[i] - o1[i])));
    EXPECT_GT(diff, 1e-3);
}

// V rows one-hot (d = s, v[j] = e_j) and Q = 0: out[i, j] = dropout(P)[i, j] = keep/(1-p)/(i+1),
// so the output shows the mask itself: kept fraction ~ 1-p and the kept value is scaled.
TEST(KernelsAttentionDropout, KeepRateAndScale) {
    const int s = 96, b = 2, nq = 2;
    const float p = 0.25f;
    for (bool fused : {true, false}) {
        const AttnDims dm = dims(s, b, nq, nq, s, p, 123);
        std::vector<float> q(qSize(dm), 0.0f), k(kSize(dm), 0.5f), v(kSize(dm), 0.0f);
        for (int j = 0; j < s; ++j)
            for (int bi = 0; bi < b; ++bi)
                for (int g = 0; g < nq; ++g) v[((size_t(j) * b + bi) * nq + g) * s + j] = 1.0f;
        std::vector<float> probs(attentionProbsSize(dm)), out(q.size());
        attentionForward(dm, q.data(), k.data(), v.data(), probs.data(), out.data(), fused);
        int64_t kept = 0, total = 0;
        for (int i = 0; i < s; ++i)
            for (int bi = 0; bi < b; ++bi)
                for (int h = 0; h < nq; ++h)
                    for (int j = 0; j < s; ++j) {
                        const float o = out[((size_t(i) * b + bi) * nq + h) * s + j];
                        if (j > i) {
                            ASSERT_EQ(o, 0.0f);  // causal
                            continue;
                        }
                        ++total;
                        if (o != 0.0f) {
                            ++kept;
                            ASSERT_NEAR(o, 1.0 / (1.0 - p) / (i + 1), 1e-5);
                        }
                    }
        // binomial: 4 sigma band around the keep probability
        const double rate = double(kept) / double(total);
        const double sigma = std::sqrt(p * (1 - p) / double(total));
        EXPECT_NEAR(rate, 1.0 - p, 4 * sigma) << (fused ? "fused" : "unfused") << " n=" << total;
    }
}

// The naive (unfused) backward — full-square GEMMs, whole-head dropout and softmax passes —
// agrees with the causal block-triangle one, with and without dropout.
TEST(KernelsAttentionDropout, UnfusedBackwardEqualsFusedBackward) {
    for (float p : {0.0f, 0.2f}) {
        const AttnDims dm = dims(130, 2, 4, 2, 8, p, 17);  // 3 causal blocks, GQA
        const auto q = randomVector(qSize(dm), 80, -2, 2);
        const auto k = randomVector(kSize(dm), 81, -2, 2);
        const auto v = randomVector(kSize(dm), 82);
        const auto dout = randomVector(q.size(), 83);
        std::vector<float> probs(attentionProbsSize(dm)), out(q.size());
        attentionForward(dm, q.data(), k.data(), v.data(), probs.data(), out.data(), true);
        std::vector<float> g[2][3];
        for (int f = 0; f < 2; ++f) {
            g[f][0].assign(q.size(), 9.f);
            g[f][1].assign(k.size(), 9.f);
            g[f][2].assign(v.size(), 9.f);
            std::vector<float> scratch(attentionScratchSize(dm), 4.f);
            attentionBackward(dm, q.data(), k.data(), v.data(), probs.data(), dout.data(),
                              g[f][0].data(), g[f][1].data(), g[f][2].data(), scratch.data(),
                              f == 1);
        }
        testing::expectClose(g[0][0], g[1][0], 1e-4, 1e-6, "dq");
        testing::expectClose(g[0][1], g[1][1], 1e-4, 1e-6, "dk");
        testing::expectClose(g[0][2], g[1][2], 1e-4, 1e-6, "dv");
    }
}

// Tensor parallelism: a rank holding heads [2, 4) of 4 (headOffset 2, nqTotal 4) draws the same
// mask for them as the single device holding all 4.
TEST(KernelsAttentionDropout, HeadSliceDrawsSingleDeviceMask) {
    const AttnDims full = dims(40, 2, 4, 2, 8, 0.2f, 9);
    const auto q = randomVector(qSize(full), 66, -2, 2);
    const auto k = randomVector(kSize(full), 67, -2, 2);
    const auto v = randomVector(kSize(full), 68);
    std::vector<float> probs(attentionProbsSize(full)), out(q.size());
    attentionForward(full, q.data(), k.data(), v.data(), probs.data(), out.data(), true);
    AttnDims half = full;
    half.nq = 2;
    half.nkv = 1;
    half.headOffset = 2;
    half.nqTotal = 4;
    const int s = full.s, b = full.b, d = full.d;
    // heads 2,3 and their group 1, as [s, b, 2, d] / [s, b, 1, d]
    std::vector<float> qh(qSize(half)), kh(kSize(half)), vh(kSize(half));
    for (int t = 0; t < s * b; ++t) {
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < d; ++c)
                qh[(size_t(t) * 2 + h) * d + c] = q[(size_t(t) * 4 + 2 + h) * d + c];
        for (int c = 0; c < d; ++c) {
            kh[size_t(t) * d + c] = k[(size_t(t) * 2 + 1) * d + c];
            vh[size_t(t) * d + c] = v[(size_t(t) * 2 + 1) * d + c];
        }
    }
    std::vector<float> ph(attentionProbsSize(half)), oh(qh.size());
    attentionForward(half, qh.data(), kh.data(), vh.data(), ph.data(), oh.data(), true);
    // a different mask would change entries by O(1); GEMM strides may change the last bits
    std::vector<float> want(oh.size());
    for (int t = 0; t < s * b; ++t)
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < d; ++c)
                want[(size_t(t) * 2 + h) * d + c] = out[(size_t(t) * 4 + 2 + h) * d + c];
    testing::expectClose(oh, want, 1e-6, 1e-7, "heads 2,3 of 4");
}

TEST(KernelsAttentionDropout, BackwardMatchesFiniteDifferences) {
    // The mask is a pure function of (seed, element), so for fixed dims the forward is a
    // smooth function of q, k, v and finite differences apply.
    for (bool fused : {true, false}) {
        const AttnDims dm = dims(67, 2, 4, 2, 4, 0.3f, 31);
        auto q = randomVector(qSize(dm), 70, -1.5, 1.5);
        auto k = randomVector(kSize(dm), 71, -1.5, 1.5);
        auto v = randomVector(kSize(dm), 72);
        const auto r = randomVector(q.size(), 73);
        std::vector<float> probs(attentionProbsSize(dm)), out(q.size());
        auto loss = [&] {
            attentionForward(dm, q.data(), k.data(), v.data(), probs.data(), out.data(), fused);
            return testing::dotD(r, out);
        };
        loss();
        std::vector<float> dq(q.size(), 5.f), dk(k.size(), 5.f), dv(v.size(), 5.f);
        ASSERT_EQ(attentionScratchSize(dm), 2 * size_t(dm.s) * dm.s);
        std::vector<float> scratch(attentionScratchSize(dm), 3.f);  // garbage is overwritten
        attentionBackward(dm, q.data(), k.data(), v.data(), probs.data(), r.data(), dq.data(),
                          dk.data(), dv.data(), scratch.data(), fused);
        auto idx = [&](size_t n, uint32_t seed) {
            auto v2 = testing::sampleIndices(n, 300, seed);
            v2.push_back(0);
            v2.push_back(n - 1);
            return v2;
        };
        const char* tag = fused ? "fused" : "unfused";
        testing::checkGradient(q, dq, loss, idx(q.size(), 1), 1e-2, 3e-3, tag);
        testing::checkGradient(k, dk, loss, idx(k.size(), 2), 1e-2, 3e-3, tag);
        testing::checkGradient(v, dv, loss, idx(v.size(), 3), 1e-2, 3e-3, tag);
    }
}

}  // namespace
}  // namespace ts::kernels::cpu
