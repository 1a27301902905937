// cuBLAS plumbing shared by the GEMM .cu files: status translation, and the handle kernels/cuda
// keeps per (host thread, current device), bound to the caller's stream.
#pragma once

#include "common/status.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace ts::kernels::cuda::detail {

Status fromCublas(cublasStatus_t st, const char* what);
// The cuBLAS handle of this thread for the current device, created on first use, with its
// stream set to `stream`. Fails with the cuBLAS/CUDA error when no handle can be made.
Status cublasFor(void* stream, cublasHandle_t* handle);
// The same with cuBLAS's default math (tensor cores for bf16 operands; fp32 stays full fp32):
// the handle of the bf16 GEMMs.
Status cublasTensorOpFor(void* stream, cublasHandle_t* handle);
// The cuBLASLt handle of this thread for the current device (cuBLASLt takes the stream per call).
Status cublasLtFor(cublasLtHandle_t* handle);

}  // namespace ts::kernels::cuda::detail
