// The run file: run-level rows, schema version + migration from version 0, the capture writer
// under concurrent producers (exactly once, drops counted), readers during a run, and a run
// killed mid-write still opening.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "profiler/analysis.h"
#include "profiler/store.h"

using namespace ts;
using namespace ts::profiler;

namespace {

std::string tempPath(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / ("ts_profiler_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::string p = (dir / name).string();
    for (const char* suf : {"", "-wal", "-shm"}) std::filesystem::remove(p + suf);
    return p;
}

int64_t countRows(const std::string& path, const char* table) {
    auto s = TraceStore::open(path, true);
    EXPECT_TRUE(s.isOk()) << s.status().toString();
    if (!s) return -1;
    sqlite3_stmt* q = nullptr;
    std::string sql = std::string("SELECT count(*) FROM ") + table;
    sqlite3_prepare_v2((*s)->db(), sql.c_str(), -1, &q, nullptr);
    int64_t n = sqlite3_step(q) == SQLITE_ROW ? sqlite3_column_int64(q, 0) : -1;
    sqlite3_finalize(q);
    return n;
}

}  // namespace

TEST(Store, RunLevelRowsRoundTrip) {
    auto s = TraceStore::create(":memory:");
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    TraceStore& st = **s;
    EXPECT_EQ(st.runInfo().status().code(), ErrorCode::NotFound);
    RunInfo ri;
    ri.id = "r1";
    ri.name = "tiny";
    ri.status = "running";
    ri.layout = "tp2 pp2 dp2";
    ri.tagsJson = "[\"a\"]";
    ri.configJson = "{\"x\":1}";
    ASSERT_TRUE(st.setRunInfo(ri).isOk());
    ASSERT_TRUE(st.setRunStatus("failed", "NaN loss at step 3").isOk());
    EXPECT_FALSE(st.setRunStatus("exploded", "").isOk());
    auto back = st.runInfo();
    ASSERT_TRUE(back.isOk());
    EXPECT_EQ(back->name, "tiny");
    EXPECT_EQ(back->layout, "tp2 pp2 dp2");
    EXPECT_EQ(back->status, "failed");
    EXPECT_EQ(back->statusReason, "NaN loss at step 3");
    EXPECT_FALSE(back->finishedAt.empty());

    StepMetrics m;
    m.step = 2;
    m.loss = 3.5;
    m.peakMemoryBytes = int64_t(1) << 40;
    ASSERT_TRUE(st.appendStepMetrics(m).isOk());
    m.step = 1;
    ASSERT_TRUE(st.appendStepMetrics(m).isOk());
    auto ms = st.stepMetrics();
    ASSERT_TRUE(ms.isOk());
    ASSERT_EQ(ms->size(), 2u);
    EXPECT_EQ((*ms)[0].step, 1);
    EXPECT_EQ((*ms)[1].peakMemoryBytes, int64_t(1) << 40);

    ASSERT_TRUE(st.appendLog("warn", "slow rank 3").isOk());
    EXPECT_EQ(st.logs()->at(0).text, "slow rank 3");
    ASSERT_TRUE(st.setMetadata("pp", "4").isOk());
    EXPECT_EQ(*st.metadata("pp").value(), "4");
    EXPECT_FALSE(st.metadata("nope")->has_value());
    ASSERT_TRUE(st.addStat("x", 2).isOk());
    ASSERT_TRUE(st.addStat("x", 3).isOk());
    EXPECT_EQ(st.stats()->at("x"), 5);
    EXPECT_EQ(st.schemaVersion().value(), kSchemaVersion);
}

TEST(Store, SlicesComeBackInTrackTimeOrderWithAllFields) {
    auto s = TraceStore::create(":memory:");
    ASSERT_TRUE(s.isOk());
    TraceWriter w(**s, 7);  // tiny batches: many commits
    uint32_t t1 = w.track({0, 0, trace::TrackKind::Compute, 0, "c"});
    uint32_t t2 = w.track({1, 1, trace::TrackKind::Comm, 2, "m"});
    EXPECT_EQ(w.track({0, 0, trace::TrackKind::Compute, 0, "c"}), t1);  // same desc -> same id
    uint32_t name = w.intern("gemm"), grp = w.intern("dp");
    EXPECT_EQ(w.intern("gemm"), name);
    for (int i = 99; i >= 0; --i) {  // written out of order
        trace::Slice x;
        x.track = i % 2 ? t2 : t1;
        x.name = name;
        x.category = trace::Category::Collective;
        x.startNs = 1000 * i;
        x.durNs = i;
        x.step = i / 10;
        x.microbatch = i % 4;
        x.chunk = 1;
        x.layer = i % 3;
        x.correlation = uint64_t(i) + 7;
        x.bytes = uint64_t(i) * 100;
        x.flops = 0.5 * i;
        x.group = grp;
        x.depth = 2;
        w.slice(x);
    }
    w.slice(trace::Slice{});  // no track: counted, not stored
    ASSERT_TRUE(w.flush().isOk());
    std::vector<trace::Slice> got;
    ASSERT_TRUE((*s)->forEachSlice({}, [&](const trace::Slice& x) { got.push_back(x); return true; }).isOk());
    ASSERT_EQ(got.size(), 100u);
    for (size_t i = 1; i < got.size(); ++i) {
        bool ordered = got[i - 1].track < got[i].track ||
                       (got[i - 1].track == got[i].track && got[i - 1].startNs < got[i].startNs);
        ASSERT_TRUE(ordered) << i;
    }
    const trace::Slice& x = got[5];  // track t1, i = 10
    EXPECT_EQ(x.startNs, 10000);
    EXPECT_EQ(x.durNs, 10);
    EXPECT_EQ(x.step, 1);
    EXPECT_EQ(x.microbatch, 2);
    EXPECT_EQ(x.chunk, 1);
    EXPECT_EQ(x.layer, 1);
    EXPECT_EQ(x.correlation, 17u);
    EXPECT_EQ(x.bytes, 1000u);
    EXPECT_DOUBLE_EQ(x.flops, 5.0);
    EXPECT_EQ(x.group, grp);
    EXPECT_EQ(x.depth, 2);
    EXPECT_EQ((*s)->stats()->at("writer.slice_without_track"), 1);
    auto tracks = (*s)->tracks();
    ASSERT_EQ(tracks->size(), 2u);
    EXPECT_EQ((*tracks)[1].kind, trace::TrackKind::Comm);
    EXPECT_EQ((*tracks)[1].streamIndex, 2);
    EXPECT_EQ((*s)->strings()->at(name), "gemm");
    EXPECT_EQ((*s)->ranks()->size(), 2u);
    // Time-window filter
    int n = 0;
    SliceFilter f;
    f.rank = 1;
    f.fromNs = 10000;
    f.toNs = 20000;
    ASSERT_TRUE((*s)->forEachSlice(f, [&](const trace::Slice&) { ++n; return true; }).isOk());
    EXPECT_EQ(n, 5);  // odd i in [10, 20)
}

TEST(Store, MigratesVersionZeroFile) {
    std::string path = tempPath("v0.db");
    {
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
        // The pre-release layout: a rowid slices table without chunk/layer/depth, user_version 0.
        const char* sql =
            "CREATE TABLE strings(id INTEGER PRIMARY KEY, text TEXT NOT NULL);"
            "CREATE TABLE tracks(id INTEGER PRIMARY KEY, rank INTEGER, device INTEGER, kind TEXT, stream_index INTEGER, name TEXT);"
            "CREATE TABLE slices(id INTEGER PRIMARY KEY, track INTEGER, ts INTEGER, dur INTEGER, name INTEGER, category INTEGER,"
            " step INTEGER, microbatch INTEGER, correlation INTEGER, bytes INTEGER, flops REAL, grp INTEGER);"
            "INSERT INTO strings VALUES(1, 'gemm');"
            "INSERT INTO tracks VALUES(1, 0, 0, 'compute', 0, 'rank 0 compute');"
            "INSERT INTO slices VALUES(5, 1, 200, 50, 1, 0, 0, NULL, 0, 0, 0, 0);"
            "INSERT INTO slices VALUES(6, 1, 100, 50, 1, 0, 0, 1, 0, 0, 0, 0);";
        ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK);
        sqlite3_close(db);
    }
    // Read-only open refuses an old schema with a message that says what to do.
    auto ro = TraceStore::open(path, true);
    ASSERT_FALSE(ro.isOk());
    EXPECT_NE(ro.status().message().find("open it once for writing"), std::string::npos);
    {
        auto rw = TraceStore::open(path, false);
        ASSERT_TRUE(rw.isOk()) << rw.status().toString();
        EXPECT_EQ((*rw)->schemaVersion().value(), kSchemaVersion);
        // New rows continue after the migrated ids.
        TraceWriter w(**rw);
        trace::Slice x;
        x.track = 1;
        x.startNs = 300;
        x.durNs = 1;
        w.slice(x);
        ASSERT_TRUE(w.flush().isOk());
    }
    auto s = TraceStore::open(path, true);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    std::vector<trace::Slice> got;
    ASSERT_TRUE((*s)->forEachSlice({}, [&](const trace::Slice& x) { got.push_back(x); return true; }).isOk());
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].startNs, 100);
    EXPECT_EQ(got[0].microbatch, 1);
    EXPECT_EQ(got[1].microbatch, -1);  // NULL became the "unknown" value
    EXPECT_EQ(got[1].chunk, -1);
    EXPECT_EQ(countRows(path, "category_names"), int64_t(trace::Category::Other) + 1);
}

TEST(Store, CreateRefusesExistingFileAndOpenReportsMissing) {
    std::string path = tempPath("exists.db");
    ASSERT_TRUE(TraceStore::create(path).isOk());
    EXPECT_EQ(TraceStore::create(path).status().code(), ErrorCode::InvalidArgument);
    EXPECT_EQ(TraceStore::open(path + ".nope").status().code(), ErrorCode::NotFound);
    std::string junk = tempPath("junk.db");
    std::ofstream(junk) << "this is not a database, just text that is long enough to look like a header........";
    EXPECT_FALSE(TraceStore::open(junk).isOk());
}

TEST(Capture, ConcurrentProducersArriveExactlyOnce) {
    std::string path = tempPath("capture.db");
    auto rec = CaptureRecorder::create(path);
    ASSERT_TRUE(rec.isOk()) << rec.status().toString();
    CaptureRecorder& r = **rec;
    const int kThreads = 4, kPer = 20000;
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
        ts.emplace_back([&, t] {
            uint32_t track = r.track({t, 0, trace::TrackKind::Compute, 0, "rank " + std::to_string(t)});
            uint32_t name = r.intern("op");  // same text from every thread -> one id
            for (int i = 0; i < kPer; ++i) {
                trace::Slice s;
                s.track = track;
                s.name = name;
                s.startNs = i;
                s.durNs = 1;
                s.correlation = r.nextCorrelation();
                r.slice(s);
                if (i % 1000 == 0) r.counter({t, r.intern("memory.activations"), i, double(i)});
            }
        });
    }
    r.metadata("pp", "2");
    RunInfo ri;
    ri.name = "concurrent";
    ri.status = "running";
    r.setRunInfo(ri);
    r.appendStepMetrics(StepMetrics{});
    r.appendLog("info", "hello");
    for (auto& t : ts) t.join();
    ASSERT_TRUE(r.flush().isOk());
    ASSERT_TRUE(r.close().isOk());
    EXPECT_EQ(r.stats().slices, uint64_t(kThreads * kPer));
    EXPECT_EQ(r.stats().dropped, 0u);

    auto s = TraceStore::open(path, true);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    std::set<uint64_t> corr;
    int64_t n = 0;
    ASSERT_TRUE((*s)->forEachSlice({}, [&](const trace::Slice& x) {
        corr.insert(x.correlation);
        ++n;
        return true;
    }).isOk());
    EXPECT_EQ(n, kThreads * kPer);
    EXPECT_EQ(corr.size(), size_t(kThreads * kPer));  // each correlation once: no duplicates
    EXPECT_EQ(*corr.begin(), 1u);
    EXPECT_EQ(*corr.rbegin(), uint64_t(kThreads * kPer));
    EXPECT_EQ((*s)->counters()->size(), size_t(kThreads * kPer / 1000));
    EXPECT_EQ((*s)->tracks()->size(), size_t(kThreads));
    EXPECT_EQ(*(*s)->metadata("pp").value(), "2");
    EXPECT_EQ((*s)->runInfo()->name, "concurrent");
    EXPECT_EQ((*s)->stepMetrics()->size(), 1u);
    EXPECT_EQ((*s)->logs()->size(), 1u);
    auto strs = (*s)->strings();
    EXPECT_EQ(std::count(strs->begin(), strs->end(), "op"), 1);
}

// intern() answers from a per-thread cache of each recorder: a text has one id per recorder,
// whichever thread asks and in whatever order recorders are used, and two recorders keep their own
// ids for the same text.
TEST(Capture, InternedIdsArePerRecorderWhateverThreadAsks) {
    auto a = CaptureRecorder::create(tempPath("intern_a.db"));
    auto b = CaptureRecorder::create(tempPath("intern_b.db"));
    ASSERT_TRUE(a.isOk() && b.isOk());
    const uint32_t aX = (*a)->intern("x"), aY = (*a)->intern("y");
    const uint32_t bY = (*b)->intern("y"), bX = (*b)->intern("x");
    EXPECT_NE(aX, aY);
    EXPECT_EQ(aX, bY);  // each recorder numbers its texts in its own first-seen order
    EXPECT_EQ(aY, bX);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ((*a)->intern("x"), aX);
        EXPECT_EQ((*b)->intern("x"), bX);
        const std::string y = std::string("y");  // another buffer with the same text
        EXPECT_EQ((*a)->intern(y), aY);
        EXPECT_EQ((*b)->intern(y), bY);
    }
    std::thread other([&] {
        EXPECT_EQ((*b)->intern("x"), bX);
        EXPECT_EQ((*a)->intern("y"), aY);
        EXPECT_EQ((*a)->intern("z"), std::max(aX, aY) + 1);
    });
    other.join();
    EXPECT_EQ((*a)->intern("z"), std::max(aX, aY) + 1);
}

TEST(Capture, OverflowIsDroppedAndCounted) {
    std::string path = tempPath("drop.db");
    CaptureRecorder::Options o;
    o.maxBufferedRows = 100;
    o.flushIntervalMs = 60000;  // the writer does not drain by itself during the test
    auto rec = CaptureRecorder::create(path, o);
    ASSERT_TRUE(rec.isOk());
    uint32_t track = (*rec)->track({0, 0, trace::TrackKind::Compute, 0, "c"});
    for (int i = 0; i < 1000; ++i) {
        trace::Slice s;
        s.track = track;
        s.startNs = i;
        (*rec)->slice(s);
    }
    ASSERT_TRUE((*rec)->close().isOk());
    EXPECT_EQ((*rec)->stats().slices, 100u);
    EXPECT_EQ((*rec)->stats().dropped, 900u);
    (*rec)->slice(trace::Slice{});  // after close: counted, no crash
    EXPECT_EQ((*rec)->stats().dropped, 901u);
    auto s = TraceStore::open(path, true);
    ASSERT_TRUE(s.isOk());
    EXPECT_EQ((*s)->sliceCount().value(), 100);
    EXPECT_EQ((*s)->stats()->at("capture.dropped_slices"), 900);
}

TEST(Capture, ReaderSeesCommittedBatchesWhileWriterRuns) {
    std::string path = tempPath("live.db");
    auto rec = CaptureRecorder::create(path);
    ASSERT_TRUE(rec.isOk());
    CaptureRecorder& r = **rec;
    uint32_t track = r.track({0, 0, trace::TrackKind::Compute, 0, "c"});
    auto put = [&](int from, int to) {
        for (int i = from; i < to; ++i) {
            trace::Slice s;
            s.track = track;
            s.startNs = i;
            r.slice(s);
        }
    };
    put(0, 500);
    ASSERT_TRUE(r.flush().isOk());
    auto reader = TraceStore::open(path, true);  // opened while the run is live
    ASSERT_TRUE(reader.isOk()) << reader.status().toString();
    EXPECT_EQ((*reader)->sliceCount().value(), 500);
    // A producer keeps appending while the reader queries: every count is a committed prefix.
    std::atomic<bool> stop{false};
    std::thread producer([&] {
        for (int k = 1; k <= 20; ++k) {
            put(k * 500, (k + 1) * 500);
            (void)r.flush();
        }
        stop = true;
    });
    int64_t last = 500;
    while (!stop) {
        int64_t n = (*reader)->sliceCount().value();
        EXPECT_GE(n, last);
        EXPECT_EQ(n % 500, 0) << "a reader saw a half-written batch";
        last = n;
    }
    producer.join();
    EXPECT_EQ((*reader)->sliceCount().value(), 10500);
    ASSERT_TRUE(r.close().isOk());
}

TEST(Capture, RunKilledMidWriteStillOpens) {
    std::string path = tempPath("killed.db");
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        auto rec = CaptureRecorder::create(path);
        if (!rec) _exit(2);
        uint32_t track = (*rec)->track({0, 0, trace::TrackKind::Compute, 0, "c"});
        for (int i = 0; i < 5000; ++i) {
            trace::Slice s;
            s.track = track;
            s.startNs = i;
            (*rec)->slice(s);
        }
        if (!(*rec)->flush()) _exit(3);
        for (int i = 5000; i < 200000; ++i) {  // in flight when the process dies
            trace::Slice s;
            s.track = track;
            s.startNs = i;
            (*rec)->slice(s);
        }
        raise(SIGKILL);
        _exit(4);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
    auto s = TraceStore::open(path, true);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    int64_t n = (*s)->sliceCount().value();
    EXPECT_GE(n, 5000);
    EXPECT_LE(n, 200000);
    // Committed rows are intact and ordered.
    int64_t expect = 0;
    bool contiguousPrefix = true;
    ASSERT_TRUE((*s)->forEachSlice({}, [&](const trace::Slice& x) {
        contiguousPrefix = contiguousPrefix && x.startNs == expect++;
        return expect <= 5000;
    }).isOk());
    EXPECT_TRUE(contiguousPrefix);

    // A WAL cut in the middle (disk full / copy of a live file) loses the torn tail only.
    std::string copy = tempPath("torn.db");
    std::filesystem::copy_file(path, copy);
    if (std::filesystem::exists(path + "-wal")) {
        std::filesystem::copy_file(path + "-wal", copy + "-wal");
        auto sz = std::filesystem::file_size(copy + "-wal");
        std::filesystem::resize_file(copy + "-wal", sz / 2 + 13);
    }
    auto t = TraceStore::open(copy, true);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    EXPECT_TRUE((*t)->sliceCount().isOk());
    EXPECT_LE((*t)->sliceCount().value(), n);
}

TEST(Capture, AppendsToARunFilePreparedBeforehand) {
    std::string path = tempPath("prepared.db");
    {
        auto s = TraceStore::create(path);
        ASSERT_TRUE(s.isOk());
        RunInfo ri;
        ri.name = "prepared";
        ASSERT_TRUE((*s)->setRunInfo(ri).isOk());
        TraceWriter w(**s);
        w.intern("existing");
        w.track({0, 0, trace::TrackKind::HostThread, 0, "h"});
        ASSERT_TRUE(w.flush().isOk());
    }
    auto rec = CaptureRecorder::create(path);
    ASSERT_TRUE(rec.isOk()) << rec.status().toString();
    EXPECT_EQ((*rec)->intern("existing"), 1u);
    EXPECT_EQ((*rec)->track({0, 0, trace::TrackKind::Compute, 0, "c"}), 2u);
    ASSERT_TRUE((*rec)->close().isOk());
    auto s = TraceStore::open(path, true);
    EXPECT_EQ((*s)->runInfo()->name, "prepared");
    EXPECT_EQ((*s)->tracks()->size(), 2u);
}
