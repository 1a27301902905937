// Schema v2 packed slice chunks: the codec round-trips every field (checked against the input
// slices), rejects damaged blobs, the (track, ts) ordering matches std::stable_sort, the store
// returns slices in (track, ts, insertion) order across overlapping chunks and batches, and a
// real v1 run file written by the previous build (tests/profiler/data/v1_pp2_run.db) reads
// read-only as it is, migrates to v2, and gives the same slices and the same analysis.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "profiler/analysis.h"
#include "profiler/slice_codec.h"
#include "profiler/store.h"

using namespace ts;
using namespace ts::profiler;

namespace {

std::string tempPath(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / ("ts_chunks_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::string p = (dir / name).string();
    for (const char* suf : {"", "-wal", "-shm"}) std::filesystem::remove(p + suf);
    return p;
}

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expectSameSlice(const trace::Slice& a, const trace::Slice& b, size_t i) {
    EXPECT_EQ(a.track, b.track) << i;
    EXPECT_EQ(a.startNs, b.startNs) << i;
    EXPECT_EQ(a.durNs, b.durNs) << i;
    EXPECT_EQ(a.name, b.name) << i;
    EXPECT_EQ(a.category, b.category) << i;
    EXPECT_EQ(a.step, b.step) << i;
    EXPECT_EQ(a.microbatch, b.microbatch) << i;
    EXPECT_EQ(a.chunk, b.chunk) << i;
    EXPECT_EQ(a.layer, b.layer) << i;
    EXPECT_EQ(a.correlation, b.correlation) << i;
    EXPECT_EQ(a.bytes, b.bytes) << i;
    EXPECT_TRUE(sameBits(a.flops, b.flops)) << i << ": " << a.flops << " vs " << b.flops;
    EXPECT_EQ(a.group, b.group) << i;
    EXPECT_EQ(a.depth, b.depth) << i;
}

// Random slices with extreme and default values mixed in; startNs non-decreasing.
std::vector<trace::Slice> randomSlices(std::mt19937_64& rng, size_t n, uint32_t track) {
    std::vector<trace::Slice> v(n);
    int64_t ts = int64_t(rng() % 1000) - 500;
    const double oddFlops[] = {0.5, -3.0, -0.0, 1e300, std::numeric_limits<double>::quiet_NaN(), 9007199254740993.0,
                               std::numeric_limits<double>::infinity(), 12345.0};
    for (size_t i = 0; i < n; ++i) {
        trace::Slice& s = v[i];
        s.track = track;
        ts += int64_t(rng() % 3 == 0 ? 0 : rng() % 100000);  // ties included
        s.startNs = ts;
        int pick = int(rng() % 8);
        s.durNs = pick == 0 ? -int64_t(rng() % 1000) : pick == 1 ? std::numeric_limits<int64_t>::max() : int64_t(rng() % 50000);
        s.name = pick == 2 ? std::numeric_limits<uint32_t>::max() : uint32_t(rng() % 300);
        s.category = trace::Category(rng() % (size_t(trace::Category::Other) + 1));
        if (rng() % 2) s.step = int32_t(rng() % 100) - 2;
        if (rng() % 2) s.microbatch = pick == 3 ? std::numeric_limits<int32_t>::min() : int32_t(rng() % 16);
        if (rng() % 3 == 0) s.chunk = int32_t(rng() % 4);
        if (rng() % 3 == 0) s.layer = pick == 4 ? std::numeric_limits<int32_t>::max() : int32_t(rng() % 48);
        if (rng() % 2) s.correlation = pick == 5 ? std::numeric_limits<uint64_t>::max() : rng() % 1000000;
        if (rng() % 2) s.bytes = rng();
        if (rng() % 2) s.flops = rng() % 4 ? double(rng() % (uint64_t(1) << 40)) : oddFlops[rng() % 8];
        if (rng() % 4 == 0) s.group = uint32_t(rng() % 8);
        if (rng() % 4 == 0) s.depth = int32_t(rng() % 6) - 1;
    }
    return v;
}

std::vector<const trace::Slice*> ptrs(const std::vector<trace::Slice>& v) {
    std::vector<const trace::Slice*> p;
    for (const auto& s : v) p.push_back(&s);
    return p;
}

}  // namespace

TEST(SliceCodec, RoundTripsEveryField) {
    std::mt19937_64 rng(7);
    for (size_t n : {size_t(1), size_t(2), size_t(100), codec::kMaxChunkSlices}) {
        auto in = randomSlices(rng, n, 42);
        auto p = ptrs(in);
        std::vector<uint8_t> blob;
        codec::encodeChunk(p.data(), p.size(), blob);
        std::vector<trace::Slice> out(3);  // decode appends
        ASSERT_TRUE(codec::decodeChunk(blob.data(), blob.size(), n, 42, in[0].startNs, out));
        ASSERT_EQ(out.size(), n + 3);
        for (size_t i = 0; i < n; ++i) expectSameSlice(out[i + 3], in[i], i);
    }
    // Extreme timestamps: deltas wrap in unsigned arithmetic instead of overflowing.
    std::vector<trace::Slice> ext(2);
    ext[0].startNs = std::numeric_limits<int64_t>::min();
    ext[1].startNs = std::numeric_limits<int64_t>::max();
    auto p = ptrs(ext);
    std::vector<uint8_t> blob;
    codec::encodeChunk(p.data(), 2, blob);
    std::vector<trace::Slice> out;
    ASSERT_TRUE(codec::decodeChunk(blob.data(), blob.size(), 2, 0, ext[0].startNs, out));
    EXPECT_EQ(out[0].startNs, ext[0].startNs);
    EXPECT_EQ(out[1].startNs, ext[1].startNs);
}

TEST(SliceCodec, RejectsDamagedBlobs) {
    std::mt19937_64 rng(11);
    auto in = randomSlices(rng, 50, 1);
    auto p = ptrs(in);
    std::vector<uint8_t> blob;
    codec::encodeChunk(p.data(), p.size(), blob);
    std::vector<trace::Slice> out(1);
    // Truncated, one byte too many, wrong count, wrong format byte, empty: all refused, out untouched.
    EXPECT_FALSE(codec::decodeChunk(blob.data(), blob.size() - 1, 50, 1, 0, out));
    std::vector<uint8_t> longer = blob;
    longer.push_back(0);
    EXPECT_FALSE(codec::decodeChunk(longer.data(), longer.size(), 50, 1, 0, out));
    EXPECT_FALSE(codec::decodeChunk(blob.data(), blob.size(), 51, 1, 0, out));
    EXPECT_FALSE(codec::decodeChunk(blob.data(), blob.size(), 49, 1, 0, out));
    EXPECT_FALSE(codec::decodeChunk(blob.data(), blob.size(), size_t(1) << 40, 1, 0, out));
    std::vector<uint8_t> badFormat = blob;
    badFormat[0] = 99;
    EXPECT_FALSE(codec::decodeChunk(badFormat.data(), badFormat.size(), 50, 1, 0, out));
    EXPECT_FALSE(codec::decodeChunk(blob.data(), 0, 0, 1, 0, out));
    EXPECT_EQ(out.size(), 1u);
    // Random garbage never crashes and never yields more than asked.
    for (int t = 0; t < 200; ++t) {
        std::vector<uint8_t> junk(1 + rng() % 200);
        for (auto& b : junk) b = uint8_t(rng());
        junk[0] = codec::kChunkFormat;
        std::vector<trace::Slice> o;
        if (codec::decodeChunk(junk.data(), junk.size(), 3, 1, 0, o)) {
            EXPECT_EQ(o.size(), 3u);
        } else {
            EXPECT_TRUE(o.empty());
        }
    }
}

TEST(SliceCodec, OrderMatchesStableSort) {
    std::mt19937_64 rng(3);
    for (int round = 0; round < 20; ++round) {
        size_t n = 1 + rng() % 3000;
        std::vector<trace::Slice> v(n);
        bool bigTracks = round % 5 == 4;  // sparse huge ids take the comparison-sort path
        for (size_t i = 0; i < n; ++i) {
            v[i].track = bigTracks ? uint32_t(rng() % 4) * 100000000u : uint32_t(rng() % 7);
            v[i].startNs = round % 2 ? int64_t(i / 3) : int64_t(rng() % 500);  // sorted per track or random
            v[i].name = uint32_t(i);  // identifies the original position
        }
        std::vector<const trace::Slice*> got;
        codec::orderByTrackAndTs(v.data(), n, got);
        std::vector<const trace::Slice*> ref = ptrs(v);
        std::stable_sort(ref.begin(), ref.end(), [](const trace::Slice* a, const trace::Slice* b) {
            return a->track != b->track ? a->track < b->track : a->startNs < b->startNs;
        });
        ASSERT_EQ(got, ref) << "round " << round;
    }
}

TEST(StoreChunks, OverlappingBatchesReadInTrackTimeInsertionOrder) {
    std::string path = tempPath("overlap.db");
    std::mt19937_64 rng(5);
    std::vector<trace::Slice> all;  // in insertion order
    {
        auto s = TraceStore::create(path);
        ASSERT_TRUE(s.isOk()) << s.status().toString();
        TraceWriter w(**s, 700);  // batches cut through tracks and chunks
        uint32_t tracks[3];
        for (int t = 0; t < 3; ++t) tracks[t] = w.track({0, 0, trace::TrackKind(t), 0, "t" + std::to_string(t)});
        for (int i = 0; i < 5000; ++i) {
            trace::Slice x;
            x.track = tracks[rng() % 3];
            // Mostly increasing time, some late "enclosing range" slices far in the past, many ties.
            x.startNs = rng() % 10 == 0 ? int64_t(rng() % 1000) * 100 : int64_t(i) * 20 - int64_t(rng() % 3) * 20;
            x.durNs = 10;
            x.name = w.intern("n" + std::to_string(i));  // unique: identifies the slice
            x.step = int32_t(i % 9);
            all.push_back(x);
            w.slice(x);
        }
        ASSERT_TRUE(w.flush().isOk());
        EXPECT_EQ((*s)->sliceCount().value(), 5000);
    }
    std::vector<trace::Slice> ref = all;
    std::stable_sort(ref.begin(), ref.end(), [](const trace::Slice& a, const trace::Slice& b) {
        return a.track != b.track ? a.track < b.track : a.startNs < b.startNs;
    });
    auto s = TraceStore::open(path, true);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    std::vector<trace::Slice> got;
    ASSERT_TRUE((*s)->forEachSlice({}, [&](const trace::Slice& x) { got.push_back(x); return true; }).isOk());
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_EQ(got[i].name, ref[i].name) << "position " << i;
    for (size_t i = 0; i < ref.size(); ++i) expectSameSlice(got[i], ref[i], i);
    // Time window on one track equals filtering the reference.
    SliceFilter f;
    f.track = ref[0].track;
    f.fromNs = 30000;
    f.toNs = 61000;
    std::vector<uint32_t> want, have;
    for (auto& x : ref)
        if (x.track == *f.track && x.startNs >= f.fromNs && x.startNs < f.toNs) want.push_back(x.name);
    ASSERT_TRUE((*s)->forEachSlice(f, [&](const trace::Slice& x) { have.push_back(x.name); return true; }).isOk());
    EXPECT_EQ(have, want);
    ASSERT_FALSE(want.empty());
    // Stopping early stops.
    int seen = 0;
    ASSERT_TRUE((*s)->forEachSlice({}, [&](const trace::Slice&) { return ++seen < 10; }).isOk());
    EXPECT_EQ(seen, 10);
}

TEST(StoreChunks, CorruptChunkIsAnErrorNotACrash) {
    std::string path = tempPath("corrupt.db");
    {
        auto s = TraceStore::create(path);
        ASSERT_TRUE(s.isOk());
        TraceWriter w(**s);
        uint32_t t = w.track({0, 0, trace::TrackKind::Compute, 0, "c"});
        for (int i = 0; i < 10; ++i) {
            trace::Slice x;
            x.track = t;
            x.startNs = i;
            w.slice(x);
        }
        ASSERT_TRUE(w.flush().isOk());
        ASSERT_TRUE((*s)->exec("UPDATE slice_chunks SET data = x'01FFFF'").isOk());
    }
    auto s = TraceStore::open(path, true);
    ASSERT_TRUE(s.isOk());
    Status st = (*s)->forEachSlice({}, [](const trace::Slice&) { return true; });
    EXPECT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("corrupt"), std::string::npos) << st.toString();
}

// The fixture is a real `trainscope run` (pp=2, 2 steps) written by the v1 build.
TEST(StoreChunks, VersionOneRunFileReadsAsIsAndMigratesWithSameResults) {
    std::string fixture = std::string(TS_SOURCE_DIR) + "/tests/profiler/data/v1_pp2_run.db";
    ASSERT_TRUE(std::filesystem::exists(fixture)) << fixture;
    std::string path = tempPath("v1_run.db");
    std::filesystem::copy_file(fixture, path);

    // Independent reference: the raw v1 rows in (track, ts, id) order, straight from SQL.
    std::vector<trace::Slice> raw;
    {
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
        sqlite3_stmt* q = nullptr;
        ASSERT_EQ(sqlite3_prepare_v2(db,
                                     "SELECT track, ts, dur, name, category, step, microbatch, chunk, layer, correlation,"
                                     " bytes, flops, grp, depth FROM slices ORDER BY track, ts, id",
                                     -1, &q, nullptr),
                  SQLITE_OK);
        while (sqlite3_step(q) == SQLITE_ROW) {
            trace::Slice x;
            x.track = uint32_t(sqlite3_column_int64(q, 0));
            x.startNs = sqlite3_column_int64(q, 1);
            x.durNs = sqlite3_column_int64(q, 2);
            x.name = uint32_t(sqlite3_column_int64(q, 3));
            x.category = trace::Category(sqlite3_column_int(q, 4));
            x.step = sqlite3_column_int(q, 5);
            x.microbatch = sqlite3_column_int(q, 6);
            x.chunk = sqlite3_column_int(q, 7);
            x.layer = sqlite3_column_int(q, 8);
            x.correlation = uint64_t(sqlite3_column_int64(q, 9));
            x.bytes = uint64_t(sqlite3_column_int64(q, 10));
            x.flops = sqlite3_column_double(q, 11);
            x.group = uint32_t(sqlite3_column_int64(q, 12));
            x.depth = sqlite3_column_int(q, 13);
            raw.push_back(x);
        }
        sqlite3_finalize(q);
        sqlite3_close(db);
    }
    ASSERT_GT(raw.size(), 1000u);
    uint64_t rawMaxCorr = 0;
    for (auto& x : raw) rawMaxCorr = std::max(rawMaxCorr, x.correlation);
    auto readAll = [](TraceStore& s) {
        std::vector<trace::Slice> v;
        EXPECT_TRUE(s.forEachSlice({}, [&](const trace::Slice& x) { v.push_back(x); return true; }).isOk());
        return v;
    };
    AnalyzeOptions opt;
    nlohmann::json before;
    {
        auto ro = TraceStore::open(path, true);
        ASSERT_TRUE(ro.isOk()) << ro.status().toString();
        EXPECT_EQ((*ro)->schemaVersion().value(), 1);
        EXPECT_EQ((*ro)->sliceCount().value(), int64_t(raw.size()));
        EXPECT_EQ((*ro)->maxCorrelation().value(), rawMaxCorr);
        auto v = readAll(**ro);
        ASSERT_EQ(v.size(), raw.size());
        for (size_t i = 0; i < raw.size(); ++i) expectSameSlice(v[i], raw[i], i);
        auto doc = analyzeRun(**ro, opt);
        ASSERT_TRUE(doc.isOk()) << doc.status().toString();
        before = *doc;
        ASSERT_FALSE(before["steps"].empty());
    }
    {
        auto rw = TraceStore::open(path, false);  // migrates 1 -> 2
        ASSERT_TRUE(rw.isOk()) << rw.status().toString();
        EXPECT_EQ((*rw)->schemaVersion().value(), kSchemaVersion);
        EXPECT_EQ((*rw)->maxCorrelation().value(), rawMaxCorr);
    }
    auto s = TraceStore::open(path, true);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    EXPECT_EQ((*s)->sliceCount().value(), int64_t(raw.size()));
    auto v = readAll(**s);
    ASSERT_EQ(v.size(), raw.size());
    for (size_t i = 0; i < raw.size(); ++i) expectSameSlice(v[i], raw[i], i);
    auto after = analyzeRun(**s, opt);
    ASSERT_TRUE(after.isOk()) << after.status().toString();
    EXPECT_EQ(after->dump(), before.dump());
    // The row table is gone after the migration (the data lives in slice_chunks only).
    sqlite3_stmt* q = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2((*s)->db(), "SELECT count(*) FROM sqlite_master WHERE name = 'slices'", -1, &q, nullptr),
              SQLITE_OK);
    ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
    EXPECT_EQ(sqlite3_column_int(q, 0), 0);
    sqlite3_finalize(q);
}
