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
double moeSoftmax(const float* v, int n, double* out) {
    double mx = v[0];
    for (int i = 1; i < n; ++i) mx = std::max(mx, double(v[i]));
    double s = 0;
    for (int i = 0; i < n; ++i) s += (out[i] = std::exp(double(v[i]) - mx));
    for (int i = 0; i < n; ++i) out[i] /= s;
    return mx + std::log(s);
}

namespace {

struct Copy {
    int token, slot;
    float prob;
};

}  // namespace

namespace {

double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }  // torch's threshold 20
double sigmoidOf(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The sigmoid / sqrtsoftplus score and its derivative.
double scoreOf(MoeScore f, double x) { return f == MoeScore::Sigmoid ? sigmoidOf(x) : std::sqrt(softplus(x)); }
double scoreGrad(MoeScore f, double x) {
    if (f == MoeScore::Sigmoid) {
        const double s = sigmoidOf(x);
        return s * (1 - s);
    }
    return sigmoidOf(x) / (2 * std::sqrt(softplus(x)));
}

// moeRoute's chunk of tokens (the unit of its threads and of its sums' order).
constexpr int kRouteChunk = 256;

// The indices of the k best of v[0..n) (ties: lower index), best first: each value inserted into
// the sorted k best so far. The candidates come in increasing index, so an equal value never moves
// ahead of one kept already. k <= n. best: scratch of K values (the kept ones, in out's order).
void topKRange(const double* v, int n, int K, int* out, double* best) {
    if (K <= 0) return;
    int m = 0;
    for (int i = 0; i < n; ++i) {
        const double x = v[i];
        if (m == K && !(x > best[K - 1])) continue;
        int j = m < K ? m++ : K - 1;
        for (; j > 0 && x > best[j - 1]; --j) {
            out[j] = out[j - 1];
            best[j] = best[j - 1];
        }
        out[j] = i;
        best[j] = x;
    }
}

// topK's scratch, reused from token to token.
struct TopKScratch {
    std::vector<int> inGroup, groups, groupBest, cand;
    std::vector<double> groupScore, candValue, best;
};

// The k best of v[0..E) (ties: lower index), best first; with groups (gk > 0) only inside the gk
// groups whose top K/gk values sum highest (group_limited_topk; ties: lower group).
void topK(const double* v, int E, int K, int G, int gk, int* out, TopKScratch& s) {
    s.best.resize(size_t(std::max({K, gk, 1})));
    if (!(gk > 0 && G > 0)) {
        topKRange(v, E, K, out, s.best.data());
        return;
    }
    const int per = E / G, kk = std::min(K / gk, per);
    s.groupScore.assign(size_t(G), 0.0);
    s.inGroup.resize(size_t(std::max(kk, 1)));
    for (int g = 0; g < G; ++g) {
        topKRange(v + size_t(g) * per, per, kk, s.inGroup.data(), s.best.data());
        for (int i = 0; i < kk; ++i) s.groupScore[size_t(g)] += v[size_t(g) * per + size_t(s.inGroup[size_t(i)])];
    }
    s.groups.resize(size_t(gk));
    topKRange(s.groupScore.data(), G, gk, s.groups.data(), s.best.data());
    std::sort(s.groups.begin(), s.groups.end());
    // The kept groups' experts in increasing index, then their k best.
    s.cand.clear();
    s.candValue.clear();
    for (int g : s.groups)
        for (int i = 0; i < per; ++i) {
            s.cand.push_back(g * per + i);
            s.candValue.push_back(v[size_t(g) * per + size_t(i)]);
        }
    s.groupBest.resize(size_t(K));
    topKRange(s.candValue.data(), int(s.cand.size()), K, s.groupBest.data(), s.best.data());
    for (int j = 0; j < K; ++j) out[j] = s.cand[size_t(s.groupBest[size_t(j)])];
}

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
    for (int e = 0; e < E; ++e) sum += (p[e] = scoreOf(score, l[e]));
    for (int e = 0; e < E; ++e) p[e] /= sum + 1e-20;
}

MoeRouting moeRoute(const float* L, const MoeRouteOptions& o) {
    const int T = o.T, E = o.E, K = o.K, G = std::max(1, o.groups), mbB = std::max(1, o.microBatch);
    MoeRouting r;
    r.topv.assign(size_t(T) * K, 0.f);
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
    const auto routeChunks = [&] {
        std::vector<double> v(static_cast<size_t>(E)), soft(static_cast<size_t>(E)), sc(static_cast<size_t>(E)),
            aux(static_cast<size_t>(E));
        std::vector<float> chosen(static_cast<size_t>(K));
        std::vector<int> sel(static_cast<size_t>(K));
        TopKScratch scratch;
        for (int ci = nextChunk++; ci < chunks; ci = nextChunk++) {
            ChunkSums& cs = sums[size_t(ci)];
            cs.routed.assign(size_t(E), 0);
            cs.groupCounts.assign(size_t(G) * E, 0);
            cs.probSum.assign(size_t(G) * E, 0.0);
            for (int t = ci * kRouteChunk; t < std::min(T, (ci + 1) * kRouteChunk); ++t) {
                const float* l = L + size_t(t) * E;
                const size_t g = size_t(t % mbB % G);
                double* p = r.topp.data() + size_t(t) * K;
                const double lse = moeSoftmax(l, E, soft.data());
                double scoreSum = 0;
                if (scored)
                    for (int e = 0; e < E; ++e) scoreSum += (sc[size_t(e)] = scoreOf(o.score, l[e]));
                const auto softmaxOfChosen = [&] {
                    for (int j = 0; j < K; ++j) chosen[size_t(j)] = l[sel[size_t(j)]];
                    moeSoftmax(chosen.data(), K, p);
                };
                if (o.precomputed) {
                    // Megatron's precomputed_indices: the probs of the score function at the given
                    // experts.
                    for (int j = 0; j < K; ++j) sel[size_t(j)] = o.precomputed[size_t(t) * K + size_t(j)];
                    if (o.score == MoeScore::Softmax && !o.preSoftmax) {
                        softmaxOfChosen();
                    } else if (o.score == MoeScore::Softmax) {
                        for (int j = 0; j < K; ++j) p[j] = soft[size_t(sel[size_t(j)])];
                    } else {
                        double sum = 0;
                        for (int j = 0; j < K; ++j) sum += (p[j] = sc[size_t(sel[size_t(j)])]);
                        if (K > 1)
                            for (int j = 0; j < K; ++j) p[j] /= sum + 1e-20;
                    }
                } else if (o.sinkhorn) {
                    for (int e = 0; e < E; ++e) v[size_t(e)] = norm[size_t(t) * E + size_t(e)];
                    topK(v.data(), E, K, 0, 0, sel.data(), scratch);
                    if (K == 1) {
                        p[0] = sigmoidOf(l[sel[0]]);
                    } else {
                        for (int j = 0; j < K; ++j) p[j] = soft[size_t(sel[size_t(j)])];
                    }
                } else if (o.score == MoeScore::Softmax && !o.preSoftmax) {
                    for (int e = 0; e < E; ++e) v[size_t(e)] = l[e];
                    topK(v.data(), E, K, o.numGroups, o.groupTopk, sel.data(), scratch);
                    softmaxOfChosen();
                } else if (o.score == MoeScore::Softmax) {
                    topK(soft.data(), E, K, o.numGroups, o.groupTopk, sel.data(), scratch);
                    for (int j = 0; j < K; ++j) p[j] = soft[size_t(sel[size_t(j)])];
                } else {
                    for (int e = 0; e < E; ++e)
                        v[size_t(e)] = sc[size_t(e)] + (o.expertBias ? double(o.expertBias[e]) : 0.0);
                    topK(v.data(), E, K, o.numGroups, o.groupTopk, sel.data(), scratch);
                    double sum = 0;
                    for (int j = 0; j < K; ++j) sum += (p[j] = sc[size_t(sel[size_t(j)])]);
                    if (K > 1)
                        for (int j = 0; j < K; ++j) p[j] /= sum + 1e-20;
                }
                if (!o.sinkhorn && o.scale != 0)
                    for (int j = 0; j < K; ++j) p[j] *= o.scale;
                for (int j = 0; j < K; ++j) {
                    const int e = sel[size_t(j)];
                    r.topi[size_t(t) * K + size_t(j)] = e;
                    r.topv[size_t(t) * K + size_t(j)] = l[e];
                    cs.routed[size_t(e)]++;
                }
                // The aux loss's own routing: the plain top-k of its scores (moeAuxScores).
                if (scored)
                    for (int e = 0; e < E; ++e) aux[size_t(e)] = sc[size_t(e)] / (scoreSum + 1e-20);
                const std::vector<double>& a = scored ? aux : soft;
                for (int e = 0; e < E; ++e) cs.probSum[g * E + size_t(e)] += a[size_t(e)];
                topK(a.data(), E, K, 0, 0, sel.data(), scratch);
                for (int j = 0; j < K; ++j) cs.groupCounts[g * E + size_t(sel[size_t(j)])]++;
                cs.zSum += lse * lse;
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

void moeProbsBackwardCoefficients(const float* L, const int* topi, const MoeRouteOptions& o, float* a, float* b,
                                  float* c, float* full) {
    const int T = o.T, E = o.E, K = o.K;
    const double scale = !o.sinkhorn && o.scale != 0 ? o.scale : 1.0;
    const bool fullSoftmax = moeProbsAreFullSoftmax(o);
    std::vector<double> p(static_cast<size_t>(std::max(E, K)));
    std::vector<float> chosen(static_cast<size_t>(K));
    for (int t = 0; t < T; ++t) {
        const float* l = L + size_t(t) * E;
        const int* sel = topi + size_t(t) * K;
        float* at = a + size_t(t) * K;
        float* bt = b + size_t(t) * K;
        float* ct = c + size_t(t) * K;
        if (fullSoftmax) {
            // probs = scale softmax(l)[sel]: dl_e = s_e (g_e - sum_j s_sel_j g_j), g = scale dprob
            moeSoftmax(l, E, p.data());
            for (int e = 0; e < E; ++e) full[size_t(t) * E + size_t(e)] = float(p[size_t(e)]);
            for (int j = 0; j < K; ++j) {
                at[j] = bt[j] = float(p[size_t(sel[j])] * scale);
                ct[j] = 0;
            }
        } else if (o.sinkhorn) {  // k = 1: sigmoid(l_sel)
            at[0] = float(scoreGrad(MoeScore::Sigmoid, l[sel[0]]));
            bt[0] = ct[0] = 0;
        } else if (o.score == MoeScore::Softmax) {
            // probs = scale softmax over the k chosen logits: dl_sel_j = p_j (g_j - sum_i p_i g_i)
            for (int j = 0; j < K; ++j) chosen[size_t(j)] = l[sel[j]];
            moeSoftmax(chosen.data(), K, p.data());
            for (int j = 0; j < K; ++j) {
                at[j] = bt[j] = float(p[size_t(j)] * scale);
                ct[j] = float(p[size_t(j)]);
            }
        } else {
            // probs = scale s_sel / (sum s_sel + 1e-20) for k > 1, else scale s_sel:
            // dl_sel_j = s'_j (g_j - sum_i g_i s_i / (S + 1e-20)) / (S + 1e-20)
            double S = 0;
            for (int j = 0; j < K; ++j) S += scoreOf(o.score, l[sel[j]]);
            for (int j = 0; j < K; ++j) {
                const double ds = scoreGrad(o.score, l[sel[j]]);
                if (K > 1) {
                    at[j] = float(ds / (S + 1e-20) * scale);
                    bt[j] = float(scoreOf(o.score, l[sel[j]]) / (S + 1e-20) * scale);
                    ct[j] = float(ds / (S + 1e-20));
                } else {
                    at[j] = float(ds * scale);
                    bt[j] = ct[j] = 0;
                }
            }
        }
    }
}

}  // namespace ts::engine
