// fp32 <-> bf16 conversion: round to nearest, ties to even; NaN stays NaN (quieted, sign kept),
// values that round past the largest bf16 become inf (as in torch and CUDA's __float2bfloat16).
// The conversion itself is kernels/common/bf16.h, shared with the CUDA kernels.
#include "kernels/common/bf16.h"
#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

using hd::bf16FromFloat;
using hd::bf16ToFloatValue;

void floatToBf16(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = bf16FromFloat(x[i]);
}

void bf16ToFloat(const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = bf16ToFloatValue(x[i]);
}

void roundToBf16(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = bf16ToFloatValue(bf16FromFloat(x[i]));
}

}  // namespace ts::kernels::cpu
