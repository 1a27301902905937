// Kineto JSON import on the real HTA traces (../shared/testdata/kineto): the imported rows
// reproduce HTA's published numbers (README table) and match an independent DOM read of the
// same file.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "profiler/import/importer.h"
#include "profiler/import/kineto_import.h"
#include "tests/profiler/test_import_util.h"

namespace ts::profiler::import {
namespace {

using testing::CollectingRecorder;
using trace::Category;

struct HtaRow {
    const char* file;
    int rank;
    double overlapPct, idlePct, computePct, nonComputePct;
    int64_t kernelTimeUs;
};

// ../shared/testdata/README.md, HTA's own output for each file.
const HtaRow kHta[] = {
    {"hta_trace_diff_control.json.gz", 3, 47.03, 16.20, 61.23, 22.57, 383404},
    {"hta_trace_diff_test.json.gz", 1, 68.80, 7.47, 68.31, 24.23, 628371},
    {"hta_negative_queue_rank0.json.gz", 0, 1.37, 69.44, 14.15, 16.41, 1016554},
    {"hta_df_index_resolver.json.gz", 1, 0.00, 46.08, 35.55, 18.37, 1396669},
};

// Reference metric computation for the test: a sweep over start/end events counting how many
// compute / communication / any device ops are active (a different algorithm from the
// merge-then-intersect used by the analyses).
struct SweepResult {
    int64_t window = 0, busy = 0, compute = 0, comm = 0, computeAndComm = 0;
};

SweepResult sweep(const CollectingRecorder& rec) {
    struct Edge {
        int64_t t;
        int delta;
        int cls;  // 0 compute, 1 comm, 2 memory
    };
    std::vector<Edge> edges;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (const auto& s : rec.slices) {
        if (!rec.onDevice(s)) continue;
        int cls = (s.category == Category::Collective || s.category == Category::P2P) ? 1
                  : (s.category == Category::Memcpy || s.category == Category::Memset) ? 2
                                                                                         : 0;
        edges.push_back({s.startNs, +1, cls});
        edges.push_back({s.startNs + s.durNs, -1, cls});
        lo = std::min(lo, s.startNs);
        hi = std::max(hi, s.startNs + s.durNs);
    }
    std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.t < b.t; });
    SweepResult r;
    r.window = hi - lo;
    int active[3] = {0, 0, 0};
    for (size_t i = 0; i < edges.size(); ++i) {
        active[edges[i].cls] += edges[i].delta;
        int64_t next = i + 1 < edges.size() ? edges[i + 1].t : edges[i].t;
        int64_t span = next - edges[i].t;
        if (span <= 0) continue;
        bool comp = active[0] > 0, comm = active[1] > 0, any = comp || comm || active[2] > 0;
        if (any) r.busy += span;
        if (comp) r.compute += span;
        if (comm) r.comm += span;
        if (comp && comm) r.computeAndComm += span;
    }
    return r;
}

class KinetoHta : public ::testing::TestWithParam<HtaRow> {};

TEST_P(KinetoHta, MatchesHtaNumbersWithLastStepDropped) {
    const HtaRow& row = GetParam();
    CollectingRecorder rec;
    ImportOptions opt;
    opt.dropLastProfilerStep = true;
    auto report = importTraces({testing::testdata(std::string("kineto/") + row.file)}, rec, opt);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    ASSERT_EQ(report->summary.files.size(), 1u);
    EXPECT_EQ(report->summary.files[0].rank, row.rank);
    for (const auto& t : rec.tracks) EXPECT_EQ(t.rank, row.rank);

    SweepResult r = sweep(rec);
    ASSERT_GT(r.window, 0);
    EXPECT_EQ(r.window, row.kernelTimeUs * 1000);  // HTA's kernel_time, exact in ns
    const double w = static_cast<double>(r.window);
    EXPECT_NEAR(100.0 * static_cast<double>(r.window - r.busy) / w, row.idlePct, 0.01);
    EXPECT_NEAR(100.0 * static_cast<double>(r.compute) / w, row.computePct, 0.01);
    EXPECT_NEAR(100.0 * static_cast<double>(r.busy - r.compute) / w, row.nonComputePct, 0.01);
    double overlap = r.comm > 0 ? 100.0 * static_cast<double>(r.computeAndComm) / static_cast<double>(r.comm) : 0.0;
    EXPECT_NEAR(overlap, row.overlapPct, 0.01);
    EXPECT_GT(report->stats.get("import.dropped_last_step_slices"), 0);
}

INSTANTIATE_TEST_SUITE_P(Files, KinetoHta, ::testing::ValuesIn(kHta),
                         [](const ::testing::TestParamInfo<HtaRow>& info) {
                             std::string n = info.param.file;
                             n = n.substr(4, n.find(".json") - 4);  // strip "hta_" and extension
                             for (char& c : n)
                                 if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                             return n;
                         });

// Everything in the file, checked against a DOM read (nlohmann::json::parse of the whole
// document) of the same file.
TEST(ImportKineto, RowsMatchIndependentDomRead) {
    const std::string path = testing::testdata("kineto/hta_df_index_resolver.json.gz");
    nlohmann::json doc = nlohmann::json::parse(testing::gunzipFile(path));
    int64_t gpuOps = 0, runtime = 0, annotations = 0, cpuOps = 0, memAllocated = 0, memHost = 0, steps = 0;
    int64_t minGpuTs = INT64_MAX;
    std::set<int64_t> streams;
    for (const auto& e : doc["traceEvents"]) {
        std::string cat = e.value("cat", ""), ph = e.value("ph", "");
        if (ph == "X" && (cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset")) {
            ++gpuOps;
            streams.insert(e["args"]["stream"].get<int64_t>());
            minGpuTs = std::min(minGpuTs, e["ts"].get<int64_t>());
        }
        if (ph == "X" && cat == "cuda_runtime") ++runtime;
        if (ph == "X" && cat == "cpu_op") ++cpuOps;
        if (ph == "X" && cat == "user_annotation") {
            ++annotations;
            if (e["name"].get<std::string>().rfind("ProfilerStep#", 0) == 0) ++steps;
        }
        if ((ph == "i" || ph == "I") && e.value("name", "") == "[memory]") {
            if (e["args"].value("Device Type", -1) == 0) ++memHost;
            else ++memAllocated;
        }
    }

    CollectingRecorder rec;
    auto report = importTraces({path}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    int64_t gotGpu = 0, gotLaunch = 0, gotRange = 0, gotOther = 0, gotSteps = 0, gpuWithLaunch = 0;
    std::set<uint64_t> launchCorrelations;
    for (const auto& s : rec.slices)
        if (s.category == Category::Launch) launchCorrelations.insert(s.correlation);
    int64_t minTs = INT64_MAX;
    for (const auto& s : rec.slices) {
        if (rec.onDevice(s)) {
            ++gotGpu;
            minTs = std::min(minTs, s.startNs);
            if (s.correlation && launchCorrelations.count(s.correlation)) ++gpuWithLaunch;
        } else if (s.category == Category::Range) {
            ++gotRange;
            if (rec.name(s).rfind("step ", 0) == 0) {
                ++gotSteps;
                EXPECT_EQ(rec.name(s), "step " + std::to_string(s.step));
            }
        } else if (s.category == Category::Launch) {
            ++gotLaunch;
        } else {
            ++gotOther;
        }
    }
    EXPECT_EQ(gotGpu, gpuOps);
    EXPECT_EQ(gotRange, annotations);
    EXPECT_EQ(gotSteps, steps);
    EXPECT_EQ(gotLaunch + gotOther, runtime + cpuOps);
    EXPECT_GT(gotLaunch, 0);
    // Nearly every GPU op has its launch in the trace (a few launches precede the profiler).
    EXPECT_GE(gpuWithLaunch, gpuOps * 99 / 100);

    int64_t gotAllocated = 0, gotHost = 0;
    for (const auto& c : rec.counters) {
        if (rec.strings.at(c.name) == "memory.allocated") ++gotAllocated;
        if (rec.strings.at(c.name) == "memory.host_allocated") ++gotHost;
    }
    EXPECT_EQ(gotAllocated, memAllocated);
    EXPECT_EQ(gotHost, memHost);

    // One GPU track per stream, kinds from content: stream 14 carries only NCCL all-reduces.
    std::set<int32_t> gotStreams;
    for (const auto& t : rec.tracks)
        if (t.kind != trace::TrackKind::HostThread) {
            gotStreams.insert(t.streamIndex);
            if (t.streamIndex == 14) {
                EXPECT_EQ(t.kind, trace::TrackKind::Comm);
            }
            if (t.streamIndex == 7) {
                EXPECT_EQ(t.kind, trace::TrackKind::Compute);
            }
            EXPECT_EQ(t.device, 1);
        }
    EXPECT_EQ(gotStreams, std::set<int32_t>(streams.begin(), streams.end()));

    // Timeline zero = earliest event; this file's clock is Unix-epoch microseconds.
    int64_t origin = std::stoll(rec.meta.at("import.time_origin_unix_ns"));
    EXPECT_EQ(minTs + origin, minGpuTs * 1000);
    EXPECT_EQ(rec.meta.at("import.source"), "kineto");
    auto files = nlohmann::json::parse(rec.meta.at("import.files"));
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(files[0]["rank"], 1);
    EXPECT_EQ(files[0]["world_size"], 2);
    EXPECT_EQ(files[0]["rank_source"], "distributedInfo.rank");
}

TEST(ImportKineto, StepsPropagateFromLaunchToKernel) {
    CollectingRecorder rec;
    auto report = importTraces({testing::testdata("kineto/hta_trace_diff_control.json.gz")}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    std::unordered_map<uint64_t, int32_t> launchStep;
    std::vector<std::pair<int64_t, int64_t>> stepRanges;
    std::unordered_map<int32_t, std::pair<int64_t, int64_t>> rangeOfStep;
    for (const auto& s : rec.slices) {
        if (s.category == Category::Launch) launchStep[s.correlation] = s.step;
        if (s.category == Category::Range && rec.name(s) == "step " + std::to_string(s.step))
            rangeOfStep[s.step] = {s.startNs, s.startNs + s.durNs};
    }
    ASSERT_EQ(rangeOfStep.size(), 6u);  // ProfilerStep#1009 ... #1014
    int64_t kernelsWithStep = 0;
    for (const auto& s : rec.slices) {
        if (!rec.onDevice(s) || s.step < 0) continue;
        ++kernelsWithStep;
        ASSERT_TRUE(launchStep.count(s.correlation));
        EXPECT_EQ(launchStep[s.correlation], s.step);
    }
    EXPECT_GT(kernelsWithStep, 8000);
    // A launch's step is the ProfilerStep range it starts in.
    for (const auto& s : rec.slices) {
        if (s.category != Category::Launch || s.step < 0) continue;
        auto [b, e] = rangeOfStep.at(s.step);
        EXPECT_GE(s.startNs, b);
        EXPECT_LT(s.startNs, e);
    }
}

TEST(ImportKineto, BaseTimeAndDecimalTimestamps) {
    auto dir = testing::scratchDir("kineto_base_time");
    // Newer Kineto: ts relative to baseTimeNanoseconds (written after traceEvents), decimals.
    const std::string json = R"({"schemaVersion": 1, "traceEvents": [
      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 10, "ts": 100.250, "dur": 2.5,
       "args": {"correlation": 7}},
      {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, "ts": 103.125, "dur": 10.0005,
       "args": {"device": 0, "stream": 7, "correlation": 7}},
      {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, "tid": 9, "ts": 104, "dur": 3,
       "args": {"device": 0, "stream": 9, "correlation": 8, "In msg nelems": 1024, "dtype": "BFloat16",
                "Process Group Description": "dp"}}
    ], "baseTimeNanoseconds": 1700000000000000000})";
    testing::writeFile(dir / "t.json", json);
    CollectingRecorder rec;
    auto report = importTraces({(dir / "t.json").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    ASSERT_EQ(rec.slices.size(), 3u);
    EXPECT_EQ(rec.meta.at("import.time_origin_unix_ns"), std::to_string(1700000000000000000LL + 100250));
    const trace::Slice* gemm = nullptr;
    const trace::Slice* nccl = nullptr;
    const trace::Slice* launch = nullptr;
    for (const auto& s : rec.slices) {
        if (rec.name(s) == "ampere_sgemm_128x64_tn") gemm = &s;
        if (s.category == Category::Collective) nccl = &s;
        if (s.category == Category::Launch) launch = &s;
    }
    ASSERT_TRUE(gemm && nccl && launch);
    EXPECT_EQ(launch->startNs, 0);
    EXPECT_EQ(launch->durNs, 2500);
    EXPECT_EQ(gemm->startNs, 103125 - 100250);
    EXPECT_EQ(gemm->durNs, 10001);  // 10.0005 us rounds half away from zero
    EXPECT_EQ(gemm->category, Category::Gemm);
    EXPECT_EQ(gemm->correlation, launch->correlation);
    EXPECT_NE(nccl->correlation, gemm->correlation);
    EXPECT_EQ(nccl->bytes, 2048u);
    EXPECT_EQ(rec.strings.at(nccl->group), "dp");
    EXPECT_EQ(rec.trackOf(*nccl).kind, trace::TrackKind::Comm);
    EXPECT_EQ(rec.trackOf(*gemm).kind, trace::TrackKind::Compute);
    EXPECT_EQ(rec.trackOf(*launch).kind, trace::TrackKind::HostThread);
    EXPECT_EQ(rec.trackOf(*gemm).streamIndex, 7);
}


TEST(ImportKineto, TextualGpuRowsAndArrayFormat) {
    auto dir = testing::scratchDir("kineto_text_rows");
    // Chrome "JSON Array Format" (no wrapping object) with GPU rows named by text, as older
    // Kineto versions wrote them.
    testing::writeFile(dir / "a.json", R"([
      {"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "pid": "GPU 2", "tid": "stream 9 ", "ts": 50, "dur": 4},
      {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 77, "tid": "main thread", "ts": 40, "dur": 12}
    ])");
    CollectingRecorder rec;
    auto report = importTraces({(dir / "a.json").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    ASSERT_EQ(rec.slices.size(), 2u);
    int gpu = 0;
    for (const auto& s : rec.slices) {
        const auto& t = rec.trackOf(s);
        if (t.kind == trace::TrackKind::HostThread) continue;
        ++gpu;
        EXPECT_EQ(t.device, 2);
        EXPECT_EQ(t.streamIndex, 9);
        EXPECT_EQ(s.category, Category::Gemm);
        EXPECT_EQ(s.startNs, 10000);  // 10 us after the cpu_op, the earliest event
    }
    EXPECT_EQ(gpu, 1);
}


// HTA's loader filter: ops of the last ProfilerStep go; a one-step trace keeps everything
// (hta/common/trace.py: "Skipping GPU kernel filtering since only one ProfilerStep found").
TEST(ImportKineto, DropLastStepFollowsHtaRules) {
    auto dir = testing::scratchDir("kineto_drop_last");
    auto launch = [](int corr, int ts) {
        return R"({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": )" +
               std::to_string(ts) + R"(, "dur": 2, "args": {"correlation": )" + std::to_string(corr) + "}}," +
               R"({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": )" + std::to_string(ts + 5) +
               R"(, "dur": 3, "args": {"stream": 7, "correlation": )" + std::to_string(corr) + "}}";
    };
    auto step = [](int n, int ts) {
        return R"({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#)" + std::to_string(n) +
               R"(", "pid": 1, "tid": 1, "ts": )" + std::to_string(ts) + R"(, "dur": 100},)";
    };
    // Two steps [100, 200) and [200, 300): only the launch at 150 (and its kernel) stay.
    testing::writeFile(dir / "two.json", "{\"traceEvents\": [" + step(1, 100) + step(2, 200) + launch(1, 150) + "," +
                                             launch(2, 250) + "]}");
    // One step [100, 200): nothing is dropped, not even the launch after its end.
    testing::writeFile(dir / "one.json", "{\"traceEvents\": [" + step(1, 100) + launch(1, 50) + "," + launch(2, 150) +
                                             "," + launch(3, 250) + "]}");
    ImportOptions opt;
    opt.dropLastProfilerStep = true;
    auto kernelCorrelations = [&](const std::string& file) {
        CollectingRecorder rec;
        auto report = importTraces({(dir / file).string()}, rec, opt);
        EXPECT_TRUE(report.isOk());
        std::map<uint64_t, int64_t> launchStart;  // renumbered correlation -> launch start
        for (const auto& s : rec.slices)
            if (s.category == Category::Launch) launchStart[s.correlation] = s.startNs;
        std::vector<int64_t> kept;  // launch start of each surviving kernel, relative to the first event
        for (const auto& s : rec.slices)
            if (rec.onDevice(s)) kept.push_back(launchStart.at(s.correlation));
        std::sort(kept.begin(), kept.end());
        return kept;
    };
    EXPECT_EQ(kernelCorrelations("two.json"), (std::vector<int64_t>{50000}));          // launch at 150 us
    EXPECT_EQ(kernelCorrelations("one.json"), (std::vector<int64_t>{0, 100000, 200000}));  // launches at 50, 150, 250 us
}

}  // namespace
}  // namespace ts::profiler::import
