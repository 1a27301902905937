// importToRunFile: the importer driven into a TraceStore (see import_run.h).
#include "profiler/import/import_run.h"

#include <chrono>
#include <ctime>
#include <filesystem>

#include "common/text.h"
#include "profiler/store.h"

namespace ts::profiler::import {
namespace {

std::string utcNowIso() {
    std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

void removeRunFile(const std::string& path) {
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::filesystem::remove(path + suffix, ec);
}

}  // namespace

std::string traceStem(const std::string& path) {
    std::string name = std::filesystem::path(path).filename().string();
    for (const char* ext : {".gz", ".json", ".sqlite", ".pt.trace"}) {
        const std::string e = ext;
        if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0)
            name.resize(name.size() - e.size());
    }
    return name;
}

Result<ImportReport> importToRunFile(const std::vector<std::string>& paths, const std::string& outPath,
                                     const ImportOptions& options, const std::string& runName) {
    if (paths.empty()) return Status::invalid("no trace files given");
    // Check the inputs before creating anything, so a typo leaves no empty run behind.
    for (const auto& p : paths) TS_RETURN_IF_ERROR(detectFormat(p).status());

    auto created = TraceStore::create(outPath);
    if (!created) return created.status().withContext("creating run file '" + outPath + "'");
    std::unique_ptr<TraceStore> store = std::move(created).value();

    RunInfo info;
    info.id = traceStem(outPath);
    info.name = sanitizeUtf8(runName.empty() ? traceStem(paths.front()) : runName);
    info.status = "running";
    info.createdAt = utcNowIso();
    info.tagsJson = R"(["imported"])";
    info.configJson = "{}";

    Result<ImportReport> result = Status::internal("import did not run");
    {
        TraceWriter writer(*store);
        result = importTraces(paths, writer, options);
        if (result) {
            for (const auto& [name, count] : result->stats.all()) writer.stat(name, count);
        }
        Status flushed = writer.finish();
        if (result && !flushed.isOk()) result = flushed.withContext("writing '" + outPath + "'");
    }
    if (result && result->summary.slices == 0 && result->summary.counters == 0) {
        // A run without a single event is no run: say what was skipped instead of leaving one.
        std::string why;
        for (const auto& [name, count] : result->stats.all())
            why += (why.empty() ? "" : ", ") + name + "=" + std::to_string(count);
        result = Status::invalid("the import found no events (no slices or counters) in " +
                                 std::to_string(paths.size()) + " file(s)" +
                                 (why.empty() ? std::string() : "; skipped or notable records: " + why) +
                                 "; no run was created");
    }
    if (!result) {
        store.reset();
        removeRunFile(outPath);
        return result.status();
    }
    const auto& files = result->summary.files;
    std::string source = files.empty() ? "kineto" : sourceFormatName(files.front().format);
    for (const auto& f : files)
        if (sourceFormatName(f.format) != source) source = "mixed";
    info.source = source;
    info.status = "completed";
    info.finishedAt = utcNowIso();
    Status s = store->setRunInfo(info);
    if (s.isOk()) s = store->checkpoint();
    if (!s.isOk()) {
        store.reset();
        removeRunFile(outPath);
        return s.withContext("writing '" + outPath + "'");
    }
    return result;
}

}  // namespace ts::profiler::import
