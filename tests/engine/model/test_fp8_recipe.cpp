// FP8 scaling bookkeeping (engine/model/fp8.h) step by step against REFERENCE.md §6.2/§6.3,
// with the expected histories and scales worked out by hand here.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>

#include <random>
#include <vector>

#include "engine/model/fp8.h"
#include "kernels/cpu/fp8_block.h"

namespace ts::engine {
namespace {

TEST(Fp8Meta, MostRecentWithHistoryOneUsesLastStepsAmax) {
    Fp8Meta m;
    m.reset(1);
    EXPECT_EQ(m.scale, 1.0f);
    m.observe(2.0f);
    m.observe(3.5f);  // the step's running amax is the max of its tensors
    m.observe(1.0f);
    m.update(448.0f, 0, false);
    EXPECT_EQ(m.scale, 448.0f / 3.5f);
    ASSERT_EQ(m.history.size(), 1u);
    EXPECT_EQ(m.history[0], 0.0f);  // restarts for the next step
    m.update(448.0f, 0, false);  // a step that saw nothing (amax 0): the scale stays
    EXPECT_EQ(m.scale, 448.0f / 3.5f);
}

TEST(Fp8Meta, HistoryRollAndMaxOverTheWindow) {
    // H = 3: history[0] = current step, [1] oldest, [2] newest earlier step.
    Fp8Meta m;
    m.reset(3);
    const float amax[] = {4.0f, 1.0f, 2.0f, 0.5f, 0.25f};
    // The update takes the max over the last H steps (the oldest, history[1], counts once more
    // before it drops out): steps {0}, {0,1}, {0,1,2}, {1,2,3}, {2,3,4}.
    const float wantScale[] = {448.0f / 4.0f, 448.0f / 4.0f, 448.0f / 4.0f, 448.0f / 2.0f, 448.0f / 2.0f};
    const float wantHist[][3] = {{0, 0, 4}, {0, 4, 1}, {0, 1, 2}, {0, 2, 0.5f}, {0, 0.5f, 0.25f}};
    for (int k = 0; k < 5; ++k) {
        m.observe(amax[k]);
        m.update(448.0f, 0, true);
        EXPECT_EQ(m.scale, wantScale[k]) << "step " << k;
        for (int i = 0; i < 3; ++i) EXPECT_EQ(m.history[size_t(i)], wantHist[k][i]) << "step " << k << " slot " << i;
    }
    // most_recent over the same window ignores the older entries.
    Fp8Meta r;
    r.reset(3);
    r.observe(4.0f);
    r.update(448.0f, 0, false);
    r.observe(1.0f);
    r.update(448.0f, 0, false);
    EXPECT_EQ(r.scale, 448.0f);
}

TEST(Fp8Meta, MarginOverflowAndNonFiniteAmax) {
    Fp8Meta m;
    m.reset(1);
    m.observe(7.0f);
    m.update(57344.0f, 2, false);
    EXPECT_EQ(m.scale, 57344.0f / 7.0f / 4.0f);
    const float kept = m.scale;
    m.observe(INFINITY);
    m.update(448.0f, 0, false);
    EXPECT_EQ(m.scale, kept);  // inf amax: scale kept
    m.observe(NAN);
    m.observe(1.0f);  // NaN sticks for the step
    EXPECT_TRUE(std::isnan(m.history[0]));
    m.update(448.0f, 0, false);
    EXPECT_EQ(m.scale, kept);
    m.observe(1e-40f);  // denormal amax: 448 / amax overflows fp32
    m.update(448.0f, 0, false);
    EXPECT_EQ(m.scale, FLT_MAX);
}

TEST(Fp8Scaling, CurrentScale) {
    EXPECT_EQ(currentScale(2.0f, 448.0f), 224.0f);
    EXPECT_EQ(currentScale(0.0f, 448.0f), 1.0f);
    EXPECT_EQ(currentScale(INFINITY, 448.0f), 1.0f);
    EXPECT_EQ(currentScale(NAN, 57344.0f), 1.0f);
    EXPECT_EQ(currentScale(1e-40f, 448.0f), FLT_MAX);
}

TEST(Fp8Recipe, FromConfig) {
    Config c;
    c.bf16 = true;
    c.fp8 = "hybrid";
    c.fp8_amax_history_len = 16;
    c.fp8_amax_compute_algo = "max";
    c.first_last_layers_bf16 = true;
    c.num_layers = 6;
    auto r = Fp8Recipe::fromConfig(c);
    ASSERT_TRUE(r.isOk()) << r.status().message();
    EXPECT_TRUE(r->enabled && r->delayed && r->algoMax);
    EXPECT_EQ(r->forward, kernels::cpu::Fp8Format::E4M3);
    EXPECT_EQ(r->backward, kernels::cpu::Fp8Format::E5M2);
    EXPECT_EQ(r->historyLen, 16);
    EXPECT_FALSE(r->layerInFp8(0, 6));
    EXPECT_TRUE(r->layerInFp8(1, 6));
    EXPECT_TRUE(r->layerInFp8(4, 6));
    EXPECT_FALSE(r->layerInFp8(5, 6));
    c.fp8_recipe = "mxfp8";
    auto mx = Fp8Recipe::fromConfig(c);
    ASSERT_TRUE(mx.isOk()) << mx.status().message();
    EXPECT_TRUE(mx->block == Fp8Recipe::Block::Mxfp8 && !mx->delayed);
    c.fp8_recipe = "blockwise";
    EXPECT_TRUE(Fp8Recipe::fromConfig(c)->block == Fp8Recipe::Block::Blockwise);
    c.fp8_recipe = "custom";
    auto bad = Fp8Recipe::fromConfig(c);
    ASSERT_FALSE(bad.isOk());
    EXPECT_NE(bad.status().message().find("custom"), std::string::npos);
    c.fp8 = "";
    EXPECT_FALSE(Fp8Recipe::fromConfig(c)->enabled);
}

// The experts' in-op quantization (fp8QuantizeTensor), here on the CPU with the slots in host
// floats: delayed uses the meta's scale and accumulates the amax into `observed`; tensorwise
// takes the scale from this tensor's amax and reports it; a gradient's amax and scale are for
// values gradDivisor times smaller; no rows observe nothing (delayed) or amax 0 (tensorwise).
TEST(Fp8Recipe, QuantizeTensorForExpertRows) {
    Fp8Recipe r;
    r.enabled = true;
    r.backward = kernels::cpu::Fp8Format::E5M2;
    float scale = 2.0f;  // delayed: the step's scale, where kernels read it
    float observed = 1.0f, raw = -1.0f;
    Fp8TensorSlots q{&scale, &observed, &raw};
    std::vector<float> x = {1.0f, -3.0f, 0.3f};
    fp8QuantizeTensor(r, q, false, 1.0f, x.data(), x.data(), nullptr, 3);
    EXPECT_EQ(observed, 3.0f);            // max(1, 3)
    EXPECT_EQ(scale, 2.0f);
    EXPECT_EQ(x[1], -3.0f);               // 6 is an E4M3 value
    EXPECT_EQ(x[2], 0.3125f);             // 0.6 -> 0.625 (E4M3 step 1/16 at [0.5, 1)), / 2
    std::vector<float> g = {-8.0f, 1.0f};
    float sg = 1.0f;
    float og = 0.0f;
    fp8QuantizeTensor(r, {&sg, &og, &raw}, true, 4.0f, g.data(), g.data(), nullptr, 2);
    EXPECT_EQ(og, 2.0f);                  // 8 / 4
    fp8QuantizeTensor(r, {&sg, &og, &raw}, true, 4.0f, nullptr, nullptr, nullptr, 0);
    EXPECT_EQ(og, 2.0f);                  // delayed: no rows change nothing
    // the scale is read when the kernel runs: another one there quantizes at it
    scale = 3.0f;
    std::vector<float> x3 = {0.7f};
    fp8QuantizeTensor(r, q, false, 1.0f, x3.data(), x3.data(), nullptr, 1);
    EXPECT_EQ(x3[0], 2.0f * (1.0f / 3.0f));  // 2.1 -> 2 (E4M3 step 1/4 at [2, 4)), / 3 (at 2: 1.375 / 2)
    r.delayed = false;
    std::vector<float> t = {0.5f, -7.0f}, y(2, 0.0f);
    std::vector<uint8_t> codes(2, 0);
    float ot = 5.0f;
    fp8QuantizeTensor(r, {nullptr, &ot, &raw}, false, 1.0f, t.data(), y.data(), codes.data(), 2);
    EXPECT_EQ(ot, 7.0f);                  // the last amax, not accumulated
    EXPECT_EQ(raw, 7.0f);
    EXPECT_FLOAT_EQ(y[1], -7.0f);         // scale 448 / 7: -7 -> -448, exact
    EXPECT_EQ(t[1], -7.0f);               // x untouched when y is another buffer
    EXPECT_EQ(codes[1], kernels::cpu::fp8Encode(-448.0f, kernels::cpu::Fp8Format::E4M3));
    fp8QuantizeTensor(r, {nullptr, &ot, &raw}, false, 1.0f, nullptr, nullptr, nullptr, 0);
    EXPECT_EQ(ot, 0.0f);
}

namespace kc = kernels::cpu;

// A block recipe by name, with the block kinds of its activations/gradients and weights.
struct BlockRecipe {
    Fp8Recipe r;
    kc::Fp8BlockKind act, weight;
};
BlockRecipe blockRecipe(const char* recipe) {
    Config c;
    c.bf16 = true;
    c.fp8 = "hybrid";
    c.fp8_recipe = recipe;
    const Fp8Recipe r = *Fp8Recipe::fromConfig(c);
    const bool mx = r.block == Fp8Recipe::Block::Mxfp8;
    return {r, mx ? kc::Fp8BlockKind::Mx1x32 : kc::Fp8BlockKind::Block1x128,
            mx ? kc::Fp8BlockKind::Mx1x32 : kc::Fp8BlockKind::Block128x128};
}
// m [rows, cols] block-quantized (and dequantized) straight with the kernels/cpu function.
std::vector<float> blockQ(const float* m, int rows, int cols, kc::Fp8BlockKind kind, bool alongRows, kc::Fp8Format f) {
    std::vector<float> y(size_t(rows) * cols);
    kc::fp8BlockQuantizeDequantize(m, y.data(), nullptr, nullptr, rows, cols, kind, alongRows, f);
    return y;
}

// Block recipes: the backward of y = x W^T takes each GEMM's operands quantized along that GEMM's
// reduction dimension, all from high precision (REFERENCE.md §6.4): dgrad dy (blocks along out)
// times W (along out), wgrad dy^T x (both along the tokens). Reference: the block quantizations
// (kernels/cpu/fp8_block.h, tested against their own reference in tests/kernels) with the
// directions written out here, and the GEMMs in double.
TEST(Fp8Recipe, BlockLinearBackwardQuantizesAlongEachGemmsReduction) {
    const int T = 64, in = 64, out = 96;
    std::mt19937 gen(3);
    std::normal_distribution<float> nd(0.f, 1.f);
    // Magnitudes vary along both dimensions (2^18 down a column, 2^12 along a row). With
    // power-of-two scales a block's scale moves every normal FP8 value by the same power of two,
    // so the direction shows where a block's range reaches FP8's subnormals: down a column here.
    auto matrix = [&](int rows, int cols) {
        std::vector<float> m(static_cast<size_t>(rows) * cols);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) m[size_t(r) * cols + c] = std::ldexp(nd(gen), (r % 7) * 3 - (c % 5) * 3);
        return m;
    };
    const std::vector<float> dy = matrix(T, out), W = matrix(out, in);
    // x: every 32nd column 2^20 larger. Along a row, its blocks are dominated by that column and
    // the rest of the row falls below FP8's smallest subnormal; along a column nothing does.
    std::vector<float> x = matrix(T, in);
    for (int t = 0; t < T; ++t)
        for (int i = 0; i < in; i += 32) x[size_t(t) * in + i] = std::ldexp(x[size_t(t) * in + i], 20);
    for (const char* recipe : {"mxfp8", "blockwise"}) {
        const BlockRecipe br = blockRecipe(recipe);
        const Fp8Recipe& r = br.r;
        const kc::Fp8BlockKind act = br.act, wk = br.weight;
        auto q = [](const std::vector<float>& m, int rows, int cols, kc::Fp8BlockKind kind, bool alongRows,
                    kc::Fp8Format f) { return blockQ(m.data(), rows, cols, kind, alongRows, f); };
        const auto dyRow = q(dy, T, out, act, true, kc::Fp8Format::E5M2);
        const auto dyCol = q(dy, T, out, act, false, kc::Fp8Format::E5M2);
        const auto xCol = q(x, T, in, act, false, kc::Fp8Format::E4M3);
        const auto wCol = q(W, out, in, wk, false, kc::Fp8Format::E4M3);
        // The weight copy the model's dgrad uses, and the forward's input and weight (along in).
        std::vector<float> buf(W.size()), buf2(x.size());
        const float* Wc = fp8BlockOperand(r, W.data(), out, in, false, true, false, buf.data());
        EXPECT_EQ(std::vector<float>(Wc, Wc + W.size()), wCol) << recipe;
        const float* xr = fp8BlockOperand(r, x.data(), T, in, true, false, false, buf2.data());
        EXPECT_EQ(std::vector<float>(xr, xr + x.size()), q(x, T, in, act, true, kc::Fp8Format::E4M3)) << recipe;
        std::vector<double> dxRef(size_t(T) * in, 0.0), dwRef(size_t(out) * in, 0.0);
        for (int t = 0; t < T; ++t)
            for (int o = 0; o < out; ++o)
                for (int i = 0; i < in; ++i) {
                    dxRef[size_t(t) * in + i] += double(dyRow[size_t(t) * out + o]) * wCol[size_t(o) * in + i];
                    dwRef[size_t(o) * in + i] += double(dyCol[size_t(t) * out + o]) * xCol[size_t(t) * in + i];
                }
        std::vector<float> dx(size_t(T) * in), dW(size_t(out) * in, 0.f);
        std::vector<float> work(size_t(fp8BlockBackwardWorkElems(T, in, out)));
        fp8BlockLinearBackward(r, dy.data(), x.data(), Wc, dx.data(), dW.data(), T, in, out, work.data());
        auto relErr = [](const std::vector<float>& a, const std::vector<double>& ref) {
            double e = 0, n = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
                e += (a[i] - ref[i]) * (a[i] - ref[i]);
                n += ref[i] * ref[i];
            }
            return std::sqrt(e / n);
        };
        EXPECT_LT(relErr(dx, dxRef), 1e-6) << recipe;
        EXPECT_LT(relErr(dW, dwRef), 1e-6) << recipe;
        // Sensitive to the direction: the wgrad with x quantized along its rows (the forward's
        // copy, reused) differs from the right one by more than the tolerance above.
        const auto xRow = q(x, T, in, act, true, kc::Fp8Format::E4M3);
        std::vector<double> wrong(size_t(out) * in, 0.0);
        for (int t = 0; t < T; ++t)
            for (int o = 0; o < out; ++o)
                for (int i = 0; i < in; ++i)
                    wrong[size_t(o) * in + i] += double(dyCol[size_t(t) * out + o]) * xRow[size_t(t) * in + i];
        auto relErrSmallColumns = [&](const std::vector<float>& a, const std::vector<double>& ref) {
            double e = 0, n = 0;
            for (int o = 0; o < out; ++o)
                for (int i = 0; i < in; ++i)
                    if (i % 32 != 0) {
                        const double d = a[size_t(o) * in + i] - ref[size_t(o) * in + i];
                        e += d * d;
                        n += ref[size_t(o) * in + i] * ref[size_t(o) * in + i];
                    }
            return std::sqrt(e / n);
        };
        EXPECT_LT(relErrSmallColumns(dW, dwRef), 1e-6) << recipe;
        EXPECT_GT(relErrSmallColumns(dW, wrong), 0.5) << recipe;
    }
}

// One MoE expert GEMM under each block recipe (fp8BlockExpertsForward / Backward, the functions
// gpt_moe.cpp calls for fc1 and fc2): three local experts with 37, 0 and 70 rows in one buffer.
// Against a reference that quantizes with kernels/cpu directly, each expert's rows as a tensor of
// their own (TE's GroupedLinear splits its input by m_splits before quantizing): the forward
// Q(x along in) Q(W along in)^T, the dgrad Q(dy along out) Q(W along out), the wgrad
// Q(dy along T)^T Q(x along T). Expert 0's inputs are 2^-24 times expert 2's: quantizing the
// concatenated rows as one tensor (blocks along the tokens straddling the experts) would take
// their blocks' scales from expert 2's rows and flush them below FP8's smallest subnormal.
TEST(Fp8BlockExperts, EachExpertsRowsAreQuantizedAsTheirOwnTensor) {
    const int in = 64, out = 96, L = 3;
    const int off[L + 1] = {0, 37, 37, 107};
    const int R = off[L];
    std::mt19937 gen(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto fill = [&](int n) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float& e : v) e = nd(gen);
        return v;
    };
    std::vector<float> x = fill(R * in), dy = fill(R * out);
    for (int r = 0; r < off[1]; ++r)
        for (int i = 0; i < in; ++i) x[size_t(r) * in + i] = std::ldexp(x[size_t(r) * in + i], -24);
    std::vector<std::vector<float>> W(L);
    for (auto& w : W) w = fill(out * in);
    for (const char* recipe : {"mxfp8", "blockwise"}) {
        const BlockRecipe br = blockRecipe(recipe);
        const Fp8Recipe& r = br.r;
        const kc::Fp8BlockKind act = br.act, wk = br.weight;
        const auto q = blockQ;
        // The weight copies as the model makes them (fp8BlockWeight: fp8BlockOperand), checked here.
        std::vector<std::vector<float>> wRow(L), wCol(L);
        std::vector<const float*> Wr(L), Wc(L);
        for (int l = 0; l < L; ++l) {
            wRow[size_t(l)].resize(W[size_t(l)].size());
            wCol[size_t(l)].resize(W[size_t(l)].size());
            Wr[size_t(l)] = fp8BlockOperand(r, W[size_t(l)].data(), out, in, true, true, false, wRow[size_t(l)].data());
            Wc[size_t(l)] = fp8BlockOperand(r, W[size_t(l)].data(), out, in, false, true, false, wCol[size_t(l)].data());
            EXPECT_EQ(wRow[size_t(l)], q(W[size_t(l)].data(), out, in, wk, true, kc::Fp8Format::E4M3)) << recipe;
            EXPECT_EQ(wCol[size_t(l)], q(W[size_t(l)].data(), out, in, wk, false, kc::Fp8Format::E4M3)) << recipe;
        }
        // The engine: all experts in one call, and expert by expert as the model's ops call it.
        std::vector<float> y(size_t(R) * out), y1(size_t(R) * out), xq(size_t(R) * in);
        fp8BlockExpertsForward(r, x.data(), Wr.data(), nullptr, y.data(), off, 0, L, in, out, xq.data());
        for (int l = 0; l < L; ++l)
            fp8BlockExpertsForward(r, x.data(), Wr.data(), nullptr, y1.data(), off, l, l + 1, in, out, xq.data());
        EXPECT_EQ(y, y1) << recipe;
        std::vector<float> dx(size_t(R) * in), work(size_t(fp8BlockBackwardWorkElems(R, in, out)));
        std::vector<std::vector<float>> dW(L, std::vector<float>(size_t(out) * in, 0.f));
        std::vector<float*> dWp(L);
        for (int l = 0; l < L; ++l) dWp[size_t(l)] = dW[size_t(l)].data();
        fp8BlockExpertsBackward(r, dy.data(), x.data(), Wc.data(), dx.data(), dWp.data(), off, 0, L, in, out, work.data());
        // The reference, expert by expert on its own rows.
        std::vector<double> yRef(size_t(R) * out, 0.0), dxRef(size_t(R) * in, 0.0);
        std::vector<std::vector<double>> dwRef(L, std::vector<double>(size_t(out) * in, 0.0));
        for (int l = 0; l < L; ++l) {
            const int r0 = off[l], rows = off[l + 1] - r0;
            if (rows == 0) continue;
            const auto xr = q(x.data() + size_t(r0) * in, rows, in, act, true, kc::Fp8Format::E4M3);
            const auto xc = q(x.data() + size_t(r0) * in, rows, in, act, false, kc::Fp8Format::E4M3);
            const auto dr = q(dy.data() + size_t(r0) * out, rows, out, act, true, kc::Fp8Format::E5M2);
            const auto dc = q(dy.data() + size_t(r0) * out, rows, out, act, false, kc::Fp8Format::E5M2);
            const auto& wr = wRow[size_t(l)];
            const auto& wc = wCol[size_t(l)];
            for (int t = 0; t < rows; ++t)
                for (int o = 0; o < out; ++o)
                    for (int i = 0; i < in; ++i) {
                        yRef[size_t(r0 + t) * out + o] += double(xr[size_t(t) * in + i]) * wr[size_t(o) * in + i];
                        dxRef[size_t(r0 + t) * in + i] += double(dr[size_t(t) * out + o]) * wc[size_t(o) * in + i];
                        dwRef[size_t(l)][size_t(o) * in + i] += double(dc[size_t(t) * out + o]) * xc[size_t(t) * in + i];
                    }
        }
        auto relErr = [](const float* a, const std::vector<double>& ref) {
            double e = 0, n = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
                e += (a[i] - ref[i]) * (a[i] - ref[i]);
                n += ref[i] * ref[i];
            }
            return n > 0 ? std::sqrt(e / n) : std::sqrt(e);
        };
        EXPECT_LT(relErr(y.data(), yRef), 1e-6) << recipe;
        EXPECT_LT(relErr(dx.data(), dxRef), 1e-6) << recipe;
        for (int l = 0; l < L; ++l) EXPECT_LT(relErr(dW[size_t(l)].data(), dwRef[size_t(l)]), 1e-6) << recipe << " expert " << l;
        EXPECT_EQ(dW[1], std::vector<float>(size_t(out) * in, 0.f)) << recipe << ": expert 1 has no rows";
        // The wgrad of expert 0 with the concatenated rows quantized along the tokens as one
        // tensor: blocks that reach into expert 2's rows flush expert 0's (mxfp8: its rows 32-36,
        // blockwise: all of them).
        const auto xAll = q(x.data(), R, in, act, false, kc::Fp8Format::E4M3);
        const auto dAll = q(dy.data(), R, out, act, false, kc::Fp8Format::E5M2);
        std::vector<double> wrong(size_t(out) * in, 0.0);
        for (int t = 0; t < off[1]; ++t)
            for (int o = 0; o < out; ++o)
                for (int i = 0; i < in; ++i)
                    wrong[size_t(o) * in + i] += double(dAll[size_t(t) * out + o]) * xAll[size_t(t) * in + i];
        const std::vector<float> wrongF(wrong.begin(), wrong.end());
        EXPECT_GT(relErr(wrongF.data(), dwRef[0]), 0.1) << recipe << ": quantizing the rows together is not told apart";
    }
}

}  // namespace
}  // namespace ts::engine
