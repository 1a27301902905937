// Causal core attention with GQA: scores = scale * Q K^T, causal softmax, out = P V, and the
// backward through it, on strided views of the [s, b, heads, d] activations: for batch bi and
// head h, Q_bh is an [s, d] matrix starting at q + (bi*nq + h)*d with leading dim b*nq*d.
//
// The fused path runs its matmuls on detail::smallGemm (small_gemm.h): per KV group it packs
// K^T and V once into 16-column panels (shared by the group's query heads), per query head it
// works in row blocks of kBlock so that the block's scores stay in L2 while the softmax runs.
// Causality is exploited at tile granularity: scores are computed for 16-column strips only
// from the 6-row tile that first needs them, .V and the backward GEMMs stop their k range at
// the tile's last needed key, so about half of the square is computed at any length. The
// entries of a tile above the diagonal that are computed anyway are overwritten by the
// softmax's zero fill before anything reads them.
// The unfused path is the naive one (OpenBLAS GEMMs over the full square, then scale, mask,
// softmax as separate passes; its backward full-square too), used to check the fused one and
// to measure what the fusion buys.
//
// Attention dropout (AttnDims::dropout > 0): probs keeps the undropped softmax P; .V uses
// dropout(P). The mask is never stored: a pure function of (seed, element number), it is
// regenerated row by row in backward (and by selective recompute), which costs one hash per
// two elements instead of s*s bytes per head of activation memory.
#include "kernels/cpu/ops.h"
#include "kernels/cpu/small_gemm.h"
#include "kernels/cpu/vec_math.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

namespace ts::kernels::cpu {

namespace {

constexpr int kBlock = 64;  // rows per block: its scores (kBlock x s floats) stay in L2
constexpr int kTileRows = 6;  // smallGemm's row tile
constexpr int kStrip = 16;    // smallGemm's column strip

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

// Row r of raw scores (already scaled): softmax over columns [0, r], zeros in (r, end). With
// stats, its maximum and the reciprocal of its denominator go to stats[0], stats[1].
inline void causalSoftmaxRow(float* row, int r, int end, float* stats = nullptr) {
    const int n = r + 1;
    const float m = detail::maxLanes(row, n);
    const float sum = detail::expShiftSum(row, row, m, n);
    const float inv = 1.0f / sum;
    for (int j = 0; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + end, 0.0f);
    if (stats) {
        stats[0] = m;
        stats[1] = inv;
    }
}

// The same row again from its raw scores and the forward's stats: the same exp of the same
// shifted scores times the same reciprocal, so the same bits as causalSoftmaxRow gave.
inline void causalSoftmaxRowFromStats(float* row, int r, int end, const float* stats) {
    const int n = r + 1;
    (void)detail::expShiftSum(row, row, stats[0], n);
    const float inv = stats[1];
    for (int j = 0; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + end, 0.0f);
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
// Per-thread panels of the packed GEMM operands (a separate buffer from threadScratch).
float* threadPanels(size_t n) {
    thread_local std::vector<float> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}
// Per-thread row block of flash attention's probabilities (kBlock x s).
float* threadBlock(size_t n) {
    thread_local std::vector<float> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}
uint8_t* threadMaskRow(size_t n) {
    thread_local std::vector<uint8_t> buf;
    if (buf.size() < n) buf.resize(n);
    return buf.data();
}

// S[r - r0, c] = alpha * A(r) . Bt(c) for the rows [r0, r1) of a head and every column c <= r,
// as 16-column strips (c in [j, j+16) for j < r1) over the 6-row tiles (aligned to r0) from the
// first one that holds a row >= j. A is the [s, d] operand with row stride lda, Bt the panels
// of the [d, s] operand, S holds row r0 first (row stride s). Entries of a tile above the
// diagonal come out as finite garbage.
inline void causalScores(int r0, int r1, int d, float alpha, const float* A, int64_t lda,
                         const float* Bt, float* S, int s) {
    for (int j = 0; j < r1; j += kStrip) {
        const int first = r0 + (std::max(j, r0) - r0) / kTileRows * kTileRows;
        detail::smallGemm(r1 - first, std::min(kStrip, r1 - j), d, alpha, A + first * lda, lda,
                          1, Bt + static_cast<int64_t>(j) * d, kStrip, 0, false,
                          S + static_cast<int64_t>(first - r0) * s + j, s);
    }
}

// C[i] = alpha * sum_{c < ie} A[i, c] B[c] for the 6-row tiles [i, ie) of [r0, r1): each
// tile's k range ends at its last row's last causal key. A rows have stride lda (columns of a
// row past its diagonal must be zero up to the tile end), B is the [s, d] panel operand.
inline void causalTimes(int r0, int r1, int s, int d, float alpha, const float* A, int64_t lda,
                        const float* B, float* C, int64_t ldc) {
    for (int i = r0; i < r1; i += kTileRows) {
        const int ie = std::min(i + kTileRows, r1);
        detail::smallGemm(ie - i, d, ie, alpha, A + static_cast<int64_t>(i - r0) * lda, lda, 1,
                          B, kStrip, static_cast<int64_t>(kStrip) * s, false, C + i * ldc, ldc);
    }
}

// Runs f(biBegin, biEnd, worker) over [0, b): on the calling thread alone, or, when `parallel`
// and GEMMs may use several threads (setNumThreads), split over min(threads, b) threads (the
// caller is worker 0). Each batch element is computed the same way on any thread, so results
// do not depend on the split.
template <class F>
void forBatchRanges(int b, bool parallel, F&& f) {
    const int nt = parallel ? std::min(numThreads(), b) : 1;
    if (nt <= 1) {
        f(0, b, 0);
        return;
    }
    std::vector<std::thread> workers;
    workers.reserve(static_cast<size_t>(nt - 1));
    for (int t = 1; t < nt; ++t)
        workers.emplace_back([&f, t, nt, b] { f(t * b / nt, (t + 1) * b / nt, t); });
    f(0, b / nt, 0);
    for (auto& w : workers) w.join();
}

}  // namespace

size_t attentionProbsSize(const AttnDims& dims) {
    return static_cast<size_t>(dims.b) * dims.nq * dims.s * dims.s;
}

size_t attentionScratchSize(const AttnDims& dims) {
    const size_t ss = static_cast<size_t>(dims.s) * dims.s;
    return dims.dropout > 0.0f ? 2 * ss : ss;
}

size_t attentionStatsSize(const AttnDims& dims) {
    return 2 * static_cast<size_t>(dims.b) * dims.nq * dims.s;
}

size_t attentionFlashScratchSize(const AttnDims& dims) {
    return attentionScratchSize(dims) + static_cast<size_t>(dims.s) * dims.s;
}

namespace {

// The forward of both ways: probs set (materialized; fusedSoftmax picks the path), or stats set
// (flash: the fused path with each row block's probabilities in a per-thread block).
void attentionForwardImpl(const AttnDims& dims, const float* q, const float* k, const float* v,
                          float* probs, float* stats, float* out, bool fusedSoftmax) {
    const int s = dims.s, d = dims.d;
    if (s <= 0 || dims.b <= 0 || dims.nq <= 0 || dims.nkv <= 0 || d <= 0) return;
    const Views vw(dims);
    const int rep = dims.nq / dims.nkv;
    const int ldq = static_cast<int>(vw.ldq), ldk = static_cast<int>(vw.ldk);
    const float p = dims.dropout;
    const bool drop = p > 0.0f;
    const float sc = keepScale(p);
    const int64_t ss = static_cast<int64_t>(s) * s;
    // Batch elements are independent: with more than one kernel thread the fused path splits
    // them over threads (per-thread buffers below are thread_local).
    auto range = [&](int biBegin, int biEnd, int /*worker*/) {
        // dropped probabilities that feed .V: a row block (fused) or the whole head (unfused)
        float* D = drop ? threadScratch(fusedSoftmax ? static_cast<size_t>(kBlock) * s
                                                     : static_cast<size_t>(ss))
                        : nullptr;
        uint8_t* mrow = drop && fusedSoftmax ? threadMaskRow(static_cast<size_t>(s)) : nullptr;
        // fused: the group's K^T ([d, s]) and V ([s, d]) as smallGemm panels
        float* Kt = fusedSoftmax ? threadPanels(static_cast<size_t>(detail::panelFloats(d, s) +
                                                                    detail::panelFloats(s, d)))
                                 : nullptr;
        float* Vp = fusedSoftmax ? Kt + detail::panelFloats(d, s) : nullptr;
        float* block = stats ? threadBlock(static_cast<size_t>(kBlock) * s) : nullptr;
        for (int bi = biBegin; bi < biEnd; ++bi) {
            for (int h = 0; h < dims.nq; ++h) {
                const int g = h / rep;
                const float* Q = q + vw.qOff(bi, h);
                const float* K = k + vw.kOff(bi, g);
                const float* V = v + vw.kOff(bi, g);
                float* O = out + vw.qOff(bi, h);
                float* P = stats ? nullptr : vw.probs(probs, bi, h);  // [s, s]
                float* St = stats ? stats + 2 * ((static_cast<int64_t>(bi) * dims.nq + h) * s) : nullptr;
                const uint64_t base = drop ? maskBase(dims, bi, h) : 0;
                if (fusedSoftmax) {
                    if (h % rep == 0) {  // first query head of the group
                        detail::packPanels(d, s, K, 1, ldk, Kt);
                        detail::packPanels(s, d, V, ldk, 1, Vp);
                    }
                    for (int r0 = 0; r0 < s; r0 += kBlock) {
                        const int r1 = std::min(s, r0 + kBlock);
                        // the block's rows: in probs, or (flash) in the per-thread block
                        float* Pb = stats ? block : P + static_cast<int64_t>(r0) * s;
                        // Pb[r - r0, c] = scale * Q[r] . K[c] for c <= r (and some c > r, see above)
                        causalScores(r0, r1, d, dims.scale, Q, ldq, Kt, Pb, s);
                        for (int r = r0; r < r1; ++r) {
                            float* row = Pb + static_cast<int64_t>(r - r0) * s;
                            // the upper triangle of probs is 0
                            causalSoftmaxRow(row, r, s, St ? St + 2 * r : nullptr);
                            if (!drop) continue;
                            // dropout while the row is in cache; D keeps the block's rows with the
                            // masked part zero up to the block end (the .V below reads that far)
                            float* drow = D + static_cast<int64_t>(r - r0) * s;
                            const int n = r + 1;
                            dropoutMask(mrow, n, p, dims.dropoutSeed,
                                        base + static_cast<uint64_t>(r) * s);
                            for (int j = 0; j < n; ++j) drow[j] = mrow[j] ? row[j] * sc : 0.0f;
                            std::fill(drow + n, drow + r1, 0.0f);
                        }
                        // O[r0:r1] = dropout(P)[r0:r1, 0:r1] V[0:r1], causal per row tile
                        const float* A = drop ? D : Pb;
                        causalTimes(r0, r1, s, d, 1.0f, A, s, Vp, O, vw.ldq);
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
    };
    forBatchRanges(dims.b, fusedSoftmax, range);
}

}  // namespace

void attentionForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                      float* probs, float* out, bool fusedSoftmax) {
    attentionForwardImpl(dims, q, k, v, probs, nullptr, out, fusedSoftmax);
}

void attentionFlashForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                           float* stats, float* out) {
    attentionForwardImpl(dims, q, k, v, nullptr, stats, out, true);
}

// With P the probs, M the dropout keep mask (scaled: Md = M/(1-p), all ones without dropout),
// Pd = P * Md and dO the output grad of one head:
//   dV += Pd^T dO;  dP = (dO V^T) * Md;  dS = P * (dP - rowsum(P * dP));  dQ = scale dS K;
//   dK += scale dS^T Q.  Fused: all restricted to the causal tiles.
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

namespace {

// The backward of both ways: probs set (materialized), or stats set (flash: the fused path,
// each head's probabilities rebuilt row block by row block into scratch first).
void attentionBackwardImpl(const AttnDims& dims, const float* q, const float* k, const float* v,
                           const float* probs, const float* stats, const float* dout, float* dq,
                           float* dk, float* dv, float* scratch, bool fusedSoftmax) {
    const int s = dims.s, d = dims.d;
    if (s <= 0 || dims.b <= 0 || dims.nq <= 0 || dims.nkv <= 0 || d <= 0) return;
    const Views vw(dims);
    const int rep = dims.nq / dims.nkv;
    const int ldq = static_cast<int>(vw.ldq), ldk = static_cast<int>(vw.ldk);
    const float p = dims.dropout;
    const bool drop = p > 0.0f;
    const float sc = keepScale(p);
    // Batch elements are independent: with more than one kernel thread the fused path splits
    // them over threads; worker 0 uses the caller's scratch, the others their own.
    auto range = [&](int biBegin, int biEnd, int worker) {
        std::vector<float> own;
        float* sbuf = scratch;
        if (worker > 0) {
            own.resize(stats ? attentionFlashScratchSize(dims) : attentionScratchSize(dims));
            sbuf = own.data();
        }
        const int64_t ss = static_cast<int64_t>(s) * s;
        float* dS = sbuf;                                             // [s, s]
        float* Pd = drop ? sbuf + ss : nullptr;  // [s, s]
        float* Pr = stats ? sbuf + (drop ? 2 : 1) * ss : nullptr;     // flash: the head's P [s, s]
        uint8_t* mrow = drop ? threadMaskRow(static_cast<size_t>(s)) : nullptr;
        // fused: smallGemm panels of the group's K and V^T and of the head's dO and Q
        const int64_t pf = detail::panelFloats(s, d);
        float* Kp = nullptr;
        float* Vt = nullptr;
        float* dOp = nullptr;
        float* Qp = nullptr;
        float* Kt = nullptr;  // flash: the group's K^T ([d, s]) for the scores
        if (fusedSoftmax) {
            const int64_t vtf = detail::panelFloats(d, s);
            Kp = threadPanels(static_cast<size_t>(3 * pf + (stats ? 2 : 1) * vtf));
            dOp = Kp + pf;
            Qp = dOp + pf;
            Vt = Qp + pf;
            if (stats) Kt = Vt + vtf;
        }
        for (int bi = biBegin; bi < biEnd; ++bi) {
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
                const float* P = stats ? Pr : vw.probs(probs, bi, h);
                const float* St = stats ? stats + 2 * ((static_cast<int64_t>(bi) * dims.nq + h) * s) : nullptr;
                const uint64_t base = drop ? maskBase(dims, bi, h) : 0;
                if (!fusedSoftmax) {
                    attentionBackwardHeadUnfused(dims, Q, K, V, P, dO, dQ, dK, dV, beta, dS, Pd, base,
                                                 ldq, ldk);
                    continue;
                }
                if (h % rep == 0) {  // the group's K ([s, d]) and V^T ([d, s]) as panels
                    detail::packPanels(s, d, K, ldk, 1, Kp);
                    detail::packPanels(d, s, V, 1, ldk, Vt);
                    if (Kt) detail::packPanels(d, s, K, 1, ldk, Kt);
                }
                detail::packPanels(s, d, dO, ldq, 1, dOp);
                detail::packPanels(s, d, Q, ldq, 1, Qp);
                for (int r0 = 0; r0 < s; r0 += kBlock) {
                    const int r1 = std::min(s, r0 + kBlock);
                    if (stats) {  // flash: the block's probabilities again, as the forward made them
                        float* Pb = Pr + static_cast<int64_t>(r0) * s;
                        causalScores(r0, r1, d, dims.scale, Q, ldq, Kt, Pb, s);
                        for (int r = r0; r < r1; ++r)
                            causalSoftmaxRowFromStats(Pb + static_cast<int64_t>(r - r0) * s, r, s, St + 2 * r);
                    }
                    // dP[r, c] = dO[r] . V[c] for c <= r (and some c > r)
                    causalScores(r0, r1, d, 1.0f, dO, ldq, Vt, dS + static_cast<int64_t>(r0) * s, s);
                    for (int r = r0; r < r1; ++r) {
                        const float* pr = P + static_cast<int64_t>(r) * s;
                        float* dr = dS + static_cast<int64_t>(r) * s;
                        const int n = r + 1;
                        // the GEMMs below read row r up to the block end (dQ) and up to 5 columns
                        // past the diagonal (dK/dV's 6-column tiles): that part must be zero
                        const int zEnd = std::min(s, std::max(r1, r + kTileRows));
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
                            std::fill(pdr + n, pdr + zEnd, 0.0f);
                        }
                        const float dot = detail::dotLanes(pr, dr, n);
                        for (int j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - dot);
                        std::fill(dr + n, dr + zEnd, 0.0f);
                    }
                    // dQ[r0:r1] = scale dS[r0:r1, 0:r1] K[0:r1], causal per row tile
                    causalTimes(r0, r1, s, d, dims.scale, dS + static_cast<int64_t>(r0) * s, s, Kp,
                                dQ, vw.ldq);
                }
                // dV[c] (+)= sum_{r >= c} Pd[r, c] dO[r], dK[c] (+)= scale sum_{r >= c} dS[r, c] Q[r]
                // over 6-row tiles of c, each with k range [c0, s) (rows above c0 are masked)
                const float* PV = drop ? Pd : P;
                const bool acc = beta != 0.0f;
                for (int c0 = 0; c0 < s; c0 += kTileRows) {
                    const int rc = std::min(kTileRows, s - c0);
                    const int64_t at = static_cast<int64_t>(c0) * s + c0;
                    detail::smallGemm(rc, d, s - c0, 1.0f, PV + at, 1, s, dOp + c0 * kStrip, kStrip,
                                      static_cast<int64_t>(kStrip) * s, acc, dV + c0 * vw.ldk, ldk);
                    detail::smallGemm(rc, d, s - c0, dims.scale, dS + at, 1, s, Qp + c0 * kStrip,
                                      kStrip, static_cast<int64_t>(kStrip) * s, acc, dK + c0 * vw.ldk,
                                      ldk);
                }
            }
        }
    };
    forBatchRanges(dims.b, fusedSoftmax, range);
}

}  // namespace

void attentionBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                       const float* probs, const float* dout, float* dq, float* dk, float* dv,
                       float* scratch, bool fusedSoftmax) {
    attentionBackwardImpl(dims, q, k, v, probs, nullptr, dout, dq, dk, dv, scratch, fusedSoftmax);
}

void attentionFlashBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                            const float* stats, const float* dout, float* dq, float* dk,
                            float* dv, float* scratch) {
    attentionBackwardImpl(dims, q, k, v, nullptr, stats, dout, dq, dk, dv, scratch, true);
}

}  // namespace ts::kernels::cpu
