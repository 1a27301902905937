// Runtime helpers of ops_cuda.h: device count, memory, streams, cuBLAS handles.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

#include <cublas_v2.h>

namespace ts::kernels::cuda {

using detail::fromCuda;

Status deviceCount(int* count) {
    *count = 0;
    const cudaError_t err = cudaGetDeviceCount(count);
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        cudaGetLastError();  // clear the sticky-free error so later calls start clean
        *count = 0;
        return Status::ok();
    }
    if (err != cudaSuccess) *count = 0;
    return fromCuda(err, "cudaGetDeviceCount");
}

Status deviceAlloc(void** ptr, size_t bytes) { return fromCuda(cudaMalloc(ptr, bytes), "cudaMalloc"); }
Status deviceFree(void* ptr) { return fromCuda(cudaFree(ptr), "cudaFree"); }

Status copyToDevice(void* dst, const void* src, size_t bytes) {
    return fromCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy to device");
}

Status copyToHost(void* dst, const void* src, size_t bytes) {
    return fromCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy to host");
}

Status streamCreate(void** stream) {
    cudaStream_t s = nullptr;
    TS_RETURN_IF_ERROR(fromCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    *stream = s;
    return Status::ok();
}

Status streamDestroy(void* stream) {
    return fromCuda(cudaStreamDestroy(detail::asStream(stream)), "cudaStreamDestroy");
}

Status streamSynchronize(void* stream) {
    return fromCuda(cudaStreamSynchronize(detail::asStream(stream)), "cudaStreamSynchronize");
}

Status cublasCreateHandle(void** handle) {
    cublasHandle_t h = nullptr;
    const cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS)
        return Status::internal(std::string("cublasCreate failed: ") + cublasGetStatusString(st));
    *handle = h;
    return Status::ok();
}

Status cublasDestroyHandle(void* handle) {
    const cublasStatus_t st = cublasDestroy(static_cast<cublasHandle_t>(handle));
    if (st != CUBLAS_STATUS_SUCCESS)
        return Status::internal(std::string("cublasDestroy failed: ") + cublasGetStatusString(st));
    return Status::ok();
}

}  // namespace ts::kernels::cuda
