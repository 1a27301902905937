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

// moeRoute's chunk of tokens (the unit of its threads and of its sums' order).
constexpr int kRouteChunk = 256;

using kernels::cpu::MoeTokenScratch;

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
    // The tokens in chunks of kRouteChunk, routed by o.threads threads, each chunk's counts of
    // routed copies apart and added afterwards.
    const int chunks = (T + kRouteChunk - 1) / kRouteChunk;
    std::vector<std::vector<int>> routedOf(static_cast<size_t>(chunks));
    std::atomic<int> nextChunk{0};  // each thread takes the next chunk not taken
    const kernels::cpu::MoeTopKSpec spec = o.topk();
    const auto routeChunks = [&] {
        std::vector<int> sel(static_cast<size_t>(K));
        MoeTokenScratch w;
        for (int ci = nextChunk++; ci < chunks; ci = nextChunk++) {
            std::vector<int>& routed = routedOf[size_t(ci)];
            routed.assign(size_t(E), 0);
            for (int t = ci * kRouteChunk; t < std::min(T, (ci + 1) * kRouteChunk); ++t) {
                // one token's choice and probs (kernels/cpu/moe_route.h)
                kernels::cpu::moeRouteToken(L + size_t(t) * E, E, spec, o.expertBias,
                                            o.sinkhorn ? norm.data() + size_t(t) * E : nullptr,
                                            o.precomputed ? o.precomputed + size_t(t) * K : nullptr, sel.data(),
                                            r.topp.data() + size_t(t) * K, w);
                for (int j = 0; j < K; ++j) {
                    r.topi[size_t(t) * K + size_t(j)] = sel[size_t(j)];
                    ++routed[size_t(sel[size_t(j)])];
                }
            }
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
    for (const std::vector<int>& routed : routedOf)
        for (int e = 0; e < E; ++e) r.routed[size_t(e)] += routed[size_t(e)];
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
