// Shared pieces of the .cu files: CUDA error -> ts::Status translation and warp reductions.
#pragma once

#include "common/status.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ts::kernels::cuda::detail {

inline Status fromCuda(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return Status::ok();
    std::string msg = std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                      cudaGetErrorString(err) + ")";
    switch (err) {
        case cudaErrorMemoryAllocation:
            return {ErrorCode::OutOfMemory, msg};
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
        case cudaErrorNoKernelImageForDevice:
            return Status::unsupported(msg);
        case cudaErrorInvalidValue:
        case cudaErrorInvalidDevicePointer:
            return Status::invalid(msg);
        default:
            return Status::internal(msg);
    }
}

// A process-wide switch: on where the environment variable `name` is "1" (read at the first
// call), until set() says otherwise.
class EnvSwitch {
public:
    explicit EnvSwitch(const char* name) : m_name(name) {}
    void set(bool on) { m_state.store(on ? 1 : 0); }
    bool on() {
        int v = m_state.load();
        if (v < 0) {
            const char* e = std::getenv(m_name);
            v = e && std::strcmp(e, "1") == 0 ? 1 : 0;
            m_state.store(v);
        }
        return v == 1;
    }

private:
    const char* m_name;
    std::atomic<int> m_state{-1};  // -1: the environment not read yet
};

// After a <<<>>> launch: configuration errors show up here (execution errors come later).
inline Status launchStatus(const char* what) { return fromCuda(cudaGetLastError(), what); }

inline cudaStream_t asStream(void* s) { return static_cast<cudaStream_t>(s); }

__device__ inline float warpSum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ inline float warpMax(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// std::max(a, b)'s rule, (a < b) ? b : a, for a sequential max that mirrors an oracle's: a NaN
// first stays, a NaN later is passed over (fmax passes over both).
__device__ inline double maxAsStd(double a, double b) { return a < b ? b : a; }

// Grid-stride loops: this thread's first index and the stride.
__device__ inline int64_t globalThread() {
    return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t gridThreads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

inline int blocksFor(int64_t n, int threads, int cap = 65535 * 8) {
    const int64_t b = (n + threads - 1) / threads;
    return static_cast<int>(b < 1 ? 1 : (b > cap ? cap : b));
}

}  // namespace ts::kernels::cuda::detail
