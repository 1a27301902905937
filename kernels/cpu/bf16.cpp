// fp32 <-> bf16 conversion: round to nearest, ties to even; NaN stays NaN (quieted, sign kept),
// values that round past the largest bf16 become inf (as in torch and CUDA's __float2bfloat16).
// The conversion itself is kernels/common/bf16.h, shared with the CUDA kernels.
#include "kernels/common/bf16.h"
#include "kernels/cpu/ops.h"

#include <cstring>

namespace ts::kernels::cpu {

using hd::bf16FromFloat;
using hd::bf16ToFloatValue;

void floatToBf16(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {  // bf16FromFloat, its NaN case a select (as roundToBf16)
        uint32_t v;
        std::memcpy(&v, x + i, sizeof v);
        const uint32_t rounded = (v + 0x7FFFu + ((v >> 16) & 1u)) >> 16;
        const uint32_t nan = (v >> 16) | 0x0040u;
        y[i] = static_cast<uint16_t>((v & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
    }
}

void bf16ToFloat(const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = bf16ToFloatValue(x[i]);
}

void roundToBf16(float* x, int64_t n) {
    // hd::bf16RoundFloat without its early return, so GCC vectorizes the loop: the NaN case is a
    // select (the same bits: KernelsSharedHd.Bf16MatchesTheOracleOnRandomBitPatternsAndSpecials).
    for (int64_t i = 0; i < n; ++i) {
        uint32_t v;
        std::memcpy(&v, x + i, sizeof v);
        const uint32_t rounded = (v + 0x7FFFu + ((v >> 16) & 1u)) & 0xFFFF0000u;
        const uint32_t nan = (v | 0x00400000u) & 0xFFFF0000u;
        v = (v & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded;
        std::memcpy(x + i, &v, sizeof v);
    }
}

}  // namespace ts::kernels::cpu
