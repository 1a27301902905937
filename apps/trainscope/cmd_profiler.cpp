// Commands of the 'profiler' group: analyze, import, export-trace.
#include <cstdio>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "apps/trainscope/commands.h"
#include "common/json_text.h"
#include "common/status.h"
#include "profiler/analysis.h"
#include "profiler/import/import_run.h"
#include "profiler/store.h"
#include "sessions/workspace.h"

namespace ts::cli {
// ---- analyze / export-trace (profiler/analysis.h; definitions in docs/profiler.md) -----------

namespace {

int exitCodeFor(const Status& s) { return exitCodeOf(s); }

// RUN -> run file path, as `runs show` resolves it: a path to a run file (inside the
// workspace or not), else an id, unique id prefix, name or `latest` in the workspace
// (--workspace DIR, else the default one).
Result<std::string> resolveRunPath(const std::string& run, const Args& a) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(run, ec)) return run;
    if (std::filesystem::is_directory(run, ec))
        return Status::invalid("'" + run + "' is a directory; give a run (id, name or the path of its .sqlite file)");
    TS_ASSIGN_OR_RETURN(auto ws, sessions::Workspace::open(a.value("--workspace").value_or("")));
    return ws.resolveRun(run);
}

}  // namespace

// trainscope analyze RUN [--json] [--step N] [--top N] [--peak-flops TABLE.json] [--device NAME] [--dtype T]
//                   [--definitions trainscope|hta]
int cmdAnalyze(const Args& a) {
    if (auto bad = a.unknownFlags(
            {"--json", "--step", "--top", "--peak-flops", "--device", "--dtype", "--workspace", "--definitions"});
        !bad.empty())
        return fail(2, "unknown option " + bad[0] +
                           " for `analyze`; usage: trainscope analyze RUN [--json] [--step N] [--definitions trainscope|hta]");
    if (a.positional().size() != 1)
        return fail(2, "usage: trainscope analyze RUN [--json] [--step N] [--definitions trainscope|hta]");
    profiler::AnalyzeOptions opt;
    if (auto defs = a.value("--definitions")) {
        auto d = profiler::definitionsByName(*defs);
        if (!d) return fail(2, d.status().message());
        opt.definitions = *d;
    }
    const auto step = intFlag(a, "--step", 0, 2147483647);
    if (!step) return fail(2, step.status().message());
    if (*step) opt.step = int(**step);
    const auto top = intFlag(a, "--top", 0, 1000000);
    if (!top) return fail(2, top.status().message());
    if (*top) opt.topKernels = int(**top);
    opt.peakFlopsTable = a.value("--peak-flops").value_or("");
    opt.deviceName = a.value("--device").value_or("");
    opt.dtype = a.value("--dtype").value_or("");
    auto path = resolveRunPath(a.positional()[0], a);
    if (!path) return fail(exitCodeFor(path.status()), path.status().message());
    auto store = profiler::TraceStore::open(*path, true);
    if (!store) return fail(exitCodeFor(store.status()), store.status().message());
    auto doc = profiler::analyzeRun(**store, opt);
    if (!doc) return fail(exitCodeFor(doc.status()), doc.status().message());
    if (a.has("--json")) {
        std::printf("%s\n", dumpJson(*doc, 2).c_str());
    } else {
        // Kernel and range names come from the trace: no raw control characters on a terminal.
        std::fputs(forTerminal(profiler::formatAnalysisText(*doc), /*keepNewlines=*/true).c_str(), stdout);
    }
    return 0;
}

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
    // Stats by kind: "<source>.kept.<what>" / ".converted.<what>" / ".skipped.<what>" and the
    // other stats (malformed, unsupported, notable), so what an import did with the file is
    // visible at a glance.
    nlohmann::json kept = nlohmann::json::object(), converted = nlohmann::json::object(),
                   skipped = nlohmann::json::object();
    for (const auto& [k, v] : report->stats.all()) {
        if (k.find(".kept.") != std::string::npos) kept[k.substr(k.find(".kept.") + 6)] = v;
        else if (k.find(".converted.") != std::string::npos) converted[k.substr(k.find(".converted.") + 11)] = v;
        else if (k.find(".skipped.") != std::string::npos) skipped[k.substr(k.find(".skipped.") + 9)] = v;
        else skipped[k] = v;  // malformed / unsupported / notable, by their stats name
    }
    if (a.has("--json")) {
        nlohmann::json j = {{"run_file", out}, {"tracks", sum.tracks}, {"slices", sum.slices},
                            {"counters", sum.counters}, {"time_origin_unix_ns", sum.originUnixNs}};
        j["summary"] = {{"kept", kept}, {"converted", converted}, {"skipped_or_notable", skipped}};
        j["files"] = nlohmann::json::array();
        for (const auto& f : sum.files)
            j["files"].push_back({{"path", f.path}, {"format", imp::sourceFormatName(f.format)}, {"rank", f.rank},
                                  {"rank_source", f.rankSource.empty() ? "file order" : f.rankSource},
                                  {"aligned", f.aligned}, {"slices", f.slices}});
        j["stats"] = report->stats.all();
        std::printf("%s\n", dumpJson(j, 2).c_str());
        return 0;
    }
    std::printf("imported %zu file(s) into %s\n", sum.files.size(), forTerminal(out).c_str());
    for (const auto& f : sum.files)
        std::printf("  rank %-3d %-6s %8lld slices  %s  (rank from %s%s)\n", f.rank, imp::sourceFormatName(f.format),
                    static_cast<long long>(f.slices), forTerminal(f.path).c_str(),
                    f.rankSource.empty() ? "file order" : forTerminal(f.rankSource).c_str(),
                    f.aligned ? "" : "; no clock info, aligned by first event");
    std::printf("  %lld tracks, %lld slices, %lld counters\n", static_cast<long long>(sum.tracks),
                static_cast<long long>(sum.slices), static_cast<long long>(sum.counters));
    auto printGroup = [](const char* title, const nlohmann::json& g) {
        if (g.empty()) return;
        std::printf("  %s\n", title);
        for (const auto& [k, v] : g.items()) std::printf("    %-52s %lld\n", k.c_str(), static_cast<long long>(v.get<int64_t>()));
    };
    printGroup("kept (events by kind):", kept);
    printGroup("converted (kept in another form, docs/import.md):", converted);
    printGroup("skipped or notable (stats):", skipped);
    std::printf("next: trainscope analyze %s\n", forTerminal(out).c_str());
    return 0;
}

// trainscope export-trace RUN --chrome OUT.json
int cmdExportTrace(const Args& a) {
    if (auto bad = a.unknownFlags({"--chrome", "--workspace"}); !bad.empty())
        return fail(2, "unknown option " + bad[0] + " for `export-trace`; usage: trainscope export-trace RUN --chrome OUT.json");
    auto out = a.value("--chrome");
    if (a.positional().size() != 1 || !out || out->empty())
        return fail(2, "usage: trainscope export-trace RUN --chrome OUT.json (open OUT.json in ui.perfetto.dev or chrome://tracing)");
    auto path = resolveRunPath(a.positional()[0], a);
    if (!path) return fail(exitCodeFor(path.status()), path.status().message());
    auto store = profiler::TraceStore::open(*path, true);
    if (!store) return fail(exitCodeFor(store.status()), store.status().message());
    if (Status s = profiler::exportChromeTrace(**store, *out); !s.isOk()) return fail(exitCodeFor(s), s.message());
    std::printf("wrote %s\n", forTerminal(*out).c_str());
    return 0;
}
}  // namespace ts::cli
