// importToRunFile: the importer through TraceWriter into a real run file, read back with
// TraceStore (what `trainscope import` produces).
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "profiler/import/import_run.h"
#include "profiler/store.h"
#include "tests/profiler/test_import_util.h"

namespace ts::profiler::import {
namespace {

TEST(ImportRun, NsysExportBecomesARunFile) {
    auto dir = testing::scratchDir("import_run_nsys");
    const std::string out = (dir / "saxpy.sqlite").string();
    const std::string src = testing::testdata("nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite");
    testing::CollectingRecorder mem;
    auto inMemory = importTraces({src}, mem);
    ASSERT_TRUE(inMemory.isOk());

    auto report = importToRunFile({src}, out);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    auto store = TraceStore::open(out, /*readOnly=*/true);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto count = (*store)->sliceCount();
    ASSERT_TRUE(count.isOk());
    EXPECT_EQ(*count, static_cast<int64_t>(mem.slices.size()));
    auto tracks = (*store)->tracks();
    ASSERT_TRUE(tracks.isOk());
    EXPECT_EQ(tracks->size(), mem.tracks.size());

    auto info = (*store)->runInfo();
    ASSERT_TRUE(info.isOk()) << info.status().toString();
    EXPECT_EQ(info->source, "nsys");
    EXPECT_EQ(info->status, "completed");
    EXPECT_EQ(info->name, "saxpy-mpi-cuda_nsys_perlmutter0");
    EXPECT_NE(info->tagsJson.find("imported"), std::string::npos);

    // The importer's counts land in the stats table.
    auto stats = (*store)->stats();
    ASSERT_TRUE(stats.isOk());
    ASSERT_TRUE(stats->count("import.nsys.duplicate_runtime_rows"));
    EXPECT_EQ(stats->at("import.nsys.duplicate_runtime_rows"), inMemory->stats.get("import.nsys.duplicate_runtime_rows"));
    auto files = (*store)->metadata("import.files");
    ASSERT_TRUE(files.isOk() && files->has_value());
    EXPECT_EQ(nlohmann::json::parse(**files).size(), 1u);

    // Kernels read back with their category and a Launch partner with the same correlation.
    auto strings = (*store)->strings();
    ASSERT_TRUE(strings.isOk());
    int kernels = 0, launches = 0;
    ASSERT_TRUE((*store)
                    ->forEachSlice({}, [&](const trace::Slice& s) {
                        if ((*strings)[s.name].rfind("saxpy", 0) == 0 && s.category == trace::Category::Other) ++kernels;
                        if (s.category == trace::Category::Launch && (*strings)[s.name] == "cudaLaunchKernel") ++launches;
                        return true;
                    })
                    .isOk());
    EXPECT_EQ(kernels, 5);
    EXPECT_EQ(launches, 5);
}

TEST(ImportRun, FailureLeavesNoFileBehind) {
    auto dir = testing::scratchDir("import_run_fail");
    testing::writeFile(dir / "notes.txt", "not a trace");
    const std::string out = (dir / "run.sqlite").string();
    auto report = importToRunFile({(dir / "notes.txt").string()}, out);
    ASSERT_FALSE(report.isOk());
    EXPECT_FALSE(std::filesystem::exists(out));
    // An existing run file is never overwritten.
    testing::writeFile(out, "x");
    auto again = importToRunFile({testing::testdata("nsys/perlmutter-cloverleaf-cuda.sqlite")}, out);
    ASSERT_FALSE(again.isOk());
    EXPECT_EQ(testing::readFile(out), "x");
}

TEST(ImportRun, TraceStem) {
    EXPECT_EQ(traceStem("/a/b/trace_rank1.json.gz"), "trace_rank1");
    EXPECT_EQ(traceStem("report.sqlite"), "report");
    EXPECT_EQ(traceStem("x.pt.trace.json"), "x");
}

}  // namespace
}  // namespace ts::profiler::import
