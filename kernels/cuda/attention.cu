// Causal core attention with GQA on the device (kernels/cpu/attention.cpp is the oracle), and
// the masked-attention engine that the context-parallel all-gather variant (attention_cp.cu)
// shares: cuBLAS strided-batched GEMMs over heads (gemm.cu, full fp32) plus our own row kernels
// for scale, causal mask, softmax, dropout and the softmax backward.
//   q: [sq, b, nq, d], k, v: [skv, b, nkv, d]; probs: [b, nq, sq, skv]; out: [sq, b, nq, d]
// The per-head [sq, d] views have leading dim b*nq*d (q, out) and b*nkv*d (k, v). Query head
// h of batch bi uses k/v head h / rep (rep = nq/nkv). The GEMMs batch over i = bi*nkv + g for
// one replica j < rep at a time (query head (bi, g*rep + j) is flat head i*rep + j), so all
// strides are uniform and the GQA gradient sums dK, dV over j run in the CPU's order
// (j = 0 overwrites, j > 0 accumulates): deterministic, no atomics.
//
// fusedSoftmax=false mirrors the CPU's naive path: scores GEMM, then scale, causal mask,
// softmax and dropout as separate kernels, full-square GEMMs; backward: dropout(P), dV GEMM,
// dP GEMM, dropout backward and softmax backward as separate kernels, dQ/dK GEMMs.
// fusedSoftmax=true: the scale folded into the scores GEMM, one row kernel for mask + softmax
// (+ dropout), and in backward one row kernel for the dropout mask, dropout(P) and the softmax
// backward. On the causal square the fused path's GEMMs run in causal row blocks
// (kernels/common/causal_gemms.h: about 1/2 + 1/(2 nb) of the square for nb blocks, the CPU's
// fused path skips at tile granularity). Under bf16 GEMMs with flashTiles() on, the flash path runs
// the tiled kernels of flash_attention.cu instead, which never write the scores out; cuDNN's fused
// attention comes later.
// Flash attention (attentionFlashForward/Backward): the fused path with each head chunk's
// probabilities in the workspace instead of the caller's probs, and each row's max and 1/sum
// written to stats; the backward rebuilds the chunk's probabilities by the scores GEMM and
// softmaxFromStatsRowsKernel before the fused backward.
//
// Row kernels: one warp per row of one head (rows of any length, no shared memory). Softmax
// sums and the softmax backward's row dot accumulate in double (the CPU sums in float lanes for
// the square, in double for the CP variant); exp is CUDA's expf where the CPU uses its own
// polynomial. Results therefore agree with the CPU to a few ulp per element, and the GEMMs'
// summation order differs: the tests compare with a tolerance. Dropout keep bits are the CPU's
// exactly (attention_common.cuh), never stored: backward regenerates them.
//
// Workspace: dropout(P) (forward) and dS, dropout(P) (backward) need [sq, skv] floats per head
// of a GEMM batch, flash attention one more (P itself). They come from a stream-ordered
// allocation (cudaMallocAsync) of at most kWorkspaceCapBytes, the heads split into chunks to fit;
// the backwards fall back to the caller's scratch (attentionScratchSize or
// attentionFlashScratchSize: one head) one head at a time when that allocation fails. The
// forwards halve their chunk until the allocation succeeds; at one head a failure fails the op
// with cudaMallocAsync's error.
#include "kernels/common/bf16.h"
#include "kernels/common/causal_gemms.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <algorithm>
#include <string>

namespace ts::kernels::cuda {

namespace detail {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ inline double warpSumD(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// What a row kernel needs to place row ro = t*sq + r of a chunk: its head, its visible keys and
// the first dropout-mask element of its row.
struct RowParams {
    HeadChunk ch;
    int nq = 0, sq = 0, skv = 0;
    const int* qPos = nullptr;
    float scale = 0.0f;
    DropoutRng rng;
    int64_t nqTotal = 0;
    int headOffset = 0;
    int64_t sTotal = 0;
    // Flash attention: probs holds the chunk's rows only (row ro of the chunk at ro * skv, a
    // workspace), and each row's max and reciprocal denominator go to / come from stats.
    bool localProbs = false;
    float* stats = nullptr;
    // bf16 GEMMs: the bf16 bits of what the fused row kernels write, at the same index as the
    // floats (probs, D / Pd, dS), so the next GEMMs read them as operands (Bf16Twin); null: none.
    uint16_t* probsBits = nullptr;
    uint16_t* dropBits = nullptr;
    uint16_t* dsBits = nullptr;
};

struct RowInfo {
    int64_t head;      // flat bi*nq + h
    int r;             // query row
    int n;             // visible keys [0, n) (n <= 0: none)
    uint64_t maskRow;  // dropout element of key 0
    uint64_t rngKey;   // the dropout stream's key (0 without dropout)
    int64_t ro;        // row of the chunk
};

__device__ inline RowInfo rowInfo(const RowParams& p, int64_t ro) {
    RowInfo ri;
    const int t = static_cast<int>(ro / p.sq);
    ri.r = static_cast<int>(ro % p.sq);
    ri.head = p.ch.head(t);
    const int pos = p.qPos ? p.qPos[ri.r] : ri.r;
    ri.n = p.qPos ? min(pos, p.skv - 1) + 1 : ri.r + 1;
    const int64_t bi = ri.head / p.nq, h = ri.head % p.nq;
    ri.maskRow = static_cast<uint64_t>(((bi * p.nqTotal + p.headOffset + h) * p.sTotal + pos) * p.sTotal);
    ri.rngKey = p.rng.key();
    ri.ro = ro;
    return ri;
}

__device__ inline int64_t probsRowOffset(const RowParams& p, const RowInfo& ri) {
    return (p.localProbs ? ri.ro : ri.head * p.sq + ri.r) * static_cast<int64_t>(p.skv);
}
__device__ inline float* probsRow(const RowParams& p, float* probs, const RowInfo& ri) {
    return probs + probsRowOffset(p, ri);
}
__device__ inline const float* probsRow(const RowParams& p, const float* probs, const RowInfo& ri) {
    return probs + probsRowOffset(p, ri);
}
// The flash stats of a row: [b, nq, sq, 2] over the flat head.
__device__ inline float* statsRow(const RowParams& p, const RowInfo& ri) {
    return p.stats + 2 * (ri.head * p.sq + ri.r);
}

// The warp's rows: ro in [0, rows), all lanes of a warp on the same row.
#define TS_FOR_EACH_WARP_ROW(ro, rows)                                                            \
    for (int64_t ro = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  \
         ro < (rows); ro += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32))

__device__ inline float keepFactor(const RowParams& p, const RowInfo& ri, uint64_t e) {
    return dropoutKeep(ri.rngKey, e, p.rng.threshold) ? p.rng.keepScale : 0.0f;
}
// x of dropout element e after dropout, as the CPU's dropoutForward/Backward (m ? x*sc : 0).
__device__ inline float dropValue(const RowParams& p, const RowInfo& ri, uint64_t e, float x) {
    return dropoutKeep(ri.rngKey, e, p.rng.threshold) ? x * p.rng.keepScale : 0.0f;
}

// Fused forward row: probs holds the scaled scores; writes the masked softmax (zeros past the
// visible keys) and, when D is set, dropout(P) into the workspace row.
__global__ void fusedSoftmaxRowsKernel(RowParams p, float* __restrict__ probs, float* __restrict__ D,
                                       int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const RowInfo ri = rowInfo(p, ro);
        float* P = probsRow(p, probs, ri);
        float mx = -INFINITY;
        for (int j = lane; j < ri.n; j += 32) mx = fmaxf(mx, P[j]);
        mx = warpMax(mx);
        double sum = 0.0;
        for (int j = lane; j < ri.n; j += 32) sum += expf(P[j] - mx);
        sum = warpSumD(sum);
        const float inv = ri.n > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
        if (p.stats && lane == 0) {
            float* st = statsRow(p, ri);
            st[0] = mx;
            st[1] = inv;
        }
        float* Dr = D ? D + ro * p.skv : nullptr;
        uint16_t* Pb = p.probsBits ? p.probsBits + probsRowOffset(p, ri) : nullptr;
        uint16_t* Db = p.dropBits && Dr ? p.dropBits + ro * p.skv : nullptr;
        for (int j = lane; j < p.skv; j += 32) {
            const float pj = j < ri.n ? expf(P[j] - mx) * inv : 0.0f;
            P[j] = pj;
            if (Pb) Pb[j] = hd::bf16FromFloat(pj);
            if (Dr) {
                const float dj = j < ri.n ? dropValue(p, ri, ri.maskRow + j, pj) : 0.0f;
                Dr[j] = dj;
                if (Db) Db[j] = hd::bf16FromFloat(dj);
            }
        }
    }
}

// Flash backward: probs holds the scaled scores again; the row's probabilities from the
// forward's stats (the same expf of the same shifted scores times the same reciprocal).
__global__ void softmaxFromStatsRowsKernel(RowParams p, float* __restrict__ probs, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const RowInfo ri = rowInfo(p, ro);
        float* P = probsRow(p, probs, ri);
        const float* st = statsRow(p, ri);
        const float mx = st[0], inv = st[1];
        uint16_t* Pb = p.probsBits ? p.probsBits + probsRowOffset(p, ri) : nullptr;
        for (int j = lane; j < p.skv; j += 32) {
            const float pj = j < ri.n ? expf(P[j] - mx) * inv : 0.0f;
            P[j] = pj;
            if (Pb) Pb[j] = hd::bf16FromFloat(pj);
        }
    }
}

// --- the unfused passes (whole rows) ---
__global__ void attentionScaleRowsKernel(RowParams p, float* __restrict__ probs, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        float* P = probsRow(p, probs, rowInfo(p, ro));
        for (int j = lane; j < p.skv; j += 32) P[j] *= p.scale;
    }
}

__global__ void attentionMaskRowsKernel(RowParams p, float* __restrict__ probs, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const RowInfo ri = rowInfo(p, ro);
        float* P = probsRow(p, probs, ri);
        for (int j = lane; j < p.skv; j += 32)
            if (j >= ri.n) P[j] = -INFINITY;
    }
}

// Softmax over the whole (masked) row: exp(-inf - max) = 0 gives the zero upper triangle.
__global__ void softmaxRowsKernel(RowParams p, float* __restrict__ probs, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        float* P = probsRow(p, probs, rowInfo(p, ro));
        float mx = -INFINITY;
        for (int j = lane; j < p.skv; j += 32) mx = fmaxf(mx, P[j]);
        mx = warpMax(mx);
        if (mx == -INFINITY) {  // nothing visible (only possible off the causal square)
            for (int j = lane; j < p.skv; j += 32) P[j] = 0.0f;
            continue;
        }
        double sum = 0.0;
        for (int j = lane; j < p.skv; j += 32) sum += expf(P[j] - mx);
        const float inv = static_cast<float>(1.0 / warpSumD(sum));
        for (int j = lane; j < p.skv; j += 32) P[j] = expf(P[j] - mx) * inv;
    }
}

// D[row] = dropout(P[row]) over the whole row (probs rows of the chunk -> workspace rows).
__global__ void dropoutRowsKernel(RowParams p, const float* __restrict__ probs, float* __restrict__ D,
                                  int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const RowInfo ri = rowInfo(p, ro);
        const float* P = probsRow(p, probs, ri);
        float* Dr = D + ro * p.skv;
        for (int j = lane; j < p.skv; j += 32) Dr[j] = dropValue(p, ri, ri.maskRow + j, P[j]);
    }
}

// dS[row] = dropout'(dS[row]) in place (workspace rows), the same keep bits.
__global__ void dropoutBackwardRowsKernel(RowParams p, float* __restrict__ dS, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const RowInfo ri = rowInfo(p, ro);
        float* dr = dS + ro * p.skv;
        for (int j = lane; j < p.skv; j += 32) dr[j] = dropValue(p, ri, ri.maskRow + j, dr[j]);
    }
}

// dS = P * (dP - rowsum(P * dP)) over whole rows; dS holds dP on entry (workspace rows).
__global__ void softmaxBackwardRowsKernel(RowParams p, const float* __restrict__ probs,
                                          float* __restrict__ dS, int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const float* P = probsRow(p, probs, rowInfo(p, ro));
        float* dr = dS + ro * p.skv;
        double dot = 0.0;
        for (int j = lane; j < p.skv; j += 32) dot += static_cast<double>(P[j]) * dr[j];
        const float dt = static_cast<float>(warpSumD(dot));
        for (int j = lane; j < p.skv; j += 32) dr[j] = P[j] * (dr[j] - dt);
    }
}

// Fused backward row: dS holds dO.V^T on entry. With dropout mask M (scaled): dP = M*dS,
// Pd = M*P (when Pd is set); then dS = P * (dP - rowsum(P*dP)); zeros past the visible keys.
__global__ void fusedSoftmaxBackwardRowsKernel(RowParams p, const float* __restrict__ probs,
                                               float* __restrict__ dS, float* __restrict__ Pd,
                                               int64_t rows) {
    const int lane = threadIdx.x % 32;
    TS_FOR_EACH_WARP_ROW(ro, rows) {
        const RowInfo ri = rowInfo(p, ro);
        const float* P = probsRow(p, probs, ri);
        float* dr = dS + ro * p.skv;
        float* pdr = Pd ? Pd + ro * p.skv : nullptr;
        uint16_t* pdb = pdr && p.dropBits ? p.dropBits + ro * p.skv : nullptr;
        double dot = 0.0;
        for (int j = lane; j < p.skv; j += 32) {
            if (j >= ri.n) {
                if (pdr) pdr[j] = 0.0f;
                if (pdb) pdb[j] = 0;
                continue;
            }
            float dp = dr[j];
            if (p.rng.on) {
                const float m = keepFactor(p, ri, ri.maskRow + j);
                dp *= m;
                dr[j] = dp;
                if (pdr) pdr[j] = P[j] * m;
                if (pdb) pdb[j] = hd::bf16FromFloat(pdr[j]);
            }
            dot += static_cast<double>(P[j]) * dp;
        }
        // each lane re-reads only the elements it wrote above: no synchronisation needed
        const float dt = static_cast<float>(warpSumD(dot));
        uint16_t* db = p.dsBits ? p.dsBits + ro * p.skv : nullptr;
        for (int j = lane; j < p.skv; j += 32) {
            const float ds = j < ri.n ? P[j] * (dr[j] - dt) : 0.0f;
            dr[j] = ds;
            if (db) db[j] = hd::bf16FromFloat(ds);
        }
    }
}

#undef TS_FOR_EACH_WARP_ROW

int rowBlocks(int64_t rows) { return blocksFor(rows, kWarps, 65535 * 8); }

Status validate(const AttnGeom& g, const char* what) {
    if (g.sq < 0 || g.skv < 0 || g.b < 0 || g.nq < 0 || g.nkv < 0 || g.d < 0)
        return Status::invalid(std::string(what) + ": negative dimension");
    if (g.nkv == 0 || g.nq % g.nkv != 0)
        return Status::invalid(std::string(what) + ": the query heads (" + std::to_string(g.nq) +
                               ") must be a multiple of the key/value heads (" +
                               std::to_string(g.nkv) + ")");
    if (!g.qPos && g.sq != g.skv)
        return Status::internal(std::string(what) + ": causal square with sq != skv");
    return Status::ok();
}

RowParams rowParams(const AttnGeom& g, const HeadChunk& ch) {
    RowParams p;
    p.ch = ch;
    p.nq = g.nq;
    p.sq = g.sq;
    p.skv = g.skv;
    p.qPos = g.qPos;
    p.scale = g.scale;
    p.rng = DropoutRng::make(g.dropout, g.seed);
    p.nqTotal = g.nqTotal;
    p.headOffset = g.headOffset;
    p.sTotal = g.sTotal;
    return p;
}

// gemmStridedBatched on `stream`, as kernels/common/causal_gemms.h calls it.
struct StreamGemm {
    void* stream;
    Status operator()(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, int64_t sA,
                      const float* B, int ldb, int64_t sB, float beta, float* C, int ldc, int64_t sC,
                      int batch) const {
        return gemmStridedBatched(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch, stream);
    }
};

// Pointers of one chunk: the first head's [sq, d] / [skv, d] views and [sq, skv] probs.
struct ChunkViews {
    int64_t qOff, kOff, pOff;  // element offsets into q/out/dout/dq, k/v/dk/dv, probs
    ChunkViews(const AttnGeom& g, const HeadChunk& ch)
        : qOff(ch.head(0) * g.d),
          kOff(ch.i0 * g.d),
          pOff(ch.head(0) * static_cast<int64_t>(g.sq) * g.skv) {}
};

}  // namespace

Status maskedAttentionForward(const AttnGeom& g, const float* q, const float* k, const float* v,
                              float* probs, float* out, bool fused, const char* what,
                              void* stream, float* stats) {
    TS_RETURN_IF_ERROR(validate(g, what));
    if (g.sq == 0 || g.b == 0 || g.nq == 0 || g.d == 0) return Status::ok();
    const cudaStream_t st = asStream(stream);
    if (g.skv == 0) {  // no keys (only possible with qPos): out = 0, as the CPU's empty rows
        const int64_t outElems = static_cast<int64_t>(g.sq) * g.b * g.nq * g.d;
        return fromCuda(cudaMemsetAsync(out, 0, sizeof(float) * outElems, st), what);
    }
    if (stats && bf16Gemms() && flashTiles() && flashTilesApply(g))
        return flashTiledForward(g, q, k, v, out, stats, what, stream);
    const int rep = g.nq / g.nkv;
    const int64_t groups = static_cast<int64_t>(g.b) * g.nkv;
    const int64_t ss = static_cast<int64_t>(g.sq) * g.skv;
    const int ldq = g.b * g.nq * g.d, ldk = g.b * g.nkv * g.d;
    const bool drop = g.dropout > 0.0f;
    const bool flash = stats != nullptr;  // the chunk's probabilities in the workspace only
    if (flash) fused = true;
    const int64_t perHead = (flash ? ss : 0) + (drop ? ss : 0);
    int chunk = chunkHeads(groups, sizeof(float) * perHead);
    StreamWorkspace ws(stream);
    if (perHead > 0) {
        // Fewer heads at a time while the memory is short, down to one head.
        for (;;) {
            const Status got = ws.allocate(sizeof(float) * perHead * chunk, (std::string(what) + ": workspace").c_str());
            if (got.isOk()) break;
            if (chunk == 1) return got;
            chunk = (chunk + 1) / 2;
        }
    }
    float* Pw = flash ? static_cast<float*>(ws.get()) : nullptr;
    float* D = drop ? static_cast<float*>(ws.get()) + (flash ? chunk * ss : 0) : nullptr;
    // bf16 GEMMs: q, k, v in bf16 once per call, and the fused row kernel writes the bits of the
    // chunk's probabilities and dropout(P) next to them (a GEMM converts its operand's whole
    // strided span per call: the whole tensor for every chunk).
    Bf16Twin tq(stream), tk(stream), tv(stream), tP(stream), tD(stream);
    if (bf16Gemms()) {  // where a twin cannot be made, the GEMMs convert per call as without
        tq.cover(q, int64_t(g.sq) * ldq, true);
        tk.cover(k, int64_t(g.skv) * ldk, true);
        tv.cover(v, int64_t(g.skv) * ldk, true);
        if (flash && !drop) tP.cover(Pw, chunk * ss, false);  // with dropout .V reads D
        if (fused && drop) tD.cover(D, chunk * ss, false);
    }
    // kernels/common/causal_gemms.h. Not with bf16 GEMMs: on an H200 (1.3B GPT, s = 2048) the
    // blocks' smaller bf16 GEMMs took longer than the full squares (37.0 against 33.5 ms of GEMMs
    // per step), where the fp32 GEMMs gain from skipping half the square.
    const bool causalBlocks = fused && !g.qPos && !bf16Gemms();
    for (int j = 0; j < rep; ++j) {
        for (int64_t i0 = 0; i0 < groups; i0 += chunk) {
            HeadChunk ch;
            ch.i0 = i0;
            ch.count = static_cast<int>(std::min<int64_t>(chunk, groups - i0));
            ch.rep = rep;
            ch.j = j;
            const ChunkViews cv(g, ch);
            RowParams rp = rowParams(g, ch);
            rp.localProbs = flash;
            rp.stats = stats;
            rp.probsBits = tP.bits();
            rp.dropBits = tD.bits();
            const int64_t rows = static_cast<int64_t>(ch.count) * g.sq;
            float* Pc = flash ? Pw : probs + cv.pOff;  // the chunk's first head's probabilities
            const int64_t pStride = flash ? ss : rep * ss;
            // probs = (scale) Q K^T; the fused square in causal row blocks (the row kernel reads
            // only the visible keys and writes whole rows)
            if (causalBlocks)
                TS_RETURN_IF_ERROR(causal::rowsTimesKeysT(StreamGemm{stream}, g.sq, g.d, g.scale, q + cv.qOff, ldq,
                                                          static_cast<int64_t>(rep) * g.d, k + cv.kOff, ldk, g.d, Pc,
                                                          pStride, ch.count));
            else
                TS_RETURN_IF_ERROR(gemmStridedBatched(false, true, g.sq, g.skv, g.d, fused ? g.scale : 1.0f,
                                                      q + cv.qOff, ldq, static_cast<int64_t>(rep) * g.d,
                                                      k + cv.kOff, ldk, g.d, 0.0f, Pc, g.skv,
                                                      pStride, ch.count, stream));
            if (fused) {
                fusedSoftmaxRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, flash ? Pw : probs, D, rows);
                TS_RETURN_IF_ERROR(launchStatus(what));
            } else {
                attentionScaleRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, probs, rows);
                TS_RETURN_IF_ERROR(launchStatus(what));
                attentionMaskRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, probs, rows);
                TS_RETURN_IF_ERROR(launchStatus(what));
                softmaxRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, probs, rows);
                TS_RETURN_IF_ERROR(launchStatus(what));
                if (drop) {
                    dropoutRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, probs, D, rows);
                    TS_RETURN_IF_ERROR(launchStatus(what));
                }
            }
            // out = dropout(P) V
            const float* A = drop ? D : Pc;
            if (causalBlocks)
                TS_RETURN_IF_ERROR(causal::rowsTimesKeys(StreamGemm{stream}, g.sq, g.d, 1.0f, A, drop ? ss : pStride,
                                                         v + cv.kOff, ldk, g.d, out + cv.qOff, ldq,
                                                         static_cast<int64_t>(rep) * g.d, ch.count));
            else
                TS_RETURN_IF_ERROR(gemmStridedBatched(false, false, g.sq, g.d, g.skv, 1.0f, A, g.skv,
                                                      drop ? ss : pStride, v + cv.kOff, ldk, g.d, 0.0f,
                                                      out + cv.qOff, ldq, static_cast<int64_t>(rep) * g.d,
                                                      ch.count, stream));
        }
    }
    return Status::ok();
}

Status maskedAttentionBackward(const AttnGeom& g, const float* q, const float* k, const float* v,
                               const float* probs, const float* dout, float* dq, float* dk,
                               float* dv, float* scratch, size_t scratchFloats, bool fused,
                               const char* what, void* stream, const float* stats) {
    TS_RETURN_IF_ERROR(validate(g, what));
    if (g.b == 0 || g.nq == 0 || g.d == 0) return Status::ok();
    const cudaStream_t st = asStream(stream);
    if (g.skv == 0) {  // no keys (only possible with qPos): dq = 0, as the CPU overwrites it
        const int64_t qElems = static_cast<int64_t>(g.sq) * g.b * g.nq * g.d;
        if (qElems == 0) return Status::ok();
        return fromCuda(cudaMemsetAsync(dq, 0, sizeof(float) * qElems, st), what);
    }
    const int64_t kvElems = static_cast<int64_t>(g.skv) * g.b * g.nkv * g.d;
    if (g.sq == 0) {  // no query rows: this rank's dk, dv contribution is zero
        TS_RETURN_IF_ERROR(fromCuda(cudaMemsetAsync(dk, 0, sizeof(float) * kvElems, st), what));
        return fromCuda(cudaMemsetAsync(dv, 0, sizeof(float) * kvElems, st), what);
    }
    if (stats && bf16Gemms() && flashTiles() && flashTilesApply(g))
        return flashTiledBackward(g, q, k, v, stats, dout, dq, dk, dv, what, stream);
    const int rep = g.nq / g.nkv;
    const int64_t groups = static_cast<int64_t>(g.b) * g.nkv;
    const int64_t ss = static_cast<int64_t>(g.sq) * g.skv;
    const int ldq = g.b * g.nq * g.d, ldk = g.b * g.nkv * g.d;
    const bool drop = g.dropout > 0.0f;
    const bool flash = stats != nullptr;  // the probabilities rebuilt per chunk from the stats
    if (flash) fused = true;
    const int64_t perHead = (drop ? 2 * ss : ss) + (flash ? ss : 0);  // dS (+ dropout(P)) (+ P)
    int chunk = chunkHeads(groups, sizeof(float) * perHead);
    float* buf = nullptr;
    StreamWorkspace ws(stream);
    const bool scratchFits = scratch && scratchFloats >= static_cast<size_t>(perHead);
    if (chunk == 1 && scratchFits) {
        buf = scratch;
    } else {
        const Status got = ws.allocate(sizeof(float) * perHead * chunk,
                                       (std::string(what) + ": workspace").c_str());
        if (got.isOk()) {
            buf = static_cast<float*>(ws.get());
        } else if (scratchFits) {
            chunk = 1;
            buf = scratch;
        } else {
            return got;
        }
    }
    float* dS = buf;                                            // [chunk, sq, skv]
    float* Pd = drop ? buf + static_cast<int64_t>(chunk) * ss : nullptr;  // [chunk, sq, skv]
    float* Pw = flash ? buf + static_cast<int64_t>(chunk) * ss * (drop ? 2 : 1) : nullptr;
    // bf16 GEMMs (see the forward): q, k, v, dout converted once; the fused row kernels write the
    // bits of the rebuilt probabilities, dropout(P) and dS, the operands of the GEMMs after them.
    Bf16Twin tq(stream), tk(stream), tv(stream), tdo(stream), tP(stream), tPd(stream), tdS(stream);
    if (bf16Gemms()) {  // where a twin cannot be made, the GEMMs convert per call as without
        tq.cover(q, int64_t(g.sq) * ldq, true);
        tk.cover(k, int64_t(g.skv) * ldk, true);
        tv.cover(v, int64_t(g.skv) * ldk, true);
        tdo.cover(dout, int64_t(g.sq) * ldq, true);
        if (flash && !drop) tP.cover(Pw, chunk * ss, false);  // with dropout dV reads Pd
        if (fused && drop) tPd.cover(Pd, chunk * ss, false);
        if (fused) tdS.cover(dS, chunk * ss, false);
    }
    // The fused square's GEMMs in causal row blocks: every row kernel reads only the visible keys
    // and writes whole rows (zeros past them), so what the blocks skip is never read. Not with
    // bf16 GEMMs (see the forward).
    const bool causalBlocks = fused && !g.qPos && !bf16Gemms();
    const StreamGemm sg{stream};
    for (int j = 0; j < rep; ++j) {
        const float beta = j == 0 ? 0.0f : 1.0f;  // the group's first query head overwrites dK/dV
        for (int64_t i0 = 0; i0 < groups; i0 += chunk) {
            HeadChunk ch;
            ch.i0 = i0;
            ch.count = static_cast<int>(std::min<int64_t>(chunk, groups - i0));
            ch.rep = rep;
            ch.j = j;
            const ChunkViews cv(g, ch);
            RowParams rp = rowParams(g, ch);
            rp.localProbs = flash;
            rp.stats = const_cast<float*>(stats);  // read only here
            rp.probsBits = tP.bits();
            rp.dropBits = tPd.bits();
            rp.dsBits = tdS.bits();
            const int64_t rows = static_cast<int64_t>(ch.count) * g.sq;
            const int64_t qStride = static_cast<int64_t>(rep) * g.d;
            if (flash) {  // P = exp(scale Q K^T - max) * inv, as the forward had it
                if (causalBlocks)
                    TS_RETURN_IF_ERROR(causal::rowsTimesKeysT(sg, g.sq, g.d, g.scale, q + cv.qOff, ldq, qStride,
                                                              k + cv.kOff, ldk, g.d, Pw, ss, ch.count));
                else
                    TS_RETURN_IF_ERROR(gemmStridedBatched(false, true, g.sq, g.skv, g.d, g.scale, q + cv.qOff, ldq,
                                                          qStride, k + cv.kOff, ldk, g.d, 0.0f, Pw, g.skv, ss,
                                                          ch.count, stream));
                softmaxFromStatsRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, Pw, rows);
                TS_RETURN_IF_ERROR(launchStatus(what));
            }
            const float* rowProbs = flash ? Pw : probs;  // what the row kernels index
            const float* P = flash ? Pw : probs + cv.pOff;
            const float* PV = drop ? Pd : P;  // what multiplied V in forward
            const int64_t pvStride = drop || flash ? ss : rep * ss;
            auto dvGemm = [&] {  // dV (+)= dropout(P)^T dO
                if (causalBlocks)
                    return causal::keysTimesRows(sg, g.sq, g.d, 1.0f, PV, pvStride, dout + cv.qOff, ldq, qStride, beta,
                                                 dv + cv.kOff, ldk, g.d, ch.count);
                return gemmStridedBatched(true, false, g.skv, g.d, g.sq, 1.0f, PV, g.skv, pvStride,
                                          dout + cv.qOff, ldq, qStride, beta, dv + cv.kOff, ldk, g.d,
                                          ch.count, stream);
            };
            auto dsGemm = [&] {  // dS = dO V^T
                if (causalBlocks)
                    return causal::rowsTimesKeysT(sg, g.sq, g.d, 1.0f, dout + cv.qOff, ldq, qStride, v + cv.kOff, ldk,
                                                  g.d, dS, ss, ch.count);
                return gemmStridedBatched(false, true, g.sq, g.skv, g.d, 1.0f, dout + cv.qOff, ldq,
                                          qStride, v + cv.kOff, ldk, g.d, 0.0f, dS, g.skv, ss,
                                          ch.count, stream);
            };
            if (!fused) {
                if (drop) {
                    dropoutRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, probs, Pd, rows);
                    TS_RETURN_IF_ERROR(launchStatus(what));
                }
                TS_RETURN_IF_ERROR(dvGemm());
                TS_RETURN_IF_ERROR(dsGemm());
                if (drop) {
                    dropoutBackwardRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, dS, rows);
                    TS_RETURN_IF_ERROR(launchStatus(what));
                }
                softmaxBackwardRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, probs, dS, rows);
                TS_RETURN_IF_ERROR(launchStatus(what));
            } else {
                TS_RETURN_IF_ERROR(dsGemm());
                fusedSoftmaxBackwardRowsKernel<<<rowBlocks(rows), kThreads, 0, st>>>(rp, rowProbs, dS, Pd,
                                                                                    rows);
                TS_RETURN_IF_ERROR(launchStatus(what));
            }
            if (causalBlocks) {
                TS_RETURN_IF_ERROR(causal::rowsTimesKeys(sg, g.sq, g.d, g.scale, dS, ss, k + cv.kOff, ldk, g.d,
                                                         dq + cv.qOff, ldq, qStride, ch.count));
                TS_RETURN_IF_ERROR(causal::keysTimesRows(sg, g.sq, g.d, g.scale, dS, ss, q + cv.qOff, ldq, qStride, beta,
                                                         dk + cv.kOff, ldk, g.d, ch.count));
            } else {
                // dQ = scale dS K (overwritten per head)
                TS_RETURN_IF_ERROR(gemmStridedBatched(false, false, g.sq, g.d, g.skv, g.scale, dS, g.skv, ss,
                                                      k + cv.kOff, ldk, g.d, 0.0f, dq + cv.qOff, ldq,
                                                      qStride, ch.count, stream));
                // dK (+)= scale dS^T Q
                TS_RETURN_IF_ERROR(gemmStridedBatched(true, false, g.skv, g.d, g.sq, g.scale, dS, g.skv, ss,
                                                      q + cv.qOff, ldq, qStride, beta, dk + cv.kOff, ldk,
                                                      g.d, ch.count, stream));
            }
            if (fused) TS_RETURN_IF_ERROR(dvGemm());
        }
    }
    return Status::ok();
}

}  // namespace detail

namespace {

detail::AttnGeom squareGeom(const AttnDims& dims) {
    detail::AttnGeom g;
    g.sq = g.skv = dims.s;
    g.b = dims.b;
    g.nq = dims.nq;
    g.nkv = dims.nkv;
    g.d = dims.d;
    g.scale = dims.scale;
    g.dropout = dims.dropout;
    g.seed = dims.dropoutSeed;
    g.headOffset = dims.headOffset;
    g.nqTotal = dims.nqTotal > 0 ? dims.nqTotal : dims.nq;
    g.sTotal = dims.s;  // the square numbers its mask over [s, s] per head
    return g;
}

// kernels::cpu::attentionScratchSize / attentionFlashScratchSize (the CPU library is not
// linked into this one).
size_t cpuScratchFloats(const AttnDims& dims, bool flash = false) {
    const size_t ss = static_cast<size_t>(dims.s) * dims.s;
    return (dims.dropout > 0.0f ? 2 * ss : ss) + (flash ? ss : 0);
}

}  // namespace

Status attentionForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                        float* probs, float* out, bool fusedSoftmax, void* stream) {
    return detail::maskedAttentionForward(squareGeom(dims), q, k, v, probs, out, fusedSoftmax,
                                          "attentionForward", stream);
}

Status attentionBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                         const float* probs, const float* dout, float* dq, float* dk, float* dv,
                         float* scratch, bool fusedSoftmax, void* stream) {
    return detail::maskedAttentionBackward(squareGeom(dims), q, k, v, probs, dout, dq, dk, dv,
                                           scratch, cpuScratchFloats(dims),
                                           fusedSoftmax, "attentionBackward", stream);
}

Status attentionFlashForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                             float* stats, float* out, void* stream) {
    if (!stats) return Status::invalid("attentionFlashForward: no stats buffer");
    return detail::maskedAttentionForward(squareGeom(dims), q, k, v, nullptr, out, true,
                                          "attentionFlashForward", stream, stats);
}

Status attentionFlashBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                              const float* stats, const float* dout, float* dq, float* dk,
                              float* dv, float* scratch, void* stream) {
    if (!stats) return Status::invalid("attentionFlashBackward: no stats buffer");
    return detail::maskedAttentionBackward(squareGeom(dims), q, k, v, nullptr, dout, dq, dk, dv,
                                           scratch, cpuScratchFloats(dims, true), true,
                                           "attentionFlashBackward", stream, stats);
}

}  // namespace ts::kernels::cuda
