// A float's IEEE-754 bit pattern and back, for host and device (TS_HD): the bit casts that the
// shared scalar code (bf16.h, fp8_scalar.h) builds on. Host: memcpy; device: CUDA's intrinsics.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/hd.h"

namespace ts::kernels::hd {

TS_HD inline uint32_t floatBits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
#endif
}

TS_HD inline float floatFromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
#endif
}

}  // namespace ts::kernels::hd
