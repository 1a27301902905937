// What the importers make of events from real traces that are not plain kernels (issue 15):
// cuda_sync rows, Triton host ops with args.stream, GPU-side annotations, 2021-format memory
// events, device memory size, and the nsys device name on both schema versions.
#include <gtest/gtest.h>

#include <sqlite3.h>

#include <set>

#include "profiler/import/importer.h"
#include "tests/profiler/test_import_util.h"

namespace ts::profiler::import {
namespace {

using testing::CollectingRecorder;
using trace::Category;
using trace::TrackKind;

TEST(ImportForeign, KinetoSyncTritonAnnotationsAndOldMemoryEvents) {
    auto dir = testing::scratchDir("kineto_foreign");
    // pid 4242 is the host process; the GPU is device 0. Shapes as in the HTA test traces
    // hta_cuda_event_sync (cuda_sync), hta_triton_example (cpu_op with args.stream) and
    // hta_amd_mi250 (gpu_user_annotation), memory events as PyTorch 1.9/1.10 wrote them.
    const std::string json = R"({"deviceProperties": [{"name": "NVIDIA A100-PG509-200", "totalGlobalMem": 42505273344}],
      "traceEvents": [
      {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 4242, "tid": 4242, "ts": 100, "dur": 900},
      {"ph": "X", "cat": "cpu_op", "name": "triton_poi_fused_add_0", "pid": 4242, "tid": 4242, "ts": 200, "dur": 95,
       "args": {"External id": 3, "stream": 0, "kernel_backend": "triton"}},
      {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "pid": 4242, "tid": 4242, "ts": 210, "dur": 40,
       "args": {"correlation": 35}},
      {"ph": "X", "cat": "kernel", "name": "triton_poi_fused_add_0", "pid": 0, "tid": 7, "ts": 290, "dur": 2,
       "args": {"device": 0, "stream": 7, "correlation": 35}},
      {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 300, "dur": 5,
       "args": {"stream": 7, "correlation": 36, "device": 0}},
      {"ph": "X", "cat": "cuda_sync", "name": "Event Sync", "pid": 0, "tid": -1, "ts": 310, "dur": 3,
       "args": {"stream": -1, "correlation": 37, "device": 0}},
      {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "pid": 0, "tid": 7, "ts": 280, "dur": 50,
       "args": {"External id": 5}},
      {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 4242, "tid": 4242, "ts": 150,
       "args": {"Device Type": 1, "Device Id": 0, "Addr": 1, "Bytes": 1000}},
      {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 4242, "tid": 4242, "ts": 160,
       "args": {"Device Type": 1, "Device Id": 0, "Addr": 2, "Bytes": 500}},
      {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 4242, "tid": 4242, "ts": 170,
       "args": {"Device Type": 1, "Device Id": 0, "Addr": 1, "Bytes": -1000}}
    ]})";
    testing::writeFile(dir / "t.json", json);
    CollectingRecorder rec;
    auto report = importTraces({(dir / "t.json").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();

    std::set<int> devices;
    int syncs = 0, annotations = 0, kernels = 0, hostTriton = 0;
    for (const auto& s : rec.slices) {
        const auto& t = rec.trackOf(s);
        if (t.kind != TrackKind::HostThread) devices.insert(t.device);
        const std::string& n = rec.name(s);
        if (n == "Stream Sync") {
            ++syncs;
            EXPECT_NE(t.kind, TrackKind::HostThread);
            EXPECT_EQ(t.streamIndex, 7);
        }
        if (n == "Event Sync") {
            EXPECT_EQ(t.kind, TrackKind::HostThread);  // stream -1: not on a stream
        }
        if (n == "ProfilerStep#1") {
            ++annotations;
            EXPECT_NE(t.kind, TrackKind::HostThread);
            EXPECT_EQ(s.category, Category::Range);
            EXPECT_EQ(s.step, 1);
        }
        if (n == "triton_poi_fused_add_0") {
            if (t.kind == TrackKind::HostThread) {
                ++hostTriton;
                EXPECT_EQ(rec.strings.at(s.group), "stream 0");
                EXPECT_NE(s.category, Category::Elementwise);
            } else {
                ++kernels;
            }
        }
    }
    EXPECT_EQ(syncs, 1);
    EXPECT_EQ(annotations, 1);
    EXPECT_EQ(kernels, 1);
    EXPECT_EQ(hostTriton, 1);
    EXPECT_EQ(devices, std::set<int>{0});  // no phantom device named after the pid

    // 2021-format memory: running sum of Bytes.
    std::vector<double> level;
    for (const auto& c : rec.counters)
        if (rec.strings.at(c.name) == "memory.allocated_since_trace_start") level.push_back(c.value);
    EXPECT_EQ(level, (std::vector<double>{1000, 1500, 500}));
    EXPECT_EQ(report->stats.get("import.kineto.malformed_events"), 0);
    EXPECT_EQ(report->stats.get("import.kineto.converted.memory_delta_events"), 3);
    EXPECT_EQ(report->stats.get("import.kineto.converted.host_ops_with_stream"), 1);
    EXPECT_EQ(report->stats.get("import.kineto.kept.kernels"), 1);
    EXPECT_EQ(report->stats.get("import.kineto.kept.gpu_syncs"), 1);
    EXPECT_EQ(report->stats.get("import.kineto.kept.gpu_annotations"), 1);
    EXPECT_EQ(rec.meta["device_name"], "NVIDIA A100-PG509-200");
    EXPECT_EQ(rec.meta["device_memory_bytes"], "42505273344");
}

// The real exports: name and memory size of the lowest device id, as a direct query gives
// them (sqlite3: SELECT name, totalMemory FROM TARGET_INFO_GPU ORDER BY id LIMIT 1).
TEST(ImportForeign, NsysDeviceMemory) {
    const std::string a = testing::testdata("nsys/perlmutter-cloverleaf-cuda.sqlite");
    const std::string b = testing::testdata("nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite");
    if (!std::filesystem::exists(a) || !std::filesystem::exists(b)) GTEST_SKIP() << "shared test data not found";
    for (auto [path, name, mem] : {std::tuple{a, "NVIDIA A100-SXM4-80GB", "84990623744"},
                                   std::tuple{b, "NVIDIA A100-SXM4-40GB", "42297524224"}}) {
        CollectingRecorder rec;
        ASSERT_TRUE(importTraces({path}, rec).isOk());
        EXPECT_EQ(rec.meta["device_name"], name);
        EXPECT_EQ(rec.meta["device_memory_bytes"], mem);
    }
}

// Older nsys schemas: TARGET_INFO_GPU without an `id` column (the query ordered by it and
// failed, so the GPU read as "cpu"), or with only a name. The export is the real saxpy one
// with that table rewritten.
TEST(ImportForeign, NsysDeviceNameWithoutIdColumn) {
    const std::string src = testing::testdata("nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite");
    if (!std::filesystem::exists(src)) GTEST_SKIP() << "shared test data not found";
    const char* rewrites[] = {
        "CREATE TABLE g AS SELECT cuDevice, name, totalMemory FROM TARGET_INFO_GPU; DROP TABLE TARGET_INFO_GPU; "
        "ALTER TABLE g RENAME TO TARGET_INFO_GPU;",
        "CREATE TABLE g AS SELECT name FROM TARGET_INFO_GPU; DROP TABLE TARGET_INFO_GPU; "
        "ALTER TABLE g RENAME TO TARGET_INFO_GPU;",
    };
    int i = 0;
    for (const char* sql : rewrites) {
        auto dir = testing::scratchDir("nsys_old_gpu_" + std::to_string(i++));
        auto path = (dir / "old.sqlite").string();
        testing::writeFile(path, testing::readFile(src));
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
        char* err = nullptr;
        EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
        sqlite3_free(err);
        sqlite3_close(db);
        CollectingRecorder rec;
        ASSERT_TRUE(importTraces({path}, rec).isOk());
        EXPECT_EQ(rec.meta["device_name"], "NVIDIA A100-SXM4-40GB") << sql;
    }
}

}  // namespace
}  // namespace ts::profiler::import
