// analyzeRun's document on a hand-built two-stage pipeline step (every number below is worked
// out by hand in the comments), its text rendering, and the Chrome trace export.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "profiler/analysis.h"
#include "tests/profiler/trace_builder.h"

using namespace ts;
using namespace ts::profiler;
using ts::profiler::testing::TraceBuilder;
using trace::Category;
using trace::TrackKind;

namespace {

// Rank 0 (stage 0) and rank 1 (stage 1), one step [0, 1000) ns on both.
//  rank 0: compute [0,400) gemm 1e6 flops, [600,800) gemm; dp all_reduce [700,900) (half under compute)
//  rank 1: compute [200,600) attention, [800,1000) gemm; pp recv [100,200) (exposed)
//  memory: rank 0 params 100 then activations 50 -> peak 150
void buildPipeline(TraceBuilder& b) {
    uint32_t h0 = b.track(0, TrackKind::HostThread), c0 = b.track(0, TrackKind::Compute), m0 = b.track(0, TrackKind::Comm);
    uint32_t h1 = b.track(1, TrackKind::HostThread), c1 = b.track(1, TrackKind::Compute), p1 = b.track(1, TrackKind::P2P);
    b.putStep(h0, 1, 0, 1000);
    b.putStep(h1, 1, 0, 1000);
    b.add(c0, Category::Gemm, 0, 400, "gemm").flops = 1e6;
    b.put(c0, Category::Gemm, 600, 800, "gemm");
    b.put(m0, Category::Collective, 700, 900, "all_reduce", "dp");
    b.put(c1, Category::Attention, 200, 600, "flash_attn");
    b.put(c1, Category::Gemm, 800, 1000, "gemm");
    b.put(p1, Category::P2P, 100, 200, "recv_forward", "pp");
    b.writer->counter({0, b.writer->intern("memory.params"), 0, 100});
    b.writer->counter({0, b.writer->intern("memory.activations"), 10, 50});
    b.writer->metadata("pp", "2");
    b.writer->metadata("num_microbatches", "4");
    b.writer->metadata("model_flops_per_step", "2000000");  // 2e6 FLOPs per 1 us step = 2 TFLOP/s
    b.writer->metadata("peak_tflops", "4");
    b.writer->metadata("flops_formula", "6*N*T (test)");
}

const nlohmann::json& rankOf(const nlohmann::json& step, int r) {
    for (const auto& x : step["ranks"])
        if (x["rank"] == r) return x;
    throw std::runtime_error("rank missing");
}

}  // namespace

TEST(Report, PipelineStepNumbersAndKeys) {
    TraceBuilder b;
    buildPipeline(b);
    AnalyzeOptions opt;
    opt.peakFlopsTable = "";
    opt.deviceName = "cpu-test-device";  // not in the table -> metadata peak_tflops is used
    auto doc = analyzeRun(b.done(), opt);
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    const auto& d = *doc;
    ASSERT_EQ(d["steps"].size(), 1u);
    const auto& s = d["steps"][0];
    EXPECT_EQ(s["step"], 1);
    EXPECT_DOUBLE_EQ(s["step_time_s"].get<double>(), 1e-6);
    const auto& r0 = rankOf(s, 0);
    const auto& r1 = rankOf(s, 1);
    // rank 0 compute covers 600 of 1000 -> bubble 400 ns, 0.4 of the step, 400/600 of the busy
    // time; theory (2-1)/(1*4 + 1) = 0.2 of the step, (2-1)/(1*4) = 0.25 as a ratio
    EXPECT_DOUBLE_EQ(r0["bubble_s"].get<double>(), 4e-7);
    EXPECT_DOUBLE_EQ(r0["bubble_fraction"].get<double>(), 0.4);
    EXPECT_DOUBLE_EQ(r0["bubble_fraction_theory"].get<double>(), 0.2);
    EXPECT_DOUBLE_EQ(r0["bubble_ratio_theory"].get<double>(), 0.25);
    EXPECT_NEAR(r0["bubble_ratio"].get<double>(), 400.0 / 600.0, 1e-6);
    EXPECT_EQ(r0["pp_stage"], 0);
    EXPECT_EQ(r1["pp_stage"], 1);
    // rank 0: dp all_reduce 200 ns, [700,800) under compute
    EXPECT_DOUBLE_EQ(r0["comm_s"].get<double>(), 2e-7);
    EXPECT_DOUBLE_EQ(r0["overlapped_comm_s"].get<double>(), 1e-7);
    EXPECT_DOUBLE_EQ(r0["exposed_comm_s"].get<double>(), 1e-7);
    EXPECT_DOUBLE_EQ(r0["comm_comp_overlap_pct"].get<double>(), 50.0);
    ASSERT_EQ(r0["comm"].size(), 1u);
    EXPECT_EQ(r0["comm"][0]["group"], "dp");
    // rank 1: recv fully exposed; compute 600 -> bubble 0.4
    EXPECT_DOUBLE_EQ(r1["exposed_comm_s"].get<double>(), 1e-7);
    EXPECT_DOUBLE_EQ(r1["comm_comp_overlap_pct"].get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(r1["bubble_fraction"].get<double>(), 0.4);
    ASSERT_EQ(s["stages"].size(), 2u);
    // 2e6 FLOPs in 1e-6 s = 2 TFLOP/s for the job, 1 per device; peak 4 -> MFU 0.25
    EXPECT_DOUBLE_EQ(s["model_tflops"].get<double>(), 2.0);
    EXPECT_DOUBLE_EQ(s["model_tflops_per_device"].get<double>(), 1.0);
    EXPECT_DOUBLE_EQ(s["mfu"].get<double>(), 0.25);
    EXPECT_EQ(d["mfu_inputs"]["flops_formula"], "6*N*T (test)");
    // Critical path covers the whole step: something runs on the chain from 0 to 1000.
    EXPECT_GT(s["critical_path"]["length_s"].get<double>(), 0.0);
    EXPECT_LE(s["critical_path"]["length_s"].get<double>(), 1e-6 + 1e-12);
    // Per rank, whole trace: memory peak is the sum of categories.
    EXPECT_DOUBLE_EQ(d["ranks"][0]["memory"]["peak_memory_bytes"].get<double>(), 150);
    EXPECT_DOUBLE_EQ(d["ranks"][0]["memory"]["peak_bytes_by_category"]["params"].get<double>(), 100);
    // HTA temporal breakdown of rank 0: window [0,900); busy [0,400)+[600,900) = 700; compute 600.
    const auto& tb = d["ranks"][0]["temporal_breakdown"];
    EXPECT_NEAR(tb["compute_pct"].get<double>(), 100.0 * 600 / 900, 1e-5);
    EXPECT_NEAR(tb["non_compute_pct"].get<double>(), 100.0 * 100 / 900, 1e-5);
    EXPECT_NEAR(tb["idle_pct"].get<double>(), 100.0 * 200 / 900, 1e-5);
    for (const char* key : {"step_time_s", "bubble_fraction", "comm_comp_overlap_pct", "exposed_comm_s", "mfu",
                            "peak_memory_bytes", "model_tflops"})
        EXPECT_TRUE(d["definitions"].contains(key) || d["definitions"].dump().find(key) != std::string::npos) << key;

    std::string text = formatAnalysisText(d);
    EXPECT_NE(text.find("step 1: step time 0.001 ms"), std::string::npos) << text;
    EXPECT_NE(text.find("definitions:"), std::string::npos);
    EXPECT_NE(text.find("6*N*T (test)"), std::string::npos);

    opt.step = 7;
    EXPECT_EQ(analyzeRun(*b.store, opt).status().code(), ErrorCode::NotFound);
}

// A rank with no communication has no overlap share: null with the reason, never a 0 that
// reads like a measurement (rank 1 has communication, so its 0 stays a number).
TEST(Report, OverlapShareOfARankWithoutCommunicationIsUnknown) {
    TraceBuilder b;
    uint32_t h0 = b.track(0, TrackKind::HostThread), c0 = b.track(0, TrackKind::Compute);
    uint32_t h1 = b.track(1, TrackKind::HostThread), c1 = b.track(1, TrackKind::Compute), m1 = b.track(1, TrackKind::Comm);
    b.putStep(h0, 1, 0, 1000);
    b.putStep(h1, 1, 0, 1000);
    b.put(c0, Category::Gemm, 0, 400, "gemm");
    b.put(c1, Category::Gemm, 0, 400, "gemm");
    b.put(m1, Category::Collective, 500, 600, "all_reduce", "dp");
    auto doc = analyzeRun(b.done(), AnalyzeOptions{});
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    const auto& ranks = (*doc)["ranks"];
    ASSERT_EQ(ranks.size(), 2u);
    EXPECT_TRUE(ranks[0]["comm_comp_overlap_pct"].is_null());
    EXPECT_EQ(ranks[0]["comm_comp_overlap_unknown_reason"], "no communication kernels on this rank");
    EXPECT_DOUBLE_EQ(ranks[1]["comm_comp_overlap_pct"].get<double>(), 0.0);
    EXPECT_TRUE(rankOf((*doc)["steps"][0], 0)["comm_comp_overlap_pct"].is_null());
    const std::string text = formatAnalysisText(*doc);
    EXPECT_FALSE(std::regex_search(text, std::regex("\\bnan\\b"))) << text;
}

// The run's metadata says what its numbers are not: ranks sharing GPUs, host-synchronized
// collectives, an unverified CUDA layout; the text report prints each before the steps. An
// ordinary run has none.
TEST(Report, CaveatsFromTheRunsMetadataComeFirst) {
    {
        TraceBuilder b;
        buildPipeline(b);
        auto doc = analyzeRun(b.done(), AnalyzeOptions{});
        ASSERT_TRUE(doc.isOk()) << doc.status().toString();
        EXPECT_TRUE((*doc)["caveats"].is_array());
        EXPECT_TRUE((*doc)["caveats"].empty());
        EXPECT_EQ(formatAnalysisText(*doc).find("caution:"), std::string::npos);
    }
    {
        // Host-synchronized collectives alone (the CPU suite's variant) are said too.
        TraceBuilder b;
        buildPipeline(b);
        b.writer->metadata("host_sync_collectives", "true");
        auto doc = analyzeRun(b.done(), AnalyzeOptions{});
        ASSERT_TRUE(doc.isOk()) << doc.status().toString();
        ASSERT_EQ((*doc)["caveats"].size(), 1u);
        EXPECT_NE((*doc)["caveats"][0].get<std::string>().find("nothing overlapped"), std::string::npos);
    }
    for (const char* storage : {"bf16", "params_bf16"}) {
        // A bf16 run of this version: the params are bf16 bits; what is still in fp32 words is
        // named (under TS_BF16_SAVED_FP32=1 the activations too).
        TraceBuilder b;
        buildPipeline(b);
        b.writer->metadata("bf16_storage", storage);
        auto doc = analyzeRun(b.done(), AnalyzeOptions{});
        ASSERT_TRUE(doc.isOk()) << doc.status().toString();
        ASSERT_EQ((*doc)["caveats"].size(), 1u) << storage;
        const std::string c = (*doc)["caveats"][0].get<std::string>();
        EXPECT_NE(c.find("the bf16 params"), std::string::npos) << c;
        EXPECT_NE(c.find("fp32 working copy"), std::string::npos) << c;
        EXPECT_EQ(c.find("bf16 model copy"), std::string::npos) << c;
        EXPECT_EQ(c.find("twice") != std::string::npos, std::string(storage) == "params_bf16") << c;
    }
    {
        // A run file of the previous version, whose saved activations were bf16 bits and whose
        // model copy was fp32 words: what was still in fp32 words is named.
        TraceBuilder b;
        buildPipeline(b);
        b.writer->metadata("bf16_storage", "saved_bf16");
        auto doc = analyzeRun(b.done(), AnalyzeOptions{});
        ASSERT_TRUE(doc.isOk()) << doc.status().toString();
        ASSERT_EQ((*doc)["caveats"].size(), 1u);
        const std::string c = (*doc)["caveats"][0].get<std::string>();
        EXPECT_NE(c.find("saved activations are bf16"), std::string::npos) << c;
        EXPECT_NE(c.find("bf16 model copy"), std::string::npos) << c;
    }
    TraceBuilder b;
    buildPipeline(b);
    b.writer->metadata("cuda_shared_gpus", "true");
    b.writer->metadata("host_sync_collectives", "true");
    b.writer->metadata("cuda_unverified", "true");
    b.writer->metadata("bf16_storage", "fp32");
    auto doc = analyzeRun(b.done(), AnalyzeOptions{});
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    const auto& caveats = (*doc)["caveats"];
    ASSERT_EQ(caveats.size(), 3u) << caveats.dump();  // sharing GPUs implies the host sync: said once
    EXPECT_NE(caveats[0].get<std::string>().find("shared GPUs"), std::string::npos) << caveats.dump();
    EXPECT_NE(caveats[0].get<std::string>().find("step times"), std::string::npos) << caveats.dump();
    EXPECT_NE(caveats[1].get<std::string>().find("twice"), std::string::npos) << caveats.dump();
    EXPECT_NE(caveats[2].get<std::string>().find("TS_CUDA_UNVERIFIED"), std::string::npos) << caveats.dump();
    const std::string text = formatAnalysisText(*doc);
    const size_t caution = text.find("caution: the ranks shared GPUs");
    ASSERT_NE(caution, std::string::npos) << text;
    EXPECT_LT(caution, text.find("step 1:")) << text;
}

TEST(Report, PeakTableLookupAndErrors) {
    std::string path = std::filesystem::temp_directory_path() / ("ts_peak_" + std::to_string(::getpid()) + ".json");
    std::ofstream(path) << R"({"devices": {"H100": {"bf16": 989.4}, "NVIDIA H100 PCIe": {"bf16": 756}}})";
    auto t = loadPeakFlopsTable(path);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    EXPECT_DOUBLE_EQ(*t->lookup("NVIDIA H100 80GB HBM3", "bf16"), 989.4);
    EXPECT_DOUBLE_EQ(*t->lookup("nvidia h100 pcie", "BF16"), 756);  // longest contained key wins
    EXPECT_FALSE(t->lookup("A100", "bf16").has_value());
    std::ofstream(path) << R"({"devices": {"H100": {"bf16": "fast"}}})";
    EXPECT_EQ(loadPeakFlopsTable(path).status().code(), ErrorCode::InvalidArgument);
    EXPECT_EQ(loadPeakFlopsTable(path + ".missing").status().code(), ErrorCode::NotFound);
    // The shipped table parses.
    std::string shipped = std::string(TS_SOURCE_DIR) + "/resources/peak_flops.json";
    auto s = loadPeakFlopsTable(shipped);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    EXPECT_TRUE(s->lookup("NVIDIA H100 80GB HBM3", "bf16").has_value());
}

TEST(ChromeExport, EventsMatchRows) {
    TraceBuilder b;
    buildPipeline(b);
    uint32_t h0 = b.track(0, TrackKind::HostThread);
    uint32_t c0 = b.track(0, TrackKind::Compute);
    b.put(h0, Category::Launch, 5, 6, "launch", "", 42);
    b.put(c0, Category::Gemm, 2000, 2100, "late \"quoted\" kernel", "", 42);
    TraceStore& s = b.done();
    std::string out = std::filesystem::temp_directory_path() / ("ts_chrome_" + std::to_string(::getpid()) + ".json");
    ASSERT_TRUE(exportChromeTrace(s, out).isOk());
    std::ifstream in(out);
    auto j = nlohmann::json::parse(in);
    int x = 0, c = 0, flowS = 0, flowF = 0;
    bool sawQuoted = false;
    for (const auto& e : j["traceEvents"]) {
        std::string ph = e["ph"];
        if (ph == "X") {
            ++x;
            if (e["name"] == "late \"quoted\" kernel") {
                sawQuoted = true;
                EXPECT_EQ(e["pid"], 0);
                EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 2.0);  // us relative to the first event (t=0)
                EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 0.1);
                EXPECT_EQ(e["args"]["correlation"], 42);
            }
        }
        if (ph == "C") ++c;
        if (ph == "s") ++flowS;
        if (ph == "f") ++flowF;
    }
    EXPECT_EQ(x, int(s.sliceCount().value()));
    EXPECT_EQ(c, 2);
    EXPECT_EQ(flowS, 1);
    EXPECT_EQ(flowF, 1);
    EXPECT_TRUE(sawQuoted);
}
