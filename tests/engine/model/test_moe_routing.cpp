// The MoE router's host-side plan (engine/model/moe_routing.h) on logits written here: top-k with
// ties to the lower expert, renormalised probs, the "probs" and "position" drop policies at a
// capacity (which copies each expert keeps when their probs differ), padding, and the
// expert-major permutation; the score functions (sigmoid, sqrtsoftplus, pre-softmax), the scaling
// factor, group-limited routing, the expert bias and the sinkhorn router; the backward of the probs
// and of the aux scores against finite differences. Expected values are worked out by hand in the
// comments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <random>

#include "engine/model/moe_routing.h"
#include "kernels/cpu/ops.h"

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

// The aux and z losses' counts and statistics of T tokens (the kernel moeRouterAuxCounts' oracle,
// which the engine runs whoever routed): counts and score sums [groups][E], sum of lse^2.
struct AuxStats {
    std::vector<int> counts;
    std::vector<double> probSum;
    double zSum = 0;
};
AuxStats auxStats(const std::vector<float>& logits, int T, int E, int K, int groups, int microBatch,
                  MoeScore score = MoeScore::Softmax) {
    std::vector<float> counts(size_t(groups) * E), stats(size_t(groups) * E + 1);
    kernels::cpu::moeRouterAuxCounts(logits.data(), T, E, K, groups, microBatch, score, counts.data(), nullptr,
                                     stats.data());
    AuxStats a;
    a.counts.assign(counts.begin(), counts.end());
    a.probSum.assign(stats.begin(), stats.end() - 1);
    a.zSum = stats.back();
    return a;
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

// Top-k ties go to the lower expert index, in the choice and in the aux loss's counts; the aux
// loss's statistics are the full-softmax sums per group, the z loss's the sum of lse^2.
TEST(MoeRouting, TiesGoToTheLowerExpertAndStatisticsAreTheSoftmaxSums) {
    const std::vector<float> logits = {1.f, 1.f, 1.f, 1.f, 0.f, 2.f, 2.f, 0.f};  // 2 tokens, 4 experts
    MoeRouteOptions o;
    o.T = 2;
    o.E = 4;
    o.K = 2;
    const MoeRouting r = moeRoute(logits.data(), o);
    EXPECT_EQ(r.topi, (std::vector<int>{0, 1, 1, 2}));
    const AuxStats a = auxStats(logits, 2, 4, 2, /*groups=*/2, /*microBatch=*/2);  // seq_aux_loss
    EXPECT_EQ(a.counts, (std::vector<int>{1, 1, 0, 0, 0, 1, 1, 0}));
    EXPECT_NEAR(a.probSum[0], 0.25, 1e-7);
    const double z1 = std::log(2 + 2 * std::exp(2.0));  // logsumexp of token 1
    EXPECT_NEAR(a.probSum[4 + 1], std::exp(2.0) / (2 + 2 * std::exp(2.0)), 1e-7);
    EXPECT_NEAR(a.zSum, std::pow(1 + std::log(4.0), 2) + z1 * z1, 1e-5);
}

// ---- score functions, groups, bias, sinkhorn ------------------------------------------------

MoeRouteOptions one(int T, int E, int K) {
    MoeRouteOptions o;
    o.T = T;
    o.E = E;
    o.K = K;
    return o;
}

// Sigmoid: logits {0, 1, -1, 2} -> scores {.5, s(1), s(-1), s(2)}; the top 2 are experts 3 and 1,
// their probs s(2)/(s(2)+s(1)) and s(1)/(s(2)+s(1)), times the scaling factor 2.5.
TEST(MoeRouting, SigmoidRenormalisesTheChosenScoresAndScales) {
    const std::vector<float> l = {0.f, 1.f, -1.f, 2.f};
    MoeRouteOptions o = one(1, 4, 2);
    o.score = MoeScore::Sigmoid;
    o.scale = 2.5;
    const MoeRouting r = moeRoute(l.data(), o);
    EXPECT_EQ(r.topi, (std::vector<int>{3, 1}));
    const double s1 = sigmoid(1), s2 = sigmoid(2);
    EXPECT_NEAR(r.topp[0], 2.5 * s2 / (s1 + s2), 1e-12);
    EXPECT_NEAR(r.topp[1], 2.5 * s1 / (s1 + s2), 1e-12);
    // The aux scores: sigmoid renormalised over all four experts.
    const double S = 0.5 + s1 + sigmoid(-1) + s2;
    const AuxStats a = auxStats(l, 1, 4, 2, 1, 1, MoeScore::Sigmoid);
    EXPECT_NEAR(a.probSum[3], s2 / S, 1e-7);
    EXPECT_EQ(a.counts, (std::vector<int>{0, 1, 0, 1}));
    // sqrtsoftplus: the same choice (monotone), probs sqrt(log(1+e^x)) renormalised.
    o.score = MoeScore::SqrtSoftplus;
    o.scale = 0;
    const MoeRouting q = moeRoute(l.data(), o);
    EXPECT_EQ(q.topi, (std::vector<int>{3, 1}));
    const double q1 = std::sqrt(std::log1p(std::exp(1.0))), q2 = std::sqrt(std::log1p(std::exp(2.0)));
    EXPECT_NEAR(q.topp[0], q2 / (q1 + q2), 1e-12);
}

// Pre-softmax: the probs are the full softmax at the chosen experts, not renormalised; k = 1 keeps
// a real prob (post-softmax over one expert would be exactly 1).
TEST(MoeRouting, PreSoftmaxKeepsTheFullSoftmax) {
    const std::vector<float> l = {1.f, 2.f, 0.f, 3.f};
    MoeRouteOptions o = one(1, 4, 2);
    o.preSoftmax = true;
    const MoeRouting r = moeRoute(l.data(), o);
    const double Z = std::exp(1.0) + std::exp(2.0) + 1 + std::exp(3.0);
    EXPECT_EQ(r.topi, (std::vector<int>{3, 1}));
    EXPECT_NEAR(r.topp[0], std::exp(3.0) / Z, 1e-12);
    EXPECT_NEAR(r.topp[1], std::exp(2.0) / Z, 1e-12);
    o.K = 1;
    EXPECT_NEAR(moeRoute(l.data(), o).topp[0], std::exp(3.0) / Z, 1e-12);
    o.preSoftmax = false;
    EXPECT_EQ(moeRoute(l.data(), o).topp[0], 1.0);
}

// Group-limited: experts {0,1} and {2,3}; one group per token, scored by the sum of its top
// k/group_topk = 2 logits: group 0 = 3 + (-5) = -2, group 1 = 2 + 1.5 = 3.5, so the token goes to
// experts 2 and 3 although expert 0 has the highest logit. The aux loss's map stays the plain top-k.
TEST(MoeRouting, GroupLimitedRoutingPicksTheBestGroupsFirst) {
    const std::vector<float> l = {3.f, -5.f, 2.f, 1.5f};
    MoeRouteOptions o = one(1, 4, 2);
    EXPECT_EQ(moeRoute(l.data(), o).topi, (std::vector<int>{0, 2}));
    o.numGroups = 2;
    o.groupTopk = 1;
    const MoeRouting r = moeRoute(l.data(), o);
    EXPECT_EQ(r.topi, (std::vector<int>{2, 3}));
    EXPECT_NEAR(r.topp[0], sigmoid(0.5), 1e-12);  // softmax of {2, 1.5}
    EXPECT_EQ(r.routed, (std::vector<int>{0, 0, 1, 1}));
    EXPECT_EQ(auxStats(l, 1, 4, 2, 1, 1).counts, (std::vector<int>{1, 0, 1, 0}));
    // Four groups of one expert, two chosen: the two best experts, as without groups.
    o.numGroups = 4;
    o.groupTopk = 2;
    EXPECT_EQ(moeRoute(l.data(), o).topi, (std::vector<int>{0, 2}));
}

// Expert bias: added to the sigmoid scores for the choice only. Scores s(1) = .73, s(.9) = .71,
// s(0) + .5 = 1.0: expert 3 is chosen with prob s(0) = .5 (k = 1: not renormalised); the aux loss's
// map ignores the bias (expert 0).
TEST(MoeRouting, ExpertBiasMovesTheChoiceButNotTheProbs) {
    const std::vector<float> l = {1.f, 0.9f, 0.f, 0.f};
    const std::vector<float> bias = {0.f, 0.f, 0.f, 0.5f};
    MoeRouteOptions o = one(1, 4, 1);
    o.score = MoeScore::Sigmoid;
    EXPECT_EQ(moeRoute(l.data(), o).topi, (std::vector<int>{0}));
    o.expertBias = bias.data();
    const MoeRouting r = moeRoute(l.data(), o);
    EXPECT_EQ(r.topi, (std::vector<int>{3}));
    EXPECT_NEAR(r.topp[0], 0.5, 1e-12);
    EXPECT_EQ(auxStats(l, 1, 4, 1, 1, 1, MoeScore::Sigmoid).counts, (std::vector<int>{1, 0, 0, 0}));
    EXPECT_EQ(r.routed, (std::vector<int>{0, 0, 0, 1}));
}

// Sinkhorn, two tokens over two experts, logits {2, 0} and {3, 0}: both prefer expert 0, but the
// doubly normalised matrix is [[x, 1/2-x], [1/2-x, x]] with x/(1/2-x) = sqrt(e^2 * 1 / (1 * e^3))
// (the scaling keeps the cross ratio), x = .1888: token 0 goes to expert 1, token 1 to expert 0.
// Probs (k = 1): sigmoid of the chosen logit.
TEST(MoeRouting, SinkhornBalancesTheChoice) {
    const std::vector<float> l = {2.f, 0.f, 3.f, 0.f};
    std::vector<float> norm(4);
    moeSinkhorn(l.data(), 2, 2, norm.data());
    const double x = 0.5 * std::exp(-0.5) / (1 + std::exp(-0.5));
    EXPECT_NEAR(norm[0], x, 1e-3);
    EXPECT_NEAR(norm[1], 0.5 - x, 1e-3);
    EXPECT_NEAR(norm[2], 0.5 - x, 1e-3);
    MoeRouteOptions o = one(2, 2, 1);
    o.sinkhorn = true;
    const MoeRouting r = moeRoute(l.data(), o);
    EXPECT_EQ(r.topi, (std::vector<int>{1, 0}));
    EXPECT_NEAR(r.topp[0], 0.5, 1e-12);
    EXPECT_NEAR(r.topp[1], sigmoid(3.0), 1e-12);
    // k = 2 of 3 experts: the full softmax at the chosen ones.
    const std::vector<float> l3 = {2.f, 0.f, 1.f, 3.f, 0.f, 1.f};
    MoeRouteOptions o3 = one(2, 3, 2);
    o3.sinkhorn = true;
    const MoeRouting r3 = moeRoute(l3.data(), o3);
    std::vector<double> sm(3);
    moeSoftmax(l3.data(), 3, sm.data());
    EXPECT_NEAR(r3.topp[0], sm[size_t(r3.topi[0])], 1e-12);
}

// The sinkhorn kernel's oracle on 611 tokens (three chunks of its column sums, the last one short)
// over 12 experts against the iteration written here in double from Megatron's moe_utils.sinkhorn,
// run to the same tolerance: the same normalised matrix to 1e-4 relative; its columns sum to 1/E
// (the last expert factors make them so) and its rows to 1/T within the tolerance.
TEST(MoeRouting, SinkhornMatchesADoubleReference) {
    const int T = 611, E = 12;
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, 1.5f);
    std::vector<float> l(size_t(T) * E), out(l.size());
    for (float& v : l) v = nd(rng);
    kernels::cpu::moeSinkhorn(l.data(), T, E, out.data(), kMoeSinkhornTol);
    std::vector<double> c(l.size()), d0(size_t(T), 1.0), d1(size_t(E), 1.0), d1old = d1;
    for (size_t i = 0; i < l.size(); ++i) c[i] = std::exp(double(l[i]));
    for (double error = 1e9; error > kMoeSinkhornTol;) {
        for (int t = 0; t < T; ++t) {
            double s = 0;
            for (int e = 0; e < E; ++e) s += d1[size_t(e)] * c[size_t(t) * E + size_t(e)];
            d0[size_t(t)] = 1.0 / T / (s + 1e-8);
        }
        for (int e = 0; e < E; ++e) {
            double s = 0;
            for (int t = 0; t < T; ++t) s += d0[size_t(t)] * c[size_t(t) * E + size_t(e)];
            d1[size_t(e)] = 1.0 / E / (s + 1e-8);
        }
        error = 0;
        for (int e = 0; e < E; ++e) error += std::fabs(d1old[size_t(e)] - d1[size_t(e)]) / E;
        d1old = d1;
    }
    std::vector<double> rows(size_t(T), 0.0), cols(size_t(E), 0.0);
    for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e) {
            const size_t i = size_t(t) * E + size_t(e);
            const double want = d1[size_t(e)] * c[i] * d0[size_t(t)];
            ASSERT_NEAR(out[i], want, 1e-4 * want) << "token " << t << ", expert " << e;
            rows[size_t(t)] += out[i];
            cols[size_t(e)] += out[i];
        }
    for (int e = 0; e < E; ++e) EXPECT_NEAR(cols[size_t(e)], 1.0 / E, 1e-5 / E) << "expert " << e;
    for (int t = 0; t < T; ++t) EXPECT_NEAR(rows[size_t(t)], 1.0 / T, 1e-2 / T) << "token " << t;
}

// The probs' backward against central differences of sum_tj w_tj p_tj, for every mode (random
// logits with clear margins: the choice does not flip).
TEST(MoeRouting, ProbsBackwardMatchesFiniteDifferences) {
    const int T = 3, E = 6, K = 2;
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    std::vector<float> logits(size_t(T) * E);
    for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e) logits[size_t(t) * E + e] = float(e) * 0.7f * ((t + e) % 2 ? 1 : -1) + 0.1f * u(gen);
    std::vector<double> w(size_t(T) * K);
    for (double& x : w) x = u(gen);
    const std::vector<float> bias = {0.3f, -0.2f, 0.f, 0.1f, 0.f, -0.4f};
    struct Mode {
        const char* name;
        MoeRouteOptions o;
    };
    std::vector<Mode> modes;
    auto add = [&](const char* n, auto f) {
        MoeRouteOptions o = one(T, E, K);
        f(o);
        modes.push_back({n, o});
    };
    add("softmax", [](MoeRouteOptions&) {});
    add("softmax_scaled", [](MoeRouteOptions& o) { o.scale = 1.3; });
    add("pre_softmax_scaled", [](MoeRouteOptions& o) { o.preSoftmax = true; o.scale = 1.7; });
    add("sigmoid_bias_scaled", [&](MoeRouteOptions& o) { o.score = MoeScore::Sigmoid; o.expertBias = bias.data(); o.scale = 2.0; });
    add("sqrtsoftplus_groups", [](MoeRouteOptions& o) { o.score = MoeScore::SqrtSoftplus; o.numGroups = 3; o.groupTopk = 2; });
    add("sinkhorn", [](MoeRouteOptions& o) { o.sinkhorn = true; });
    add("sinkhorn_k1", [](MoeRouteOptions& o) { o.sinkhorn = true; o.K = 1; });
    add("sigmoid_k1", [](MoeRouteOptions& o) { o.score = MoeScore::Sigmoid; o.K = 1; });
    for (const Mode& m : modes) {
        const int k = m.o.K;
        const MoeRouting base = moeRoute(logits.data(), m.o);
        // The engine's path: the kernels' coefficients, applied to the probs' grads.
        std::vector<float> a(size_t(T) * k), b(a.size()), c(a.size()), full(size_t(T) * E, 0.f);
        kernels::cpu::moeRouterProbsCoefficients(logits.data(), base.topi.data(), T, E, m.o.topk(), m.o.sinkhorn,
                                                 a.data(), b.data(), c.data(), full.data());
        const bool isFull = moeProbsAreFullSoftmax(m.o);
        // The slots' permuted rows in reverse order; slot 1 of token 1 (k > 1) dropped: its row's
        // grad is not read, and it weighs nothing in the finite differences.
        std::vector<float> dprob(a.size()), dl(size_t(T) * E, 0.f);
        std::vector<int32_t> rowOf(a.size()), sel(base.topi.begin(), base.topi.end());
        std::vector<double> wk(w.begin(), w.begin() + std::ptrdiff_t(a.size()));
        const size_t n = a.size(), dropped = k > 1 ? size_t(k) + 1 : n;
        for (size_t j = 0; j < n; ++j) {
            rowOf[j] = j == dropped ? -1 : int32_t(n - 1 - j);
            dprob[n - 1 - j] = j == dropped ? 123.f : float(w[j]);
            if (j == dropped) wk[j] = 0;
        }
        kernels::cpu::moeRouterProbsBackward(dprob.data(), rowOf.data(), sel.data(), a.data(), b.data(), c.data(),
                                             isFull ? full.data() : nullptr, dl.data(), T, k, E);
        for (size_t i = 0; i < logits.size(); ++i) {
            double f[2];
            for (int sg = 0; sg < 2; ++sg) {
                std::vector<float> l = logits;
                l[i] += sg ? -1e-3f : 1e-3f;
                const MoeRouting r = moeRoute(l.data(), m.o);
                ASSERT_EQ(r.topi, base.topi) << m.name << ": the choice flipped";
                f[sg] = 0;
                for (int j = 0; j < T * k; ++j) f[sg] += wk[size_t(j)] * r.topp[size_t(j)];
            }
            const double h = double(logits[i] + 1e-3f) - double(logits[i] - 1e-3f);  // the float step taken
            const double numeric = (f[0] - f[1]) / h;
            EXPECT_NEAR(dl[i], numeric, 2e-3 * std::fabs(numeric) + 2e-4) << m.name << " logit " << i;
        }
    }
}

// The plan, dropless and at a capacity (moeRoutePlan, the kernels' oracle, which moeRoute uses too)
// against a brute force written here: each expert's copies in token order; over the capacity the `cap` with
// the highest probs (ties: the earlier token) or the first `cap`; padded with the earliest tokens it
// does not keep, at prob 0; expert-major. Probs on a coarse grid, so many tie.
TEST(MoeRouting, CapacityPlanMatchesABruteForce) {
    const int T = 157, K = 3, E = 7;
    std::mt19937 rng(5);
    std::vector<int32_t> topi(size_t(T) * K);
    std::vector<float> probs(size_t(T) * K);
    for (int t = 0; t < T; ++t) {
        std::vector<int> experts(static_cast<size_t>(E));
        for (int e = 0; e < E; ++e) experts[size_t(e)] = e;
        // skewed: expert 0 is chosen by most tokens
        std::shuffle(experts.begin() + 1, experts.end(), rng);
        if (rng() % 4 == 0) std::swap(experts[0], experts[size_t(1 + rng() % (E - 1))]);
        for (int j = 0; j < K; ++j) {
            topi[size_t(t) * K + j] = experts[size_t(j)];
            probs[size_t(t) * K + j] = float(rng() % 5) / 8.f;
        }
    }
    struct Row {
        int token, slot;  // slot -1: padding
    };
    for (int cap : {-1, 0, 5, 40, 70, 200})
        for (bool byProb : {true, false})
            for (bool pad : {false, true}) {
                if (cap < 0 && (pad || !byProb)) continue;  // dropless: once
                const std::string what = "cap " + std::to_string(cap) + (byProb ? " by prob" : " by position") +
                                         (pad ? ", padded" : "");
                std::vector<std::vector<Row>> want(static_cast<size_t>(E));
                std::vector<int> routed(static_cast<size_t>(E), 0);
                for (int e = 0; e < E; ++e) {
                    std::vector<Row> list;
                    for (int t = 0; t < T; ++t)
                        for (int j = 0; j < K; ++j)
                            if (topi[size_t(t) * K + j] == e) list.push_back({t, j});
                    routed[size_t(e)] = int(list.size());
                    if (cap >= 0 && int(list.size()) > cap) {
                        if (byProb)
                            std::stable_sort(list.begin(), list.end(), [&](const Row& a, const Row& b) {
                                return probs[size_t(a.token) * K + a.slot] > probs[size_t(b.token) * K + b.slot];
                            });
                        list.resize(size_t(cap));
                    }
                    std::vector<bool> in(static_cast<size_t>(T), false);
                    for (const Row& r : list) in[size_t(r.token)] = true;
                    for (int t = 0; pad && t < T && int(list.size()) < cap; ++t)
                        if (!in[size_t(t)]) list.push_back({t, -1});
                    std::sort(list.begin(), list.end(), [](const Row& a, const Row& b) { return a.token < b.token; });
                    want[size_t(e)] = list;
                }
                const size_t rowsMax = size_t(std::max(T * K, E * cap));
                std::vector<int32_t> offset(size_t(E) + 1, -9), got(size_t(E), -9), tok(rowsMax, -9),
                    start(size_t(T) + 1, -9), inv(rowsMax, -9), tokExp(rowsMax, -9), rowOf(size_t(T) * K, -9);
                std::vector<float> probT(rowsMax, -9.f);
                kernels::cpu::MoeCapacity c;
                c.cap = cap;
                c.pad = pad;
                c.byProb = byProb;
                kernels::cpu::moeRoutePlan(topi.data(), probs.data(), T, K, E, c, offset.data(), got.data(), tok.data(),
                                           start.data(), inv.data(), tokExp.data(), rowOf.data(), probT.data());
                EXPECT_EQ(std::vector<int>(got.begin(), got.end()), routed) << what;
                std::vector<int32_t> wantRowOf(size_t(T) * K, -1);
                std::vector<std::vector<int32_t>> rowsOfToken(static_cast<size_t>(T));
                int r = 0;
                for (int e = 0; e < E; ++e) {
                    ASSERT_EQ(offset[size_t(e)], r) << what << ", expert " << e;
                    for (const Row& w : want[size_t(e)]) {
                        EXPECT_EQ(tok[size_t(r)], w.token) << what << ", row " << r;
                        EXPECT_EQ(tokExp[size_t(r)], w.token * E + e) << what << ", row " << r;
                        EXPECT_EQ(probT[size_t(r)], w.slot < 0 ? 0.f : probs[size_t(w.token) * K + w.slot]) << what;
                        if (w.slot >= 0) wantRowOf[size_t(w.token) * K + w.slot] = r;
                        rowsOfToken[size_t(w.token)].push_back(r);
                        ++r;
                    }
                }
                EXPECT_EQ(offset[size_t(E)], r) << what;
                EXPECT_EQ(rowOf, wantRowOf) << what;
                int at = 0;
                for (int t = 0; t < T; ++t) {
                    EXPECT_EQ(start[size_t(t)], at) << what << ", token " << t;
                    std::vector<int32_t> rows = rowsOfToken[size_t(t)];
                    std::sort(rows.begin(), rows.end());
                    EXPECT_EQ(std::vector<int32_t>(inv.begin() + at, inv.begin() + at + int(rows.size())), rows) << what;
                    at += int(rows.size());
                }
                EXPECT_EQ(start[size_t(T)], r) << what;
            }
}

// Dropping by prob ranks a NaN prob as -inf: the expert keeps exactly `cap` copies, the finite
// ones with the highest probs (one expert, six tokens, k = 1, cap 3).
TEST(MoeRouting, CapacityDropsNaNProbsFirst) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<int32_t> topi(6, 0);
    const std::vector<float> probs = {0.5f, nan, 0.2f, nan, 0.9f, 0.1f};
    kernels::cpu::MoeCapacity c;
    c.cap = 3;
    std::vector<int32_t> offset(2), routed(1), tok(6, -1), start(7), inv(6), tokExp(6), rowOf(6);
    std::vector<float> probT(6);
    kernels::cpu::moeRoutePlan(topi.data(), probs.data(), 6, 1, 1, c, offset.data(), routed.data(), tok.data(),
                               start.data(), inv.data(), tokExp.data(), rowOf.data(), probT.data());
    EXPECT_EQ(offset[1], 3);
    EXPECT_EQ(routed[0], 6);
    EXPECT_EQ(std::vector<int32_t>(tok.begin(), tok.begin() + 3), (std::vector<int32_t>{0, 2, 4}));
    EXPECT_EQ(rowOf, (std::vector<int32_t>{0, -1, 1, -1, 2, -1}));
    // Two NaNs and cap 5: both finite-first, then the NaNs in token order fill the last place.
    c.cap = 5;
    kernels::cpu::moeRoutePlan(topi.data(), probs.data(), 6, 1, 1, c, offset.data(), routed.data(), tok.data(),
                               start.data(), inv.data(), tokExp.data(), rowOf.data(), probT.data());
    EXPECT_EQ(offset[1], 5);
    EXPECT_EQ(rowOf, (std::vector<int32_t>{0, 1, 2, -1, 3, 4}));
}

// The routing kernels' oracle (kernels/cpu/moe_route.cpp: moeRouteTopK, moeRoutePlan,
// moeRouterAuxCounts, moeRoutingMap), which route every mode in the engine (sinkhorn after the
// kernel moeSinkhorn, quantile balancing with its choice given), dropless here, against the
// host's moeRoute on the same logits: the same choice and probs, and the plan's arrays as the host
// reads them (moeRoute's plan is the same oracle, checked against a brute force above); the aux
// statistics against their definition.
// The logits are multiples of 1/4, so many tokens have tied experts (the lower index wins).
TEST(MoeRouting, KernelsRouteAsTheHost) {
    const int T = 611, E = 16;
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> q(-12, 12);
    std::vector<float> logits(size_t(T) * E), bias(static_cast<size_t>(E));
    for (float& v : logits) v = float(q(rng)) / 4.f;
    for (float& v : bias) v = float(q(rng)) / 64.f;
    std::vector<int> pre(size_t(T) * 4);  // a given choice of up to 4 distinct experts per token
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < 4; ++j) pre[size_t(t) * 4 + size_t(j)] = (t * 7 + j * 5) % E;
    struct Mode {
        const char* name;
        std::function<void(MoeRouteOptions&)> set;
    };
    const std::vector<Mode> modes = {
        {"sinkhorn k1", [](MoeRouteOptions& o) { o.sinkhorn = true; o.K = 1; }},
        {"sinkhorn k3, bf16 probs", [](MoeRouteOptions& o) { o.sinkhorn = true; }},
        {"given choice, softmax", [&](MoeRouteOptions& o) { o.precomputed = pre.data(); o.K = 4; }},
        {"given choice, pre-softmax, scale",
         [&](MoeRouteOptions& o) { o.precomputed = pre.data(); o.K = 4; o.preSoftmax = true; o.scale = 2; }},
        {"given choice, sigmoid", [&](MoeRouteOptions& o) { o.precomputed = pre.data(); o.K = 4; o.score = MoeScore::Sigmoid; }},
        {"softmax", [](MoeRouteOptions&) {}},
        {"softmax k1, fp32 probs", [](MoeRouteOptions& o) { o.K = 1; o.bf16Probs = false; }},
        {"softmax, groups, scale", [](MoeRouteOptions& o) { o.numGroups = 4; o.groupTopk = 2; o.scale = 1.5; }},
        {"pre-softmax, groups", [](MoeRouteOptions& o) { o.preSoftmax = true; o.numGroups = 8; o.groupTopk = 3; }},
        {"sigmoid, bias, groups, scale",
         [&](MoeRouteOptions& o) {
             o.score = MoeScore::Sigmoid;
             o.expertBias = bias.data();
             o.numGroups = 4;
             o.groupTopk = 2;
             o.scale = 2.5;
         }},
        {"sigmoid k1", [](MoeRouteOptions& o) { o.score = MoeScore::Sigmoid; o.K = 1; }},
        {"sqrtsoftplus k4, fp32 probs",
         [](MoeRouteOptions& o) { o.score = MoeScore::SqrtSoftplus; o.K = 4; o.bf16Probs = false; }},
    };
    for (const Mode& m : modes) {
        MoeRouteOptions o;
        o.T = T;
        o.E = E;
        o.K = 3;
        o.bf16Probs = true;
        m.set(o);
        const int K = o.K;
        const int64_t TK = int64_t(T) * K;
        const MoeRouting r = moeRoute(logits.data(), o);
        std::vector<int32_t> topi(size_t(TK), -1), offset(size_t(E) + 1, -1), tok(size_t(TK), -1),
            start(size_t(T) + 1, -1), inv(size_t(TK), -1), tokExp(size_t(TK), -1), rowOf(size_t(TK), -1);
        std::vector<float> probs(static_cast<size_t>(TK)), probT(static_cast<size_t>(TK));
        // As router.topk_permute calls them: sinkhorn's normalised logits first, a given choice as
        // an int32 [T, K] (pre's rows are 4 wide).
        std::vector<float> norm;
        if (o.sinkhorn) {
            norm.resize(size_t(T) * E);
            kernels::cpu::moeSinkhorn(logits.data(), T, E, norm.data(), kMoeSinkhornTol);
        }
        std::vector<int32_t> given;
        if (o.precomputed) given.assign(o.precomputed, o.precomputed + TK);
        kernels::cpu::moeRouteTopK(logits.data(), o.expertBias, o.sinkhorn ? norm.data() : nullptr,
                                   o.precomputed ? given.data() : nullptr, topi.data(), probs.data(), T, E, o.topk());
        std::vector<int32_t> routed(static_cast<size_t>(E), -1);
        kernels::cpu::moeRoutePlan(topi.data(), probs.data(), T, K, E, kernels::cpu::MoeCapacity{}, offset.data(),
                                   routed.data(), tok.data(), start.data(), inv.data(), tokExp.data(), rowOf.data(),
                                   probT.data());
        EXPECT_EQ(std::vector<int>(routed.begin(), routed.end()), r.routed) << m.name;
        const std::string what = m.name;
        EXPECT_EQ(std::vector<int>(topi.begin(), topi.end()), r.topi) << what;
        for (int64_t i = 0; i < TK; ++i) {
            float want = float(r.topp[size_t(i)]);
            if (o.bf16Probs) kernels::cpu::roundToBf16(&want, 1);
            ASSERT_EQ(probs[size_t(i)], want) << what << ", slot " << i;
        }
        EXPECT_EQ(std::vector<int>(offset.begin(), offset.end()), r.offset) << what;
        EXPECT_EQ(std::vector<int>(tok.begin(), tok.end()), r.tokenOf) << what;
        EXPECT_EQ(probT, r.prob) << what;
        for (int64_t i = 0; i < TK; ++i) {
            EXPECT_EQ(tokExp[size_t(i)], r.tokenOf[size_t(i)] * E + r.expertOf[size_t(i)]) << what;
            EXPECT_EQ(rowOf[size_t(r.tokenOf[size_t(i)]) * K + size_t(r.slotOf[size_t(i)])], i) << what;
        }
        for (int t = 0; t <= T; ++t) EXPECT_EQ(start[size_t(t)], t * K) << what;
        for (int t = 0; t < T; ++t) {
            std::vector<int32_t> rows;
            for (int64_t i = 0; i < TK; ++i)
                if (r.tokenOf[size_t(i)] == t) rows.push_back(int32_t(i));
            EXPECT_EQ(std::vector<int32_t>(inv.begin() + t * K, inv.begin() + (t + 1) * K), rows) << what << ", token " << t;
        }
        // The aux statistics in three groups of the sequences of a microbatch of 4, against their
        // definition written out here: per token the scores (softmax over E, or sigmoid /
        // sqrtsoftplus renormalised over E), their plain top-k (ties: the lower expert), lse^2.
        const int G = 3, mbB = 4;
        std::vector<float> counts(size_t(G) * E, -1.f), total(size_t(E), -1.f), stats(size_t(G) * E + 1, -1.f);
        kernels::cpu::moeRouterAuxCounts(logits.data(), T, E, K, G, mbB, o.score, counts.data(), total.data(),
                                         stats.data());
        std::vector<int> wantCounts(size_t(G) * E, 0);
        std::vector<double> wantSum(size_t(G) * E, 0.0);
        double wantZ = 0;
        for (int t = 0; t < T; ++t) {
            const float* l = logits.data() + size_t(t) * E;
            double mx = l[0], se = 0, S = 0;
            for (int e = 1; e < E; ++e) mx = std::max(mx, double(l[e]));
            for (int e = 0; e < E; ++e) se += std::exp(double(l[e]) - mx);
            std::vector<double> p(static_cast<size_t>(E));
            for (int e = 0; e < E; ++e) {
                const double x = l[e];
                p[size_t(e)] = o.score == MoeScore::Softmax ? std::exp(x - mx) / se
                               : o.score == MoeScore::Sigmoid ? sigmoid(x)
                                                              : std::sqrt(std::log1p(std::exp(x)));
                S += p[size_t(e)];
            }
            if (o.score != MoeScore::Softmax)
                for (double& v : p) v /= S;
            std::vector<int> order(static_cast<size_t>(E));
            for (int e = 0; e < E; ++e) order[size_t(e)] = e;
            std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return p[size_t(x)] > p[size_t(y)]; });
            const size_t g = size_t(t % mbB % G);
            for (int j = 0; j < K; ++j) ++wantCounts[g * E + size_t(order[size_t(j)])];
            for (int e = 0; e < E; ++e) wantSum[g * E + size_t(e)] += p[size_t(e)];
            const double lse = mx + std::log(se);
            wantZ += lse * lse;
        }
        double scoreTotal = 0;
        for (int e = 0; e < E; ++e) {
            int sum = 0;
            for (int g = 0; g < G; ++g) {
                const size_t i = size_t(g) * E + size_t(e);
                EXPECT_EQ(counts[i], float(wantCounts[i])) << what << ", group " << g << ", expert " << e;
                EXPECT_NEAR(stats[i], wantSum[i], 1e-6 * std::max(1.0, wantSum[i])) << what;
                sum += wantCounts[i];
                scoreTotal += stats[i];
            }
            EXPECT_EQ(total[size_t(e)], float(sum)) << what;
        }
        EXPECT_NEAR(stats[size_t(G) * E], wantZ, 1e-6 * wantZ) << what;
        EXPECT_NEAR(scoreTotal, T, 1e-3) << what << ": every token's aux scores sum to 1";
        // The allgather dispatcher's dense map of the same rows.
        const int64_t TE = int64_t(T) * E;
        std::vector<float> map(size_t(2 * TE), -1.f);
        kernels::cpu::moeRoutingMap(tokExp.data(), probT.data(), int(TK), TE, map.data());
        std::vector<float> want(size_t(2 * TE), 0.f);
        for (int64_t i = 0; i < TK; ++i) {
            want[size_t(tokExp[size_t(i)])] = 1.f;
            want[size_t(TE + tokExp[size_t(i)])] = r.prob[size_t(i)];
        }
        EXPECT_EQ(map, want) << what;
    }
}

// The kernel that gives the router's logits the aux and z losses' gradient (moeRouterAuxBackward)
// against finite differences of the loss it differentiates, sum_t w_g(t) . p(l_t) +
// zScale/2 lse(l_t)^2, with the weights built here from the counts: two groups of tokens
// (seq_aux_loss's groups, token t in group (t % microBatch) % G), each aux term on its own and all
// three with the z-loss, for every score function.
TEST(MoeRouting, AuxBackwardKernelMatchesFiniteDifferences) {
    // Three sequences in two groups (the engine uses one group or one per sequence; these differ,
    // so that a mix-up of the two shows).
    const int T = 6, E = 5, G = 2, mbB = 3;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    std::vector<float> logits(size_t(T) * E), counts(size_t(G) * E), global(static_cast<size_t>(E));
    for (float& v : logits) v = u(rng);
    for (float& v : counts) v = float(int(rng() % 7));
    for (float& v : global) v = float(int(rng() % 13));
    struct Weights {
        const char* name;
        double aux, seq, global, z;
    };
    for (const Weights& k : {Weights{"aux", 0.3, 0, 0, 0}, Weights{"seq", 0, 0.7, 0, 0},
                             Weights{"global", 0, 0, 0.2, 0}, Weights{"all with z", 0.3, -0.5, 0.2, 0.4}}) {
        // w[g][e] from its definition: the total over the groups, the group's own, the global count
        std::vector<double> w(size_t(G) * E);
        for (int g = 0; g < G; ++g)
            for (int e = 0; e < E; ++e)
                w[size_t(g) * E + e] = k.aux * (counts[size_t(e)] + counts[size_t(E + e)]) +
                                       k.seq * counts[size_t(g) * E + e] + k.global * global[size_t(e)];
        const auto loss = [&](const std::vector<float>& L, MoeScore f) {
            double sum = 0;
            std::vector<double> p(static_cast<size_t>(E));
            for (int t = 0; t < T; ++t) {
                const float* l = L.data() + size_t(t) * E;
                moeAuxScores(l, E, f, p.data());
                for (int e = 0; e < E; ++e) sum += w[size_t(t % mbB % G) * E + e] * p[size_t(e)];
                double mx = l[0], se = 0;
                for (int e = 1; e < E; ++e) mx = std::max(mx, double(l[e]));
                for (int e = 0; e < E; ++e) se += std::exp(double(l[e]) - mx);
                const double lse = mx + std::log(se);
                sum += k.z / 2 * lse * lse;
            }
            return sum;
        };
        for (MoeScore f : {MoeScore::Softmax, MoeScore::Sigmoid, MoeScore::SqrtSoftplus}) {
            std::vector<float> dl(size_t(T) * E, 99.f);  // overwritten
            kernels::cpu::moeRouterAuxBackward(logits.data(), k.aux || k.seq ? counts.data() : nullptr,
                                               k.global ? global.data() : nullptr, dl.data(), T, E, G, mbB, f, k.aux,
                                               k.seq, k.global, k.z);
            double largest = 0;
            for (size_t i = 0; i < logits.size(); ++i) {
                std::vector<float> lp = logits, lm = logits;
                lp[i] += 1e-3f;
                lm[i] -= 1e-3f;
                const double numeric = (loss(lp, f) - loss(lm, f)) / (double(lp[i]) - double(lm[i]));
                EXPECT_NEAR(dl[i], numeric, 2e-3 * std::fabs(numeric) + 1e-4)
                    << k.name << ", score " << int(f) << ", logit " << i;
                largest = std::max(largest, std::fabs(numeric));
            }
            EXPECT_GT(largest, 1e-2) << k.name << ", score " << int(f) << ": the terms must move the logits";
        }
    }
}

}  // namespace
}  // namespace ts::engine
