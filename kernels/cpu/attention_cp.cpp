// Causal attention of a context-parallel rank's query rows against the whole sequence's keys
// (REFERENCE.md §4; the all-gather variant of §4.5): the query rows carry their global
// positions, key j (global position j) is visible to query i iff j <= qPos[i]. Straightforward
// loops per (batch, head, query row): the oracle the CUDA path will be checked against too.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

void cpAttentionForward(const CpAttnDims& a, const int* qPos, const float* q, const float* k, const float* v,
                        float* probs, float* out) {
    const int r = a.nq / a.nkv;
    std::vector<float> row(static_cast<size_t>(a.skv));
    for (int bi = 0; bi < a.b; ++bi) {
        for (int hq = 0; hq < a.nq; ++hq) {
            const int hk = hq / r;
            for (int i = 0; i < a.sq; ++i) {
                const float* qi = q + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                float* P = probs + ((size_t(bi) * a.nq + hq) * a.sq + i) * a.skv;
                const int last = std::min(qPos[i], a.skv - 1);
                float mx = -INFINITY;
                for (int j = 0; j <= last; ++j) {
                    const float* kj = k + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    float s = 0;
                    for (int e = 0; e < a.d; ++e) s += qi[e] * kj[e];
                    row[size_t(j)] = s * a.scale;
                    mx = std::max(mx, row[size_t(j)]);
                }
                double sum = 0;
                for (int j = 0; j <= last; ++j) sum += (row[size_t(j)] = std::exp(row[size_t(j)] - mx));
                const float inv = float(1.0 / sum);
                for (int j = 0; j < a.skv; ++j) P[j] = j <= last ? row[size_t(j)] * inv : 0.f;
                float* o = out + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                std::fill(o, o + a.d, 0.f);
                for (int j = 0; j <= last; ++j) {
                    const float* vj = v + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    for (int e = 0; e < a.d; ++e) o[e] += P[j] * vj[e];
                }
            }
        }
    }
}

void cpAttentionBackward(const CpAttnDims& a, const int* qPos, const float* q, const float* k, const float* v,
                         const float* probs, const float* dout, float* dq, float* dk, float* dv) {
    const int r = a.nq / a.nkv;
    std::fill(dq, dq + size_t(a.sq) * a.b * a.nq * a.d, 0.f);
    std::fill(dk, dk + size_t(a.skv) * a.b * a.nkv * a.d, 0.f);
    std::fill(dv, dv + size_t(a.skv) * a.b * a.nkv * a.d, 0.f);
    std::vector<float> dP(static_cast<size_t>(a.skv));
    for (int bi = 0; bi < a.b; ++bi) {
        for (int hq = 0; hq < a.nq; ++hq) {
            const int hk = hq / r;
            for (int i = 0; i < a.sq; ++i) {
                const float* P = probs + ((size_t(bi) * a.nq + hq) * a.sq + i) * a.skv;
                const float* go = dout + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                const float* qi = q + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                float* gq = dq + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                const int last = std::min(qPos[i], a.skv - 1);
                double dot = 0;
                for (int j = 0; j <= last; ++j) {
                    const float* vj = v + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    float s = 0;
                    for (int e = 0; e < a.d; ++e) s += go[e] * vj[e];
                    dP[size_t(j)] = s;
                    dot += double(P[j]) * s;
                    float* gv = dv + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    for (int e = 0; e < a.d; ++e) gv[e] += P[j] * go[e];
                }
                for (int j = 0; j <= last; ++j) {
                    const float ds = P[j] * (dP[size_t(j)] - float(dot)) * a.scale;
                    const float* kj = k + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    float* gk = dk + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    for (int e = 0; e < a.d; ++e) {
                        gq[e] += ds * kj[e];
                        gk[e] += ds * qi[e];
                    }
                }
            }
        }
    }
}

}  // namespace ts::kernels::cpu
