// The host side of the MoE router (Megatron's TopKRouter + permute; REFERENCE.md §5.2): from the
// router logits of T tokens over E experts, the top-k choice of each token, its renormalised
// probs, token dropping at a capacity, and the expert-major permutation the experts consume.
// Pure function of the logits, so the drop policies and the permutation are tested directly
// (tests/engine/model/test_moe_routing.cpp); GptModel::moeForward runs it inside its router op.
#pragma once

#include <vector>

namespace ts::engine {

struct MoeRouteOptions {
    int T = 0, E = 0, K = 1;  // tokens, experts, top-k
    // Capacity per expert in token copies (-1: dropless). Over it an expert keeps its `cap`
    // copies with the highest probs (byProb; ties: earlier token) or its first `cap` copies in
    // token order; pad fills every expert up to exactly `cap` rows with the earliest tokens not
    // routed to it, at prob 0 (moe_pad_expert_input_to_capacity).
    int cap = -1;
    bool pad = false;
    bool byProb = true;
    bool bf16Probs = false;  // probs rounded to bf16 (the router's output dtype under bf16)
    // Aux-loss groups: token t belongs to group (t % microBatch) % groups (seq_aux_loss: one per
    // sequence of the microbatch, groups == microBatch; aux_loss: groups == 1).
    int microBatch = 1, groups = 1;
};

struct MoeRouting {
    std::vector<int> topi;          // [T*K] chosen experts, token-major, best first (ties: lower index)
    std::vector<float> topv;        // [T*K] their logits
    std::vector<int> routed;        // [E] copies routed to each expert, before dropping
    std::vector<int> groupCounts;   // [groups*E] the same per aux-loss group
    std::vector<double> probSum;    // [groups*E] sum over the group's tokens of the full softmax
    double zSum = 0;                // sum over tokens of logsumexp(logits)^2
    int dropped = 0;                // copies dropped at the capacity
    // The permuted rows: expert-major, token-ascending inside an expert (Megatron's permute).
    std::vector<int> offset;        // [E+1] first row of each expert
    std::vector<int> tokenOf;       // [rows] the row's token
    std::vector<int> expertOf;      // [rows] its expert
    std::vector<int> slotOf;        // [rows] which of the token's k choices (-1: padding row)
    std::vector<float> prob;        // [rows] its routing prob (0 for padding)
    int rows() const { return offset.empty() ? 0 : offset.back(); }
};

// Softmax of v[0..n) into out, in double (the router's full and top-k softmaxes).
void moeSoftmax(const float* v, int n, double* out);

// logits: [T, E] row-major.
MoeRouting moeRoute(const float* logits, const MoeRouteOptions& o);

}  // namespace ts::engine
