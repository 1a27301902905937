// The analyses against Holistic Trace Analysis' own published numbers on real Kineto traces
// (../shared/testdata/README.md): overlap and temporal breakdown to ±0.01 percentage points,
// kernel_time exact. Run through the importer into a run file, then analysis.h, both with the
// last-step filter left to the analysis and with the importer doing it (no double drop).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "profiler/analysis.h"
#include "profiler/import/import_run.h"

using namespace ts;
using namespace ts::profiler;

namespace {
struct HtaRef {
    const char* file;
    int rank;
    double overlap, idle, compute, nonCompute;
    int64_t kernelTimeUs;
};
const HtaRef kRefs[] = {
    {"hta_trace_diff_control.json.gz", 3, 47.03, 16.20, 61.23, 22.57, 383404},
    {"hta_trace_diff_test.json.gz", 1, 68.80, 7.47, 68.31, 24.23, 628371},
    {"hta_negative_queue_rank0.json.gz", 0, 1.37, 69.44, 14.15, 16.41, 1016554},
    {"hta_df_index_resolver.json.gz", 1, 0.00, 46.08, 35.55, 18.37, 1396669},
};

class HtaReference : public ::testing::TestWithParam<std::tuple<HtaRef, bool>> {};
}  // namespace

TEST_P(HtaReference, OverlapAndTemporalBreakdownMatchHta) {
    const auto& [ref, importerDrops] = GetParam();
    std::string in = std::string(TS_SHARED_TESTDATA) + "/kineto/" + ref.file;
    if (!std::filesystem::exists(in)) GTEST_SKIP() << in << " not present";
    std::string out = (std::filesystem::temp_directory_path() /
                       ("ts_hta_" + std::to_string(::getpid()) + "_" + std::to_string(importerDrops) + ".sqlite"))
                          .string();
    for (const char* suf : {"", "-wal", "-shm"}) std::filesystem::remove(out + suf);
    import::ImportOptions opt;
    opt.dropLastProfilerStep = importerDrops;
    auto rep = import::importToRunFile({in}, out, opt);
    ASSERT_TRUE(rep.isOk()) << rep.status().toString();
    auto store = TraceStore::open(out, true);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto ov = commComputeOverlap(**store, ref.rank);
    ASSERT_TRUE(ov.isOk()) << ov.status().toString();
    EXPECT_NEAR(ov->pct, ref.overlap, 0.01);
    auto tb = temporalBreakdown(**store, ref.rank);
    ASSERT_TRUE(tb.isOk()) << tb.status().toString();
    EXPECT_NEAR(tb->idlePct, ref.idle, 0.01);
    EXPECT_NEAR(tb->computePct, ref.compute, 0.01);
    EXPECT_NEAR(tb->nonComputePct, ref.nonCompute, 0.01);
    EXPECT_EQ(int64_t(tb->kernelTimeNs), ref.kernelTimeUs * 1000);
    store->reset();
    for (const char* suf : {"", "-wal", "-shm"}) std::filesystem::remove(out + suf);
}

INSTANTIATE_TEST_SUITE_P(Kineto, HtaReference, ::testing::Combine(::testing::ValuesIn(kRefs), ::testing::Bool()),
                         [](const auto& info) {
                             std::string n = std::get<0>(info.param).file;
                             n = n.substr(4, n.find(".json") - 4);
                             for (char& c : n)
                                 if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                             return n + (std::get<1>(info.param) ? "_importer_drops" : "_analysis_drops");
                         });
