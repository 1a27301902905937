// The ops the CUDA backend runs: the kernel functions kernels/cuda/ops_cuda.h declares, by
// their names there ("gemm", "layerNormForward", ...). CudaDevice::supports(op) answers from
// this list. Built with or without CUDA, so a CPU test (tests/engine/backend) checks that the
// list and ops_cuda.h name the same ops.
#pragma once

#include <string>
#include <vector>

namespace ts::engine {

// In ops_cuda.h order; the runtime helpers there (deviceAlloc, copyAsync, ...) are not ops.
const std::vector<std::string>& cudaOpNames();
bool isCudaOp(const std::string& op);

}  // namespace ts::engine
