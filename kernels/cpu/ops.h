// CPU kernels: the numerical reference (oracle) for every backend. Plain functions over
// contiguous row-major float arrays; no engine types. Each op has a forward and a backward.
// Activations are sequence-first as in Megatron: a token index is t = s_idx * b + b_idx and a
// [T, C] array is [s, b, C] flattened (T = s*b). Backward functions that produce parameter
// gradients ACCUMULATE into them (+=), so the caller zeroes grads once per step; gradients
// w.r.t. activations are OVERWRITTEN unless the comment says otherwise.
// Threading: GEMMs use OpenBLAS (threads set with setNumThreads); other loops are
// single-threaded per call unless noted (ranks are parallel on their own threads).
// openblas_set_num_threads is process-global. Debian's libopenblas0-pthread serialises
// concurrent *multithreaded* level-3 calls (one level3_lock in the threaded GEMM driver);
// in 1-thread mode each call runs on its caller's thread without that lock, so an engine
// that runs several rank threads should setNumThreads(1). See docs/kernels.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/dropout_rng.h"

namespace ts::kernels::cpu {

// --- runtime ---------------------------------------------------------------------------
// Threads used by GEMM (OpenBLAS) for calls made from now on; 0 = library default.
void setNumThreads(int n);
int numThreads();
// Times square sgemm with `threads` OpenBLAS threads for about `seconds` (after an untimed
// warm-up) and returns the best GFLOP/s of any single call (2m^3 flops per call). Sizes: n, and
// also 2n when threads > 1 (multi-threaded calls need more work per call to reach the peak).
// Restores the previous thread count afterwards.
double measureSgemmPeakGflops(int threads, int n = 1024, double seconds = 0.5);

// --- GEMM -------------------------------------------------------------------------------
// C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C, row-major, leading dims in elements.
void gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
// Strided-batched GEMM: for i < batch: C_i = alpha op(A_i) op(B_i) + beta C_i,
// X_i = X + i*strideX.
void gemmStridedBatched(bool transA, bool transB, int M, int N, int K, float alpha,
                        const float* A, int lda, int64_t strideA, const float* B, int ldb,
                        int64_t strideB, float beta, float* C, int ldc, int64_t strideC,
                        int batch);

// --- Linear (y = x W^T + b), Megatron's weight layout W[out, in] --------------------------
// x: [T, in], W: [out, in], b: [out] or null, y: [T, out]
void linearForward(const float* x, const float* W, const float* b, float* y, int T, int in,
                   int out);
// dx: [T, in] (overwritten; may be null to skip dgrad)
// dW: [out, in] (+=; may be null), db: [out] (+=; may be null)
void linearBackward(const float* dy, const float* x, const float* W, float* dx, float* dW,
                    float* db, int T, int in, int out);

// --- Grouped linear (the MoE experts' GEMMs: TE's GroupedLinear, Megatron's TEGroupedMLP) --
// G linear layers over consecutive row groups of one buffer: group g is rows [off[g], off[g+1])
// of x [off[G], in] (row offsets from x, not from off[0]), multiplied by its own W[g] [out, in]
// (+ b[g] where b and b[g] are given) into the same rows of y [off[G], out]. off, W, b, dW and db
// are host arrays of G (+1) entries; the pointers in them point where x does (device memory on
// CUDA). The offsets ascend (CUDA refuses others; here a group whose offsets do not ascend is
// skipped, as one without rows, whose dW[g] and db[g] stay untouched). Each group's results are
// linearForward's / linearBackward's on its rows.
void linearForwardGrouped(const float* x, const float* const* W, const float* const* b, float* y, const int* off,
                          int G, int in, int out);
// dx: the groups' rows overwritten (null: no dgrad); dW[g] +=, db[g] += (null arrays or entries:
// skipped).
void linearBackwardGrouped(const float* dy, const float* x, const float* const* W, float* dx, float* const* dW,
                           float* const* db, const int* off, int G, int in, int out);

// --- Embedding (vocab-parallel aware) ---------------------------------------------------
// table: [vocabEnd - vocabStart, C] holds rows [vocabStart, vocabEnd) of the full table.
// Tokens outside the range produce zero rows (summed across TP ranks by the caller).
// ids: [T], out: [T, C] (overwritten). Returns the number of ids that are < 0 or >= vocabSize
// (the caller turns that into an error; such rows are zero).
int embeddingForward(const int32_t* ids, const float* table, float* out, int T, int C,
                     int vocabStart, int vocabEnd, int vocabSize);
// The same lookup without the count (the engine's: its data loader validated the ids), from an
// fp32 table or from a bf16 model copy's bits (the rows' exact values, no fp32 copy of the table).
void embeddingLookup(const int32_t* ids, const float* table, float* out, int T, int C, int vocabStart,
                     int vocabEnd, int vocabSize);
void embeddingLookupBf16(const int32_t* ids, const uint16_t* table, float* out, int T, int C,
                         int vocabStart, int vocabEnd, int vocabSize);
// dtable (+=) rows of owned tokens.
void embeddingBackward(const int32_t* ids, const float* dout, float* dtable, int T, int C,
                       int vocabStart, int vocabEnd);
// Learned absolute position embedding on sequence-first rows (row = i*b + j is position i):
// forward out[i*b+j, :] += table[i, :]; backward dtable[i, :] += sum_j dout[i*b+j, :].
void positionEmbeddingForward(const float* table, float* out, int s, int b, int C);
void positionEmbeddingForwardBf16(const uint16_t* table, float* out, int s, int b, int C);  // bf16 bits
void positionEmbeddingBackward(const float* dout, float* dtable, int s, int b, int C);

// --- Norms ------------------------------------------------------------------------------
// x, y: [T, C]; w, b: [C]; mean, rstd: [T] saved for backward. b may be null (no bias).
// roundBf16 (here and in the activations and bias-dropout-add below): the output tensor (y;
// the backward's dx) is written as bf16 values in the same pass, what roundToBf16 over it after
// the call gives (a bf16 model's activations: its kernels write bf16); the statistics, the
// parameter gradients and the masks stay as they are.
void layerNormForward(const float* x, const float* w, const float* b, float* y, float* mean,
                      float* rstd, int T, int C, float eps, bool roundBf16 = false);
// dx (overwritten), dw (+=), db (+=, may be null)
void layerNormBackward(const float* dy, const float* x, const float* w, const float* mean,
                       const float* rstd, float* dx, float* dw, float* db, int T, int C, bool roundBf16 = false);
// "persist_layer_norm"/fused LN: one statistics pass over the row (shifted sums),
// same results as the unfused path to ~1e-6.
void layerNormForwardFused(const float* x, const float* w, const float* b, float* y,
                           float* mean, float* rstd, int T, int C, float eps, bool roundBf16 = false);
void layerNormBackwardFused(const float* dy, const float* x, const float* w, const float* mean,
                            const float* rstd, float* dx, float* dw, float* db, int T, int C,
                            bool roundBf16 = false);
// RMSNorm: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). rstd: [T]
void rmsNormForward(const float* x, const float* w, float* y, float* rstd, int T, int C,
                    float eps, bool roundBf16 = false);
void rmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd,
                     float* dx, float* dw, int T, int C, bool roundBf16 = false);

// --- Rotary position embedding (rotate-half / GPT-NeoX style, as Megatron's default) -----
// x: [s, b, n, d] in place; rotary dim = d (full head dim), inv_freq_i = theta^(-2i/d).
// position of row s_idx is posOffset + s_idx (posOffset for sequence/context shards).
// Unfused: builds cos/sin tables and applies them in separate passes (as the PyTorch
// reference); fused: one pass computing the rotation in place ("apply_rope_fusion").
void ropeForward(float* x, int s, int b, int n, int d, float theta, int posOffset);
void ropeForwardFused(float* x, int s, int b, int n, int d, float theta, int posOffset);
// Backward = rotation by -angle, in place on dx.
void ropeBackward(float* dx, int s, int b, int n, int d, float theta, int posOffset);
// The QKV layout copies around core attention fused with the rotation (one pass instead of
// copy + in-place rope): qkv: [s, b, ng, nq/ng + 2, d] (per group: its query heads, k, v), as
// the linear_qkv GEMM writes it; q: [s, b, nq, d], k, v: [s, b, ng, d]. Forward:
// q, k = rope(split(qkv)), v = split(qkv); backward: dqkv = merge(rope^-1(dq), rope^-1(dk), dv).
// Bitwise equal to the split/merge copies with ropeForwardFused / ropeBackward in place.
// roundBf16: q and k (the rotated heads) stored as bf16 values, as the norms' flag (v is copied).
void splitQkvRopeForward(const float* qkv, float* q, float* k, float* v, int s, int b, int nq,
                         int ng, int d, float theta, int posOffset, bool roundBf16 = false);
// The same layout copies without a rotation (rope off, or apply_rope_fusion off): T tokens.
void splitQkv(const float* qkv, float* q, float* k, float* v, int T, int nq, int ng, int d);
void mergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int T, int nq, int ng, int d);
void ropeBackwardMergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int s,
                          int b, int nq, int ng, int d, float theta, int posOffset);

// --- Core attention (causal, GQA) -------------------------------------------------------
struct AttnDims {
    int s = 0;    // sequence length (local, full sequence for the attention itself)
    int b = 0;    // micro batch
    int nq = 0;   // query heads (local to the TP rank)
    int nkv = 0;  // key/value heads (query groups), nq % nkv == 0
    int d = 0;    // head dim
    float scale = 0;  // softmax scale, usually 1/sqrt(d)
    // Attention dropout on the probabilities (after softmax, before .V), Megatron's
    // attention_dropout. Keep element (bi, head, r, c) iff dropout-mask element
    // ((bi*nqTotal + headOffset + head)*s + r)*s + c of stream `dropoutSeed` keeps (see
    // dropoutMask), so a TP rank holding heads [headOffset, headOffset+nq) of nqTotal draws
    // exactly the single-device mask of its heads. nqTotal = 0 means nq. The seed is resolved
    // (DropoutSeed::value) when the kernel runs.
    float dropout = 0;
    hd::DropoutSeed dropoutSeed;
    int headOffset = 0;
    int nqTotal = 0;
};
// q: [s, b, nq, d], k, v: [s, b, nkv, d]; probs: [b, nq, s, s] (saved for backward: the
// softmax BEFORE dropout, causal upper triangle is 0); out: [s, b, nq, d] = dropout(P) V.
// fusedSoftmax=false: scores = scale*QK^T, then mask, then softmax, then dropout as separate
// passes; true: "masked_softmax_fusion" scale+causal-mask+softmax(+dropout) in one pass per
// row. With dropout the mask is not stored: backward regenerates it from dims.
void attentionForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                      float* probs, float* out, bool fusedSoftmax);
// dq: [s,b,nq,d], dk, dv: [s,b,nkv,d] all overwritten.
// scratch: at least attentionScratchSize(dims) floats.
// fusedSoftmax=true: every GEMM restricted to the causal 6x16 tiles, the softmax (and
// dropout) backward fused per row; false: the naive path matching the unfused forward (full
// s x s GEMMs, dropout and softmax backward as separate passes over the whole head).
void attentionBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                       const float* probs, const float* dout, float* dq, float* dk, float* dv,
                       float* scratch, bool fusedSoftmax = true);
// Flash attention (attention_backend flash, fused, auto): the same causal attention as the
// fused path above without keeping anything of size s x s between forward and backward. The
// forward writes out and, per query row, two floats into stats [b, nq, s, 2]: the row's maximum
// scaled score m and the reciprocal of its softmax denominator; the backward recomputes each
// head's probabilities from q, k and those stats, P = exp(score - m) * inv, the very bits the
// forward used (same GEMM tiles, same exp), so flash equals the fused path bit for bit. On the
// CPU the backward rebuilds one head at a time in scratch (attentionFlashScratchSize floats:
// P and dS, and dropout(P) with dropout), which is workspace, not a saved activation.
void attentionFlashForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                           float* stats, float* out);
void attentionFlashBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                            const float* stats, const float* dout, float* dq, float* dk,
                            float* dv, float* scratch);
size_t attentionStatsSize(const AttnDims& dims);         // 2*b*nq*s
size_t attentionFlashScratchSize(const AttnDims& dims);  // 2*s*s, 3*s*s with dropout

// Context parallel (attention_cp.cpp): sq local query rows [sq, b, nq, d] with global
// positions qPos[sq] against the whole sequence's keys/values [skv, b, nkv, d] in global order;
// key j visible iff j <= qPos[i]. probs: [b, nq, sq, skv] (the softmax before dropout).
// Backward overwrites dq [sq,...] and the full-length dk, dv [skv,...] (this rank's
// contribution; the owners sum them).
// Attention dropout (dropout > 0) draws the single device's mask (see AttnDims): the element of
// (bi, head, query, key) is ((bi*nqTotal + headOffset + head)*sTotal + qPos)*sTotal + kPos with
// GLOBAL positions, so every CP layout keeps and drops exactly what the cp=1 run does.
// nqTotal = 0 means nq, sTotal = 0 means skv.
struct CpAttnDims {
    int sq = 0, skv = 0, b = 0, nq = 0, nkv = 0, d = 0;
    float scale = 0;
    float dropout = 0;
    hd::DropoutSeed dropoutSeed;
    int headOffset = 0;
    int nqTotal = 0;
    int sTotal = 0;
};
void cpAttentionForward(const CpAttnDims& dims, const int* qPos, const float* q, const float* k, const float* v,
                        float* probs, float* out);
void cpAttentionBackward(const CpAttnDims& dims, const int* qPos, const float* q, const float* k, const float* v,
                         const float* probs, const float* dout, float* dq, float* dk, float* dv);
// Ring attention (cp_comm_type=p2p; attention_cp.cpp): the local query rows q [sq, b, nq, d]
// (global positions qPos) against ONE block of keys/values k, v [skv, b, nkv, d] whose rows
// have global positions kPos (ascending); key j is visible to query i iff kPos[j] <= qPos[i]. Nothing of
// size sq x skv is kept: the forward merges the block into a running result with the
// log-sum-exp of each row's scaled scores, lse [b, nq, sq] (natural log of the softmax
// denominator): first=true starts it (a row with no visible key: out 0, lse -inf), first=false
// merges out = out*e^(lse-lse') + o_blk*e^(lse_blk-lse') with lse' = logaddexp(lse, lse_blk).
// With dropout the block's unnormalised probabilities are masked (and scaled by 1/(1-p)) before
// .V while lse keeps the undropped denominator, so the merged out is dropout(softmax(S)) V.
void cpRingAttentionForward(const CpAttnDims& dims, const int* qPos, const int* kPos, const float* q, const float* k,
                            const float* v, float* out, float* lse, bool first);
// delta [b, nq, sq] = rowsum(dout * out) per head (the softmax backward's correction term).
void cpRingAttentionDelta(const CpAttnDims& dims, const float* out, const float* dout, float* delta);
// Backward of one block from the FINAL out's lse and delta: P = exp(scale*qk - lse),
// dq += scale*dS k (accumulated), dk, dv [skv, b, nkv, d] overwritten with this block's
// gradient from these queries (dS = P (dout.v - delta)). With dropout (keep mask M, scaled by
// 1/(1-p)): dv += (P M) dout, dS = P (M dout.v - delta); delta = rowsum(dout*out) still.
void cpRingAttentionBackward(const CpAttnDims& dims, const int* qPos, const int* kPos, const float* q, const float* k,
                             const float* v, const float* lse, const float* delta, const float* dout, float* dq,
                             float* dk, float* dv);
size_t attentionProbsSize(const AttnDims& dims);    // elements of probs
size_t attentionScratchSize(const AttnDims& dims);  // s*s, 2*s*s with dropout

// --- Activations ------------------------------------------------------------------------
// Tanh-approximate GeLU (Megatron's bias_gelu): y = gelu(x + b). x, y: [T, C], b: [C]|null
void biasGeluForward(const float* x, const float* b, float* y, int T, int C, bool roundBf16 = false);
// Unfused: bias-add pass then gelu pass (needs y as scratch for x+b); a bf16 model rounds in a
// pass of its own (roundToBf16), as the unfused path's separate kernels do.
void biasGeluForwardUnfused(const float* x, const float* b, float* y, int T, int C);
// dx = dy * gelu'(x + b) (overwritten), db (+=, may be null)
void biasGeluBackward(const float* dy, const float* x, const float* b, float* dx, float* db,
                      int T, int C);
// SwiGLU: x: [T, 2F] laid out per row as [gate(F) | up(F)], y: [T, F] = silu(gate) * up.
void swigluForward(const float* x, float* y, int T, int F, bool roundBf16 = false);
void swigluBackward(const float* dy, const float* x, float* dx, int T, int F);

// --- Dropout / residual -----------------------------------------------------------------
// Counter-based RNG: the mask element i of a call is a pure function of (seed.value(), offset + i),
// so recompute reproduces it (seed: kernels/common/dropout_rng.h DropoutSeed, read at the call). keep prob = 1-p, kept values scaled by 1/(1-p).
// mask: [n] bytes (1 keep, 0 drop) written when non-null.
void dropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p, hd::DropoutSeed seed,
                    uint64_t offset);
void dropoutBackward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float p);
// Regenerates the mask dropoutForward(.., p, seed, offset) writes, without touching data
// (recompute of a slice, or a caller that skipped storing the mask).
void dropoutMask(uint8_t* mask, int64_t n, float p, hd::DropoutSeed seed, uint64_t offset);
// out = residual + dropout(x + b); b: [C]|null, x/residual/out: [T, C]; mask: [T*C]|null.
// Fused: one pass ("bias_dropout_fusion"); Unfused: bias add, dropout, add as three passes.
void biasDropoutAddFused(const float* x, const float* b, const float* residual, float* out,
                         uint8_t* mask, int T, int C, float p, hd::DropoutSeed seed, uint64_t offset,
                         bool roundBf16 = false);
void biasDropoutAddUnfused(const float* x, const float* b, const float* residual, float* out,
                           uint8_t* mask, int T, int C, float p, hd::DropoutSeed seed, uint64_t offset);
// dx = dropout'(dout) (overwritten), db += sum_t dx (may be null). dresidual = dout (caller).
void biasDropoutAddBackward(const float* dout, const uint8_t* mask, float* dx, float* db, int T,
                            int C, float p);

// --- Elementwise helpers ----------------------------------------------------------------
void add(const float* a, const float* b, float* y, int64_t n);          // y = a + b
void addInPlace(float* y, const float* x, int64_t n);                  // y += x
void scale(float* y, float alpha, int64_t n);                          // y *= alpha
void addBias(float* y, const float* b, int T, int C);                  // y[t,:] += b
void biasGradAccumulate(const float* dy, float* db, int T, int C);     // db += sum_t dy
double sumSquares(const float* x, int64_t n);                          // in double
// *acc += sumSquares(x, n), and *accAsFloat = float(*acc) when accAsFloat is set: a norm summed
// over several tensors where it stays (a device's memory), read back once.
void sumSquaresAccumulate(const float* x, int64_t n, double* acc, float* accAsFloat);
bool allFinite(const float* x, int64_t n);
// Number of ids outside [0, vocabSize) (token ids / CE targets); the caller turns it into an
// error. The CE functions treat such a target as "not owned" (no target term).
int countInvalidIds(const int32_t* ids, int T, int vocabSize);

// --- Cross entropy (vocab-parallel aware) ------------------------------------------------
// Logits [T, Vl] hold vocab columns [vStart, vStart+Vl) of the full vocab. The vocab-parallel
// path (Megatron cross_entropy.py) is three stages with an all-reduce after each, done by the
// caller: 1) rowMax -> all-reduce MAX; 2) targetLogit & sumExp (given the global max)
// -> all-reduce SUM each; 3) loss = log(sumExp) - targetLogit.
void crossEntropyRowMax(const float* logits, float* rowMax, int T, int Vl);
// targetLogit[t] = logits[t, target - vStart] - rowMax[t] if owned else 0;
// sumExp[t] = sum_j exp(logits[t,j] - rowMax[t]).
void crossEntropyStats(const float* logits, const int32_t* targets, const float* rowMax,
                       float* targetLogit, float* sumExp, int T, int Vl, int vStart);
// loss[t] = log(sumExp[t]) - targetLogit[t]
void crossEntropyLoss(const float* targetLogit, const float* sumExp, float* loss, int T);
// dlogits[t,j] = (softmax_j - [j == target]) * dloss[t], softmax from rowMax/sumExp.
// May run in place (dlogits == logits).
void crossEntropyBackward(const float* logits, const int32_t* targets, const float* rowMax,
                          const float* sumExp, const float* dloss, float* dlogits, int T, int Vl,
                          int vStart);
// Unfused single-partition reference: materializes softmax probs [T, V] (probs buffer) and
// loss from them (what a naive framework does).
void crossEntropyForwardUnfused(const float* logits, const int32_t* targets, float* probs,
                                float* loss, int T, int V);
void crossEntropyBackwardUnfused(const float* probs, const int32_t* targets, const float* dloss,
                                 float* dlogits, int T, int V);
// Fused ("cross_entropy_loss_fusion"), single partition: loss and dlogits (in place over
// logits, scaled by dloss[t]), no probs buffer: max, exp+sum and scale sweep each row while
// it is in cache, so memory sees the logits once (read) plus once (write).
void crossEntropyFused(float* logitsInGradOut, const int32_t* targets, const float* dloss,
                       float* loss, int T, int V);

// --- Optimizer --------------------------------------------------------------------------
struct AdamParams {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weightDecay = 0.0f;  // decoupled (AdamW), applied as p -= lr*wd*p
    int64_t step = 1;          // 1-based, for bias correction
    // The update uses g = grad * gradScale: global-norm clipping folded into the step (the
    // same float product as scaling the grads first, without a pass over them). 1 = none.
    float gradScale = 1.0f;
};
// PyTorch AdamW semantics (torch.optim.AdamW, amsgrad=False). bits (null: none) receives the
// new params' bf16 bits (floatToBf16 of param after the step), in the same pass.
void adamwStep(float* param, const float* grad, float* m, float* v, int64_t n,
               const AdamParams& hp, uint16_t* bits = nullptr);

// --- bf16 -------------------------------------------------------------------------------
// Round-to-nearest-even fp32 -> bf16 (NaN preserved), and back.
void floatToBf16(const float* x, uint16_t* y, int64_t n);
void bf16ToFloat(const uint16_t* x, float* y, int64_t n);
// Round fp32 values through bf16 in place (emulates bf16 storage of an fp32 buffer).
void roundToBf16(float* x, int64_t n);

// ---- FP8 emulation (fp8.cpp; REFERENCE.md §6.1) -------------------------------------------
enum class Fp8Format : uint8_t { E4M3 = 0, E5M2 };
float fp8Max(Fp8Format f);  // 448 (E4M3), 57344 (E5M2)
// fp32 -> code: round to nearest even, subnormals, finite overflow and +-inf saturate to +-max,
// NaN -> NaN. Code -> fp32 exactly.
uint8_t fp8Encode(float x, Fp8Format f);
float fp8Decode(uint8_t code, Fp8Format f);
// max |x| (NaN if any element is NaN).
float amaxOf(const float* x, int64_t n);
// Current (tensorwise) scaling from an amax where kernels see it (a buffer element, reduced over
// the ranks holding the tensor): a = *amax / divisor, scale = fp8Max / a (1 for a 0 or non-finite
// amax, the largest float on overflow), then fp8QuantizeDequantize with scale / divisor; the scale
// never comes back to the host. *observed = a when observed is not null.
void fp8QuantizeCurrent(const float* x, float* y, uint8_t* codes, int64_t n, const float* amax, float divisor,
                        Fp8Format f, float* observed);
// The scale fp8QuantizeCurrent quantizes with for that amax and divisor (scale / divisor above).
float fp8CurrentScale(float amax, float divisor, Fp8Format f);
// Delayed scaling's observation into an amax slot: *slot = max(*slot, amaxOf(x, n) / divisor),
// NaN sticking (either side NaN gives NaN), as Fp8Meta::observe does on the host.
void amaxAccumulate(const float* x, int64_t n, float divisor, float* slot);
// Delayed scaling from a scale where kernels see it (the step's, written there by the host before
// the step): fp8QuantizeDequantize with *scale / divisor, read when the kernel runs.
void fp8QuantizeDelayed(const float* x, float* y, uint8_t* codes, int64_t n, const float* scale, float divisor,
                        Fp8Format f);
// y = decode(encode(x * scale)) * (1 / scale), the value an FP8 GEMM sees after its scale_inv;
// codes (may be null) receives the FP8 codes. y may alias x.
void fp8QuantizeDequantize(const float* x, float* y, uint8_t* codes, int64_t n, float scale, Fp8Format f);

// ---- MoE row movement and the experts' elementwise parts (moe.cpp) ------------------------
// The token permutation of the dispatcher and its inverse as index-driven row copies, with
// the index arrays built on the host from the routing plan (engine/model/gpt_moe.cpp). Every
// sum runs in a fixed order (no atomics), so every backend gives the same bits.
// dst[i, :] = src[idx[i], :] for i < rows; a negative idx[i] gives a zero row.
void gatherRows(const float* src, const int32_t* idx, float* dst, int rows, int cols);
// dst[t, :] += src[idx[j], :] for j = start[t] .. start[t+1]-1 in that order, t < outRows
// (the combine of a token's expert outputs: an inverse index instead of a scatter-add).
void gatherSumRows(const float* src, const int32_t* start, const int32_t* idx, float* dst, int outRows,
                   int cols);
// y[r, c] = x[r * xRowStride + c] * s[r] (xRowStride 0: the same row x for every r).
void scaleRows(const float* x, int64_t xRowStride, const float* s, float* y, int rows, int cols);
// The backward of an expert's act * prob (rows of F): dact = da * prob[r], and
// dprob[r] = sum_f da[r, f] act[r, f] (+ sum_i dy[r, i] b2[i] when b2 is set: fc2's bias
// weighted by the prob, dy [rows, h]), each dot in double in index order.
void moeProbGrad(const float* da, const float* act, const float* prob, const float* dy, const float* b2,
                 float* dact, float* dprob, int rows, int F, int h);
// db[c] += sum_r dy[r, c] w[r], summed in double over r in order (fc2's bias weighted by the prob).
void weightedColumnSum(const float* dy, const float* w, float* db, int rows, int cols);
// The shared experts' gate (Megatron's SharedExpertMLP with moe_shared_expert_gate):
// gate[t] = sigmoid(x[t] . w) (dot in double; rounded to bf16 when bf16Gate), out[t] = y[t] * gate[t].
void sigmoidGateForward(const float* x, const float* w, const float* y, float* gate, float* out, int T, int h,
                        bool bf16Gate);
// Its backward: dz_t = (dout[t] . y[t]) g (1 - g) (double), dy[t] = dout[t] * g, dx[t] = dz_t w,
// dw[i] += sum_t dz_t x[t, i] (double over t in order).
void sigmoidGateBackward(const float* dout, const float* y, const float* x, const float* gate, const float* w,
                         float* dy, float* dx, float* dw, int T, int h);
// The router's backward through its probs, with per-token coefficients derived from the
// forward's logits (moeRouterProbsCoefficients), so the probs' grads never go back to the host. For token t < T and its K slots j (token-major [T, K] arrays): the
// slot's expert sel, its permuted row rowOf (< 0: dropped, g = 0), g_j = dprob[rowOf], and
// dot = sum_j b_j g_j (double, j in order). Then, per expert e of the token's row of dl [T, E]:
//   v = dl[t, e] - full[t, e] dot (full: [T, E], null when the probs are not a softmax over all E),
//   v += a_j g_j - c_j dot for the slot j choosing e (a token's experts are distinct),
// in double, dl[t, e] = v. dl holds the aux and z losses' gradient (or zeros) on entry.
void moeRouterProbsBackward(const float* dprob, const int32_t* rowOf, const int32_t* sel, const float* a,
                            const float* b, const float* c, const float* full, float* dl, int T, int K, int E);
// The router's score function (moe_router_score_function; the engine's MoeScore).
enum class MoeScore : uint8_t { Softmax = 0, Sigmoid, SqrtSoftplus };
// The aux and z losses' gradient on the router's logits [T, E], from the aux loss's routing
// counts where the device has them (summed over tp/cp by a collective, never read back). Token
// t is in group g = (t % microBatch) % G; its weights are
//   w_e = wAux sum_g' counts[g', e] + wSeq counts[g, e] + wGlobal global[e]
// (counts [G, E] and global [E] may be null when their weights are 0), and with p the aux
// scores of its logits l (softmax over E; sigmoid or sqrtsoftplus s_e over S = sum_e s_e,
// p_e = s_e / (S + 1e-20)) and dot = sum_e w_e p_e (e in order):
//   softmax: v_e = p_e (w_e - dot); else v_e = (w_e - dot) / (S + 1e-20) s'(l_e);
//   dl[t, e] = v_e + zScale lse(l) softmax(l)_e,
// in double (the derivative of sum_t w . p + zScale/2 lse^2). dl is overwritten.
void moeRouterAuxBackward(const float* logits, const float* counts, const float* global, float* dl, int T, int E,
                          int G, int microBatch, MoeScore score, double wAux, double wSeq, double wGlobal,
                          double zScale);

// --- The router's choice and plan on the device (moe_route.cpp, moe_balance.cpp; Megatron's
// TopKRouter and its permute, REFERENCE.md §5.2), for every mode: the score functions, the
// sinkhorn router, quantile balancing's choice; dropless or at a capacity ---
// How a token chooses (moe_utils.py::topk_routing_with_score_function): K experts by the
// score function; softmax: the top-k of the logits and a softmax over the k chosen, or with
// preSoftmax the softmax over all E and its top-k (probs not renormalised); sigmoid /
// sqrtsoftplus: the top-k of score + expert bias, probs the scores renormalised over the k
// (k > 1); probs times scale (0: none); group-limited (numGroups / groupTopk, 0: off): the top
// groupTopk groups by the sum of their top K/groupTopk values, the top-k inside them; bf16Probs:
// the probs rounded to bf16 (the router's output dtype under bf16).
struct MoeTopKSpec {
    int K = 1;
    MoeScore score = MoeScore::Softmax;
    bool preSoftmax = false;
    double scale = 0;
    int numGroups = 0, groupTopk = 0;
    bool bf16Probs = false;
};
// Each token's choice topi [T, K] (best first, ties: lower index) and probs [T, K] from the
// logits [T, E] (bias [E]: the expert bias on the choice, null: none). sinkhorn [T, E] (non-null:
// the sinkhorn router, moeSinkhorn of the logits): the choice is each row's top-k, the probs
// sigmoid(logit) for K = 1 or the full softmax at the chosen experts, never scaled. chosen [T, K]
// (non-null: a choice made elsewhere, quantile balancing's): the probs the score function's at
// those experts (groups and bias unused). Needs K <= E, K <= 64 and numGroups <= 64 (the engine's
// config checks refuse more).
void moeRouteTopK(const float* logits, const float* bias, const float* sinkhorn, const int32_t* chosen,
                  int32_t* topi, float* probs, int T, int E, const MoeTopKSpec& spec);
// Megatron's sinkhorn (moe_utils.py) of cost [T, E] into out [T, E]: exp(cost) scaled by per-token
// factors d0 = (1/T) / (row . d1 + eps) and per-expert factors d1 = (1/E) / (column . d0 + eps),
// iterated from d1 = 1 until the expert factors move by <= tol on average; fp32, in the orders of
// kernels/common/moe_balance.h.
void moeSinkhorn(const float* cost, int T, int E, float* out, float tol = 1e-4f);
// Quantile balancing (moe_router_load_balancing_type=quantile_balancing; Megatron's qb_dual_update
// in moe_utils.py), on scores [m, n] (tokens, experts; the fp32 logits), in fp32 as torch does:
//   indices [m*k] (if non-null): each token's top-k of scores - beta, best first (ties: lower
//     expert, as every router);
//   quantile [n] (if non-null): with alpha_t the token's (k+1)-th largest of scores_t - beta, each
//     expert's (m*k/n + 1)-th largest of scores[:, j] - alpha over the m tokens: the bias under
//     which expert j would get m*k/n tokens (the per-microbatch estimate the step-end update
//     averages into qb_beta).
// Selections by kernels/common/moe_balance.h's key (-0 taken as +0, every NaN above +inf). Needs
// 1 <= k < n, and k <= 64 on CUDA (the engine's config checks refuse the rest).
void moeQbDualUpdate(const float* scores, int m, int n, int k, const float* beta, int32_t* indices, float* quantile);
// A capacity per expert in token copies (moe_expert_capacity_factor; Megatron's
// apply_router_token_dropping; cap < 0: dropless). Over it an expert keeps its `cap` copies with
// the highest probs (byProb; ties: the earlier token) or its first `cap` in token order; pad fills
// every expert up to `cap` rows (at most T) with the earliest tokens it does not keep, at prob 0
// (moe_pad_expert_input_to_capacity).
struct MoeCapacity {
    int cap = -1;
    bool pad = false;
    bool byProb = true;
};
// The permutation of the choice: each expert's rows in token order, expert-major (Megatron's
// permute). offset [E+1]: the first row of each expert (offset[E]: the rows; T*K dropless, at
// most E*cap with a capacity); routed [E] (null: not wanted): each expert's copies before any
// dropping; per row r: tok[r] its token, tokExp[r] = token*E + expert, probT[r] its prob (0 for a
// padding row); per token t: start[t] its first entry of inv and inv[start[t] ..] its rows
// ascending (the combine's inverse index, start [T+1]); per slot (t, j): rowOf[t*K + j] its row
// (-1: dropped). Dropless, start[t] = t*K.
void moeRoutePlan(const int32_t* topi, const float* probs, int T, int K, int E, const MoeCapacity& capacity,
                  int32_t* offset, int32_t* routed, int32_t* tok, int32_t* start, int32_t* inv, int32_t* tokExp,
                  int32_t* rowOf, float* probT);
// The aux losses' routing counts and the router's statistics from the logits [T, E]
// (compute_routing_scores_for_aux_loss): per token its aux scores p (softmax over E, or sigmoid /
// sqrtsoftplus over their sum + 1e-20) and their plain top-K; token t is in group
// (t % microBatch) % G. counts [G, E] (null: not wanted): how many of the group's tokens chose e;
// total [E] (null: not wanted): the same over all groups; stats [G*E + 1] (null: not wanted):
// the groups' sums of p (in double over t in order), then the sum over t of lse(l_t)^2.
void moeRouterAuxCounts(const float* logits, int T, int E, int K, int G, int microBatch, MoeScore score,
                        float* counts, float* total, float* stats);
// The probs' backward as per-token coefficients for moeRouterProbsBackward, from the logits the
// choice was made from and the choice topi [T, K] (spec: how the probs were made; sinkhorn: the
// sinkhorn router's probs, sigmoid for K = 1 else the full softmax, unscaled). a, b, c [T, K]
// (the scale included); full [T, E] = softmax(l) when the probs are a softmax over all E
// (preSoftmax, or sinkhorn with K > 1), else not written. With g the slots' grads and
// dot = sum_j b_j g_j: dl_e -= full_e dot, dl_sel_j += a_j g_j - c_j dot.
void moeRouterProbsCoefficients(const float* logits, const int32_t* topi, int T, int E, const MoeTopKSpec& spec,
                                bool sinkhorn, float* a, float* b, float* c, float* full);
// Megatron's dense routing_map and probs of the allgather dispatcher: map [2, TE] zeroed, then for
// each row r < rows map[tokExp[r]] = 1 and map[TE + tokExp[r]] = probT[r].
void moeRoutingMap(const int32_t* tokExp, const float* probT, int rows, int64_t TE, float* map);

}  // namespace ts::kernels::cpu
