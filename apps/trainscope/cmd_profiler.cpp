// Commands of the 'profiler' group. (Placeholder until that group lands.)
#include "apps/trainscope/commands.h"

#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "profiler/import/import_run.h"
#include "sessions/workspace.h"

namespace ts::cli {
int cmdAnalyze(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }

// ---- import (profiler/import; docs/import.md) -----------------------------------------------
// trainscope import FILE [FILE ...] [--out RUN.sqlite | --workspace DIR] [--name NAME]
//                  [--drop-last-step] [--json]
// Without --out the run goes into the workspace (like `run`) and is indexed there.
int cmdImport(const Args& a) {
    namespace imp = ts::profiler::import;
    if (auto bad = a.unknownFlags({"--out", "--workspace", "--name", "--drop-last-step", "--json"}); !bad.empty())
        return fail(2, "unknown option " + bad[0] + " for `import`; see `trainscope import --help`");
    const auto& files = a.positional();
    if (files.empty())
        return fail(2, "usage: trainscope import FILE [FILE ...] [--out RUN.sqlite] "
                       "(nsys SQLite exports and PyTorch/Kineto .json/.json.gz traces, one file per rank)");
    imp::ImportOptions options;
    options.dropLastProfilerStep = a.has("--drop-last-step");
    const std::string name = a.value("--name").value_or("");

    std::string out = a.value("--out").value_or("");
    std::optional<sessions::Workspace> ws;
    if (out.empty()) {
        auto opened = sessions::Workspace::open(a.value("--workspace").value_or(""));
        if (!opened) return fail(1, opened.status().message());
        ws.emplace(std::move(opened).value());
        auto path = ws->newRunFile(name.empty() ? imp::traceStem(files.front()) : name);
        if (!path) return fail(1, path.status().message());
        out = *path;
    }
    auto report = imp::importToRunFile(files, out, options, name);
    if (!report) {
        ErrorCode c = report.status().code();
        return fail(c == ErrorCode::NotFound ? 3 : c == ErrorCode::InvalidArgument ? 2 : 1, report.status().message());
    }
    if (ws) {
        if (Status s = ws->indexRun(out); !s.isOk())
            std::fprintf(stderr, "trainscope: warning: imported, but the workspace index was not updated: %s\n",
                         s.message().c_str());
    }
    const auto& sum = report->summary;
    if (a.has("--json")) {
        nlohmann::json j = {{"run_file", out}, {"tracks", sum.tracks}, {"slices", sum.slices},
                            {"counters", sum.counters}, {"time_origin_unix_ns", sum.originUnixNs}};
        j["files"] = nlohmann::json::array();
        for (const auto& f : sum.files)
            j["files"].push_back({{"path", f.path}, {"format", imp::sourceFormatName(f.format)}, {"rank", f.rank},
                                  {"rank_source", f.rankSource.empty() ? "file order" : f.rankSource},
                                  {"aligned", f.aligned}, {"slices", f.slices}});
        j["stats"] = report->stats.all();
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("imported %zu file(s) into %s\n", sum.files.size(), out.c_str());
    for (const auto& f : sum.files)
        std::printf("  rank %-3d %-6s %8lld slices  %s  (rank from %s%s)\n", f.rank, imp::sourceFormatName(f.format),
                    static_cast<long long>(f.slices), f.path.c_str(),
                    f.rankSource.empty() ? "file order" : f.rankSource.c_str(),
                    f.aligned ? "" : "; no clock info, aligned by first event");
    std::printf("  %lld tracks, %lld slices, %lld counters\n", static_cast<long long>(sum.tracks),
                static_cast<long long>(sum.slices), static_cast<long long>(sum.counters));
    if (!report->stats.all().empty()) {
        std::printf("  stats (skipped or notable records):\n");
        for (const auto& [k, v] : report->stats.all()) std::printf("    %-52s %lld\n", k.c_str(), static_cast<long long>(v));
    }
    std::printf("next: trainscope analyze %s\n", out.c_str());
    return 0;
}

int cmdExportTrace(const Args& a) { return fail(2, "'" + a.command() + "' is not available in this build yet"); }
}  // namespace ts::cli
