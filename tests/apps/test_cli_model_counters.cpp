// `trainscope run` of a micro MoE model and of a micro FP8 model on 2 data-parallel ranks (the
// engine does not run FP8 experts yet), then `trainscope analyze`: the router and FP8 counters
// the engine recorded show up as the "moe" and "fp8" sections (numbers checked against what the
// config implies, not against a copy of earlier output), and a dense fp32 run has neither.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "tests/apps/cli_test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ts::cli_test::Output;
using ts::cli_test::run;

fs::path scratch(const std::string& name) {
    fs::path p = fs::path(TS_BINARY_DIR) / "test_scratch" / ("cli_counters_" + name);
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
}

const char* kMicro =
    "position_embedding_type: rope\nnum_layers: 1\nhidden_size: 32\nnum_attention_heads: 2\nseq_length: 16\n"
    "vocab_size: 256\nmicro_batch_size: 2\ndata_path: synthetic\ntrain_iters: 3\n";

// `run CONFIG --steps 2 --world-size 2` of kMicro + extra, then `analyze` (JSON and text).
struct Analyzed {
    json doc;
    std::string text;
};
Analyzed runAndAnalyze(const std::string& name, const std::string& extra) {
    const fs::path d = scratch(name);
    std::ofstream(d / "config.yaml") << "name: " << name << "\n" << kMicro << extra;
    const std::string runFile = (d / "run.sqlite").string();
    Output r = run("run '" + (d / "config.yaml").string() + "' --steps 2 --world-size 2 --run-file '" + runFile + "'");
    EXPECT_EQ(r.code, 0) << r.text;
    Output a = run("analyze '" + runFile + "' --json");
    EXPECT_EQ(a.code, 0) << a.text;
    Output t = run("analyze '" + runFile + "'");
    EXPECT_EQ(t.code, 0) << t.text;
    return {json::parse(a.text, nullptr, false), t.text};
}

}  // namespace

// 1 layer, 4 experts, top-2; micro-batch 2 x seq 16 = 32 tokens per rank and step (one
// microbatch per rank: the global batch is micro-batch x dp).
TEST(CliModelCounters, AnalyzeShowsTheMoeRouterOfARealRun) {
    const Analyzed a = runAndAnalyze("micro-moe", "add_bias_linear: false\nnum_moe_experts: 4\nmoe_router_topk: 2\n"
                                                  "moe_aux_loss_coeff: 0.01\nmoe_z_loss_coeff: 0.001\n");
    const json& doc = a.doc;
    ASSERT_TRUE(doc.is_object());
    ASSERT_TRUE(doc.contains("moe")) << doc.dump().substr(0, 500);
    EXPECT_FALSE(doc.contains("fp8"));
    EXPECT_EQ(doc["moe"]["samples_outside_steps"], 0);  // every forward lies inside its step
    ASSERT_EQ(doc["moe"]["layers"].size(), 1u);
    const json& l = doc["moe"]["layers"][0];
    EXPECT_EQ(l["layer"], 0);
    EXPECT_EQ(l["steps"], 2);
    ASSERT_EQ(l["tokens_per_expert"].size(), 4u);
    // Every token goes to top-k = 2 experts: 2 ranks x 32 tokens x 2 = 128 assignments per step.
    const auto tokens = l["tokens_per_expert"].get<std::vector<double>>();
    EXPECT_DOUBLE_EQ(std::accumulate(tokens.begin(), tokens.end(), 0.0), 128.0);
    const auto last = l["tokens_per_expert_last"].get<std::vector<double>>();
    EXPECT_DOUBLE_EQ(std::accumulate(last.begin(), last.end(), 0.0), 128.0);
    EXPECT_GE(l["imbalance"].get<double>(), 1.0);
    EXPECT_LE(l["imbalance"].get<double>(), 2.0);  // top-2 of 4: an expert gets each token at most once
    EXPECT_GT(l["aux_loss_mean"].get<double>(), 0.0);
    EXPECT_GT(l["z_loss_mean"].get<double>(), 0.0);
    EXPECT_NE(a.text.find("MoE router"), std::string::npos) << a.text;
    EXPECT_NE(a.text.find("  layer 0: aux "), std::string::npos) << a.text;
}

TEST(CliModelCounters, AnalyzeShowsTheFp8ScalesOfARealRun) {
    const Analyzed a = runAndAnalyze("micro-fp8", "bf16: true\nfp8: hybrid\nfp8_recipe: delayed\n");
    const json& doc = a.doc;
    ASSERT_TRUE(doc.is_object());
    ASSERT_TRUE(doc.contains("fp8")) << doc.dump().substr(0, 500);
    EXPECT_FALSE(doc.contains("moe"));
    // 4 FP8 linears (qkv, proj, fc1, fc2) x 3 tensors (input, weight, grad) in the one layer.
    EXPECT_EQ(doc["fp8"]["tensor_count"], 12);
    for (const auto& t : doc["fp8"]["tensors"]) {
        EXPECT_EQ(t["ranks"], 2) << t.dump();
        EXPECT_GT(t["scale_min"].get<double>(), 0.0) << t.dump();
        EXPECT_LE(t["scale_min"].get<double>(), t["scale_max"].get<double>()) << t.dump();
    }
    EXPECT_NE(a.text.find("FP8 (last amax and scale): 12 tensors"), std::string::npos) << a.text;
}

TEST(CliModelCounters, DenseRunHasNoMoeOrFp8Section) {
    const Analyzed a = runAndAnalyze("micro-dense", "");
    ASSERT_TRUE(a.doc.is_object());
    EXPECT_FALSE(a.doc.contains("moe"));
    EXPECT_FALSE(a.doc.contains("fp8"));
    EXPECT_EQ(a.text.find("MoE router"), std::string::npos) << a.text;
    EXPECT_EQ(a.text.find("FP8 ("), std::string::npos) << a.text;
}
