// The dropout RNG shared by the CPU oracle (kernels/cpu/dropout.cpp) and the CUDA kernels
// (kernels/cuda/dropout.cu): one definition, compiled for host and device, so the masks of the
// two backends are bit-identical by construction (tests/kernels/test_dropout_rng_shared.cpp
// checks these functions against the oracle's masks, so what the GPU runs is tested in CI).
//
// Stream: key = splitmix64(seed + golden). Element e of the stream has the 32-bit uniform
// u_e = high half (e even) or low half (e odd) of splitmix64(key + (e / 2) * golden); it is
// kept iff u_e >= threshold(p) = round(p * 2^32). A call with `offset` uses elements
// offset + i, so any slice of a mask can be regenerated alone and nothing depends on how the
// work is split over threads.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/hd.h"

namespace ts::kernels::hd {

inline constexpr uint64_t kDropoutGolden = 0x9E3779B97F4A7C15ull;

// splitmix64's output function.
TS_HD inline uint64_t dropoutMix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

TS_HD inline uint64_t dropoutStreamKey(uint64_t seed) { return dropoutMix64(seed + kDropoutGolden); }

// splitmix64(a ^ splitmix64(b)), where splitmix64(x) is dropoutStreamKey(x). The engine's
// splitmix64 and hashCombine (engine/model/layers.h) are these two.
TS_HD inline uint64_t dropoutCombine(uint64_t a, uint64_t b) {
    return dropoutStreamKey(a ^ dropoutStreamKey(b));
}

// The seed of a dropout call as kernels receive it: `site` itself when stepKey is null, else
// dropoutCombine(*stepKey, site) with *stepKey read when the kernel runs. The engine keeps the
// step's key in one word of device memory that it rewrites before every step, so a CUDA graph,
// which replays its kernels with the arguments they were captured with, still draws each step's
// own masks. Converts from a plain seed (tests and callers without a step key).
struct DropoutSeed {
    const uint64_t* stepKey = nullptr;
    uint64_t site = 0;
    TS_HD DropoutSeed() {}
    TS_HD DropoutSeed(uint64_t plain) : site(plain) {}
    TS_HD DropoutSeed(const uint64_t* key, uint64_t siteKey) : stepKey(key), site(siteKey) {}
    TS_HD uint64_t value() const { return stepKey ? dropoutCombine(*stepKey, site) : site; }
};

// The 64 random bits of pair `pair` (stream elements 2 pair and 2 pair + 1).
TS_HD inline uint64_t dropoutPairBits(uint64_t key, uint64_t pair) {
    return dropoutMix64(key + pair * kDropoutGolden);
}

TS_HD inline bool dropoutKeepHigh(uint64_t bits, uint64_t threshold) { return (bits >> 32) >= threshold; }
TS_HD inline bool dropoutKeepLow(uint64_t bits, uint64_t threshold) {
    return (bits & 0xFFFFFFFFull) >= threshold;
}

// Keep bit of stream element e (one hash per element; kernels that own a whole pair call
// dropoutPairBits once and take both halves).
TS_HD inline bool dropoutKeep(uint64_t key, uint64_t e, uint64_t threshold) {
    const uint64_t bits = dropoutPairBits(key, e >> 1);
    return (e & 1) ? dropoutKeepLow(bits, threshold) : dropoutKeepHigh(bits, threshold);
}

// P(drop) = threshold / 2^32: 0 for p <= 0 (or NaN: everything kept), 2^32 for p >= 1
// (everything dropped). Host only (the launchers pass it to the kernels).
inline uint64_t dropoutThreshold(float p) {
    if (!(p > 0.0f)) return 0;
    if (p >= 1.0f) return uint64_t{1} << 32;
    return static_cast<uint64_t>(std::llround(static_cast<double>(p) * 4294967296.0));
}

// Scale of kept values, 1 / (1 - p) in float (0 for p >= 1, where nothing is kept).
TS_HD inline float dropoutKeepScale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

}  // namespace ts::kernels::hd
