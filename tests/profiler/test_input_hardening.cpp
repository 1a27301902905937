// Hostile files for the profiler: a run file whose counts would size huge allocations, trace
// files with invalid UTF-8, imports that yield nothing, and inputs that are not regular files
// or are truncated gzip. Everything must end in a Status naming the file and the field.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "common/text.h"
#include "profiler/analysis.h"
#include "profiler/import/import_run.h"
#include "profiler/import/importer.h"
#include "profiler/store.h"
#include "tests/profiler/test_import_util.h"
#include "tests/profiler/trace_builder.h"

namespace ts::profiler {
namespace {

namespace fs = std::filesystem;
using import::testing::scratchDir;
using import::testing::writeFile;

void buildRun(const std::string& path) {
    testing::TraceBuilder b(path);
    const uint32_t host = b.track(0, trace::TrackKind::HostThread);
    const uint32_t gpu = b.track(0, trace::TrackKind::Compute);
    b.putStep(host, 1, 0, 1000);
    for (int i = 0; i < 10; ++i) b.put(gpu, trace::Category::Gemm, i * 100, i * 100 + 50, "gemm");
    b.done();
}

void sql(const std::string& path, const std::string& text) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, text.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
}

TEST(RunFileHardening, ChunkCountOutOfRangeIsAnErrorNotAnAllocation) {
    const fs::path dir = scratchDir("chunk_n");
    for (const char* bad : {"1099511627776", "-1", "0", "1025"}) {
        const std::string path = (dir / (std::string("run_") + bad + ".sqlite")).string();
        buildRun(path);
        sql(path, std::string("UPDATE slice_chunks SET n = ") + bad);
        auto store = TraceStore::open(path, true);
        ASSERT_TRUE(store.isOk()) << store.status().toString();
        auto count = (*store)->sliceCount(0);
        ASSERT_FALSE(count.isOk()) << bad;
        EXPECT_NE(count.status().message().find("slice_chunks.n"), std::string::npos) << count.status().message();
        EXPECT_NE(count.status().message().find(path), std::string::npos) << count.status().message();
        EXPECT_FALSE((*store)->sliceCount().isOk());
        AnalyzeOptions opt;
        Result<nlohmann::json> doc = Status::internal("not run");
        EXPECT_NO_THROW(doc = analyzeRun(**store, opt)) << bad;
        EXPECT_FALSE(doc.isOk()) << bad;
        // Streaming the slices reports the same damage.
        Status st = (*store)->forEachSlice({}, [](const trace::Slice&) { return true; });
        EXPECT_FALSE(st.isOk());
        EXPECT_NE(st.message().find("slice_chunks.n"), std::string::npos) << st.message();
    }
}

TEST(RunFileHardening, StringIdFarBeyondTheTableIsAnError) {
    const fs::path dir = scratchDir("string_id");
    const std::string path = (dir / "run.sqlite").string();
    buildRun(path);
    sql(path, "UPDATE strings SET id = 2147483647 WHERE id = (SELECT max(id) FROM strings)");
    auto store = TraceStore::open(path, true);
    ASSERT_TRUE(store.isOk());
    Result<std::vector<std::string>> strings = Status::internal("not run");
    EXPECT_NO_THROW(strings = (*store)->strings());
    ASSERT_FALSE(strings.isOk());
    EXPECT_NE(strings.status().message().find("strings.id"), std::string::npos) << strings.status().message();
}

TEST(RunFileHardening, EmptyRunFileSaysSo) {
    const fs::path dir = scratchDir("empty_run");
    writeFile(dir / "empty.sqlite", "");
    auto store = TraceStore::open((dir / "empty.sqlite").string(), true);
    ASSERT_FALSE(store.isOk());
    EXPECT_NE(store.status().message().find("is empty (0 bytes)"), std::string::npos) << store.status().message();
    EXPECT_EQ(store.status().message().find("migrate"), std::string::npos) << store.status().message();
}

// A Kineto trace whose second event name holds bytes that are not UTF-8: the JSON parser stops
// there (the first event is kept) and its message quotes the bytes; nothing written may throw.
TEST(ImportHardening, InvalidUtf8InKinetoTraceNeverReachesJsonRaw) {
    const fs::path dir = scratchDir("kineto_utf8");
    writeFile(dir / "t.json",
              "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"good\",\"pid\":0,\"tid\":7,\"ts\":1,"
              "\"dur\":2,\"args\":{\"stream\":7,\"device\":0}},\n"
              "{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"bad\xff\xfe\x1b[2J\",\"pid\":0,\"tid\":7,\"ts\":5,\"dur\":2}]}");
    const std::string out = (dir / "run.sqlite").string();
    Result<import::ImportReport> r = Status::internal("not run");
    EXPECT_NO_THROW(r = import::importToRunFile({(dir / "t.json").string()}, out));
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    auto store = TraceStore::open(out, true);
    ASSERT_TRUE(store.isOk());
    auto meta = (*store)->allMetadata();
    ASSERT_TRUE(meta.isOk());
    for (const auto& [k, v] : *meta) EXPECT_TRUE(isValidUtf8(v)) << k;
    AnalyzeOptions opt;
    auto doc = analyzeRun(**store, opt);
    ASSERT_TRUE(doc.isOk()) << doc.status().toString();
    EXPECT_NO_THROW((void)doc->dump());
    EXPECT_TRUE(exportChromeTrace(**store, (dir / "chrome.json").string()).isOk());
    EXPECT_NO_THROW({
        const nlohmann::json chrome = nlohmann::json::parse(import::testing::readFile(dir / "chrome.json"));
        EXPECT_TRUE(chrome.is_object() || chrome.is_array());
    });
}

TEST(ImportHardening, InvalidUtf8InNsysStringsIsReplaced) {
    const fs::path dir = scratchDir("nsys_utf8");
    const std::string path = (dir / "export.sqlite").string();
    sql(path,
        "CREATE TABLE StringIds(id INTEGER PRIMARY KEY, value TEXT);"
        "INSERT INTO StringIds VALUES(1, CAST(X'6B65726E656CFF1B' AS TEXT));"
        "INSERT INTO StringIds VALUES(2, CAST(X'74687265616480' AS TEXT));"
        "CREATE TABLE ThreadNames(globalTid INTEGER, nameId INTEGER);"
        "INSERT INTO ThreadNames VALUES(16777217, 2);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME(start INTEGER, end INTEGER, eventClass INTEGER, globalTid INTEGER,"
        " correlationId INTEGER, nameId INTEGER);"
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES(100, 200, 0, 16777217, 5, 1);"
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL(start INTEGER, end INTEGER, deviceId INTEGER, streamId INTEGER,"
        " correlationId INTEGER, globalPid INTEGER, demangledName INTEGER, shortName INTEGER);"
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES(300, 400, 0, 7, 5, 16777216, 1, 1);");
    const std::string out = (dir / "run.sqlite").string();
    Result<import::ImportReport> r = Status::internal("not run");
    EXPECT_NO_THROW(r = import::importToRunFile({path}, out, {}, "name\xff"));
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    auto store = TraceStore::open(out, true);
    ASSERT_TRUE(store.isOk());
    auto strings = (*store)->strings();
    ASSERT_TRUE(strings.isOk());
    for (const auto& s : *strings) EXPECT_TRUE(isValidUtf8(s)) << s;
    auto tracks = (*store)->tracks();
    ASSERT_TRUE(tracks.isOk());
    for (const auto& t : *tracks) EXPECT_TRUE(isValidUtf8(t.name)) << t.name;
    auto info = (*store)->runInfo();
    ASSERT_TRUE(info.isOk());
    EXPECT_TRUE(isValidUtf8(info->name));
    EXPECT_TRUE(exportChromeTrace(**store, (dir / "chrome.json").string()).isOk());
}

TEST(ImportHardening, AnImportWithoutEventsFailsAndLeavesNoRun) {
    const fs::path dir = scratchDir("empty_import");
    writeFile(dir / "empty.json", "{\"traceEvents\": []}");
    writeFile(dir / "meta_only.json",
              "{\"traceEvents\": [{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,\"args\":{\"name\":\"x\"}}]}");
    for (const char* f : {"empty.json", "meta_only.json"}) {
        const fs::path out = dir / (std::string(f) + ".sqlite");
        auto r = import::importToRunFile({(dir / f).string()}, out.string());
        ASSERT_FALSE(r.isOk()) << f;
        EXPECT_EQ(r.status().code(), ErrorCode::InvalidArgument);
        EXPECT_NE(r.status().message().find("no events"), std::string::npos) << r.status().message();
        EXPECT_FALSE(fs::exists(out)) << f;
    }
}

TEST(ImportHardening, DirectoriesFifosAndTruncatedGzipGetTheirOwnMessage) {
    const fs::path dir = scratchDir("import_inputs");
    auto d = import::detectFormat(dir.string());
    ASSERT_FALSE(d.isOk());
    EXPECT_NE(d.status().message().find("is a directory"), std::string::npos) << d.status().message();

    const fs::path fifo = dir / "pipe.json";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto f = import::detectFormat(fifo.string());  // must not block waiting for a writer
    ASSERT_FALSE(f.isOk());
    EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status().message();

    writeFile(dir / "cut.json.gz", std::string("\x1f\x8b\x08\x00\x00", 5));
    auto g = import::importToRunFile({(dir / "cut.json.gz").string()}, (dir / "cut.sqlite").string());
    ASSERT_FALSE(g.isOk());
    EXPECT_NE(g.status().message().find("truncated or damaged gzip"), std::string::npos) << g.status().message();
    EXPECT_EQ(g.status().message().find("JSON error"), std::string::npos) << g.status().message();
}

}  // namespace
}  // namespace ts::profiler
