// Block-scaled FP8 emulation (see fp8_block.h). The scalar conversions (E8M0, the blockwise
// scale) live in kernels/common/fp8_scalar.h, shared with the CUDA kernels.
#include "kernels/cpu/fp8_block.h"

#include "kernels/common/fp8_scalar.h"

#include <algorithm>
#include <cmath>

namespace ts::kernels::cpu {

uint8_t e8m0FromFloat(float v) { return fp8s::e8m0FromFloat(v); }

float e8m0ToFloat(uint8_t e) { return fp8s::e8m0ToFloat(e); }

namespace {

int blockLen(Fp8BlockKind kind) { return kind == Fp8BlockKind::Mx1x32 ? 32 : 128; }

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t fp8BlockScaleCount(int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows) {
    const int64_t b = blockLen(kind);
    if (kind == Fp8BlockKind::Block128x128) return ceilDiv(rows, b) * ceilDiv(cols, b);
    return alongRows ? rows * ceilDiv(cols, b) : ceilDiv(rows, b) * cols;
}

int64_t fp8BlockBytes(int64_t rows, int64_t cols, Fp8BlockKind kind, bool alongRows) {
    const int64_t scaleBytes = kind == Fp8BlockKind::Mx1x32 ? 1 : 4;
    return rows * cols + scaleBytes * fp8BlockScaleCount(rows, cols, kind, alongRows);
}

float fp8BlockScale(float amax, float fp8Max, bool pow2) { return fp8s::fp8BlockScale(amax, fp8Max, pow2); }

void fp8BlockQuantizeDequantize(const float* x, float* y, uint8_t* codes, void* scales, int64_t rows, int64_t cols,
                                Fp8BlockKind kind, bool alongRows, Fp8Format f, bool pow2) {
    const int64_t b = blockLen(kind);
    const float mx = fp8Max(f);
    // A block: rows [r0, r1) x cols [c0, c1).
    auto block = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, int64_t idx) {
        float amax = 0.0f;
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) {
                const float a = std::fabs(x[r * cols + c]);
                amax = (std::isnan(a) || std::isnan(amax)) ? NAN : std::max(amax, a);
            }
        float q, dq;  // multiply before encoding, after decoding
        if (kind == Fp8BlockKind::Mx1x32) {
            const uint8_t e = e8m0FromFloat(amax * (1.0f / mx));
            q = fp8s::e8m0EncodeFactor(e);  // TE's exp2f_rcp
            dq = e8m0ToFloat(e);
            if (scales) static_cast<uint8_t*>(scales)[idx] = e;
        } else {
            q = fp8BlockScale(amax, mx, pow2);
            dq = 1.0f / q;
            if (scales) static_cast<float*>(scales)[idx] = dq;
        }
        for (int64_t r = r0; r < r1; ++r)
            for (int64_t c = c0; c < c1; ++c) {
                const int64_t i = r * cols + c;
                const uint8_t code = fp8Encode(x[i] * q, f);
                if (codes) codes[i] = code;
                y[i] = fp8Decode(code, f) * dq;
            }
    };
    int64_t idx = 0;
    if (kind == Fp8BlockKind::Block128x128) {
        for (int64_t r0 = 0; r0 < rows; r0 += b)
            for (int64_t c0 = 0; c0 < cols; c0 += b) block(r0, std::min(rows, r0 + b), c0, std::min(cols, c0 + b), idx++);
    } else if (alongRows) {
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c0 = 0; c0 < cols; c0 += b) block(r, r + 1, c0, std::min(cols, c0 + b), idx++);
    } else {
        for (int64_t r0 = 0; r0 < rows; r0 += b)
            for (int64_t c = 0; c < cols; ++c) block(r0, std::min(rows, r0 + b), c, c + 1, idx++);
    }
}

}  // namespace ts::kernels::cpu
