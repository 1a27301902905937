// FP8 emulation (REFERENCE.md §6.1): E4M3 ("fn": no infinities, max 448, NaN = S.1111.111) and
// E5M2 (IEEE-like: infinities, NaNs, max 57344), encoded from fp32 with round-to-nearest-even,
// subnormals, and saturation of finite overflow and of infinities to +-max (the saturating
// cast Transformer Engine uses); NaN stays NaN. The scalar conversions live in
// kernels/common/fp8_scalar.h, shared with the CUDA kernels so both give the same bits.
#include <algorithm>
#include <cmath>

#include "kernels/common/fp8_scalar.h"
#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {

float fp8Max(Fp8Format f) { return fp8s::fp8MaxOf(int(f)); }

float fp8Decode(uint8_t code, Fp8Format f) { return fp8s::fp8Decode(code, int(f)); }

uint8_t fp8Encode(float x, Fp8Format f) { return fp8s::fp8Encode(x, int(f)); }

float amaxOf(const float* x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float a = std::fabs(x[i]);
        if (std::isnan(a)) return a;
        m = std::max(m, a);
    }
    return m;
}

void fp8QuantizeCurrent(const float* x, float* y, uint8_t* codes, int64_t n, const float* amax, float divisor,
                        Fp8Format f, float* observed) {
    if (observed) *observed = *amax / divisor;
    fp8QuantizeDequantize(x, y, codes, n, fp8CurrentScale(*amax, divisor, f), f);
}

float fp8CurrentScale(float amax, float divisor, Fp8Format f) {
    return fp8s::currentScaleDivided(amax, divisor, fp8Max(f));
}

void amaxAccumulate(const float* x, int64_t n, float divisor, float* slot) {
    const float a = amaxOf(x, n) / divisor;
    float& s = *slot;
    if (std::isnan(a) || std::isnan(s)) s = NAN;
    else s = std::max(s, a);
}

void fp8QuantizeDelayed(const float* x, float* y, uint8_t* codes, int64_t n, const float* scale, float divisor,
                        Fp8Format f) {
    fp8QuantizeDequantize(x, y, codes, n, *scale / divisor, f);
}

void fp8QuantizeDequantize(const float* x, float* y, uint8_t* codes, int64_t n, float scale, Fp8Format f) {
    const float inv = 1.0f / scale;
    const fp8s::Fp8Rounder r = fp8s::Fp8Rounder::make(int(f));
    if (codes) {
        for (int64_t i = 0; i < n; ++i) {
            const float v = r.round(x[i] * scale);
            codes[i] = r.code(v);
            y[i] = v * inv;
        }
        return;
    }
    for (int64_t i = 0; i < n; ++i) y[i] = r.round(x[i] * scale) * inv;
}

}  // namespace ts::kernels::cpu
