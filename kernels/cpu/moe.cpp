// MoE row movement and the experts' elementwise parts (ops.h): the CPU oracle. Sums run in
// index order, in double where the comment in ops.h says so; the CUDA kernels (kernels/cuda/
// moe.cu) keep the same order per output element.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/moe_route.h"
#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

void gatherRows(const float* src, const int32_t* idx, float* dst, int rows, int cols) {
    const size_t rowBytes = size_t(cols) * sizeof(float);
    for (int i = 0; i < rows; ++i) {
        float* d = dst + int64_t(i) * cols;
        if (idx[i] < 0) std::memset(d, 0, rowBytes);
        else std::memcpy(d, src + int64_t(idx[i]) * cols, rowBytes);
    }
}

void gatherSumRows(const float* src, const int32_t* start, const int32_t* idx, float* dst, int outRows,
                   int cols) {
    for (int t = 0; t < outRows; ++t) {
        float* d = dst + int64_t(t) * cols;
        for (int j = start[t]; j < start[t + 1]; ++j) {
            const float* s = src + int64_t(idx[j]) * cols;
            for (int c = 0; c < cols; ++c) d[c] += s[c];
        }
    }
}

void scaleRows(const float* x, int64_t xRowStride, const float* s, float* y, int rows, int cols) {
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + int64_t(r) * xRowStride;
        float* yr = y + int64_t(r) * cols;
        const float p = s[r];
        for (int c = 0; c < cols; ++c) yr[c] = xr[c] * p;
    }
}

void moeProbGrad(const float* da, const float* act, const float* prob, const float* dy, const float* b2,
                 float* dact, float* dprob, int rows, int F, int h) {
    for (int r = 0; r < rows; ++r) {
        const float* d = da + int64_t(r) * F;
        const float* a = act + int64_t(r) * F;
        float* o = dact + int64_t(r) * F;
        const float p = prob[r];
        double dp = 0;
        for (int f = 0; f < F; ++f) {
            dp += double(d[f]) * a[f];
            o[f] = d[f] * p;
        }
        if (b2) {
            const float* g = dy + int64_t(r) * h;
            double bias = 0;
            for (int i = 0; i < h; ++i) bias += double(g[i]) * b2[i];
            dp += bias;
        }
        dprob[r] = float(dp);
    }
}

void weightedColumnSum(const float* dy, const float* w, float* db, int rows, int cols) {
    std::vector<double> acc(size_t(cols), 0.0);
    for (int r = 0; r < rows; ++r) {
        const float* d = dy + int64_t(r) * cols;
        for (int c = 0; c < cols; ++c) acc[size_t(c)] += double(d[c]) * w[r];
    }
    for (int c = 0; c < cols; ++c) db[c] += float(acc[size_t(c)]);
}

void sigmoidGateForward(const float* x, const float* w, const float* y, float* gate, float* out, int T, int h,
                        bool bf16Gate) {
    for (int t = 0; t < T; ++t) {
        const float* xt = x + int64_t(t) * h;
        double z = 0;
        for (int i = 0; i < h; ++i) z += double(xt[i]) * double(w[i]);
        float g = float(1.0 / (1.0 + std::exp(-z)));
        if (bf16Gate) roundToBf16(&g, 1);
        gate[t] = g;
        const float* yt = y + int64_t(t) * h;
        float* o = out + int64_t(t) * h;
        for (int i = 0; i < h; ++i) o[i] = yt[i] * g;
    }
}

void sigmoidGateBackward(const float* dout, const float* y, const float* x, const float* gate, const float* w,
                         float* dy, float* dx, float* dw, int T, int h) {
    std::vector<double> gw(size_t(h), 0.0);
    for (int t = 0; t < T; ++t) {
        const float* d = dout + int64_t(t) * h;
        const float* yt = y + int64_t(t) * h;
        const float* xt = x + int64_t(t) * h;
        const float g = gate[t];
        double dg = 0;
        for (int i = 0; i < h; ++i) dg += double(d[i]) * double(yt[i]);
        const double dz = dg * double(g) * (1.0 - double(g));
        float* o = dy + int64_t(t) * h;
        float* dxt = dx + int64_t(t) * h;
        for (int i = 0; i < h; ++i) {
            o[i] = d[i] * g;
            dxt[i] = float(dz * double(w[i]));
            gw[size_t(i)] += dz * double(xt[i]);
        }
    }
    for (int i = 0; i < h; ++i) dw[i] += float(gw[size_t(i)]);
}

void moeRouterProbsBackward(const float* dprob, const int32_t* rowOf, const int32_t* sel, const float* a,
                            const float* b, const float* c, const float* full, float* dl, int T, int K, int E) {
    std::vector<double> g(size_t(std::max(K, 0)));
    for (int t = 0; t < T; ++t) {
        const int64_t tk = int64_t(t) * K;
        double dot = 0;
        for (int j = 0; j < K; ++j) {
            const int32_t r = rowOf[tk + j];
            g[size_t(j)] = r < 0 ? 0.0 : double(dprob[r]);
            dot += double(b[tk + j]) * g[size_t(j)];
        }
        float* d = dl + int64_t(t) * E;
        const float* f = full ? full + int64_t(t) * E : nullptr;
        for (int e = 0; e < E; ++e) {
            double v = d[e];
            if (f) v -= double(f[e]) * dot;
            for (int j = 0; j < K; ++j)
                if (sel[tk + j] == e) v += double(a[tk + j]) * g[size_t(j)] - double(c[tk + j]) * dot;
            d[e] = float(v);
        }
    }
}

void moeRouterAuxBackward(const float* logits, const float* counts, const float* global, float* dl, int T, int E,
                          int G, int microBatch, MoeScore score, double wAux, double wSeq, double wGlobal,
                          double zScale) {
    G = std::max(G, 1);
    microBatch = std::max(microBatch, 1);
    // Each group's weights: the same for all of its tokens.
    std::vector<double> w(size_t(G) * size_t(std::max(E, 0)), 0.0);
    for (int e = 0; e < E; ++e) {
        double total = 0;
        if (counts)
            for (int g = 0; g < G; ++g) total += double(counts[int64_t(g) * E + e]);
        for (int g = 0; g < G; ++g) {
            double v = wAux * total;
            if (counts) v += wSeq * double(counts[int64_t(g) * E + e]);
            if (global) v += wGlobal * double(global[e]);
            w[size_t(g) * E + size_t(e)] = v;
        }
    }
    std::vector<double> soft(size_t(std::max(E, 0))), p(size_t(std::max(E, 0)));
    for (int t = 0; t < T; ++t) {
        const float* l = logits + int64_t(t) * E;
        const double* wt = w.data() + size_t((t % microBatch) % G) * E;
        double mx = E > 0 ? double(l[0]) : 0.0;
        for (int e = 1; e < E; ++e) mx = std::max(mx, double(l[e]));
        double se = 0;
        for (int e = 0; e < E; ++e) se += (soft[size_t(e)] = std::exp(double(l[e]) - mx));
        for (int e = 0; e < E; ++e) soft[size_t(e)] /= se;
        const double lse = mx + std::log(se);
        double S = 0;
        if (score == MoeScore::Softmax) {
            for (int e = 0; e < E; ++e) p[size_t(e)] = soft[size_t(e)];
        } else {
            for (int e = 0; e < E; ++e) S += (p[size_t(e)] = moeScoreOf(score, l[e]));
            for (int e = 0; e < E; ++e) p[size_t(e)] /= S + 1e-20;
        }
        double dot = 0;
        for (int e = 0; e < E; ++e) dot += wt[e] * p[size_t(e)];
        float* d = dl + int64_t(t) * E;
        for (int e = 0; e < E; ++e) {
            double v;
            if (score == MoeScore::Softmax) {
                v = p[size_t(e)] * (wt[e] - dot);
            } else {
                v = (wt[e] - dot) / (S + 1e-20) * moeScoreGrad(score, l[e]);
            }
            d[e] = float(v + zScale * lse * soft[size_t(e)]);
        }
    }
}

}  // namespace ts::kernels::cpu
