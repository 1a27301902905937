// The MoE router's host-side plan (moe_routing.h).
#include "engine/model/moe_routing.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <system_error>
#include <thread>

#include "kernels/cpu/ops.h"

namespace ts::engine {
namespace {

struct Copy {
    int token, slot;
    float prob;
};

// moeRoute's chunk of tokens (the unit of its threads and of its sums' order).
constexpr int kRouteChunk = 256;

using kernels::cpu::MoeTokenScratch;
using kernels::cpu::moeScoreOf;

}  // namespace

void moeSinkhorn(const float* cost, int T, int E, float* out, float tol) {
    std::vector<float> c(size_t(T) * E), d0(size_t(T), 1.f), d1(size_t(E), 1.f), d1old(size_t(E), 1.f);
    for (size_t i = 0; i < c.size(); ++i) c[i] = std::exp(cost[i]);
    const float eps = 1e-8f;
    float error = 1e9f;
    // Megatron iterates until converged; the cap only guards against a non-finite input.
    for (int it = 0; error > tol && it < 100000; ++it) {
        for (int t = 0; t < T; ++t) {
            float sum = 0;
            for (int e = 0; e < E; ++e) sum += d1[size_t(e)] * c[size_t(t) * E + size_t(e)];
            d0[size_t(t)] = (1.f / float(T)) * 1.f / (sum + eps);
        }
        for (int e = 0; e < E; ++e) {
            float sum = 0;
            for (int t = 0; t < T; ++t) sum += d0[size_t(t)] * c[size_t(t) * E + size_t(e)];
            d1[size_t(e)] = (1.f / float(E)) * 1.f / (sum + eps);
        }
        float diff = 0;
        for (int e = 0; e < E; ++e) diff += std::fabs(d1old[size_t(e)] - d1[size_t(e)]);
        error = diff / float(E);
        d1old = d1;
    }
    for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e) out[size_t(t) * E + size_t(e)] = d1[size_t(e)] * c[size_t(t) * E + size_t(e)] * d0[size_t(t)];
}

void moeQbDualUpdate(const float* S, int m, int n, int k, const float* beta, int* indices, float* quantile) {
    // per token: the k+1 best of scores - beta (torch.topk(k + 1, dim=1)); alpha = the (k+1)-th value
    std::vector<float> v(static_cast<size_t>(n)), alpha(static_cast<size_t>(m));
    std::vector<int> order(static_cast<size_t>(n));
    for (int t = 0; t < m; ++t) {
        const float* s = S + size_t(t) * n;
        for (int j = 0; j < n; ++j) {
            v[size_t(j)] = s[j] - beta[j];
            order[size_t(j)] = j;
        }
        std::partial_sort(order.begin(), order.begin() + k + 1, order.end(), [&](int a, int b) {
            return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b);
        });
        if (indices)
            for (int j = 0; j < k; ++j) indices[size_t(t) * k + size_t(j)] = order[size_t(j)];
        alpha[size_t(t)] = v[size_t(order[size_t(k)])];
    }
    if (!quantile) return;
    // per expert: the (m*k/n + 1)-th largest of scores[:, j] - alpha (torch.topk(c + 1, dim=0).values[-1])
    const int c = int(int64_t(m) * k / n);
    std::vector<float> col(static_cast<size_t>(m));
    for (int j = 0; j < n; ++j) {
        for (int t = 0; t < m; ++t) col[size_t(t)] = S[size_t(t) * n + size_t(j)] - alpha[size_t(t)];
        std::nth_element(col.begin(), col.begin() + c, col.end(), std::greater<float>());
        quantile[j] = col[size_t(c)];
    }
}

void moeQbBetaUpdate(float* beta, const float* mean, int n, double ema) {
    const float a = float(ema);
    float total = 0;
    for (int j = 0; j < n; ++j) total += (beta[j] = a * beta[j] + (1.f - a) * mean[j]);
    const float centre = total / float(n);
    for (int j = 0; j < n; ++j) beta[j] -= centre;
}

void moeAuxScores(const float* l, int E, MoeScore score, double* p) {
    if (score == MoeScore::Softmax) {
        moeSoftmax(l, E, p);
        return;
    }
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = moeScoreOf(score, l[e]));
    for (int e = 0; e < E; ++e) p[e] /= sum + 1e-20;
}

MoeRouting moeRoute(const float* L, const MoeRouteOptions& o) {
    const int T = o.T, E = o.E, K = o.K, G = std::max(1, o.groups), mbB = std::max(1, o.microBatch);
    MoeRouting r;
    r.topi.assign(size_t(T) * K, 0);
    r.topp.assign(size_t(T) * K, 0.0);
    r.routed.assign(size_t(E), 0);
    r.groupCounts.assign(size_t(G) * E, 0);
    r.probSum.assign(size_t(G) * E, 0.0);
    std::vector<float> norm;
    if (o.sinkhorn) {
        norm.resize(size_t(T) * E);
        moeSinkhorn(L, T, E, norm.data());
    }
    // The tokens in chunks of kRouteChunk, each chunk's sums (the routed copies, the aux loss's
    // statistics) apart and added in chunk order afterwards: the same bits whatever the number of
    // threads (o.threads) that route the chunks. Per token: the full softmax of its logits (and
    // their logsumexp) and, for sigmoid / sqrtsoftplus, its scores, each computed once and shared
    // by the choice, the probs and the aux loss's statistics.
    const bool scored = o.score != MoeScore::Softmax;
    const int chunks = (T + kRouteChunk - 1) / kRouteChunk;
    struct ChunkSums {
        std::vector<int> routed, groupCounts;
        std::vector<double> probSum;
        double zSum = 0;
    };
    std::vector<ChunkSums> sums(static_cast<size_t>(chunks));
    std::atomic<int> nextChunk{0};  // each thread takes the next chunk not taken
    const kernels::cpu::MoeTopKSpec spec = o.topk();
    // One token: its choice and probs (kernels/cpu/moe_route.h), then the aux loss's statistics
    // from the same softmax and scores.
    const auto routeToken = [&](int t, ChunkSums& cs, int* sel, double* aux, MoeTokenScratch& w) {
        const float* l = L + size_t(t) * E;
        const double lse = kernels::cpu::moeRouteToken(
            l, E, spec, o.expertBias, o.sinkhorn ? norm.data() + size_t(t) * E : nullptr,
            o.precomputed ? o.precomputed + size_t(t) * K : nullptr, sel, r.topp.data() + size_t(t) * K, w, true);
        for (int j = 0; j < K; ++j) {
            const int e = sel[j];
            r.topi[size_t(t) * K + size_t(j)] = e;
            cs.routed[size_t(e)]++;
        }
        // The aux loss's own routing: the plain top-k of its scores (moeAuxScores).
        const double* a = w.soft.data();
        if (scored) {
            double scoreSum = 0;
            for (int e = 0; e < E; ++e) scoreSum += w.sc[size_t(e)];
            for (int e = 0; e < E; ++e) aux[e] = w.sc[size_t(e)] / (scoreSum + 1e-20);
            a = aux;
        }
        const size_t g = size_t(t % mbB % G);
        for (int e = 0; e < E; ++e) cs.probSum[g * E + size_t(e)] += a[e];
        kernels::cpu::moeTopK(a, E, K, 0, 0, sel, w.topk);
        for (int j = 0; j < K; ++j) cs.groupCounts[g * E + size_t(sel[j])]++;
        cs.zSum += lse * lse;
    };
    const auto routeChunks = [&] {
        std::vector<double> aux(static_cast<size_t>(E));
        std::vector<int> sel(static_cast<size_t>(K));
        MoeTokenScratch w;
        for (int ci = nextChunk++; ci < chunks; ci = nextChunk++) {
            ChunkSums& cs = sums[size_t(ci)];
            cs.routed.assign(size_t(E), 0);
            cs.groupCounts.assign(size_t(G) * E, 0);
            cs.probSum.assign(size_t(G) * E, 0.0);
            for (int t = ci * kRouteChunk; t < std::min(T, (ci + 1) * kRouteChunk); ++t)
                routeToken(t, cs, sel.data(), aux.data(), w);
        }
    };
    // Helpers as the system gives them (the calling thread routes what they do not).
    std::vector<std::thread> pool;
    for (int i = 1; i < std::min(o.threads, chunks); ++i) {
        try {
            pool.emplace_back(routeChunks);
        } catch (const std::system_error&) {
            break;
        }
    }
    routeChunks();
    for (std::thread& th : pool) th.join();
    for (const ChunkSums& cs : sums) {
        for (int e = 0; e < E; ++e) r.routed[size_t(e)] += cs.routed[size_t(e)];
        for (size_t i = 0; i < cs.probSum.size(); ++i) {
            r.groupCounts[i] += cs.groupCounts[i];
            r.probSum[i] += cs.probSum[i];
        }
        r.zSum += cs.zSum;
    }
    // Each expert's token copies in token order, with the renormalised top-k probs.
    std::vector<std::vector<Copy>> byExpert(static_cast<size_t>(E));
    for (int t = 0; t < T; ++t) {
        for (int j = 0; j < K; ++j) {
            float p = float(r.topp[size_t(t) * K + size_t(j)]);
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

bool moeProbsAreFullSoftmax(const MoeRouteOptions& o) {
    return (o.sinkhorn && o.K > 1) || (!o.sinkhorn && o.score == MoeScore::Softmax && o.preSoftmax);
}

}  // namespace ts::engine
