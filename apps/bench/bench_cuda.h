// What the benches that run on GPU 0 share (bench_gpu_gemm, bench_gpu_attention, bench_moe_routing
// --cuda): error printers that name the program, device memory freed with its holder, timing by
// CUDA events, and the check for a GPU. Only under a CUDA build (TS_HAVE_CUDA).
#pragma once

#ifdef TS_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <vector>

#include "apps/bench/bench_args.h"
#include "common/status.h"

namespace ts::bench::gpu {

// The program's name in the messages below; main() sets it first.
inline const char*& program() {
    static const char* name = "bench";
    return name;
}

inline bool ok(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    std::fprintf(stderr, "%s: %s: %s\n", program(), what, cudaGetErrorString(e));
    return false;
}
inline bool ok(const ts::Status& s) {
    if (s.isOk()) return true;
    std::fprintf(stderr, "%s: %s\n", program(), s.toString().c_str());
    return false;
}
inline bool ok(cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    std::fprintf(stderr, "%s: %s: %s\n", program(), what, cublasGetStatusString(s));
    return false;
}

// Device memory of n elements of T (p null when cudaMalloc failed), freed with the object.
template <typename T>
struct Dev {
    T* p = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) {
        if (cudaMalloc(&p, sizeof(T) * (n ? n : 1)) != cudaSuccess) p = nullptr;
    }
    // ... holding a copy of host data (p null when either step failed)
    explicit Dev(const std::vector<T>& h) : Dev(h.size()) {
        if (p && cudaMemcpy(p, h.data(), sizeof(T) * n, cudaMemcpyHostToDevice) != cudaSuccess) {
            cudaFree(p);
            p = nullptr;
        }
    }
    ~Dev() { cudaFree(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    std::vector<T> get() const {
        std::vector<T> h(n);
        (void)cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost);
        return h;
    }
};

// The median time in ms of fn's work on the stream over reps calls, after 2 warm-up calls;
// negative when a call failed (fn returns false having said why).
inline double timeMs(void* stream, int reps, const std::function<bool()>& fn) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<double> t;
    bool good = true;
    for (int i = 0; i < reps + 2 && good; ++i) {
        cudaEventRecord(e0, s);
        good = fn();
        cudaEventRecord(e1, s);
        good = good && ok(cudaEventSynchronize(e1), "timed call");
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i >= 2) t.push_back(ms);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return good ? median(t) : -1.0;
}

// GPU 0's properties; false (having said so) when there is none.
inline bool firstGpu(cudaDeviceProp& prop) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::fprintf(stderr, "%s: no GPU (cudaGetDeviceCount found none)\n", program());
        return false;
    }
    return ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
}

}  // namespace ts::bench::gpu

#endif  // TS_HAVE_CUDA
