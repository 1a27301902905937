// The "moe" and "fp8" sections of analyzeRun on hand-written counters of 2 ranks over 2 steps;
// every expected number is worked out by hand in the comments.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "profiler/analysis.h"
#include "tests/profiler/trace_builder.h"

using namespace ts;
using namespace ts::profiler;
using ts::profiler::testing::TraceBuilder;
using trace::Category;
using trace::TrackKind;

namespace {

void counter(TraceBuilder& b, int rank, const std::string& name, int64_t ts, double v) {
    b.writer->counter({rank, b.writer->intern(name), ts, v});
}

// One MoE forward of layer `layer` on `rank` at `ts`: aux, z and the tokens of each expert.
void moeForward(TraceBuilder& b, int rank, int layer, int64_t ts, double aux, double z, const std::vector<double>& tokens) {
    const std::string base = "moe.layer" + std::to_string(layer) + ".";
    counter(b, rank, base + "aux_loss", ts, aux);
    counter(b, rank, base + "z_loss", ts, z);
    for (size_t e = 0; e < tokens.size(); ++e) counter(b, rank, base + "tokens.expert" + std::to_string(e), ts, tokens[e]);
}

void fp8(TraceBuilder& b, int rank, const std::string& tensor, int64_t ts, double amax, double scale) {
    counter(b, rank, "fp8." + tensor + ".amax", ts, amax);
    counter(b, rank, "fp8." + tensor + ".scale", ts, scale);
}

// Steps: rank 0 step 0 [0,1000), step 1 [1000,2000); rank 1 shifted by 10 ns, so a rank 1
// sample at 1005 is still its step 0 (windows are per rank). Values are binary fractions, so
// the sums below are exact.
void buildCounters(TraceBuilder& b) {
    uint32_t h0 = b.track(0, TrackKind::HostThread), c0 = b.track(0, TrackKind::Compute);
    uint32_t h1 = b.track(1, TrackKind::HostThread), c1 = b.track(1, TrackKind::Compute);
    b.putStep(h0, 0, 0, 1000);
    b.putStep(h0, 1, 1000, 2000);
    b.putStep(h1, 0, 10, 1010);
    b.putStep(h1, 1, 1010, 2010);
    b.put(c0, Category::Gemm, 0, 500, "gemm");
    b.put(c1, Category::Gemm, 10, 510, "moe.unpermute");  // a slice named moe.*: not a counter
    // MoE layer 0, two forwards per rank in step 0, one in step 1.
    //  step 0: aux (0.125 + 0.375 + 0.25 + 0.5) / 4 = 0.3125, z (0.0625 + 0.125 + 0.0625 + 0.25) / 4 = 0.125
    //          tokens [3,1,2,2] + [2,2,2,2] + [4,0,2,2] + [3,1,2,2] = [12,4,8,8]
    //  step 1: aux (0.75 + 0.25) / 2 = 0.5, z (0.5 + 0.25) / 2 = 0.375, tokens [1,5,1,1] + [2,4,1,1] = [3,9,2,2]
    moeForward(b, 0, 0, 100, 0.125, 0.0625, {3, 1, 2, 2});
    moeForward(b, 0, 0, 200, 0.375, 0.125, {2, 2, 2, 2});
    moeForward(b, 1, 0, 150, 0.25, 0.0625, {4, 0, 2, 2});
    moeForward(b, 1, 0, 1005, 0.5, 0.25, {3, 1, 2, 2});
    moeForward(b, 0, 0, 1100, 0.75, 0.5, {1, 5, 1, 1});
    moeForward(b, 1, 0, 1150, 0.25, 0.25, {2, 4, 1, 1});
    // Layer 1 only on rank 1 (another pipeline stage) in step 1, no tokens routed.
    moeForward(b, 1, 1, 1200, 2, 1, {0, 0});
    // Layer 0 has an expert capacity: dropped copies 3 + 1 (step 0, two ranks), 6 (step 1).
    counter(b, 0, "moe.layer0.dropped_tokens", 100, 3);
    counter(b, 1, "moe.layer0.dropped_tokens", 150, 1);
    counter(b, 0, "moe.layer0.dropped_tokens", 1100, 6);
    // After every step window of rank 0: counted, not used.
    counter(b, 0, "moe.layer0.aux_loss", 5000, 8);
    // FP8: rank 0 and 1 disagree on the scale of layer2.linear_qkv.input in step 1.
    fp8(b, 0, "layer2.linear_qkv.input", 50, 4, 100);
    fp8(b, 1, "layer2.linear_qkv.input", 60, 5, 100);
    fp8(b, 0, "layer2.linear_qkv.input", 1050, 6, 50);
    fp8(b, 1, "layer2.linear_qkv.input", 1060, 3, 80);
    fp8(b, 0, "layer2.linear_fc2.grad", 1050, 0.5, 1000);
    fp8(b, 1, "layer2.linear_fc2.grad", 1060, 0.5, 1000);
    fp8(b, 1, "layer10.linear_fc1.weight", 60, 2, 200);
    fp8(b, 1, "layer10.linear_fc1.weight", 1060, 2, 224);
    counter(b, 0, "fp8.bogus", 100, 1);  // not a tensor counter: ignored
    counter(b, 0, "memory.params", 0, 100);
}

}  // namespace

TEST(ModelCounters, MoeLossesTokensAndImbalanceOverRanksAndSteps) {
    TraceBuilder b;
    buildCounters(b);
    auto doc = analyzeRun(b.done(), AnalyzeOptions{});
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    ASSERT_TRUE(doc->contains("moe"));
    const auto& moe = (*doc)["moe"];
    EXPECT_EQ(moe["samples_outside_steps"], 1);
    ASSERT_EQ(moe["layers"].size(), 2u);
    const auto& l0 = moe["layers"][0];
    EXPECT_EQ(l0["layer"], 0);
    EXPECT_EQ(l0["steps"], 2);
    // Mean of the step values (0.3125 + 0.5) / 2, not the mean of all six samples (0.375).
    EXPECT_DOUBLE_EQ(l0["aux_loss_mean"].get<double>(), 0.40625);
    EXPECT_DOUBLE_EQ(l0["z_loss_mean"].get<double>(), 0.25);
    // ([12,4,8,8] + [3,9,2,2]) / 2 = [7.5,6.5,5,5]: mean 6, max 7.5 (expert 0) -> 1.25
    EXPECT_EQ(l0["tokens_per_expert"], (std::vector<double>{7.5, 6.5, 5, 5}));
    EXPECT_DOUBLE_EQ(l0["imbalance"].get<double>(), 1.25);
    EXPECT_EQ(l0["max_expert"], 0);
    EXPECT_EQ(l0["last_step"], 1);
    EXPECT_DOUBLE_EQ(l0["aux_loss_last"].get<double>(), 0.5);
    EXPECT_DOUBLE_EQ(l0["z_loss_last"].get<double>(), 0.375);
    // [3,9,2,2]: mean 4, max 9 -> 2.25
    EXPECT_EQ(l0["tokens_per_expert_last"], (std::vector<double>{3, 9, 2, 2}));
    EXPECT_DOUBLE_EQ(l0["imbalance_last"].get<double>(), 2.25);
    // (4 + 6) / 2 steps; the last step's 6. Layer 1 had no capacity: no such keys.
    EXPECT_DOUBLE_EQ(l0["dropped_tokens_mean"].get<double>(), 5.0);
    EXPECT_DOUBLE_EQ(l0["dropped_tokens_last"].get<double>(), 6.0);
    EXPECT_FALSE(moe["layers"][1].contains("dropped_tokens_mean"));
    const auto& l1 = moe["layers"][1];
    EXPECT_EQ(l1["layer"], 1);
    EXPECT_EQ(l1["steps"], 1);
    EXPECT_DOUBLE_EQ(l1["aux_loss_mean"].get<double>(), 2.0);
    EXPECT_DOUBLE_EQ(l1["z_loss_mean"].get<double>(), 1.0);
    EXPECT_DOUBLE_EQ(l1["imbalance"].get<double>(), 0.0);  // no tokens: no imbalance, no max expert
    EXPECT_TRUE(l1["max_expert"].is_null());
    EXPECT_TRUE((*doc)["definitions"].contains("moe"));

    const std::string text = formatAnalysisText(*doc);
    EXPECT_NE(text.find("MoE router"), std::string::npos) << text;
    EXPECT_NE(text.find("layer 0: aux 0.406"), std::string::npos) << text;
    EXPECT_NE(text.find("imbalance 1.25 (max expert 0)"), std::string::npos) << text;
    EXPECT_NE(text.find("1 samples outside every step"), std::string::npos) << text;
    EXPECT_NE(text.find("dropped 5.0 token copies/step"), std::string::npos) << text;

    // One step: step 0 only. Layer 1 has no sample there.
    AnalyzeOptions one;
    one.step = 0;
    auto d0 = analyzeRun(*b.store, one);
    ASSERT_TRUE(d0.isOk()) << d0.status().toString();
    ASSERT_EQ((*d0)["moe"]["layers"].size(), 1u);
    const auto& s0 = (*d0)["moe"]["layers"][0];
    EXPECT_DOUBLE_EQ(s0["aux_loss_mean"].get<double>(), 0.3125);
    EXPECT_DOUBLE_EQ(s0["z_loss_mean"].get<double>(), 0.125);
    EXPECT_EQ(s0["tokens_per_expert"], (std::vector<double>{12, 4, 8, 8}));
    EXPECT_DOUBLE_EQ(s0["imbalance"].get<double>(), 1.5);  // 12 / 8
}

TEST(ModelCounters, Fp8LastAmaxAndScalePerTensor) {
    TraceBuilder b;
    buildCounters(b);
    auto doc = analyzeRun(b.done(), AnalyzeOptions{});
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    ASSERT_TRUE(doc->contains("fp8"));
    const auto& f = (*doc)["fp8"];
    EXPECT_EQ(f["tensor_count"], 3);
    ASSERT_EQ(f["tensors"].size(), 3u);
    // By layer number (2 before 10), then name.
    const auto& grad = f["tensors"][0];
    const auto& qkv = f["tensors"][1];
    const auto& fc1 = f["tensors"][2];
    EXPECT_EQ(grad["tensor"], "layer2.linear_fc2.grad");
    EXPECT_EQ(qkv["tensor"], "layer2.linear_qkv.input");
    EXPECT_EQ(fc1["tensor"], "layer10.linear_fc1.weight");
    EXPECT_EQ(fc1["layer"], 10);
    // qkv input, last samples: rank 0 (amax 6, scale 50), rank 1 (3, 80).
    EXPECT_DOUBLE_EQ(qkv["amax"].get<double>(), 6);
    EXPECT_DOUBLE_EQ(qkv["scale_min"].get<double>(), 50);
    EXPECT_DOUBLE_EQ(qkv["scale_max"].get<double>(), 80);
    EXPECT_EQ(qkv["ranks"], 2);
    EXPECT_DOUBLE_EQ(grad["amax"].get<double>(), 0.5);
    EXPECT_DOUBLE_EQ(grad["scale_min"].get<double>(), 1000);
    EXPECT_DOUBLE_EQ(fc1["scale_max"].get<double>(), 224);
    EXPECT_EQ(fc1["ranks"], 1);
    EXPECT_EQ(f["smallest_scale"]["tensor"], "layer2.linear_qkv.input");
    EXPECT_DOUBLE_EQ(f["smallest_scale"]["scale"].get<double>(), 50);
    EXPECT_EQ(f["largest_scale"]["tensor"], "layer2.linear_fc2.grad");
    EXPECT_DOUBLE_EQ(f["largest_scale"]["scale"].get<double>(), 1000);

    const std::string text = formatAnalysisText(*doc);
    EXPECT_NE(text.find("FP8 (last amax and scale): 3 tensors, smallest scale 50 (layer2.linear_qkv.input), largest "
                        "1000 (layer2.linear_fc2.grad); 1 with different scales across ranks"),
              std::string::npos)
        << text;

    // Step 0: its last samples; fc2.grad has none there.
    AnalyzeOptions one;
    one.step = 0;
    auto d0 = analyzeRun(*b.store, one);
    ASSERT_TRUE(d0.isOk()) << d0.status().toString();
    const auto& t0 = (*d0)["fp8"]["tensors"];
    ASSERT_EQ(t0.size(), 2u);
    EXPECT_EQ(t0[0]["tensor"], "layer2.linear_qkv.input");
    EXPECT_DOUBLE_EQ(t0[0]["amax"].get<double>(), 5);
    EXPECT_DOUBLE_EQ(t0[0]["scale_min"].get<double>(), 100);
    EXPECT_DOUBLE_EQ(t0[0]["scale_max"].get<double>(), 100);
    EXPECT_DOUBLE_EQ(t0[1]["scale_max"].get<double>(), 200);
}

// Memory reads only memory.* counters: the router and FP8 counters are not memory categories.
TEST(ModelCounters, AreNotMemory) {
    TraceBuilder b;
    buildCounters(b);
    auto m = memorySummary(b.done(), 0);
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    ASSERT_EQ(m->peakBytesByCategory.size(), 1u);
    EXPECT_DOUBLE_EQ(m->peakBytesByCategory["params"], 100);
    EXPECT_DOUBLE_EQ(m->peakTotalBytes, 100);
}

TEST(ModelCounters, RunWithoutThemHasNoSections) {
    TraceBuilder b;
    uint32_t h0 = b.track(0, TrackKind::HostThread), c0 = b.track(0, TrackKind::Compute);
    b.putStep(h0, 0, 0, 1000);
    b.put(c0, Category::Gemm, 0, 500, "moe.router");  // names of slices are not counters
    counter(b, 0, "memory.params", 0, 100);
    counter(b, 0, "moe.layerX.aux_loss", 10, 1);      // not the engine's form
    counter(b, 0, "fp8.layer0.linear_qkv.input", 10, 1);  // no .amax/.scale
    auto doc = analyzeRun(b.done(), AnalyzeOptions{});
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    EXPECT_FALSE(doc->contains("moe"));
    EXPECT_FALSE(doc->contains("fp8"));
    EXPECT_FALSE((*doc)["definitions"].contains("moe"));
    const std::string text = formatAnalysisText(*doc);
    EXPECT_EQ(text.find("MoE router"), std::string::npos) << text;
    EXPECT_EQ(text.find("FP8 ("), std::string::npos) << text;
}

// FP8 state of MoE experts: "fp8.layer<L>.expert<E>.<linear>.<slot>" is a tensor of layer L,
// one per global expert; ranks holding the same expert (edp replicas) are merged.
TEST(ModelCounters, Fp8ExpertTensorsAreTheirOwnTensors) {
    TraceBuilder b;
    uint32_t h0 = b.track(0, TrackKind::HostThread), h1 = b.track(1, TrackKind::HostThread);
    b.putStep(h0, 0, 0, 1000);
    b.putStep(h1, 0, 0, 1000);
    fp8(b, 0, "layer3.expert5.linear_fc1.grad", 100, 0.25, 4096);
    fp8(b, 1, "layer3.expert5.linear_fc1.grad", 110, 0.5, 2048);
    fp8(b, 1, "layer3.expert12.linear_fc2.input", 110, 2, 224);
    auto doc = analyzeRun(b.done(), AnalyzeOptions{});
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    const auto& t = (*doc)["fp8"]["tensors"];
    ASSERT_EQ(t.size(), 2u);
    EXPECT_EQ(t[0]["tensor"], "layer3.expert12.linear_fc2.input");  // by layer, then name
    EXPECT_EQ(t[1]["tensor"], "layer3.expert5.linear_fc1.grad");
    EXPECT_EQ(t[1]["layer"], 3);
    EXPECT_EQ(t[1]["ranks"], 2);
    EXPECT_DOUBLE_EQ(t[1]["amax"].get<double>(), 0.5);
    EXPECT_DOUBLE_EQ(t[1]["scale_min"].get<double>(), 2048);
}
