// End to end: import the real HTA traces into a run file and run the profiler's analyses
// (commComputeOverlap, temporalBreakdown) on it. HTA's published numbers for these files
// (../shared/testdata/README.md) must come out to ±0.01 percentage points: this is the check
// that our definitions equal HTA's.
#include <gtest/gtest.h>

#include <cctype>

#include "profiler/analysis.h"
#include "profiler/import/import_run.h"
#include "profiler/store.h"
#include "tests/profiler/test_import_util.h"

namespace ts::profiler::import {
namespace {

struct HtaNumbers {
    const char* file;
    int rank;
    double overlapPct, idlePct, computePct, nonComputePct;
    int64_t kernelTimeUs;
};

const HtaNumbers kReadme[] = {
    {"hta_trace_diff_control.json.gz", 3, 47.03, 16.20, 61.23, 22.57, 383404},
    {"hta_trace_diff_test.json.gz", 1, 68.80, 7.47, 68.31, 24.23, 628371},
    {"hta_negative_queue_rank0.json.gz", 0, 1.37, 69.44, 14.15, 16.41, 1016554},
    {"hta_df_index_resolver.json.gz", 1, 0.00, 46.08, 35.55, 18.37, 1396669},
};

class ImportHtaAnalyses : public ::testing::TestWithParam<HtaNumbers> {};

TEST_P(ImportHtaAnalyses, OverlapAndTemporalBreakdownMatchHta) {
    const HtaNumbers& row = GetParam();
    auto dir = testing::scratchDir(std::string("hta_e2e_") + std::to_string(row.rank) + "_" + std::to_string(row.kernelTimeUs));
    const std::string out = (dir / "run.sqlite").string();
    ImportOptions opt;
    opt.dropLastProfilerStep = true;  // HTA drops the last profiler step when it loads a trace
    auto report = importToRunFile({testing::testdata(std::string("kineto/") + row.file)}, out, opt);
    ASSERT_TRUE(report.isOk()) << report.status().toString();

    auto store = TraceStore::open(out, /*readOnly=*/true);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto ranks = (*store)->ranks();
    ASSERT_TRUE(ranks.isOk());
    ASSERT_EQ(*ranks, std::vector<int>{row.rank});

    auto overlap = commComputeOverlap(**store, row.rank);
    ASSERT_TRUE(overlap.isOk()) << overlap.status().toString();
    EXPECT_NEAR(overlap->pct, row.overlapPct, 0.01);

    auto t = temporalBreakdown(**store, row.rank);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    EXPECT_DOUBLE_EQ(t->kernelTimeNs, static_cast<double>(row.kernelTimeUs) * 1000.0);
    EXPECT_NEAR(t->idlePct, row.idlePct, 0.01);
    EXPECT_NEAR(t->computePct, row.computePct, 0.01);
    EXPECT_NEAR(t->nonComputePct, row.nonComputePct, 0.01);
}

INSTANTIATE_TEST_SUITE_P(Readme, ImportHtaAnalyses, ::testing::ValuesIn(kReadme),
                         [](const ::testing::TestParamInfo<HtaNumbers>& info) {
                             std::string n = info.param.file;
                             n = n.substr(4, n.find(".json") - 4);
                             for (char& c : n)
                                 if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                             return n;
                         });

}  // namespace
}  // namespace ts::profiler::import
