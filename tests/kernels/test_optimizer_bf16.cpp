// AdamW against a hand-written torch.optim.AdamW step (3 steps), bf16 rounding edge cases
// against a nearest-value search in double, and the vectorized exp against std::exp.
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/vec_math.h"

#include <cstring>
#include <limits>

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

TEST(KernelsAdamW, ThreeStepsMatchPyTorchFormula) {
    const int64_t n = 257;
    auto p = randomVector(n, 90), m = std::vector<float>(n, 0.f), v = std::vector<float>(n, 0.f);
    // reference state in double, following torch/optim/adamw.py (_single_tensor_adamw)
    std::vector<double> pr(p.begin(), p.end()), mr(n, 0.0), vr(n, 0.0);
    AdamParams hp;
    hp.lr = 3e-3f;
    hp.beta1 = 0.9f;
    hp.beta2 = 0.95f;
    hp.eps = 1e-8f;
    hp.weightDecay = 0.1f;
    for (int step = 1; step <= 3; ++step) {
        const auto g = randomVector(n, 100 + step, -2.f, 2.f);
        hp.step = step;
        adamwStep(p.data(), g.data(), m.data(), v.data(), n, hp);
        const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, wd = hp.weightDecay;
        for (int64_t i = 0; i < n; ++i) {
            pr[i] *= 1.0 - lr * wd;                                   // param.mul_(1 - lr*wd)
            mr[i] = mr[i] + (1.0 - b1) * (g[i] - mr[i]);              // exp_avg.lerp_(g, 1-b1)
            vr[i] = vr[i] * b2 + (1.0 - b2) * g[i] * g[i];            // mul_(b2).addcmul_(g,g,1-b2)
            const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
            const double denom = std::sqrt(vr[i]) / std::sqrt(bc2) + hp.eps;
            pr[i] += -(lr / bc1) * mr[i] / denom;                     // addcdiv_(m, denom, -lr/bc1)
        }
        testing::expectClose(p, pr, 2e-6, 1e-7, "param");
        testing::expectClose(m, mr, 1e-5, 1e-7, "exp_avg");
        testing::expectClose(v, vr, 1e-5, 1e-9, "exp_avg_sq");
    }
    // not a vacuous comparison: Adam's normalized steps (~lr each) moved the parameters
    auto p0 = randomVector(n, 90);
    double moved = 0;
    for (int64_t i = 0; i < n; ++i) moved += std::fabs(p[i] - p0[i]);
    EXPECT_GT(moved / n, 1e-3);
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
float fromBits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// gradScale (the folded clip coefficient) gives exactly the step on grads scaled first, as
// Megatron's in-place clipping does, and leaves the grads untouched.
TEST(KernelsAdamW, GradScaleEqualsScalingTheGradsFirst) {
    const int64_t n = 300;
    auto p1 = randomVector(n, 91), p2 = p1;
    std::vector<float> m1(n, 0.f), v1(n, 0.f), m2(n, 0.f), v2(n, 0.f);
    AdamParams hp;
    hp.lr = 1e-2f;
    hp.weightDecay = 0.1f;
    const float coef = 0.3712f;
    for (int step = 1; step <= 3; ++step) {
        const auto g = randomVector(n, 200 + step, -3.f, 3.f);
        std::vector<float> scaled = g;
        scale(scaled.data(), coef, n);
        hp.step = step;
        AdamParams folded = hp;
        folded.gradScale = coef;
        std::vector<float> gCopy = g;
        adamwStep(p1.data(), gCopy.data(), m1.data(), v1.data(), n, folded);
        adamwStep(p2.data(), scaled.data(), m2.data(), v2.data(), n, hp);
        ASSERT_EQ(gCopy, g) << "the grads are read, not scaled in place";
    }
    for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits(p1[i]), bits(p2[i])) << i;
        ASSERT_EQ(bits(m1[i]), bits(m2[i])) << i;
        ASSERT_EQ(bits(v1[i]), bits(v2[i])) << i;
    }
    EXPECT_NE(m1[0], 0.0f);
}

// The bf16 value nearest to x (ties to the even mantissa), by comparing the two neighbours in
// double. Overflow beyond the rounding boundary of the max finite bf16 goes to inf.
uint16_t refBf16(float x) {
    if (std::isnan(x)) return 0x7FC0;  // any NaN; checked separately
    const uint32_t u = bits(x);
    const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation (toward zero)
    const uint16_t hi = static_cast<uint16_t>(lo + 1);   // next away from zero
    const double dx = x;
    const double dlo = fromBits(static_cast<uint32_t>(lo) << 16);
    // the value of `hi` may be inf (0x7F80): use the exact step instead
    // bf16 spacing: 2^(e-7) for normal exponents e, 2^-133 throughout the denormal range
    const double step = std::ldexp(1.0, std::max(std::ilogb(dlo == 0 ? x : dlo), -126) - 7);
    const double dhi = dlo + (x < 0 ? -step : step);
    const double elo = std::fabs(dx - dlo), ehi = std::fabs(dx - dhi);
    if (elo < ehi) return lo;
    if (ehi < elo) return hi;
    return (lo & 1) ? hi : lo;
}

// The bf16 model copy written in the step's pass: the same params, moments bit for bit as without
// it, and bits that are floatToBf16 of the new params (ties, NaN and values near bf16's largest
// among them: params placed there before a step with lr 0 and no decay leave them as they are).
TEST(KernelsAdamW, ModelBitsAreTheNewParamsInBf16) {
    const int64_t n = 1031;
    auto p1 = randomVector(n, 91), g = randomVector(n, 92, -2.f, 2.f);
    p1[0] = 1.00390625f;        // a tie between two bf16 (even: down)
    p1[1] = 1.01171875f;        // a tie (even: up)
    p1[2] = std::numeric_limits<float>::quiet_NaN();
    p1[3] = 3.4e38f;            // rounds past bf16's largest: inf
    auto p2 = p1, m1 = std::vector<float>(n, 0.f), v1 = m1, m2 = m1, v2 = m1;
    std::vector<uint16_t> bits(static_cast<size_t>(n), 0), want(static_cast<size_t>(n));
    AdamParams hp;
    for (float lr : {0.f, 3e-3f}) {  // lr 0: the params stay (the edge values reach the bits)
        hp.lr = lr;
        hp.weightDecay = lr == 0 ? 0.f : 0.1f;
        hp.step = lr == 0 ? 1 : 2;
        adamwStep(p1.data(), g.data(), m1.data(), v1.data(), n, hp, bits.data());
        adamwStep(p2.data(), g.data(), m2.data(), v2.data(), n, hp);
        EXPECT_EQ(std::memcmp(p1.data(), p2.data(), size_t(n) * sizeof(float)), 0) << "params, lr " << lr;
        EXPECT_EQ(std::memcmp(m1.data(), m2.data(), size_t(n) * sizeof(float)), 0) << "exp_avg, lr " << lr;
        EXPECT_EQ(std::memcmp(v1.data(), v2.data(), size_t(n) * sizeof(float)), 0) << "exp_avg_sq, lr " << lr;
        floatToBf16(p2.data(), want.data(), n);
        EXPECT_EQ(bits, want) << "lr " << lr;
        if (lr == 0) {
            EXPECT_EQ(bits[0], 0x3F80) << "tie to even, down";
            EXPECT_EQ(bits[1], 0x3F82) << "tie to even, up";
            EXPECT_EQ(bits[3], 0x7F80) << "past the largest bf16: inf";
        }
    }
}

TEST(KernelsBf16, RoundToNearestEvenEdgeCases) {
    auto conv = [](float f) {
        uint16_t h;
        floatToBf16(&f, &h, 1);
        return h;
    };
    // exact ties: 1 + 2^-8 sits half way between 1 and 1+2^-7 -> even (1.0)
    EXPECT_EQ(conv(fromBits(0x3F808000)), 0x3F80);
    // 1 + 3*2^-8: half way between 1+2^-7 (odd) and 1+2^-6 (even) -> up
    EXPECT_EQ(conv(fromBits(0x3F818000)), 0x3F82);
    // just above a tie rounds up, just below rounds down
    EXPECT_EQ(conv(fromBits(0x3F808001)), 0x3F81);
    EXPECT_EQ(conv(fromBits(0x3F807FFF)), 0x3F80);
    // negative tie
    EXPECT_EQ(conv(fromBits(0xBF808000)), 0xBF80);
    // inf stays inf, NaN stays NaN (quiet, sign kept), even a NaN whose payload is in the
    // low bits only (truncation would turn it into inf)
    EXPECT_EQ(conv(std::numeric_limits<float>::infinity()), 0x7F80);
    EXPECT_EQ(conv(-std::numeric_limits<float>::infinity()), 0xFF80);
    const uint16_t qn = conv(fromBits(0x7F800001));
    EXPECT_EQ(qn & 0x7F80, 0x7F80);
    EXPECT_NE(qn & 0x007F, 0);
    const uint16_t nn = conv(fromBits(0xFFC00000));
    EXPECT_EQ(nn & 0x8000, 0x8000);
    EXPECT_NE(nn & 0x007F, 0);
    // largest finite bf16 is exact; float max rounds past it to inf
    EXPECT_EQ(conv(fromBits(0x7F7F0000)), 0x7F7F);
    EXPECT_EQ(conv(std::numeric_limits<float>::max()), 0x7F80);
    // largest float that still rounds down to the max finite bf16
    EXPECT_EQ(conv(fromBits(0x7F7F7FFF)), 0x7F7F);
    // denormals and signed zero
    EXPECT_EQ(conv(-0.0f), 0x8000);
    EXPECT_EQ(conv(fromBits(0x00008000)), 0x0000);  // tie -> even 0
    EXPECT_EQ(conv(fromBits(0x00018000)), 0x0002);  // tie -> even 2
}

TEST(KernelsBf16, RandomValuesMatchNearestSearchAndRoundTrip) {
    std::mt19937 rng(91);
    std::vector<float> x(20000);
    for (auto& f : x) {
        // random bit patterns over all finite exponents, plus many exact ties
        uint32_t u = rng() & 0xFFFFFFFFu;
        if ((u & 0x7F800000u) == 0x7F800000u) u &= 0xBFFFFFFFu;  // avoid inf/NaN here
        if (rng() % 4 == 0) u = (u & 0xFFFF0000u) | 0x8000u;     // tie
        f = fromBits(u);
    }
    std::vector<uint16_t> h(x.size());
    floatToBf16(x.data(), h.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(h[i], refBf16(x[i])) << std::hex << bits(x[i]);
    std::vector<float> back(x.size());
    bf16ToFloat(h.data(), back.data(), static_cast<int64_t>(x.size()));
    auto y = x;
    roundToBf16(y.data(), static_cast<int64_t>(y.size()));
    for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(bits(back[i]), static_cast<uint32_t>(h[i]) << 16);
        ASSERT_EQ(bits(y[i]), bits(back[i]));
    }
}

TEST(KernelsVecMath, ExpApproxAccurateAndEdgeCases) {
    double worst = 0;
    for (int i = -870000; i <= 887000; i += 7) {
        const float x = static_cast<float>(i) * 1e-4f;
        const double want = std::exp(static_cast<double>(x));
        if (want < 1.2e-38) continue;  // denormal range is flushed to 0 on purpose
        const double got = detail::expApprox(x);
        worst = std::max(worst, std::fabs(got - want) / want);
    }
    EXPECT_LT(worst, 5e-7);
    EXPECT_EQ(detail::expApprox(-std::numeric_limits<float>::infinity()), 0.0f);
    EXPECT_EQ(detail::expApprox(-100.0f), 0.0f);
    EXPECT_TRUE(std::isinf(detail::expApprox(89.0f)));
    EXPECT_TRUE(std::isnan(detail::expApprox(std::numeric_limits<float>::quiet_NaN())));
    EXPECT_EQ(detail::expApprox(0.0f), 1.0f);
}

}  // namespace
}  // namespace ts::kernels::cpu
