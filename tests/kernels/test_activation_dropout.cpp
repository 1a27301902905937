// Bias-GeLU, SwiGLU, dropout and bias-dropout-add: forward against std:: math references,
// backward against finite differences, fused against unfused, RNG reproducibility.
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

double refGelu(double u) {
    return 0.5 * u * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
}

TEST(KernelsActivation, BiasGeluForwardMatchesTanhFormulaFusedAndUnfused) {
    const int T = 6, C = 45;
    const auto x = randomVector(T * C, 60, -6.0f, 6.0f), b = randomVector(C, 61);
    std::vector<double> want(T * C);
    for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) want[t * C + c] = refGelu(static_cast<double>(x[t * C + c]) + b[c]);
    std::vector<float> y1(T * C), y2(T * C);
    biasGeluForward(x.data(), b.data(), y1.data(), T, C);
    biasGeluForwardUnfused(x.data(), b.data(), y2.data(), T, C);
    testing::expectClose(y1, want, 1e-5, 1e-6, "fused");
    testing::expectClose(y2, want, 1e-5, 1e-6, "unfused");
    testing::expectClose(y1, y2, 1e-6, 1e-7, "fused vs unfused");
    // no bias
    biasGeluForward(x.data(), nullptr, y1.data(), T, C);
    for (int i = 0; i < T * C; ++i) EXPECT_NEAR(y1[i], refGelu(x[i]), 1e-6 + 1e-5 * std::fabs(refGelu(x[i])));
}

TEST(KernelsActivation, BiasGeluBackwardMatchesFiniteDifferences) {
    const int T = 5, C = 13;
    auto x = randomVector(T * C, 62, -4.0f, 4.0f), b = randomVector(C, 63);
    const auto r = randomVector(T * C, 64);
    std::vector<float> y(T * C);
    auto loss = [&] {
        biasGeluForward(x.data(), b.data(), y.data(), T, C);
        return testing::dotD(r, y);
    };
    std::vector<float> dx(T * C), db(C, 0.0f);
    biasGeluBackward(r.data(), x.data(), b.data(), dx.data(), db.data(), T, C);
    testing::checkGradient(x, dx, loss, testing::allIndices(x.size()), 1e-3, 2e-3, "dx");
    testing::checkGradient(b, db, loss, testing::allIndices(b.size()), 1e-3, 2e-3, "db");
}

TEST(KernelsActivation, SwigluForwardAndBackward) {
    const int T = 4, F = 11;
    auto x = randomVector(T * 2 * F, 65, -4.0f, 4.0f);
    const auto r = randomVector(T * F, 66);
    std::vector<float> y(T * F);
    swigluForward(x.data(), y.data(), T, F);
    for (int t = 0; t < T; ++t)
        for (int f = 0; f < F; ++f) {
            const double g = x[t * 2 * F + f], u = x[t * 2 * F + F + f];
            const double want = g / (1.0 + std::exp(-g)) * u;
            EXPECT_NEAR(y[t * F + f], want, 1e-6 + 1e-5 * std::fabs(want));
        }
    auto loss = [&] {
        swigluForward(x.data(), y.data(), T, F);
        return testing::dotD(r, y);
    };
    std::vector<float> dx(x.size());
    swigluBackward(r.data(), x.data(), dx.data(), T, F);
    testing::checkGradient(x, dx, loss, testing::allIndices(x.size()), 1e-3, 2e-3, "dx");
}

TEST(KernelsDropout, MaskReproducibleFromSeedAndOffsetAndKeepsOneMinusP) {
    const int64_t n = 200000;
    const float p = 0.3f;
    std::vector<uint8_t> m1(n), m2(n), m3(n);
    const auto x = randomVector(n, 67);
    std::vector<float> y(n);
    dropoutForward(x.data(), y.data(), m1.data(), n, p, 1234, 0);
    dropoutMask(m2.data(), n, p, 1234, 0);
    EXPECT_EQ(m1, m2);  // regenerated without data
    // offset shifts the stream: offset k at i equals offset 0 at i + k
    const int64_t k = 777;
    dropoutMask(m3.data(), n - k, p, 1234, k);
    for (int64_t i = 0; i < n - k; ++i) ASSERT_EQ(m3[i], m1[i + k]) << i;
    // another seed gives another mask
    dropoutMask(m3.data(), n, p, 1235, 0);
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += m3[i] == m1[i];
    EXPECT_LT(same, n * 0.7);  // independent masks agree on p^2 + (1-p)^2 = 58% of entries
    // keep fraction within 5 sigma of the binomial
    int64_t kept = 0;
    for (auto m : m1) kept += m;
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(static_cast<double>(kept), n * (1 - p), 5 * sigma);
    // kept values scaled by 1/(1-p), dropped are 0
    for (int64_t i = 0; i < n; ++i) {
        if (m1[i]) ASSERT_FLOAT_EQ(y[i], x[i] / (1 - p));
        else ASSERT_EQ(y[i], 0.0f);
    }
    // no bias towards runs: neighbours are independent (P(both kept) ~ (1-p)^2)
    int64_t both = 0;
    for (int64_t i = 0; i + 1 < n; ++i) both += m1[i] & m1[i + 1];
    EXPECT_NEAR(static_cast<double>(both) / (n - 1), (1 - p) * (1 - p), 0.01);
}

TEST(KernelsDropout, BackwardAppliesSameMaskAndScale) {
    const int64_t n = 1000;
    const float p = 0.25f;
    const auto x = randomVector(n, 68), dy = randomVector(n, 69);
    std::vector<float> y(n), dx(n);
    std::vector<uint8_t> mask(n);
    dropoutForward(x.data(), y.data(), mask.data(), n, p, 9, 100);
    dropoutBackward(dy.data(), mask.data(), dx.data(), n, p);
    // the op is linear in x given the mask: d(sum dy*y)/dx_i = dy_i * y_i / x_i
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(dx[i], dy[i] * (y[i] / x[i]), 1e-5);
    // p = 0 is the identity with an all-ones mask
    dropoutForward(x.data(), y.data(), mask.data(), n, 0.0f, 9, 100);
    for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(y[i], x[i]);
        EXPECT_EQ(mask[i], 1);
    }
}

TEST(KernelsDropout, BiasDropoutAddFusedEqualsUnfusedWithSameMask) {
    const int T = 33, C = 40;
    const float p = 0.4f;
    const auto x = randomVector(T * C, 70), b = randomVector(C, 71), res = randomVector(T * C, 72);
    for (bool bias : {true, false}) {
        std::vector<float> o1(T * C), o2(T * C);
        std::vector<uint8_t> m1(T * C), m2(T * C);
        biasDropoutAddFused(x.data(), bias ? b.data() : nullptr, res.data(), o1.data(), m1.data(),
                            T, C, p, 42, 5000);
        biasDropoutAddUnfused(x.data(), bias ? b.data() : nullptr, res.data(), o2.data(),
                              m2.data(), T, C, p, 42, 5000);
        EXPECT_EQ(m1, m2);
        testing::expectClose(o1, o2, 1e-6, 1e-7, "out");
        // against the definition, with the mask from the RNG alone
        std::vector<uint8_t> m3(T * C);
        dropoutMask(m3.data(), T * C, p, 42, 5000);
        EXPECT_EQ(m1, m3);
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < C; ++c) {
                const int i = t * C + c;
                const double u = x[i] + (bias ? b[c] : 0.0f);
                EXPECT_NEAR(o1[i], res[i] + (m3[i] ? u / (1 - p) : 0.0), 1e-5);
            }
    }
}

TEST(KernelsDropout, BiasDropoutAddBackwardMatchesFiniteDifferences) {
    const int T = 6, C = 7;
    const float p = 0.3f;
    auto x = randomVector(T * C, 73), b = randomVector(C, 74);
    const auto res = randomVector(T * C, 75), r = randomVector(T * C, 76);
    std::vector<float> out(T * C);
    std::vector<uint8_t> mask(T * C);
    auto loss = [&] {  // same seed/offset each call: the mask is fixed
        biasDropoutAddFused(x.data(), b.data(), res.data(), out.data(), mask.data(), T, C, p, 3, 0);
        return testing::dotD(r, out);
    };
    loss();
    std::vector<float> dx(T * C), db(C, 0.0f);
    biasDropoutAddBackward(r.data(), mask.data(), dx.data(), db.data(), T, C, p);
    testing::checkGradient(x, dx, loss, testing::allIndices(x.size()), 1e-2, 1e-3, "dx");
    testing::checkGradient(b, db, loss, testing::allIndices(b.size()), 1e-2, 1e-3, "db");
}

}  // namespace
}  // namespace ts::kernels::cpu
