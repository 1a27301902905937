// The MoE row kernels of kernels/cpu/moe.cpp against references written here from their
// definitions (ops.h): gathers with zero rows for negative indices, the combine as a gather-sum
// through an inverse index equal to the scatter-add it replaces (same bits: same order), the
// row scale with and without broadcasting, the prob gradient with and without fc2's bias, the
// weighted column sum and the shared experts' sigmoid gate against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

void expectBits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << what << "[" << i << "]: " << got[i] << " vs " << want[i];
}

TEST(MoeKernels, GatherRowsCopiesIndexedRowsAndZerosNegativeOnes) {
    const int srcRows = 7, cols = 5;
    const auto src = randomVector(size_t(srcRows) * cols, 1);
    const std::vector<int32_t> idx = {3, 0, -1, 6, 3, 2};
    std::vector<float> dst(idx.size() * cols, 42.f);
    gatherRows(src.data(), idx.data(), dst.data(), int(idx.size()), cols);
    for (size_t i = 0; i < idx.size(); ++i)
        for (int c = 0; c < cols; ++c)
            EXPECT_EQ(dst[i * cols + c], idx[i] < 0 ? 0.f : src[size_t(idx[i]) * cols + c]) << i << "," << c;
}

TEST(MoeKernels, GatherSumRowsEqualsTheScatterAddInRowOrder) {
    // 11 permuted rows of 4 tokens (token 2 gets none), combined onto existing values.
    const int T = 4, rows = 11, cols = 9;
    const std::vector<int> tokenOf = {1, 3, 0, 1, 1, 3, 0, 0, 3, 1, 0};
    const auto src = randomVector(size_t(rows) * cols, 2, -3, 3);
    const auto init = randomVector(size_t(T) * cols, 3);
    std::vector<float> want = init;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) want[size_t(tokenOf[r]) * cols + c] += src[size_t(r) * cols + c];
    std::vector<int32_t> start(T + 1, 0), idx;
    for (int t = 0; t < T; ++t) {
        for (int r = 0; r < rows; ++r)
            if (tokenOf[r] == t) idx.push_back(r);
        start[t + 1] = int32_t(idx.size());
    }
    std::vector<float> got = init;
    gatherSumRows(src.data(), start.data(), idx.data(), got.data(), T, cols);
    expectBits(got, want, "gatherSumRows");
}

TEST(MoeKernels, ScaleRowsScalesEachRowAndBroadcastsWithStrideZero) {
    const int rows = 5, cols = 6;
    const auto x = randomVector(size_t(rows) * cols, 4), s = randomVector(rows, 5), b = randomVector(cols, 6);
    std::vector<float> y(size_t(rows) * cols), yb(size_t(rows) * cols);
    scaleRows(x.data(), cols, s.data(), y.data(), rows, cols);
    scaleRows(b.data(), 0, s.data(), yb.data(), rows, cols);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
            EXPECT_EQ(y[size_t(r) * cols + c], x[size_t(r) * cols + c] * s[r]);
            EXPECT_EQ(yb[size_t(r) * cols + c], b[c] * s[r]);
        }
}

TEST(MoeKernels, ProbGradIsTheDotOfDaWithTheActivationPlusTheBiasTerm) {
    const int rows = 4, F = 7, h = 5;
    const auto da = randomVector(size_t(rows) * F, 7), act = randomVector(size_t(rows) * F, 8);
    const auto prob = randomVector(rows, 9, 0, 1), dy = randomVector(size_t(rows) * h, 10), b2 = randomVector(h, 11);
    for (const bool bias : {false, true}) {
        std::vector<float> dact(size_t(rows) * F), dprob(rows);
        moeProbGrad(da.data(), act.data(), prob.data(), bias ? dy.data() : nullptr, bias ? b2.data() : nullptr,
                    dact.data(), dprob.data(), rows, F, h);
        for (int r = 0; r < rows; ++r) {
            long double want = 0;
            for (int f = 0; f < F; ++f) {
                want += (long double)da[size_t(r) * F + f] * act[size_t(r) * F + f];
                EXPECT_EQ(dact[size_t(r) * F + f], da[size_t(r) * F + f] * prob[r]);
            }
            if (bias)
                for (int i = 0; i < h; ++i) want += (long double)dy[size_t(r) * h + i] * b2[i];
            EXPECT_NEAR(dprob[r], double(want), 1e-6) << "row " << r << (bias ? " with bias" : "");
        }
    }
}

TEST(MoeKernels, WeightedColumnSumAccumulates) {
    const int rows = 6, cols = 4;
    const auto dy = randomVector(size_t(rows) * cols, 12), w = randomVector(rows, 13), init = randomVector(cols, 14);
    std::vector<float> db = init;
    weightedColumnSum(dy.data(), w.data(), db.data(), rows, cols);
    for (int c = 0; c < cols; ++c) {
        double s = 0;
        for (int r = 0; r < rows; ++r) s += double(dy[size_t(r) * cols + c]) * w[r];
        EXPECT_NEAR(db[c], init[c] + s, 1e-6) << c;
    }
}

// The gate's backward against central differences of L = sum(out * g_out) in double.
TEST(MoeKernels, SigmoidGateBackwardMatchesFiniteDifferences) {
    const int T = 3, h = 4;
    auto x = randomVector(size_t(T) * h, 15), w = randomVector(h, 16), y = randomVector(size_t(T) * h, 17);
    const auto gout = randomVector(size_t(T) * h, 18);
    auto loss = [&](const std::vector<float>& xv, const std::vector<float>& wv, const std::vector<float>& yv) {
        double L = 0;
        for (int t = 0; t < T; ++t) {
            double z = 0;
            for (int i = 0; i < h; ++i) z += double(xv[size_t(t) * h + i]) * wv[i];
            const double g = 1.0 / (1.0 + std::exp(-z));
            for (int i = 0; i < h; ++i) L += double(yv[size_t(t) * h + i]) * g * gout[size_t(t) * h + i];
        }
        return L;
    };
    std::vector<float> gate(T), out(size_t(T) * h);
    sigmoidGateForward(x.data(), w.data(), y.data(), gate.data(), out.data(), T, h, false);
    for (int t = 0; t < T; ++t) {
        double z = 0;
        for (int i = 0; i < h; ++i) z += double(x[size_t(t) * h + i]) * w[i];
        EXPECT_FLOAT_EQ(gate[t], float(1.0 / (1.0 + std::exp(-z))));
        for (int i = 0; i < h; ++i) EXPECT_EQ(out[size_t(t) * h + i], y[size_t(t) * h + i] * gate[t]);
    }
    std::vector<float> dy(size_t(T) * h), dx(size_t(T) * h), dw(h, 0.f);
    sigmoidGateBackward(gout.data(), y.data(), x.data(), gate.data(), w.data(), dy.data(), dx.data(), dw.data(), T, h);
    const float eps = 1e-3f;
    auto fd = [&](std::vector<float>& v, size_t i) {
        const float keep = v[i];
        v[i] = keep + eps;
        const double up = loss(x, w, y);
        v[i] = keep - eps;
        const double dn = loss(x, w, y);
        v[i] = keep;
        return (up - dn) / (2.0 * eps);
    };
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], fd(x, i), 2e-3) << "dx " << i;
    for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dw[i], fd(w, i), 2e-3) << "dw " << i;
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(dy[i], fd(y, i), 2e-3) << "dy " << i;
}

}  // namespace
}  // namespace ts::kernels::cpu
