// The sigmoid-form GeLU (activation.cpp) and its clamped exp (vec_math.h expClamped80) against
// double-precision references over a wide input range, plus the documented special values;
// the softmax exp (expShifted) against expApprox bit for bit.
// The reference is the tanh-GeLU evaluated in double as u / (1 + exp(-2z)) (identical to
// 0.5 u (1 + tanh z) mathematically, but free of the 1 + tanh cancellation that makes the tanh
// form useless in double below u ~ -8); both forms are checked against each other too.
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

#include <cstring>
#include <limits>

namespace ts::kernels::cpu {
namespace {

constexpr double kK0 = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kK1 = 0.044715;

double refZ2(double u) { return 2.0 * kK0 * (u + kK1 * u * u * u); }
// sigmoid(z2) and sigmoid(z2) (1 - sigmoid(z2)) from exp(-|z2|), which never overflows
double refSigmoid(double z2) {
    const double e = std::exp(-std::fabs(z2));
    return z2 >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}
double refSigmoidSlope(double z2) {
    const double e = std::exp(-std::fabs(z2));
    return e / ((1.0 + e) * (1.0 + e));
}
double refGeluSigmoid(double u) { return u * refSigmoid(refZ2(u)); }
double refGeluTanh(double u) { return 0.5 * u * (1.0 + std::tanh(0.5 * refZ2(u))); }
// d/du [u s(z2(u))] = s + u s (1 - s) z2'(u)
double refGeluGrad(double u) {
    const double z2 = refZ2(u);
    return refSigmoid(z2) + u * refSigmoidSlope(z2) * 2.0 * kK0 * (1.0 + 3.0 * kK1 * u * u);
}

std::vector<float> geluOf(const std::vector<float>& x) {
    std::vector<float> y(x.size());
    biasGeluForward(x.data(), nullptr, y.data(), 1, static_cast<int>(x.size()));
    return y;
}
std::vector<float> geluGradOf(const std::vector<float>& x) {
    const std::vector<float> ones(x.size(), 1.0f);
    std::vector<float> dx(x.size());
    biasGeluBackward(ones.data(), x.data(), nullptr, dx.data(), nullptr, 1,
                     static_cast<int>(x.size()));
    return dx;
}

TEST(KernelsVecMath, ExpClamped80AccurateInRangeAndClampsOutside) {
    double worst = 0;
    for (int i = -800000; i <= 800000; i += 3) {
        const float x = static_cast<float>(i) * 1e-4f;
        const double want = std::exp(static_cast<double>(x));
        worst = std::max(worst, std::fabs(detail::expClamped80(x) - want) / want);
    }
    EXPECT_LT(worst, 5e-7);
    const double lo = std::exp(-80.0), hi = std::exp(80.0);
    const float inf = std::numeric_limits<float>::infinity();
    for (float x : {-80.5f, -100.0f, -1e30f, -inf})
        EXPECT_NEAR(detail::expClamped80(x), lo, 1e-6 * lo) << x;
    for (float x : {80.5f, 100.0f, 1e30f, inf})
        EXPECT_NEAR(detail::expClamped80(x), hi, 1e-6 * hi) << x;
    EXPECT_TRUE(std::isnan(detail::expClamped80(std::numeric_limits<float>::quiet_NaN())));
    EXPECT_EQ(detail::expClamped80(0.0f), 1.0f);
}

TEST(KernelsVecMath, ExpShiftedEqualsExpApproxBitForBitOnSoftmaxArguments) {
    // softmax/cross-entropy arguments x - rowmax: every float step in [-100, 0] region sampled
    // densely, plus the positive part up to the documented 88.3 bound
    int mismatches = 0;
    for (int i = -1000000; i <= 883000; ++i) {
        const float x = static_cast<float>(i) * 1e-4f;
        const float a = detail::expApprox(x), b = detail::expShifted(x);
        if (std::memcmp(&a, &b, sizeof a) != 0 && ++mismatches < 5)
            ADD_FAILURE() << "x=" << x << ": expApprox " << a << " expShifted " << b;
    }
    EXPECT_EQ(mismatches, 0);
    // and the double reference, independently of expApprox
    for (float x : {-87.0f, -50.0f, -10.0f, -1.0f, -1e-3f, 0.0f})
        EXPECT_NEAR(detail::expShifted(x), std::exp(double(x)), 5e-7 * std::exp(double(x)));
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(detail::expShifted(-inf), 0.0f);
    EXPECT_EQ(detail::expShifted(-88.0f), 0.0f);
    EXPECT_TRUE(std::isnan(detail::expShifted(std::numeric_limits<float>::quiet_NaN())));
}

TEST(KernelsActivation, GeluSigmoidFormMatchesDoubleReferenceOverWideRange) {
    // dense in [-40, 40] (covers both clamp points, u ~ +-10.4) plus large magnitudes
    std::vector<float> x;
    for (int i = -400000; i <= 400000; ++i) x.push_back(static_cast<float>(i) * 1e-4f);
    for (float big : {50.0f, 1e3f, 1e6f, 1e10f, 1e19f, 1e30f, std::numeric_limits<float>::max()}) {
        x.push_back(big);
        x.push_back(-big);
    }
    const auto y = geluOf(x);
    const auto g = geluGradOf(x);
    double worstY = 0, worstG = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double u = x[i];
        const double wantY = refGeluSigmoid(u);
        const double wantG = refGeluGrad(u);
        // The float argument z2 carries a relative rounding error of a few 1e-8, which exp
        // turns into an absolute error of |z2| times that in the exponent: allow relative
        // error growing with |z2| (capped where the kernel returns the float limit).
        const double z2 = std::min(std::fabs(refZ2(u)), 80.0);
        const double relTol = 2e-6 + 1.5e-7 * z2;
        const double errY = std::fabs(y[i] - wantY);
        ASSERT_LE(errY, relTol * std::fabs(wantY) + 1e-30) << "gelu(" << u << ") = " << y[i]
                                                            << " want " << wantY;
        const double errG = std::fabs(g[i] - wantG);
        ASSERT_LE(errG, relTol * std::fabs(wantG) + 2e-7) << "gelu'(" << u << ") = " << g[i]
                                                           << " want " << wantG;
        if (std::fabs(wantY) > 1e-30) worstY = std::max(worstY, errY / std::fabs(wantY));
        worstG = std::max(worstG, errG);
        // where the tanh form is still accurate in double, it agrees with the sigmoid form
        if (std::fabs(u) < 4.0) {
            ASSERT_NEAR(wantY, refGeluTanh(u), 1e-12);
            ASSERT_NEAR(y[i], refGeluTanh(u), 1e-6 * std::fabs(wantY) + 1e-7);
        }
    }
    // the bulk of the range is far tighter than the tail bound above
    EXPECT_LT(worstY, 2e-5);
    EXPECT_LT(worstG, 2e-7);
}

TEST(KernelsActivation, GeluSpecialValuesAreTheDocumentedLimits) {
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float fmax = std::numeric_limits<float>::max();
    const std::vector<float> x = {inf, -inf, nan, 1e30f, -1e30f, fmax, -fmax, -20.0f, 20.0f};
    const auto y = geluOf(x);
    const auto g = geluGradOf(x);
    EXPECT_EQ(y[0], inf);
    EXPECT_TRUE(std::isnan(y[1]));  // -inf * 0, as the tanh formula (and torch) give
    EXPECT_TRUE(std::isnan(y[2]));
    EXPECT_EQ(y[3], 1e30f);
    EXPECT_EQ(y[4], 0.0f);
    EXPECT_EQ(y[5], fmax);
    EXPECT_EQ(y[6], 0.0f);
    EXPECT_EQ(y[7], 0.0f);  // true value ~ -20 * exp(-571): below the float range
    EXPECT_EQ(y[8], 20.0f);
    EXPECT_EQ(g[0], 1.0f);
    EXPECT_EQ(g[1], 0.0f);
    EXPECT_TRUE(std::isnan(g[2]));
    EXPECT_EQ(g[3], 1.0f);
    EXPECT_EQ(g[4], 0.0f);
    EXPECT_EQ(g[5], 1.0f);
    EXPECT_EQ(g[6], 0.0f);
    EXPECT_EQ(g[7], 0.0f);
    EXPECT_EQ(g[8], 1.0f);
}

}  // namespace
}  // namespace ts::kernels::cpu
