// The MoE router's host-side plan (moe_routing.h).
#include "engine/model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>

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

// The k best of v[0..E) (ties: lower index), best first; with groups (gk > 0) only inside the gk
// groups whose top K/gk values sum highest (group_limited_topk; ties: lower group).
void topK(const double* v, int E, int K, int G, int gk, int* out) {
    std::vector<int> cand;
    const auto better = [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
    if (gk > 0 && G > 0) {
        const int per = E / G, kk = K / gk;
        std::vector<double> gs(static_cast<size_t>(G), 0.0);
        std::vector<int> in(static_cast<size_t>(per));
        for (int g = 0; g < G; ++g) {
            for (int i = 0; i < per; ++i) in[size_t(i)] = g * per + i;
            std::partial_sort(in.begin(), in.begin() + std::min(kk, per), in.end(), better);
            for (int i = 0; i < std::min(kk, per); ++i) gs[size_t(g)] += v[in[size_t(i)]];
        }
        std::vector<int> groups(static_cast<size_t>(G));
        for (int g = 0; g < G; ++g) groups[size_t(g)] = g;
        std::partial_sort(groups.begin(), groups.begin() + gk, groups.end(), [&](int a, int b) {
            return gs[size_t(a)] > gs[size_t(b)] || (gs[size_t(a)] == gs[size_t(b)] && a < b);
        });
        std::sort(groups.begin(), groups.begin() + gk);
        for (int j = 0; j < gk; ++j)
            for (int i = 0; i < per; ++i) cand.push_back(groups[size_t(j)] * per + i);
    } else {
        cand.resize(size_t(E));
        for (int e = 0; e < E; ++e) cand[size_t(e)] = e;
    }
    std::partial_sort(cand.begin(), cand.begin() + K, cand.end(), better);
    for (int j = 0; j < K; ++j) out[j] = cand[size_t(j)];
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
    std::vector<double> v(static_cast<size_t>(E)), sc(static_cast<size_t>(E)), aux(static_cast<size_t>(E));
    std::vector<int> sel(static_cast<size_t>(K));
    for (int t = 0; t < T; ++t) {
        const float* l = L + size_t(t) * E;
        const size_t g = size_t(t % mbB % G);
        double* p = r.topp.data() + size_t(t) * K;
        if (o.precomputed) {
            // Megatron's precomputed_indices: the probs of the score function at the given experts.
            for (int j = 0; j < K; ++j) sel[size_t(j)] = o.precomputed[size_t(t) * K + size_t(j)];
            if (o.score == MoeScore::Softmax && !o.preSoftmax) {
                std::vector<float> chosen(static_cast<size_t>(K));
                for (int j = 0; j < K; ++j) chosen[size_t(j)] = l[sel[size_t(j)]];
                moeSoftmax(chosen.data(), K, p);
            } else if (o.score == MoeScore::Softmax) {
                moeSoftmax(l, E, sc.data());
                for (int j = 0; j < K; ++j) p[j] = sc[size_t(sel[size_t(j)])];
            } else {
                double sum = 0;
                for (int j = 0; j < K; ++j) sum += (p[j] = scoreOf(o.score, l[sel[size_t(j)]]));
                if (K > 1)
                    for (int j = 0; j < K; ++j) p[j] /= sum + 1e-20;
            }
        } else if (o.sinkhorn) {
            for (int e = 0; e < E; ++e) v[size_t(e)] = norm[size_t(t) * E + size_t(e)];
            topK(v.data(), E, K, 0, 0, sel.data());
            if (K == 1) {
                p[0] = sigmoidOf(l[sel[0]]);
            } else {
                moeSoftmax(l, E, sc.data());
                for (int j = 0; j < K; ++j) p[j] = sc[size_t(sel[size_t(j)])];
            }
        } else if (o.score == MoeScore::Softmax && !o.preSoftmax) {
            for (int e = 0; e < E; ++e) v[size_t(e)] = l[e];
            topK(v.data(), E, K, o.numGroups, o.groupTopk, sel.data());
            std::vector<float> chosen(static_cast<size_t>(K));
            for (int j = 0; j < K; ++j) chosen[size_t(j)] = l[sel[size_t(j)]];
            moeSoftmax(chosen.data(), K, p);
        } else if (o.score == MoeScore::Softmax) {
            moeSoftmax(l, E, sc.data());
            topK(sc.data(), E, K, o.numGroups, o.groupTopk, sel.data());
            for (int j = 0; j < K; ++j) p[j] = sc[size_t(sel[size_t(j)])];
        } else {
            for (int e = 0; e < E; ++e) {
                sc[size_t(e)] = scoreOf(o.score, l[e]);
                v[size_t(e)] = sc[size_t(e)] + (o.expertBias ? double(o.expertBias[e]) : 0.0);
            }
            topK(v.data(), E, K, o.numGroups, o.groupTopk, sel.data());
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
            r.routed[size_t(e)]++;
        }
        // The aux loss's own routing: the plain top-k of its scores.
        moeAuxScores(l, E, o.score, aux.data());
        for (int e = 0; e < E; ++e) r.probSum[g * E + size_t(e)] += aux[size_t(e)];
        topK(aux.data(), E, K, 0, 0, sel.data());
        for (int j = 0; j < K; ++j) r.groupCounts[g * E + size_t(sel[size_t(j)])]++;
        double mx = l[0];
        for (int e = 1; e < E; ++e) mx = std::max(mx, double(l[e]));
        double se = 0;
        for (int e = 0; e < E; ++e) se += std::exp(double(l[e]) - mx);
        const double lse = mx + std::log(se);
        r.zSum += lse * lse;
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
