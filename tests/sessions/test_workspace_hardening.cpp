// The workspace against damaged and ambiguous folders: an index that is not a database, two
// files with one run id, empty run files, deleting a running run, names with invalid UTF-8.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/text.h"
#include "profiler/store.h"
#include "sessions/workspace.h"
#include "session_test_util.h"

using namespace ts::sessions;
namespace fs = std::filesystem;
using ts::sessions::testutil::TempDir;

namespace {

void writeRun(const std::string& path, const std::string& id, const std::string& status = "completed",
              const std::string& name = "n") {
    auto store = ts::profiler::TraceStore::create(path);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    ts::profiler::RunInfo info;
    info.id = id;
    info.name = name;
    info.status = status;
    info.createdAt = "2025-01-01T00:00:00Z";
    ASSERT_TRUE((*store)->setRunInfo(info).isOk());
    ts::profiler::StepMetrics m;
    m.step = 1;
    ASSERT_TRUE((*store)->appendStepMetrics(m).isOk());
}

TEST(WorkspaceHardening, IndexThatIsNotADatabaseIsMovedAsideAndRebuilt) {
    TempDir d("ts_ws_hard");
    {
        auto ws = Workspace::open(d.path);
        ASSERT_TRUE(ws.isOk());
        writeRun(ws->runsDir() + "/r1.sqlite", "r1");
        ASSERT_TRUE(ws->listRuns().isOk());
    }
    // Garbage over the index (a disk error, a stray copy): open, list and reindex still work.
    std::ofstream(d.path + "/index.sqlite", std::ios::trunc) << std::string(8192, 'x');
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk()) << ws.status().toString();
    auto list = ws->listRuns();
    ASSERT_TRUE(list.isOk()) << list.status().toString();
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ(list->front().id, "r1");
    EXPECT_TRUE(fs::exists(d.path + "/index.sqlite.broken"));
    std::ofstream(d.path + "/index.sqlite", std::ios::trunc) << std::string(8192, 'y');
    EXPECT_TRUE(ws->rebuildIndex().isOk());
    std::ofstream(d.path + "/index.sqlite", std::ios::trunc) << std::string(8192, 'z');
    list = ws->listRuns();
    ASSERT_TRUE(list.isOk()) << list.status().toString();
    EXPECT_EQ(list->size(), 1u);
}

TEST(WorkspaceHardening, TwoFilesWithOneIdAreBothListedAndTheIdIsRefused) {
    TempDir d("ts_ws_hard");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    const std::string a = ws->runsDir() + "/20250101T000000000Z-aaaaaa.sqlite";
    const std::string b = ws->runsDir() + "/copy.sqlite";
    writeRun(a, "20250101T000000000Z-aaaaaa");
    fs::copy_file(a, b);
    for (int i = 0; i < 2; ++i) {  // a second listing must not flip between the files
        auto list = ws->listRuns();
        ASSERT_TRUE(list.isOk());
        EXPECT_EQ(list->size(), 2u);
    }
    for (const char* key : {"20250101T000000000Z-aaaaaa", "20250101"}) {
        auto r = ws->resolveRun(key);
        ASSERT_FALSE(r.isOk()) << key;
        EXPECT_NE(r.status().message().find(a), std::string::npos) << r.status().message();
        EXPECT_NE(r.status().message().find(b), std::string::npos) << r.status().message();
        EXPECT_FALSE(ws->remove(key).isOk());
    }
    EXPECT_TRUE(fs::exists(a));
    EXPECT_TRUE(fs::exists(b));
    // By path each file is unambiguous.
    EXPECT_EQ(ws->resolveRun(b).value(), b);
    EXPECT_TRUE(ws->remove(b).isOk());
    EXPECT_FALSE(fs::exists(b));
    EXPECT_EQ(ws->resolveRun("20250101T000000000Z-aaaaaa").value(), a);
    ASSERT_TRUE(ws->rebuildIndex().isOk());
    EXPECT_EQ(ws->listRuns()->size(), 1u);
}

TEST(WorkspaceHardening, EmptyRunFileIsListedAsBrokenAndCanBeDeleted) {
    TempDir d("ts_ws_hard");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    writeRun(ws->runsDir() + "/good.sqlite", "good");
    const std::string empty = ws->runsDir() + "/20250101T000000000Z-eeeeee.sqlite";
    std::ofstream{empty};
    auto list = ws->listRuns();
    ASSERT_TRUE(list.isOk());
    ASSERT_EQ(list->size(), 2u);
    const RunSummary& broken = list->front();
    EXPECT_EQ(broken.status, kBrokenStatus);
    EXPECT_EQ(broken.path, empty);
    EXPECT_NE(broken.statusReason.find("empty (0 bytes)"), std::string::npos) << broken.statusReason;
    EXPECT_EQ(broken.statusReason.find("migrate"), std::string::npos) << broken.statusReason;
    auto shown = ws->findRun(empty);
    ASSERT_FALSE(shown.isOk());
    EXPECT_NE(shown.status().message().find("empty (0 bytes)"), std::string::npos) << shown.status().message();
    EXPECT_TRUE(ws->remove("20250101T000000000Z-eeeeee").isOk());
    EXPECT_FALSE(fs::exists(empty));
}

TEST(WorkspaceHardening, RunningRunIsNotDeletedUnlessAskedTo) {
    TempDir d("ts_ws_hard");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    const std::string p = ws->runsDir() + "/live.sqlite";
    writeRun(p, "live", "running");
    ts::Status s = ws->remove("live");
    ASSERT_FALSE(s.isOk());
    EXPECT_NE(s.message().find("still running"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("cancel"), std::string::npos) << s.message();
    EXPECT_TRUE(fs::exists(p));
    EXPECT_TRUE(ws->remove("live", RemoveMode::EvenIfRunning).isOk());
    EXPECT_FALSE(fs::exists(p));
}

TEST(WorkspaceHardening, InvalidUtf8FromRunFilesAndNamesIsSanitised) {
    TempDir d("ts_ws_hard");
    auto ws = Workspace::open(d.path);
    ASSERT_TRUE(ws.isOk());
    writeRun(ws->runsDir() + "/u.sqlite", "u", "completed", "bad\xff name");
    ASSERT_TRUE(ws->rename("u", "also\xfe bad").isOk());
    ASSERT_TRUE(ws->tag("u", "t\xff").isOk());
    auto list = ws->listRuns();
    ASSERT_TRUE(list.isOk());
    ASSERT_EQ(list->size(), 1u);
    EXPECT_TRUE(ts::isValidUtf8(list->front().name));
    EXPECT_NO_THROW((void)list->front().toJson().dump());
}

}  // namespace
