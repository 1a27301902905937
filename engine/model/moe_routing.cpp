// The MoE router's host-side plan (moe_routing.h).
#include "engine/model/moe_routing.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"

namespace ts::engine {
void moeSoftmax(const float* v, int n, double* out) {
    double mx = v[0];
    for (int i = 1; i < n; ++i) mx = std::max(mx, double(v[i]));
    double s = 0;
    for (int i = 0; i < n; ++i) s += (out[i] = std::exp(double(v[i]) - mx));
    for (int i = 0; i < n; ++i) out[i] /= s;
}

namespace {

struct Copy {
    int token, slot;
    float prob;
};

}  // namespace

MoeRouting moeRoute(const float* L, const MoeRouteOptions& o) {
    const int T = o.T, E = o.E, K = o.K, G = std::max(1, o.groups), mbB = std::max(1, o.microBatch);
    MoeRouting r;
    r.topv.assign(size_t(T) * K, 0.f);
    r.topi.assign(size_t(T) * K, 0);
    r.routed.assign(size_t(E), 0);
    r.groupCounts.assign(size_t(G) * E, 0);
    r.probSum.assign(size_t(G) * E, 0.0);
    std::vector<int> order(static_cast<size_t>(E));
    std::vector<double> full(static_cast<size_t>(E));
    for (int t = 0; t < T; ++t) {
        const float* l = L + size_t(t) * E;
        const size_t g = size_t(t % mbB % G);
        for (int e = 0; e < E; ++e) order[size_t(e)] = e;
        // top-k by logit, ties to the lower expert index
        std::partial_sort(order.begin(), order.begin() + K, order.end(),
                          [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
        for (int j = 0; j < K; ++j) {
            const int e = order[size_t(j)];
            r.topi[size_t(t) * K + size_t(j)] = e;
            r.topv[size_t(t) * K + size_t(j)] = l[e];
            r.routed[size_t(e)]++;
            r.groupCounts[g * E + size_t(e)]++;
        }
        moeSoftmax(l, E, full.data());
        for (int e = 0; e < E; ++e) r.probSum[g * E + size_t(e)] += full[size_t(e)];
        double mx = l[0];
        for (int e = 1; e < E; ++e) mx = std::max(mx, double(l[e]));
        double se = 0;
        for (int e = 0; e < E; ++e) se += std::exp(double(l[e]) - mx);
        const double lse = mx + std::log(se);
        r.zSum += lse * lse;
    }
    // Each expert's token copies in token order, with the renormalised top-k probs.
    std::vector<std::vector<Copy>> byExpert(static_cast<size_t>(E));
    std::vector<double> kp(static_cast<size_t>(K));
    for (int t = 0; t < T; ++t) {
        moeSoftmax(r.topv.data() + size_t(t) * K, K, kp.data());
        for (int j = 0; j < K; ++j) {
            float p = float(kp[size_t(j)]);
            if (o.bf16Probs) kernels::cpu::roundToBf16(&p, 1);
            byExpert[size_t(r.topi[size_t(t) * K + size_t(j)])].push_back({t, j, p});
        }
    }
    // The capacity.
    if (o.cap >= 0) {
        const auto byToken = [](const Copy& a, const Copy& b) { return a.token < b.token; };
        for (auto& list : byExpert) {
            if (int(list.size()) > o.cap) {
                if (o.byProb)
                    std::stable_sort(list.begin(), list.end(), [](const Copy& a, const Copy& b) { return a.prob > b.prob; });
                r.dropped += int(list.size()) - o.cap;
                list.resize(size_t(o.cap));
                std::sort(list.begin(), list.end(), byToken);
            }
            if (!o.pad) continue;
            std::vector<char> in(static_cast<size_t>(T), 0);
            for (const Copy& c : list) in[size_t(c.token)] = 1;
            for (int t = 0; t < T && int(list.size()) < o.cap; ++t)
                if (!in[size_t(t)]) list.push_back({t, -1, 0.f});
            std::sort(list.begin(), list.end(), byToken);
        }
    }
    // Expert-major, token-ascending permutation.
    r.offset.assign(size_t(E) + 1, 0);
    for (int e = 0; e < E; ++e) r.offset[size_t(e) + 1] = r.offset[size_t(e)] + int(byExpert[size_t(e)].size());
    const size_t rows = size_t(r.offset[size_t(E)]);
    r.tokenOf.resize(rows);
    r.expertOf.resize(rows);
    r.slotOf.resize(rows);
    r.prob.resize(rows);
    for (int e = 0; e < E; ++e) {
        size_t i = size_t(r.offset[size_t(e)]);
        for (const Copy& c : byExpert[size_t(e)]) {
            r.tokenOf[i] = c.token;
            r.expertOf[i] = e;
            r.slotOf[i] = c.slot;
            r.prob[i] = c.prob;
            ++i;
        }
    }
    return r;
}

}  // namespace ts::engine
