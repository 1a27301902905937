// Format detection and the multi-file import driver (see importer.h).
#include "profiler/import/importer.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "profiler/import/kineto_import.h"
#include "profiler/import/nsys_import.h"

namespace ts::profiler::import {

Result<SourceFormat> detectFormat(const std::string& path) {
    // Only regular files: a directory reads as empty and a FIFO would block the import.
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Status::notFound("cannot open '" + path + "': " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) return Status::invalid("'" + path + "' is a directory; give the trace files inside it");
    if (!S_ISREG(st.st_mode))
        return Status::invalid("'" + path + "' is not a regular file (a pipe, socket or device); copy the trace to a file first");
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::notFound("cannot open '" + path + "': " + std::strerror(errno));
    char head[64] = {};
    in.read(head, sizeof head);
    const auto n = static_cast<size_t>(in.gcount());
    if (n == 0) return Status::invalid("'" + path + "' is empty");
    if (n >= 16 && std::memcmp(head, "SQLite format 3\0", 16) == 0) return SourceFormat::Nsys;
    if (n >= 2 && static_cast<unsigned char>(head[0]) == 0x1f && static_cast<unsigned char>(head[1]) == 0x8b)
        return SourceFormat::Kineto;
    size_t i = 0;
    if (n >= 3 && std::memcmp(head, "\xEF\xBB\xBF", 3) == 0) i = 3;  // UTF-8 BOM
    while (i < n && (head[i] == ' ' || head[i] == '\n' || head[i] == '\r' || head[i] == '\t')) ++i;
    if (i < n && (head[i] == '{' || head[i] == '[')) return SourceFormat::Kineto;
    std::string hint;
    if (path.size() > 9 && path.compare(path.size() - 9, 9, ".nsys-rep") == 0)
        hint = "; convert the report first with `nsys export --type sqlite " + path + "`";
    return Status::invalid("'" + path +
                           "' is neither an Nsight Systems SQLite export nor a PyTorch/Kineto JSON trace "
                           "(.json or .json.gz)" + hint);
}

Result<ImportReport> importTraces(const std::vector<std::string>& paths, trace::Recorder& rec,
                                  const ImportOptions& options) {
    if (paths.empty()) return Status::invalid("no trace files given");
    std::vector<StagedFile> staged;
    for (const std::string& path : paths) {
        TS_ASSIGN_OR_RETURN(SourceFormat format, detectFormat(path));
        if (format == SourceFormat::Nsys) {
            auto parsed = parseNsysExport(path);
            if (!parsed) return parsed.status();
            for (auto& f : parsed.value()) staged.push_back(std::move(f));
        } else {
            auto parsed = parseKinetoTrace(path);
            if (!parsed) return parsed.status();
            staged.push_back(std::move(parsed.value()));
        }
    }
    for (auto& f : staged) finalizeStaged(f, options);
    ImportReport report;
    report.summary = emitStaged(staged, rec, report.stats);
    // Tells the analyses that HTA's last-step filter was already applied (they must not
    // apply it a second time).
    if (options.dropLastProfilerStep) rec.metadata("import.dropped_last_step", "1");
    return report;
}

}  // namespace ts::profiler::import
