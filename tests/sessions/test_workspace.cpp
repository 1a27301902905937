// Workspace (index rebuilt from run files, resolve/rename/tag/delete), compare, export.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/config/knobs.h"
#include "profiler/store.h"
#include "session_test_util.h"
#include "sessions/compare.h"
#include "sessions/export.h"
#include "sessions/workspace.h"

using namespace ts::sessions;
using nlohmann::json;
namespace fs = std::filesystem;
using ts::sessions::testutil::TempDir;

namespace {

// Writes a run file the way a run does: run info with the config, then step metrics.
void writeRun(const std::string& path, const std::string& id, const ts::engine::Config& cfg,
              const std::vector<double>& stepTimes, const std::string& status = "completed",
              const std::string& createdAt = "2025-01-01T00:00:00Z", double lossStart = 8.0) {
    auto store = ts::profiler::TraceStore::create(path);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    ts::profiler::RunInfo info;
    info.id = id;
    info.name = cfg.name;
    info.status = status;
    info.createdAt = createdAt;
    info.node = "testnode";
    info.layout = "tp1 pp1 dp1";
    info.configJson = ts::engine::configToJson(cfg).dump();
    ASSERT_TRUE((*store)->setRunInfo(info).isOk());
    int step = 1;
    for (double t : stepTimes) {
        ts::profiler::StepMetrics m;
        m.step = step;
        m.loss = lossStart - 0.5 * step;
        m.stepTimeS = t;
        m.tokensPerS = 1000.0 / t;
        m.modelTflops = 2.0 / t;
        m.peakMemoryBytes = 1000 * step;
        ASSERT_TRUE((*store)->appendStepMetrics(m).isOk());
        ++step;
    }
}

std::string runPath(Workspace& ws, const std::string& id) { return ws.runsDir() + "/" + id + ".sqlite"; }

}  // namespace

TEST(Workspace, DefaultDirFollowsEnvironmentPrecedence) {
    const char* keep[] = {"TRAINSCOPE_WORKSPACE", "XDG_DATA_HOME", "HOME"};
    std::vector<std::pair<std::string, std::string>> saved;
    for (auto k : keep) saved.emplace_back(k, std::getenv(k) ? std::getenv(k) : "");
    ::unsetenv("TRAINSCOPE_WORKSPACE");
    ::setenv("XDG_DATA_HOME", "/x/data", 1);
    ::setenv("HOME", "/home/u", 1);
    EXPECT_EQ(Workspace::defaultDir(), "/x/data/trainscope");
    ::unsetenv("XDG_DATA_HOME");
    EXPECT_EQ(Workspace::defaultDir(), "/home/u/.local/share/trainscope");
    ::setenv("TRAINSCOPE_WORKSPACE", "/w", 1);
    EXPECT_EQ(Workspace::defaultDir(), "/w");
    for (auto& [k, v] : saved) {
        if (v.empty()) ::unsetenv(k.c_str());
        else ::setenv(k.c_str(), v.c_str(), 1);
    }
}

TEST(Workspace, RunIdsAreUniqueAndSortByCreationTime) {
    TempDir d("ts_ws_test");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk()) << ws.status().toString();
    std::vector<std::string> ids;
    for (int i = 0; i < 5; ++i) {
        auto p = ws->newRunFile(i % 2 ? "my run/with:odd chars" : "");
        ASSERT_TRUE(p.isOk());
        EXPECT_EQ(fs::path(*p).parent_path().string(), ws->runsDir());
        EXPECT_EQ(fs::path(*p).extension(), ".sqlite");
        ids.push_back(fs::path(*p).stem().string());
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    auto sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, ids);
    EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
    EXPECT_NE(ids[1].find("my-run-with-odd-chars"), std::string::npos) << ids[1];
}

TEST(Workspace, SummaryIndexAndRebuildFromRunFiles) {
    TempDir d("ts_ws_test");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    ts::engine::Config cfg;
    cfg.name = "baseline";
    cfg.overlap_grad_reduce = true;
    cfg.bf16 = true;
    cfg.masked_softmax_fusion = false;
    // Step 1 is warm-up and left out: median of {0.5, 0.6, 0.4} = 0.5.
    writeRun(runPath(*ws, "r1"), "r1", cfg, {1.0, 0.5, 0.6, 0.4});
    {
        // Per-device peak 8 TFLOP/s; model TFLOP/s per step = 2/t -> median {4, 3.33, 5} = 4.
        auto st = ts::profiler::TraceStore::open(runPath(*ws, "r1"), false);
        ASSERT_TRUE(st.isOk());
        ASSERT_TRUE((*st)->setMetadata("peak_tflops", "8").isOk());
    }
    ASSERT_TRUE(ws->indexRun(runPath(*ws, "r1")).isOk());
    auto list = ws->listRuns();
    ASSERT_TRUE(list.isOk()) << list.status().toString();
    ASSERT_EQ(list->size(), 1u);
    const RunSummary& s = list->front();
    EXPECT_EQ(s.id, "r1");
    EXPECT_EQ(s.name, "baseline");
    EXPECT_EQ(s.status, "completed");
    EXPECT_EQ(s.node, "testnode");
    EXPECT_EQ(s.layout, "tp1 pp1 dp1");
    EXPECT_DOUBLE_EQ(s.stepTimeS, 0.5);
    EXPECT_DOUBLE_EQ(s.tokensPerS, 2000.0);
    EXPECT_EQ(s.peakMemoryBytes, 4000);
    EXPECT_EQ(s.steps, 4);
    EXPECT_NEAR(s.mfu, 0.5, 1e-12);
    EXPECT_DOUBLE_EQ(s.lastLoss, 8.0 - 0.5 * 4);
    EXPECT_EQ(s.keyKnobs, "overlap_grad_reduce masked_softmax_fusion=false bf16");

    // Name and tag live in the run file: deleting the index and rebuilding keeps them.
    ASSERT_TRUE(ws->rename("r1", "tuned").isOk());
    ASSERT_TRUE(ws->tag("tuned", "keep").isOk());
    ASSERT_TRUE(ws->tag("r1", "keep").isOk());  // idempotent
    ASSERT_TRUE(ws->tag("r1", "ab").isOk());
    ASSERT_TRUE(ws->untag("r1", "ab").isOk());
    fs::remove(ws->indexPath());
    auto ws2 = Workspace::open(d.path);
    ASSERT_TRUE(ws2.isOk());
    ASSERT_TRUE(ws2->rebuildIndex().isOk());
    auto again = ws2->findRun("r1");
    ASSERT_TRUE(again.isOk()) << again.status().toString();
    EXPECT_EQ(again->name, "tuned");
    EXPECT_EQ(again->tags, std::vector<std::string>{"keep"});
    EXPECT_DOUBLE_EQ(again->stepTimeS, 0.5);
}

TEST(Workspace, ResolveByIdPrefixNameLatestAndPath) {
    TempDir d("ts_ws_test");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    ts::engine::Config cfg;
    cfg.name = "same";
    writeRun(runPath(*ws, "20250101T000000000Z-aaaaaa"), "20250101T000000000Z-aaaaaa", cfg, {1}, "completed",
             "2025-01-01T00:00:00Z");
    writeRun(runPath(*ws, "20250102T000000000Z-bbbbbb"), "20250102T000000000Z-bbbbbb", cfg, {1}, "failed",
             "2025-01-02T00:00:00Z");
    // Not indexed yet: listRuns finds files nobody indexed.
    auto list = ws->listRuns();
    ASSERT_TRUE(list.isOk());
    ASSERT_EQ(list->size(), 2u);
    EXPECT_EQ(list->front().id, "20250101T000000000Z-aaaaaa");  // oldest first

    EXPECT_EQ(*ws->resolveRun("20250101T000000000Z-aaaaaa"), runPath(*ws, "20250101T000000000Z-aaaaaa"));
    EXPECT_EQ(*ws->resolveRun("20250102"), runPath(*ws, "20250102T000000000Z-bbbbbb"));
    EXPECT_EQ(*ws->resolveRun("same"), runPath(*ws, "20250102T000000000Z-bbbbbb"));  // newest of that name
    EXPECT_EQ(*ws->resolveRun("latest"), runPath(*ws, "20250102T000000000Z-bbbbbb"));
    EXPECT_EQ(*ws->resolveRun(runPath(*ws, "20250101T000000000Z-aaaaaa")), runPath(*ws, "20250101T000000000Z-aaaaaa"));
    auto amb = ws->resolveRun("2025");
    ASSERT_FALSE(amb.isOk());
    EXPECT_NE(amb.status().message().find("matches 2 runs"), std::string::npos);
    auto none = ws->resolveRun("nothing-like-this");
    ASSERT_FALSE(none.isOk());
    EXPECT_EQ(none.status().code(), ts::ErrorCode::NotFound);

    // Delete: file and row go.
    ASSERT_TRUE(ws->remove("20250101").isOk());
    EXPECT_FALSE(fs::exists(runPath(*ws, "20250101T000000000Z-aaaaaa")));
    list = ws->listRuns();
    ASSERT_TRUE(list.isOk());
    ASSERT_EQ(list->size(), 1u);
    // A file removed behind the index's back disappears from the list too.
    fs::remove(runPath(*ws, "20250102T000000000Z-bbbbbb"));
    list = ws->listRuns();
    ASSERT_TRUE(list.isOk());
    EXPECT_TRUE(list->empty());
}

TEST(Workspace, GarbageFileInRunsFolderDoesNotBreakListing) {
    TempDir d("ts_ws_test");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    std::ofstream(ws->runsDir() + "/junk.sqlite") << "this is not a database";
    writeRun(runPath(*ws, "good"), "good", ts::engine::Config{}, {1, 1});
    auto list = ws->listRuns();
    ASSERT_TRUE(list.isOk()) << list.status().toString();
    // The junk is listed as broken (so that it can be seen and deleted), never indexed.
    ASSERT_EQ(list->size(), 2u);
    EXPECT_EQ(list->front().id, "junk");
    EXPECT_EQ(list->front().status, kBrokenStatus);
    EXPECT_EQ(list->back().id, "good");
    EXPECT_EQ(ws->resolveRun("latest").value(), runPath(*ws, "good"));
    EXPECT_TRUE(ws->rebuildIndex().isOk());
}

TEST(Compare, KnobDiffsAndMetricDeltasWithTheSignThatMatters) {
    TempDir d("ts_ws_test");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    ts::engine::Config a, b;
    b.overlap_grad_reduce = true;
    writeRun(runPath(*ws, "a"), "a", a, {1.0, 0.5, 0.5, 0.5});
    writeRun(runPath(*ws, "b"), "b", b, {1.0, 0.4, 0.4, 0.4}, "completed", "2025-01-01T00:00:00Z", 8.1);
    CompareOptions o;
    o.traceAnalyzer = [](const std::string& path) -> ts::Result<json> {
        bool isA = fs::path(path).stem() == "a";
        return json{{"bubble_fraction", {{"0", isA ? 0.30 : 0.20}, {"1", 0.1}}},
                    {"exposed_comm_s", {{"dp", isA ? 0.010 : 0.002}}},
                    {"peak_memory_bytes_by_rank", {{"0", 100}, {"1", 100}}}};
    };
    auto c = compareRuns(runPath(*ws, "a"), runPath(*ws, "b"), o);
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    ASSERT_EQ(c->knobs.size(), 1u);
    EXPECT_EQ(c->knobs[0].knob, "overlap_grad_reduce");
    EXPECT_EQ(c->knobs[0].a, "false");
    EXPECT_EQ(c->knobs[0].b, "true");
    auto find = [&](const std::string& name, const std::string& scope) -> const MetricDelta* {
        for (const auto& m : c->metrics)
            if (m.name == name && m.scope == scope) return &m;
        return nullptr;
    };
    const MetricDelta* st = find("step_time_s", "");
    ASSERT_NE(st, nullptr);
    EXPECT_NEAR(st->delta, -0.1, 1e-12);
    EXPECT_NEAR(st->relative, -0.2, 1e-12);
    EXPECT_EQ(st->better, "B");  // lower step time is better
    const MetricDelta* tp = find("tokens_per_s", "");
    ASSERT_NE(tp, nullptr);
    EXPECT_NEAR(tp->a, 2000, 1e-9);
    EXPECT_NEAR(tp->b, 2500, 1e-9);
    EXPECT_EQ(tp->better, "B");  // higher throughput is better
    const MetricDelta* loss = find("loss", "step 4");
    ASSERT_NE(loss, nullptr);
    EXPECT_EQ(loss->better, "A");  // B's loss is 0.1 higher
    const MetricDelta* bubble = find("bubble_fraction", "stage 0");
    ASSERT_NE(bubble, nullptr);
    EXPECT_EQ(bubble->better, "B");
    EXPECT_EQ(find("bubble_fraction", "stage 1"), nullptr);  // equal: left out
    EXPECT_EQ(find("peak_memory_bytes", "rank 0"), nullptr);
    ASSERT_NE(find("exposed_comm_s", "group dp"), nullptr);
    EXPECT_EQ(find("peak_memory_bytes", ""), nullptr);  // same peaks

    // --all shows every knob and the equal metrics.
    o.all = true;
    auto all = compareRuns(runPath(*ws, "a"), runPath(*ws, "b"), o);
    ASSERT_TRUE(all.isOk());
    EXPECT_EQ(all->knobs.size(), ts::engine::knobRegistry().size());
    bool sawEqual = false;
    for (const auto& m : all->metrics) sawEqual |= m.better == "=";
    EXPECT_TRUE(sawEqual);
    json j = c->toJson();
    EXPECT_EQ(j["knobs"].size(), 1u);
    EXPECT_FALSE(c->toText().empty());
}

// Two runs whose peaks were measured at different machine loads: MFU is compared over A's
// peak, so its ratio equals the ratio of achieved FLOP/s (B is 25% faster: 5 vs 4 TFLOP/s).
TEST(Compare, MfuOfRunsWithDifferentMeasuredPeaksUsesOnePeak) {
    TempDir d("ts_ws_test");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    ts::engine::Config cfg;
    writeRun(runPath(*ws, "a"), "a", cfg, {1.0, 0.5, 0.5, 0.5});  // 4 TFLOP/s
    writeRun(runPath(*ws, "b"), "b", cfg, {1.0, 0.4, 0.4, 0.4});  // 5 TFLOP/s
    for (auto [id, peak] : {std::pair{"a", "8"}, std::pair{"b", "20"}}) {
        auto st = ts::profiler::TraceStore::open(runPath(*ws, id), false);
        ASSERT_TRUE(st.isOk());
        ASSERT_TRUE((*st)->setMetadata("peak_tflops", peak).isOk());
    }
    auto c = compareRuns(runPath(*ws, "a"), runPath(*ws, "b"));
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    EXPECT_NEAR(c->b.mfu, 0.25, 1e-12);  // B over its own peak reads worse than A's 0.5
    const MetricDelta* mfu = nullptr;
    for (const auto& m : c->metrics)
        if (m.name == "mfu") mfu = &m;
    ASSERT_NE(mfu, nullptr);
    EXPECT_NEAR(mfu->a, 0.5, 1e-12);
    EXPECT_NEAR(mfu->b, 5.0 / 8.0, 1e-12);
    EXPECT_EQ(mfu->better, "B");
    EXPECT_EQ(mfu->scope, "vs A's peak");
    bool noted = false;
    for (const auto& n : c->notes) noted |= n.find("A's peak 8 TFLOP/s") != std::string::npos;
    EXPECT_TRUE(noted);

    // Equal peaks: each run's own MFU, no note.
    {
        auto st = ts::profiler::TraceStore::open(runPath(*ws, "b"), false);
        ASSERT_TRUE(st.isOk());
        ASSERT_TRUE((*st)->setMetadata("peak_tflops", "8").isOk());
    }
    auto same = compareRuns(runPath(*ws, "a"), runPath(*ws, "b"));
    ASSERT_TRUE(same.isOk());
    for (const auto& m : same->metrics)
        if (m.name == "mfu") {
            EXPECT_EQ(m.scope, "");
            EXPECT_NEAR(m.b, 5.0 / 8.0, 1e-12);
        }
}

TEST(Compare, DeltaDirection) {
    EXPECT_EQ(makeDelta("x", "", "", 10, 9, true, 0.01).better, "B");
    EXPECT_EQ(makeDelta("x", "", "", 10, 9, false, 0.01).better, "A");
    EXPECT_EQ(makeDelta("x", "", "", 10, 10.05, true, 0.01).better, "=");
    EXPECT_EQ(makeDelta("x", "", "", 0, 1, true, 0.01).better, "A");
}

// ---- export ---------------------------------------------------------------------------------

namespace {

ts::engine::Config tunedConfig() {
    ts::engine::Config c;
    c.num_layers = 8;
    c.hidden_size = 512;
    c.num_attention_heads = 8;
    c.num_query_groups = 2;
    c.seq_length = 256;
    c.swiglu = true;
    c.tensor_model_parallel_size = 2;
    c.overlap_grad_reduce = true;
    c.use_distributed_optimizer = true;
    c.masked_softmax_fusion = false;
    c.bias_activation_fusion = false;
    c.bf16 = true;
    c.recompute_granularity = "selective";
    c.recompute_modules = {"core_attn", "mlp"};
    c.lr = 1.5e-4;
    c.data_path = "synthetic";
    c.name = "tuned run: #1";
    c.untie_embeddings_and_output_weights = false;
    return c;
}

bool hasPair(const std::vector<std::string>& args, const std::string& flag, const std::string& value) {
    for (size_t i = 0; i + 1 < args.size(); ++i)
        if (args[i] == flag && args[i + 1] == value) return true;
    return false;
}
bool hasFlag(const std::vector<std::string>& args, const std::string& flag) {
    return std::find(args.begin(), args.end(), flag) != args.end();
}

}  // namespace

TEST(Export, YamlRoundTripGivesTheIdenticalConfig) {
    std::vector<ts::engine::Config> configs = {ts::engine::Config{}, tunedConfig()};
    ts::engine::Config odd;
    odd.norm_epsilon = 1e-6;
    odd.rotary_base = 500000;
    odd.adam_eps = 1e-8;
    odd.bf16 = true;
    odd.fp8 = "hybrid";
    odd.fp8_recipe = "tensorwise";
    odd.recompute_modules = {};
    odd.name = "quotes ' and \" and: colons";
    odd.bucket_size = 40000000;
    configs.push_back(odd);
    for (const auto& c : configs) {
        ExportResult r = exportConfig(c, ExportFormat::Yaml);
        auto loaded = ts::engine::parseConfigYaml(r.text, "exported.yaml");
        for (const auto& i : loaded.issues) ADD_FAILURE() << i.toString() << "\n" << r.text;
        EXPECT_EQ(ts::engine::configToJson(loaded.config), ts::engine::configToJson(c)) << r.text;
    }
}

TEST(Export, MegatronArgumentsMatchMegatronSpellings) {
    // Expected flags derived from Megatron-LM megatron/training/arguments.py: store_true flags
    // for features Megatron defaults off, --no-* (store_false) for those it defaults on,
    // --no-bias-swiglu-fusion (dest bias_swiglu_fusion) when the MLP is SwiGLU.
    auto c = tunedConfig();
    std::vector<std::string> notes;
    auto args = megatronArgs(c, &notes);
    EXPECT_TRUE(hasPair(args, "--num-layers", "8"));
    EXPECT_TRUE(hasPair(args, "--hidden-size", "512"));
    EXPECT_TRUE(hasPair(args, "--num-attention-heads", "8"));
    EXPECT_TRUE(hasPair(args, "--num-query-groups", "2"));
    EXPECT_TRUE(hasFlag(args, "--group-query-attention"));
    EXPECT_TRUE(hasPair(args, "--seq-length", "256"));
    EXPECT_TRUE(hasPair(args, "--max-position-embeddings", "256"));
    EXPECT_TRUE(hasPair(args, "--tensor-model-parallel-size", "2"));
    EXPECT_TRUE(hasPair(args, "--global-batch-size", "8"));  // 8 micro x dp 1 x 1 microbatch
    EXPECT_TRUE(hasPair(args, "--recompute-granularity", "selective"));
    EXPECT_TRUE(hasPair(args, "--lr", "0.00015"));
    EXPECT_TRUE(hasFlag(args, "--swiglu"));
    EXPECT_TRUE(hasFlag(args, "--overlap-grad-reduce"));
    EXPECT_TRUE(hasFlag(args, "--use-distributed-optimizer"));
    EXPECT_TRUE(hasFlag(args, "--no-masked-softmax-fusion"));
    EXPECT_TRUE(hasFlag(args, "--no-bias-swiglu-fusion"));
    EXPECT_FALSE(hasFlag(args, "--no-bias-gelu-fusion"));
    EXPECT_TRUE(hasFlag(args, "--bf16"));
    EXPECT_TRUE(hasFlag(args, "--mock-data"));
    // overlap_p2p_comm defaults to true in both; no flag.
    EXPECT_FALSE(hasFlag(args, "--no-overlap-p2p-communication"));
    // Defaults that match Megatron's leave no flag; derived/unset values are left out.
    EXPECT_FALSE(hasFlag(args, "--no-bias-dropout-fusion"));
    EXPECT_FALSE(hasFlag(args, "--untie-embeddings-and-output-weights"));
    EXPECT_FALSE(hasFlag(args, "--ffn-hidden-size"));
    EXPECT_FALSE(hasFlag(args, "--num-virtual-stages-per-pipeline-rank"));
    EXPECT_FALSE(hasFlag(args, "--fp8-recipe"));
    EXPECT_FALSE(hasFlag(args, "--moe-router-topk"));
    EXPECT_FALSE(hasFlag(args, "--ddp-bucket-size"));
    // The list knob is one flag followed by its values.
    auto it = std::find(args.begin(), args.end(), "--recompute-modules");
    ASSERT_NE(it, args.end());
    ASSERT_LT(size_t(it - args.begin()) + 2, args.size());
    EXPECT_EQ(*(it + 1), "core_attn");
    EXPECT_EQ(*(it + 2), "mlp");
    // Every token is a flag or follows one; no flag appears twice.
    std::vector<std::string> flags;
    for (const auto& a : args)
        if (a.rfind("--", 0) == 0) flags.push_back(a);
    auto sorted = flags;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
    EXPECT_EQ(args.front().rfind("--", 0), 0u);
    // The run name has no Megatron flag: a note says so.
    bool nameNote = false;
    for (const auto& n : notes) nameNote |= n.rfind("name=", 0) == 0;
    EXPECT_TRUE(nameNote);

    // Exact text for a small config (single line, shell-quoted where needed).
    ts::engine::Config small;
    small.data_path = "/data/my corpus_text_document";
    auto text = exportConfig(small, ExportFormat::MegatronArgs).text;
    EXPECT_NE(text.find("--data-path '/data/my corpus_text_document'"), std::string::npos) << text;
    EXPECT_NE(text.find("--num-layers 4 --hidden-size 256 "), std::string::npos) << text;
}

TEST(Export, MegatronArgumentsUpstreamRejectedBefore) {
    // Issue #14: --rotary-base is type=int upstream and only means something with RoPE;
    // moe_expert_capacity_factor / moe_z_loss_coeff 0 stand for upstream's None.
    ts::engine::Config c;
    auto args = megatronArgs(c);
    EXPECT_FALSE(hasFlag(args, "--rotary-base"));  // learned_absolute: no RoPE
    c.position_embedding_type = "rope";
    c.rotary_base = 500000;
    args = megatronArgs(c);
    EXPECT_TRUE(hasPair(args, "--rotary-base", "500000"));
    EXPECT_TRUE(hasPair(args, "--position-embedding-type", "rope"));

    ts::engine::Config moe;
    moe.num_moe_experts = 8;
    args = megatronArgs(moe);
    EXPECT_TRUE(hasPair(args, "--num-experts", "8"));
    EXPECT_FALSE(hasFlag(args, "--moe-expert-capacity-factor"));  // 0: dropless
    EXPECT_FALSE(hasFlag(args, "--moe-z-loss-coeff"));            // 0: no z-loss term
    moe.moe_expert_capacity_factor = 1.25;
    moe.moe_z_loss_coeff = 1e-3;
    args = megatronArgs(moe);
    EXPECT_TRUE(hasPair(args, "--moe-expert-capacity-factor", "1.25"));
    EXPECT_TRUE(hasPair(args, "--moe-z-loss-coeff", "0.001"));

    // swiglu without ffn_hidden_size: no flag, Megatron derives what the engine built.
    ts::engine::Config sw;
    sw.swiglu = true;
    args = megatronArgs(sw);
    EXPECT_FALSE(hasFlag(args, "--ffn-hidden-size"));
    EXPECT_EQ(ts::engine::deriveSizes(sw).ffn_hidden_size, int((4 * sw.hidden_size * 2 / 3.0) / 64) * 64);

    // The deprecated --enable-cuda-graph is never written; cuda_graph_impl is.
    ts::engine::Config cg;
    cg.cuda_graph_impl = "local";
    cg.device_backend = "cuda";
    args = megatronArgs(cg);
    EXPECT_TRUE(hasPair(args, "--cuda-graph-impl", "local"));
    EXPECT_FALSE(hasFlag(args, "--enable-cuda-graph"));
}

TEST(Export, BridgeOverrides) {
    auto c = tunedConfig();
    auto ov = bridgeOverrides(c);
    auto has = [&](const std::string& s) { return std::find(ov.begin(), ov.end(), s) != ov.end(); };
    EXPECT_TRUE(has("model.tensor_model_parallel_size=2"));
    EXPECT_TRUE(has("comm_overlap.overlap_grad_reduce=true"));  // Bridge applies comm_overlap last
    EXPECT_TRUE(has("model.masked_softmax_fusion=false"));
    EXPECT_TRUE(has("model.gated_linear_unit=true"));
    // untie=false <=> share_embeddings_and_output_weights=true (negated field).
    EXPECT_TRUE(has("model.share_embeddings_and_output_weights=true"));
    EXPECT_TRUE(has("model.recompute_modules=[core_attn,mlp]"));
    EXPECT_TRUE(has("optimizer.lr=0.00015"));
    EXPECT_TRUE(has("train.global_batch_size=8"));
    EXPECT_TRUE(has("model.recompute_granularity=selective"));
    for (const auto& o : ov) EXPECT_NE(o.find('='), std::string::npos);
}

TEST(Export, ConfigOfRunFile) {
    TempDir d("ts_ws_test");
    auto c = tunedConfig();
    writeRun(d.path + "/r.sqlite", "r", c, {1});
    auto back = configOfRunFile(d.path + "/r.sqlite");
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    EXPECT_EQ(ts::engine::configToJson(*back), ts::engine::configToJson(c));
    EXPECT_FALSE(parseExportFormat("toml").isOk());
    EXPECT_EQ(*parseExportFormat("megatron-args"), ExportFormat::MegatronArgs);
}

// Trace metrics for compare from a hand-built two-stage trace; expected values worked out by
// hand from the slice intervals below (not from the implementation).
TEST(Compare, TraceMetricsFromProfilerAnalyses) {
    TempDir d("ts_ws_test");
    const std::string path = d.path + "/trace.sqlite";
    {
        auto store = ts::profiler::TraceStore::create(path);
        ASSERT_TRUE(store.isOk()) << store.status().toString();
        ts::profiler::TraceWriter w(**store);
        w.metadata("pp", "2");
        using ts::trace::Category;
        using ts::trace::TrackKind;
        const uint32_t dp = w.intern("dp");
        for (int rank = 0; rank < 2; ++rank) {
            uint32_t host = w.track({rank, rank, TrackKind::HostThread, 0, "host"});
            uint32_t comp = w.track({rank, rank, TrackKind::Compute, 0, "compute"});
            uint32_t comm = w.track({rank, rank, TrackKind::Comm, 0, "comm"});
            auto slice = [&](uint32_t track, const char* name, Category cat, int64_t s, int64_t e, int step,
                             uint32_t group = 0) {
                ts::trace::Slice sl;
                sl.track = track;
                sl.name = w.intern(name);
                sl.category = cat;
                sl.startNs = s;
                sl.durNs = e - s;
                sl.step = step;
                sl.group = group;
                w.slice(sl);
            };
            // Step 1 (warm-up, ignored): fully busy.
            slice(host, "step 1", Category::Range, 0, 100, 1);
            slice(comp, "gemm", Category::Gemm, 0, 100, 1);
            // Step 2: rank 0 computes [200,230) and [250,280), dp all-reduce [280,300) exposed 20 ns
            // -> bubble 40/100; rank 1 computes [210,300), all-reduce [200,210) exposed 10 ns
            // -> bubble 10/100.
            slice(host, "step 2", Category::Range, 200, 300, 2);
            if (rank == 0) {
                slice(comp, "gemm", Category::Gemm, 200, 230, 2);
                slice(comp, "gemm", Category::Gemm, 250, 280, 2);
                slice(comm, "all_reduce", Category::Collective, 280, 300, 2, dp);
            } else {
                slice(comp, "gemm", Category::Gemm, 210, 300, 2);
                slice(comm, "all_reduce", Category::Collective, 200, 210, 2, dp);
            }
            ts::trace::Counter c;
            c.rank = rank;
            c.name = w.intern("memory.params");
            c.tsNs = 0;
            c.value = 1000.0 * (rank + 1);
            w.counter(c);
        }
        ASSERT_TRUE(w.finish().isOk());
    }
    auto m = analyzeTraceMetrics(path);
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    EXPECT_NEAR((*m)["bubble_fraction"]["0"].get<double>(), 0.4, 1e-9) << m->dump();
    EXPECT_NEAR((*m)["bubble_fraction"]["1"].get<double>(), 0.1, 1e-9) << m->dump();
    EXPECT_NEAR((*m)["exposed_comm_s"]["dp"].get<double>(), 15e-9, 1e-15) << m->dump();  // (20+10)/2 windows
    EXPECT_NEAR((*m)["peak_memory_bytes_by_rank"]["0"].get<double>(), 1000, 1e-9);
    EXPECT_NEAR((*m)["peak_memory_bytes_by_rank"]["1"].get<double>(), 2000, 1e-9);
}
