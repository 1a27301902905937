// TraceStore: the SQLite run file. Schema, ordered migrations, prepared statements for the
// hot insert paths, and the read side the analyses stream from. Layout documented in
// docs/profiler.md ("Schema").
#include "profiler/store.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "common/clock.h"
#include "profiler/slice_codec.h"

namespace ts::profiler {

namespace {

Status sqlError(sqlite3* db, const std::string& what) {
    std::string msg = what + ": " + (db ? sqlite3_errmsg(db) : "out of memory");
    return Status::io(msg);
}

// Statement wrapper: finalizes on destruction.
struct Stmt {
    sqlite3_stmt* s = nullptr;
    Stmt() = default;
    Stmt(const Stmt&) = delete;
    Stmt& operator=(const Stmt&) = delete;
    ~Stmt() { sqlite3_finalize(s); }
    Status prepare(sqlite3* db, const char* sql) {
        sqlite3_finalize(s);
        s = nullptr;
        if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &s, nullptr) != SQLITE_OK)
            return sqlError(db, std::string("preparing '") + sql + "'");
        return Status::ok();
    }
};

Status execSql(sqlite3* db, const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
        std::string msg = err ? err : sqlite3_errmsg(db);
        sqlite3_free(err);
        return Status::io(std::string("running '") + std::string(sql).substr(0, 80) + "': " + msg);
    }
    return Status::ok();
}

std::string columnText(sqlite3_stmt* s, int i) {
    const unsigned char* t = sqlite3_column_text(s, i);
    return t ? std::string(reinterpret_cast<const char*>(t), size_t(sqlite3_column_bytes(s, i))) : std::string();
}

void bindText(sqlite3_stmt* s, int i, std::string_view t) {
    sqlite3_bind_text(s, i, t.data(), int(t.size()), SQLITE_TRANSIENT);
}

std::string isoNowUtc() {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

// ---- schema. Version 1 is the first released layout. Every later change appends a migration;
// never edit a released one. Version 0 = a database without our tables, or the pre-release
// layout of early development files (a `slices` rowid table without `chunk`/`depth`), which
// migration 1 upgrades in place.
const char* kSchemaV1 = R"sql(
CREATE TABLE IF NOT EXISTS strings(id INTEGER PRIMARY KEY, text TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS category_names(id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tracks(id INTEGER PRIMARY KEY, rank INTEGER NOT NULL, device INTEGER NOT NULL,
    kind TEXT NOT NULL, stream_index INTEGER NOT NULL, name TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS tracks_rank ON tracks(rank, kind);
-- Clustered on (track, ts): the analyses read each track in time order straight off the b-tree.
CREATE TABLE IF NOT EXISTS slices(track INTEGER NOT NULL, ts INTEGER NOT NULL, id INTEGER NOT NULL,
    dur INTEGER NOT NULL, name INTEGER NOT NULL, category INTEGER NOT NULL,
    step INTEGER NOT NULL DEFAULT -1, microbatch INTEGER NOT NULL DEFAULT -1,
    chunk INTEGER NOT NULL DEFAULT -1, layer INTEGER NOT NULL DEFAULT -1,
    correlation INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0,
    flops REAL NOT NULL DEFAULT 0, grp INTEGER NOT NULL DEFAULT 0, depth INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(track, ts, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters(rank INTEGER NOT NULL, name INTEGER NOT NULL, ts INTEGER NOT NULL,
    value REAL NOT NULL);
CREATE INDEX IF NOT EXISTS counters_rank_name_ts ON counters(rank, name, ts);
CREATE TABLE IF NOT EXISTS metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stats(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS run(single INTEGER PRIMARY KEY CHECK(single = 1), id TEXT, name TEXT,
    status TEXT, status_reason TEXT, created_at TEXT, finished_at TEXT, node TEXT, host TEXT,
    user TEXT, config_json TEXT, layout TEXT, tags_json TEXT, source TEXT);
CREATE TABLE IF NOT EXISTS step_metrics(step INTEGER NOT NULL, loss REAL, step_time_s REAL,
    tokens_per_s REAL, model_tflops REAL, grad_norm REAL, lr REAL, peak_memory_bytes INTEGER,
    ts INTEGER);
CREATE TABLE IF NOT EXISTS logs(ts INTEGER NOT NULL, level TEXT NOT NULL, text TEXT NOT NULL);
)sql";

bool tableExists(sqlite3* db, const char* name) {
    Stmt q;
    if (!q.prepare(db, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?")) return false;
    sqlite3_bind_text(q.s, 1, name, -1, SQLITE_STATIC);
    return sqlite3_step(q.s) == SQLITE_ROW;
}

bool columnExists(sqlite3* db, const char* table, const char* column) {
    Stmt q;
    std::string sql = std::string("SELECT 1 FROM pragma_table_info('") + table + "') WHERE name=?";
    if (!q.prepare(db, sql.c_str())) return false;
    sqlite3_bind_text(q.s, 1, column, -1, SQLITE_STATIC);
    return sqlite3_step(q.s) == SQLITE_ROW;
}

// 0 -> 1: create the v1 tables. A pre-release `slices` table (rowid, no chunk/depth columns) is
// copied into the clustered v1 layout.
Status migrateTo1(sqlite3* db) {
    bool legacySlices = tableExists(db, "slices") && !columnExists(db, "slices", "depth");
    if (legacySlices) TS_RETURN_IF_ERROR(execSql(db, "ALTER TABLE slices RENAME TO slices_v0"));
    TS_RETURN_IF_ERROR(execSql(db, kSchemaV1));
    if (legacySlices) {
        TS_RETURN_IF_ERROR(execSql(db,
            "INSERT INTO slices(track, ts, id, dur, name, category, step, microbatch, correlation, bytes, flops, grp)"
            " SELECT track, ts, id, dur, name, category, coalesce(step,-1), coalesce(microbatch,-1),"
            " coalesce(correlation,0), coalesce(bytes,0), coalesce(flops,0), coalesce(grp,0) FROM slices_v0"));
        TS_RETURN_IF_ERROR(execSql(db, "DROP TABLE slices_v0"));
    }
    Stmt ins;
    TS_RETURN_IF_ERROR(ins.prepare(db, "INSERT OR REPLACE INTO category_names(id, name) VALUES(?, ?)"));
    for (int c = 0; c <= int(trace::Category::Other); ++c) {
        sqlite3_bind_int(ins.s, 1, c);
        sqlite3_bind_text(ins.s, 2, trace::categoryName(trace::Category(c)), -1, SQLITE_STATIC);
        if (sqlite3_step(ins.s) != SQLITE_DONE) return sqlError(db, "filling category_names");
        sqlite3_reset(ins.s);
    }
    return Status::ok();
}

// The v1 row columns ts, dur, name, category, step, microbatch, chunk, layer, correlation,
// bytes, flops, grp, depth, read from column c on (v1 files: migration 2 and read-only reads).
void readV1SliceColumns(sqlite3_stmt* q, int c, trace::Slice& x) {
    x.startNs = sqlite3_column_int64(q, c);
    x.durNs = sqlite3_column_int64(q, c + 1);
    x.name = uint32_t(sqlite3_column_int64(q, c + 2));
    int cat = sqlite3_column_int(q, c + 3);
    x.category = (cat >= 0 && cat <= int(trace::Category::Other)) ? trace::Category(cat) : trace::Category::Other;
    x.step = sqlite3_column_int(q, c + 4);
    x.microbatch = sqlite3_column_int(q, c + 5);
    x.chunk = sqlite3_column_int(q, c + 6);
    x.layer = sqlite3_column_int(q, c + 7);
    x.correlation = uint64_t(sqlite3_column_int64(q, c + 8));
    x.bytes = uint64_t(sqlite3_column_int64(q, c + 9));
    x.flops = sqlite3_column_double(q, c + 10);
    x.group = uint32_t(sqlite3_column_int64(q, c + 11));
    x.depth = sqlite3_column_int(q, c + 12);
}

// ---- packed slice chunks (schema v2; layout in slice_codec.h) --------------------------------
// One row per chunk of <= codec::kMaxChunkSlices slices of one track in time order; the chunk's
// slices have ids id .. id + n - 1. Index (track, ts_first): a track is read in time order by
// walking its chunks; chunks whose time ranges overlap (a late-recorded enclosing range) are
// merged on read (forEachSlice).
const char* kSchemaV2 = R"sql(
CREATE TABLE IF NOT EXISTS slice_chunks(id INTEGER PRIMARY KEY, track INTEGER NOT NULL, ts_first INTEGER NOT NULL,
    ts_last INTEGER NOT NULL, n INTEGER NOT NULL, max_correlation INTEGER NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS slice_chunks_track_ts ON slice_chunks(track, ts_first);
)sql";

const char* kInsertChunkSql =
    "INSERT INTO slice_chunks(id, track, ts_first, ts_last, n, max_correlation, data) VALUES(?,?,?,?,?,?,?)";

// Writes slices (sorted by (track, startNs)) as chunks; ids continue from nextId.
Status writeChunks(sqlite3* db, sqlite3_stmt* ins, const trace::Slice* const* s, size_t n, int64_t& nextId,
                   std::vector<uint8_t>& blob) {
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        uint64_t maxCorr = s[i]->correlation;
        while (j < n && j - i < codec::kMaxChunkSlices && s[j]->track == s[i]->track && s[j]->startNs >= s[j - 1]->startNs) {
            maxCorr = std::max(maxCorr, s[j]->correlation);
            ++j;
        }
        blob.clear();
        codec::encodeChunk(s + i, j - i, blob);
        sqlite3_bind_int64(ins, 1, nextId);
        sqlite3_bind_int64(ins, 2, s[i]->track);
        sqlite3_bind_int64(ins, 3, s[i]->startNs);
        sqlite3_bind_int64(ins, 4, s[j - 1]->startNs);
        sqlite3_bind_int64(ins, 5, int64_t(j - i));
        sqlite3_bind_int64(ins, 6, int64_t(maxCorr));
        sqlite3_bind_blob(ins, 7, blob.data(), int(blob.size()), SQLITE_STATIC);
        int rc = sqlite3_step(ins);
        sqlite3_reset(ins);
        if (rc != SQLITE_DONE) return sqlError(db, "writing slices");
        nextId += int64_t(j - i);
        i = j;
    }
    return Status::ok();
}

// 1 -> 2: slices move from one row per slice (v1 `slices`) into packed chunks. Rows are copied
// in (track, ts, id) order, so the new ids keep the old order of slices with equal ts.
Status migrateTo2(sqlite3* db) {
    TS_RETURN_IF_ERROR(execSql(db, kSchemaV2));
    if (!tableExists(db, "slices")) return Status::ok();
    Stmt q, ins;
    TS_RETURN_IF_ERROR(q.prepare(db,
        "SELECT track, ts, dur, name, category, step, microbatch, chunk, layer, correlation, bytes, flops, grp, depth"
        " FROM slices ORDER BY track, ts, id"));
    TS_RETURN_IF_ERROR(ins.prepare(db, kInsertChunkSql));
    std::vector<trace::Slice> rows;
    std::vector<const trace::Slice*> ptrs;
    std::vector<uint8_t> blob;
    int64_t nextId = 1;
    auto drain = [&]() -> Status {
        ptrs.resize(rows.size());
        for (size_t i = 0; i < rows.size(); ++i) ptrs[i] = &rows[i];
        Status st = writeChunks(db, ins.s, ptrs.data(), ptrs.size(), nextId, blob);
        rows.clear();
        return st;
    };
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
        trace::Slice x;
        x.track = uint32_t(sqlite3_column_int64(q.s, 0));
        readV1SliceColumns(q.s, 1, x);
        if (rows.size() >= (size_t(1) << 16)) TS_RETURN_IF_ERROR(drain());  // bounded memory
        rows.push_back(x);
    }
    if (rc != SQLITE_DONE) return sqlError(db, "reading v1 slices");
    TS_RETURN_IF_ERROR(drain());
    sqlite3_finalize(q.s);  // DROP TABLE needs no statement reading it
    q.s = nullptr;
    return execSql(db, "DROP TABLE slices");
}

using Migration = Status (*)(sqlite3*);
// kMigrations[i] upgrades version i to i+1.
const Migration kMigrations[] = {migrateTo1, migrateTo2};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kSchemaVersion);

Result<int> userVersion(sqlite3* db) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(db, "PRAGMA user_version"));
    if (sqlite3_step(q.s) != SQLITE_ROW) return sqlError(db, "reading user_version");
    return sqlite3_column_int(q.s, 0);
}

Status configureConnection(sqlite3* db, bool readOnly) {
    sqlite3_busy_timeout(db, 5000);
    if (!readOnly) {
        // WAL: readers never block the writer and see only committed batches.
        // synchronous=NORMAL: a crash may lose the last batches but never corrupts the file.
        TS_RETURN_IF_ERROR(execSql(db, "PRAGMA journal_mode=WAL"));
        TS_RETURN_IF_ERROR(execSql(db, "PRAGMA synchronous=NORMAL"));
        TS_RETURN_IF_ERROR(execSql(db, "PRAGMA wal_autocheckpoint=16384"));
    }
    TS_RETURN_IF_ERROR(execSql(db, "PRAGMA cache_size=-65536"));  // 64 MiB page cache
    TS_RETURN_IF_ERROR(execSql(db, "PRAGMA temp_store=MEMORY"));
    return Status::ok();
}

}  // namespace

Status migrateSchema(sqlite3* db) {
    TS_ASSIGN_OR_RETURN(int version, userVersion(db));
    if (version > kSchemaVersion)
        return Status::unsupported("run file schema version " + std::to_string(version) +
                                   " is newer than this trainscope (" + std::to_string(kSchemaVersion) +
                                   "); upgrade trainscope to open it");
    for (int v = version; v < kSchemaVersion; ++v) {
        TS_RETURN_IF_ERROR(execSql(db, "BEGIN IMMEDIATE"));
        Status st = kMigrations[v](db);
        if (st) st = execSql(db, ("PRAGMA user_version=" + std::to_string(v + 1)).c_str());
        if (!st) {
            (void)execSql(db, "ROLLBACK");
            return st.withContext("migrating run file schema " + std::to_string(v) + " -> " + std::to_string(v + 1));
        }
        TS_RETURN_IF_ERROR(execSql(db, "COMMIT"));
    }
    return Status::ok();
}

struct TraceStore::Statements {
    Stmt chunk, counter, str, track, stat;
    std::vector<const trace::Slice*> order;  // putSlices scratch: rows in (track, ts) order
    std::vector<uint8_t> blob;               // putSlices scratch: one encoded chunk
};

Result<std::unique_ptr<TraceStore>> TraceStore::create(const std::string& path) {
    if (path != ":memory:" && !path.empty()) {
        std::error_code ec;
        if (std::filesystem::exists(path, ec) && std::filesystem::file_size(path, ec) > 0)
            return Status::invalid("run file '" + path + "' already exists; pick a new path or open it");
    }
    std::unique_ptr<TraceStore> store(new TraceStore());
    store->m_path = path;
    store->m_readOnly = false;
    int rc = sqlite3_open_v2(path.c_str(), &store->m_db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) return sqlError(store->m_db, "creating run file '" + path + "'");
    TS_RETURN_IF_ERROR(configureConnection(store->m_db, false));
    TS_RETURN_IF_ERROR(migrateSchema(store->m_db));
    TS_RETURN_IF_ERROR(store->prepareWriteStatements());
    return store;
}

Result<std::unique_ptr<TraceStore>> TraceStore::open(const std::string& path, bool readOnly) {
    if (path != ":memory:") {
        std::error_code ec;
        if (!std::filesystem::exists(path, ec)) return Status::notFound("run file '" + path + "' does not exist");
        if (std::filesystem::is_directory(path, ec))
            return Status::invalid("'" + path + "' is a directory, not a run file");
        // SQLite would read an empty file as an empty database of schema version 0 (a writer
        // opening it makes it a run file, as create() does).
        if (readOnly && std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) == 0 && !ec)
            return Status::invalid("run file '" + path +
                                   "' is empty (0 bytes): its run never wrote anything (the process that "
                                   "created it stopped first?); delete it");
    }
    std::unique_ptr<TraceStore> store(new TraceStore());
    store->m_path = path;
    store->m_readOnly = readOnly;
    int flags = (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(path.c_str(), &store->m_db, flags, nullptr) != SQLITE_OK)
        return sqlError(store->m_db, "opening run file '" + path + "'");
    TS_RETURN_IF_ERROR(configureConnection(store->m_db, readOnly));
    // Touch the schema: this is where a non-database file or a corrupt header is detected.
    TS_ASSIGN_OR_RETURN(int version, userVersion(store->m_db));
    if (readOnly) {
        // Version 1 (one row per slice) is read as it is: migrating needs a writer.
        if (version == 1) {
            store->m_legacySlices = true;
        } else if (version != kSchemaVersion) {
            return Status::unsupported("run file '" + path + "' has schema version " + std::to_string(version) +
                                       " (this build reads 1 and " + std::to_string(kSchemaVersion) +
                                       "); open it once for writing to migrate it");
        }
    } else {
        TS_RETURN_IF_ERROR(migrateSchema(store->m_db));
        TS_RETURN_IF_ERROR(store->prepareWriteStatements());
    }
    return store;
}

TraceStore::~TraceStore() {
    if (m_inBatch) (void)commitBatch();
    m_stmts.reset();
    sqlite3_close_v2(m_db);
}

sqlite3* TraceStore::db() { return m_db; }

Result<int> TraceStore::schemaVersion() { return userVersion(m_db); }

Status TraceStore::prepareWriteStatements() {
    m_stmts = std::make_unique<Statements>();
    TS_RETURN_IF_ERROR(m_stmts->chunk.prepare(m_db, kInsertChunkSql));
    TS_RETURN_IF_ERROR(m_stmts->counter.prepare(m_db, "INSERT INTO counters(rank, name, ts, value) VALUES(?,?,?,?)"));
    TS_RETURN_IF_ERROR(m_stmts->str.prepare(m_db, "INSERT OR REPLACE INTO strings(id, text) VALUES(?,?)"));
    TS_RETURN_IF_ERROR(m_stmts->track.prepare(m_db,
        "INSERT OR REPLACE INTO tracks(id, rank, device, kind, stream_index, name) VALUES(?,?,?,?,?,?)"));
    TS_RETURN_IF_ERROR(m_stmts->stat.prepare(m_db,
        "INSERT INTO stats(name, value) VALUES(?1, ?2) ON CONFLICT(name) DO UPDATE SET value = value + ?2"));
    // Slice ids continue after the largest one in the file (a reopened run keeps appending).
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT id + n FROM slice_chunks ORDER BY id DESC LIMIT 1"));
    if (sqlite3_step(q.s) == SQLITE_ROW) m_nextSliceId = sqlite3_column_int64(q.s, 0);
    return Status::ok();
}

Status TraceStore::exec(const std::string& sql) { return execSql(m_db, sql.c_str()); }

Status TraceStore::checkpoint() {
    if (sqlite3_wal_checkpoint_v2(m_db, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr) != SQLITE_OK)
        return sqlError(m_db, "checkpointing the run file");
    return Status::ok();
}

// ---- run-level rows ------------------------------------------------------------------------

Status TraceStore::setRunInfo(const RunInfo& r) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db,
        "INSERT OR REPLACE INTO run(single, id, name, status, status_reason, created_at, finished_at, node,"
        " host, user, config_json, layout, tags_json, source) VALUES(1,?,?,?,?,?,?,?,?,?,?,?,?,?)"));
    const std::string* fields[] = {&r.id, &r.name, &r.status, &r.statusReason, &r.createdAt, &r.finishedAt,
                                   &r.node, &r.host, &r.user, &r.configJson, &r.layout, &r.tagsJson, &r.source};
    for (int i = 0; i < 13; ++i) bindText(q.s, i + 1, *fields[i]);
    if (sqlite3_step(q.s) != SQLITE_DONE) return sqlError(m_db, "writing run info");
    return Status::ok();
}

Result<RunInfo> TraceStore::runInfo() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db,
        "SELECT id, name, status, status_reason, created_at, finished_at, node, host, user, config_json,"
        " layout, tags_json, source FROM run WHERE single = 1"));
    int rc = sqlite3_step(q.s);
    if (rc == SQLITE_DONE) return Status::notFound("run file '" + m_path + "' has no run info row");
    if (rc != SQLITE_ROW) return sqlError(m_db, "reading run info");
    RunInfo r;
    std::string* fields[] = {&r.id, &r.name, &r.status, &r.statusReason, &r.createdAt, &r.finishedAt,
                             &r.node, &r.host, &r.user, &r.configJson, &r.layout, &r.tagsJson, &r.source};
    for (int i = 0; i < 13; ++i) *fields[i] = columnText(q.s, i);
    return r;
}

Status TraceStore::setRunStatus(const std::string& status, const std::string& reason) {
    static const char* kValid[] = {"running", "completed", "failed", "cancelled"};
    bool ok = false;
    for (const char* v : kValid) ok = ok || status == v;
    if (!ok) return Status::invalid("run status '" + status + "' is not one of running|completed|failed|cancelled");
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db,
        "INSERT INTO run(single, status, status_reason, finished_at) VALUES(1, ?1, ?2, ?3)"
        " ON CONFLICT(single) DO UPDATE SET status = ?1, status_reason = ?2, finished_at = ?3"));
    bindText(q.s, 1, status);
    bindText(q.s, 2, reason);
    bindText(q.s, 3, status == "running" ? std::string() : isoNowUtc());
    if (sqlite3_step(q.s) != SQLITE_DONE) return sqlError(m_db, "writing run status");
    return Status::ok();
}

Status TraceStore::appendStepMetrics(const StepMetrics& m) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db,
        "INSERT INTO step_metrics(step, loss, step_time_s, tokens_per_s, model_tflops, grad_norm, lr,"
        " peak_memory_bytes, ts) VALUES(?,?,?,?,?,?,?,?,?)"));
    sqlite3_bind_int(q.s, 1, m.step);
    sqlite3_bind_double(q.s, 2, m.loss);
    sqlite3_bind_double(q.s, 3, m.stepTimeS);
    sqlite3_bind_double(q.s, 4, m.tokensPerS);
    sqlite3_bind_double(q.s, 5, m.modelTflops);
    sqlite3_bind_double(q.s, 6, m.gradNorm);
    sqlite3_bind_double(q.s, 7, m.lr);
    sqlite3_bind_int64(q.s, 8, m.peakMemoryBytes);
    sqlite3_bind_int64(q.s, 9, m.tsNs ? m.tsNs : monotonicNs());
    if (sqlite3_step(q.s) != SQLITE_DONE) return sqlError(m_db, "writing step metrics");
    return Status::ok();
}

Result<std::vector<StepMetrics>> TraceStore::stepMetrics() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db,
        "SELECT step, loss, step_time_s, tokens_per_s, model_tflops, grad_norm, lr, peak_memory_bytes, ts"
        " FROM step_metrics ORDER BY step, rowid"));
    std::vector<StepMetrics> out;
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
        StepMetrics m;
        m.step = sqlite3_column_int(q.s, 0);
        m.loss = sqlite3_column_double(q.s, 1);
        m.stepTimeS = sqlite3_column_double(q.s, 2);
        m.tokensPerS = sqlite3_column_double(q.s, 3);
        m.modelTflops = sqlite3_column_double(q.s, 4);
        m.gradNorm = sqlite3_column_double(q.s, 5);
        m.lr = sqlite3_column_double(q.s, 6);
        m.peakMemoryBytes = sqlite3_column_int64(q.s, 7);
        m.tsNs = sqlite3_column_int64(q.s, 8);
        out.push_back(m);
    }
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading step metrics");
    return out;
}

Status TraceStore::appendLog(const std::string& level, const std::string& text) {
    return appendLog(monotonicNs(), level, text);
}

Status TraceStore::appendLog(int64_t tsNs, const std::string& level, const std::string& text) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "INSERT INTO logs(ts, level, text) VALUES(?,?,?)"));
    sqlite3_bind_int64(q.s, 1, tsNs);
    bindText(q.s, 2, level);
    bindText(q.s, 3, text);
    if (sqlite3_step(q.s) != SQLITE_DONE) return sqlError(m_db, "writing a log line");
    return Status::ok();
}

Result<std::vector<LogLine>> TraceStore::logs() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT ts, level, text FROM logs ORDER BY rowid"));
    std::vector<LogLine> out;
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW)
        out.push_back({sqlite3_column_int64(q.s, 0), columnText(q.s, 1), columnText(q.s, 2)});
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading logs");
    return out;
}

Status TraceStore::setMetadata(const std::string& key, const std::string& value) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "INSERT OR REPLACE INTO metadata(key, value) VALUES(?,?)"));
    bindText(q.s, 1, key);
    bindText(q.s, 2, value);
    if (sqlite3_step(q.s) != SQLITE_DONE) return sqlError(m_db, "writing metadata '" + key + "'");
    return Status::ok();
}

Result<std::optional<std::string>> TraceStore::metadata(const std::string& key) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT value FROM metadata WHERE key = ?"));
    bindText(q.s, 1, key);
    int rc = sqlite3_step(q.s);
    if (rc == SQLITE_ROW) return std::optional<std::string>(columnText(q.s, 0));
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading metadata '" + key + "'");
    return std::optional<std::string>();
}

Result<std::map<std::string, std::string>> TraceStore::allMetadata() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT key, value FROM metadata"));
    std::map<std::string, std::string> out;
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) out[columnText(q.s, 0)] = columnText(q.s, 1);
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading metadata");
    return out;
}

Status TraceStore::addStat(const std::string& name, int64_t delta) {
    sqlite3_stmt* s = nullptr;
    Stmt local;
    if (m_stmts) {
        s = m_stmts->stat.s;
    } else {
        TS_RETURN_IF_ERROR(local.prepare(m_db,
            "INSERT INTO stats(name, value) VALUES(?1, ?2) ON CONFLICT(name) DO UPDATE SET value = value + ?2"));
        s = local.s;
    }
    bindText(s, 1, name);
    sqlite3_bind_int64(s, 2, delta);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return sqlError(m_db, "writing stat '" + name + "'");
    return Status::ok();
}

Result<std::map<std::string, int64_t>> TraceStore::stats() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT name, value FROM stats"));
    std::map<std::string, int64_t> out;
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) out[columnText(q.s, 0)] = sqlite3_column_int64(q.s, 1);
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading stats");
    return out;
}

// ---- trace rows: writer --------------------------------------------------------------------

Status TraceStore::beginBatch() {
    if (m_inBatch) return Status::ok();
    TS_RETURN_IF_ERROR(execSql(m_db, "BEGIN"));
    m_inBatch = true;
    return Status::ok();
}

Status TraceStore::commitBatch() {
    if (!m_inBatch) return Status::ok();
    m_inBatch = false;
    return execSql(m_db, "COMMIT");
}

Status TraceStore::rollbackBatch() {
    if (!m_inBatch) return Status::ok();
    m_inBatch = false;
    return execSql(m_db, "ROLLBACK");
}

Status TraceStore::putString(uint32_t id, std::string_view text) {
    if (!m_stmts) return Status::invalid("run file '" + m_path + "' is open read-only");
    sqlite3_stmt* s = m_stmts->str.s;
    sqlite3_bind_int64(s, 1, id);
    bindText(s, 2, text);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return sqlError(m_db, "writing an interned string");
    return Status::ok();
}

Status TraceStore::putTrack(uint32_t id, const trace::TrackDesc& d) {
    if (!m_stmts) return Status::invalid("run file '" + m_path + "' is open read-only");
    sqlite3_stmt* s = m_stmts->track.s;
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int(s, 2, d.rank);
    sqlite3_bind_int(s, 3, d.device);
    sqlite3_bind_text(s, 4, trace::trackKindName(d.kind), -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 5, d.streamIndex);
    bindText(s, 6, d.name);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return sqlError(m_db, "writing a track");
    return Status::ok();
}

Status TraceStore::putSlices(const trace::Slice* slices, size_t count) {
    if (!m_stmts) return Status::invalid("run file '" + m_path + "' is open read-only");
    if (count == 0) return Status::ok();
    codec::orderByTrackAndTs(slices, count, m_stmts->order);
    return writeChunks(m_db, m_stmts->chunk.s, m_stmts->order.data(), count, m_nextSliceId, m_stmts->blob);
}

Status TraceStore::putSlice(const trace::Slice& x) { return putSlices(&x, 1); }

Status TraceStore::putCounter(const trace::Counter& c) {
    if (!m_stmts) return Status::invalid("run file '" + m_path + "' is open read-only");
    sqlite3_stmt* s = m_stmts->counter.s;
    sqlite3_bind_int(s, 1, c.rank);
    sqlite3_bind_int64(s, 2, c.name);
    sqlite3_bind_int64(s, 3, c.tsNs);
    sqlite3_bind_double(s, 4, c.value);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return sqlError(m_db, "writing a counter");
    return Status::ok();
}

// ---- trace rows: reader --------------------------------------------------------------------

namespace {
trace::TrackKind kindFromName(const std::string& n) {
    for (int k = 0; k <= int(trace::TrackKind::Copy); ++k)
        if (n == trace::trackKindName(trace::TrackKind(k))) return trace::TrackKind(k);
    return trace::TrackKind::HostThread;
}
}  // namespace

Result<std::vector<TrackRow>> TraceStore::tracks() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT id, rank, device, kind, stream_index, name FROM tracks ORDER BY id"));
    std::vector<TrackRow> out;
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
        TrackRow t;
        t.id = uint32_t(sqlite3_column_int64(q.s, 0));
        t.rank = sqlite3_column_int(q.s, 1);
        t.device = sqlite3_column_int(q.s, 2);
        t.kind = kindFromName(columnText(q.s, 3));
        t.streamIndex = sqlite3_column_int(q.s, 4);
        t.name = columnText(q.s, 5);
        out.push_back(std::move(t));
    }
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading tracks");
    return out;
}

Result<std::vector<std::string>> TraceStore::strings() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT id, text FROM strings ORDER BY id"));
    // Ids are dense (the writers number them 1, 2, ...); the table is indexed by id, so a
    // damaged id must not size it: ids beyond twice the row count (+ slack) are refused.
    Stmt c;
    TS_RETURN_IF_ERROR(c.prepare(m_db, "SELECT count(*), coalesce(max(id), 0) FROM strings"));
    if (sqlite3_step(c.s) != SQLITE_ROW) return sqlError(m_db, "reading strings of run file '" + m_path + "'");
    const int64_t rows = sqlite3_column_int64(c.s, 0), maxId = sqlite3_column_int64(c.s, 1);
    if (maxId > 2 * rows + 65536 || maxId > (int64_t(1) << 31))
        return Status::io("run file '" + m_path + "' is damaged: strings.id " + std::to_string(maxId) +
                          " is far beyond the " + std::to_string(rows) + " strings it holds");
    std::vector<std::string> out(size_t(std::max<int64_t>(maxId, 0)) + 1);
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
        int64_t id = sqlite3_column_int64(q.s, 0);
        if (id <= 0 || id > maxId) continue;
        out[size_t(id)] = columnText(q.s, 1);
    }
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading strings");
    return out;
}

Result<uint32_t> TraceStore::stringId(std::string_view text) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT id FROM strings WHERE text = ? LIMIT 1"));
    bindText(q.s, 1, text);
    int rc = sqlite3_step(q.s);
    if (rc == SQLITE_ROW) return uint32_t(sqlite3_column_int64(q.s, 0));
    if (rc != SQLITE_DONE) return sqlError(m_db, "looking up a string");
    return uint32_t(0);
}

namespace {
using SliceFn = std::function<bool(const trace::Slice&)>;

// Schema v1 files opened read-only: one row per slice, clustered on (track, ts, id).
Status forEachLegacyRow(sqlite3* db, const std::vector<uint32_t>& trackIds, const SliceFilter& f, const SliceFn& fn) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(db,
        "SELECT ts, dur, name, category, step, microbatch, chunk, layer, correlation, bytes, flops, grp, depth"
        " FROM slices WHERE track = ?1 AND ts >= ?2 AND ts < ?3 ORDER BY ts, id"));
    trace::Slice s;
    for (uint32_t track : trackIds) {
        sqlite3_bind_int64(q.s, 1, track);
        sqlite3_bind_int64(q.s, 2, f.fromNs);
        sqlite3_bind_int64(q.s, 3, f.toNs);
        s.track = track;
        int rc;
        while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
            readV1SliceColumns(q.s, 0, s);
            if (!fn(s)) return Status::ok();
        }
        if (rc != SQLITE_DONE) return sqlError(db, "reading slices");
        sqlite3_reset(q.s);
    }
    return Status::ok();
}

// Schema v2: each track's chunks in (ts_first, id) order. Chunks whose [ts_first, ts_last]
// ranges overlap form a group whose slices are merged by (ts, id); a lone chunk is already in
// order and is emitted as decoded.
Status forEachChunkedSlice(sqlite3* db, const std::string& path, const std::vector<uint32_t>& trackIds,
                           const SliceFilter& f, const SliceFn& fn) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(db,
        "SELECT id, ts_first, ts_last, n, data FROM slice_chunks"
        " WHERE track = ?1 AND ts_first < ?3 AND ts_last >= ?2 ORDER BY ts_first, id"));
    std::vector<trace::Slice> buf;   // the current group's slices, chunk after chunk
    std::vector<int64_t> ids;        // their ids (filled for groups of several chunks)
    std::vector<uint32_t> perm;
    bool stopped = false;
    // Emits the group in (ts, id) order; returns false once fn asked to stop.
    auto emit = [&](int chunks) {
        if (chunks > 1) {
            perm.resize(buf.size());
            for (uint32_t i = 0; i < perm.size(); ++i) perm[i] = i;
            std::sort(perm.begin(), perm.end(), [&](uint32_t a, uint32_t b) {
                return buf[a].startNs != buf[b].startNs ? buf[a].startNs < buf[b].startNs : ids[a] < ids[b];
            });
            for (uint32_t i : perm) {
                const trace::Slice& x = buf[i];
                if (x.startNs >= f.fromNs && x.startNs < f.toNs && !fn(x)) return false;
            }
        } else {
            for (const trace::Slice& x : buf)
                if (x.startNs >= f.fromNs && x.startNs < f.toNs && !fn(x)) return false;
        }
        return true;
    };
    for (uint32_t track : trackIds) {
        sqlite3_bind_int64(q.s, 1, track);
        sqlite3_bind_int64(q.s, 2, f.fromNs);
        sqlite3_bind_int64(q.s, 3, f.toNs);
        buf.clear();
        ids.clear();
        int chunks = 0;
        int64_t groupLast = INT64_MIN;
        int rc;
        while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
            int64_t id = sqlite3_column_int64(q.s, 0);
            int64_t tsFirst = sqlite3_column_int64(q.s, 1);
            int64_t tsLast = sqlite3_column_int64(q.s, 2);
            int64_t n = sqlite3_column_int64(q.s, 3);
            const void* data = sqlite3_column_blob(q.s, 4);
            size_t size = size_t(sqlite3_column_bytes(q.s, 4));
            // Equal timestamps merge too: order among them is by id, across chunks.
            if (chunks > 0 && tsFirst > groupLast) {
                if (!emit(chunks)) {
                    stopped = true;
                    break;
                }
                buf.clear();
                ids.clear();
                chunks = 0;
            }
            if (n < 1 || n > int64_t(codec::kMaxChunkSlices))
                return Status::io("run file '" + path + "' is damaged: slice_chunks.n of chunk " + std::to_string(id) +
                                  " is " + std::to_string(n) + ", outside [1, " +
                                  std::to_string(codec::kMaxChunkSlices) + "]");
            if (!data ||
                !codec::decodeChunk(static_cast<const uint8_t*>(data), size, size_t(n), track, tsFirst, buf))
                return Status::io("run file '" + path + "': slice chunk " + std::to_string(id) + " of track " +
                                  std::to_string(track) +
                                  " is corrupt (slice_chunks.data does not decode; run file damaged or written "
                                  "by an incompatible build)");
            for (int64_t k = 0; k < n; ++k) ids.push_back(id + k);
            groupLast = chunks == 0 ? tsLast : std::max(groupLast, tsLast);
            ++chunks;
        }
        if (stopped) return Status::ok();
        if (rc != SQLITE_DONE) return sqlError(db, "reading slices");
        sqlite3_reset(q.s);
        if (chunks > 0 && !emit(chunks)) return Status::ok();
    }
    return Status::ok();
}
}  // namespace

Status TraceStore::forEachSlice(const SliceFilter& f, const std::function<bool(const trace::Slice&)>& fn) {
    std::vector<uint32_t> trackIds;
    if (f.track) {
        trackIds.push_back(*f.track);
    } else {
        TS_ASSIGN_OR_RETURN(auto all, tracks());
        for (auto& t : all) {
            if (f.rank && t.rank != *f.rank) continue;
            if (f.trackKind && t.kind != *f.trackKind) continue;
            trackIds.push_back(t.id);
        }
    }
    return m_legacySlices ? forEachLegacyRow(m_db, trackIds, f, fn) : forEachChunkedSlice(m_db, m_path, trackIds, f, fn);
}

// Slice counts size allocations (the analyses reserve them), so a chunk's n is checked first:
// the writer never packs more than codec::kMaxChunkSlices slices into one chunk.
Result<int64_t> TraceStore::sliceCount() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, m_legacySlices
        ? "SELECT count(*), NULL FROM slices"
        : "SELECT coalesce(sum(n), 0), min(CASE WHEN n < 1 OR n > ?1 THEN id END) FROM slice_chunks"));
    if (!m_legacySlices) sqlite3_bind_int64(q.s, 1, int64_t(codec::kMaxChunkSlices));
    if (sqlite3_step(q.s) != SQLITE_ROW) return sqlError(m_db, "counting the slices of run file '" + m_path + "'");
    if (sqlite3_column_type(q.s, 1) != SQLITE_NULL)
        return badChunkCount(sqlite3_column_int64(q.s, 1));
    return sqlite3_column_int64(q.s, 0);
}

Result<int64_t> TraceStore::sliceCount(int rank) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, m_legacySlices
        ? "SELECT count(*), NULL FROM slices WHERE track IN (SELECT id FROM tracks WHERE rank = ?2)"
        : "SELECT coalesce(sum(n), 0), min(CASE WHEN n < 1 OR n > ?1 THEN id END)"
          " FROM slice_chunks WHERE track IN (SELECT id FROM tracks WHERE rank = ?2)"));
    if (!m_legacySlices) sqlite3_bind_int64(q.s, 1, int64_t(codec::kMaxChunkSlices));
    sqlite3_bind_int(q.s, 2, rank);
    if (sqlite3_step(q.s) != SQLITE_ROW) return sqlError(m_db, "counting a rank's slices in run file '" + m_path + "'");
    if (sqlite3_column_type(q.s, 1) != SQLITE_NULL)
        return badChunkCount(sqlite3_column_int64(q.s, 1));
    return sqlite3_column_int64(q.s, 0);
}

Status TraceStore::badChunkCount(int64_t chunkId) {
    Stmt q;
    int64_t n = 0;
    if (q.prepare(m_db, "SELECT n FROM slice_chunks WHERE id = ?")) {
        sqlite3_bind_int64(q.s, 1, chunkId);
        if (sqlite3_step(q.s) == SQLITE_ROW) n = sqlite3_column_int64(q.s, 0);
    }
    return Status::io("run file '" + m_path + "' is damaged: slice_chunks.n of chunk " + std::to_string(chunkId) +
                      " is " + std::to_string(n) + ", outside [1, " + std::to_string(codec::kMaxChunkSlices) + "]");
}

Result<uint64_t> TraceStore::maxCorrelation() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, m_legacySlices ? "SELECT coalesce(max(correlation), 0) FROM slices"
                                                      : "SELECT coalesce(max(max_correlation), 0) FROM slice_chunks"));
    if (sqlite3_step(q.s) != SQLITE_ROW) return sqlError(m_db, "reading the largest correlation id");
    return uint64_t(sqlite3_column_int64(q.s, 0));
}

Result<std::vector<trace::Counter>> TraceStore::counters(int rank) {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, rank < 0
        ? "SELECT rank, name, ts, value FROM counters ORDER BY rank, name, ts"
        : "SELECT rank, name, ts, value FROM counters WHERE rank = ? ORDER BY rank, name, ts"));
    if (rank >= 0) sqlite3_bind_int(q.s, 1, rank);
    std::vector<trace::Counter> out;
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) {
        trace::Counter c;
        c.rank = sqlite3_column_int(q.s, 0);
        c.name = uint32_t(sqlite3_column_int64(q.s, 1));
        c.tsNs = sqlite3_column_int64(q.s, 2);
        c.value = sqlite3_column_double(q.s, 3);
        out.push_back(c);
    }
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading counters");
    return out;
}

Result<std::vector<int>> TraceStore::ranks() {
    Stmt q;
    TS_RETURN_IF_ERROR(q.prepare(m_db, "SELECT DISTINCT rank FROM tracks ORDER BY rank"));
    std::vector<int> out;
    int rc;
    while ((rc = sqlite3_step(q.s)) == SQLITE_ROW) out.push_back(sqlite3_column_int(q.s, 0));
    if (rc != SQLITE_DONE) return sqlError(m_db, "reading ranks");
    return out;
}

}  // namespace ts::profiler
