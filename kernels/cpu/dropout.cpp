// Dropout with a counter-based RNG and the (fused / unfused) bias-dropout-add.
// Element e = offset + i of a stream keeps iff its 32-bit uniform u_e >= p * 2^32, where
// u_{2k} and u_{2k+1} are the high and low halves of splitmix64 output number k of a stream
// keyed by splitmix64(seed). So any slice of a mask can be regenerated alone (recompute,
// sequence shards), nothing depends on thread count, and one 64-bit hash serves two elements.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ts::kernels::cpu {

namespace {

inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t streamKey(uint64_t seed) { return mix64(seed + kGolden); }

// P(drop) = threshold / 2^32.
inline uint64_t dropThreshold(float p) {
    if (!(p > 0.0f)) return 0;
    if (p >= 1.0f) return uint64_t{1} << 32;
    return static_cast<uint64_t>(std::llround(static_cast<double>(p) * 4294967296.0));
}

inline float keepScale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

// mask[i] = keep bit of stream element start + i, for i < n.
void keepBits(uint8_t* mask, int64_t n, uint64_t key, uint64_t start, uint64_t thr) {
    int64_t i = 0;
    if (n > 0 && (start & 1)) {  // odd start: low half of pair start/2
        mask[0] = (mix64(key + (start >> 1) * kGolden) & 0xFFFFFFFFull) >= thr;
        i = 1;
    }
    uint64_t pair = (start + static_cast<uint64_t>(i)) >> 1;
    for (; i + 2 <= n; i += 2, ++pair) {
        const uint64_t h = mix64(key + pair * kGolden);
        mask[i] = (h >> 32) >= thr;
        mask[i + 1] = (h & 0xFFFFFFFFull) >= thr;
    }
    if (i < n) mask[i] = (mix64(key + pair * kGolden) >> 32) >= thr;
}

constexpr int64_t kChunk = 2048;  // mask scratch when the caller does not keep the mask

}  // namespace

void dropoutMask(uint8_t* mask, int64_t n, float p, uint64_t seed, uint64_t offset) {
    keepBits(mask, n, streamKey(seed), offset, dropThreshold(p));
}

void dropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p, uint64_t seed,
                    uint64_t offset) {
    if (!(p > 0.0f)) {
        if (y != x) std::memcpy(y, x, sizeof(float) * n);
        if (mask) std::memset(mask, 1, n);
        return;
    }
    const uint64_t key = streamKey(seed), thr = dropThreshold(p);
    const float sc = keepScale(p);
    uint8_t local[kChunk];
    for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const int64_t len = std::min(kChunk, n - c0);
        uint8_t* m = mask ? mask + c0 : local;
        keepBits(m, len, key, offset + static_cast<uint64_t>(c0), thr);
        for (int64_t i = 0; i < len; ++i) y[c0 + i] = m[i] ? x[c0 + i] * sc : 0.0f;
    }
}

void dropoutBackward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float p) {
    if (!(p > 0.0f) || !mask) {
        // p == 0 keeps everything (a null mask only makes sense then)
        if (dx != dy) std::memcpy(dx, dy, sizeof(float) * n);
        return;
    }
    const float sc = keepScale(p);
    for (int64_t i = 0; i < n; ++i) dx[i] = mask[i] ? dy[i] * sc : 0.0f;
}

void biasDropoutAddFused(const float* x, const float* b, const float* residual, float* out,
                         uint8_t* mask, int T, int C, float p, uint64_t seed, uint64_t offset) {
    if (!(p > 0.0f)) {
        for (int t = 0; t < T; ++t) {
            const int64_t off = static_cast<int64_t>(t) * C;
            if (b)
                for (int c = 0; c < C; ++c) out[off + c] = residual[off + c] + (x[off + c] + b[c]);
            else
                for (int c = 0; c < C; ++c) out[off + c] = residual[off + c] + x[off + c];
        }
        if (mask) std::memset(mask, 1, static_cast<size_t>(T) * C);
        return;
    }
    const uint64_t key = streamKey(seed), thr = dropThreshold(p);
    const float sc = keepScale(p);
    uint8_t local[kChunk];
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        for (int c0 = 0; c0 < C; c0 += static_cast<int>(kChunk)) {
            const int len = static_cast<int>(std::min<int64_t>(kChunk, C - c0));
            const int64_t base = off + c0;
            uint8_t* m = mask ? mask + base : local;
            keepBits(m, len, key, offset + static_cast<uint64_t>(base), thr);
            const float* xb = x + base;
            const float* rb = residual + base;
            float* ob = out + base;
            if (b) {
                const float* bb = b + c0;
                for (int c = 0; c < len; ++c) ob[c] = rb[c] + (m[c] ? (xb[c] + bb[c]) * sc : 0.0f);
            } else {
                for (int c = 0; c < len; ++c) ob[c] = rb[c] + (m[c] ? xb[c] * sc : 0.0f);
            }
        }
    }
}

void biasDropoutAddUnfused(const float* x, const float* b, const float* residual, float* out,
                           uint8_t* mask, int T, int C, float p, uint64_t seed, uint64_t offset) {
    const int64_t n = static_cast<int64_t>(T) * C;
    if (b) {
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < C; ++c)
                out[static_cast<int64_t>(t) * C + c] = x[static_cast<int64_t>(t) * C + c] + b[c];
        dropoutForward(out, out, mask, n, p, seed, offset);
    } else {
        dropoutForward(x, out, mask, n, p, seed, offset);
    }
    for (int64_t i = 0; i < n; ++i) out[i] = residual[i] + out[i];
}

void biasDropoutAddBackward(const float* dout, const uint8_t* mask, float* dx, float* db, int T,
                            int C, float p) {
    dropoutBackward(dout, mask, dx, static_cast<int64_t>(T) * C, p);
    if (db) biasGradAccumulate(dx, db, T, C);
}

}  // namespace ts::kernels::cpu
