// What the MoE router's two balancing modes share between the CPU oracle
// (kernels/cpu/moe_balance.cpp) and the CUDA kernels (kernels/cuda/moe_route.cu), so that both
// compute the same bits: the sinkhorn iteration's constants and the order of its sums, and the
// total order on floats that quantile balancing's selections use.
#pragma once

#include <cstdint>

#include "kernels/common/float_bits.h"
#include "kernels/common/hd.h"

namespace ts::kernels::hd {

// Sinkhorn (Megatron's moe_utils.sinkhorn): eps in the normalisers, the iteration cap (Megatron
// iterates until converged; the cap only ends a run whose error never falls, e.g. an infinite
// logit), and the tokens per partial sum of an expert's column (each column is summed in chunks
// of this many tokens, each chunk in token order, then the chunks in order: the device sums the
// chunks in parallel).
constexpr float kSinkhornEps = 1e-8f;
constexpr int kSinkhornMaxIters = 100000;
constexpr int kSinkhornChunk = 256;

// A float's place in a total order, as an unsigned key: a larger key is a larger value; -0 and +0
// are one key (+0's); every NaN one key above +inf (torch.topk ranks NaN highest; the CPU and the
// GPU make NaNs of different signs and payloads, e.g. inf - inf, so the key must not see them).
// Quantile balancing selects by these keys, ties between equal keys to the lower index; a NaN
// comes back from its key as the NaN 0x7FFFFFFF.
TS_HD inline uint32_t floatOrderKey(float x) {
    if (x != x) return 0xFFFFFFFFu;
    const uint32_t u = floatBits(x == 0.f ? 0.f : x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
TS_HD inline float floatOfOrderKey(uint32_t k) {
    return floatFromBits((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

}  // namespace ts::kernels::hd
