// Dropout with a counter-based RNG and the (fused / unfused) bias-dropout-add.
// Element i of a call keeps iff hash(seed, offset + i) >= p * 2^32, where hash is the
// splitmix64 output number (offset + i) of a stream keyed by splitmix64(seed): any slice of a
// mask can be regenerated alone (recompute, sequence shards) and no result depends on threads.
#include "kernels/cpu/ops.h"

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

// Keep threshold on the top 32 bits of the hash: P(drop) = threshold / 2^32.
inline uint64_t dropThreshold(float p) {
    if (!(p > 0.0f)) return 0;
    if (p >= 1.0f) return uint64_t{1} << 32;
    return static_cast<uint64_t>(std::llround(static_cast<double>(p) * 4294967296.0));
}

inline uint8_t keepBit(uint64_t key, uint64_t counter, uint64_t threshold) {
    return (mix64(key + counter * kGolden) >> 32) >= threshold ? 1 : 0;
}

inline float keepScale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

}  // namespace

void dropoutMask(uint8_t* mask, int64_t n, float p, uint64_t seed, uint64_t offset) {
    const uint64_t key = streamKey(seed), thr = dropThreshold(p);
    for (int64_t i = 0; i < n; ++i) mask[i] = keepBit(key, offset + static_cast<uint64_t>(i), thr);
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
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t keep = keepBit(key, offset + static_cast<uint64_t>(i), thr);
        if (mask) mask[i] = keep;
        y[i] = keep ? x[i] * sc : 0.0f;
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
    const bool drop = p > 0.0f;
    const uint64_t key = streamKey(seed), thr = dropThreshold(p);
    const float sc = keepScale(p);
    for (int t = 0; t < T; ++t) {
        const int64_t off = static_cast<int64_t>(t) * C;
        for (int c = 0; c < C; ++c) {
            const int64_t i = off + c;
            const float u = b ? x[i] + b[c] : x[i];
            uint8_t keep = 1;
            if (drop) keep = keepBit(key, offset + static_cast<uint64_t>(i), thr);
            if (mask) mask[i] = keep;
            out[i] = residual[i] + (drop ? (keep ? u * sc : 0.0f) : u);
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
