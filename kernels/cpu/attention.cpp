// Causal core attention with GQA: scores = scale * Q K^T, causal softmax, out = P V, and the
// backward through it. All matmuls are OpenBLAS GEMMs on strided views of the [s, b, heads, d]
// activations (no transposes or copies): for batch bi and head h, Q_bh is an [s, d] matrix
// starting at q + (bi*nq + h)*d with leading dim b*nq*d.
//
// Causality: the fused path only computes the lower block-triangle (rows in blocks of kBlock,
// block i needs key columns [0, end of block i)), which roughly halves the GEMM work at long
// sequences; the unfused path is the naive one (full square scores, then scale, mask, softmax
// as separate passes; its backward full-square too) used to check the fused one and to
// measure what the fusion buys.
//
// Attention dropout (AttnDims::dropout > 0): probs keeps the undropped softmax P; .V uses
// dropout(P). The mask is never stored: a pure function of (seed, element number), it is
// regenerated row by row in backward (and by selective recompute), which costs one hash per
// two elements instead of s*s bytes per head of activation memory.
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace ts::kernels::cpu {

namespace {

constexpr int kBlock = 64;  // rows per causal block: small enough to skip most of the upper half

struct Views {
    int64_t ldq, ldk;  // leading dims of the per-head [s, d] views of q/out and k/v
    const AttnDims& dm;
    explicit Views(const AttnDims& d)
        : ldq(static_cast<int64_t>(d.b) * d.nq * d.d),
          ldk(static_cast<int64_t>(d.b) * d.nkv * d.d),
          dm(d) {}
    int64_t qOff(int bi, int h) const { return (static_cast<int64_t>(bi) * dm.nq + h) * dm.d; }
    int64_t kOff(int bi, int g) const { return (static_cast<int64_t>(bi) * dm.nkv + g) * dm.d; }
    float* probs(float* p, int bi, int h) const {
        return p + (static_cast<int64_t>(bi) * dm.nq + h) * dm.s * dm.s;
    }
    const float* probs(const float* p, int bi, int h) const {
        return p + (static_cast<int64_t>(bi) * dm.nq + h) * dm.s * dm.s;
    }
};

// Row r of raw scores (already scaled) in columns [0, end): softmax over columns [0, r],
// zeros in (r, end). Columns from end on must already be zero (the caller zeroed the block).
inline void causalSoftmaxRow(float* row, int r, int end) {
    const int n = r + 1;
    const float m = detail::maxLanes(row, n);
    const float sum = detail::expShiftSum(row, row, m, n);
    const float inv = 1.0f / sum;
    for (int j = 0; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + end, 0.0f);
}

// C[0:rows, 0:cols] = 0 (row stride ldc). The fused path zeroes GEMM outputs itself and calls
// the GEMM with beta = 1: OpenBLAS's beta = 0 handling is a separate, slow pass over C
// (sgemm_beta, ~15% of core-attention time on these small strided blocks), while zeroing a
// row that is about to be written is a cheap memset.
inline void zeroRows(float* C, int rows, int cols, int64_t ldc) {
    for (int i = 0; i < rows; ++i) std::memset(C + i * ldc, 0, sizeof(float) * cols);
}

inline float keepScale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

// First dropout-mask element of head (bi, h): masks are numbered over the full [b, nqTotal,
// s, s] probabilities (see AttnDims), row r of the head starts at + r*s.
inline uint64_t maskBase(const AttnDims& dm, int bi, int h) {
    const int64_t nqTotal = dm.nqTotal > 0 ? dm.nqTotal : dm.nq;
    return static_cast<uint64_t>(((bi * nqTotal + dm.headOffset + h) * dm.s) *
                                 static_cast<int64_t>(dm.s));
}

// Per-thread scratch that only grows (kernels run on rank/stream threads).
float* threadScratch(size_t n) {
    thread_local std::vector<float> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}
uint8_t* threadMaskRow(size_t n) {
    thread_local std::vector<uint8_t> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}

}  // namespace

size_t attentionProbsSize(const AttnDims& dims) {
    return static_cast<size_t>(dims.b) * dims.nq * dims.s * dims.s;
}

size_t attentionScratchSize(const AttnDims& dims) {
    const size_t ss = static_cast<size_t>(dims.s) * dims.s;
    return dims.dropout > 0.0f ? 2 * ss : ss;
}

void attentionForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                      float* probs, float* out, bool fusedSoftmax) {
    const int s = dims.s, d = dims.d;
    if (s <= 0 || dims.b <= 0 || dims.nq <= 0 || dims.nkv <= 0 || d <= 0) return;
    const Views vw(dims);
    const int rep = dims.nq / dims.nkv;
    const int ldq = static_cast<int>(vw.ldq), ldk = static_cast<int>(vw.ldk);
    const float p = dims.dropout;
    const bool drop = p > 0.0f;
    const float sc = keepScale(p);
    const int64_t ss = static_cast<int64_t>(s) * s;
    // dropped probabilities that feed .V: a row block (fused) or the whole head (unfused)
    float* D = drop ? threadScratch(fusedSoftmax ? static_cast<size_t>(kBlock) * s
                                                 : static_cast<size_t>(ss))
                    : nullptr;
    uint8_t* mrow = drop && fusedSoftmax ? threadMaskRow(static_cast<size_t>(s)) : nullptr;
    for (int bi = 0; bi < dims.b; ++bi) {
        for (int h = 0; h < dims.nq; ++h) {
            const int g = h / rep;
            const float* Q = q + vw.qOff(bi, h);
            const float* K = k + vw.kOff(bi, g);
            const float* V = v + vw.kOff(bi, g);
            float* O = out + vw.qOff(bi, h);
            float* P = vw.probs(probs, bi, h);  // [s, s]
            const uint64_t base = drop ? maskBase(dims, bi, h) : 0;
            if (fusedSoftmax) {
                for (int r0 = 0; r0 < s; r0 += kBlock) {
                    const int r1 = std::min(s, r0 + kBlock);
                    // P[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T; the rows of the block are
                    // contiguous, so one memset also zeroes their masked tail [r1, s)
                    std::memset(P + static_cast<int64_t>(r0) * s, 0,
                                sizeof(float) * static_cast<size_t>(r1 - r0) * s);
                    gemm(false, true, r1 - r0, r1, d, dims.scale, Q + r0 * vw.ldq, ldq, K, ldk,
                         1.0f, P + static_cast<int64_t>(r0) * s, s);
                    for (int r = r0; r < r1; ++r) {
                        float* row = P + static_cast<int64_t>(r) * s;
                        causalSoftmaxRow(row, r, r1);
                        if (!drop) continue;
                        // dropout while the row is in cache; D keeps the block's columns
                        // [0, r1) with the masked part zero for the GEMM below
                        float* drow = D + static_cast<int64_t>(r - r0) * s;
                        const int n = r + 1;
                        dropoutMask(mrow, n, p, dims.dropoutSeed,
                                    base + static_cast<uint64_t>(r) * s);
                        for (int j = 0; j < n; ++j) drow[j] = mrow[j] ? row[j] * sc : 0.0f;
                        std::fill(drow + n, drow + r1, 0.0f);
                    }
                    // O[r0:r1] = dropout(P)[r0:r1, 0:r1] V[0:r1]
                    const float* A = drop ? D : P + static_cast<int64_t>(r0) * s;
                    zeroRows(O + r0 * vw.ldq, r1 - r0, d, vw.ldq);
                    gemm(false, false, r1 - r0, d, r1, 1.0f, A, s, V, ldk, 1.0f,
                         O + r0 * vw.ldq, ldq);
                }
            } else {
                gemm(false, true, s, s, d, 1.0f, Q, ldq, K, ldk, 0.0f, P, s);
                for (int64_t i = 0; i < ss; ++i) P[i] *= dims.scale;
                const float ninf = -std::numeric_limits<float>::infinity();
                for (int r = 0; r < s; ++r)
                    for (int j = r + 1; j < s; ++j) P[static_cast<int64_t>(r) * s + j] = ninf;
                for (int r = 0; r < s; ++r) {
                    float* row = P + static_cast<int64_t>(r) * s;
                    const float m = detail::maxLanes(row, s);
                    const float sum = detail::expShiftSum(row, row, m, s);  // exp(-inf) = 0
                    const float inv = 1.0f / sum;
                    for (int j = 0; j < s; ++j) row[j] *= inv;
                }
                if (drop) dropoutForward(P, D, nullptr, ss, p, dims.dropoutSeed, base);
                gemm(false, false, s, d, s, 1.0f, drop ? D : P, s, V, ldk, 0.0f, O, ldq);
            }
        }
    }
}

// With P the probs, M the dropout keep mask (scaled: Md = M/(1-p), all ones without dropout),
// Pd = P * Md and dO the output grad of one head:
//   dV += Pd^T dO;  dP = (dO V^T) * Md;  dS = P * (dP - rowsum(P * dP));  dQ = scale dS K;
//   dK += scale dS^T Q.  All restricted to the causal block-triangle.
namespace {

// The naive backward of one head, mirroring the unfused forward: full-square GEMMs (the
// masked upper triangle of P is 0, so its products vanish), dropout and the softmax
// backward as whole-head passes.
void attentionBackwardHeadUnfused(const AttnDims& dims, const float* Q, const float* K,
                                  const float* V, const float* P, const float* dO, float* dQ,
                                  float* dK, float* dV, float beta, float* dS, float* Pd,
                                  uint64_t base, int ldq, int ldk) {
    const int s = dims.s, d = dims.d;
    const int64_t ss = static_cast<int64_t>(s) * s;
    const float p = dims.dropout;
    const bool drop = p > 0.0f;
    const float* PV = P;
    if (drop) {
        dropoutForward(P, Pd, nullptr, ss, p, dims.dropoutSeed, base);  // Pd = dropout(P)
        PV = Pd;
    }
    // dV (+)= Pd^T dO
    gemm(true, false, s, d, s, 1.0f, PV, s, dO, ldq, beta, dV, ldk);
    // dPd = dO V^T; dP = dropout'(dPd) with the same mask
    gemm(false, true, s, s, d, 1.0f, dO, ldq, V, ldk, 0.0f, dS, s);
    if (drop) {
        uint8_t* mask = threadMaskRow(static_cast<size_t>(ss));
        dropoutMask(mask, ss, p, dims.dropoutSeed, base);
        dropoutBackward(dS, mask, dS, ss, p);
    }
    // softmax backward: dS = P * (dP - rowsum(P * dP)) over whole rows
    for (int r = 0; r < s; ++r) {
        const float* pr = P + static_cast<int64_t>(r) * s;
        float* dr = dS + static_cast<int64_t>(r) * s;
        const float dot = detail::dotLanes(pr, dr, s);
        for (int j = 0; j < s; ++j) dr[j] = pr[j] * (dr[j] - dot);
    }
    gemm(false, false, s, d, s, dims.scale, dS, s, K, ldk, 0.0f, dQ, ldq);
    gemm(true, false, s, d, s, dims.scale, dS, s, Q, ldq, beta, dK, ldk);
}

}  // namespace

void attentionBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                       const float* probs, const float* dout, float* dq, float* dk, float* dv,
                       float* scratch, bool fusedSoftmax) {
    const int s = dims.s, d = dims.d;
    if (s <= 0 || dims.b <= 0 || dims.nq <= 0 || dims.nkv <= 0 || d <= 0) return;
    const Views vw(dims);
    const int rep = dims.nq / dims.nkv;
    const int ldq = static_cast<int>(vw.ldq), ldk = static_cast<int>(vw.ldk);
    const float p = dims.dropout;
    const bool drop = p > 0.0f;
    const float sc = keepScale(p);
    float* dS = scratch;                                             // [s, s]
    float* Pd = drop ? scratch + static_cast<int64_t>(s) * s : nullptr;  // [s, s]
    uint8_t* mrow = drop ? threadMaskRow(static_cast<size_t>(s)) : nullptr;
    for (int bi = 0; bi < dims.b; ++bi) {
        for (int h = 0; h < dims.nq; ++h) {
            const int g = h / rep;
            // The first query head of a group overwrites dK/dV, the rest accumulate.
            const float beta = (h % rep == 0) ? 0.0f : 1.0f;
            const float* Q = q + vw.qOff(bi, h);
            const float* K = k + vw.kOff(bi, g);
            const float* V = v + vw.kOff(bi, g);
            const float* dO = dout + vw.qOff(bi, h);
            float* dQ = dq + vw.qOff(bi, h);
            float* dK = dk + vw.kOff(bi, g);
            float* dV = dv + vw.kOff(bi, g);
            const float* P = vw.probs(probs, bi, h);
            const uint64_t base = drop ? maskBase(dims, bi, h) : 0;
            if (!fusedSoftmax) {
                attentionBackwardHeadUnfused(dims, Q, K, V, P, dO, dQ, dK, dV, beta, dS, Pd, base,
                                             ldq, ldk);
                continue;
            }
            for (int r0 = 0; r0 < s; r0 += kBlock) {
                const int r1 = std::min(s, r0 + kBlock);
                float* dSb = dS + static_cast<int64_t>(r0) * s;
                // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T
                zeroRows(dSb, r1 - r0, r1, s);
                gemm(false, true, r1 - r0, r1, d, 1.0f, dO + r0 * vw.ldq, ldq, V, ldk, 1.0f, dSb,
                     s);
                for (int r = r0; r < r1; ++r) {
                    const float* pr = P + static_cast<int64_t>(r) * s;
                    float* dr = dS + static_cast<int64_t>(r) * s;
                    const int n = r + 1;
                    if (drop) {
                        // regenerate the forward's mask row; Pd feeds the dV GEMM below
                        dropoutMask(mrow, n, p, dims.dropoutSeed,
                                    base + static_cast<uint64_t>(r) * s);
                        float* pdr = Pd + static_cast<int64_t>(r) * s;
                        for (int j = 0; j < n; ++j) {
                            const float m = mrow[j] ? sc : 0.0f;
                            dr[j] *= m;
                            pdr[j] = pr[j] * m;
                        }
                        std::fill(pdr + n, pdr + r1, 0.0f);
                    }
                    const float dot = detail::dotLanes(pr, dr, n);
                    for (int j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
                    // the GEMMs below read up to the block end: keep the masked part zero
                    std::fill(dr + n, dr + r1, 0.0f);
                }
                // dQ[r0:r1] = scale dS[r0:r1, 0:r1] K[0:r1]
                zeroRows(dQ + r0 * vw.ldq, r1 - r0, d, vw.ldq);
                gemm(false, false, r1 - r0, d, r1, dims.scale, dSb, s, K, ldk, 1.0f,
                     dQ + r0 * vw.ldq, ldq);
            }
            const float* PV = drop ? Pd : P;
            for (int c0 = 0; c0 < s; c0 += kBlock) {
                const int c1 = std::min(s, c0 + kBlock);
                if (beta == 0.0f) {
                    zeroRows(dV + c0 * vw.ldk, c1 - c0, d, vw.ldk);
                    zeroRows(dK + c0 * vw.ldk, c1 - c0, d, vw.ldk);
                }
                // dV[c0:c1] (+)= Pd[c0:s, c0:c1]^T dO[c0:s]  (rows above c0 are masked)
                gemm(true, false, c1 - c0, d, s - c0, 1.0f,
                     PV + static_cast<int64_t>(c0) * s + c0, s, dO + c0 * vw.ldq, ldq, 1.0f,
                     dV + c0 * vw.ldk, ldk);
                // dK[c0:c1] (+)= scale dS[c0:s, c0:c1]^T Q[c0:s]
                gemm(true, false, c1 - c0, d, s - c0, dims.scale,
                     dS + static_cast<int64_t>(c0) * s + c0, s, Q + c0 * vw.ldq, ldq, 1.0f,
                     dK + c0 * vw.ldk, ldk);
            }
        }
    }
}

}  // namespace ts::kernels::cpu
