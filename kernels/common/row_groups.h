// Groups whose rows lie together: group g's rows are [off[g], off[g + 1]) of one array (the
// experts' rows after the MoE permute; a grouped GEMM's operands). The one walk over them that the
// grouped GEMMs (CPU oracle, the dispatch's host fallback, CUDA), the block-FP8 expert GEMMs and
// the MoE layer share. Plain C++17 (the CUDA sources include it).
#pragma once

#include <type_traits>

#include "common/status.h"

namespace ts::kernels {

// f(g, first row, rows) for each group g in [g0, g1) that has rows, in order. When f returns a
// Status, the walk stops at the first error and returns it (Status::ok() when none).
template <class F>
auto forEachGroupWithRows(const int* off, int g0, int g1, F&& f) {
    using R = decltype(f(0, 0, 0));
    for (int g = g0; g < g1; ++g) {
        const int r0 = off[g], rows = off[g + 1] - r0;
        if (rows <= 0) continue;
        if constexpr (std::is_same_v<R, Status>) {
            Status s = f(g, r0, rows);
            if (!s.isOk()) return s;
        } else {
            f(g, r0, rows);
        }
    }
    if constexpr (std::is_same_v<R, Status>) return Status::ok();
}

}  // namespace ts::kernels
