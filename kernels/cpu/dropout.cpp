// Dropout with a counter-based RNG and the (fused / unfused) bias-dropout-add.
// Element e = offset + i of a stream keeps iff its 32-bit uniform u_e >= p * 2^32, where
// u_{2k} and u_{2k+1} are the high and low halves of splitmix64 output number k of a stream
// keyed by splitmix64(seed). So any slice of a mask can be regenerated alone (recompute,
// sequence shards), nothing depends on thread count, and one 64-bit hash serves two elements.
// The RNG itself lives in kernels/common/dropout_rng.h, shared with the CUDA kernels.
#include "kernels/common/dropout_rng.h"
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ts::kernels::cpu {

namespace {

using hd::dropoutKeepScale;
using hd::dropoutPairBits;
using hd::dropoutStreamKey;
using hd::dropoutThreshold;

// mask[i] = keep bit of stream element start + i, for i < n.
void keepBits(uint8_t* mask, int64_t n, uint64_t key, uint64_t start, uint64_t thr) {
    int64_t i = 0;
    if (n > 0 && (start & 1)) {  // odd start: low half of pair start/2
        mask[0] = hd::dropoutKeepLow(dropoutPairBits(key, start >> 1), thr);
        i = 1;
    }
    uint64_t pair = (start + static_cast<uint64_t>(i)) >> 1;
    for (; i + 2 <= n; i += 2, ++pair) {
        const uint64_t h = dropoutPairBits(key, pair);
        mask[i] = hd::dropoutKeepHigh(h, thr);
        mask[i + 1] = hd::dropoutKeepLow(h, thr);
    }
    if (i < n) mask[i] = hd::dropoutKeepHigh(dropoutPairBits(key, pair), thr);
}

constexpr int64_t kChunk = 2048;  // mask scratch when the caller does not keep the mask

}  // namespace

void dropoutMask(uint8_t* mask, int64_t n, float p, hd::DropoutSeed seed, uint64_t offset) {
    keepBits(mask, n, dropoutStreamKey(seed.value()), offset, dropoutThreshold(p));
}

void dropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p, hd::DropoutSeed seed,
                    uint64_t offset) {
    if (!(p > 0.0f)) {
        if (y != x) std::memcpy(y, x, sizeof(float) * n);
        if (mask) std::memset(mask, 1, n);
        return;
    }
    const uint64_t key = dropoutStreamKey(seed.value()), thr = dropoutThreshold(p);
    const float sc = dropoutKeepScale(p);
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
    const float sc = dropoutKeepScale(p);
    for (int64_t i = 0; i < n; ++i) dx[i] = mask[i] ? dy[i] * sc : 0.0f;
}

void biasDropoutAddFused(const float* x, const float* b, const float* residual, float* out,
                         uint8_t* mask, int T, int C, float p, hd::DropoutSeed seed, uint64_t offset, bool roundBf16) {
    if (!(p > 0.0f)) {
        for (int t = 0; t < T; ++t) {
            const int64_t off = static_cast<int64_t>(t) * C;
            if (b)
                for (int c = 0; c < C; ++c) out[off + c] = residual[off + c] + (x[off + c] + b[c]);
            else
                for (int c = 0; c < C; ++c) out[off + c] = residual[off + c] + x[off + c];
            if (roundBf16) roundToBf16(out + off, C);
        }
        if (mask) std::memset(mask, 1, static_cast<size_t>(T) * C);
        return;
    }
    const uint64_t key = dropoutStreamKey(seed.value()), thr = dropoutThreshold(p);
    const float sc = dropoutKeepScale(p);
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
            if (roundBf16) roundToBf16(ob, len);
        }
    }
}

void biasDropoutAddUnfused(const float* x, const float* b, const float* residual, float* out,
                           uint8_t* mask, int T, int C, float p, hd::DropoutSeed seed, uint64_t offset) {
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
