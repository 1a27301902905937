// Cross entropy: unfused, fused and vocab-parallel staged (2 and 4 partitions, with the
// caller's all-reduces emulated) agree with each other and with a double log-softmax
// reference; their gradients match finite differences.
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

std::vector<double> refLoss(const std::vector<float>& logits, const std::vector<int32_t>& tg,
                            int T, int V) {
    std::vector<double> loss(T);
    for (int t = 0; t < T; ++t) {
        double mx = -1e300, s = 0;
        for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[t * V + j]));
        for (int j = 0; j < V; ++j) s += std::exp(logits[t * V + j] - mx);
        loss[t] = std::log(s) + mx - logits[t * V + tg[t]];
    }
    return loss;
}

// Vocab-parallel CE over `parts` equal partitions; the all-reduces are loops over partitions.
void stagedCe(const std::vector<float>& logits, const std::vector<int32_t>& tg,
              const std::vector<float>& dloss, int T, int V, int parts, std::vector<float>& loss,
              std::vector<float>& grad) {
    const int Vl = V / parts;
    std::vector<std::vector<float>> shard(parts, std::vector<float>(static_cast<size_t>(T) * Vl));
    for (int p = 0; p < parts; ++p)
        for (int t = 0; t < T; ++t)
            for (int j = 0; j < Vl; ++j) shard[p][t * Vl + j] = logits[t * V + p * Vl + j];
    std::vector<float> gmax(T, -INFINITY), tl(T, 0.f), se(T, 0.f), tmp(T), tl2(T), se2(T);
    for (int p = 0; p < parts; ++p) {  // 1) all-reduce MAX
        crossEntropyRowMax(shard[p].data(), tmp.data(), T, Vl);
        for (int t = 0; t < T; ++t) gmax[t] = std::max(gmax[t], tmp[t]);
    }
    for (int p = 0; p < parts; ++p) {  // 2) all-reduce SUM of target logit and sum-exp
        crossEntropyStats(shard[p].data(), tg.data(), gmax.data(), tl2.data(), se2.data(), T, Vl,
                          p * Vl);
        for (int t = 0; t < T; ++t) {
            tl[t] += tl2[t];
            se[t] += se2[t];
        }
    }
    loss.resize(T);
    crossEntropyLoss(tl.data(), se.data(), loss.data(), T);
    grad.assign(static_cast<size_t>(T) * V, 0.f);
    for (int p = 0; p < parts; ++p) {
        // in place, as the engine will do it
        crossEntropyBackward(shard[p].data(), tg.data(), gmax.data(), se.data(), dloss.data(),
                             shard[p].data(), T, Vl, p * Vl);
        for (int t = 0; t < T; ++t)
            for (int j = 0; j < Vl; ++j) grad[t * V + p * Vl + j] = shard[p][t * Vl + j];
    }
}

struct CeCase {
    int T = 12, V = 64;
    std::vector<float> logits;
    std::vector<int32_t> targets;
    std::vector<float> dloss;
    CeCase() {
        logits = randomVector(static_cast<size_t>(T) * V, 80, -5.0f, 5.0f);
        logits[3] = 40.0f;  // one dominant logit: the max-shift matters
        targets.resize(T);
        for (int t = 0; t < T; ++t) targets[t] = (t * 37 + 5) % V;  // hits every partition
        dloss = randomVector(T, 81, 0.5f, 1.5f);
    }
};

TEST(KernelsCrossEntropy, AllThreeVariantsAgreeWithReference) {
    CeCase c;
    const auto want = refLoss(c.logits, c.targets, c.T, c.V);
    // unfused
    std::vector<float> probs(c.logits.size()), lossU(c.T), gradU(c.logits.size());
    crossEntropyForwardUnfused(c.logits.data(), c.targets.data(), probs.data(), lossU.data(), c.T,
                               c.V);
    crossEntropyBackwardUnfused(probs.data(), c.targets.data(), c.dloss.data(), gradU.data(), c.T,
                                c.V);
    testing::expectClose(lossU, want, 1e-5, 1e-6, "unfused loss");
    // fused, in place
    auto gradF = c.logits;
    std::vector<float> lossF(c.T);
    crossEntropyFused(gradF.data(), c.targets.data(), c.dloss.data(), lossF.data(), c.T, c.V);
    testing::expectClose(lossF, want, 1e-5, 1e-6, "fused loss");
    testing::expectClose(gradF, gradU, 1e-5, 1e-7, "fused grad vs unfused");
    // staged, 1/2/4 partitions
    for (int parts : {1, 2, 4}) {
        std::vector<float> lossS, gradS;
        stagedCe(c.logits, c.targets, c.dloss, c.T, c.V, parts, lossS, gradS);
        testing::expectClose(lossS, lossF, 1e-6, 1e-7, "staged loss vs fused");
        testing::expectClose(gradS, gradF, 1e-5, 1e-7, "staged grad vs fused");
    }
}

TEST(KernelsCrossEntropy, GradientsMatchFiniteDifferences) {
    CeCase c;
    c.T = 3;
    c.V = 16;
    c.logits = randomVector(static_cast<size_t>(c.T) * c.V, 82, -3.0f, 3.0f);
    c.targets = {2, 15, 7};
    c.dloss = {0.7f, 1.3f, 1.0f};
    auto x = c.logits;
    auto weighted = [&](const std::vector<float>& loss) {
        double s = 0;
        for (int t = 0; t < c.T; ++t) s += static_cast<double>(c.dloss[t]) * loss[t];
        return s;
    };
    {  // unfused
        std::vector<float> probs(x.size()), loss(c.T), grad(x.size());
        crossEntropyForwardUnfused(x.data(), c.targets.data(), probs.data(), loss.data(), c.T, c.V);
        crossEntropyBackwardUnfused(probs.data(), c.targets.data(), c.dloss.data(), grad.data(),
                                    c.T, c.V);
        auto f = [&] {
            crossEntropyForwardUnfused(x.data(), c.targets.data(), probs.data(), loss.data(), c.T,
                                       c.V);
            return weighted(loss);
        };
        testing::checkGradient(x, grad, f, testing::allIndices(x.size()), 1e-2, 2e-3, "unfused");
    }
    {  // fused
        auto grad = x;
        std::vector<float> loss(c.T);
        crossEntropyFused(grad.data(), c.targets.data(), c.dloss.data(), loss.data(), c.T, c.V);
        auto f = [&] {
            auto tmp = x;
            crossEntropyFused(tmp.data(), c.targets.data(), c.dloss.data(), loss.data(), c.T, c.V);
            return weighted(loss);
        };
        testing::checkGradient(x, grad, f, testing::allIndices(x.size()), 1e-2, 2e-3, "fused");
    }
    {  // staged over 4 partitions
        std::vector<float> loss, grad;
        stagedCe(x, c.targets, c.dloss, c.T, c.V, 4, loss, grad);
        auto f = [&] {
            std::vector<float> l, g;
            stagedCe(x, c.targets, c.dloss, c.T, c.V, 4, l, g);
            return weighted(l);
        };
        testing::checkGradient(x, grad, f, testing::allIndices(x.size()), 1e-2, 2e-3, "staged");
    }
}

TEST(KernelsCrossEntropy, LargeLogitsStayFinite) {
    const int T = 2, V = 40;
    std::vector<float> logits(T * V, 1000.0f);
    logits[5] = 1010.0f;
    std::vector<int32_t> tg = {5, 6};
    std::vector<float> dl = {1.f, 1.f}, loss(T);
    crossEntropyFused(logits.data(), tg.data(), dl.data(), loss.data(), T, V);
    EXPECT_NEAR(loss[0], std::log(std::exp(10.0) + 39.0) - 10.0, 1e-4);
    EXPECT_NEAR(loss[1], std::log(40.0), 1e-5);
    EXPECT_TRUE(allFinite(logits.data(), T * V));
}

}  // namespace
}  // namespace ts::kernels::cpu
