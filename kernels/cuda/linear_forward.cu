// Linear forward through cuBLAS: y[T, out] = x[T, in] W[out, in]^T + b. Row-major y is the
// column-major [out, T] matrix W x^T, i.e. SGEMM(op_T(W as col-major [in, out]), x as
// col-major [in, T]); the bias is broadcast into y first and the GEMM accumulates (beta = 1).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cublas_v2.h>

#include <string>

namespace ts::kernels::cuda {

namespace {

__global__ void broadcastBiasKernel(const float* __restrict__ b, float* __restrict__ y,
                                    int64_t n, int out) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride)
        y[i] = b[i % out];
}

Status fromCublas(cublasStatus_t st, const char* what) {
    if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
    std::string msg = std::string(what) + ": " + cublasGetStatusString(st);
    if (st == CUBLAS_STATUS_ALLOC_FAILED) return {ErrorCode::OutOfMemory, msg};
    if (st == CUBLAS_STATUS_INVALID_VALUE) return Status::invalid(msg);
    if (st == CUBLAS_STATUS_NOT_INITIALIZED) return Status::unsupported(msg);
    return Status::internal(msg);
}

}  // namespace

Status linearForward(void* cublasHandle, const float* x, const float* W, const float* b,
                     float* y, int T, int in, int out, void* stream) {
    if (!cublasHandle) return Status::invalid("linearForward: no cuBLAS handle (cublasCreateHandle)");
    if (T < 0 || in <= 0 || out <= 0)
        return Status::invalid("linearForward: need T >= 0, in > 0, out > 0");
    if (T == 0) return Status::ok();
    auto handle = static_cast<cublasHandle_t>(cublasHandle);
    TS_RETURN_IF_ERROR(fromCublas(cublasSetStream(handle, detail::asStream(stream)), "cublasSetStream"));
    float beta = 0.0f;
    if (b) {
        const int64_t n = static_cast<int64_t>(T) * out;
        constexpr int kThreads = 256;
        broadcastBiasKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(
            b, y, n, out);
        TS_RETURN_IF_ERROR(detail::launchStatus("linearForward bias launch"));
        beta = 1.0f;
    }
    const float alpha = 1.0f;
    return fromCublas(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &alpha, W, in, x,
                                  in, &beta, y, out),
                      "linearForward cublasSgemm");
}

}  // namespace ts::kernels::cuda
