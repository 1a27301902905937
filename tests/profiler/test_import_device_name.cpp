// Imported traces name their GPU in run metadata "device_name" so MFU finds the peak FLOPS:
// Kineto's deviceProperties[].name, nsys's TARGET_INFO_GPU.name. Reference names were read
// from the files with other tools (Python's json module on the Kineto files, the sqlite3
// command line / a direct query below on the nsys exports).
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <filesystem>
#include <memory>
#include <string>

#include "profiler/analysis.h"
#include "profiler/import/importer.h"
#include "profiler/store.h"
#include "test_import_util.h"

namespace ts::profiler::import {
namespace {

const std::string kData = TS_SHARED_TESTDATA;

std::string importedDeviceName(const std::string& path) {
    testing::CollectingRecorder rec;
    auto r = importTraces({path}, rec);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    auto it = rec.meta.find("device_name");
    return it == rec.meta.end() ? std::string("<missing>") : it->second;
}

// First GPU name by device id, straight from the export.
std::string nsysGpuName(const std::string& path) {
    sqlite3* db = nullptr;
    std::string name = "<none>";
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
        sqlite3_stmt* st = nullptr;
        if (sqlite3_prepare_v2(db, "SELECT name FROM TARGET_INFO_GPU ORDER BY id LIMIT 1", -1, &st, nullptr) ==
                SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            name = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return name;
}

bool haveData(const std::string& p) { return std::filesystem::exists(p); }

TEST(ImportDeviceName, KinetoDeviceProperties) {
    const std::string a = kData + "/kineto/hta_trace_diff_control.json.gz";
    const std::string b = kData + "/kineto/hta_negative_queue_rank0.json.gz";
    if (!haveData(a) || !haveData(b)) GTEST_SKIP() << "shared test data not found under " << kData;
    EXPECT_EQ(importedDeviceName(a), "NVIDIA A100-PG509-200");
    EXPECT_EQ(importedDeviceName(b), "NVIDIA A100-SXM4-80GB");
}

TEST(ImportDeviceName, NsysTargetInfoGpu) {
    const std::string a = kData + "/nsys/perlmutter-cloverleaf-cuda.sqlite";
    const std::string b = kData + "/nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite";
    if (!haveData(a) || !haveData(b)) GTEST_SKIP() << "shared test data not found under " << kData;
    EXPECT_EQ(nsysGpuName(a), "NVIDIA A100-SXM4-80GB");
    EXPECT_EQ(importedDeviceName(a), nsysGpuName(a));
    EXPECT_EQ(nsysGpuName(b), "NVIDIA A100-SXM4-40GB");
    EXPECT_EQ(importedDeviceName(b), nsysGpuName(b));
}

// End to end: the MFU inputs of `analyze` on an imported trace name the device and find a
// peak in resources/peak_flops.json (before, they fell back to "cpu" and no peak).
TEST(ImportDeviceName, AnalyzeFindsPeakFlopsForImportedTrace) {
    const std::string path = kData + "/kineto/hta_trace_diff_test.json.gz";
    if (!haveData(path)) GTEST_SKIP() << "shared test data not found under " << kData;
    auto store = TraceStore::create(":memory:");
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    {
        TraceWriter w(*store.value());
        auto r = importTraces({path}, w);
        ASSERT_TRUE(r.isOk()) << r.status().toString();
        ASSERT_TRUE(w.finish().isOk());
    }
    AnalyzeOptions opt;
    opt.criticalPath = false;
    opt.dtype = "fp16";
    auto doc = analyzeRun(*store.value(), opt);
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    const auto& mfu = doc.value()["mfu_inputs"];
    EXPECT_EQ(mfu["device"], "Tesla V100-SXM2-16GB");
    auto table = loadPeakFlopsTable(defaultPeakFlopsTablePath());
    ASSERT_TRUE(table.isOk()) << table.status().toString();
    auto want = table.value().lookup("V100", "fp16");
    ASSERT_TRUE(want.has_value());
    ASSERT_FALSE(mfu["peak_tflops_per_device"].is_null());
    EXPECT_DOUBLE_EQ(mfu["peak_tflops_per_device"].get<double>(), *want);
}

}  // namespace
}  // namespace ts::profiler::import
