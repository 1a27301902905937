// detail::smallGemm (the in-cache GEMM under core attention) against a double reference, over
// shapes that hit every tile kind (6-row and shorter row tiles, 16-, 9..15-, 8- and <8-column
// tiles), row-major and transposed A, row-major and panel-packed B, overwrite and accumulate,
// and K = 0.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/small_gemm.h"
#include "tests/kernels/kernel_test_util.h"

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

struct Case {
    int M, N, K;
    bool transA, accumulate;
    bool panels = false;  // B packed by packPanels (from its transpose, to cover cs != 1)
};

void check(const Case& cs, uint32_t seed) {
    const int M = cs.M, N = cs.N, K = cs.K;
    // Padded leading dims so that strides differ from the logical sizes.
    const int lda = cs.transA ? M + 3 : K + 5;  // A stored [M, K] (or [K, M] when transA)
    const int ldb = N + 7, ldc = N + 2;
    const auto A = randomVector(static_cast<size_t>(cs.transA ? K : M) * lda + 1, seed);
    const auto B = randomVector(static_cast<size_t>(std::max(K, 1)) * ldb, seed + 1);
    auto C = randomVector(static_cast<size_t>(M) * ldc, seed + 2);
    const std::vector<float> C0 = C;
    const float alpha = 0.75f;
    const int64_t ars = cs.transA ? 1 : lda, acs = cs.transA ? lda : 1;
    if (cs.panels) {
        // Bt = B^T stored [N, ldbt]; packing it with rs = 1, cs = ldbt yields B's panels.
        const int ldbt = K + 2;
        std::vector<float> Bt(static_cast<size_t>(N) * ldbt);
        for (int k = 0; k < K; ++k)
            for (int j = 0; j < N; ++j) Bt[static_cast<size_t>(j) * ldbt + k] = B[k * ldb + j];
        std::vector<float> P(static_cast<size_t>(detail::panelFloats(K, N)) + 1, -7.0f);
        detail::packPanels(K, N, Bt.data(), 1, ldbt, P.data());
        EXPECT_EQ(P.back(), -7.0f);  // packPanels stays inside panelFloats(K, N)
        for (int64_t x = 0; x + 1 < static_cast<int64_t>(P.size()); ++x) {
            const int64_t j = (x / (16 * std::max(K, 1))) * 16 + x % 16;  // column of lane x
            if (j >= N) {
                ASSERT_EQ(P[x], 0.0f) << x;
            }
        }
        detail::smallGemm(M, N, K, alpha, A.data(), ars, acs, P.data(), 16, 16 * K,
                          cs.accumulate, C.data(), ldc);
    } else {
        detail::smallGemm(M, N, K, alpha, A.data(), ars, acs, B.data(), ldb, 16, cs.accumulate,
                          C.data(), ldc);
    }
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < ldc; ++j) {
            const float got = C[static_cast<size_t>(i) * ldc + j];
            if (j >= N) {  // padding past N is never written
                ASSERT_EQ(got, C0[static_cast<size_t>(i) * ldc + j]) << i << "," << j;
                continue;
            }
            double want = 0.0, mag = 0.0;
            for (int k = 0; k < K; ++k) {
                const double p = static_cast<double>(A[i * ars + k * acs]) * B[k * ldb + j];
                want += p;
                mag += std::fabs(p);
            }
            want *= alpha;
            if (cs.accumulate) want += C0[static_cast<size_t>(i) * ldc + j];
            const double tol = 1e-6 * (mag + 1.0) + 1e-6 * std::fabs(want);
            ASSERT_NEAR(got, want, tol) << "M=" << M << " N=" << N << " K=" << K
                                        << " transA=" << cs.transA << " acc=" << cs.accumulate
                                        << " at (" << i << "," << j << ")";
        }
    }
}

TEST(KernelsSmallGemm, MatchesDoubleReferenceOverAllTileShapes) {
    uint32_t seed = 1;
    for (int M : {1, 5, 6, 7, 13, 64})
        for (int N : {1, 7, 8, 9, 15, 16, 17, 40, 64})
            for (int K : {1, 3, 64, 70})
                for (bool transA : {false, true})
                    for (bool acc : {false, true})
                        for (bool panels : {false, true})
                            check({M, N, K, transA, acc, panels}, seed++);
}

TEST(KernelsSmallGemm, KZeroClearsOrKeepsC) {
    check({7, 19, 0, false, false}, 99);  // C = 0
    check({7, 19, 0, true, true}, 98);    // C unchanged
    std::vector<float> C(6, 5.0f);
    detail::smallGemm(2, 3, 0, 1.0f, nullptr, 1, 1, nullptr, 3, 16, false, C.data(), 3);
    for (float c : C) EXPECT_EQ(c, 0.0f);
}

}  // namespace
}  // namespace ts::kernels::cpu
