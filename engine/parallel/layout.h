// Parallel layout and process groups in Megatron-Core's rank order (parallel_state.py,
// RankGenerator with order "tp-cp-ep-dp-pp"; REFERENCE.md §5):
//   dense:  global = tp + t*(cp + c*(dp + d*pp))            (ep = 1 in the dense generator)
//   expert: global = etp + ETP*(ep + EP*(edp + EDP*pp))      (cp = 1, edp = world/(etp*ep*pp))
// Attention/dense layers use the dense groups, MoE experts the expert groups over the same
// ranks ("parallel folding").
//
// Group names (Megatron's spelling; a group's members are listed in group-rank order, the
// lower dimension of the order string varying fastest, as Megatron's generator lists them):
//   dense : tp, cp, dp, pp, dp-cp, tp-cp, tp-dp, tp-dp-cp, tp-pp (alias mp), tp-cp-pp, world,
//           and any other '-'-joined subset of {tp, cp, dp, pp};
//   pipeline ends: embd (first and last stage of each pp group; the only stage when pp == 1),
//           pos-embd (first stage);
//   expert: ep, etp, edp, etp-ep (Megatron's expert "tp-ep"), etp-ep-pp (expert "tp-ep-pp").
//   hierarchical CP (hierarchical_context_parallel_sizes [a, p], Megatron's
//           create_hierarchical_groups over each cp group): hcp-a2a = a consecutive CP ranks
//           (cp index / a equal), hcp-p2p = the p CP ranks with the same cp index mod a; a rank's
//           cp index is p2p rank * a + a2a rank (TE's a2a+p2p). Empty when the sizes are not set.
// This file does not depend on the config type: sizes are plain ints.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace ts::engine {

struct ParallelSizes {
    int tp = 1;
    int cp = 1;
    int pp = 1;
    int dp = 0;     // 0 = world / (tp*cp*pp)
    int ep = 1;
    int etp = 0;    // 0 = tp (Megatron: expert_tensor_parallel_size defaults to tp)
    int world = 0;  // 0 = tp*cp*pp*dp (dp must then be given)
    int hcpA2a = 0; // hierarchical CP: size of "hcp-a2a" (hcp-p2p: cp / hcpA2a); 0 = no such groups
};

struct RankCoords {
    int global = 0;
    // dense
    int tp = 0, cp = 0, dp = 0, pp = 0;
    // expert
    int etp = 0, ep = 0, edp = 0;
};

class ParallelLayout {
public:
    // Validates and completes the sizes (derived dp, etp, world).
    static Result<ParallelLayout> create(const ParallelSizes& sizes);

    const ParallelSizes& sizes() const { return m_sizes; }  // completed: no zeros
    int worldSize() const { return m_sizes.world; }
    int expertDataParallelSize() const { return m_edp; }

    RankCoords coordsOf(int globalRank) const;
    int globalRank(int tp, int cp, int dp, int pp) const;

    // Members (global ranks, group-rank order) of the `name` group containing `globalRank`.
    // Empty when the name is unknown or the rank is outside the world.
    std::vector<int> groupRanks(const std::string& name, int globalRank) const;
    // Every group of that kind, each rank in exactly one (empty when the name is unknown).
    std::vector<std::vector<int>> allGroups(const std::string& name) const;
    // The group names the engine uses, in display order.
    static const std::vector<std::string>& groupNames();
    static bool isKnownGroup(const std::string& name);

private:
    ParallelSizes m_sizes;
    int m_edp = 1;
};

}  // namespace ts::engine
