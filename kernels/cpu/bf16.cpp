// fp32 <-> bf16 conversion: round to nearest, ties to even; NaN stays NaN (quieted, sign kept),
// values that round past the largest bf16 become inf (as in torch and CUDA's __float2bfloat16).
#include "kernels/cpu/ops.h"

#include <cstring>

namespace ts::kernels::cpu {

namespace {

inline uint16_t toBf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

inline float fromBf16(uint16_t h) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

}  // namespace

void floatToBf16(const float* x, uint16_t* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = toBf16(x[i]);
}

void bf16ToFloat(const uint16_t* x, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = fromBf16(x[i]);
}

void roundToBf16(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = fromBf16(toBf16(x[i]));
}

}  // namespace ts::kernels::cpu
