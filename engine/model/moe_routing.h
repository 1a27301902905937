// The host side of the MoE router (Megatron's TopKRouter + permute; REFERENCE.md §5.2), for every
// mode: from the router logits of T tokens over E experts, the top-k choice of each token and its
// probs (kernels/cpu/moe_route.h's moeRouteToken: Megatron's topk_routing_with_score_function,
// softmax after or before the top-k, sigmoid or sqrtsoftplus scores renormalised over the k
// chosen, the scaling factor, group-limited top-k, the aux-loss-free expert bias; or the sinkhorn
// router; quantile balancing's choice), and the expert-major permutation the experts consume, at
// a capacity if any (the kernel moeRoutePlan's CPU oracle). The engine routes every mode with
// kernels on its stream (GptModel::moeForward, router.topk_permute: moeSinkhorn or
// moeQbDualUpdate where the mode asks, then moeRouteTopK and moeRoutePlan); moeRoute is the
// reference the tests check those kernels against, token by token
// (tests/engine/model/test_moe_routing.cpp). (The aux and z losses' counts and statistics are the
// kernel moeRouterAuxCounts'.)
#pragma once

#include <vector>

#include "kernels/cpu/moe_route.h"
#include "kernels/cpu/ops.h"

namespace ts::engine {

// moe_router_score_function (moe_utils.py::topk_routing_with_score_function); the kernels' enum,
// as moeRouterAuxBackward takes it.
using MoeScore = kernels::cpu::MoeScore;

struct MoeRouteOptions {
    int T = 0, E = 0, K = 1;  // tokens, experts, top-k
    MoeScore score = MoeScore::Softmax;
    // softmax only: softmax over all E before the top-k, probs not renormalised
    // (moe_router_pre_softmax); else the top-k of the logits and a softmax over the k chosen.
    bool preSoftmax = false;
    double scale = 0;  // moe_router_topk_scaling_factor: probs *= scale (0: Megatron's None)
    // Group-limited routing (group_limited_topk; moe_router_num_groups / moe_router_group_topk,
    // 0 = off): experts in numGroups equal groups, a group scored by the sum of its top
    // K/groupTopk scores, the top groupTopk groups kept, the top-k taken inside them.
    int numGroups = 0, groupTopk = 0;
    // Aux-loss-free balancing (moe_router_enable_expert_bias): [E] added to the sigmoid /
    // sqrtsoftplus scores for the choice only (null: none).
    const float* expertBias = nullptr;
    // moe_router_load_balancing_type=sinkhorn (TopKRouter.sinkhorn_load_balancing, training):
    // the choice is the top-k of sinkhorn(logits) over these T tokens; the probs are sigmoid(logit)
    // for k = 1, else the full softmax at the chosen experts (no renormalisation, no scaling).
    bool sinkhorn = false;
    // Chosen experts given by the caller ([T*K], token-major; topk_routing_with_score_function's
    // precomputed_indices, e.g. quantile balancing's): the score function's own top-k, the groups
    // and the expert bias are skipped, the probs are computed at these experts (null: none).
    const int* precomputed = nullptr;
    // Capacity per expert in token copies (-1: dropless). Over it an expert keeps its `cap`
    // copies with the highest probs (byProb; ties: earlier token) or its first `cap` copies in
    // token order; pad fills every expert up to exactly `cap` rows with the earliest tokens not
    // routed to it, at prob 0 (moe_pad_expert_input_to_capacity).
    int cap = -1;
    bool pad = false;
    bool byProb = true;
    bool bf16Probs = false;  // probs rounded to bf16 (the router's output dtype under bf16)
    // How a token chooses, as the routing kernels take it (kernels/cpu/ops.h).
    kernels::cpu::MoeTopKSpec topk() const {
        kernels::cpu::MoeTopKSpec s;
        s.K = K;
        s.score = score;
        s.preSoftmax = preSoftmax;
        s.scale = scale;
        s.numGroups = numGroups;
        s.groupTopk = groupTopk;
        s.bf16Probs = bf16Probs;
        return s;
    }
    kernels::cpu::MoeCapacity capacity() const {
        kernels::cpu::MoeCapacity c;
        c.cap = cap;
        c.pad = pad;
        c.byProb = byProb;
        return c;
    }
};

struct MoeRouting {
    std::vector<int> topi;          // [T*K] chosen experts, token-major, best first (ties: lower index)
    std::vector<double> topp;       // [T*K] their probs (before any bf16 rounding)
    std::vector<float> probs;       // [T*K] the probs as the router outputs them (bf16Probs: rounded)
    std::vector<int> routed;        // [E] copies routed to each expert, before dropping
    // moeRoute only (moeChoose stops before): the plan's, from moeRoutePlan's oracle.
    int dropped = 0;                // copies dropped at the capacity
    // The permuted rows: expert-major, token-ascending inside an expert (Megatron's permute).
    std::vector<int> offset;        // [E+1] first row of each expert
    std::vector<int> tokenOf;       // [rows] the row's token
    std::vector<int> expertOf;      // [rows] its expert
    std::vector<int> slotOf;        // [rows] which of the token's k choices (-1: padding row)
    std::vector<float> prob;        // [rows] its routing prob (0 for padding)
    int rows() const { return offset.empty() ? 0 : offset.back(); }
};

using kernels::cpu::moeAuxScores;
using kernels::cpu::moeSoftmax;

// logits: [T, E] row-major. moeChoose: each token's choice and probs (topi, topp, probs, routed);
// moeRoute: that and the plan. (Sinkhorn: the choice from moeSinkhorn of the logits.)
MoeRouting moeChoose(const float* logits, const MoeRouteOptions& o);
MoeRouting moeRoute(const float* logits, const MoeRouteOptions& o);

// The balancing modes' kernels (kernels/cpu/ops.h): Megatron's sinkhorn, quantile balancing's
// qb_dual_update.
using kernels::cpu::moeQbDualUpdate;
using kernels::cpu::moeSinkhorn;
// Megatron's sinkhorn tolerance (moe_utils.sinkhorn's tol, which TopKRouter leaves at its default).
constexpr float kMoeSinkhornTol = 1e-4f;

// The step-end update of qb_beta (finalize_model_grads' _update_router_qb_beta): beta = ema * beta +
// (1 - ema) * mean, then centred (its mean over the n experts subtracted), in fp32.
void moeQbBetaUpdate(float* beta, const float* mean, int n, double ema);

// Whether the probs are a softmax over all E experts (pre-softmax; sinkhorn with k > 1): then
// the kernel moeRouterProbsCoefficients writes `full`.
bool moeProbsAreFullSoftmax(const MoeRouteOptions& o);

}  // namespace ts::engine
