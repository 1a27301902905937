// Bad input: what can be read is imported, the rest is counted in the stats; files that are
// not traces at all give an error a user can act on. Never a crash.
#include <gtest/gtest.h>

#include <sqlite3.h>

#include "profiler/import/importer.h"
#include "tests/profiler/test_import_util.h"

namespace ts::profiler::import {
namespace {

using testing::CollectingRecorder;
using trace::Category;

int64_t deviceSlices(const CollectingRecorder& rec) {
    int64_t n = 0;
    for (const auto& s : rec.slices) n += rec.onDevice(s) ? 1 : 0;
    return n;
}

TEST(ImportMalformed, TruncatedGzipKeepsWhatWasRead) {
    auto dir = testing::scratchDir("truncated_gzip");
    const std::string src = testing::testdata("kineto/hta_trace_diff_test.json.gz");
    CollectingRecorder full;
    ASSERT_TRUE(importTraces({src}, full).isOk());

    std::string bytes = testing::readFile(src);
    testing::writeFile(dir / "cut.json.gz", bytes.substr(0, bytes.size() * 6 / 10));
    CollectingRecorder rec;
    auto report = importTraces({(dir / "cut.json.gz").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    EXPECT_EQ(report->stats.get("import.truncated_input"), 1);
    EXPECT_EQ(report->stats.get("import.kineto.parse_errors"), 1);
    EXPECT_GT(rec.slices.size(), full.slices.size() / 4);
    EXPECT_LT(rec.slices.size(), full.slices.size());
    // The imported part is an exact prefix: same rank, same kernels where both have them.
    EXPECT_EQ(report->summary.files[0].rank, 1);
}

TEST(ImportMalformed, InvalidJsonKeepsEventsBeforeTheError) {
    auto dir = testing::scratchDir("invalid_json");
    testing::writeFile(dir / "bad.json", R"({"traceEvents": [
      {"ph": "X", "cat": "kernel", "name": "k1", "pid": 0, "tid": 7, "ts": 10, "dur": 5, "args": {"stream": 7, "device": 0}},
      {"ph": "X", "cat": "kernel", "name": "k2", "pid": 0, "tid": 7, "ts": 20, "dur": 5, "args": {"stream": 7, "device": 0}},
      {"ph": "X", "cat": "kernel", "name": "k3", "pid": 0, "tid": 7, ts: 30}
    ]})");
    CollectingRecorder rec;
    auto report = importTraces({(dir / "bad.json").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    EXPECT_EQ(deviceSlices(rec), 2);
    EXPECT_EQ(report->stats.get("import.kineto.parse_errors"), 1);
    EXPECT_EQ(report->stats.get("import.truncated_input"), 0);
}

TEST(ImportMalformed, WrongTypesAreCountedAndSkipped) {
    auto dir = testing::scratchDir("wrong_types");
    testing::writeFile(dir / "types.json", R"({"traceEvents": [
      {"ph": "X", "cat": "kernel", "name": "good", "pid": 0, "tid": 7, "ts": 10, "dur": 5, "args": {"stream": 7}},
      {"ph": "X", "cat": "kernel", "name": "ts_text", "pid": 0, "tid": 7, "ts": "soon", "dur": 5, "args": {"stream": 7}},
      {"ph": "X", "cat": "kernel", "name": "dur_null", "pid": 0, "tid": 7, "ts": 10, "dur": null, "args": {"stream": 7}},
      {"ph": "X", "cat": "kernel", "name": 42, "pid": 0, "tid": 7, "ts": 10, "dur": 1, "args": {"stream": 7}},
      {"ph": "X", "cat": "kernel", "name": "no_dur", "pid": 0, "tid": 7, "ts": 10, "args": {"stream": 7}},
      {"ph": "X", "cat": "kernel", "name": "neg_dur", "pid": 0, "tid": 7, "ts": 10, "dur": -3, "args": {"stream": 7}},
      {"ph": "X", "cat": "kernel", "name": "ts_object", "pid": 0, "tid": 7, "ts": {"us": 1}, "dur": 3, "args": {"stream": 7}},
      {"cat": "kernel", "name": "no_ph", "pid": 0, "tid": 7, "ts": 10, "dur": 3},
      {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 12, "args": {"Total Allocated": "lots"}},
      {"ph": "X", "cat": "kernel", "name": "also_good", "pid": 0, "tid": 7, "ts": 20, "dur": 2,
       "args": {"stream": 7, "Input Dims": [[1, 2], []], "nested": {"ts": "x"}}},
      {"ph": "B", "name": "begin", "pid": 1, "tid": 1, "ts": 5}
    ], "distributedInfo": {"rank": "two"}})");
    CollectingRecorder rec;
    auto report = importTraces({(dir / "types.json").string()}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    ASSERT_EQ(deviceSlices(rec), 2);
    EXPECT_EQ(rec.name(rec.slices[0]), "good");
    EXPECT_EQ(rec.name(rec.slices[1]), "also_good");
    // ts_text, dur_null, name 42, no_dur, neg_dur, ts_object, no_ph, [memory] with text.
    EXPECT_EQ(report->stats.get("import.kineto.malformed_events"), 8);
    EXPECT_EQ(report->stats.get("import.kineto.unsupported_events"), 1);
    EXPECT_EQ(report->summary.files[0].rank, 0);  // the textual rank was not used
}

TEST(ImportMalformed, NotATraceGivesClearErrors) {
    auto dir = testing::scratchDir("not_a_trace");
    testing::writeFile(dir / "notes.txt", "hello, this is not a trace\n");
    testing::writeFile(dir / "image.png", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16));
    testing::writeFile(dir / "empty.json", "");
    testing::writeFile(dir / "config.json", R"({"model": {"layers": 2}})");
    testing::writeFile(dir / "report.nsys-rep", std::string("\x00\x01nsys", 6));
    CollectingRecorder rec;
    for (const char* name : {"notes.txt", "image.png", "empty.json", "config.json", "report.nsys-rep"}) {
        SCOPED_TRACE(name);
        auto r = importTraces({(dir / name).string()}, rec);
        ASSERT_FALSE(r.isOk());
        EXPECT_EQ(r.status().code(), ErrorCode::InvalidArgument);
        EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().message();
    }
    auto rep = importTraces({(dir / "report.nsys-rep").string()}, rec);
    EXPECT_NE(rep.status().message().find("nsys export --type sqlite"), std::string::npos);
    auto cfg = importTraces({(dir / "config.json").string()}, rec);
    EXPECT_NE(cfg.status().message().find("traceEvents"), std::string::npos);
    auto missing = importTraces({(dir / "missing.json").string()}, rec);
    EXPECT_EQ(missing.status().code(), ErrorCode::NotFound);
    // An SQLite file that is not an nsys export (e.g. one of our own run files).
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir / "other.sqlite").string().c_str(), &db), SQLITE_OK);
    sqlite3_exec(db, "CREATE TABLE runs(id TEXT); INSERT INTO runs VALUES('x');", nullptr, nullptr, nullptr);
    sqlite3_close(db);
    auto other = importTraces({(dir / "other.sqlite").string()}, rec);
    ASSERT_FALSE(other.isOk());
    EXPECT_NE(other.status().message().find("not an Nsight Systems export"), std::string::npos);
    EXPECT_TRUE(rec.slices.empty());
    EXPECT_TRUE(rec.tracks.empty());
}

// Copies the old-schema nsys export and damages it with SQL.
std::string damagedNsys(const std::string& name, const std::string& sql) {
    auto dir = testing::scratchDir("nsys_" + name);
    auto path = (dir / "damaged.sqlite").string();
    testing::writeFile(path, testing::readFile(testing::testdata("nsys/saxpy-mpi-cuda_nsys_perlmutter0.sqlite")));
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
    return path;
}

TEST(ImportMalformed, NsysMissingStringTable) {
    auto path = damagedNsys("no_strings", "DROP TABLE StringIds;");
    CollectingRecorder rec;
    auto report = importTraces({path}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    EXPECT_EQ(deviceSlices(rec), 5 + 15);  // 5 kernels + 15 copies, names unresolved
    EXPECT_EQ(report->stats.get("import.nsys.missing_string_table"), 1);
    EXPECT_GT(report->stats.get("import.nsys.unresolved_strings"), 0);
    bool placeholder = false;
    for (const auto& s : rec.slices)
        if (rec.name(s).rfind("string#", 0) == 0) placeholder = true;
    EXPECT_TRUE(placeholder);
}

TEST(ImportMalformed, NsysMissingRuntimeTable) {
    auto path = damagedNsys("no_runtime", "DROP TABLE CUPTI_ACTIVITY_KIND_RUNTIME;");
    CollectingRecorder rec;
    auto report = importTraces({path}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    int64_t kernels = 0, launches = 0;
    for (const auto& s : rec.slices) {
        if (rec.onDevice(s) && s.category != Category::Memcpy) ++kernels;
        if (s.category == Category::Launch) ++launches;
    }
    EXPECT_EQ(kernels, 5);
    EXPECT_EQ(launches, 0);
}

TEST(ImportMalformed, NsysWrongTypesAndBadRows) {
    auto path = damagedNsys("bad_rows",
                            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 1;"
                            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 5 WHERE rowid = 2;"
                            "UPDATE NVTX_EVENTS SET end = NULL WHERE eventType = 59 AND rowid = "
                            "(SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType = 59);");
    CollectingRecorder rec;
    auto report = importTraces({path}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    int64_t kernels = 0, ranges = 0;
    for (const auto& s : rec.slices) {
        if (rec.onDevice(s) && s.category != Category::Memcpy) ++kernels;
        if (s.category == Category::Range) ++ranges;
    }
    EXPECT_EQ(kernels, 3);
    EXPECT_EQ(report->stats.get("import.nsys.malformed_rows.CUPTI_ACTIVITY_KIND_KERNEL"), 2);
    EXPECT_EQ(report->stats.get("import.nsys.unterminated_nvtx_ranges"), 1);
    EXPECT_EQ(ranges, 21);
}

TEST(ImportMalformed, NsysTableWithoutRequiredColumn) {
    auto path = damagedNsys("no_column", "ALTER TABLE CUPTI_ACTIVITY_KIND_MEMCPY RENAME COLUMN start TO begin_ns;");
    CollectingRecorder rec;
    auto report = importTraces({path}, rec);
    ASSERT_TRUE(report.isOk()) << report.status().toString();
    EXPECT_EQ(report->stats.get("import.nsys.unreadable_tables"), 1);
    int64_t copies = 0, kernels = 0;
    for (const auto& s : rec.slices) {
        if (s.category == Category::Memcpy) ++copies;
        else if (rec.onDevice(s)) ++kernels;
    }
    EXPECT_EQ(copies, 0);
    EXPECT_EQ(kernels, 5);
}

}  // namespace
}  // namespace ts::profiler::import
