// The layout preview's data: which global rank sits at which (tp, cp, ep, dp, pp) coordinate, in
// Megatron-Core's rank order tp-cp-ep-dp-pp (engine/layout.h), for a config's sizes.
#pragma once

#include <vector>

#include <QString>

#include <nlohmann/json.hpp>

namespace ts::gui {

struct LayoutGrid {
    int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1, vpp = 1, world = 1;
    // cells[pp][dp][cp][tp] = global rank (ep is folded over dp for the dense layers).
    std::vector<int> ranks;  // flattened in that order
    QString error;           // why the sizes do not make a layout ("" when fine)
    int rankAt(int p, int d, int c, int t) const { return ranks[size_t(((p * dp + d) * cp + c) * tp + t)]; }
    // "TP2 × CP1 × DP2 × PP2 = 8 ranks (EP 1)"
    QString title() const;
};

// From a resolved config ({knob: value}); the world is tp·cp·pp·dp where world_size is 0.
LayoutGrid layoutGridOf(const nlohmann::json& config);

}  // namespace ts::gui
