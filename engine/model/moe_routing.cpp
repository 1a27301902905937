// The MoE router's host-side reference routing (moe_routing.h).
#include "engine/model/moe_routing.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/ops.h"

namespace ts::engine {

void moeQbBetaUpdate(float* beta, const float* mean, int n, double ema) {
    const float a = float(ema);
    float total = 0;
    for (int j = 0; j < n; ++j) total += (beta[j] = a * beta[j] + (1.f - a) * mean[j]);
    const float centre = total / float(n);
    for (int j = 0; j < n; ++j) beta[j] -= centre;
}

MoeRouting moeChoose(const float* L, const MoeRouteOptions& o) {
    const int T = o.T, E = o.E, K = o.K;
    MoeRouting r;
    r.topi.assign(size_t(T) * K, 0);
    r.topp.assign(size_t(T) * K, 0.0);
    r.routed.assign(size_t(E), 0);
    std::vector<float> norm;
    if (o.sinkhorn) {
        norm.resize(size_t(T) * E);
        moeSinkhorn(L, T, E, norm.data());
    }
    const kernels::cpu::MoeTopKSpec spec = o.topk();
    std::vector<int> sel(static_cast<size_t>(K));
    kernels::cpu::MoeTokenScratch w;
    for (int t = 0; t < T; ++t) {
        // one token's choice and probs (kernels/cpu/moe_route.h)
        kernels::cpu::moeRouteToken(L + size_t(t) * E, E, spec, o.expertBias,
                                    o.sinkhorn ? norm.data() + size_t(t) * E : nullptr,
                                    o.precomputed ? o.precomputed + size_t(t) * K : nullptr, sel.data(),
                                    r.topp.data() + size_t(t) * K, w);
        for (int j = 0; j < K; ++j) {
            r.topi[size_t(t) * K + size_t(j)] = sel[size_t(j)];
            ++r.routed[size_t(sel[size_t(j)])];
        }
    }
    const int64_t TK = int64_t(T) * K;
    r.probs.assign(r.topp.begin(), r.topp.end());
    if (o.bf16Probs) kernels::cpu::roundToBf16(r.probs.data(), TK);
    return r;
}

MoeRouting moeRoute(const float* L, const MoeRouteOptions& o) {
    MoeRouting r = moeChoose(L, o);
    const int T = o.T, E = o.E, K = o.K;
    // The plan (the kernels' oracle, kernels/cpu/moe_route.cpp): each expert's rows in token order,
    // at the capacity if any.
    const int64_t TK = int64_t(T) * K;
    const kernels::cpu::MoeCapacity capacity = o.capacity();
    const int64_t rowsMax = o.cap >= 0 && o.pad ? int64_t(E) * o.cap : TK;
    const size_t rowsCap = static_cast<size_t>(rowsMax), slots = static_cast<size_t>(TK);
    std::vector<int32_t> offset(size_t(E) + 1), tok(rowsCap), start(size_t(T) + 1), inv(rowsCap), tokExp(rowsCap),
        rowOf(slots);
    std::vector<float> probT(rowsCap);
    kernels::cpu::moeRoutePlan(r.topi.data(), r.probs.data(), T, K, E, capacity, offset.data(), nullptr, tok.data(),
                               start.data(), inv.data(), tokExp.data(), rowOf.data(), probT.data());
    r.offset.assign(offset.begin(), offset.end());
    const size_t rows = size_t(r.offset[size_t(E)]);
    r.tokenOf.assign(tok.begin(), tok.begin() + int64_t(rows));
    r.prob.assign(probT.begin(), probT.begin() + int64_t(rows));
    r.expertOf.resize(rows);
    for (size_t i = 0; i < rows; ++i) r.expertOf[i] = tokExp[i] % E;
    r.slotOf.assign(rows, -1);  // a padding row: -1
    for (int64_t i = 0; i < TK; ++i)
        if (rowOf[size_t(i)] >= 0) r.slotOf[size_t(rowOf[size_t(i)])] = int(i % K);
    r.dropped = int(TK - std::count_if(rowOf.begin(), rowOf.end(), [](int32_t v) { return v >= 0; }));
    return r;
}

bool moeProbsAreFullSoftmax(const MoeRouteOptions& o) {
    return (o.sinkhorn && o.K > 1) || (!o.sinkhorn && o.score == MoeScore::Softmax && o.preSoftmax);
}

}  // namespace ts::engine
