// See small_gemm.h. The AVX2+FMA path is a register-tiled kernel: per tile of R <= 6 rows and
// V*8 <= 16 columns it keeps R*V accumulators in ymm registers, streams one row of B (V
// loads) and broadcasts R elements of A per k. Column tails use masked loads/stores. Without
// AVX2/FMA at compile time the portable loop below computes the same sums in the same order
// (up to FMA contraction).
#include "kernels/cpu/small_gemm.h"

#include <algorithm>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TS_SMALL_GEMM_AVX2 1
#endif

namespace ts::kernels::cpu::detail {

namespace {

#ifdef TS_SMALL_GEMM_AVX2

// Lane mask with the first n (1..8) lanes on.
inline __m256i firstLanes(int n) {
    alignas(32) static const int32_t kOnes[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  0,  0,  0,  0,  0,  0,  0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kOnes + 8 - n));
}

// One tile: R rows, V vectors of 8 columns; the last vector is masked when Masked.
template <int R, int V, bool Masked>
inline void tile(int K, float alpha, const float* A, int64_t ars, int64_t acs, const float* B,
                 int64_t ldb, bool accumulate, float* C, int64_t ldc, __m256i mask) {
    __m256 c[R][V];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) c[r][v] = _mm256_setzero_ps();
    const float* a = A;
    const float* b = B;
    for (int k = 0; k < K; ++k, a += acs, b += ldb) {
        __m256 bv[V];
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v)
            bv[v] = (Masked && v == V - 1) ? _mm256_maskload_ps(b + 8 * v, mask)
                                           : _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
            const __m256 ar = _mm256_broadcast_ss(a + r * ars);
#pragma GCC unroll 2
            for (int v = 0; v < V; ++v) c[r][v] = _mm256_fmadd_ps(ar, bv[v], c[r][v]);
        }
    }
    const __m256 al = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
        float* cr = C + r * ldc;
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) {
            __m256 x = _mm256_mul_ps(c[r][v], al);
            if (Masked && v == V - 1) {
                if (accumulate) x = _mm256_add_ps(_mm256_maskload_ps(cr + 8 * v, mask), x);
                _mm256_maskstore_ps(cr + 8 * v, mask, x);
            } else {
                if (accumulate) x = _mm256_add_ps(_mm256_loadu_ps(cr + 8 * v), x);
                _mm256_storeu_ps(cr + 8 * v, x);
            }
        }
    }
}

template <int V, bool Masked>
inline void rowsTile(int R, int K, float alpha, const float* A, int64_t ars, int64_t acs,
                     const float* B, int64_t ldb, bool acc, float* C, int64_t ldc, __m256i m) {
    switch (R) {
        case 6: tile<6, V, Masked>(K, alpha, A, ars, acs, B, ldb, acc, C, ldc, m); break;
        case 5: tile<5, V, Masked>(K, alpha, A, ars, acs, B, ldb, acc, C, ldc, m); break;
        case 4: tile<4, V, Masked>(K, alpha, A, ars, acs, B, ldb, acc, C, ldc, m); break;
        case 3: tile<3, V, Masked>(K, alpha, A, ars, acs, B, ldb, acc, C, ldc, m); break;
        case 2: tile<2, V, Masked>(K, alpha, A, ars, acs, B, ldb, acc, C, ldc, m); break;
        default: tile<1, V, Masked>(K, alpha, A, ars, acs, B, ldb, acc, C, ldc, m); break;
    }
}

#endif  // TS_SMALL_GEMM_AVX2

}  // namespace

void smallGemm(int M, int N, int K, float alpha, const float* A, int64_t ars, int64_t acs,
               const float* B, int64_t ldb, int64_t bStrip, bool accumulate, float* C,
               int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    K = std::max(K, 0);
#ifdef TS_SMALL_GEMM_AVX2
    // Columns outer, rows inner: a 16-column strip of B stays in L1 while the row tiles of A
    // stream past it (packed panels make the strip K*64 contiguous bytes).
    for (int j = 0; j < N; j += 16) {
        const int nj = std::min(16, N - j);
        const __m256i mask = firstLanes(((nj - 1) & 7) + 1);
        for (int i = 0; i < M; i += 6) {
            const int ri = std::min(6, M - i);
            const float* a = A + i * ars;
            const float* b = B + (j / 16) * bStrip;
            float* c = C + i * ldc + j;
            if (nj == 16)
                rowsTile<2, false>(ri, K, alpha, a, ars, acs, b, ldb, accumulate, c, ldc, mask);
            else if (nj > 8)
                rowsTile<2, true>(ri, K, alpha, a, ars, acs, b, ldb, accumulate, c, ldc, mask);
            else if (nj == 8)
                rowsTile<1, false>(ri, K, alpha, a, ars, acs, b, ldb, accumulate, c, ldc, mask);
            else
                rowsTile<1, true>(ri, K, alpha, a, ars, acs, b, ldb, accumulate, c, ldc, mask);
        }
    }
#else
    for (int i = 0; i < M; ++i) {
        float* c = C + i * ldc;
        for (int j = 0; j < N; ++j) {
            float s = 0.0f;
            const float* b = B + (j / 16) * bStrip + j % 16;
            for (int k = 0; k < K; ++k) s += A[i * ars + k * acs] * b[k * ldb];
            c[j] = (accumulate ? c[j] : 0.0f) + alpha * s;
        }
    }
#endif
}

void packPanels(int K, int N, const float* src, int64_t rs, int64_t cs, float* dst) {
    for (int j0 = 0; j0 < N; j0 += 16) {
        const int nj = std::min(16, N - j0);
        float* panel = dst + static_cast<int64_t>(j0) * K;  // (j0/16) * 16*K
        if (cs == 1 || rs != 1) {
            for (int k = 0; k < K; ++k) {
                float* row = panel + static_cast<int64_t>(k) * 16;
                const float* s = src + k * rs + j0 * cs;
                for (int jj = 0; jj < nj; ++jj) row[jj] = s[jj * cs];
                std::fill(row + nj, row + 16, 0.0f);
            }
        } else {
            // transposed source (rs = 1): read each source row contiguously, write a column
            for (int jj = 0; jj < nj; ++jj) {
                const float* s = src + (j0 + jj) * cs;
                for (int k = 0; k < K; ++k) panel[static_cast<int64_t>(k) * 16 + jj] = s[k];
            }
            for (int k = 0; k < K; ++k)
                std::fill(panel + static_cast<int64_t>(k) * 16 + nj, panel + (k + 1) * 16, 0.0f);
        }
    }
}

}  // namespace ts::kernels::cpu::detail
