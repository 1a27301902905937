// The run file: one SQLite database per run holding the trace (interned strings, tracks,
// slices, counters), run metadata, run info, per-step metrics, logs and stats. Also the
// engine's CaptureRecorder, which fills it from a writer thread, and TraceWriter, the
// synchronous writer importers and tests use. Schema and every column: docs/profiler.md.
//
// Concurrency model: a file has ONE writer (a TraceStore opened for writing, or a
// CaptureRecorder); any number of readers (TraceStore::open(path, true)) may read while it
// writes, because the file is in WAL mode and every batch is one transaction. A TraceStore
// object itself is not thread-safe: use one per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/recorder.h"
#include "common/status.h"

struct sqlite3;

namespace ts::profiler {

// PRAGMA user_version of a file written by this build. Older files are migrated on open for
// writing (store.cpp, kMigrations). Opened read-only, a version 1 file (one row per slice) is
// read in its own layout; version 0 must be opened for writing once.
// v1: one `slices` row per slice. v2: slices packed in `slice_chunks` (slice_codec.h).
inline constexpr int kSchemaVersion = 2;

struct RunInfo {
    std::string id, name;
    std::string status;        // running | completed | failed | cancelled
    std::string statusReason;
    std::string createdAt;     // ISO-8601 UTC, "2025-01-31T12:00:00Z"
    std::string finishedAt;    // "" while running
    std::string node, host, user;
    std::string configJson;    // the resolved run config as JSON
    std::string layout;        // "tp2 pp2 dp2"
    std::string tagsJson = "[]";  // JSON array of strings
    std::string source = "trainscope";  // trainscope | nsys | kineto
};

struct StepMetrics {
    int step = 0;
    double loss = 0, stepTimeS = 0, tokensPerS = 0, modelTflops = 0, gradNorm = 0, lr = 0;
    int64_t peakMemoryBytes = 0;
    int64_t tsNs = 0;  // monotonicNs() when the step finished
};

struct LogLine {
    int64_t tsNs = 0;
    std::string level, text;
};

// A track as stored (id = the id Recorder::track() returned).
struct TrackRow {
    uint32_t id = 0;
    int32_t rank = 0;
    int32_t device = 0;
    trace::TrackKind kind = trace::TrackKind::HostThread;
    int32_t streamIndex = 0;
    std::string name;
};

// Which slices forEachSlice() visits. Rows come ordered by (track, startNs) (index order).
struct SliceFilter {
    std::optional<uint32_t> track;             // one track
    std::optional<int32_t> rank;               // all tracks of a rank
    std::optional<trace::TrackKind> trackKind; // with rank or alone
    int64_t fromNs = INT64_MIN;                // slices with startNs in [fromNs, toNs)
    int64_t toNs = INT64_MAX;
};

class TraceStore {
public:
    // Creates a new run file with the current schema (fails if a non-empty file exists).
    // ":memory:" gives a private in-memory database (tests).
    static Result<std::unique_ptr<TraceStore>> create(const std::string& path);
    // Opens an existing run file. readOnly=false migrates an older schema to kSchemaVersion.
    // A file left behind by a killed writer (WAL not checkpointed) opens fine.
    static Result<std::unique_ptr<TraceStore>> open(const std::string& path, bool readOnly = true);

    ~TraceStore();
    TraceStore(const TraceStore&) = delete;
    TraceStore& operator=(const TraceStore&) = delete;

    sqlite3* db();
    const std::string& path() const { return m_path; }
    bool readOnly() const { return m_readOnly; }
    Result<int> schemaVersion();

    // ---- run-level rows
    Status setRunInfo(const RunInfo& info);
    Result<RunInfo> runInfo();  // NotFound when the run row was never written
    Status setRunStatus(const std::string& status, const std::string& reason);
    Status appendStepMetrics(const StepMetrics& m);
    Result<std::vector<StepMetrics>> stepMetrics();
    Status appendLog(const std::string& level, const std::string& text);
    Status appendLog(int64_t tsNs, const std::string& level, const std::string& text);
    Result<std::vector<LogLine>> logs();
    Status setMetadata(const std::string& key, const std::string& value);
    Result<std::optional<std::string>> metadata(const std::string& key);
    Result<std::map<std::string, std::string>> allMetadata();
    // stats: counts of dropped / malformed / skipped records ("capture.dropped_slices",
    // "import.malformed_events", ...). addStat adds delta to the current value.
    Status addStat(const std::string& name, int64_t delta);
    Result<std::map<std::string, int64_t>> stats();

    // ---- trace rows (writer side). Wrap many puts in beginBatch()/commitBatch(): one
    // transaction per batch is what makes >1M rows/s possible and what readers see atomically.
    Status beginBatch();
    Status commitBatch();
    Status rollbackBatch();
    Status putString(uint32_t id, std::string_view text);
    Status putTrack(uint32_t id, const trace::TrackDesc& desc);
    Status putSlice(const trace::Slice& s);
    // Bulk insert: the fast path. Rows are ordered by (track, startNs) (stable) and packed into
    // chunks of one track (slice_codec.h), one SQLite row per chunk: put a whole batch at once.
    Status putSlices(const trace::Slice* slices, size_t count);
    Status putCounter(const trace::Counter& c);

    // ---- trace rows (reader side)
    Result<std::vector<TrackRow>> tracks();
    // All interned strings, indexed by id (index 0 = "", missing ids = "").
    Result<std::vector<std::string>> strings();
    // Id of an interned text, 0 when absent.
    Result<uint32_t> stringId(std::string_view text);
    // Streams slices in (track, startNs) order; fn returns false to stop early.
    Status forEachSlice(const SliceFilter& filter, const std::function<bool(const trace::Slice&)>& fn);
    Result<int64_t> sliceCount();
    Result<int64_t> sliceCount(int rank);  // slices on the rank's tracks
    // Largest correlation id of any slice (0 when none): importers continue after it.
    Result<uint64_t> maxCorrelation();
    // Counters of a rank (all ranks if rank < 0), ordered by (rank, name, ts).
    Result<std::vector<trace::Counter>> counters(int rank = -1);
    // Distinct ranks that have at least one track, ascending.
    Result<std::vector<int>> ranks();

    // Runs a statement that returns no rows (schema tools, tests). Not for hot paths.
    Status exec(const std::string& sql);

    // Checkpoints the WAL into the main file (readers keep working).
    Status checkpoint();

private:
    TraceStore() = default;
    Status prepareWriteStatements();
    Status badChunkCount(int64_t chunkId);  // the error for a chunk whose n is out of range
    struct Statements;
    sqlite3* m_db = nullptr;
    std::string m_path;
    bool m_readOnly = true;
    bool m_inBatch = false;
    bool m_legacySlices = false;  // a v1 file opened read-only: slices are rows of `slices`
    int64_t m_nextSliceId = 1;  // slice ids are assigned here, unique within the file
    std::unique_ptr<Statements> m_stmts;
};

// Applies the ordered migrations from the file's user_version up to kSchemaVersion.
// Version 0 = an empty database or the pre-release layout (see store.cpp).
Status migrateSchema(sqlite3* db);

// A synchronous trace::Recorder over a TraceStore: interns strings and assigns track ids
// itself, buffers rows and writes them in batched transactions of batchRows rows. Used by
// importers (feed it events, call finish()) and by tests to build traces. Not thread-safe.
// The store must outlive the writer. Strings/tracks already in the store are reused.
class TraceWriter : public trace::Recorder {
public:
    explicit TraceWriter(TraceStore& store, size_t batchRows = 65536);
    ~TraceWriter() override;  // finish() if not done; errors are then only counted

    uint32_t track(const trace::TrackDesc& desc) override;
    uint32_t intern(std::string_view text) override;
    void slice(const trace::Slice& s) override;
    void counter(const trace::Counter& c) override;
    void metadata(std::string_view key, std::string_view value) override;
    uint64_t nextCorrelation() override;

    // Counts a dropped/malformed record in the stats table (name like "import.bad_ts").
    void stat(const std::string& name, int64_t delta = 1);
    // Writes everything buffered; the first error seen since the last flush is returned.
    Status flush();
    Status finish() { return flush(); }

private:
    struct Impl;
    std::unique_ptr<Impl> m;
};

// The engine's recorder: implements trace::Recorder; the hot path appends to per-thread
// buffers (no lock in the common case, never I/O), one writer thread drains them into the
// store in batched transactions with prepared statements. When a buffer cannot grow
// (memory cap reached) records are dropped and counted (stats "capture.dropped_*").
class CaptureRecorder : public trace::Recorder {
public:
    struct Options {
        size_t maxBufferedRows = 8u << 20;  // across all threads; beyond -> dropped
        int flushIntervalMs = 50;           // the writer wakes at least this often
    };
    static Result<std::unique_ptr<CaptureRecorder>> create(const std::string& runFilePath);
    static Result<std::unique_ptr<CaptureRecorder>> create(const std::string& runFilePath,
                                                           const Options& options);
    ~CaptureRecorder() override;  // close()

    // trace::Recorder (thread-safe, non-blocking)
    uint32_t track(const trace::TrackDesc& desc) override;
    uint32_t intern(std::string_view text) override;
    void slice(const trace::Slice& s) override;
    void counter(const trace::Counter& c) override;
    void metadata(std::string_view key, std::string_view value) override;
    uint64_t nextCorrelation() override;

    // Run-level writes also go through the writer thread (the file has one writer).
    void setRunInfo(const RunInfo& info);
    void setRunStatus(const std::string& status, const std::string& reason);
    void appendStepMetrics(const StepMetrics& m);
    void appendLog(const std::string& level, const std::string& text);
    void appendLog(int64_t tsNs, const std::string& level, const std::string& text);  // tsNs: monotonicNs()

    Status flush();  // everything appended before the call is committed (readers see it)
    Status close();  // flush + stop the writer thread; idempotent

    struct Stats {
        uint64_t slices = 0, counters = 0, dropped = 0, batches = 0;
    };
    Stats stats() const;
    const std::string& path() const;

    struct Impl;

private:
    CaptureRecorder() = default;
    std::unique_ptr<Impl> m;
};

}  // namespace ts::profiler
