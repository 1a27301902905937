// CUDA kernels: one op per .cu file with its launcher (as in llm.c), checked against the CPU
// oracle (kernels/cpu/ops.h) by tests/gpu/test_kernels_cuda.cpp. Same shapes and semantics as
// the CPU ops of the same name; pointers are device pointers, `stream` is a cudaStream_t
// (nullptr = legacy default stream). Launches are asynchronous: a returned ok Status means the
// launch was accepted; execution errors surface at the next synchronizing call. This header
// needs no CUDA headers, so plain C++ code (engine, tests) can include it.
#pragma once

#include "common/status.h"

#include <cstddef>
#include <cstdint>

namespace ts::kernels::cuda {

// --- runtime helpers (thin, Status-returning wrappers so callers need no CUDA headers) -----
// Number of usable devices; 0 (and an ok Status) when there is no driver or no device.
Status deviceCount(int* count);
Status deviceAlloc(void** ptr, size_t bytes);
Status deviceFree(void* ptr);
Status copyToDevice(void* dst, const void* src, size_t bytes);
Status copyToHost(void* dst, const void* src, size_t bytes);
Status streamCreate(void** stream);
Status streamDestroy(void* stream);
Status streamSynchronize(void* stream);
// cuBLAS handle (cublasHandle_t) for linearForward; one per thread/stream user.
Status cublasCreateHandle(void** handle);
Status cublasDestroyHandle(void* handle);

// --- ops -----------------------------------------------------------------------------------
// x, y: [T, C]; w, b: [C] (b may be null); mean, rstd: [T]. Biased variance, eps in the sqrt.
Status layerNormForward(const float* x, const float* w, const float* b, float* y, float* mean,
                        float* rstd, int T, int C, float eps, void* stream);
// y = gelu_tanh(x + b); x, y: [T, C], b: [C] or null.
Status biasGeluForward(const float* x, const float* b, float* y, int T, int C, void* stream);
// torch.optim.AdamW step, see kernels/cpu/ops.h AdamParams (same fields, same formula).
struct AdamParams {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weightDecay = 0.0f;
    int64_t step = 1;
    float gradScale = 1.0f;  // g = grad * gradScale (clipping folded in), as kernels::cpu
};
Status adamwStep(float* param, const float* grad, float* m, float* v, int64_t n,
                 const AdamParams& hp, void* stream);
// Row-wise cross entropy over the full vocab: logits [T, V], targets [T] -> loss [T].
// A target outside [0, V) contributes no target term (as the CPU ops; callers validate ids).
Status crossEntropyForward(const float* logits, const int32_t* targets, float* loss, int T,
                           int V, void* stream);
// y[T, out] = x[T, in] W[out, in]^T + b[out] (b may be null), via cuBLAS SGEMM on `stream`.
Status linearForward(void* cublasHandle, const float* x, const float* W, const float* b,
                     float* y, int T, int in, int out, void* stream);

}  // namespace ts::kernels::cuda
