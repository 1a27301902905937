// Nsight Systems SQLite export importer (see nsys_import.h).
#include "profiler/import/nsys_import.h"

#include <charconv>
#include <map>
#include <set>
#include <unordered_map>

#include <sqlite3.h>

#include "profiler/import/kernel_names.h"

namespace ts::profiler::import {

std::string stripApiVersion(std::string_view name) {
    size_t v = name.rfind("_v");
    if (v == std::string_view::npos || v + 2 >= name.size()) return std::string(name);
    for (size_t i = v + 2; i < name.size(); ++i)
        if (name[i] < '0' || name[i] > '9') return std::string(name);
    return std::string(name.substr(0, v));
}

namespace {

using trace::Category;

constexpr int kBacktraceEventClass = 67;  // ENUM_NSYS_EVENT_CLASS: "CUDA backtrace"
constexpr int kNvtxPushPop = 59;
constexpr int kNvtxStartEnd = 60;

struct Db {
    sqlite3* db = nullptr;
    ~Db() {
        if (db) sqlite3_close(db);
    }
};

struct Stmt {
    sqlite3_stmt* st = nullptr;
    ~Stmt() {
        if (st) sqlite3_finalize(st);
    }
};

int64_t pidOf(int64_t globalId) { return (globalId >> 24) & 0xFFFFFF; }
int64_t tidOf(int64_t globalId) { return globalId & 0xFFFFFF; }

// "MPI Rank 3" -> 3.
std::optional<int> rankFromThreadName(std::string_view name) {
    constexpr std::string_view kPrefix = "MPI Rank ";
    if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
    int r = 0;
    auto rest = name.substr(kPrefix.size());
    auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), r);
    if (ec != std::errc() || r < 0) return std::nullopt;
    return r;
}

class NsysReader {
public:
    NsysReader(sqlite3* db, std::string path) : m_db(db), m_path(std::move(path)) {}
    Result<std::vector<StagedFile>> run();

private:
    struct Process {
        StagedFile file;
        std::map<std::pair<int64_t, int64_t>, uint32_t> gpuTracks;  // (device, stream)
        std::map<int64_t, uint32_t> hostTracks;                      // globalTid
        std::unordered_map<int64_t, std::pair<size_t, int>> runtimeByCorrelation;  // -> (slice, eventClass)
    };

    bool hasTable(const std::string& t) const { return m_tables.count(t) > 0; }
    std::set<std::string> columns(const std::string& table);
    // SELECT of wanted columns, NULL for the ones the table lacks; nullopt when a required
    // column is missing (counted as an unreadable table).
    std::optional<std::string> selectSql(const std::string& table, const std::vector<std::string>& wanted,
                                         const std::set<std::string>& required);
    bool prepare(const std::string& sql, Stmt& stmt);
    void loadStrings();
    void loadMeta();
    const std::string& str(sqlite3_stmt* st, int col);
    Process& process(int64_t pid);
    uint32_t gpuTrack(Process& p, int64_t device, int64_t stream);
    uint32_t hostTrack(Process& p, int64_t globalTid);
    bool readSpan(sqlite3_stmt* st, int startCol, int endCol, int64_t& start, int64_t& end, const char* table);
    // A device activity row whose first columns are start, end, deviceId, streamId,
    // correlationId, globalPid (kernels, memcpy, memset): its process and a slice with span,
    // stream track and correlation set. False when the span is unusable (readSpan counts it).
    bool deviceSlice(sqlite3_stmt* st, const char* table, Process*& p, trace::Slice& s);
    void readRuntime();
    void readKernels();
    void readMemcpy();
    void readMemset();
    void readNvtx();
    StagedFile& anyFile() { return m_processes.empty() ? m_orphan : m_processes.begin()->second.file; }

    sqlite3* m_db;
    std::string m_path;
    std::set<std::string> m_tables;
    std::unordered_map<int64_t, std::string> m_strings;
    bool m_haveStrings = false;
    std::string m_scratch;
    std::map<std::string, std::string> m_info;
    std::optional<int64_t> m_epochOffset;
    std::unordered_map<int64_t, std::string> m_threadNames;  // globalTid -> name
    std::map<int64_t, std::string> m_processNames;
    std::optional<std::pair<int, std::string>> m_envRank;
    std::map<int64_t, Process> m_processes;  // by pid
    StagedFile m_orphan;                     // stats seen before any process exists
};

std::set<std::string> NsysReader::columns(const std::string& table) {
    std::set<std::string> cols;
    Stmt st;
    if (!prepare("PRAGMA table_info(\"" + table + "\")", st)) return cols;
    while (sqlite3_step(st.st) == SQLITE_ROW) {
        auto* name = reinterpret_cast<const char*>(sqlite3_column_text(st.st, 1));
        if (name) cols.insert(name);
    }
    return cols;
}

std::optional<std::string> NsysReader::selectSql(const std::string& table, const std::vector<std::string>& wanted,
                                                 const std::set<std::string>& required) {
    std::set<std::string> have = columns(table);
    std::string sql = "SELECT ";
    for (size_t i = 0; i < wanted.size(); ++i) {
        if (i) sql += ", ";
        if (have.count(wanted[i])) {
            sql += "\"" + wanted[i] + "\"";
        } else {
            if (required.count(wanted[i])) {
                anyFile().stats.add("import.nsys.unreadable_tables");
                m_info["unreadable." + table] = "no column " + wanted[i];
                return std::nullopt;
            }
            sql += "NULL";
        }
    }
    sql += " FROM \"" + table + "\"";
    return sql;
}

bool NsysReader::prepare(const std::string& sql, Stmt& stmt) {
    return sqlite3_prepare_v2(m_db, sql.c_str(), -1, &stmt.st, nullptr) == SQLITE_OK;
}

void NsysReader::loadStrings() {
    if (!hasTable("StringIds")) return;
    Stmt st;
    if (!prepare("SELECT id, value FROM StringIds", st)) return;
    m_haveStrings = true;
    while (sqlite3_step(st.st) == SQLITE_ROW) {
        auto* v = reinterpret_cast<const char*>(sqlite3_column_text(st.st, 1));
        m_strings.emplace(sqlite3_column_int64(st.st, 0), v ? v : "");
    }
}

const std::string& NsysReader::str(sqlite3_stmt* st, int col) {
    if (sqlite3_column_type(st, col) == SQLITE_NULL) {
        m_scratch.clear();
        return m_scratch;
    }
    if (sqlite3_column_type(st, col) == SQLITE_TEXT) {
        m_scratch = reinterpret_cast<const char*>(sqlite3_column_text(st, col));
        return m_scratch;
    }
    int64_t id = sqlite3_column_int64(st, col);
    auto it = m_strings.find(id);
    if (it != m_strings.end()) return it->second;
    anyFile().stats.add("import.nsys.unresolved_strings");
    m_scratch = "string#" + std::to_string(id);
    return m_scratch;
}

void NsysReader::loadMeta() {
    for (const char* table : {"EXPORT_META_DATA", "META_DATA_EXPORT"}) {
        if (!hasTable(table)) continue;
        Stmt st;
        if (!prepare(std::string("SELECT name, value FROM ") + table, st)) continue;
        while (sqlite3_step(st.st) == SQLITE_ROW) {
            auto* n = reinterpret_cast<const char*>(sqlite3_column_text(st.st, 0));
            auto* v = reinterpret_cast<const char*>(sqlite3_column_text(st.st, 1));
            if (!n || !v) continue;
            std::string name = n;
            if (name == "EXPORT_SCHEMA_VERSION") m_info["nsys_schema_version"] = v;
            else if (name == "EXPORT_PRODUCT_VERSION") m_info["nsys_version"] = v;
        }
    }
    if (hasTable("TARGET_INFO_SESSION_START_TIME")) {
        Stmt st;
        if (prepare("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME", st) && sqlite3_step(st.st) == SQLITE_ROW &&
            sqlite3_column_type(st.st, 0) == SQLITE_INTEGER) {
            m_epochOffset = sqlite3_column_int64(st.st, 0);
            m_info["clock"] = "TARGET_INFO_SESSION_START_TIME.utcEpochNs + ts";
        }
    }
    // The GPU's product name (run metadata "device_name", used by MFU) and memory size:
    // TARGET_INFO_GPU in current exports, TARGET_INFO_CUDA_DEVICE in some older ones; lowest
    // device id first. Which columns exist differs by schema version (older exports have no
    // TARGET_INFO_GPU.id): order by the first id column the table has, else by row order.
    for (const char* table : {"TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE"}) {
        if (m_info.count("device_name") || !hasTable(table)) continue;
        std::set<std::string> cols = columns(table);
        if (!cols.count("name")) continue;
        std::string order = "rowid";
        for (const char* c : {"id", "cuDevice", "deviceId", "cudaId"})
            if (cols.count(c)) {
                order = std::string("\"") + c + "\"";
                break;
            }
        const char* memCol = cols.count("totalMemory") ? "\"totalMemory\"" : "NULL";
        std::string sql = std::string("SELECT name, ") + memCol + " FROM \"" + table +
                          "\" WHERE name IS NOT NULL AND name != '' ORDER BY " + order;
        Stmt st;
        if (prepare(sql, st) && sqlite3_step(st.st) == SQLITE_ROW) {
            auto* n = reinterpret_cast<const char*>(sqlite3_column_text(st.st, 0));
            if (n) m_info["device_name"] = n;
            if (sqlite3_column_type(st.st, 1) == SQLITE_INTEGER && sqlite3_column_int64(st.st, 1) > 0)
                m_info["device_memory_bytes"] = std::to_string(sqlite3_column_int64(st.st, 1));
        }
    }
    if (hasTable("ThreadNames")) {
        Stmt st;
        if (prepare("SELECT globalTid, nameId FROM ThreadNames", st))
            while (sqlite3_step(st.st) == SQLITE_ROW)
                m_threadNames[sqlite3_column_int64(st.st, 0)] = str(st.st, 1);
    }
    if (hasTable("PROCESSES")) {
        Stmt st;
        if (prepare("SELECT pid, name FROM PROCESSES", st))
            while (sqlite3_step(st.st) == SQLITE_ROW) {
                auto* n = reinterpret_cast<const char*>(sqlite3_column_text(st.st, 1));
                if (n) m_processNames[sqlite3_column_int64(st.st, 0)] = n;
            }
    }
    if (hasTable("TARGET_INFO_SYSTEM_ENV")) {
        Stmt st;
        if (prepare("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'", st)) {
            while (sqlite3_step(st.st) == SQLITE_ROW) {
                auto* v = reinterpret_cast<const char*>(sqlite3_column_text(st.st, 0));
                if (!v) continue;
                std::string env = std::string(";") + v + ";";
                for (const char* var : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
                    std::string needle = std::string(";") + var + "=";
                    size_t pos = env.find(needle);
                    if (pos == std::string::npos) continue;
                    pos += needle.size();
                    int r = 0;
                    auto [ptr, ec] = std::from_chars(env.data() + pos, env.data() + env.size(), r);
                    if (ec == std::errc() && *ptr == ';' && r >= 0) {
                        m_envRank = std::make_pair(r, std::string("environment ") + var);
                        break;
                    }
                }
                if (m_envRank) break;
            }
        }
    }
}

NsysReader::Process& NsysReader::process(int64_t pid) {
    auto [it, inserted] = m_processes.try_emplace(pid);
    if (inserted) {
        StagedFile& f = it->second.file;
        f.path = m_path;
        f.format = SourceFormat::Nsys;
        f.epochOffsetNs = m_epochOffset;
        f.info = m_info;
        f.info["pid"] = std::to_string(pid);
        auto name = m_processNames.find(pid);
        if (name != m_processNames.end()) f.info["process_name"] = name->second;
        if (m_processes.size() == 1) f.stats.merge(m_orphan.stats);
    }
    return it->second;
}

uint32_t NsysReader::gpuTrack(Process& p, int64_t device, int64_t stream) {
    auto [it, inserted] = p.gpuTracks.try_emplace({device, stream}, 0u);
    if (inserted) {
        StagedTrack t;
        t.gpu = true;
        t.kind = trace::TrackKind::Compute;
        t.device = static_cast<int32_t>(device);
        t.streamIndex = static_cast<int32_t>(stream);
        t.label = "gpu " + std::to_string(device) + " stream " + std::to_string(stream);
        it->second = static_cast<uint32_t>(p.file.tracks.size());
        p.file.tracks.push_back(std::move(t));
    }
    return it->second;
}

uint32_t NsysReader::hostTrack(Process& p, int64_t globalTid) {
    auto [it, inserted] = p.hostTracks.try_emplace(globalTid, 0u);
    if (inserted) {
        StagedTrack t;
        t.gpu = false;
        t.kind = trace::TrackKind::HostThread;
        t.pid = pidOf(globalTid);
        t.tid = tidOf(globalTid);
        t.label = "thread " + std::to_string(t.tid);
        auto name = m_threadNames.find(globalTid);
        if (name != m_threadNames.end() && !name->second.empty()) {
            t.label += " (" + name->second + ")";
            if (auto r = rankFromThreadName(name->second); r && !p.file.rankHint) {
                p.file.rankHint = *r;
                p.file.rankSource = "nsys thread name '" + name->second + "'";
            }
        }
        it->second = static_cast<uint32_t>(p.file.tracks.size());
        p.file.tracks.push_back(std::move(t));
    }
    return it->second;
}

bool NsysReader::readSpan(sqlite3_stmt* st, int startCol, int endCol, int64_t& start, int64_t& end, const char* table) {
    if (sqlite3_column_type(st, startCol) != SQLITE_INTEGER || sqlite3_column_type(st, endCol) != SQLITE_INTEGER) {
        anyFile().stats.add(std::string("import.nsys.malformed_rows.") + table);
        return false;
    }
    start = sqlite3_column_int64(st, startCol);
    end = sqlite3_column_int64(st, endCol);
    if (end < start) {
        anyFile().stats.add(std::string("import.nsys.malformed_rows.") + table);
        return false;
    }
    return true;
}

void NsysReader::readRuntime() {
    const char* table = "CUPTI_ACTIVITY_KIND_RUNTIME";
    if (!hasTable(table)) return;
    auto sql = selectSql(table, {"start", "end", "eventClass", "globalTid", "correlationId", "nameId"},
                         {"start", "end", "globalTid", "nameId"});
    Stmt st;
    if (!sql || !prepare(*sql, st)) return;
    while (sqlite3_step(st.st) == SQLITE_ROW) {
        int64_t start = 0, end = 0;
        if (!readSpan(st.st, 0, 1, start, end, table)) continue;
        if (sqlite3_column_type(st.st, 3) != SQLITE_INTEGER) {
            anyFile().stats.add("import.nsys.malformed_rows.CUPTI_ACTIVITY_KIND_RUNTIME");
            continue;
        }
        int eventClass = sqlite3_column_int(st.st, 2);
        int64_t gtid = sqlite3_column_int64(st.st, 3);
        int64_t corr = sqlite3_column_type(st.st, 4) == SQLITE_INTEGER ? sqlite3_column_int64(st.st, 4) : 0;
        Process& p = process(pidOf(gtid));
        trace::Slice s;
        s.track = hostTrack(p, gtid);
        s.name = p.file.strings.intern(stripApiVersion(str(st.st, 5)));
        s.category = Category::Other;  // Launch when it launched GPU work (finalizeStaged)
        s.startNs = start;
        s.durNs = end - start;
        s.correlation = corr > 0 ? static_cast<uint64_t>(corr) : 0;
        if (corr > 0) {
            auto [it, inserted] = p.runtimeByCorrelation.try_emplace(corr, std::make_pair(p.file.slices.size(), eventClass));
            if (!inserted) {
                // Same API call recorded twice (runtime + backtrace event class): keep one,
                // preferring the runtime-class row.
                p.file.stats.add("import.nsys.duplicate_runtime_rows");
                if (it->second.second == kBacktraceEventClass && eventClass != kBacktraceEventClass) {
                    p.file.slices[it->second.first] = s;
                    it->second.second = eventClass;
                }
                continue;
            }
        }
        p.file.slices.push_back(s);
    }
}

bool NsysReader::deviceSlice(sqlite3_stmt* st, const char* table, Process*& p, trace::Slice& s) {
    int64_t start = 0, end = 0;
    if (!readSpan(st, 0, 1, start, end, table)) return false;
    int64_t pid = sqlite3_column_type(st, 5) == SQLITE_INTEGER ? pidOf(sqlite3_column_int64(st, 5))
                                                                : (m_processes.empty() ? 0 : m_processes.begin()->first);
    p = &process(pid);
    s.track = gpuTrack(*p, sqlite3_column_int64(st, 2), sqlite3_column_int64(st, 3));
    s.startNs = start;
    s.durNs = end - start;
    int64_t corr = sqlite3_column_int64(st, 4);
    s.correlation = corr > 0 ? static_cast<uint64_t>(corr) : 0;
    return true;
}

void NsysReader::readKernels() {
    const char* table = "CUPTI_ACTIVITY_KIND_KERNEL";
    if (!hasTable(table)) return;
    auto sql = selectSql(table,
                         {"start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName", "shortName"},
                         {"start", "end"});
    Stmt st;
    if (!sql || !prepare(*sql, st)) return;
    while (sqlite3_step(st.st) == SQLITE_ROW) {
        Process* p = nullptr;
        trace::Slice s;
        if (!deviceSlice(st.st, table, p, s)) continue;
        int nameCol = sqlite3_column_type(st.st, 6) != SQLITE_NULL ? 6 : 7;
        const std::string& name = str(st.st, nameCol);
        s.name = p->file.strings.intern(name);
        s.category = classifyKernel(name);
        p->file.slices.push_back(s);
    }
}

void NsysReader::readMemcpy() {
    const char* table = "CUPTI_ACTIVITY_KIND_MEMCPY";
    if (!hasTable(table)) return;
    auto sql = selectSql(table, {"start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "copyKind"},
                         {"start", "end"});
    Stmt st;
    if (!sql || !prepare(*sql, st)) return;
    // CUpti_ActivityMemcpyKind, spelled the way Kineto and HTA name copies.
    static const char* kKinds[] = {"Memcpy Unknown", "Memcpy HtoD", "Memcpy DtoH", "Memcpy HtoA", "Memcpy AtoH", "Memcpy AtoA",
                                   "Memcpy AtoD",    "Memcpy DtoA", "Memcpy DtoD", "Memcpy HtoH", "Memcpy PtoP"};
    while (sqlite3_step(st.st) == SQLITE_ROW) {
        Process* p = nullptr;
        trace::Slice s;
        if (!deviceSlice(st.st, table, p, s)) continue;
        int kind = sqlite3_column_int(st.st, 7);
        s.name = p->file.strings.intern(kind >= 0 && kind <= 10 ? kKinds[kind] : kKinds[0]);
        s.category = Category::Memcpy;
        int64_t bytes = sqlite3_column_int64(st.st, 6);
        s.bytes = bytes > 0 ? static_cast<uint64_t>(bytes) : 0;
        p->file.slices.push_back(s);
    }
}

void NsysReader::readMemset() {
    const char* table = "CUPTI_ACTIVITY_KIND_MEMSET";
    if (!hasTable(table)) return;
    auto sql = selectSql(table, {"start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes"},
                         {"start", "end"});
    Stmt st;
    if (!sql || !prepare(*sql, st)) return;
    while (sqlite3_step(st.st) == SQLITE_ROW) {
        Process* p = nullptr;
        trace::Slice s;
        if (!deviceSlice(st.st, table, p, s)) continue;
        s.name = p->file.strings.intern("Memset");
        s.category = Category::Memset;
        int64_t bytes = sqlite3_column_int64(st.st, 6);
        s.bytes = bytes > 0 ? static_cast<uint64_t>(bytes) : 0;
        p->file.slices.push_back(s);
    }
}

void NsysReader::readNvtx() {
    const char* table = "NVTX_EVENTS";
    if (!hasTable(table)) return;
    auto sql = selectSql(table, {"start", "end", "eventType", "text", "textId", "globalTid"}, {"start", "eventType"});
    Stmt st;
    if (!sql || !prepare(*sql, st)) return;
    while (sqlite3_step(st.st) == SQLITE_ROW) {
        int type = sqlite3_column_int(st.st, 2);
        if (type != kNvtxPushPop && type != kNvtxStartEnd) continue;  // marks, domains, names
        if (sqlite3_column_type(st.st, 1) == SQLITE_NULL) {
            anyFile().stats.add("import.nsys.unterminated_nvtx_ranges");
            continue;
        }
        int64_t start = 0, end = 0;
        if (!readSpan(st.st, 0, 1, start, end, table)) continue;
        if (sqlite3_column_type(st.st, 5) != SQLITE_INTEGER) {
            anyFile().stats.add("import.nsys.malformed_rows.NVTX_EVENTS");
            continue;
        }
        int64_t gtid = sqlite3_column_int64(st.st, 5);
        std::string name = sqlite3_column_type(st.st, 3) != SQLITE_NULL ? str(st.st, 3)
                           : sqlite3_column_type(st.st, 4) != SQLITE_NULL ? str(st.st, 4)
                                                                           : std::string("(unnamed range)");
        Process& p = process(pidOf(gtid));
        trace::Slice s;
        s.track = hostTrack(p, gtid);
        s.category = Category::Range;
        if (auto step = parseStepName(name)) {
            s.step = *step;
            s.name = p.file.strings.intern("step " + std::to_string(*step));
        } else {
            s.name = p.file.strings.intern(name);
        }
        s.startNs = start;
        s.durNs = end - start;
        p.file.slices.push_back(s);
    }
}

Result<std::vector<StagedFile>> NsysReader::run() {
    {
        Stmt st;
        if (!prepare("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')", st))
            return Status::invalid("'" + m_path + "' is not a readable SQLite database: " + sqlite3_errmsg(m_db));
        while (sqlite3_step(st.st) == SQLITE_ROW) {
            auto* n = reinterpret_cast<const char*>(sqlite3_column_text(st.st, 0));
            if (n) m_tables.insert(n);
        }
    }
    const bool nsysLike = hasTable("CUPTI_ACTIVITY_KIND_KERNEL") || hasTable("CUPTI_ACTIVITY_KIND_RUNTIME") ||
                          hasTable("CUPTI_ACTIVITY_KIND_MEMCPY") || hasTable("CUPTI_ACTIVITY_KIND_MEMSET") ||
                          hasTable("NVTX_EVENTS");
    if (!nsysLike)
        return Status::invalid("'" + m_path +
                               "' is an SQLite database but not an Nsight Systems export (no CUPTI_ACTIVITY_KIND_* "
                               "or NVTX_EVENTS table); export a report with `nsys export --type sqlite`");
    if (!hasTable("StringIds")) m_orphan.stats.add("import.nsys.missing_string_table");
    loadStrings();
    loadMeta();
    // Runtime first so kernels of a process with no runtime rows still find their process.
    readRuntime();
    readKernels();
    readMemcpy();
    readMemset();
    readNvtx();

    std::vector<StagedFile> out;
    if (m_processes.empty()) {
        m_orphan.path = m_path;
        m_orphan.format = SourceFormat::Nsys;
        m_orphan.epochOffsetNs = m_epochOffset;
        m_orphan.info = m_info;
        m_orphan.stats.add("import.nsys.empty_exports");
        out.push_back(std::move(m_orphan));
        return out;
    }
    for (auto& [pid, p] : m_processes) {
        StagedFile& f = p.file;
        // Host thread ordinals: the main thread (tid == pid) first.
        int32_t next = 1;
        for (auto& t : f.tracks)
            if (!t.gpu) t.streamIndex = t.tid == t.pid ? 0 : next++;
        if (!f.rankHint && m_envRank && m_processes.size() == 1) {
            f.rankHint = m_envRank->first;
            f.rankSource = m_envRank->second;
        }
        out.push_back(std::move(f));
    }
    return out;
}

}  // namespace

Result<std::vector<StagedFile>> parseNsysExport(const std::string& path) {
    Db db;
    if (sqlite3_open_v2(path.c_str(), &db.db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK)
        return Status::io("cannot open '" + path + "' as SQLite: " + (db.db ? sqlite3_errmsg(db.db) : "out of memory"));
    NsysReader reader(db.db, path);
    return reader.run();
}

}  // namespace ts::profiler::import
