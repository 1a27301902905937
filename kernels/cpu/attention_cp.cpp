// Causal attention of a context-parallel rank's query rows against the whole sequence's keys
// (REFERENCE.md §4; the all-gather variant of §4.5): the query rows carry their global
// positions, key j (global position j) is visible to query i iff j <= qPos[i]. Straightforward
// loops per (batch, head, query row): the oracle the CUDA path will be checked against too.
// Attention dropout: the keep bits of a row are drawn from the global (query, key) positions
// (CpAttnDims), one dropoutMask call per run of consecutive key positions, never stored.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

namespace {

inline float keepScale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

// keep[j] = 1/(1-p) or 0 for the first n keys of query row qp (global) of head (bi, hq):
// key j has global position kPos[j] (ascending), or j when kPos is null.
void rowKeep(const CpAttnDims& a, int bi, int hq, int qp, const int* kPos, int n, std::vector<uint8_t>& bits,
             float* keep) {
    const int64_t nqTotal = a.nqTotal > 0 ? a.nqTotal : a.nq;
    const int64_t S = a.sTotal > 0 ? a.sTotal : a.skv;
    const uint64_t row = uint64_t(((int64_t(bi) * nqTotal + a.headOffset + hq) * S + qp) * S);
    if (bits.size() < size_t(n)) bits.resize(size_t(n));
    for (int j0 = 0; j0 < n;) {
        int j1 = j0 + 1;
        if (kPos)
            while (j1 < n && kPos[j1] == kPos[j1 - 1] + 1) ++j1;
        else
            j1 = n;
        const int first = kPos ? kPos[j0] : j0;
        dropoutMask(bits.data() + j0, j1 - j0, a.dropout, a.dropoutSeed, row + uint64_t(first));
        j0 = j1;
    }
    const float sc = keepScale(a.dropout);
    for (int j = 0; j < n; ++j) keep[j] = bits[size_t(j)] ? sc : 0.0f;
}

}  // namespace

void cpAttentionForward(const CpAttnDims& a, const int* qPos, const float* q, const float* k, const float* v,
                        float* probs, float* out) {
    const int r = a.nq / a.nkv;
    const bool drop = a.dropout > 0.0f;
    std::vector<float> row(static_cast<size_t>(a.skv)), keep(drop ? size_t(a.skv) : 0);
    std::vector<uint8_t> bits;
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
                if (drop) rowKeep(a, bi, hq, qPos[i], nullptr, last + 1, bits, keep.data());
                for (int j = 0; j <= last; ++j) {
                    const float pj = drop ? P[j] * keep[size_t(j)] : P[j];  // dropout(P)
                    const float* vj = v + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    for (int e = 0; e < a.d; ++e) o[e] += pj * vj[e];
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
    const bool drop = a.dropout > 0.0f;
    std::vector<float> dP(static_cast<size_t>(a.skv)), keep(drop ? size_t(a.skv) : 0);
    std::vector<uint8_t> bits;
    for (int bi = 0; bi < a.b; ++bi) {
        for (int hq = 0; hq < a.nq; ++hq) {
            const int hk = hq / r;
            for (int i = 0; i < a.sq; ++i) {
                const float* P = probs + ((size_t(bi) * a.nq + hq) * a.sq + i) * a.skv;
                const float* go = dout + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                const float* qi = q + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                float* gq = dq + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                const int last = std::min(qPos[i], a.skv - 1);
                if (drop) rowKeep(a, bi, hq, qPos[i], nullptr, last + 1, bits, keep.data());
                double dot = 0;
                for (int j = 0; j <= last; ++j) {
                    const float* vj = v + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    float s = 0;
                    for (int e = 0; e < a.d; ++e) s += go[e] * vj[e];
                    // dropout backward: dP = M * d(dropout(P)), dV takes dropout(P)
                    const float m = drop ? keep[size_t(j)] : 1.0f;
                    s *= m;
                    dP[size_t(j)] = s;
                    dot += double(P[j]) * s;
                    const float pj = P[j] * m;
                    float* gv = dv + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    for (int e = 0; e < a.d; ++e) gv[e] += pj * go[e];
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

namespace ts::kernels::cpu {

// Ring attention blocks (see ops.h). Same loop order as above; the scores of one row against
// the block live in `row` only. A block's positions ascend (chunk r, then chunk 2c-1-r), so the
// keys visible to a query are a prefix of the block: [0, visibleKeys).
namespace {
int visibleKeys(const int* kPos, int skv, int qPos) {
    return int(std::upper_bound(kPos, kPos + skv, qPos) - kPos);
}
}  // namespace

void cpRingAttentionForward(const CpAttnDims& a, const int* qPos, const int* kPos, const float* q, const float* k,
                            const float* v, float* out, float* lse, bool first) {
    const int r = a.nq / a.nkv;
    const bool drop = a.dropout > 0.0f;
    std::vector<float> row(static_cast<size_t>(a.skv)), acc(static_cast<size_t>(a.d)),
        keep(drop ? size_t(a.skv) : 0);
    std::vector<uint8_t> bits;
    for (int bi = 0; bi < a.b; ++bi) {
        for (int hq = 0; hq < a.nq; ++hq) {
            const int hk = hq / r;
            for (int i = 0; i < a.sq; ++i) {
                const float* qi = q + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                float* o = out + ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                float& L = lse[(size_t(bi) * a.nq + hq) * a.sq + i];
                if (first) {
                    std::fill(o, o + a.d, 0.f);
                    L = -INFINITY;
                }
                const int nv = visibleKeys(kPos, a.skv, qPos[i]);
                if (nv == 0) continue;  // no key of this block is visible to the row
                float mx = -INFINITY;
                for (int j = 0; j < nv; ++j) {
                    const float* kj = k + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    float s = 0;
                    for (int e = 0; e < a.d; ++e) s += qi[e] * kj[e];
                    row[size_t(j)] = s * a.scale;
                    mx = std::max(mx, row[size_t(j)]);
                }
                double sum = 0;
                std::fill(acc.begin(), acc.end(), 0.f);
                if (drop) rowKeep(a, bi, hq, qPos[i], kPos, nv, bits, keep.data());
                for (int j = 0; j < nv; ++j) {
                    const float p = std::exp(row[size_t(j)] - mx);
                    sum += p;  // the normaliser stays undropped
                    const float pd = drop ? p * keep[size_t(j)] : p;
                    const float* vj = v + ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    for (int e = 0; e < a.d; ++e) acc[size_t(e)] += pd * vj[e];
                }
                const double lb = double(mx) + std::log(sum);
                if (L == -INFINITY) {
                    for (int e = 0; e < a.d; ++e) o[e] = float(acc[size_t(e)] / sum);
                    L = float(lb);
                    continue;
                }
                const double m = std::max(double(L), lb);
                const double lNew = m + std::log(std::exp(double(L) - m) + std::exp(lb - m));
                const double wOld = std::exp(double(L) - lNew), wBlk = std::exp(lb - lNew) / sum;
                for (int e = 0; e < a.d; ++e) o[e] = float(o[e] * wOld + acc[size_t(e)] * wBlk);
                L = float(lNew);
            }
        }
    }
}

void cpRingAttentionDelta(const CpAttnDims& a, const float* out, const float* dout, float* delta) {
    for (int bi = 0; bi < a.b; ++bi)
        for (int hq = 0; hq < a.nq; ++hq)
            for (int i = 0; i < a.sq; ++i) {
                const size_t off = ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                double s = 0;
                for (int e = 0; e < a.d; ++e) s += double(out[off + e]) * dout[off + e];
                delta[(size_t(bi) * a.nq + hq) * a.sq + i] = float(s);
            }
}

void cpRingAttentionBackward(const CpAttnDims& a, const int* qPos, const int* kPos, const float* q, const float* k,
                             const float* v, const float* lse, const float* delta, const float* dout, float* dq,
                             float* dk, float* dv) {
    const int r = a.nq / a.nkv;
    const bool drop = a.dropout > 0.0f;
    std::vector<float> P(static_cast<size_t>(a.skv)), dS(static_cast<size_t>(a.skv)),
        keep(drop ? size_t(a.skv) : 0);
    std::vector<uint8_t> bits;
    std::fill(dk, dk + size_t(a.skv) * a.b * a.nkv * a.d, 0.f);
    std::fill(dv, dv + size_t(a.skv) * a.b * a.nkv * a.d, 0.f);
    for (int bi = 0; bi < a.b; ++bi) {
        for (int hq = 0; hq < a.nq; ++hq) {
            const int hk = hq / r;
            for (int i = 0; i < a.sq; ++i) {
                const size_t off = ((size_t(i) * a.b + bi) * a.nq + hq) * a.d;
                const float* qi = q + off;
                const float* go = dout + off;
                float* gq = dq + off;
                const size_t si = (size_t(bi) * a.nq + hq) * a.sq + i;
                const float L = lse[si], D = delta[si];
                if (L == -INFINITY) continue;
                const int nv = visibleKeys(kPos, a.skv, qPos[i]);
                if (drop) rowKeep(a, bi, hq, qPos[i], kPos, nv, bits, keep.data());
                // Pass 1: P and dS of the row's visible keys; pass 2: the three updates, each a
                // plain axpy over the head dim (separate loops vectorize; one fused loop did not).
                for (int j = 0; j < nv; ++j) {
                    const size_t kvOff = ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    const float* kj = k + kvOff;
                    const float* vj = v + kvOff;
                    float s = 0, dp = 0;
                    for (int e = 0; e < a.d; ++e) s += qi[e] * kj[e];
                    for (int e = 0; e < a.d; ++e) dp += go[e] * vj[e];
                    const float p = std::exp(s * a.scale - L);
                    const float m = drop ? keep[size_t(j)] : 1.0f;
                    P[size_t(j)] = p * m;  // what multiplied V: dropout(P)
                    dS[size_t(j)] = p * (dp * m - D) * a.scale;
                }
                for (int j = 0; j < nv; ++j) {
                    const size_t kvOff = ((size_t(j) * a.b + bi) * a.nkv + hk) * a.d;
                    const float p = P[size_t(j)], ds = dS[size_t(j)];
                    const float* kj = k + kvOff;
                    float* gv = dv + kvOff;
                    float* gk = dk + kvOff;
                    for (int e = 0; e < a.d; ++e) gv[e] += p * go[e];
                    for (int e = 0; e < a.d; ++e) gq[e] += ds * kj[e];
                    for (int e = 0; e < a.d; ++e) gk[e] += ds * qi[e];
                }
            }
        }
    }
}

}  // namespace ts::kernels::cpu
