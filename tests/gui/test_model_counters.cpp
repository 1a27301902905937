// The "moe" and "fp8" sections of the analysis document as the panels read them
// (gui/core/model_counters.h), from a hand-written document: every number is one the document
// states or a ratio of them, so they compare exactly.
#include <gtest/gtest.h>

#include "gui/core/model_counters.h"

using namespace ts::gui;
using nlohmann::json;

namespace {

// Two MoE layers listed out of order (the view sorts them): layer 3 is imbalanced and its last
// step has a tie for the busiest expert; layer 1 routed no tokens (max_expert null).
const char* kDoc = R"({
  "definitions": {"moe": "def of moe", "fp8": "def of fp8", "mfu": "not ours"},
  "moe": {"samples_outside_steps": 3, "layers": [
    {"layer": 3, "steps": 2, "aux_loss_mean": 0.0125, "z_loss_mean": 0.00075,
     "tokens_per_expert": [10, 30, 20, 20], "imbalance": 1.5, "max_expert": 1,
     "last_step": 2, "aux_loss_last": 0.02, "z_loss_last": 0.001,
     "tokens_per_expert_last": [40, 40, 0, 0], "imbalance_last": 2.0},
    {"layer": 1, "steps": 1, "aux_loss_mean": 0.5, "z_loss_mean": 0.25,
     "tokens_per_expert": [0, 0, 0, 0], "imbalance": 0, "max_expert": null,
     "last_step": 1, "aux_loss_last": 0.5, "z_loss_last": 0.25,
     "tokens_per_expert_last": [0, 0, 0, 0], "imbalance_last": 0}
  ]},
  "fp8": {"tensor_count": 3,
    "smallest_scale": {"tensor": "layer0.linear_qkv.input", "scale": 179.2},
    "largest_scale": {"tensor": "layer0.linear_fc2.grad", "scale": 60000},
    "tensors": [
      {"tensor": "layer0.linear_fc2.grad", "layer": 0, "amax": 1e-06, "scale_min": 50000, "scale_max": 60000, "ranks": 2},
      {"tensor": "layer0.linear_qkv.input", "layer": 0, "amax": 2.5, "scale_min": 179.2, "scale_max": 179.2, "ranks": 2},
      {"tensor": "layer10.linear_proj.weight", "layer": 10, "amax": 0.125, "scale_min": 3584, "scale_max": 3584, "ranks": 1}
    ]}
})";

}  // namespace

TEST(GuiModelCounters, MoeLayersExpertsLossesAndLoadFromTheDocument) {
    const MoeView v = moeViewOf(json::parse(kDoc));
    ASSERT_TRUE(v.present);
    EXPECT_EQ(v.samplesOutsideSteps, 3);
    EXPECT_EQ(v.experts, 4);
    EXPECT_EQ(v.lastStep, 2);
    EXPECT_EQ(v.definition, QStringLiteral("def of moe"));
    ASSERT_EQ(v.layers.size(), 2u);
    EXPECT_EQ(v.layers[0].layer, 1) << "sorted by layer";
    const MoeLayerRow& l = v.layers[1];
    EXPECT_EQ(l.layer, 3);
    EXPECT_EQ(l.steps, 2);
    EXPECT_EQ(l.lastStep, 2);
    EXPECT_EQ(l.auxLoss, 0.0125);
    EXPECT_EQ(l.zLoss, 0.00075);
    EXPECT_EQ(l.auxLossOf(true), 0.02);
    EXPECT_EQ(l.zLossOf(true), 0.001);
    EXPECT_EQ(l.tokens, (std::vector<double>{10, 30, 20, 20}));
    EXPECT_EQ(l.tokensOf(true), (std::vector<double>{40, 40, 0, 0}));
    EXPECT_EQ(l.imbalance, 1.5);
    EXPECT_EQ(l.imbalanceOf(true), 2.0);
    EXPECT_EQ(l.maxExpert, 1);
    EXPECT_EQ(l.maxExpertOf(true), 0) << "a tie goes to the lowest expert, as the profiler's max_expert";
    // Load = tokens / the layer's mean (20 tokens, then 20 in the last step).
    EXPECT_EQ(l.loadOf(1, false), 1.5);
    EXPECT_EQ(l.loadOf(0, false), 0.5);
    EXPECT_EQ(l.loadOf(0, true), 2.0);
    EXPECT_EQ(l.loadOf(3, true), 0.0);
    EXPECT_EQ(l.loadOf(4, false), 0.0) << "no such expert";
    // A layer without tokens: no busiest expert, no load.
    EXPECT_EQ(v.layers[0].maxExpert, -1);
    EXPECT_EQ(v.layers[0].maxExpertOf(true), -1);
    EXPECT_EQ(v.layers[0].loadOf(0, false), 0.0);
    EXPECT_EQ(v.mostImbalancedRow(false), 1);
    EXPECT_EQ(v.mostImbalancedRow(true), 1);
}

TEST(GuiModelCounters, Fp8TensorsSplitTheirNamesAndFindTheExtremeScales) {
    const Fp8View v = fp8ViewOf(json::parse(kDoc));
    ASSERT_TRUE(v.present);
    EXPECT_EQ(v.tensorCount, 3);
    EXPECT_EQ(v.definition, QStringLiteral("def of fp8"));
    ASSERT_EQ(v.tensors.size(), 3u);
    const Fp8TensorRow& g = v.tensors[0];
    EXPECT_EQ(g.tensor, QStringLiteral("layer0.linear_fc2.grad"));
    EXPECT_EQ(g.linear, QStringLiteral("linear_fc2"));
    EXPECT_EQ(g.slot, QStringLiteral("grad"));
    EXPECT_EQ(g.layer, 0);
    EXPECT_EQ(g.amax, 1e-06);
    EXPECT_EQ(g.scaleMin, 50000.0);
    EXPECT_EQ(g.scaleMax, 60000.0);
    EXPECT_EQ(g.ranks, 2);
    EXPECT_TRUE(g.ranksDisagree());
    EXPECT_FALSE(v.tensors[1].ranksDisagree());
    EXPECT_EQ(v.tensors[2].layer, 10);
    EXPECT_EQ(v.tensors[2].ranks, 1);
    EXPECT_EQ(v.disagreeing, 1);
    EXPECT_EQ(v.smallestTensor, QStringLiteral("layer0.linear_qkv.input"));
    EXPECT_EQ(v.smallestScale, 179.2);
    EXPECT_EQ(v.smallestRow, 1);
    EXPECT_EQ(v.largestTensor, QStringLiteral("layer0.linear_fc2.grad"));
    EXPECT_EQ(v.largestScale, 60000.0);
    EXPECT_EQ(v.largestRow, 0);
}

TEST(GuiModelCounters, DocumentsWithoutTheSectionsAreNotPresent) {
    const json dense = {{"definitions", {{"mfu", "x"}}}, {"steps", json::array()}};
    EXPECT_FALSE(moeViewOf(dense).present);
    EXPECT_FALSE(fp8ViewOf(dense).present);
    EXPECT_TRUE(moeViewOf(dense).layers.empty());
    EXPECT_EQ(moeViewOf(dense).mostImbalancedRow(false), -1);
    EXPECT_FALSE(moeViewOf(json()).present);
    // Router samples that all fell outside the steps: a section without layers.
    const MoeView outside = moeViewOf(json{{"moe", {{"layers", json::array()}, {"samples_outside_steps", 5}}}});
    EXPECT_TRUE(outside.present);
    EXPECT_TRUE(outside.layers.empty());
    EXPECT_EQ(outside.samplesOutsideSteps, 5);
    EXPECT_EQ(outside.experts, 0);
}
