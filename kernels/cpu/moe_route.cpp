// The MoE router's per-token pieces (moe_route.h) and its kernels' CPU oracle (ops.h: moeRouteTopK,
// moeRoutePlan, moeRouterAuxCounts, moeRouterProbsCoefficients, moeRoutingMap). The CUDA twins
// (kernels/cuda/moe_route.cu) follow the same per-token steps in the same order.
#include "kernels/cpu/moe_route.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ts::kernels::cpu {

double moeSoftmax(const float* v, int n, double* out) {
    double mx = v[0];
    for (int i = 1; i < n; ++i) mx = std::max(mx, double(v[i]));
    double s = 0;
    for (int i = 0; i < n; ++i) s += (out[i] = std::exp(double(v[i]) - mx));
    for (int i = 0; i < n; ++i) out[i] /= s;
    return mx + std::log(s);
}

namespace {
double sigmoidOf(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double softplusOf(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
}  // namespace

double moeScoreOf(MoeScore f, double x) { return f == MoeScore::Sigmoid ? sigmoidOf(x) : std::sqrt(softplusOf(x)); }

double moeScoreGrad(MoeScore f, double x) {
    if (f == MoeScore::Sigmoid) {
        const double s = sigmoidOf(x);
        return s * (1 - s);
    }
    return sigmoidOf(x) / (2 * std::sqrt(softplusOf(x)));
}

// Each value inserted into the sorted k best so far. The candidates come in increasing index, so
// an equal value never moves ahead of one kept already.
void moeTopKRange(const double* v, int n, int k, int* out, double* best) {
    if (k <= 0) return;
    int m = 0;
    for (int i = 0; i < n; ++i) {
        const double x = v[i];
        if (m == k && !(x > best[k - 1])) continue;
        int j = m < k ? m++ : k - 1;
        for (; j > 0 && x > best[j - 1]; --j) {
            out[j] = out[j - 1];
            best[j] = best[j - 1];
        }
        out[j] = i;
        best[j] = x;
    }
}

void moeTopK(const double* v, int E, int k, int G, int gk, int* out, MoeTopKScratch& s) {
    s.best.resize(size_t(std::max({k, gk, 1})));
    if (!(gk > 0 && G > 0)) {
        moeTopKRange(v, E, k, out, s.best.data());
        return;
    }
    const int per = E / G, kk = std::min(k / gk, per);
    s.groupScore.assign(size_t(G), 0.0);
    s.inGroup.resize(size_t(std::max(kk, 1)));
    for (int g = 0; g < G; ++g) {
        moeTopKRange(v + size_t(g) * per, per, kk, s.inGroup.data(), s.best.data());
        for (int i = 0; i < kk; ++i) s.groupScore[size_t(g)] += v[size_t(g) * per + size_t(s.inGroup[size_t(i)])];
    }
    s.groups.resize(size_t(gk));
    moeTopKRange(s.groupScore.data(), G, gk, s.groups.data(), s.best.data());
    std::sort(s.groups.begin(), s.groups.end());
    // The kept groups' experts in increasing index, then their k best.
    s.cand.clear();
    s.candValue.clear();
    for (int g : s.groups)
        for (int i = 0; i < per; ++i) {
            s.cand.push_back(g * per + i);
            s.candValue.push_back(v[size_t(g) * per + size_t(i)]);
        }
    s.groupBest.resize(size_t(k));
    moeTopKRange(s.candValue.data(), int(s.cand.size()), k, s.groupBest.data(), s.best.data());
    for (int j = 0; j < k; ++j) out[j] = s.cand[size_t(s.groupBest[size_t(j)])];
}

void moeRouteToken(const float* l, int E, const MoeTopKSpec& s, const float* bias, const float* sinkhornRow,
                   const int* precomputed, int* sel, double* p, MoeTokenScratch& w) {
    const int K = s.K;
    w.v.resize(size_t(E));
    w.soft.resize(size_t(E));
    w.sc.resize(size_t(E));
    w.chosen.resize(size_t(K));
    const bool softmax = s.score == MoeScore::Softmax;
    // The full softmax, where the probs are taken from it.
    if ((softmax && s.preSoftmax) || (sinkhornRow && K > 1)) moeSoftmax(l, E, w.soft.data());
    if (s.score != MoeScore::Softmax)
        for (int e = 0; e < E; ++e) w.sc[size_t(e)] = moeScoreOf(s.score, l[e]);
    // The probs of the chosen experts: a softmax over their logits; the full softmax at them; or
    // their scores, renormalised for K > 1.
    const auto softmaxOfChosen = [&] {
        for (int j = 0; j < K; ++j) w.chosen[size_t(j)] = l[sel[j]];
        moeSoftmax(w.chosen.data(), K, p);
    };
    const auto fullSoftmaxAtChosen = [&] {
        for (int j = 0; j < K; ++j) p[j] = w.soft[size_t(sel[j])];
    };
    const auto scoresOfChosen = [&] {
        double sum = 0;
        for (int j = 0; j < K; ++j) sum += (p[j] = w.sc[size_t(sel[j])]);
        if (K > 1)
            for (int j = 0; j < K; ++j) p[j] /= sum + 1e-20;
    };
    if (precomputed) {
        for (int j = 0; j < K; ++j) sel[j] = precomputed[j];
        if (softmax && !s.preSoftmax) softmaxOfChosen();
        else if (softmax) fullSoftmaxAtChosen();
        else scoresOfChosen();
    } else if (sinkhornRow) {
        for (int e = 0; e < E; ++e) w.v[size_t(e)] = sinkhornRow[e];
        moeTopK(w.v.data(), E, K, 0, 0, sel, w.topk);
        if (K == 1) p[0] = sigmoidOf(l[sel[0]]);
        else fullSoftmaxAtChosen();
    } else if (softmax && !s.preSoftmax) {
        for (int e = 0; e < E; ++e) w.v[size_t(e)] = l[e];
        moeTopK(w.v.data(), E, K, s.numGroups, s.groupTopk, sel, w.topk);
        softmaxOfChosen();
    } else if (softmax) {
        moeTopK(w.soft.data(), E, K, s.numGroups, s.groupTopk, sel, w.topk);
        fullSoftmaxAtChosen();
    } else {
        for (int e = 0; e < E; ++e) w.v[size_t(e)] = w.sc[size_t(e)] + (bias ? double(bias[e]) : 0.0);
        moeTopK(w.v.data(), E, K, s.numGroups, s.groupTopk, sel, w.topk);
        scoresOfChosen();
    }
    if (!sinkhornRow && s.scale != 0)
        for (int j = 0; j < K; ++j) p[j] *= s.scale;
}

double moeAuxScores(const float* l, int E, MoeScore score, double* p) {
    const double lse = moeSoftmax(l, E, p);
    if (score == MoeScore::Softmax) return lse;
    double S = 0;
    for (int e = 0; e < E; ++e) S += (p[e] = moeScoreOf(score, l[e]));
    for (int e = 0; e < E; ++e) p[e] /= S + 1e-20;
    return lse;
}

void moeRouteTopK(const float* logits, const float* bias, const float* sinkhorn, const int32_t* chosen,
                  int32_t* topi, float* probs, int T, int E, const MoeTopKSpec& spec) {
    const int K = spec.K;
    MoeTokenScratch w;
    std::vector<int> sel(size_t(std::max(K, 1)));
    std::vector<double> p(size_t(std::max(K, 1)));
    for (int t = 0; t < T; ++t) {
        moeRouteToken(logits + int64_t(t) * E, E, spec, bias, sinkhorn ? sinkhorn + int64_t(t) * E : nullptr,
                      chosen ? chosen + int64_t(t) * K : nullptr, sel.data(), p.data(), w);
        for (int j = 0; j < K; ++j) {
            float q = float(p[size_t(j)]);
            if (spec.bf16Probs) roundToBf16(&q, 1);
            topi[int64_t(t) * K + j] = sel[size_t(j)];
            probs[int64_t(t) * K + j] = q;
        }
    }
}

void moeRoutePlan(const int32_t* topi, const float* probs, int T, int K, int E, const MoeCapacity& capacity,
                  int32_t* offset, int32_t* routed, int32_t* tok, int32_t* start, int32_t* inv, int32_t* tokExp,
                  int32_t* rowOf, float* probT) {
    const int64_t TK = int64_t(T) * K;
    const int cap = capacity.cap;
    // Each expert's slots in token order (a token chooses an expert at most once).
    std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));
    for (int64_t i = 0; i < TK; ++i) slots[size_t(topi[i])].push_back(i);
    std::fill(rowOf, rowOf + TK, -1);
    std::vector<int32_t> rowsOfToken(static_cast<size_t>(T), 0);
    std::vector<int64_t> keep;
    int32_t r = 0;
    offset[0] = 0;
    for (int e = 0; e < E; ++e) {
        const std::vector<int64_t>& mine = slots[size_t(e)];
        if (routed) routed[e] = int32_t(mine.size());
        keep = mine;
        if (cap >= 0 && int64_t(keep.size()) > cap) {
            if (capacity.byProb)  // the highest probs, ties: the earlier token (a NaN prob ranks as -inf)
                std::stable_sort(keep.begin(), keep.end(), [&](int64_t x, int64_t y) {
                    return moeCapacityKey(probs[x]) > moeCapacityKey(probs[y]);
                });
            keep.resize(size_t(cap));
            std::sort(keep.begin(), keep.end());
        }
        // The expert's rows in token order: its kept copies (slot i) and, padded, the earliest
        // other tokens (slot -1, prob 0), which lie between the kept ones.
        int need = cap >= 0 && capacity.pad ? cap - int(keep.size()) : 0;
        const auto row = [&](int t, int64_t i) {
            tok[r] = t;
            tokExp[r] = t * E + e;
            probT[r] = i >= 0 ? probs[i] : 0.f;
            if (i >= 0) rowOf[i] = r;
            ++rowsOfToken[size_t(t)];
            ++r;
        };
        int next = 0;  // the first token not passed yet
        const auto padBefore = [&](int end) {
            for (; need > 0 && next < end; ++next, --need) row(next, -1);
            next = end;
        };
        for (const int64_t i : keep) {
            padBefore(int(i / K));
            row(int(i / K), i);
            next = int(i / K) + 1;
        }
        padBefore(T);
        offset[e + 1] = r;
    }
    // Each token's rows ascending.
    start[0] = 0;
    for (int t = 0; t < T; ++t) start[t + 1] = start[t] + rowsOfToken[size_t(t)];
    std::vector<int32_t> cursor(start, start + T);
    for (int32_t i = 0; i < r; ++i) inv[cursor[size_t(tok[i])]++] = i;
}

void moeRouterAuxCounts(const float* logits, int T, int E, int K, int G, int microBatch, MoeScore score,
                        float* counts, float* total, float* stats) {
    G = std::max(G, 1);
    microBatch = std::max(microBatch, 1);
    const size_t GE = size_t(G) * size_t(E);
    std::vector<int64_t> cnt(GE, 0);
    std::vector<double> probSum(GE, 0.0), aux(static_cast<size_t>(E)), best(static_cast<size_t>(std::max(K, 1)));
    std::vector<int> sel(size_t(std::max(K, 1)));
    double z = 0;
    for (int t = 0; t < T; ++t) {
        const float* l = logits + int64_t(t) * E;
        const size_t g = size_t((t % microBatch) % G);
        const double lse = moeAuxScores(l, E, score, aux.data());
        for (int e = 0; e < E; ++e) probSum[g * E + size_t(e)] += aux[size_t(e)];
        moeTopKRange(aux.data(), E, K, sel.data(), best.data());
        for (int j = 0; j < K; ++j) ++cnt[g * E + size_t(sel[size_t(j)])];
        z += lse * lse;
    }
    if (counts)
        for (size_t i = 0; i < GE; ++i) counts[i] = float(cnt[i]);
    if (total)
        for (int e = 0; e < E; ++e) {
            int64_t c = 0;
            for (int g = 0; g < G; ++g) c += cnt[size_t(g) * E + size_t(e)];
            total[e] = float(c);
        }
    if (stats) {
        for (size_t i = 0; i < GE; ++i) stats[i] = float(probSum[i]);
        stats[GE] = float(z);
    }
}

void moeRouterProbsCoefficients(const float* logits, const int32_t* topi, int T, int E, const MoeTopKSpec& spec,
                                bool sinkhorn, float* a, float* b, float* c, float* full) {
    const int K = spec.K;
    const double scale = !sinkhorn && spec.scale != 0 ? spec.scale : 1.0;
    const bool fullSoftmax = sinkhorn ? K > 1 : spec.score == MoeScore::Softmax && spec.preSoftmax;
    std::vector<double> p(size_t(std::max({E, K, 1})));
    std::vector<float> chosen(size_t(std::max(K, 1)));
    for (int t = 0; t < T; ++t) {
        const float* l = logits + int64_t(t) * E;
        const int32_t* sel = topi + int64_t(t) * K;
        float* at = a + int64_t(t) * K;
        float* bt = b + int64_t(t) * K;
        float* ct = c + int64_t(t) * K;
        if (fullSoftmax) {
            // probs = scale softmax(l)[sel]: dl_e = s_e (g_e - sum_j s_sel_j g_j), g = scale dprob
            moeSoftmax(l, E, p.data());
            for (int e = 0; e < E; ++e) full[int64_t(t) * E + e] = float(p[size_t(e)]);
            for (int j = 0; j < K; ++j) {
                at[j] = bt[j] = float(p[size_t(sel[j])] * scale);
                ct[j] = 0;
            }
        } else if (sinkhorn) {  // K = 1: sigmoid(l_sel)
            at[0] = float(moeScoreGrad(MoeScore::Sigmoid, l[sel[0]]));
            bt[0] = ct[0] = 0;
        } else if (spec.score == MoeScore::Softmax) {
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
            for (int j = 0; j < K; ++j) S += moeScoreOf(spec.score, l[sel[j]]);
            for (int j = 0; j < K; ++j) {
                const double ds = moeScoreGrad(spec.score, l[sel[j]]);
                if (K > 1) {
                    at[j] = float(ds / (S + 1e-20) * scale);
                    bt[j] = float(moeScoreOf(spec.score, l[sel[j]]) / (S + 1e-20) * scale);
                    ct[j] = float(ds / (S + 1e-20));
                } else {
                    at[j] = float(ds * scale);
                    bt[j] = ct[j] = 0;
                }
            }
        }
    }
}

void moeRoutingMap(const int32_t* tokExp, const float* probT, int rows, int64_t TE, float* map) {
    std::fill(map, map + 2 * TE, 0.f);
    for (int r = 0; r < rows; ++r) {
        map[tokExp[r]] = 1.f;
        map[TE + tokExp[r]] = probT[r];
    }
}

}  // namespace ts::kernels::cpu
