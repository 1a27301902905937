// The GEMMs of causal attention over a square [s, s] head, restricted to row blocks so that the
// part above the diagonal is mostly not computed (about 1/2 + 1/(2 nb) of the square with nb
// blocks, instead of all of it): query rows [r0, r1) need keys [0, r1) only, and keys [c0, c1)
// are seen by query rows [c0, s) only. The CUDA attention (kernels/cuda/attention.cu) runs them
// on cuBLAS's strided-batched GEMMs; tests/kernels/test_causal_gemms.cpp runs the very same
// calls on the CPU oracle's GEMM against the full-square products, which checks every offset and
// extent here without a GPU.
//
// Gemm: a callable with gemmStridedBatched's row-major arguments (transA, transB, M, N, K,
// alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batch) returning Status.
// Each function covers `batch` heads at the given strides; a head's [s, s] matrix has leading
// dimension s.
// Plain C++17 (nvcc compiles it too).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/status.h"

namespace ts::kernels::causal {

// Rows per block: at most 8 blocks of at least 128 rows each (fewer, larger GEMMs keep the
// library efficient; below 256 rows the square is one block, the full GEMM).
inline int blockRows(int s) {
    const int nb = std::min(8, std::max(1, s / 128));
    return (s + nb - 1) / nb;
}

// S[r, j] = alpha * X[r] . Y[j] for j < end(r), end(r) the end of r's block; the rest of each row
// of S is not written. X, Y: [s, d] with leading dims ldx, ldy.
template <class Gemm>
Status rowsTimesKeysT(Gemm&& gemm, int s, int d, float alpha, const float* X, int ldx, int64_t strideX,
                      const float* Y, int ldy, int64_t strideY, float* S, int64_t strideS, int batch) {
    const int R = blockRows(s);
    for (int r0 = 0; r0 < s; r0 += R) {
        const int r1 = std::min(s, r0 + R);
        TS_RETURN_IF_ERROR(gemm(false, true, r1 - r0, r1, d, alpha, X + int64_t(r0) * ldx, ldx, strideX, Y, ldy,
                                strideY, 0.0f, S + int64_t(r0) * s, s, strideS, batch));
    }
    return Status::ok();
}

// O[r] = alpha * sum_{j < end(r)} A[r, j] Y[j] (overwritten): the full product when each row r
// of A is zero past column r. Y: [s, d] (ldy), O: [s, d] (ldo).
template <class Gemm>
Status rowsTimesKeys(Gemm&& gemm, int s, int d, float alpha, const float* A, int64_t strideA, const float* Y,
                     int ldy, int64_t strideY, float* O, int ldo, int64_t strideO, int batch) {
    const int R = blockRows(s);
    for (int r0 = 0; r0 < s; r0 += R) {
        const int r1 = std::min(s, r0 + R);
        TS_RETURN_IF_ERROR(gemm(false, false, r1 - r0, d, r1, alpha, A + int64_t(r0) * s, s, strideA, Y, ldy, strideY,
                                0.0f, O + int64_t(r0) * ldo, ldo, strideO, batch));
    }
    return Status::ok();
}

// D[c] = alpha * sum_{r >= start(c)} A[r, c] X[r] + beta * D[c], start(c) the start of c's
// block: the full A^T X when each column c of A is zero above row c. X: [s, d] (ldx), D: [s, d]
// (ldd).
template <class Gemm>
Status keysTimesRows(Gemm&& gemm, int s, int d, float alpha, const float* A, int64_t strideA, const float* X,
                     int ldx, int64_t strideX, float beta, float* D, int ldd, int64_t strideD, int batch) {
    const int R = blockRows(s);
    for (int c0 = 0; c0 < s; c0 += R) {
        const int c1 = std::min(s, c0 + R);
        TS_RETURN_IF_ERROR(gemm(true, false, c1 - c0, d, s - c0, alpha, A + int64_t(c0) * s + c0, s, strideA,
                                X + int64_t(c0) * ldx, ldx, strideX, beta, D + int64_t(c0) * ldd, ldd, strideD, batch));
    }
    return Status::ok();
}

}  // namespace ts::kernels::causal
