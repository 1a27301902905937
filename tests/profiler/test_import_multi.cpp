// Several files -> several ranks on one clock.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "profiler/import/importer.h"
#include "tests/profiler/test_import_util.h"

namespace ts::profiler::import {
namespace {

using testing::CollectingRecorder;

// A minimal one-rank Kineto trace: a launch at launchUs and its kernel 5 us later, on the
// epoch clock (absolute microseconds, as older Kineto writes them).
std::string kinetoRank(int rank, int64_t launchUs, bool withRank = true) {
    nlohmann::json doc;
    doc["traceEvents"] = nlohmann::json::array({
        {{"ph", "X"}, {"cat", "cuda_runtime"}, {"name", "cudaLaunchKernel"}, {"pid", 100 + rank}, {"tid", 100 + rank},
         {"ts", launchUs}, {"dur", 3}, {"args", {{"correlation", 1}}}},
        {{"ph", "X"}, {"cat", "kernel"}, {"name", "ncclKernel_AllReduce_RING_LL_Sum_float"}, {"pid", rank}, {"tid", 20},
         {"ts", launchUs + 5}, {"dur", 40}, {"args", {{"correlation", 1}, {"stream", 20}, {"device", rank}}}},
    });
    if (withRank) doc["distributedInfo"] = {{"rank", rank}, {"world_size", 2}, {"backend", "nccl"}};
    return doc.dump();
}

std::map<int, int64_t> kernelStartByRank(const CollectingRecorder& rec) {
    std::map<int, int64_t> out;
    for (const auto& s : rec.slices)
        if (rec.onDevice(s)) out[rec.trackOf(s).rank] = s.startNs;
    return out;
}

TEST(ImportMulti, FilesBecomeRanksAlignedOnTheEpochClock) {
    auto dir = testing::scratchDir("multi_ranks");
    const int64_t t0 = 1700000000000000;  // us since the epoch
    // Rank 1's file comes first on the command line and starts 2.5 ms after rank 0's.
    testing::writeFile(dir / "r1.json", kinetoRank(1, t0 + 2500));
    testing::gzipWrite(dir / "r0.json.gz", kinetoRank(0, t0));
    CollectingRecorder rec;
    auto report = importTraces({(dir / "r1.json").string(), (dir / "r0.json.gz").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    ASSERT_EQ(report->summary.files.size(), 2u);
    EXPECT_EQ(report->summary.files[0].rank, 1);
    EXPECT_EQ(report->summary.files[1].rank, 0);
    EXPECT_TRUE(report->summary.files[0].aligned);
    EXPECT_EQ(report->summary.originUnixNs, t0 * 1000);

    auto start = kernelStartByRank(rec);
    ASSERT_EQ(start.size(), 2u);
    EXPECT_EQ(start[0], 5000);
    EXPECT_EQ(start[1], 2500 * 1000 + 5000);
    // Correlation ids are renumbered per file: both files used id 1.
    std::set<uint64_t> kernelCorrelations;
    for (const auto& s : rec.slices)
        if (rec.onDevice(s)) kernelCorrelations.insert(s.correlation);
    EXPECT_EQ(kernelCorrelations.size(), 2u);
    // Each launch still pairs with its own rank's kernel.
    for (const auto& s : rec.slices) {
        if (s.category != trace::Category::Launch) continue;
        for (const auto& k : rec.slices) {
            if (rec.onDevice(k) && k.correlation == s.correlation) {
                EXPECT_EQ(rec.trackOf(k).rank, rec.trackOf(s).rank);
            }
        }
    }
    EXPECT_EQ(report->stats.get("import.unaligned_files"), 0);
}

TEST(ImportMulti, RanksFromFileOrderAndConflicts) {
    auto dir = testing::scratchDir("multi_conflicts");
    testing::writeFile(dir / "a.json", kinetoRank(1, 1700000000000000));
    testing::writeFile(dir / "b.json", kinetoRank(1, 1700000000000100));  // claims rank 1 too
    testing::writeFile(dir / "c.json", kinetoRank(5, 1700000000000200, /*withRank=*/false));
    CollectingRecorder rec;
    auto report = importTraces({(dir / "a.json").string(), (dir / "b.json").string(), (dir / "c.json").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    // a keeps its hint 1; b's hint collides -> its position (1) is taken -> lowest free (0);
    // c has no hint -> its position 2.
    EXPECT_EQ(report->summary.files[0].rank, 1);
    EXPECT_EQ(report->summary.files[1].rank, 0);
    EXPECT_EQ(report->summary.files[2].rank, 2);
    EXPECT_EQ(report->stats.get("import.rank_conflicts"), 1);
    std::set<int> ranks;
    for (const auto& t : rec.tracks) ranks.insert(t.rank);
    EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

TEST(ImportMulti, RealKinetoRanksAndMixedFormats) {
    CollectingRecorder rec;
    auto report = importTraces({testing::testdata("kineto/hta_trace_diff_control.json.gz"),
                                testing::testdata("kineto/hta_trace_diff_test.json.gz"),
                                testing::testdata("nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite")},
                               rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    ASSERT_EQ(report->summary.files.size(), 3u);
    EXPECT_EQ(report->summary.files[0].rank, 3);  // distributedInfo
    EXPECT_EQ(report->summary.files[1].rank, 1);
    EXPECT_EQ(report->summary.files[2].rank, 0);  // "MPI Rank 0"
    EXPECT_EQ(rec.meta.at("import.source"), "mixed");
    // All on one clock: the earliest event of all files is at 0, nothing negative.
    int64_t lo = INT64_MAX;
    for (const auto& s : rec.slices) lo = std::min(lo, s.startNs);
    EXPECT_EQ(lo, 0);
    // The 2022 trace (control) and the 2023 nsys capture keep their true distance.
    std::map<int, int64_t> first;
    for (const auto& s : rec.slices) {
        int r = rec.trackOf(s).rank;
        if (!first.count(r) || s.startNs < first[r]) first[r] = s.startNs;
    }
    EXPECT_GT(first[0] - first[3], int64_t(300) * 24 * 3600 * 1000000000LL);
}

TEST(ImportMulti, UnknownClockAlignsByFirstEvent) {
    auto dir = testing::scratchDir("multi_unaligned");
    // Small relative timestamps and no baseTimeNanoseconds: no epoch clock to align on.
    testing::writeFile(dir / "rel.json", kinetoRank(0, 1000));
    testing::writeFile(dir / "abs.json", kinetoRank(1, 1700000000000000));
    CollectingRecorder rec;
    auto report = importTraces({(dir / "rel.json").string(), (dir / "abs.json").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    EXPECT_EQ(report->stats.get("import.unaligned_files"), 1);
    EXPECT_FALSE(report->summary.files[0].aligned);
    EXPECT_TRUE(report->summary.files[1].aligned);
    auto start = kernelStartByRank(rec);
    EXPECT_EQ(start[0], 5000);
    EXPECT_EQ(start[1], 5000);
}

}  // namespace
}  // namespace ts::profiler::import
