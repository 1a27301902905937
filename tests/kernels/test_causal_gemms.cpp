// The causal row-block GEMMs that the CUDA attention runs (kernels/common/causal_gemms.h), run
// here on the CPU oracle's strided-batched GEMM: on a causal operand (zero above the diagonal)
// each equals the full-square product wherever the attention reads it, for one block, several
// blocks with a short last one, and a batch of heads at non-trivial strides and leading dims.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/common/causal_gemms.h"
#include "kernels/cpu/ops.h"

namespace ts::kernels {
namespace {

namespace tu = cpu::testing;
using tu::randomVector;

Status cpuGemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, int64_t sA,
               const float* B, int ldb, int64_t sB, float beta, float* C, int ldc, int64_t sC, int batch) {
    cpu::gemmStridedBatched(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch);
    return Status::ok();
}

// got against want, two fp32 GEMMs of the same products summed in different orders (the blocks
// split K where the full square does not): each element within 4 sqrt(K) float epsilons of the
// sum of its products' magnitudes (absSum, the same GEMM on |A| and |B|), the usual bound for
// rounding errors that do not all go one way. A block that misses or repeats products is off by
// about a product, far more.
void expectSameSums(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& absSum,
                    int K, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    const double eps = std::ldexp(1.0, -24);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double tol = 4.0 * std::sqrt(double(K)) * eps * std::fabs(absSum[i]) + 1e-7;
        if (!(std::fabs(double(got[i]) - want[i]) <= tol) && ++bad <= 5)
            ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i] << " (tol " << tol << ")";
    }
    EXPECT_EQ(bad, 0u) << what;
}

std::vector<float> absolute(std::vector<float> v) {
    for (float& x : v) x = std::fabs(x);
    return v;
}

// Zero above the diagonal of each [s, s] head.
void causalize(std::vector<float>& a, int s, int batch) {
    for (int h = 0; h < batch; ++h)
        for (int r = 0; r < s; ++r)
            for (int j = r + 1; j < s; ++j) a[(size_t(h) * s + r) * s + j] = 0.0f;
}

TEST(CausalGemms, EqualTheFullSquareWhereAttentionReadsThem) {
    EXPECT_EQ(causal::blockRows(200), 200) << "short sequences: one block";
    EXPECT_GT(causal::blockRows(1000), 1) << "long ones: several";
    for (int s : {200, 700, 1100}) {
        SCOPED_TRACE(::testing::Message() << "s=" << s << " block rows " << causal::blockRows(s));
        const int d = 24, batch = 3, ld = batch * d + 5;  // each head's [s, d] view inside wider rows
        const int64_t sv = d, ss = int64_t(s) * s;    // heads side by side in a row / stacked squares
        const auto X = randomVector(size_t(s) * ld, 1, -1, 1), Y = randomVector(size_t(s) * ld, 2, -1, 1);
        // scores: every causal entry (j <= r) is the full GEMM's
        std::vector<float> S(size_t(batch) * ss, 7.0f), Sfull(S.size());
        ASSERT_TRUE(causal::rowsTimesKeysT(cpuGemm, s, d, 0.5f, X.data(), ld, sv, Y.data(), ld, sv, S.data(), ss, batch)
                        .isOk());
        cpu::gemmStridedBatched(false, true, s, s, d, 0.5f, X.data(), ld, sv, Y.data(), ld, sv, 0.0f, Sfull.data(), s,
                                ss, batch);
        size_t bad = 0;
        for (int h = 0; h < batch; ++h)
            for (int r = 0; r < s; ++r)
                for (int j = 0; j <= r; ++j) {
                    const size_t i = (size_t(h) * s + r) * s + j;
                    bad += std::fabs(S[i] - Sfull[i]) > 1e-5f;
                }
        EXPECT_EQ(bad, 0u) << "scores";
        // A causal: rows of A times Y, and A^T times X accumulated onto D
        auto A = randomVector(size_t(batch) * ss, 3, -1, 1);
        causalize(A, s, batch);
        std::vector<float> O(size_t(s) * ld, 5.0f), Ofull = O;
        ASSERT_TRUE(causal::rowsTimesKeys(cpuGemm, s, d, 2.0f, A.data(), ss, Y.data(), ld, sv, O.data(), ld, sv, batch)
                        .isOk());
        cpu::gemmStridedBatched(false, false, s, d, s, 2.0f, A.data(), s, ss, Y.data(), ld, sv, 0.0f, Ofull.data(), ld, sv,
                                batch);
        const auto absA = absolute(A), absX = absolute(X), absY = absolute(Y);
        std::vector<float> Oabs(O.size(), 5.0f);  // the padding columns (ld > batch*d) keep their 5.0
        cpu::gemmStridedBatched(false, false, s, d, s, 2.0f, absA.data(), s, ss, absY.data(), ld, sv, 0.0f, Oabs.data(),
                                ld, sv, batch);
        expectSameSums(O, Ofull, Oabs, s, "rowsTimesKeys");
        std::vector<float> D = randomVector(size_t(s) * ld, 4, -1, 1), Dfull = D;
        ASSERT_TRUE(causal::keysTimesRows(cpuGemm, s, d, 0.25f, A.data(), ss, X.data(), ld, sv, 1.0f, D.data(), ld, sv,
                                          batch)
                        .isOk());
        cpu::gemmStridedBatched(true, false, s, d, s, 0.25f, A.data(), s, ss, X.data(), ld, sv, 1.0f, Dfull.data(), ld,
                                sv, batch);
        std::vector<float> Dabs = absolute(D);  // |D| plus the products' magnitudes
        cpu::gemmStridedBatched(true, false, s, d, s, 0.25f, absA.data(), s, ss, absX.data(), ld, sv, 1.0f, Dabs.data(),
                                ld, sv, batch);
        expectSameSums(D, Dfull, Dabs, s + 1, "keysTimesRows");
    }
}

}  // namespace
}  // namespace ts::kernels
