// nsys SQLite export import on the two real exports in ../shared/testdata/nsys (schema 2.9.1
// from nsys 2022.2 and schema 3.13.2 from 2024.5). Expected counts come from SQL queries on
// the same files, run here with sqlite3 directly.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "profiler/import/importer.h"
#include "tests/profiler/test_import_util.h"

namespace ts::profiler::import {
namespace {

using testing::CollectingRecorder;
using trace::Category;

const char* kOld = "nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite";  // 2022.2, schema 2.9.1
const char* kNew = "nsys/perlmutter-cloverleaf-cuda.sqlite";       // 2024.5, schema 3.13.2

int64_t queryInt(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    int64_t v = -1;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    else
        ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

struct Counts {
    int64_t kernels = 0, memcpy = 0, memset = 0, launches = 0, hostOther = 0, ranges = 0;
};

Counts countSlices(const CollectingRecorder& rec) {
    Counts c;
    for (const auto& s : rec.slices) {
        if (rec.onDevice(s)) {
            if (s.category == Category::Memcpy) ++c.memcpy;
            else if (s.category == Category::Memset) ++c.memset;
            else ++c.kernels;
        } else if (s.category == Category::Launch) {
            ++c.launches;
        } else if (s.category == Category::Range) {
            ++c.ranges;
        } else {
            ++c.hostOther;
        }
    }
    return c;
}

class NsysVersions : public ::testing::TestWithParam<const char*> {};

TEST_P(NsysVersions, KernelsCountedOnceAndLaunchesCorrelated) {
    const std::string path = testing::testdata(GetParam());
    CollectingRecorder rec;
    auto report = importTraces({path}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    Counts c = countSlices(rec);

    const int64_t distinctKernels =
        queryInt(path, "SELECT count(*) FROM (SELECT DISTINCT start, end, deviceId, streamId, correlationId "
                       "FROM CUPTI_ACTIVITY_KIND_KERNEL)");
    EXPECT_EQ(c.kernels, distinctKernels);
    EXPECT_EQ(c.memcpy, queryInt(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY"));
    // One host slice per CUDA API call, however many rows nsys wrote for it.
    const int64_t apiCalls = queryInt(path, "SELECT count(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME");
    EXPECT_EQ(c.launches + c.hostOther, apiCalls);

    // Every kernel and copy has exactly one Launch slice with its correlation id.
    std::map<uint64_t, int> launchesByCorrelation;
    for (const auto& s : rec.slices)
        if (s.category == Category::Launch) ++launchesByCorrelation[s.correlation];
    for (const auto& s : rec.slices) {
        if (!rec.onDevice(s)) continue;
        ASSERT_NE(s.correlation, 0u);
        EXPECT_EQ(launchesByCorrelation[s.correlation], 1) << rec.name(s);
    }
    // A launch precedes its kernel.
    std::map<uint64_t, int64_t> launchStart;
    for (const auto& s : rec.slices)
        if (s.category == Category::Launch) launchStart[s.correlation] = s.startNs;
    for (const auto& s : rec.slices) {
        if (rec.onDevice(s)) {
            EXPECT_LE(launchStart[s.correlation], s.startNs);
        }
    }

    // Clock: ns since the Unix epoch = session start + nsys timestamp.
    const int64_t sessionStart = queryInt(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME");
    const int64_t firstKernel = queryInt(path, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL");
    const int64_t origin = std::stoll(rec.meta.at("import.time_origin_unix_ns"));
    int64_t importedFirstKernel = INT64_MAX;
    for (const auto& s : rec.slices)
        if (rec.onDevice(s) && s.category != Category::Memcpy && s.category != Category::Memset)
            importedFirstKernel = std::min(importedFirstKernel, s.startNs);
    EXPECT_EQ(importedFirstKernel + origin, sessionStart + firstKernel);

    EXPECT_EQ(rec.meta.at("import.source"), "nsys");
    for (const auto& t : rec.tracks) EXPECT_EQ(t.rank, 0);
}

INSTANTIATE_TEST_SUITE_P(Schemas, NsysVersions, ::testing::Values(kOld, kNew),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                             return std::string(info.param) == kOld ? "schema_2_9_1" : "schema_3_13_2";
                         });

TEST(ImportNsys, OldSchemaDuplicateRuntimeRowsAndNvtx) {
    const std::string path = testing::testdata(kOld);
    CollectingRecorder rec;
    auto report = importTraces({path}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    Counts c = countSlices(rec);
    // The 2022.2 export writes launch calls twice (eventClass 0 and 67, same correlationId).
    const int64_t rows = queryInt(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME");
    const int64_t calls = queryInt(path, "SELECT count(DISTINCT correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME");
    ASSERT_GT(rows, calls);
    EXPECT_EQ(report->stats.get("import.nsys.duplicate_runtime_rows"), rows - calls);
    EXPECT_EQ(c.kernels, 5);

    // NVTX push/pop ranges (eventType 59) with an end; names from text or StringIds.
    EXPECT_EQ(c.ranges, queryInt(path, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL"));
    std::multiset<std::string> names;
    for (const auto& s : rec.slices)
        if (s.category == Category::Range) names.insert(rec.name(s));
    EXPECT_EQ(names.count("saxpy"), 5u);
    EXPECT_EQ(names.count("MPI_Send"), 10u);
    EXPECT_EQ(names.count("MPI_Recv"), 5u);
    EXPECT_EQ(names.count("MPI_Init"), 1u);
    // API names without nsys' version suffix.
    bool sawLaunchKernel = false;
    for (const auto& s : rec.slices)
        if (s.category == Category::Launch && rec.name(s) == "cudaLaunchKernel") sawLaunchKernel = true;
    EXPECT_TRUE(sawLaunchKernel);

    auto files = nlohmann::json::parse(rec.meta.at("import.files"));
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(files[0]["info"]["nsys_schema_version"], "2.9.1");
    EXPECT_EQ(files[0]["rank_source"], "nsys thread name 'MPI Rank 0'");
}

TEST(ImportNsys, NewSchemaRankFromEnvironmentAndStreams) {
    const std::string path = testing::testdata(kNew);
    CollectingRecorder rec;
    auto report = importTraces({path}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    EXPECT_EQ(report->stats.get("import.nsys.duplicate_runtime_rows"), 0);
    auto files = nlohmann::json::parse(rec.meta.at("import.files"));
    EXPECT_EQ(files[0]["info"]["nsys_schema_version"], "3.13.2");
    EXPECT_EQ(files[0]["rank_source"], "environment PMI_RANK");
    std::set<int32_t> streams;
    for (const auto& t : rec.tracks)
        if (t.kind != trace::TrackKind::HostThread) streams.insert(t.streamIndex);
    const int64_t kernelStreams = queryInt(path, "SELECT count(DISTINCT streamId) FROM (SELECT streamId FROM "
                                                 "CUPTI_ACTIVITY_KIND_KERNEL UNION SELECT streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY)");
    EXPECT_EQ(static_cast<int64_t>(streams.size()), kernelStreams);
    // Host thread named by ThreadNames.
    bool named = false;
    for (const auto& t : rec.tracks)
        if (t.kind == trace::TrackKind::HostThread && t.name.find("(cuda-cloverleaf)") != std::string::npos) named = true;
    EXPECT_TRUE(named);
}

}  // namespace
}  // namespace ts::profiler::import
