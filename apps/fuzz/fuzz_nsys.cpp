// Fuzz target for the Nsight Systems SQLite export importer (profiler/import/nsys_import.cpp,
// through importTraces). Random bytes are almost never a database, so the input describes
// one: which of the tables the importer reads exist, and rows of typed values (NULL, small or
// extreme integers, text with any bytes, reals, blobs) for them. The database is built in
// memory, written with VACUUM INTO and imported. Any content must give a Status or a trace
// whose strings are valid UTF-8 and whose rows reference what was emitted before them.
//
// Input layout: byte 0 = 0xFF -> the rest is written as the file itself (SQLite's own parser
// of damaged files); else bytes 0-1 = table mask, then records: table index, then per column
// a tag byte (value kind) and its payload.
//   libFuzzer (clang): fuzz_nsys -max_total_time=600 apps/fuzz/corpus/nsys
//   replay (built by default): fuzz_nsys_replay --seconds 3 apps/fuzz/corpus/nsys
#include <sqlite3.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "apps/fuzz/fuzz_import_common.h"
#include "profiler/import/importer.h"

namespace {

struct Table {
    const char* name;
    std::vector<const char*> columns;
};

// The tables and columns nsys_import.cpp reads.
const std::vector<Table>& tables() {
    static const std::vector<Table> kTables = {
        {"StringIds", {"id", "value"}},
        {"ThreadNames", {"globalTid", "nameId"}},
        {"PROCESSES", {"pid", "name"}},
        {"TARGET_INFO_SESSION_START_TIME", {"utcEpochNs"}},
        {"TARGET_INFO_GPU", {"id", "name"}},
        {"TARGET_INFO_SYSTEM_ENV", {"name", "value"}},
        {"EXPORT_META_DATA", {"name", "value"}},
        {"CUPTI_ACTIVITY_KIND_RUNTIME", {"start", "end", "eventClass", "globalTid", "correlationId", "nameId"}},
        {"CUPTI_ACTIVITY_KIND_KERNEL",
         {"start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName", "shortName"}},
        {"CUPTI_ACTIVITY_KIND_MEMCPY",
         {"start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes", "copyKind"}},
        {"CUPTI_ACTIVITY_KIND_MEMSET", {"start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes"}},
        {"NVTX_EVENTS", {"start", "end", "eventType", "text", "textId", "globalTid"}},
    };
    return kTables;
}

struct Reader {
    const uint8_t* p;
    const uint8_t* end;
    bool more() const { return p < end; }
    uint8_t byte() { return p < end ? *p++ : 0; }
    int64_t i64() {
        uint64_t v = 0;
        for (int k = 0; k < 8; ++k) v = (v << 8) | byte();
        return int64_t(v);
    }
};

// Binds one value read from the input: the tag picks its kind.
void bindValue(sqlite3_stmt* st, int col, Reader& r) {
    static const int64_t kSpecial[] = {INT64_MIN, INT64_MAX, -1, 0, 1, 59, 60, 67, (int64_t(1) << 24) | 1,
                                       int64_t(1) << 24, 1700000000000000000LL, int64_t(1) << 40};
    const uint8_t tag = r.byte();
    switch (tag % 8) {
        case 0: sqlite3_bind_null(st, col); break;
        case 1: sqlite3_bind_int64(st, col, int8_t(r.byte())); break;
        case 2: sqlite3_bind_int64(st, col, r.i64()); break;
        case 3: {
            const size_t n = std::min<size_t>(r.byte(), size_t(r.end - r.p));
            sqlite3_bind_text(st, col, reinterpret_cast<const char*>(r.p), int(n), SQLITE_TRANSIENT);
            r.p += n;
            break;
        }
        case 4: {
            const int64_t bits = r.i64();
            double d;
            std::memcpy(&d, &bits, sizeof d);
            sqlite3_bind_double(st, col, d);
            break;
        }
        case 5: {
            const size_t n = std::min<size_t>(r.byte() % 16, size_t(r.end - r.p));
            sqlite3_bind_blob(st, col, r.p, int(n), SQLITE_TRANSIENT);
            r.p += n;
            break;
        }
        case 6: sqlite3_bind_int64(st, col, kSpecial[r.byte() % (sizeof kSpecial / sizeof kSpecial[0])]); break;
        default: sqlite3_bind_int64(st, col, (int64_t(1) << 24) * (r.byte() % 4) + r.byte() % 4); break;  // gtid
    }
}

// Builds the described database and writes it to path; false when SQLite refused.
bool buildDatabase(const uint8_t* data, size_t size, const std::string& path) {
    sqlite3* db = nullptr;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK) {
        sqlite3_close(db);
        return false;
    }
    sqlite3_exec(db, "PRAGMA synchronous=OFF", nullptr, nullptr, nullptr);  // VACUUM INTO need not fsync
    Reader r{data, data + size};
    const unsigned mask = unsigned(r.byte()) << 8 | r.byte();
    const auto& tabs = tables();
    std::vector<sqlite3_stmt*> inserts(tabs.size(), nullptr);
    for (size_t t = 0; t < tabs.size(); ++t) {
        if (!(mask & (1u << t)) && t != 8) continue;  // the kernel table always exists: an nsys-like file
        // Bit 15 drops each table's last column (older exports lack some).
        std::string create = std::string("CREATE TABLE ") + tabs[t].name + "(";
        std::string insert = std::string("INSERT INTO ") + tabs[t].name + " VALUES(";
        const size_t cols = tabs[t].columns.size() - ((mask & 0x8000) && tabs[t].columns.size() > 2 ? 1 : 0);
        for (size_t c = 0; c < cols; ++c) {
            create += std::string(c ? ", " : "") + tabs[t].columns[c];
            insert += c ? ", ?" : "?";
        }
        create += ")";
        insert += ")";
        sqlite3_exec(db, create.c_str(), nullptr, nullptr, nullptr);
        sqlite3_prepare_v2(db, insert.c_str(), -1, &inserts[t], nullptr);
    }
    int rows = 0;
    while (r.more() && rows < 4096) {
        sqlite3_stmt* st = inserts[r.byte() % tabs.size()];
        if (!st) continue;
        for (int c = 1; c <= sqlite3_bind_parameter_count(st); ++c) bindValue(st, c, r);
        sqlite3_step(st);
        sqlite3_reset(st);
        ++rows;
    }
    for (auto* st : inserts) sqlite3_finalize(st);
    std::remove(path.c_str());
    const std::string vacuum = "VACUUM INTO '" + path + "'";
    const bool ok = sqlite3_exec(db, vacuum.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
    sqlite3_close(db);
    return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0 || size > (1u << 20)) return 0;
    const std::string& path = ts::fuzz::scratchPath(".sqlite");
    if (data[0] == 0xFF) {
        ts::fuzz::writeScratch(path, data + 1, size - 1);
    } else if (!buildDatabase(data, size, path)) {
        return 0;
    }
    ts::fuzz::CheckingRecorder rec;
    auto report = ts::profiler::import::importTraces({path}, rec);
    if (report) ts::fuzz::check(size_t(report->summary.slices) == rec.slices, "summary counts the emitted slices");
    else ts::fuzz::check(!report.status().message().empty(), "an error says why");
    return 0;
}

#ifndef TS_LIBFUZZER
int main(int argc, char** argv) {
    return ts::fuzz::replayMain(argc, argv, "fuzz_nsys",
                                {std::string("\x03\x05", 2), std::string("\x06\x00", 2), std::string("\x06\x05", 2),
                                 std::string("\x03\x04\xff\xfe\x1b\x80", 6), std::string("\x07\x01\x01", 3)},
                                1 << 14);
}
#endif
