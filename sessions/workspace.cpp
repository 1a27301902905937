// Workspace of runs: run files under runs/, an index.sqlite cache rebuilt from them.
#include "sessions/workspace.h"

#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>

#include "common/json_text.h"
#include "common/text.h"
#include "engine/config/knobs.h"
#include "profiler/store.h"

namespace ts::sessions {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// v2: keyed by path, not id: two files may hold the same run id (a copied file), and both are
// listed; commands that name a run by id then refuse the ambiguity (findRun).
constexpr int kIndexVersion = 2;

// Owning handle of one index connection (opened per operation so that several processes can
// share a workspace; SQLite locks the file).
struct Db {
    sqlite3* db = nullptr;
    Db() = default;
    Db(Db&& o) noexcept : db(o.db) { o.db = nullptr; }
    Db& operator=(Db&& o) noexcept {
        std::swap(db, o.db);
        return *this;
    }
    Db(const Db&) = delete;
    Db& operator=(const Db&) = delete;
    ~Db() { if (db) sqlite3_close(db); }
};

Status sqlError(sqlite3* db, const std::string& what) {
    return Status::io(what + ": " + (db ? sqlite3_errmsg(db) : "out of memory"));
}

Status execSql(sqlite3* db, const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
        std::string msg = err ? err : "unknown error";
        sqlite3_free(err);
        return Status::io("workspace index: " + msg);
    }
    return Status::ok();
}

int64_t fileMtimeNs(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return -1;
    return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// A run file changes through its WAL before the main file is checkpointed.
int64_t runMtimeNs(const std::string& path) {
    int64_t a = fileMtimeNs(path);
    if (a < 0) return -1;
    return std::max({a, fileMtimeNs(path + "-wal"), int64_t(0)});
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string columnText(sqlite3_stmt* st, int i) {
    const unsigned char* t = sqlite3_column_text(st, i);
    return t ? reinterpret_cast<const char*>(t) : "";
}

std::vector<std::string> parseTags(const std::string& text) {
    std::vector<std::string> out;
    json j = json::parse(text, nullptr, false);
    if (j.is_array())
        for (auto& e : j)
            if (e.is_string()) out.push_back(sanitizeUtf8(e.get<std::string>()));
    return out;
}

std::string slug(const std::string& name) {
    std::string out;
    for (char c : name) {
        if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') out += c;
        else if (!out.empty() && out.back() != '-') out += '-';
        if (out.size() >= 24) break;
    }
    while (!out.empty() && out.back() == '-') out.pop_back();
    return out;
}

Result<Db> openIndex(const std::string& path) {
    Db d;
    if (sqlite3_open_v2(path.c_str(), &d.db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK)
        return sqlError(d.db, "cannot open workspace index " + path);
    sqlite3_busy_timeout(d.db, 10000);
    return d;
}

// SQLite's answer for a file that is not a database or is damaged.
bool isDamaged(int rc) {
    rc &= 0xff;  // primary code of an extended result code
    return rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT;
}

// The index is a cache: a damaged one is moved aside (kept as index.sqlite.broken for a bug
// report) and a fresh one takes its place; listRuns() refills it from the run files.
Status moveIndexAside(const std::string& path) {
    std::error_code ec;
    fs::rename(path, path + ".broken", ec);
    if (ec) fs::remove(path, ec);
    if (ec) return Status::io("the workspace index " + path + " is damaged and cannot be moved aside: " + ec.message());
    for (const char* suffix : {"-wal", "-shm", "-journal"}) fs::remove(path + suffix, ec);
    std::fprintf(stderr, "trainscope: warning: the workspace index %s was not a readable database; moved it to "
                         "%s.broken and rebuilt it from the run files\n",
                 path.c_str(), path.c_str());
    return Status::ok();
}

RunSummary rowToSummary(sqlite3_stmt* st) {
    RunSummary s;
    int i = 0;
    s.id = columnText(st, i++);
    s.path = columnText(st, i++);
    s.name = columnText(st, i++);
    s.createdAt = columnText(st, i++);
    s.finishedAt = columnText(st, i++);
    s.node = columnText(st, i++);
    s.layout = columnText(st, i++);
    s.keyKnobs = columnText(st, i++);
    s.stepTimeS = sqlite3_column_double(st, i++);
    s.tokensPerS = sqlite3_column_double(st, i++);
    s.mfu = sqlite3_column_double(st, i++);
    s.peakMemoryBytes = sqlite3_column_int64(st, i++);
    s.steps = sqlite3_column_int(st, i++);
    s.lastLoss = sqlite3_column_double(st, i++);
    s.status = columnText(st, i++);
    s.statusReason = columnText(st, i++);
    s.tags = parseTags(columnText(st, i++));
    return s;
}

// A file under runs/ that is not a readable run file, as the runs list shows it.
RunSummary brokenRunSummary(const std::string& path, const Status& why) {
    RunSummary s;
    s.path = path;
    s.id = sanitizeUtf8(fs::path(path).stem().string());
    s.status = kBrokenStatus;
    s.statusReason = sanitizeUtf8(why.message());
    return s;
}

constexpr const char* kSelectColumns =
    "id, path, name, created_at, finished_at, node, layout, key_knobs, step_time_s, tokens_per_s, "
    "mfu, peak_memory_bytes, steps, last_loss, status, status_reason, tags, mtime_ns";

}  // namespace

// ---- free helpers -------------------------------------------------------------------------

json RunSummary::toJson() const {
    return {{"id", id}, {"name", name}, {"created_at", createdAt}, {"finished_at", finishedAt},
            {"node", node}, {"layout", layout}, {"key_knobs", keyKnobs},
            {"step_time_s", stepTimeS}, {"tokens_per_s", tokensPerS}, {"mfu", mfu},
            {"peak_memory_bytes", peakMemoryBytes}, {"steps", steps}, {"last_loss", lastLoss},
            {"status", status}, {"status_reason", statusReason}, {"tags", tags}, {"path", path}};
}

std::string isoTimeUtcNow() {
    std::time_t t = std::time(nullptr);
    std::tm tm {};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string makeRunId(const std::string& name) {
    auto now = std::chrono::system_clock::now();
    std::time_t t = std::chrono::system_clock::to_time_t(now);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm tm {};
    gmtime_r(&t, &tm);
    char buf[40];
    std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%S", &tm);
    // Millisecond digits keep ids from one second in creation order; the random suffix keeps
    // ids from several processes apart.
    static thread_local std::mt19937_64 rng(std::random_device{}() ^ uint64_t(::getpid()) << 32);
    char suffix[16];
    std::snprintf(suffix, sizeof suffix, "%03dZ-%06x", int(ms), unsigned(rng() & 0xFFFFFF));
    std::string id = std::string(buf) + suffix;
    std::string s = slug(name);
    if (!s.empty()) id += "-" + s;
    return id;
}

bool isValidRunId(std::string_view id) {
    if (id.empty() || id.size() > kMaxRunIdLength || id.front() == '.' || id.front() == '-') return false;
    return std::all_of(id.begin(), id.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
               c == '-';
    });
}

namespace {

std::string readSmallFile(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return "";
    char buf[1024];
    size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    std::string s(buf, n);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

std::string thisHost() {
    char buf[256] = {0};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
}

// /proc/PID/stat: "pid (comm) state ppid ... starttime(22) ...". comm may hold spaces and
// parentheses, so fields are counted after the last ')'. False when the process is gone.
bool procStat(int64_t pid, char* state, std::string* startTime) {
    std::string s = readSmallFile("/proc/" + std::to_string(pid) + "/stat");
    auto close = s.rfind(')');
    if (s.empty() || close == std::string::npos) return false;
    std::vector<std::string> fields;
    size_t i = close + 1;
    while (i < s.size()) {
        while (i < s.size() && s[i] == ' ') ++i;
        size_t j = s.find(' ', i);
        if (j == std::string::npos) j = s.size();
        if (j > i) fields.push_back(s.substr(i, j - i));
        i = j;
    }
    if (fields.size() < 20) return false;
    *state = fields[0].empty() ? '?' : fields[0][0];  // field 3
    *startTime = fields[19];                           // field 22
    return true;
}

}  // namespace

WriterProcess writerProcessOf(int64_t pid) {
    WriterProcess w;
    char state = '?';
    std::string start;
    if (pid > 0 && procStat(pid, &state, &start)) {
        w.pid = pid;
        w.startTime = start;
    } else if (pid > 0 && ::kill(pid_t(pid), 0) == 0) {
        w.pid = pid;  // no /proc: the pid alone
    }
    w.bootId = readSmallFile("/proc/sys/kernel/random/boot_id");
    w.host = thisHost();
    return w;
}

WriterProcess currentWriterProcess() { return writerProcessOf(int64_t(::getpid())); }

std::vector<std::pair<std::string, std::string>> writerProcessMetadata() {
    WriterProcess w = currentWriterProcess();
    return {{"writer_pid", std::to_string(w.pid)},
            {"writer_start", w.startTime},
            {"writer_boot_id", w.bootId},
            {"writer_host", w.host}};
}

WriterState writerState(const WriterProcess& r) {
    if (r.pid <= 0) return WriterState::Unknown;
    if (!r.host.empty() && r.host != thisHost()) return WriterState::Unknown;
    const std::string boot = readSmallFile("/proc/sys/kernel/random/boot_id");
    if (!r.bootId.empty() && !boot.empty() && r.bootId != boot) return WriterState::Gone;
    char state = '?';
    std::string start;
    if (procStat(r.pid, &state, &start)) {
        if (state == 'Z' || state == 'X') return WriterState::Gone;  // exited, not yet reaped
        if (!r.startTime.empty() && start != r.startTime) return WriterState::Gone;  // pid reused
        return WriterState::Alive;
    }
    // No /proc entry we could read (no /proc, or hidepid): ask the kernel about the pid alone.
    if (::kill(pid_t(r.pid), 0) == 0) return WriterState::Alive;
    return errno == ESRCH ? WriterState::Gone : WriterState::Unknown;
}

Result<std::vector<std::string>> finalizeStaleRuns(Workspace& ws) {
    std::vector<std::string> done;
    TS_ASSIGN_OR_RETURN(auto runs, ws.listRuns());
    for (const auto& run : runs) {
        if (run.status != "running") continue;
        WriterProcess recorded;
        {
            auto store = profiler::TraceStore::open(run.path, /*readOnly=*/true);
            if (!store) continue;
            auto meta = (*store)->allMetadata();
            if (!meta) continue;
            auto get = [&](const char* k) {
                auto it = meta->find(k);
                return it == meta->end() ? std::string() : it->second;
            };
            recorded.pid = std::atoll(get("writer_pid").c_str());
            recorded.startTime = get("writer_start");
            recorded.bootId = get("writer_boot_id");
            recorded.host = get("writer_host");
        }
        if (writerState(recorded) != WriterState::Gone) continue;
        // The writer is gone, so nothing else writes this file now; re-read the status under
        // the write connection (it may have finished between the listing and the check).
        auto store = profiler::TraceStore::open(run.path, /*readOnly=*/false);
        if (!store) continue;
        auto info = (*store)->runInfo();
        if (!info || info->status != "running") continue;
        info->status = "failed";
        info->statusReason = kStaleRunReason;
        if (info->finishedAt.empty()) info->finishedAt = isoTimeUtcNow();
        if (!(*store)->setRunInfo(*info)) continue;
        (void)(*store)->appendLog("error", std::string("trainscope: ") + kStaleRunReason + " (process " +
                                               std::to_string(recorded.pid) + " is gone; noticed at " +
                                               isoTimeUtcNow() + ")");
        store->reset();
        (void)ws.indexRun(run.path);
        done.push_back(run.id);
    }
    return done;
}

std::string keyKnobsOfConfig(const json& configJson) {
    if (!configJson.is_object()) return "";
    auto cfg = engine::configFromJson(configJson);
    if (!cfg) return "";
    static const char* kGroups[] = {"dp_comm", "tp_pp_comm", "fusion", "precision", "recompute", "moe", "misc"};
    const engine::Config defaults;
    std::string out;
    for (const auto& k : engine::knobRegistry()) {
        if (std::find(std::begin(kGroups), std::end(kGroups), k.group) == std::end(kGroups)) continue;
        json v = k.get(*cfg), d = k.get(defaults);
        if (v == d) continue;
        if (!out.empty()) out += ' ';
        if (v.is_boolean()) out += v.get<bool>() ? k.name : k.name + "=false";
        else out += k.name + "=" + engine::knobValueText(k, *cfg);
    }
    return out;
}

Result<RunSummary> summarizeRunFile(const std::string& runFilePath) {
    std::error_code ec;
    std::string path = fs::absolute(runFilePath, ec).lexically_normal().string();
    if (!fs::is_regular_file(path, ec)) return Status::notFound("run file " + path + " does not exist");
    auto store = profiler::TraceStore::open(path, /*readOnly=*/true);
    if (!store) return store.status().withContext("reading run file " + path);
    RunSummary s;
    s.path = path;
    s.id = sanitizeUtf8(fs::path(path).stem().string());
    s.status = "unknown";
    auto info = (*store)->runInfo();
    if (info) {
        // Text from the file is made valid UTF-8 here (it is written as JSON and to terminals).
        const auto& r = *info;
        if (!r.id.empty()) s.id = sanitizeUtf8(r.id);
        s.name = sanitizeUtf8(r.name);
        s.createdAt = sanitizeUtf8(r.createdAt);
        s.finishedAt = sanitizeUtf8(r.finishedAt);
        s.node = sanitizeUtf8(r.node.empty() ? r.host : r.node);
        s.layout = sanitizeUtf8(r.layout);
        s.status = r.status.empty() ? "unknown" : sanitizeUtf8(r.status);
        s.statusReason = sanitizeUtf8(r.statusReason);
        s.tags = parseTags(r.tagsJson);
        s.keyKnobs = keyKnobsOfConfig(json::parse(r.configJson, nullptr, false));
    } else if (info.status().code() != ErrorCode::NotFound) {
        return info.status().withContext("reading run file " + path);
    }
    auto steps = (*store)->stepMetrics();
    if (steps && !steps->empty()) {
        const auto& v = *steps;
        // The first step carries warm-up (allocation, first-touch); leave it out when others exist.
        size_t from = v.size() > 1 ? 1 : 0;
        std::vector<double> times, tokens, tflops;
        for (size_t i = from; i < v.size(); ++i) {
            times.push_back(v[i].stepTimeS);
            tokens.push_back(v[i].tokensPerS);
            tflops.push_back(v[i].modelTflops);
        }
        for (const auto& m : v) s.peakMemoryBytes = std::max(s.peakMemoryBytes, m.peakMemoryBytes);
        s.stepTimeS = median(times);
        s.tokensPerS = median(tokens);
        s.steps = int(v.size());
        s.lastLoss = v.back().loss;
    }
    // MFU = achieved model TFLOP/s per device / peak TFLOP/s per device. step_metrics'
    // modelTflops is per device (Megatron's "TFLOP/s/GPU": F / (t * 1e12 * world)); the run
    // writes its devices' peak as metadata "peak_tflops" when it knows it. A run (or importer)
    // may instead write "mfu" directly. Unknown stays 0.
    auto mfu = (*store)->metadata("mfu");
    auto peak = (*store)->metadata("peak_tflops");
    if (mfu && mfu->has_value()) {
        s.mfu = std::atof((*mfu)->c_str());
    } else if (peak && peak->has_value() && steps && !steps->empty()) {
        const double p = std::atof((*peak)->c_str());
        std::vector<double> tflops;
        for (size_t i = steps->size() > 1 ? 1 : 0; i < steps->size(); ++i) tflops.push_back((*steps)[i].modelTflops);
        if (p > 0) s.mfu = median(tflops) / p;
    }
    return s;
}

// ---- Workspace ------------------------------------------------------------------------------

struct Workspace::SummaryCache {
    struct Entry {
        int64_t mtimeNs = 0;
        std::chrono::steady_clock::time_point readAt;
        RunSummary summary;
    };
    std::mutex mu;
    std::map<std::string, Entry> byPath;
};

Workspace::Workspace(Workspace&& o) noexcept
    : m_dir(std::move(o.m_dir)), m_mutex(std::move(o.m_mutex)), m_cache(std::move(o.m_cache)) {}
Workspace& Workspace::operator=(Workspace&& o) noexcept {
    m_dir = std::move(o.m_dir);
    m_mutex = std::move(o.m_mutex);
    m_cache = std::move(o.m_cache);
    return *this;
}

Result<RunSummary> Workspace::cachedSummary(const std::string& path, int64_t mtimeNs) {
    if (!m_cache) return summarizeRunFile(path);
    const auto now = std::chrono::steady_clock::now();
    {
        std::lock_guard lock(m_cache->mu);
        auto it = m_cache->byPath.find(path);
        // A running run changes its file every step: its summary is re-read at most twice a
        // second however often clients list (they get live progress from the agent anyway).
        if (it != m_cache->byPath.end() &&
            (it->second.mtimeNs == mtimeNs ||
             (it->second.summary.status == "running" && now - it->second.readAt < std::chrono::milliseconds(500))))
            return it->second.summary;
    }
    TS_ASSIGN_OR_RETURN(RunSummary s, summarizeRunFile(path));
    std::lock_guard lock(m_cache->mu);
    if (m_cache->byPath.size() > 100000) m_cache->byPath.clear();  // bounded
    m_cache->byPath[path] = {mtimeNs, now, s};
    return s;
}

std::string Workspace::defaultDir() {
    if (const char* w = std::getenv("TRAINSCOPE_WORKSPACE"); w && *w) return w;
    if (const char* x = std::getenv("XDG_DATA_HOME"); x && *x) return std::string(x) + "/trainscope";
    if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/share/trainscope";
    return ".trainscope";
}

Result<Workspace> Workspace::open(const std::string& dirIn) {
    std::string dir = dirIn.empty() ? defaultDir() : dirIn;
    std::error_code ec;
    fs::path abs = fs::absolute(dir, ec).lexically_normal();
    if (ec) return Status::io("workspace " + dir + ": " + ec.message());
    Workspace w;
    w.m_cache = std::make_shared<SummaryCache>();
    w.m_dir = abs.string();
    while (w.m_dir.size() > 1 && w.m_dir.back() == '/') w.m_dir.pop_back();
    for (const auto& sub : {w.runsDir(), w.tmpDir()}) {
        fs::create_directories(sub, ec);
        if (ec) return Status::io("cannot create workspace folder " + sub + ": " + ec.message() +
                                  " (set --workspace DIR or TRAINSCOPE_WORKSPACE)");
    }
    TS_RETURN_IF_ERROR(w.ensureIndex());
    return w;
}

Status Workspace::ensureIndex() {
    for (int attempt = 0;; ++attempt) {
        TS_ASSIGN_OR_RETURN(Db d, openIndex(indexPath()));
        sqlite3_stmt* st = nullptr;
        int version = 0;
        int rc = sqlite3_prepare_v2(d.db, "PRAGMA user_version", -1, &st, nullptr);
        if (rc == SQLITE_OK) {
            rc = sqlite3_step(st);
            if (rc == SQLITE_ROW) version = sqlite3_column_int(st, 0), rc = SQLITE_OK;
        }
        sqlite3_finalize(st);
        if (isDamaged(rc) && attempt == 0) {
            d = Db();
            TS_RETURN_IF_ERROR(moveIndexAside(indexPath()));
            continue;
        }
        if (rc != SQLITE_OK) return sqlError(d.db, "reading the workspace index " + indexPath());
        if (version == kIndexVersion) return Status::ok();
        // Unknown or older index: it is only a cache, so recreate it (rows come back on listRuns).
        return execSql(d.db,
            "BEGIN IMMEDIATE;"
            "DROP TABLE IF EXISTS runs;"
            "CREATE TABLE runs(path TEXT PRIMARY KEY, id TEXT NOT NULL, name TEXT, "
            " created_at TEXT, finished_at TEXT, node TEXT, layout TEXT, key_knobs TEXT, "
            " step_time_s REAL, tokens_per_s REAL, mfu REAL, peak_memory_bytes INTEGER, steps INTEGER, "
            " last_loss REAL, status TEXT, status_reason TEXT, tags TEXT, mtime_ns INTEGER);"
            "CREATE INDEX runs_id ON runs(id);"
            "PRAGMA user_version=" + std::to_string(kIndexVersion) + ";"
            "COMMIT;");
    }
}

Result<std::string> Workspace::newRunFile(const std::string& name) {
    std::error_code ec;
    for (int attempt = 0; attempt < 16; ++attempt) {
        std::string path = runsDir() + "/" + makeRunId(name) + ".sqlite";
        if (!fs::exists(path, ec)) return path;
    }
    return Status::internal("could not find an unused run id in " + runsDir());
}

Status Workspace::upsert(const RunSummary& s, int64_t mtimeNs) {
    TS_ASSIGN_OR_RETURN(Db d, openIndex(indexPath()));
    std::lock_guard lock(*m_mutex);
    // One row per path: a file re-read under a new id replaces its old row.
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(d.db,
            "INSERT OR REPLACE INTO runs(id, path, name, created_at, finished_at, node, layout, key_knobs, "
            "step_time_s, tokens_per_s, mfu, peak_memory_bytes, steps, last_loss, status, status_reason, "
            "tags, mtime_ns) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18)",
            -1, &st, nullptr) != SQLITE_OK)
        return sqlError(d.db, "workspace index");
    int i = 1;
    auto text = [&](const std::string& v) { sqlite3_bind_text(st, i++, v.c_str(), -1, SQLITE_TRANSIENT); };
    text(s.id); text(s.path); text(s.name); text(s.createdAt); text(s.finishedAt); text(s.node);
    text(s.layout); text(s.keyKnobs);
    sqlite3_bind_double(st, i++, s.stepTimeS);
    sqlite3_bind_double(st, i++, s.tokensPerS);
    sqlite3_bind_double(st, i++, s.mfu);
    sqlite3_bind_int64(st, i++, s.peakMemoryBytes);
    sqlite3_bind_int(st, i++, s.steps);
    sqlite3_bind_double(st, i++, s.lastLoss);
    text(s.status); text(s.statusReason); text(dumpJson(json(s.tags)));
    sqlite3_bind_int64(st, i++, mtimeNs);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return sqlError(d.db, "writing the workspace index");
    return Status::ok();
}

void Workspace::forgetSummary(const std::string& path) {
    if (!m_cache) return;
    std::error_code ec;
    const std::string abs = fs::absolute(path, ec).lexically_normal().string();
    std::lock_guard lock(m_cache->mu);
    m_cache->byPath.erase(abs);
    m_cache->byPath.erase(path);
}

Status Workspace::indexRun(const std::string& runFilePath) {
    forgetSummary(runFilePath);  // what this workspace writes, its next listing shows
    int64_t mtime = runMtimeNs(runFilePath);
    TS_ASSIGN_OR_RETURN(RunSummary s, summarizeRunFile(runFilePath));
    return upsert(s, mtime);
}

Result<std::vector<RunSummary>> Workspace::listRuns() {
    // A read: the index is opened read-only and nothing is written back (a listing under load
    // must not queue on the index's write lock or fsync). An index that cannot be read is
    // treated as empty: every run file is then summarised from the file itself.
    std::vector<std::pair<RunSummary, int64_t>> rows;
    {
        Db d;
        int rc = sqlite3_open_v2(indexPath().c_str(), &d.db, SQLITE_OPEN_READONLY, nullptr);
        if (rc == SQLITE_OK) {
            sqlite3_busy_timeout(d.db, 10000);
            sqlite3_stmt* st = nullptr;
            std::string sql = std::string("SELECT ") + kSelectColumns + " FROM runs";
            rc = sqlite3_prepare_v2(d.db, sql.c_str(), -1, &st, nullptr);
            if (rc == SQLITE_OK) {
                while ((rc = sqlite3_step(st)) == SQLITE_ROW) rows.emplace_back(rowToSummary(st), sqlite3_column_int64(st, 17));
                sqlite3_finalize(st);
            }
        }
        if (isDamaged(rc)) {
            // A damaged index (not a database, corrupt) is moved aside and an empty one made:
            // the one write a listing makes. Every run file is then summarised below.
            rows.clear();
            d = Db();
            TS_RETURN_IF_ERROR(moveIndexAside(indexPath()));
            TS_RETURN_IF_ERROR(ensureIndex());
        }
    }
    std::vector<RunSummary> out;
    std::vector<std::string> known;
    for (auto& [s, mtime] : rows) {
        known.push_back(s.path);
        int64_t now = runMtimeNs(s.path);
        if (now < 0) continue;  // the run file is gone (indexRun/rebuildIndex drop the row)
        if (now != mtime) {
            auto fresh = cachedSummary(s.path, now);
            if (fresh) {
                out.push_back(std::move(*fresh));
                continue;
            }
        }
        out.push_back(std::move(s));
    }
    // Run files nobody indexed yet (a run still going, one written by another process, a copied file).
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(runsDir(), ec)) {
        if (e.path().extension() != ".sqlite") continue;
        std::string p = fs::absolute(e.path(), ec).lexically_normal().string();
        if (std::find(known.begin(), known.end(), p) != known.end()) continue;
        auto s = cachedSummary(p, runMtimeNs(p));
        if (!s) {
            // Not a readable run file (empty, damaged, another program's database): listed as
            // broken with the reason, so it is visible and can be deleted; never indexed.
            out.push_back(brokenRunSummary(p, s.status()));
            continue;
        }
        out.push_back(std::move(*s));
    }
    std::sort(out.begin(), out.end(), [](const RunSummary& a, const RunSummary& b) {
        return std::tie(a.createdAt, a.id) < std::tie(b.createdAt, b.id);
    });
    return out;
}

Result<RunSummary> Workspace::findRun(const std::string& key) {
    if (key.empty()) return Status::invalid("no run given (use an id, a name, a path or 'latest')");
    std::error_code ec;
    const bool looksLikePath = key.find('/') != std::string::npos || key.ends_with(".sqlite");
    if (looksLikePath && fs::is_regular_file(key, ec)) {
        std::string abs = fs::absolute(key, ec).lexically_normal().string();
        return summarizeRunFile(abs);
    }
    TS_ASSIGN_OR_RETURN(auto all, listRuns());
    // Broken files are listed, but named only by path (they have no run id).
    std::vector<RunSummary> runs;
    for (auto& r : all) {
        if (r.status != kBrokenStatus) runs.push_back(std::move(r));
        else if (r.id == key) return Status::invalid("run file " + r.path + " is broken: " + r.statusReason);
    }
    if (runs.empty()) return Status::notFound("no runs in workspace " + m_dir);
    if (key == "latest" || key == "last") return runs.back();
    std::vector<const RunSummary*> exact;
    for (const auto& r : runs)
        if (r.id == key) exact.push_back(&r);
    if (exact.size() == 1) return *exact.front();
    if (exact.size() > 1) {
        // Two files with one id (a copied run file): naming the id would pick one at random.
        std::string files;
        for (const auto* r : exact) files += (files.empty() ? "" : ", ") + r->path;
        return Status::invalid("run id '" + key + "' is held by " + std::to_string(exact.size()) +
                               " run files (" + files + "); name the one you mean by its path");
    }
    for (auto it = runs.rbegin(); it != runs.rend(); ++it)
        if (it->name == key) return *it;  // newest run of that name
    std::vector<const RunSummary*> prefix;
    for (const auto& r : runs)
        if (r.id.rfind(key, 0) == 0) prefix.push_back(&r);
    if (prefix.size() > 1 && std::all_of(prefix.begin(), prefix.end(), [&](const RunSummary* r) {
            return r->id == prefix.front()->id;
        })) {
        std::string files;
        for (const auto* r : prefix) files += (files.empty() ? "" : ", ") + r->path;
        return Status::invalid("run id '" + prefix.front()->id + "' is held by " + std::to_string(prefix.size()) +
                               " run files (" + files + "); name the one you mean by its path");
    }
    if (prefix.size() == 1) return *prefix.front();
    if (prefix.size() > 1)
        return Status::invalid("'" + key + "' matches " + std::to_string(prefix.size()) +
                               " runs (" + prefix[0]->id + ", " + prefix[1]->id + ", ...); give more of the id");
    if (looksLikePath) return Status::notFound("run file " + key + " does not exist");
    return Status::notFound("no run with id or name '" + key + "' in workspace " + m_dir +
                            " (see `trainscope runs list`)");
}

Result<std::string> Workspace::resolveRun(const std::string& key) {
    TS_ASSIGN_OR_RETURN(RunSummary s, findRun(key));
    return s.path;
}

Status Workspace::updateRunInfoInFile(const std::string& path, const std::string* newName,
                                      const std::string* addTag, const std::string* removeTag) {
    TS_ASSIGN_OR_RETURN(auto store, profiler::TraceStore::open(path, /*readOnly=*/false));
    profiler::RunInfo info;
    auto cur = store->runInfo();
    if (cur) {
        info = *cur;
    } else if (cur.status().code() == ErrorCode::NotFound) {
        info.id = fs::path(path).stem().string();
        info.status = "unknown";
    } else {
        return cur.status();
    }
    if (newName) info.name = *newName;
    std::vector<std::string> tags = parseTags(info.tagsJson);
    if (addTag && std::find(tags.begin(), tags.end(), *addTag) == tags.end()) tags.push_back(*addTag);
    if (removeTag) tags.erase(std::remove(tags.begin(), tags.end(), *removeTag), tags.end());
    info.tagsJson = dumpJson(json(tags));
    TS_RETURN_IF_ERROR(store->setRunInfo(info));
    store.reset();
    return indexRun(path);
}

Status Workspace::rename(const std::string& run, const std::string& newNameIn) {
    TS_ASSIGN_OR_RETURN(std::string path, resolveRun(run));
    const std::string newName = sanitizeUtf8(newNameIn);
    return updateRunInfoInFile(path, &newName, nullptr, nullptr);
}

Status Workspace::tag(const std::string& run, const std::string& tagIn) {
    if (tagIn.empty()) return Status::invalid("empty tag");
    TS_ASSIGN_OR_RETURN(std::string path, resolveRun(run));
    const std::string t = sanitizeUtf8(tagIn);
    return updateRunInfoInFile(path, nullptr, &t, nullptr);
}

Status Workspace::untag(const std::string& run, const std::string& t) {
    TS_ASSIGN_OR_RETURN(std::string path, resolveRun(run));
    return updateRunInfoInFile(path, nullptr, nullptr, &t);
}

Status Workspace::remove(const std::string& run, RemoveMode mode) {
    auto found = findRun(run);
    if (!found) {
        // A broken file has no run id: it is named by its path or its file name.
        std::error_code ec;
        const std::string abs = fs::absolute(run, ec).lexically_normal().string();
        auto all = listRuns();
        if (all)
            for (const auto& r : *all)
                if (r.status == kBrokenStatus && (r.path == abs || r.id == run)) found = r;
        if (!found) return found.status();
    }
    const RunSummary& s = *found;
    const std::string& path = s.path;
    forgetSummary(path);
    if (s.status == "running" && mode != RemoveMode::EvenIfRunning)
        return Status::invalid("run " + s.id + " is still running (" + path +
                               "); cancel it first, or delete it with --force (which cancels it first)");
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) fs::remove(path + suffix, ec);
    if (fs::exists(path)) return Status::io("could not delete " + path);
    TS_ASSIGN_OR_RETURN(Db d, openIndex(indexPath()));
    sqlite3_stmt* del = nullptr;
    sqlite3_prepare_v2(d.db, "DELETE FROM runs WHERE path = ?1", -1, &del, nullptr);
    sqlite3_bind_text(del, 1, path.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_step(del);
    sqlite3_finalize(del);
    return Status::ok();
}

Status Workspace::rebuildIndex() {
    {
        TS_ASSIGN_OR_RETURN(Db d, openIndex(indexPath()));
        char* err = nullptr;
        const int rc = sqlite3_exec(d.db, "DELETE FROM runs", nullptr, nullptr, &err);
        sqlite3_free(err);
        if (rc != SQLITE_OK) {
            // Whatever is wrong with it, the index is rebuilt from the run files anyway.
            d = Db();
            if (isDamaged(rc)) TS_RETURN_IF_ERROR(moveIndexAside(indexPath()));
            else TS_RETURN_IF_ERROR(Status::io("cannot clear the workspace index " + indexPath()));
            TS_RETURN_IF_ERROR(ensureIndex());
        }
    }
    std::error_code ec;
    int ok = 0, bad = 0;
    std::string firstError;
    for (const auto& e : fs::directory_iterator(runsDir(), ec)) {
        if (e.path().extension() != ".sqlite") continue;
        Status s = indexRun(e.path().string());
        if (s) ++ok;
        else if (++bad == 1) firstError = s.toString();
    }
    if (ok == 0 && bad > 0)
        return Status::io("no readable run file in " + runsDir() + " (first error: " + firstError + ")");
    return Status::ok();
}

}  // namespace ts::sessions
