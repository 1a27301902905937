// Runtime helpers of ops_cuda.h: devices, memory, copies, streams.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops_cuda.h"

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

// cudaMemcpy from pageable memory returns once the source is staged, maybe before the copy has
// landed, and the streams kernels run on are non-blocking (they do not wait for the legacy
// stream): wait for the copy, so that a kernel launched next reads the data.
Status copyToDevice(void* dst, const void* src, size_t bytes) {
    TS_RETURN_IF_ERROR(fromCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "copy to device"));
    return fromCuda(cudaStreamSynchronize(cudaStreamLegacy), "copy to device (wait)");
}

Status copyToHost(void* dst, const void* src, size_t bytes) {
    return fromCuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "copy to host");
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

Status setDevice(int device) { return fromCuda(cudaSetDevice(device), "cudaSetDevice"); }

Status hostAllocPinned(void** ptr, size_t bytes) {
    return fromCuda(cudaMallocHost(ptr, bytes), "cudaMallocHost");
}
Status hostFreePinned(void* ptr) { return fromCuda(cudaFreeHost(ptr), "cudaFreeHost"); }

Status copyAsync(void* dst, const void* src, size_t bytes, void* stream) {
    if (bytes == 0) return Status::ok();
    return fromCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, detail::asStream(stream)),
                    "cudaMemcpyAsync");
}

Status copy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t widthBytes, size_t height,
                   void* stream) {
    if (widthBytes == 0 || height == 0) return Status::ok();
    return fromCuda(cudaMemcpy2DAsync(dst, dpitch, src, spitch, widthBytes, height, cudaMemcpyDefault,
                                      detail::asStream(stream)),
                    "cudaMemcpy2DAsync");
}

Status memsetAsync(void* dst, int value, size_t bytes, void* stream) {
    if (bytes == 0) return Status::ok();
    return fromCuda(cudaMemsetAsync(dst, value, bytes, detail::asStream(stream)), "cudaMemsetAsync");
}

Status deviceSynchronize() { return fromCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace ts::kernels::cuda
