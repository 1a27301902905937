// A GEMM for operands that already sit in L1/L2: the per-head blocks of core attention
// (64-256 rows, head dim 64-128). A BLAS call packs both operands into its own panels on every
// call, which for these sizes costs as much as the math; this kernel reads the operands in
// place through a 6x16 register tile (12 AVX2 FMA accumulators) instead, so the caller packs
// once per head what it reuses (K^T, V) and hands the rest over with its natural strides.
// Internal to kernels/cpu (not part of ops.h); tests include it to check it directly.
#pragma once

#include <cstdint>

namespace ts::kernels::cpu::detail {

// C(i, j) = [C(i, j) if accumulate] + alpha * sum_{k < K} A(i, k) * B(k, j), i < M, j < N, with
//   A(i, k) = A[i*ars + k*acs]  (any strides: row-major A has acs = 1, a transposed view ars = 1)
//   B(k, j) = B[(j/16)*bStrip + k*ldb + j%16]  (16-column strips, unit stride along j):
//             row-major B is bStrip = 16; panels from packPanels are ldb = 16, bStrip = 16*Kp
//             (Kp the packed row count; start at row k0 with B + k0*16)
//   C(i, j) = C[i*ldc + j].
// The sum runs over k in order for every element (results do not depend on M, N or tiling).
// K = 0 gives C = 0 (or leaves C) like a BLAS call with beta 0 (or 1).
void smallGemm(int M, int N, int K, float alpha, const float* A, int64_t ars, int64_t acs,
               const float* B, int64_t ldb, int64_t bStrip, bool accumulate, float* C,
               int64_t ldc);

// Packs B(k, j) = src[k*rs + j*cs] (k < K, j < N) into 16-column panels for smallGemm:
// dst[(j/16)*16*K + k*16 + j%16], lanes past N in the last panel zero. dst holds
// panelFloats(K, N) floats. cs = 1 packs a row-major matrix, rs = 1 a transposed one.
void packPanels(int K, int N, const float* src, int64_t rs, int64_t cs, float* dst);
inline int64_t panelFloats(int K, int N) { return static_cast<int64_t>((N + 15) / 16) * 16 * K; }

}  // namespace ts::kernels::cpu::detail
