// The MoE router's host-side plan (engine/model/moe_routing.h) on logits written here: top-k with
// ties to the lower expert, renormalised probs, the "probs" and "position" drop policies at a
// capacity (which copies each expert keeps when their probs differ), padding, and the
// expert-major permutation. Expected values are worked out by hand in the comments.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/model/moe_routing.h"

namespace ts::engine {
namespace {

// Six tokens over three experts: every token picks experts 0 and 1 (expert 2's logit is far
// below), with prob(expert 0) = sigmoid(d_t), d = logit0 - logit1 all different.
const std::vector<float> kD = {0.1f, 2.0f, -1.0f, 0.5f, 3.0f, -0.3f};

std::vector<float> twoExpertLogits() {
    std::vector<float> l;
    for (float d : kD) l.insert(l.end(), {d, 0.f, -20.f});
    return l;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

MoeRouteOptions options(int cap, bool byProb, bool pad = false) {
    MoeRouteOptions o;
    o.T = 6;
    o.E = 3;
    o.K = 2;
    o.cap = cap;
    o.byProb = byProb;
    o.pad = pad;
    return o;
}

// The tokens of expert e's rows, in row order.
std::vector<int> tokensOf(const MoeRouting& r, int e) {
    return {r.tokenOf.begin() + r.offset[size_t(e)], r.tokenOf.begin() + r.offset[size_t(e) + 1]};
}

TEST(MoeRouting, DroplessPermutationIsExpertMajorTokenAscending) {
    const auto logits = twoExpertLogits();
    const MoeRouting r = moeRoute(logits.data(), options(-1, true));
    EXPECT_EQ(r.rows(), 12);
    EXPECT_EQ(r.dropped, 0);
    EXPECT_EQ(r.routed, (std::vector<int>{6, 6, 0}));
    EXPECT_EQ(tokensOf(r, 0), (std::vector<int>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(tokensOf(r, 1), (std::vector<int>{0, 1, 2, 3, 4, 5}));
    EXPECT_TRUE(tokensOf(r, 2).empty());
    for (int t = 0; t < 6; ++t) {
        // Token t's best choice first: expert 0 when d > 0.
        EXPECT_EQ(r.topi[size_t(2 * t)], kD[size_t(t)] > 0 ? 0 : 1) << t;
        EXPECT_NEAR(r.prob[size_t(t)], sigmoid(kD[size_t(t)]), 1e-6) << t;          // expert 0's row
        EXPECT_NEAR(r.prob[size_t(6 + t)], sigmoid(-kD[size_t(t)]), 1e-6) << t;     // expert 1's row
        EXPECT_EQ(r.slotOf[size_t(t)], kD[size_t(t)] > 0 ? 0 : 1) << t;
    }
}

// cap 2 of 6 copies per expert. "probs": expert 0 keeps its two highest sigmoid(d) — tokens 4
// (d 3.0) and 1 (d 2.0); expert 1 keeps its two highest sigmoid(-d) — tokens 2 (d -1.0) and 5
// (d -0.3). "position": both keep tokens 0 and 1. Eight copies dropped either way.
TEST(MoeRouting, ProbsPolicyKeepsTheHighestProbsAndPositionTheFirstTokens) {
    const auto logits = twoExpertLogits();
    const MoeRouting byProb = moeRoute(logits.data(), options(2, true));
    EXPECT_EQ(byProb.dropped, 8);
    EXPECT_EQ(byProb.routed, (std::vector<int>{6, 6, 0}));  // counted before dropping (aux loss)
    EXPECT_EQ(tokensOf(byProb, 0), (std::vector<int>{1, 4}));
    EXPECT_EQ(tokensOf(byProb, 1), (std::vector<int>{2, 5}));
    EXPECT_NEAR(byProb.prob[0], sigmoid(2.0), 1e-6);
    EXPECT_NEAR(byProb.prob[1], sigmoid(3.0), 1e-6);
    EXPECT_NEAR(byProb.prob[2], sigmoid(1.0), 1e-6);
    EXPECT_NEAR(byProb.prob[3], sigmoid(0.3), 1e-6);
    const MoeRouting byPos = moeRoute(logits.data(), options(2, false));
    EXPECT_EQ(byPos.dropped, 8);
    EXPECT_EQ(tokensOf(byPos, 0), (std::vector<int>{0, 1}));
    EXPECT_EQ(tokensOf(byPos, 1), (std::vector<int>{0, 1}));
    EXPECT_NEAR(byPos.prob[2], sigmoid(-0.1), 1e-6);
}

// Equal probs: the earlier token wins (a stable sort by prob).
TEST(MoeRouting, ProbsPolicyBreaksTiesByToken) {
    std::vector<float> logits;
    for (float d : {0.5f, 1.5f, 0.5f, 0.5f}) logits.insert(logits.end(), {d, 0.f});
    MoeRouteOptions o;
    o.T = 4;
    o.E = 2;
    o.K = 2;
    o.cap = 2;
    const MoeRouting r = moeRoute(logits.data(), o);
    EXPECT_EQ(tokensOf(r, 0), (std::vector<int>{0, 1}));  // 1.5 first, then the first 0.5
    EXPECT_EQ(tokensOf(r, 1), (std::vector<int>{0, 2}));  // sigmoid(-0.5) x3: tokens 0 and 2
}

// Padding: every expert gets exactly cap rows; expert 2, routed nothing, gets the earliest tokens
// at prob 0 (slot -1); kept copies keep their probs.
TEST(MoeRouting, PaddingFillsEveryExpertToCapacityWithZeroProbRows) {
    const auto logits = twoExpertLogits();
    const MoeRouting r = moeRoute(logits.data(), options(2, true, /*pad=*/true));
    EXPECT_EQ(r.rows(), 6);
    EXPECT_EQ(tokensOf(r, 0), (std::vector<int>{1, 4}));
    EXPECT_EQ(tokensOf(r, 2), (std::vector<int>{0, 1}));
    for (int i = 4; i < 6; ++i) {
        EXPECT_EQ(r.prob[size_t(i)], 0.f);
        EXPECT_EQ(r.slotOf[size_t(i)], -1);
        EXPECT_EQ(r.expertOf[size_t(i)], 2);
    }
}

// Top-k ties go to the lower expert index; the full-softmax sums and z feed the aux and z losses.
TEST(MoeRouting, TiesGoToTheLowerExpertAndStatisticsAreTheSoftmaxSums) {
    const std::vector<float> logits = {1.f, 1.f, 1.f, 1.f, 0.f, 2.f, 2.f, 0.f};  // 2 tokens, 4 experts
    MoeRouteOptions o;
    o.T = 2;
    o.E = 4;
    o.K = 2;
    o.microBatch = 2;
    o.groups = 2;  // seq_aux_loss: one group per sequence
    const MoeRouting r = moeRoute(logits.data(), o);
    EXPECT_EQ(r.topi, (std::vector<int>{0, 1, 1, 2}));
    EXPECT_EQ(r.groupCounts, (std::vector<int>{1, 1, 0, 0, 0, 1, 1, 0}));
    EXPECT_NEAR(r.probSum[0], 0.25, 1e-12);
    const double z1 = std::log(2 + 2 * std::exp(2.0));  // logsumexp of token 1
    EXPECT_NEAR(r.probSum[4 + 1], std::exp(2.0) / (2 + 2 * std::exp(2.0)), 1e-12);
    EXPECT_NEAR(r.zSum, std::pow(1 + std::log(4.0), 2) + z1 * z1, 1e-9);
}

}  // namespace
}  // namespace ts::engine
