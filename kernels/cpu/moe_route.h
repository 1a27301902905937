// The MoE router's per-token pieces on the host, shared by the routing kernels' CPU oracle
// (kernels/cpu/moe_route.cpp: moeRouteTopK, moeRouterAuxCounts, moeRouterProbsCoefficients) and
// the host's reference routing (engine/model/moe_routing.h, moeRoute, which the tests check the
// kernels against), so both choose and weigh a token the same way.
// Everything in double; the top-k keeps the lower index on ties.
#pragma once

#include <limits>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

// Softmax of v[0..n) into out, in double; returns the logsumexp of v.
double moeSoftmax(const float* v, int n, double* out);

// The sigmoid / sqrtsoftplus score of a logit and its derivative (torch's softplus threshold 20).
double moeScoreOf(MoeScore f, double x);
double moeScoreGrad(MoeScore f, double x);

// The indices of the k best of v[0..n) (ties: lower index), best first. k <= n. best: scratch of
// k values.
void moeTopKRange(const double* v, int n, int k, int* out, double* best);

// moeTopK's scratch, reused from token to token.
struct MoeTopKScratch {
    std::vector<int> inGroup, groups, groupBest, cand;
    std::vector<double> groupScore, candValue, best;
};

// The k best of v[0..E) (ties: lower index), best first; with groups (gk > 0 and G > 0) only
// inside the gk groups whose top k/gk values sum highest (group_limited_topk; ties: lower group).
void moeTopK(const double* v, int E, int k, int G, int gk, int* out, MoeTopKScratch& s);

// One token's routing scratch.
struct MoeTokenScratch {
    std::vector<double> v, soft, sc;
    std::vector<float> chosen;
    MoeTopKScratch topk;
};

// One token's choice sel [K] and probs p [K] (before any bf16 rounding) from its logits l [E], as
// MoeTopKSpec describes (ops.h); bias [E] (null: none) is the aux-loss-free expert bias.
// sinkhornRow [E] (non-null: the sinkhorn router): the choice is its top-k, the probs sigmoid(l)
// for K = 1 or the full softmax at the chosen experts, never scaled. precomputed [K] (non-null):
// the chosen experts, the probs the score function's at them. The full softmax is computed only
// where the probs need it.
void moeRouteToken(const float* l, int E, const MoeTopKSpec& s, const float* bias, const float* sinkhornRow,
                   const int* precomputed, int* sel, double* p, MoeTokenScratch& w);

// A prob's rank key for dropping by prob: the prob, a NaN as -inf (a total order, so an expert
// keeps exactly `cap` copies whatever its probs).
inline float moeCapacityKey(float p) { return p != p ? -std::numeric_limits<float>::infinity() : p; }

// The aux loss's scores of one token (Megatron's compute_routing_scores_for_aux_loss): the softmax
// over its E logits, or its sigmoid / sqrtsoftplus scores renormalised over E, into p [E]. Returns
// logsumexp(l), the z loss's. moeRouterAuxCounts sums them; moeRouterAuxBackward differentiates them.
double moeAuxScores(const float* l, int E, MoeScore score, double* p);

}  // namespace ts::kernels::cpu
