// Kernel dispatch: the ops of the CPU oracle (kernels/cpu/ops.h, fp8_block.h) under the same
// names and signatures, run on the backend of the stream whose op is running on this thread
// (backend.h currentStream()): a stream with a native handle (CUDA) launches the kernels/cuda op
// of that name on it, anything else (a CPU stream's worker, host code outside any op) runs the
// CPU function. The engine's model, optimizer and parallel code call kernels only through here
// (`namespace k = ts::engine::kern;`), so the same code runs on both backends.
//
// On CUDA a launch failure is handed to the running stream (reportKernelError), which fails like
// an op returning that Status. The ops that return a value (embeddingForward, sumSquares,
// allFinite, countInvalidIds, amaxOf) copy it back and wait for the stream on CUDA: they
// synchronize, so keep them off the hot path there.
//
// A pointer handed to a kernel must live where the stream's kernels run: a device buffer on CUDA.
// Host code that reads or writes buffer contents directly is CPU-only (see docs/engine.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/backend/backend.h"

#include "kernels/cpu/fp8_block.h"
#include "kernels/cpu/ops.h"

namespace ts::engine::kern {

// Argument types and pure host helpers (no device data) are the oracle's own.
using kernels::cpu::AdamParams;
using kernels::cpu::AttnDims;
using kernels::cpu::CpAttnDims;
using kernels::cpu::Fp8BlockKind;
using kernels::cpu::Fp8Format;
using kernels::cpu::attentionProbsSize;
using kernels::cpu::attentionScratchSize;
using kernels::cpu::attentionFlashScratchSize;
using kernels::cpu::attentionStatsSize;
using kernels::cpu::fp8BlockBytes;
using kernels::cpu::fp8BlockScaleCount;
using kernels::cpu::fp8Max;

// True when the calling thread is running an op of a stream with a native (CUDA) handle, i.e.
// when kernels called now run on the GPU.
bool onDevice();

// True when kernels enqueued on `s` see device memory (CUDA, the emulated device): buffers must
// then be uploaded rather than host data handed to kernels. Host code deciding at enqueue time
// asks this; inside an op, onDevice().
bool streamOnDevice(Stream& s);

// --- memory ops on the current stream ------------------------------------------------------
// dst[0, bytes) = value (device memory).
void setBytes(void* dst, int value, size_t bytes);
// An upload (host src), download (host dst) or device copy, in stream order. A host source is
// read at the call (as cudaMemcpyAsync stages pageable memory), so it may be freed after it; a
// host destination is written when the stream reaches the copy: use download() to read it.
void copyBytes(void* dst, const void* src, size_t bytes);
// copyBytes of `height` rows of `widthBytes` each, rows `dpitch` / `spitch` bytes apart (one
// cudaMemcpy2DAsync on CUDA): strided packs and unpacks.
void copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t widthBytes, size_t height);
// Device -> host copy that waits for the stream: dst holds the bytes when it returns.
void download(void* dst, const void* src, size_t bytes);

// The same from host code outside any op (checkpoints, gathering params, test harnesses): the
// copy is submitted on `s`, after the work already queued there, and waited for. On every
// backend; a host pointer on the buffer side is copied as plain memory.
Status runOp(Stream& s, const char* name, std::function<void()> fn);  // fn as an op on s, waited for
// The read-backs are ops named `op` (the trace's and emulatedHostWaits' name for the wait).
Status copyToHost(Stream& s, void* dst, const void* src, size_t bytes, const char* op = "copy_to_host");
Status copyFromHost(Stream& s, void* dst, const void* src, size_t bytes);
// A whole float buffer (or the first n floats of it) as a host vector.
Result<std::vector<float>> toHost(Stream& s, const float* src, int64_t n, const char* op = "copy_to_host");

// The 16-bit twin of a bf16-valued float array (the working copy of a part's weights and their
// bf16 bits, GptModel::useWeights; saved activations and their packed bits): on CUDA, a bf16
// GEMM whose operand lies wholly inside [base, base + n) reads twin + (operand - base) instead of
// converting the operand (kernels/cuda/ops_cuda.h). The caller keeps the twin equal to the
// array's bf16 bits and unbinds it before either is freed. Host calls outside any op; no-ops
// without CUDA.
void bindBf16Twin(const float* base, const uint16_t* twin, int64_t n);
void unbindBf16Twin(const float* base);

// GEMM operands in bf16 for the kernels this thread launches while the scope lives (restores the
// previous setting after): on CUDA, gemm / gemmStridedBatched / linear* round A and B to bf16 and
// use the tensor cores with fp32 accumulation (kernels/cuda/ops_cuda.h setBf16Gemms); the CPU
// oracle and the emulated device keep fp32 GEMMs, which on operands holding bf16 values give the
// same products. Exec sets it around the ops of a bf16 model (GptModel's constructor); the
// FP8 linears under tensorwise scaling take their GEMMs out with Fp32GemmScope; delayed
// scaling's operands are bound as FP8 codes at their scale (kernels/common/fp8_codes.h), which
// the CUDA GEMMs multiply as codes and the check below verifies as such.
class Bf16GemmScope {
public:
    explicit Bf16GemmScope(bool on);
    ~Bf16GemmScope();
    Bf16GemmScope(const Bf16GemmScope&) = delete;
    Bf16GemmScope& operator=(const Bf16GemmScope&) = delete;
    static bool active();  // this thread is inside a scope that is on

private:
    bool m_prev = false;      // this thread's scope before (every backend)
    bool m_prevCuda = false;  // the CUDA kernels' setting before (CUDA builds)
};

// fp32 GEMMs inside a bf16 scope where `fp32` holds, else the surrounding setting unchanged: the
// GEMMs of the FP8 linears under tensorwise scaling, whose dequantized operands (a code times
// 1/scale, any fp32 scale made on the device) are not bf16 values. The rest of such a model keeps
// its bf16 GEMMs.
class Fp32GemmScope : public Bf16GemmScope {
public:
    explicit Fp32GemmScope(bool fp32) : Bf16GemmScope(!fp32 && Bf16GemmScope::active()) {}
};

// The check of that promise on the host backends (CPU, emulated device): with it on, gemm,
// gemmStridedBatched, linearForward and linearBackward run under a Bf16GemmScope first look at
// their operands (A and B; x, W, dy) and fail the op, naming the operand, the element and its
// value, where one holds a value bf16 does not represent, which a GPU's bf16 GEMM would round
// and the oracle would not (an operand bound as FP8 codes at a scale: a value that is no code at
// it). On CUDA nothing is checked; nor are the GEMMs inside the CUDA
// attention kernels (they round P, dropout(P) and dS, which the oracle keeps fp32: a known
// difference, docs/cuda_port.md). Off unless TS_CHECK_BF16_GEMMS=1 or setCheckBf16Gemms(true)
// (the tests: tests/engine/train/test_bf16_gemm_check.cpp).
void setCheckBf16Gemms(bool on);
bool checkBf16Gemms();
// While the check is on: how many GEMMs the host backends ran under a Bf16GemmScope that is on
// (checked) and outside one (fp32), since the process started; a test takes differences.
struct Bf16GemmCounts {
    int64_t bf16 = 0, fp32 = 0;
};
Bf16GemmCounts bf16GemmCounts();

// --- ops that return a value (synchronize on CUDA) ------------------------------------------
int embeddingForward(const int32_t* ids, const float* table, float* out, int T, int C,
                     int vocabStart, int vocabEnd, int vocabSize);
double sumSquares(const float* x, int64_t n);
// Waits for nothing: *acc += sumSquares(x, n) where acc is (device memory), and *accAsFloat =
// float(*acc) when set (kernels/cpu/ops.h).
void sumSquaresAccumulate(const float* x, int64_t n, double* acc, float* accAsFloat);
bool allFinite(const float* x, int64_t n);
int countInvalidIds(const int32_t* ids, int T, int vocabSize);
float amaxOf(const float* x, int64_t n);

// amaxOf into a buffer element, asynchronous (the value stays where kernels see it).
void amaxInto(const float* x, int64_t n, float* amax);
// Current scaling with the scale taken from a buffer element on the device (kernels/cpu/ops.h).
// Unlike fp8QuantizeDequantize it does not bind y as codes: its scale lives in the amax's buffer,
// which the caller must keep alive with the binding (fp8codes::Map::bindCurrent, GptModel).
void fp8QuantizeCurrent(const float* x, float* y, uint8_t* codes, int64_t n, const float* amax, float divisor,
                        Fp8Format f, float* observed);
// Delayed scaling's observation into a buffer element, asynchronous (kernels/cpu/ops.h).
void amaxAccumulate(const float* x, int64_t n, float divisor, float* slot);
// Delayed scaling with the step's scale read from a buffer element when the kernel runs
// (kernels/cpu/ops.h). Does not bind y: the caller binds it with the scale's address
// (fp8codes::Map::bindScaleAt) and keeps the scale's buffer alive with the binding.
void fp8QuantizeDelayed(const float* x, float* y, uint8_t* codes, int64_t n, const float* scale, float divisor,
                        Fp8Format f);

// --- the rest: asynchronous on CUDA ---------------------------------------------------------
void gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemmStridedBatched(bool transA, bool transB, int M, int N, int K, float alpha, const float* A,
                        int lda, int64_t strideA, const float* B, int ldb, int64_t strideB,
                        float beta, float* C, int ldc, int64_t strideC, int batch);
void linearForward(const float* x, const float* W, const float* b, float* y, int T, int in,
                   int out);
void linearBackward(const float* dy, const float* x, const float* W, float* dx, float* dW,
                    float* db, int T, int in, int out);
// The MoE experts' GEMMs, one call for all local experts (kernels/cpu/ops.h): off, W, b, dW and
// db are host arrays. On CUDA one host call: the groups' shared operands converted to bf16 once
// for all of them, then a cuBLAS GEMM per group; on the host backends linearForward /
// linearBackward per group, each checked and viewed as those are.
void linearForwardGrouped(const float* x, const float* const* W, const float* const* b, float* y, const int* off,
                          int G, int in, int out);
void linearBackwardGrouped(const float* dy, const float* x, const float* const* W, float* dx, float* const* dW,
                           float* const* db, const int* off, int G, int in, int out);
// The lookup without embeddingForward's invalid-id count, so nothing synchronizes: from an fp32
// table, or from a bf16 model copy's bits (no fp32 copy of the table needed).
void embeddingLookup(const int32_t* ids, const float* table, float* out, int T, int C, int vocabStart,
                     int vocabEnd, int vocabSize);
void embeddingLookupBf16(const int32_t* ids, const uint16_t* table, float* out, int T, int C, int vocabStart,
                         int vocabEnd, int vocabSize);
void embeddingBackward(const int32_t* ids, const float* dout, float* dtable, int T, int C,
                       int vocabStart, int vocabEnd);
void positionEmbeddingForward(const float* table, float* out, int s, int b, int C);
void positionEmbeddingForwardBf16(const uint16_t* table, float* out, int s, int b, int C);
void positionEmbeddingBackward(const float* dout, float* dtable, int s, int b, int C);
// roundBf16 (the norms, biasGeluForward, swigluForward, biasDropoutAddFused): the output written
// as bf16 values in the same pass (kernels/cpu/ops.h), what a roundToBf16 after the call gives.
void layerNormForward(const float* x, const float* w, const float* b, float* y, float* mean,
                      float* rstd, int T, int C, float eps, bool roundBf16 = false);
void layerNormBackward(const float* dy, const float* x, const float* w, const float* mean,
                       const float* rstd, float* dx, float* dw, float* db, int T, int C, bool roundBf16 = false);
void layerNormForwardFused(const float* x, const float* w, const float* b, float* y, float* mean,
                           float* rstd, int T, int C, float eps, bool roundBf16 = false);
void layerNormBackwardFused(const float* dy, const float* x, const float* w, const float* mean,
                            const float* rstd, float* dx, float* dw, float* db, int T, int C,
                            bool roundBf16 = false);
void rmsNormForward(const float* x, const float* w, float* y, float* rstd, int T, int C, float eps,
                    bool roundBf16 = false);
void rmsNormBackward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                     float* dw, int T, int C, bool roundBf16 = false);
void ropeForward(float* x, int s, int b, int n, int d, float theta, int posOffset);
void ropeForwardFused(float* x, int s, int b, int n, int d, float theta, int posOffset);
void ropeBackward(float* dx, int s, int b, int n, int d, float theta, int posOffset);
void splitQkvRopeForward(const float* qkv, float* q, float* k, float* v, int s, int b, int nq,
                         int ng, int d, float theta, int posOffset, bool roundBf16 = false);
void splitQkv(const float* qkv, float* q, float* k, float* v, int T, int nq, int ng, int d);
void mergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int T, int nq, int ng, int d);
void ropeBackwardMergeQkv(const float* dq, const float* dk, const float* dv, float* dqkv, int s,
                          int b, int nq, int ng, int d, float theta, int posOffset);
void attentionForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                      float* probs, float* out, bool fusedSoftmax);
void attentionBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                       const float* probs, const float* dout, float* dq, float* dk, float* dv,
                       float* scratch, bool fusedSoftmax = true);
void attentionFlashForward(const AttnDims& dims, const float* q, const float* k, const float* v,
                           float* stats, float* out);
void attentionFlashBackward(const AttnDims& dims, const float* q, const float* k, const float* v,
                            const float* stats, const float* dout, float* dq, float* dk,
                            float* dv, float* scratch);
void cpAttentionForward(const CpAttnDims& dims, const int* qPos, const float* q, const float* k,
                        const float* v, float* probs, float* out);
void cpAttentionBackward(const CpAttnDims& dims, const int* qPos, const float* q, const float* k,
                         const float* v, const float* probs, const float* dout, float* dq,
                         float* dk, float* dv);
void cpRingAttentionForward(const CpAttnDims& dims, const int* qPos, const int* kPos,
                            const float* q, const float* k, const float* v, float* out, float* lse,
                            bool first);
void cpRingAttentionDelta(const CpAttnDims& dims, const float* out, const float* dout,
                          float* delta);
void cpRingAttentionBackward(const CpAttnDims& dims, const int* qPos, const int* kPos,
                             const float* q, const float* k, const float* v, const float* lse,
                             const float* delta, const float* dout, float* dq, float* dk,
                             float* dv);
void biasGeluForward(const float* x, const float* b, float* y, int T, int C, bool roundBf16 = false);
void biasGeluForwardUnfused(const float* x, const float* b, float* y, int T, int C);
void biasGeluBackward(const float* dy, const float* x, const float* b, float* dx, float* db, int T,
                      int C);
void swigluForward(const float* x, float* y, int T, int F, bool roundBf16 = false);
void swigluBackward(const float* dy, const float* x, float* dx, int T, int F);
void dropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p, kernels::hd::DropoutSeed seed,
                    uint64_t offset);
void dropoutBackward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float p);
void dropoutMask(uint8_t* mask, int64_t n, float p, kernels::hd::DropoutSeed seed, uint64_t offset);
void biasDropoutAddFused(const float* x, const float* b, const float* residual, float* out,
                         uint8_t* mask, int T, int C, float p, kernels::hd::DropoutSeed seed, uint64_t offset,
                         bool roundBf16 = false);
void biasDropoutAddUnfused(const float* x, const float* b, const float* residual, float* out,
                           uint8_t* mask, int T, int C, float p, kernels::hd::DropoutSeed seed, uint64_t offset);
void biasDropoutAddBackward(const float* dout, const uint8_t* mask, float* dx, float* db, int T,
                            int C, float p);
void add(const float* a, const float* b, float* y, int64_t n);
void addInPlace(float* y, const float* x, int64_t n);
void scale(float* y, float alpha, int64_t n);
void addBias(float* y, const float* b, int T, int C);
void biasGradAccumulate(const float* dy, float* db, int T, int C);
void crossEntropyRowMax(const float* logits, float* rowMax, int T, int Vl);
void crossEntropyStats(const float* logits, const int32_t* targets, const float* rowMax,
                       float* targetLogit, float* sumExp, int T, int Vl, int vStart);
void crossEntropyLoss(const float* targetLogit, const float* sumExp, float* loss, int T);
void crossEntropyBackward(const float* logits, const int32_t* targets, const float* rowMax,
                          const float* sumExp, const float* dloss, float* dlogits, int T, int Vl,
                          int vStart);
void crossEntropyForwardUnfused(const float* logits, const int32_t* targets, float* probs,
                                float* loss, int T, int V);
void crossEntropyBackwardUnfused(const float* probs, const int32_t* targets, const float* dloss,
                                 float* dlogits, int T, int V);
void crossEntropyFused(float* logitsInGradOut, const int32_t* targets, const float* dloss,
                       float* loss, int T, int V);
// bits (null: none): the new params' bf16 bits (the bf16 model copy), in the same pass.
void adamwStep(float* param, const float* grad, float* m, float* v, int64_t n,
               const AdamParams& hp, uint16_t* bits);
void floatToBf16(const float* x, uint16_t* y, int64_t n);
void bf16ToFloat(const uint16_t* x, float* y, int64_t n);
void roundToBf16(float* x, int64_t n);
void fp8QuantizeDequantize(const float* x, float* y, uint8_t* codes, int64_t n, float scale,
                           Fp8Format f);
void fp8BlockQuantizeDequantize(const float* x, float* y, uint8_t* codes, void* scales,
                                int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows,
                                Fp8Format f, bool pow2 = true);

// MoE row movement and the experts' elementwise parts (kernels/cpu/ops.h): idx / start are
// int32 arrays where kernels read them (kernelInts, or a buffer the op uploaded the plan into).
void gatherRows(const float* src, const int32_t* idx, float* dst, int rows, int cols);
void gatherSumRows(const float* src, const int32_t* start, const int32_t* idx, float* dst, int outRows, int cols);
void scaleRows(const float* x, int64_t xRowStride, const float* s, float* y, int rows, int cols);
void moeProbGrad(const float* da, const float* act, const float* prob, const float* dy, const float* b2, float* dact,
                 float* dprob, int rows, int F, int h);
void weightedColumnSum(const float* dy, const float* w, float* db, int rows, int cols);
void sigmoidGateForward(const float* x, const float* w, const float* y, float* gate, float* out, int T, int h,
                        bool bf16Gate);
void sigmoidGateBackward(const float* dout, const float* y, const float* x, const float* gate, const float* w,
                         float* dy, float* dx, float* dw, int T, int h);
void moeRouterProbsBackward(const float* dprob, const int32_t* rowOf, const int32_t* sel, const float* a,
                            const float* b, const float* c, const float* full, float* dl, int T, int K, int E);
void moeRouterAuxBackward(const float* logits, const float* counts, const float* global, float* dl, int T, int E,
                          int G, int microBatch, kernels::cpu::MoeScore score, double wAux, double wSeq, double wGlobal,
                          double zScale);
// The router's choice and plan where the logits are (kernels/cpu/ops.h).
void moeRouteTopK(const float* logits, const float* bias, const float* sinkhorn, const int32_t* chosen,
                  int32_t* topi, float* probs, int T, int E, const kernels::cpu::MoeTopKSpec& spec);
void moeSinkhorn(const float* cost, int T, int E, float* out, float tol);
void moeQbDualUpdate(const float* scores, int m, int n, int k, const float* beta, int32_t* indices, float* quantile);
void moeRoutePlan(const int32_t* topi, const float* probs, int T, int K, int E,
                  const kernels::cpu::MoeCapacity& capacity, int32_t* offset, int32_t* routed, int32_t* tok,
                  int32_t* start, int32_t* inv, int32_t* tokExp, int32_t* rowOf, float* probT);
void moeRouterAuxCounts(const float* logits, int T, int E, int K, int G, int microBatch,
                        kernels::cpu::MoeScore score, float* counts, float* total, float* stats);
void moeRouterProbsCoefficients(const float* logits, const int32_t* topi, int T, int E,
                                const kernels::cpu::MoeTopKSpec& spec, bool sinkhorn, float* a, float* b, float* c,
                                float* full);
void moeRoutingMap(const int32_t* tokExp, const float* probT, int rows, int64_t TE, float* map);

}  // namespace ts::engine::kern
