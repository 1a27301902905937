// GEMM, linear layers and the OpenBLAS runtime knobs (thread count, measured sgemm peak).
#include "kernels/cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace ts::kernels::cpu {

void setNumThreads(int n) {
    // openblas_set_num_threads is process-global: see the threading note in ops.h.
    openblas_set_num_threads(n > 0 ? n : openblas_get_num_procs());
}

int numThreads() { return openblas_get_num_threads(); }

void gemm(bool transA, bool transB, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        // BLAS leaves C untouched for K == 0 only when beta == 1; make the math explicit.
        for (int i = 0; i < M; ++i) {
            float* c = C + static_cast<int64_t>(i) * ldc;
            if (beta == 0.0f)
                std::fill(c, c + N, 0.0f);
            else
                for (int j = 0; j < N; ++j) c[j] *= beta;
        }
        return;
    }
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                transB ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemmStridedBatched(bool transA, bool transB, int M, int N, int K, float alpha,
                        const float* A, int lda, int64_t strideA, const float* B, int ldb,
                        int64_t strideB, float beta, float* C, int ldc, int64_t strideC,
                        int batch) {
    for (int i = 0; i < batch; ++i)
        gemm(transA, transB, M, N, K, alpha, A + i * strideA, lda, B + i * strideB, ldb, beta,
             C + i * strideC, ldc);
}

void linearForward(const float* x, const float* W, const float* b, float* y, int T, int in,
                   int out) {
    // With a bias, prefill y with it and let the GEMM accumulate (beta = 1): OpenBLAS scales C
    // by beta in a separate pass anyway, so this costs no more than beta = 0 and saves the
    // bias pass afterwards.
    if (b) {
        for (int t = 0; t < T; ++t)
            std::memcpy(y + static_cast<int64_t>(t) * out, b, sizeof(float) * out);
    }
    gemm(false, true, T, out, in, 1.0f, x, in, W, in, b ? 1.0f : 0.0f, y, out);
}

void linearBackward(const float* dy, const float* x, const float* W, float* dx, float* dW,
                    float* db, int T, int in, int out) {
    // dx[T, in] = dy[T, out] W[out, in]
    if (dx) gemm(false, false, T, in, out, 1.0f, dy, out, W, in, 0.0f, dx, in);
    // dW[out, in] += dy^T x  (gradient-accumulation fusion: straight into the fp32 grad)
    if (dW) gemm(true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f, dW, in);
    if (db) biasGradAccumulate(dy, db, T, out);
}

double measureSgemmPeakGflops(int threads, int n, double seconds) {
    if (n <= 0) n = 1024;
    const int previous = numThreads();
    setNumThreads(threads);
    const size_t nn = static_cast<size_t>(n) * n;
    std::vector<float> a(nn), b(nn), c(nn, 0.0f);
    for (size_t i = 0; i < nn; ++i) {
        a[i] = static_cast<float>((i * 7) % 13) * 0.01f;
        b[i] = static_cast<float>((i * 5) % 11) * 0.01f;
    }
    const double flops = 2.0 * n * static_cast<double>(n) * n;
    using Clock = std::chrono::steady_clock;
    gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
    double best = 0.0;
    const auto start = Clock::now();
    int reps = 0;
    do {
        const auto t0 = Clock::now();
        gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        if (dt > 0) best = std::max(best, flops / dt * 1e-9);
        ++reps;
    } while (reps < 3 ||
             std::chrono::duration<double>(Clock::now() - start).count() < seconds);
    setNumThreads(previous);
    return best;
}

}  // namespace ts::kernels::cpu
