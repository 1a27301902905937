// fp32 <-> bf16 conversions on device with the CPU oracle's rounding (kernels/common/bf16.h, the
// same __host__ __device__ functions kernels/cpu/bf16.cpp runs): round to nearest even, NaN kept
// (quieted), overflow to inf. Integer bit operations only, so bit-identical to the CPU.
#include "kernels/common/bf16.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/fp8_codes.cuh"
#include "kernels/cuda/ops_cuda.h"

namespace ts::kernels::cuda {

namespace {

constexpr int kThreads = 256;

using detail::globalThread;
using detail::gridThreads;

__global__ void castFloatToBf16Kernel(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = hd::bf16FromFloat(x[i]);
}

// The codes of FP8 values stored at a scale (kernels/common/fp8_codes.h): bf16(y * scale), the
// product rounded as written (__fmul_rn, as the host check computes it).
__global__ void castFp8CodesToBf16Kernel(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n,
                                         fp8codes::Binding codes) {
    const float scale = detail::codesScale(codes);
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = hd::bf16FromFloat(__fmul_rn(x[i], scale));
}

__global__ void castBf16ToFloatKernel(const uint16_t* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) y[i] = hd::bf16ToFloatValue(x[i]);
}

__global__ void roundToBf16CastKernel(float* __restrict__ x, int64_t n) {
    for (int64_t i = globalThread(); i < n; i += gridThreads()) x[i] = hd::bf16RoundFloat(x[i]);
}

}  // namespace


Status floatToBf16(const float* x, uint16_t* y, int64_t n, void* stream) {
    if (n < 0) return Status::invalid("floatToBf16: negative element count");
    if (n == 0) return Status::ok();
    castFloatToBf16Kernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(x, y, n);
    return detail::launchStatus("floatToBf16 launch");
}

Status fp8CodesToBf16(const float* x, uint16_t* y, int64_t n, fp8codes::Binding codes, void* stream) {
    if (n < 0) return Status::invalid("fp8CodesToBf16: negative element count");
    if (!fp8codes::hasCodes(codes))
        return Status::invalid("fp8CodesToBf16: the operand is not bound as FP8 codes at a scale");
    if (n == 0) return Status::ok();
    castFp8CodesToBf16Kernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(x, y, n,
                                                                                                       codes);
    return detail::launchStatus("fp8CodesToBf16 launch");
}

Status bf16ToFloat(const uint16_t* x, float* y, int64_t n, void* stream) {
    if (n < 0) return Status::invalid("bf16ToFloat: negative element count");
    if (n == 0) return Status::ok();
    castBf16ToFloatKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(x, y, n);
    return detail::launchStatus("bf16ToFloat launch");
}

Status roundToBf16(float* x, int64_t n, void* stream) {
    if (n < 0) return Status::invalid("roundToBf16: negative element count");
    if (n == 0) return Status::ok();
    roundToBf16CastKernel<<<detail::blocksFor(n, kThreads), kThreads, 0, detail::asStream(stream)>>>(x, n);
    return detail::launchStatus("roundToBf16 launch");
}

}  // namespace ts::kernels::cuda
