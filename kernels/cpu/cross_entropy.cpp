// Vocab cross entropy: the vocab-parallel staged functions (Megatron cross_entropy.py; the
// caller all-reduces between stages), an unfused single-partition reference that materializes
// the softmax, and the fused single-partition loss+grad that works in place on the logits.
// logits: [T, Vl] rows; all statistics in float, exp via the vectorized expApprox.
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

#include <algorithm>
#include <cmath>

namespace ts::kernels::cpu {

void crossEntropyRowMax(const float* logits, float* rowMax, int T, int Vl) {
    for (int t = 0; t < T; ++t)
        rowMax[t] = Vl > 0 ? detail::maxLanes(logits + static_cast<int64_t>(t) * Vl, Vl)
                           : -INFINITY;
}

void crossEntropyStats(const float* logits, const int32_t* targets, const float* rowMax,
                       float* targetLogit, float* sumExp, int T, int Vl, int vStart) {
    for (int t = 0; t < T; ++t) {
        const float* row = logits + static_cast<int64_t>(t) * Vl;
        const float m = rowMax[t];
        float acc[detail::kLanes] = {};
        int j = 0;
        for (; j + detail::kLanes <= Vl; j += detail::kLanes)
            for (int l = 0; l < detail::kLanes; ++l) acc[l] += detail::expApprox(row[j + l] - m);
        float s = 0.0f;
        for (; j < Vl; ++j) s += detail::expApprox(row[j] - m);
        for (int l = 0; l < detail::kLanes; ++l) s += acc[l];
        sumExp[t] = s;
        const int64_t local = static_cast<int64_t>(targets[t]) - vStart;
        targetLogit[t] = (local >= 0 && local < Vl) ? row[local] - m : 0.0f;
    }
}

void crossEntropyLoss(const float* targetLogit, const float* sumExp, float* loss, int T) {
    for (int t = 0; t < T; ++t) loss[t] = std::log(sumExp[t]) - targetLogit[t];
}

void crossEntropyBackward(const float* logits, const int32_t* targets, const float* rowMax,
                          const float* sumExp, const float* dloss, float* dlogits, int T, int Vl,
                          int vStart) {
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * Vl;
        const float m = rowMax[t];
        const float sc = dloss[t] / sumExp[t];
        for (int j = 0; j < Vl; ++j) dlogits[off + j] = detail::expApprox(logits[off + j] - m) * sc;
        const int64_t local = static_cast<int64_t>(targets[t]) - vStart;
        if (local >= 0 && local < Vl) dlogits[off + local] -= dloss[t];
    }
}

void crossEntropyForwardUnfused(const float* logits, const int32_t* targets, float* probs,
                                float* loss, int T, int V) {
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * V;
        const float m = detail::maxLanes(logits + off, V);
        const float s = detail::expShiftSum(logits + off, probs + off, m, V);
        const float inv = 1.0f / s;
        for (int j = 0; j < V; ++j) probs[off + j] *= inv;
        const int32_t y = targets[t];
        // -log p_target, as a framework computing nll(log(softmax)) would; a target outside
        // [0, V) has no term (callers validate ids, see countInvalidIds)
        loss[t] = (y >= 0 && y < V) ? -std::log(probs[off + y]) : std::log(s);
    }
}

void crossEntropyBackwardUnfused(const float* probs, const int32_t* targets, const float* dloss,
                                 float* dlogits, int T, int V) {
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * V;
        const float g = dloss[t];
        for (int j = 0; j < V; ++j) dlogits[off + j] = probs[off + j] * g;
        const int32_t y = targets[t];
        if (y >= 0 && y < V) dlogits[off + y] -= g;
    }
}

void crossEntropyFused(float* logitsInGradOut, const int32_t* targets, const float* dloss,
                       float* loss, int T, int V) {
    // Per row: max; exp(z - max) in place with its sum; loss; scale in place. The row (V*4
    // bytes) stays in cache across the three sweeps, so memory sees it about once.
    for (int t = 0; t < T; ++t) {
        float* row = logitsInGradOut + static_cast<int64_t>(t) * V;
        const float m = detail::maxLanes(row, V);
        const int32_t y = targets[t];
        const bool owned = y >= 0 && y < V;
        const float zt = owned ? row[y] - m : 0.0f;
        const float s = detail::expShiftSum(row, row, m, V);
        loss[t] = std::log(s) - zt;
        const float sc = dloss[t] / s;
        for (int j = 0; j < V; ++j) row[j] *= sc;
        if (owned) row[y] -= dloss[t];
    }
}

}  // namespace ts::kernels::cpu
