// Shared by rope.cu, attention.cu and attention_cp.cu: the dropout
// keep bit of the CPU's counter-based RNG (kernels/cpu/dropout.cpp) on the device, and the
// masked-attention engine that attentionForward/Backward (causal square) and
// cpAttentionForward/Backward (query rows at global positions) both run.
#pragma once

#include "common/status.h"
#include "kernels/common/dropout_rng.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/workspace.cuh"

#include <cmath>
#include <cstdint>

namespace ts::kernels::cuda::detail {

// --- dropout keep bit ------------------------------------------------------------------------
// The CPU's counter-based RNG (kernels/common/dropout_rng.h, the same functions the oracle runs).
using hd::dropoutKeep;

// One dropout stream: its seed, threshold and the kept values' scale 1/(1-p). The stream key is
// resolved on the device (key(): the seed's step key is read when the kernel runs, so a captured
// graph draws each step's masks): once per thread or row, not per element.
struct DropoutRng {
    bool on = false;
    hd::DropoutSeed seed;
    uint64_t threshold = 0;
    float keepScale = 1.0f;
    static DropoutRng make(float p, hd::DropoutSeed seed) {
        DropoutRng r;
        r.on = p > 0.0f;
        if (!r.on) return r;
        r.seed = seed;
        r.threshold = hd::dropoutThreshold(p);
        r.keepScale = hd::dropoutKeepScale(p);
        return r;
    }
    __device__ uint64_t key() const { return on ? hd::dropoutStreamKey(seed.value()) : 0; }
};

// --- the masked-attention engine --------------------------------------------------------------
// sq query rows [sq, b, nq, d] against skv keys/values [skv, b, nkv, d]; probs [b, nq, sq, skv].
// qPos null: the causal square (sq == skv, query i at position i sees keys [0, i]); otherwise
// query i (global position qPos[i], device array) sees keys [0, min(qPos[i], skv-1)].
// Dropout element of (bi, head, query i, key j): ((bi*nqTotal + headOffset + head)*S + pos_i)*S
// + j with S = sTotal (the AttnDims / CpAttnDims numbering).
struct AttnGeom {
    int sq = 0, skv = 0, b = 0, nq = 0, nkv = 0, d = 0;
    float scale = 0.0f;
    float dropout = 0.0f;
    hd::DropoutSeed seed;
    int headOffset = 0;
    int nqTotal = 0;  // already resolved (> 0)
    int sTotal = 0;   // already resolved (> 0)
    const int* qPos = nullptr;
};

// fused=false: scores, scale, mask, softmax, dropout as separate kernels; true: one row kernel
// for scale (folded into the GEMM), mask, softmax and dropout. stats set (flash attention):
// probs is not used, each head chunk's probabilities live in the workspace, and every row's
// max and reciprocal softmax denominator go to stats [b, nq, sq, 2] (implies fused).
Status maskedAttentionForward(const AttnGeom& g, const float* q, const float* k, const float* v,
                              float* probs, float* out, bool fused, const char* what,
                              void* stream, float* stats = nullptr);
// dq, dk, dv overwritten. scratch (may be null): scratchFloats floats the caller lends for one
// head at a time when no larger stream-ordered workspace can be had. stats set (flash): probs
// is not used, each chunk's probabilities are rebuilt from the scores GEMM and the stats.
Status maskedAttentionBackward(const AttnGeom& g, const float* q, const float* k, const float* v,
                               const float* probs, const float* dout, float* dq, float* dk,
                               float* dv, float* scratch, size_t scratchFloats, bool fused,
                               const char* what, void* stream, const float* stats = nullptr);

// The tiled flash kernels (flash_attention.cu): bf16 tensor cores, no [sq, skv] square, the
// same stats as maskedAttentionForward's flash path. Apply: a head dim of at most 128, a GPU of
// sm_80 or later with the shared memory they need. The backward overwrites dq, dk, dv.
bool flashTilesApply(const AttnGeom& g);
Status flashTiledForward(const AttnGeom& g, const float* q, const float* k, const float* v, float* out,
                         float* stats, const char* what, void* stream);
Status flashTiledBackward(const AttnGeom& g, const float* q, const float* k, const float* v, const float* stats,
                          const float* dout, float* dq, float* dk, float* dv, const char* what, void* stream);

// Heads are processed as GEMM batches: for the replica j < nq/nkv of each query group, the
// batch runs over i = bi*nkv + g (query head (bi, g*rep + j) = flat head i*rep + j, its k/v
// head i), so every GEMM has uniform strides. A chunk is [i0, i0 + count) of one j.
struct HeadChunk {
    int64_t i0 = 0;
    int count = 0;
    int rep = 1;
    int j = 0;
    __host__ __device__ int64_t head(int t) const { return (i0 + t) * rep + j; }  // flat bi*nq + h
};

// Heads per chunk for `perHeadBytes` of workspace each: all of them when they fit in the cap.
constexpr size_t kWorkspaceCapBytes = size_t{256} << 20;
inline int chunkHeads(int64_t groups, size_t perHeadBytes) {
    if (perHeadBytes == 0) return static_cast<int>(groups);
    const int64_t fit = static_cast<int64_t>(kWorkspaceCapBytes / perHeadBytes);
    return static_cast<int>(fit < 1 ? 1 : (fit > groups ? groups : fit));
}

}  // namespace ts::kernels::cuda::detail
