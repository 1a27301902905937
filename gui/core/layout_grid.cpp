// layoutGridOf (layout_grid.h): the engine's own ParallelLayout, so the preview cannot disagree
// with what runs.
#include "gui/core/layout_grid.h"

#include <algorithm>

#include "engine/parallel/layout.h"

namespace ts::gui {

namespace {
int intKnob(const nlohmann::json& c, const char* key, int fallback) {
    return c.is_object() && c.contains(key) && c[key].is_number_integer() ? c[key].get<int>() : fallback;
}
}  // namespace

QString LayoutGrid::title() const {
    QString t = QStringLiteral("TP%1 × CP%2 × DP%3 × PP%4 = %5 ranks").arg(tp).arg(cp).arg(dp).arg(pp).arg(world);
    if (ep > 1) t += QStringLiteral(" · EP%1 over DP").arg(ep);
    if (vpp > 1) t += QStringLiteral(" · %1 virtual stages per rank").arg(vpp);
    return t;
}

LayoutGrid layoutGridOf(const nlohmann::json& config) {
    LayoutGrid g;
    engine::ParallelSizes s;
    s.tp = intKnob(config, "tensor_model_parallel_size", 1);
    s.cp = intKnob(config, "context_parallel_size", 1);
    s.pp = intKnob(config, "pipeline_model_parallel_size", 1);
    s.ep = intKnob(config, "expert_model_parallel_size", 1);
    const int world = intKnob(config, "world_size", 0);
    const int dp = intKnob(config, "data_parallel_size", 0);
    s.world = world;
    s.dp = world > 0 ? 0 : std::max(dp, 1);
    g.vpp = std::max(1, intKnob(config, "virtual_pipeline_model_parallel_size", 1));
    // The preview draws every rank: refuse sizes nobody can read as a grid.
    const long long want = (long long)(world > 0 ? world : (long long)s.tp * s.cp * s.pp * std::max(dp, 1));
    if (want > 4096) {
        g.error = QStringLiteral("%1 ranks: too many to draw (the preview draws up to 4096)").arg(want);
        return g;
    }
    auto layout = engine::ParallelLayout::create(s);
    if (!layout) {
        g.error = QString::fromStdString(layout.status().message());
        return g;
    }
    const auto& z = layout->sizes();
    g.tp = z.tp;
    g.cp = z.cp;
    g.pp = z.pp;
    g.dp = z.dp;
    g.ep = z.ep;
    g.world = z.world;
    g.ranks.assign(size_t(g.world), 0);
    for (int p = 0; p < g.pp; ++p)
        for (int d = 0; d < g.dp; ++d)
            for (int c = 0; c < g.cp; ++c)
                for (int t = 0; t < g.tp; ++t)
                    g.ranks[size_t(((p * g.dp + d) * g.cp + c) * g.tp + t)] = layout->globalRank(t, c, d, p);
    return g;
}

}  // namespace ts::gui
