// fp32 <-> bf16 bit conversion shared by the CPU oracle (kernels/cpu/bf16.cpp) and the CUDA
// kernels (kernels/cuda/bf16.cu), compiled for host and device so both round identically:
// round to nearest, ties to even; NaN stays NaN (quieted: bit 0x0040 set, sign and payload's
// high bits kept); values that round past the largest bf16 become inf (as torch and CUDA's
// __float2bfloat16). tests/kernels/test_dropout_rng_shared.cpp checks them against the oracle.
#pragma once

#include <cstdint>

#include "kernels/common/float_bits.h"

namespace ts::kernels::hd {

TS_HD inline uint16_t bf16FromFloat(float f) {
    uint32_t u = floatBits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

TS_HD inline float bf16ToFloatValue(uint16_t h) { return floatFromBits(static_cast<uint32_t>(h) << 16); }

// f rounded to the nearest bf16, kept in fp32 storage.
TS_HD inline float bf16RoundFloat(float f) { return bf16ToFloatValue(bf16FromFloat(f)); }

}  // namespace ts::kernels::hd
