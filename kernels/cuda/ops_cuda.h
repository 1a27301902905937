// CUDA kernels: the CPU oracle's ops (kernels/cpu/ops.h, kernels/cpu/fp8_block.h) on device
// memory, one op family per .cu file with its launcher (as in llm.c), each checked against the
// CPU function of the same name by tests/gpu (label gpu).
//
// Contract, for every op below:
// - Same name, arguments, shapes and semantics as the kernels::cpu function of that name
//   (accumulate (+=) vs overwrite, null pointers meaning "skip", aliasing allowed where the CPU
//   comment allows it), plus a trailing `stream` (a cudaStream_t; nullptr = legacy default
//   stream). Pointers are device pointers unless a comment says host.
// - Launches are asynchronous. The returned Status says whether the launch was accepted
//   (bad shapes, launch configuration errors, cuBLAS errors); execution errors surface at the
//   next synchronizing call.
// - A CPU function that returns a value (a count, a sum) writes it here to a DEVICE scalar
//   instead, so nothing synchronizes: the caller copies it back when it needs it.
// - GEMMs go through cuBLAS(Lt) with fp32 accumulation. kernels/cuda keeps one cuBLAS and one
//   cuBLASLt handle (and workspace) per (host thread, current device), created on first use and
//   bound to `stream` for each call, so callers pass only the stream.
// - Results equal the CPU oracle within a tolerance scaled to dtype and magnitude (summation
//   order differs); element-exact where the op is (dropout masks, FP8 and bf16 rounding,
//   embedding gathers, RNG).
// This header needs no CUDA headers, so plain C++ code (engine, tests) can include it.
#pragma once

#include "common/status.h"
#include "kernels/common/fp8_codes.h"
#include "kernels/cpu/fp8_block.h"
#include "kernels/cpu/ops.h"

#include <cstddef>
#include <cstdint>

namespace ts::kernels::cuda {

// The argument structs are the oracle's, so the two backends cannot drift apart.
using cpu::AdamParams;
using cpu::AttnDims;
using cpu::CpAttnDims;
using cpu::Fp8BlockKind;
using cpu::Fp8Format;

// --- runtime helpers (thin, Status-returning wrappers so callers need no CUDA headers) -----
// Number of usable devices; 0 (and an ok Status) when there is no driver or no device.
Status deviceCount(int* count);
Status setDevice(int device);
Status deviceAlloc(void** ptr, size_t bytes);
Status deviceFree(void* ptr);
Status hostAllocPinned(void** ptr, size_t bytes);
Status hostFreePinned(void* ptr);
// Synchronous copies (whole device).
Status copyToDevice(void* dst, const void* src, size_t bytes);
Status copyToHost(void* dst, const void* src, size_t bytes);
// Asynchronous on `stream` (any direction; cudaMemcpyDefault).
Status copyAsync(void* dst, const void* src, size_t bytes, void* stream);
Status memsetAsync(void* dst, int value, size_t bytes, void* stream);
// `height` rows of `widthBytes`, rows `dpitch` / `spitch` bytes apart (cudaMemcpy2DAsync).
Status copy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t widthBytes, size_t height,
                   void* stream);
Status streamCreate(void** stream);
Status streamDestroy(void* stream);
Status streamSynchronize(void* stream);
Status deviceSynchronize();
// GEMM operand precision of this host thread's calls from now on. Off (the default): full fp32
// (cuBLAS pedantic math, as the oracle). On: gemm, gemmStridedBatched, linearForward and
// linearBackward round A and B to bf16 (stream-ordered bf16 copies) and multiply on the tensor
// cores with fp32 accumulation and an fp32 C, as Megatron's bf16 GEMMs do: where the operands
// already hold bf16 values (the engine's bf16 mode rounds what it stores) the products are the
// oracle's exactly, only the summation order differs. engine/backend/kernels.h's Bf16GemmScope
// sets it around an op's code.
void setBf16Gemms(bool on);
bool bf16Gemms();
// An experiment for a GPU session, process-wide, off unless TS_CUDA_GEMM_FAST_16BF=1 (read once)
// or setFast16bfGemms(true): a bf16 GEMM one of whose operands has no bound twin multiplies both
// fp32 operands with CUBLAS_COMPUTE_32F_FAST_16BF (cuBLAS converts them itself) instead of
// converting that operand to a bf16 copy first (gemm.cu says when the products are the same).
void setFast16bfGemms(bool on);
bool fast16bfGemms();
// Flash attention under bf16 GEMMs by the tiled tensor-core kernels (flash_attention.cu: no
// [sq, skv] square, the causal half of the work) instead of the scores GEMM, row kernels and PV
// GEMM. Process-wide; off unless TS_CUDA_FLASH_TILES=1 (read once) or setFlashTiles(true): the
// kernels have compiled, not yet run on a GPU (docs/cuda_port.md).
void setFlashTiles(bool on);
bool flashTiles();
// Whether this thread's GPU can run the tiled flash kernels for heads of headDim (at most 128, sm_80
// or later, the shared memory they need).
bool flashTilesSupported(int headDim);
// FP8 GEMMs on FP8 codes. Process-wide; off unless TS_CUDA_FP8_GEMMS=1 (read once) or
// setFp8Gemms(true): compiled, not yet run on a GPU (docs/cuda_port.md). On, a bf16 GEMM both of
// whose operands are bound as FP8 codes (kernels/common/fp8_codes.h: the FP8 linears'
// activations, weights and output gradients), not both E5M2, unbatched, with M, N and K multiples
// of 16, on a GPU with FP8 tensor cores (sm_89 or later), multiplies the codes in FP8 with
// cuBLASLt (fp32 accumulation and C; the scales' inverses in alpha, or through cuBLASLt's scale
// pointers where they are on the device), each operand's codes copied K-major first (transposed
// where the GEMM reads it the other way: the dgrad's W, the wgrad's dy and x; Hopper's FP8 GEMMs
// take only that layout). Any other GEMM, or one cuBLASLt finds no algorithm for, runs as before.
// Codes whose scale is on the device (tensorwise scaling's) take the tensor cores (bf16 or FP8)
// only while this is on; off, their GEMMs run in fp32 on the stored values.
void setFp8Gemms(bool on);
bool fp8Gemms();
// How many GEMMs this process has run on FP8 tensor cores (what tests and benchmarks read to
// know the path was taken).
int64_t fp8GemmCount();
// The 16-bit twin of a bf16-valued float array (the engine's bf16 model copy, or an operand an
// op converts once for its GEMMs: workspace.cuh Bf16Twin): a bf16 GEMM operand lying wholly
// inside [base, base + n) is read from twin + (operand - base), no copy made; the innermost twin
// bound at an address wins, and binds of one base stack. The caller keeps the twin equal to the
// array's bf16 bits and unbinds before freeing either. Thread-safe (one registry per process;
// device pointers are unique under UVA).
void bindBf16Twin(const float* base, const uint16_t* twin, int64_t n);
void unbindBf16Twin(const float* base);
// The twin bits of floats [x, x + n) if a bound twin covers them all, else null.
const uint16_t* boundBf16Twin(const float* x, int64_t n);

// --- GEMM (row-major, as kernels::cpu) ------------------------------------------------------
Status gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
            const float* B, int ldb, float beta, float* C, int ldc, void* stream);
Status gemmStridedBatched(bool transA, bool transB, int M, int N, int K, float alpha,
                          const float* A, int lda, int64_t strideA, const float* B, int ldb,
                          int64_t strideB, float beta, float* C, int ldc, int64_t strideC,
                          int batch, void* stream);

// --- Linear (y = x W^T + b), W[out, in] -----------------------------------------------------
Status linearForward(const float* x, const float* W, const float* b, float* y, int T, int in,
                     int out, void* stream);
Status linearBackward(const float* dy, const float* x, const float* W, float* dx, float* dW,
                      float* db, int T, int in, int out, void* stream);
// The MoE experts' GEMMs (kernels/cpu/ops.h): off, W, b, dW and db are HOST arrays of device
// pointers. Under bf16 GEMMs the operand all groups share a buffer of (x; dy, and x for the wgrads)
// is converted to bf16 once for every group, unless it holds FP8 codes or a bound twin covers it;
// then a cuBLAS GEMM per group (as Transformer Engine's grouped GEMM calls cuBLAS per expert:
// cublasGemmGroupedBatchedEx writes no fp32 C from bf16 operands).
Status linearForwardGrouped(const float* x, const float* const* W, const float* const* b, float* y, const int* off,
                            int G, int in, int out, void* stream);
Status linearBackwardGrouped(const float* dy, const float* x, const float* const* W, float* dx, float* const* dW,
                             float* const* db, const int* off, int G, int in, int out, void* stream);

// --- Embedding ------------------------------------------------------------------------------
// invalidCount (device int, may be null) receives the number of ids outside [0, vocabSize).
Status embeddingForward(const int32_t* ids, const float* table, float* out, int T, int C,
                        int vocabStart, int vocabEnd, int vocabSize, int* invalidCount,
                        void* stream);
// The lookup without the count, asynchronous (kernels/cpu/ops.h): from an fp32 table or from a
// bf16 model copy's bits.
Status embeddingLookup(const int32_t* ids, const float* table, float* out, int T, int C, int vocabStart,
                       int vocabEnd, int vocabSize, void* stream);
Status embeddingLookupBf16(const int32_t* ids, const uint16_t* table, float* out, int T, int C,
                           int vocabStart, int vocabEnd, int vocabSize, void* stream);
Status embeddingBackward(const int32_t* ids, const float* dout, float* dtable, int T, int C,
                         int vocabStart, int vocabEnd, void* stream);
Status positionEmbeddingForward(const float* table, float* out, int s, int b, int C,
                                void* stream);
Status positionEmbeddingForwardBf16(const uint16_t* table, float* out, int s, int b, int C, void* stream);
Status positionEmbeddingBackward(const float* dout, float* dtable, int s, int b, int C,
                                 void* stream);

// --- Norms ----------------------------------------------------------------------------------
// roundBf16 (here, biasGeluForward, swigluForward, biasDropoutAddFused): the output stored as
// bf16 values (round to nearest even) in the same pass, the oracle's flag.
Status layerNormForward(const float* x, const float* w, const float* b, float* y, float* mean,
                        float* rstd, int T, int C, float eps, bool roundBf16, void* stream);
Status layerNormBackward(const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* dx, float* dw, float* db, int T, int C,
                         bool roundBf16, void* stream);
Status layerNormForwardFused(const float* x, const float* w, const float* b, float* y,
                             float* mean, float* rstd, int T, int C, float eps, bool roundBf16, void* stream);
Status layerNormBackwardFused(const float* dy, const float* x, const float* w,
                              const float* mean, const float* rstd, float* dx, float* dw,
                              float* db, int T, int C, bool roundBf16, void* stream);
Status rmsNormForward(const float* x, const float* w, float* y, float* rstd, int T, int C,
                      float eps, bool roundBf16, void* stream);
Status rmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd,
                       float* dx, float* dw, int T, int C, bool roundBf16, void* stream);

// --- Rotary position embedding ----------------------------------------------------------------
Status ropeForward(float* x, int s, int b, int n, int d, float theta, int posOffset,
                   void* stream);
Status ropeForwardFused(float* x, int s, int b, int n, int d, float theta, int posOffset,
                        void* stream);
Status ropeBackward(float* dx, int s, int b, int n, int d, float theta, int posOffset,
                    void* stream);
Status splitQkvRopeForward(const float* qkv, float* q, float* k, float* v, int s, int b, int nq,
                           int ng, int d, float theta, int posOffset, bool roundBf16, void* stream);
Status splitQkv(const float* qkv, float* q, float* k, float* v, int T, int nq, int ng, int d, void* stream);
Status mergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int T, int nq, int ng, int d,
                void* stream);
Status ropeBackwardMergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv,
                            int s, int b, int nq, int ng, int d, float theta, int posOffset,
                            void* stream);

// --- Core attention (causal, GQA; our own kernels, the fallback where cuDNN's is absent) ----
Status attentionForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                        float* probs, float* out, bool fusedSoftmax, void* stream);
Status attentionBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                         const float* probs, const float* dout, float* dq, float* dk, float* dv,
                         float* scratch, bool fusedSoftmax, void* stream);
// Flash attention (kernels/cpu/ops.h): stats [b, nq, s, 2], the row max and the reciprocal of
// the softmax denominator. The probabilities live per head chunk in a stream-ordered workspace
// only: the forward's for .V, the backward's rebuilt from the stats by the scores GEMM again.
Status attentionFlashForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                             float* stats, float* out, void* stream);
Status attentionFlashBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                              const float* stats, const float* dout, float* dq, float* dk,
                              float* dv, float* scratch, void* stream);
// Context parallel. qPos, kPos: device int arrays.
Status cpAttentionForward(const CpAttnDims& dims, const int* qPos, const float* q,
                          const float* k, const float* v, float* probs, float* out,
                          void* stream);
Status cpAttentionBackward(const CpAttnDims& dims, const int* qPos, const float* q,
                           const float* k, const float* v, const float* probs,
                           const float* dout, float* dq, float* dk, float* dv, void* stream);
Status cpRingAttentionForward(const CpAttnDims& dims, const int* qPos, const int* kPos,
                              const float* q, const float* k, const float* v, float* out,
                              float* lse, bool first, void* stream);
Status cpRingAttentionDelta(const CpAttnDims& dims, const float* out, const float* dout,
                            float* delta, void* stream);
Status cpRingAttentionBackward(const CpAttnDims& dims, const int* qPos, const int* kPos,
                               const float* q, const float* k, const float* v, const float* lse,
                               const float* delta, const float* dout, float* dq, float* dk,
                               float* dv, void* stream);

// --- Activations ----------------------------------------------------------------------------
Status biasGeluForward(const float* x, const float* b, float* y, int T, int C, bool roundBf16, void* stream);
Status biasGeluForwardUnfused(const float* x, const float* b, float* y, int T, int C,
                              void* stream);
Status biasGeluBackward(const float* dy, const float* x, const float* b, float* dx, float* db,
                        int T, int C, void* stream);
Status swigluForward(const float* x, float* y, int T, int F, bool roundBf16, void* stream);
Status swigluBackward(const float* dy, const float* x, float* dx, int T, int F, void* stream);

// --- Dropout / residual (the CPU's counter-based RNG, so masks are bit-identical) ----------
Status dropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p,
                      hd::DropoutSeed seed, uint64_t offset, void* stream);
Status dropoutBackward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float p,
                       void* stream);
Status dropoutMask(uint8_t* mask, int64_t n, float p, hd::DropoutSeed seed, uint64_t offset,
                   void* stream);
Status biasDropoutAddFused(const float* x, const float* b, const float* residual, float* out,
                           uint8_t* mask, int T, int C, float p, hd::DropoutSeed seed, uint64_t offset,
                           bool roundBf16, void* stream);
Status biasDropoutAddUnfused(const float* x, const float* b, const float* residual, float* out,
                             uint8_t* mask, int T, int C, float p, hd::DropoutSeed seed,
                             uint64_t offset, void* stream);
Status biasDropoutAddBackward(const float* dout, const uint8_t* mask, float* dx, float* db,
                              int T, int C, float p, void* stream);

// --- Elementwise helpers --------------------------------------------------------------------
Status add(const float* a, const float* b, float* y, int64_t n, void* stream);
Status addInPlace(float* y, const float* x, int64_t n, void* stream);
Status scale(float* y, float alpha, int64_t n, void* stream);
Status addBias(float* y, const float* b, int T, int C, void* stream);
Status biasGradAccumulate(const float* dy, float* db, int T, int C, void* stream);
// Device scalars: *sum = sum of squares (accumulated in double); *finite = 1 if every element
// is finite else 0; *invalid = number of ids outside [0, vocabSize).
Status sumSquares(const float* x, int64_t n, double* sum, void* stream);
// acc, accAsFloat (may be null): device scalars; the sum through a stream-ordered scratch double.
Status sumSquaresAccumulate(const float* x, int64_t n, double* acc, float* accAsFloat, void* stream);
Status allFinite(const float* x, int64_t n, int* finite, void* stream);
Status countInvalidIds(const int32_t* ids, int T, int vocabSize, int* invalid, void* stream);

// --- Cross entropy --------------------------------------------------------------------------
Status crossEntropyRowMax(const float* logits, float* rowMax, int T, int Vl, void* stream);
Status crossEntropyStats(const float* logits, const int32_t* targets, const float* rowMax,
                         float* targetLogit, float* sumExp, int T, int Vl, int vStart,
                         void* stream);
Status crossEntropyLoss(const float* targetLogit, const float* sumExp, float* loss, int T,
                        void* stream);
Status crossEntropyBackward(const float* logits, const int32_t* targets, const float* rowMax,
                            const float* sumExp, const float* dloss, float* dlogits, int T,
                            int Vl, int vStart, void* stream);
Status crossEntropyForwardUnfused(const float* logits, const int32_t* targets, float* probs,
                                  float* loss, int T, int V, void* stream);
Status crossEntropyBackwardUnfused(const float* probs, const int32_t* targets,
                                   const float* dloss, float* dlogits, int T, int V,
                                   void* stream);
Status crossEntropyFused(float* logitsInGradOut, const int32_t* targets, const float* dloss,
                         float* loss, int T, int V, void* stream);

// --- Optimizer ------------------------------------------------------------------------------
// bits (null: none): the new params' bf16 bits, written in the same pass (the bf16 model copy).
Status adamwStep(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamParams& hp, uint16_t* bits, void* stream);

// --- bf16 -----------------------------------------------------------------------------------
Status floatToBf16(const float* x, uint16_t* y, int64_t n, void* stream);
// y = bf16(x * scale): the FP8 codes of x where x holds FP8 values stored at a scale, as `codes`
// binds them (kernels/common/fp8_codes.h: a host scale, or kOnDevice, read where the amax or the
// delayed scale is),
// exactly; the bf16 GEMMs' operand for such x.
Status fp8CodesToBf16(const float* x, uint16_t* y, int64_t n, fp8codes::Binding codes, void* stream);
Status bf16ToFloat(const uint16_t* x, float* y, int64_t n, void* stream);
Status roundToBf16(float* x, int64_t n, void* stream);

// --- FP8 (emulated in fp32 storage exactly as the CPU does; REFERENCE.md §6.1) ---------------
// *amax (device float) = max |x| (NaN if any element is NaN).
Status amaxOf(const float* x, int64_t n, float* amax, void* stream);
// amax, observed: device floats.
Status fp8QuantizeCurrent(const float* x, float* y, uint8_t* codes, int64_t n, const float* amax, float divisor,
                          Fp8Format f, float* observed, void* stream);
// *slot (device float) = max(*slot, amax / divisor), NaN sticking; a float of stream-ordered scratch.
Status amaxAccumulate(const float* x, int64_t n, float divisor, float* slot, void* stream);
// scale: a device float, the step's (delayed scaling), divided by divisor when the kernel runs.
Status fp8QuantizeDelayed(const float* x, float* y, uint8_t* codes, int64_t n, const float* scale, float divisor,
                          Fp8Format f, void* stream);
// scale is a host value here, as on the CPU.
Status fp8QuantizeDequantize(const float* x, float* y, uint8_t* codes, int64_t n, float scale,
                             Fp8Format f, void* stream);
Status fp8BlockQuantizeDequantize(const float* x, float* y, uint8_t* codes, void* scales,
                                  int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows,
                                  Fp8Format f, bool pow2, void* stream);
// The codes fp8(x * scale) of the [rows, cols] matrix x (row stride ld) where x holds FP8 values
// as `codes` binds them (their format and scale, kernels/common/fp8_codes.h), exactly: y is
// [rows, cols] contiguous, or with transpose [cols, rows] (y[c * rows + r] is x[r, c]'s code).
// The FP8 GEMMs' K-major operands.
Status fp8CodesToFp8(const float* x, int64_t rows, int64_t cols, int64_t ld, bool transpose,
                     fp8codes::Binding codes, uint8_t* y, void* stream);

// --- MoE row movement and the experts' elementwise parts (moe.cu) ---------------------------
// idx, start: device int32 arrays. Bit-identical to the oracle (one thread per output element
// in the oracle's order) except sigmoidGateForward's exp (see moe.cu) and moeRouterProbsBackward,
// whose CPU loops may fuse multiply-adds (-ffp-contract=fast) where the kernel rounds each step.
Status gatherRows(const float* src, const int32_t* idx, float* dst, int rows, int cols, void* stream);
Status gatherSumRows(const float* src, const int32_t* start, const int32_t* idx, float* dst, int outRows, int cols,
                     void* stream);
Status scaleRows(const float* x, int64_t xRowStride, const float* s, float* y, int rows, int cols, void* stream);
Status moeProbGrad(const float* da, const float* act, const float* prob, const float* dy, const float* b2,
                   float* dact, float* dprob, int rows, int F, int h, void* stream);
Status weightedColumnSum(const float* dy, const float* w, float* db, int rows, int cols, void* stream);
Status sigmoidGateForward(const float* x, const float* w, const float* y, float* gate, float* out, int T, int h,
                          bool bf16Gate, void* stream);
// Uses a T-double scratch from the stream-ordered allocator.
Status sigmoidGateBackward(const float* dout, const float* y, const float* x, const float* gate, const float* w,
                           float* dy, float* dx, float* dw, int T, int h, void* stream);
// rowOf, sel: device int32 [T, K]; one thread per token (the oracle's order, no FMA contraction).
Status moeRouterProbsBackward(const float* dprob, const int32_t* rowOf, const int32_t* sel, const float* a,
                              const float* b, const float* c, const float* full, float* dl, int T, int K, int E,
                              void* stream);
// counts, global: device [G, E], [E] or null; one thread per token (the oracle's order, every double
// step rounded; exp/log1p/sqrt within CUDA's 1-2 ulp of glibc's).
Status moeRouterAuxBackward(const float* logits, const float* counts, const float* global, float* dl, int T, int E,
                            int G, int microBatch, cpu::MoeScore score, double wAux, double wSeq, double wGlobal,
                            double zScale, void* stream);

// --- The router's choice and plan (moe_route.cu; the oracle is kernels/cpu/moe_route.cpp) -----
// One thread per token for the choice, its probs and the coefficients (the oracle's steps in
// double; exp/log within CUDA's 1-2 ulp of glibc's, so a near tie between two experts' values may
// break the other way); the plan's ranks by one block per expert in token order (exact; at a
// capacity with a stream-ordered scratch of 3 T*K + E + T + 1 ints); the aux counts by integer
// atomics, traced their statistics by per-chunk partial sums added in order. Limits: K <= 64 and
// numGroups <= 64 (Status::invalid beyond).
Status moeRouteTopK(const float* logits, const float* bias, const float* sinkhorn, const int32_t* chosen,
                    int32_t* topi, float* probs, int T, int E, const cpu::MoeTopKSpec& spec, void* stream);
Status moeRoutePlan(const int32_t* topi, const float* probs, int T, int K, int E, const cpu::MoeCapacity& capacity,
                    int32_t* offset, int32_t* routed, int32_t* tok, int32_t* start, int32_t* inv, int32_t* tokExp,
                    int32_t* rowOf, float* probT, void* stream);
Status moeRouterAuxCounts(const float* logits, int T, int E, int K, int G, int microBatch, cpu::MoeScore score,
                          float* counts, float* total, float* stats, void* stream);
Status moeRouterProbsCoefficients(const float* logits, const int32_t* topi, int T, int E, const cpu::MoeTopKSpec& spec,
                                  bool sinkhorn, float* a, float* b, float* c, float* full, void* stream);
Status moeRoutingMap(const int32_t* tokExp, const float* probT, int rows, int64_t TE, float* map, void* stream);
// The balancing modes (the oracle is kernels/cpu/moe_balance.cpp), the same bits: sinkhorn's whole
// iteration in one block of 1024 threads (no host check per iteration), with a stream-ordered
// scratch of T + 2E + ceil(T/256)*E floats; quantile balancing's choice a thread per token (k < n,
// k <= 64), its quantile a block per expert (a radix select; scratch: m floats).
Status moeSinkhorn(const float* cost, int T, int E, float* out, float tol, void* stream);
Status moeQbDualUpdate(const float* scores, int m, int n, int k, const float* beta, int32_t* indices,
                       float* quantile, void* stream);

}  // namespace ts::kernels::cuda
