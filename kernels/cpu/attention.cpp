// Causal core attention with GQA: scores = scale * Q K^T, causal softmax, out = P V, and the
// backward through it. All matmuls are OpenBLAS GEMMs on strided views of the [s, b, heads, d]
// activations (no transposes or copies): for batch bi and head h, Q_bh is an [s, d] matrix
// starting at q + (bi*nq + h)*d with leading dim b*nq*d.
//
// Causality: the fused path only computes the lower block-triangle (rows in blocks of kBlock,
// block i needs key columns [0, end of block i)), which roughly halves the GEMM work at long
// sequences; the unfused path is the naive one (full square scores, then scale, mask, softmax
// as separate passes) used to check the fused one and to measure what the fusion buys.
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

#include <algorithm>
#include <cstring>
#include <limits>

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

// Row r of raw scores (already scaled): softmax over columns [0, r], zeros after.
inline void causalSoftmaxRow(float* row, int r, int s) {
    const int n = r + 1;
    const float m = detail::maxLanes(row, n);
    const float sum = detail::expShiftSum(row, row, m, n);
    const float inv = 1.0f / sum;
    for (int j = 0; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + s, 0.0f);
}

}  // namespace

size_t attentionProbsSize(const AttnDims& dims) {
    return static_cast<size_t>(dims.b) * dims.nq * dims.s * dims.s;
}

void attentionForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                      float* probs, float* out, bool fusedSoftmax) {
    const int s = dims.s, d = dims.d;
    if (s <= 0 || dims.b <= 0 || dims.nq <= 0 || dims.nkv <= 0 || d <= 0) return;
    const Views vw(dims);
    const int rep = dims.nq / dims.nkv;
    const int ldq = static_cast<int>(vw.ldq), ldk = static_cast<int>(vw.ldk);
    for (int bi = 0; bi < dims.b; ++bi) {
        for (int h = 0; h < dims.nq; ++h) {
            const int g = h / rep;
            const float* Q = q + vw.qOff(bi, h);
            const float* K = k + vw.kOff(bi, g);
            const float* V = v + vw.kOff(bi, g);
            float* O = out + vw.qOff(bi, h);
            float* P = vw.probs(probs, bi, h);  // [s, s]
            if (fusedSoftmax) {
                for (int r0 = 0; r0 < s; r0 += kBlock) {
                    const int r1 = std::min(s, r0 + kBlock);
                    // P[r0:r1, 0:r1] = scale * Q[r0:r1] K[0:r1]^T
                    gemm(false, true, r1 - r0, r1, d, dims.scale, Q + r0 * vw.ldq, ldq, K, ldk,
                         0.0f, P + static_cast<int64_t>(r0) * s, s);
                    for (int r = r0; r < r1; ++r)
                        causalSoftmaxRow(P + static_cast<int64_t>(r) * s, r, s);
                    // O[r0:r1] = P[r0:r1, 0:r1] V[0:r1]
                    gemm(false, false, r1 - r0, d, r1, 1.0f, P + static_cast<int64_t>(r0) * s, s,
                         V, ldk, 0.0f, O + r0 * vw.ldq, ldq);
                }
            } else {
                gemm(false, true, s, s, d, 1.0f, Q, ldq, K, ldk, 0.0f, P, s);
                const int64_t ss = static_cast<int64_t>(s) * s;
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
                gemm(false, false, s, d, s, 1.0f, P, s, V, ldk, 0.0f, O, ldq);
            }
        }
    }
}

// With P the probs and dO the output grad of one head:
//   dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(P * dP));  dQ = scale dS K;
//   dK += scale dS^T Q.  All restricted to the causal block-triangle.
void attentionBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                       const float* probs, const float* dout, float* dq, float* dk, float* dv,
                       float* scratch) {
    const int s = dims.s, d = dims.d;
    if (s <= 0 || dims.b <= 0 || dims.nq <= 0 || dims.nkv <= 0 || d <= 0) return;
    const Views vw(dims);
    const int rep = dims.nq / dims.nkv;
    const int ldq = static_cast<int>(vw.ldq), ldk = static_cast<int>(vw.ldk);
    float* dS = scratch;  // [s, s]
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
            for (int c0 = 0; c0 < s; c0 += kBlock) {
                const int c1 = std::min(s, c0 + kBlock);
                // dV[c0:c1] (+)= P[c0:s, c0:c1]^T dO[c0:s]  (rows above c0 are masked)
                gemm(true, false, c1 - c0, d, s - c0, 1.0f, P + static_cast<int64_t>(c0) * s + c0,
                     s, dO + c0 * vw.ldq, ldq, beta, dV + c0 * vw.ldk, ldk);
            }
            for (int r0 = 0; r0 < s; r0 += kBlock) {
                const int r1 = std::min(s, r0 + kBlock);
                float* dSb = dS + static_cast<int64_t>(r0) * s;
                // dP[r0:r1, 0:r1] = dO[r0:r1] V[0:r1]^T
                gemm(false, true, r1 - r0, r1, d, 1.0f, dO + r0 * vw.ldq, ldq, V, ldk, 0.0f, dSb,
                     s);
                for (int r = r0; r < r1; ++r) {
                    const float* pr = P + static_cast<int64_t>(r) * s;
                    float* dr = dS + static_cast<int64_t>(r) * s;
                    const int n = r + 1;
                    const float dot = detail::dotLanes(pr, dr, n);
                    for (int j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
                    // the GEMMs below read up to the block end: keep the masked part zero
                    std::fill(dr + n, dr + r1, 0.0f);
                }
                // dQ[r0:r1] = scale dS[r0:r1, 0:r1] K[0:r1]
                gemm(false, false, r1 - r0, d, r1, dims.scale, dSb, s, K, ldk, 0.0f,
                     dQ + r0 * vw.ldq, ldq);
            }
            for (int c0 = 0; c0 < s; c0 += kBlock) {
                const int c1 = std::min(s, c0 + kBlock);
                // dK[c0:c1] (+)= scale dS[c0:s, c0:c1]^T Q[c0:s]
                gemm(true, false, c1 - c0, d, s - c0, dims.scale,
                     dS + static_cast<int64_t>(c0) * s + c0, s, Q + c0 * vw.ldq, ldq, beta,
                     dK + c0 * vw.ldk, ldk);
            }
        }
    }
}

}  // namespace ts::kernels::cpu
