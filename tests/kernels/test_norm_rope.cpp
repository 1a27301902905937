// LayerNorm / RMSNorm and RoPE: forward against double-precision references, backward against
// finite differences, fused variants against the unfused paths.
#include "kernel_test_util.h"
#include "kernels/cpu/ops.h"

#include <cstdint>
#include <cstring>
#include <functional>

namespace ts::kernels::cpu {
namespace {

using testing::randomVector;

std::vector<double> refLayerNorm(const std::vector<float>& x, const std::vector<float>& w,
                                 const float* b, int T, int C, double eps) {
    std::vector<double> y(x.size());
    for (int t = 0; t < T; ++t) {
        double mu = 0, var = 0;
        for (int c = 0; c < C; ++c) mu += x[t * C + c];
        mu /= C;
        for (int c = 0; c < C; ++c) var += (x[t * C + c] - mu) * (x[t * C + c] - mu);
        var /= C;  // biased, like torch
        for (int c = 0; c < C; ++c)
            y[t * C + c] = (x[t * C + c] - mu) / std::sqrt(var + eps) * w[c] + (b ? b[c] : 0.0);
    }
    return y;
}

TEST(KernelsNorm, LayerNormForwardMatchesReferenceBothPaths) {
    const int T = 5, C = 37;  // C not a multiple of the lane count: exercises the tails
    // an offset mean checks the variance is not computed as E[x^2]-E[x]^2 naively
    const auto x = randomVector(T * C, 30, 9.0f, 11.0f);
    const auto w = randomVector(C, 31, 0.5f, 1.5f), b = randomVector(C, 32);
    for (bool fused : {false, true})
        for (bool bias : {true, false}) {
            std::vector<float> y(T * C), mean(T), rstd(T);
            (fused ? layerNormForwardFused : layerNormForward)(
                x.data(), w.data(), bias ? b.data() : nullptr, y.data(), mean.data(),
                rstd.data(), T, C, 1e-5f, false);
            testing::expectClose(y, refLayerNorm(x, w, bias ? b.data() : nullptr, T, C, 1e-5),
                                 1e-4, 1e-4, fused ? "fused y" : "y");
        }
}

TEST(KernelsNorm, LayerNormFusedEqualsUnfused) {
    const int T = 16, C = 256;
    const auto x = randomVector(T * C, 33, -3.0f, 3.0f), w = randomVector(C, 34),
               b = randomVector(C, 35), dy = randomVector(T * C, 36);
    std::vector<float> y1(T * C), y2(T * C), m1(T), m2(T), r1(T), r2(T);
    layerNormForward(x.data(), w.data(), b.data(), y1.data(), m1.data(), r1.data(), T, C, 1e-5f);
    layerNormForwardFused(x.data(), w.data(), b.data(), y2.data(), m2.data(), r2.data(), T, C,
                          1e-5f);
    testing::expectClose(y2, y1, 1e-5, 1e-5, "y");
    testing::expectClose(m2, m1, 1e-5, 1e-6, "mean");
    testing::expectClose(r2, r1, 1e-5, 0, "rstd");
    std::vector<float> dx1(T * C), dx2(T * C), dw1(C, 0.f), dw2(C, 0.f), db1(C, 0.f), db2(C, 0.f);
    layerNormBackward(dy.data(), x.data(), w.data(), m1.data(), r1.data(), dx1.data(), dw1.data(),
                      db1.data(), T, C);
    layerNormBackwardFused(dy.data(), x.data(), w.data(), m1.data(), r1.data(), dx2.data(),
                           dw2.data(), db2.data(), T, C);
    testing::expectClose(dx2, dx1, 1e-5, 1e-5, "dx");
    testing::expectClose(dw2, dw1, 1e-5, 1e-5, "dw");
    testing::expectClose(db2, db1, 1e-5, 1e-6, "db");
}

TEST(KernelsNorm, LayerNormBackwardMatchesFiniteDifferences) {
    const int T = 4, C = 19;
    for (bool fused : {false, true})
        for (bool bias : {true, false}) {
            auto x = randomVector(T * C, 37, -2.0f, 2.0f), w = randomVector(C, 38),
                 b = randomVector(C, 39);
            const auto r = randomVector(T * C, 40);
            std::vector<float> y(T * C), mean(T), rstd(T);
            auto loss = [&] {
                layerNormForward(x.data(), w.data(), bias ? b.data() : nullptr, y.data(),
                                 mean.data(), rstd.data(), T, C, 1e-5f);
                return testing::dotD(r, y);
            };
            loss();
            std::vector<float> dx(T * C), dw(C, 0.f), db(C, 0.f);
            (fused ? layerNormBackwardFused : layerNormBackward)(
                r.data(), x.data(), w.data(), mean.data(), rstd.data(), dx.data(), dw.data(),
                bias ? db.data() : nullptr, T, C, false);
            testing::checkGradient(x, dx, loss, testing::allIndices(x.size()), 1e-2, 2e-3, "dx");
            testing::checkGradient(w, dw, loss, testing::allIndices(w.size()), 1e-2, 2e-3, "dw");
            if (bias)
                testing::checkGradient(b, db, loss, testing::allIndices(b.size()), 1e-2, 2e-3,
                                       "db");
            else
                for (float v : db) EXPECT_EQ(v, 0.0f);  // null db: nothing written anywhere
        }
}

TEST(KernelsNorm, RmsNormForwardAndBackward) {
    const int T = 4, C = 21;
    auto x = randomVector(T * C, 41, -2.0f, 2.0f), w = randomVector(C, 42, 0.5f, 1.5f);
    const auto r = randomVector(T * C, 43);
    std::vector<float> y(T * C), rstd(T);
    rmsNormForward(x.data(), w.data(), y.data(), rstd.data(), T, C, 1e-6f);
    std::vector<double> want(T * C);
    for (int t = 0; t < T; ++t) {
        double ms = 0;
        for (int c = 0; c < C; ++c) ms += static_cast<double>(x[t * C + c]) * x[t * C + c];
        const double rs = 1.0 / std::sqrt(ms / C + 1e-6);
        for (int c = 0; c < C; ++c) want[t * C + c] = x[t * C + c] * rs * w[c];
    }
    testing::expectClose(y, want, 1e-5, 1e-6, "y");
    auto loss = [&] {
        rmsNormForward(x.data(), w.data(), y.data(), rstd.data(), T, C, 1e-6f);
        return testing::dotD(r, y);
    };
    loss();
    std::vector<float> dx(T * C), dw(C, 0.f);
    rmsNormBackward(r.data(), x.data(), w.data(), rstd.data(), dx.data(), dw.data(), T, C);
    testing::checkGradient(x, dx, loss, testing::allIndices(x.size()), 1e-2, 2e-3, "dx");
    testing::checkGradient(w, dw, loss, testing::allIndices(w.size()), 1e-2, 2e-3, "dw");
}

// Straight from the definition, in double: out = [x1 cos - x2 sin, x2 cos + x1 sin].
std::vector<double> refRope(const std::vector<float>& x, int s, int b, int n, int d,
                            double theta, int posOffset) {
    std::vector<double> out(x.size());
    const int half = d / 2;
    for (int si = 0; si < s; ++si)
        for (int r = 0; r < b * n; ++r) {
            const size_t base = (static_cast<size_t>(si) * b * n + r) * d;
            for (int i = 0; i < half; ++i) {
                const double ang = (posOffset + si) * std::pow(theta, -2.0 * i / d);
                const double x1 = x[base + i], x2 = x[base + half + i];
                out[base + i] = x1 * std::cos(ang) - x2 * std::sin(ang);
                out[base + half + i] = x2 * std::cos(ang) + x1 * std::sin(ang);
            }
        }
    return out;
}

TEST(KernelsRope, ForwardMatchesDefinitionWithOffsetFusedAndUnfused) {
    const int s = 9, b = 2, n = 3, d = 8, offset = 37;
    const auto x = randomVector(static_cast<size_t>(s) * b * n * d, 44);
    const auto want = refRope(x, s, b, n, d, 10000.0, offset);
    auto a = x, f = x;
    ropeForward(a.data(), s, b, n, d, 10000.0f, offset);
    ropeForwardFused(f.data(), s, b, n, d, 10000.0f, offset);
    // angles up to ~45 rad are computed in float like torch: abs error ~ 45 * 6e-8
    testing::expectClose(a, want, 1e-5, 1e-5, "unfused");
    testing::expectClose(f, want, 1e-5, 1e-5, "fused");
    testing::expectClose(f, a, 1e-6, 1e-7, "fused vs unfused");
}

TEST(KernelsRope, BackwardMatchesFiniteDifferencesWithOffset) {
    const int s = 5, b = 2, n = 2, d = 6, offset = 11;
    auto x = randomVector(static_cast<size_t>(s) * b * n * d, 45);
    const auto r = randomVector(x.size(), 46);
    auto loss = [&] {
        auto y = x;
        ropeForwardFused(y.data(), s, b, n, d, 500.0f, offset);
        return testing::dotD(r, y);
    };
    auto dx = r;
    ropeBackward(dx.data(), s, b, n, d, 500.0f, offset);
    testing::checkGradient(x, dx, loss, testing::allIndices(x.size()), 1e-2, 1e-3, "dx");
    // The backward must not be the forward at offset 0 (a plausible bug): differs from it.
    auto wrong = r;
    ropeBackward(wrong.data(), s, b, n, d, 500.0f, 0);
    double diff = 0;
    for (size_t i = 0; i < dx.size(); ++i) diff += std::fabs(dx[i] - wrong[i]);
    EXPECT_GT(diff, 1e-2);
}

// roundBf16: each kernel that writes a bf16 model's activation stores bf16 values in the same
// pass: exactly roundToBf16 of what it writes without the flag (every element), and nothing else
// it writes (statistics, parameter gradients, masks) changes.
TEST(KernelsBf16Out, EveryRoundedOutputIsTheRoundingOfTheFp32One) {
    const int T = 6, C = 2101;  // C past the dropout's 2048-element mask chunk, odd
    const size_t n = size_t(T) * C;
    const auto x = randomVector(n, 90, -3.0f, 3.0f), w = randomVector(C, 91), b = randomVector(C, 92);
    const auto dy = randomVector(n, 93), res = randomVector(n, 94), x2 = randomVector(2 * n, 95, -4.0f, 4.0f);
    auto rounded = [](std::vector<float> v) {
        roundToBf16(v.data(), int64_t(v.size()));
        return v;
    };
    auto bits = [](const std::vector<float>& v) {
        std::vector<uint32_t> o(v.size());
        std::memcpy(o.data(), v.data(), v.size() * sizeof(float));
        return o;
    };
    struct Out {
        std::vector<float> y, side;
        std::vector<uint8_t> mask;
    };
    // LayerNorm's unfused and fused kernels take the same arguments: one case each way.
    auto layerNormForwardOf = [&](auto forward) {
        return [&, forward](bool r) {
            Out o{std::vector<float>(n), std::vector<float>(2 * T), {}};
            forward(x.data(), w.data(), b.data(), o.y.data(), o.side.data(), o.side.data() + T, T, C, 1e-5f, r);
            return o;
        };
    };
    auto layerNormBackwardOf = [&](auto backward) {
        return [&, backward](bool r) {
            std::vector<float> y(n), st(2 * T);
            layerNormForward(x.data(), w.data(), b.data(), y.data(), st.data(), st.data() + T, T, C, 1e-5f);
            Out o{std::vector<float>(n), std::vector<float>(2 * size_t(C), 0.0f), {}};
            backward(dy.data(), x.data(), w.data(), st.data(), st.data() + T, o.y.data(), o.side.data(),
                     o.side.data() + C, T, C, r);
            return o;
        };
    };
    // op(roundBf16) -> its output and what else it writes
    const std::vector<std::pair<const char*, std::function<Out(bool)>>> ops = {
        {"layerNormForward", layerNormForwardOf(layerNormForward)},
        {"layerNormForwardFused", layerNormForwardOf(layerNormForwardFused)},
        {"rmsNormForward", [&](bool r) {
             Out o{std::vector<float>(n), std::vector<float>(T), {}};
             rmsNormForward(x.data(), w.data(), o.y.data(), o.side.data(), T, C, 1e-5f, r);
             return o;
         }},
        {"layerNormBackward", layerNormBackwardOf(layerNormBackward)},
        {"layerNormBackwardFused", layerNormBackwardOf(layerNormBackwardFused)},
        {"rmsNormBackward", [&](bool r) {
             std::vector<float> y(n), rs(T);
             rmsNormForward(x.data(), w.data(), y.data(), rs.data(), T, C, 1e-5f);
             Out o{std::vector<float>(n), std::vector<float>(C, 0.0f), {}};
             rmsNormBackward(dy.data(), x.data(), w.data(), rs.data(), o.y.data(), o.side.data(), T, C, r);
             return o;
         }},
        {"biasGeluForward", [&](bool r) {
             Out o{std::vector<float>(n), {}, {}};
             biasGeluForward(x.data(), b.data(), o.y.data(), T, C, r);
             return o;
         }},
        {"swigluForward", [&](bool r) {
             Out o{std::vector<float>(n), {}, {}};
             swigluForward(x2.data(), o.y.data(), T, C, r);
             return o;
         }},
        {"biasDropoutAddFused p=0.3", [&](bool r) {
             Out o{std::vector<float>(n), {}, std::vector<uint8_t>(n)};
             biasDropoutAddFused(x.data(), b.data(), res.data(), o.y.data(), o.mask.data(), T, C, 0.3f, 7, 1001, r);
             return o;
         }},
        {"biasDropoutAddFused p=0", [&](bool r) {
             Out o{std::vector<float>(n), {}, std::vector<uint8_t>(n)};
             biasDropoutAddFused(x.data(), nullptr, res.data(), o.y.data(), o.mask.data(), T, C, 0.0f, 7, 0, r);
             return o;
         }},
    };
    for (const auto& [name, run] : ops) {
        SCOPED_TRACE(name);
        const Out plain = run(false), round = run(true);
        size_t changed = 0;
        for (size_t i = 0; i < n; ++i) changed += plain.y[i] != round.y[i];
        EXPECT_GT(changed, n / 2) << "the flag should round most of the outputs";
        EXPECT_EQ(bits(round.y), bits(rounded(plain.y)));
        EXPECT_EQ(bits(round.side), bits(plain.side));
        EXPECT_EQ(round.mask, plain.mask);
    }
}

}  // namespace
}  // namespace ts::kernels::cpu
