// GEMM, linear layers and the OpenBLAS runtime knobs (thread count, measured sgemm peak).
#include "kernels/cpu/ops.h"
#include "kernels/common/row_groups.h"

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
    if (beta == 0.0f) {
        // OpenBLAS clears C for beta = 0 in a separate pass that is slower than memset (about
        // 15% of the attention GEMMs' time, measured); clear it here and accumulate instead.
        // Same values bit for bit (0 + x == x), except that a -0 product becomes +0.
        if (ldc == N) {
            std::memset(C, 0, sizeof(float) * static_cast<size_t>(M) * static_cast<size_t>(N));
        } else {
            for (int i = 0; i < M; ++i)
                std::memset(C + static_cast<int64_t>(i) * ldc, 0, sizeof(float) * static_cast<size_t>(N));
        }
        beta = 1.0f;
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

void linearForwardGrouped(const float* x, const float* const* W, const float* const* b, float* y, const int* off,
                          int G, int in, int out) {
    forEachGroupWithRows(off, 0, G, [&](int g, int r0, int rows) {
        linearForward(x + int64_t(r0) * in, W[g], b ? b[g] : nullptr, y + int64_t(r0) * out, rows, in, out);
    });
}

void linearBackwardGrouped(const float* dy, const float* x, const float* const* W, float* dx, float* const* dW,
                           float* const* db, const int* off, int G, int in, int out) {
    forEachGroupWithRows(off, 0, G, [&](int g, int r0, int rows) {
        linearBackward(dy + int64_t(r0) * out, x ? x + int64_t(r0) * in : nullptr, W ? W[g] : nullptr,
                       dx ? dx + int64_t(r0) * in : nullptr, dW ? dW[g] : nullptr, db ? db[g] : nullptr, rows, in,
                       out);
    });
}

double measureSgemmPeakGflops(int threads, int n, double seconds) {
    // The peak is the best rate seen, so everything that can only make a call slower is
    // excluded: an untimed warm-up (thread pool start, page faults of the operands, CPU
    // frequency ramp), several sizes (with 2+ threads a 1024^3 call is short enough that
    // fork/join overhead shows; 2048 amortizes it), best-of-N calls per size, and the
    // time budget split so that every size gets at least 3 timed calls.
    if (n <= 0) n = 1024;
    if (seconds <= 0) seconds = 0.01;
    const int previous = numThreads();
    setNumThreads(threads);
    std::vector<int> sizes = {n};
    if (threads > 1 && n >= 512) sizes.push_back(2 * n);
    const int nMax = *std::max_element(sizes.begin(), sizes.end());
    const size_t nn = static_cast<size_t>(nMax) * nMax;
    std::vector<float> a(nn), b(nn), c(nn, 0.0f);
    for (size_t i = 0; i < nn; ++i) {
        a[i] = static_cast<float>((i * 7) % 13) * 0.01f;
        b[i] = static_cast<float>((i * 5) % 11) * 0.01f;
    }
    using Clock = std::chrono::steady_clock;
    auto since = [](Clock::time_point t) {
        return std::chrono::duration<double>(Clock::now() - t).count();
    };
    double best = 0.0;
    for (const int m : sizes) {
        const double flops = 2.0 * m * static_cast<double>(m) * m;
        auto call = [&] {
            gemm(false, false, m, m, m, 1.0f, a.data(), m, b.data(), m, 0.0f, c.data(), m);
        };
        const auto warm = Clock::now();
        do call(); while (since(warm) < std::min(0.1, seconds * 0.2));
        const double budget = seconds / static_cast<double>(sizes.size());
        const auto start = Clock::now();
        int reps = 0;
        do {
            const auto t0 = Clock::now();
            call();
            const double dt = since(t0);
            if (dt > 0) best = std::max(best, flops / dt * 1e-9);
            ++reps;
        } while (reps < 3 || since(start) < budget);
    }
    setNumThreads(previous);
    return best;
}

}  // namespace ts::kernels::cpu
