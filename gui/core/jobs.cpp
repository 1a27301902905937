// The workbench's background jobs (jobs.h).
#include "gui/core/jobs.h"

#include <algorithm>
#include <map>

#include "engine/config/knobs.h"
#include "profiler/analysis.h"
#include "profiler/import/import_run.h"
#include "profiler/store.h"
#include "sessions/compare.h"
#include "sessions/export.h"
#include "sessions/workspace.h"

namespace ts::gui {

using nlohmann::json;

QThreadPool* jobPool() {
    static QThreadPool* pool = [] {
        auto* p = new QThreadPool;
        p->setMaxThreadCount(4);
        return p;
    }();
    return pool;
}

Result<json> analyzeRunFile(const std::string& runFile, int step) {
    auto store = profiler::TraceStore::open(runFile, true);
    if (!store) return store.status();
    profiler::AnalyzeOptions options;
    options.step = step;
    return profiler::analyzeRun(**store, options);
}

Result<json> compareRunFiles(const std::string& runFileA, const std::string& runFileB) {
    sessions::CompareOptions options;
    options.traceAnalyzer = sessions::analyzeTraceMetrics;
    auto cmp = sessions::compareRuns(runFileA, runFileB, options);
    if (!cmp) return cmp.status();
    json j = cmp->toJson();
    j["text"] = cmp->toText();
    return j;
}

Result<json> exportRunFile(const std::string& runFile) {
    auto config = sessions::configOfRunFile(runFile);
    if (!config) return config.status();
    json out;
    json notes = json::object();
    const std::pair<const char*, sessions::ExportFormat> formats[] = {
        {"yaml", sessions::ExportFormat::Yaml},
        {"megatron_args", sessions::ExportFormat::MegatronArgs},
        {"bridge_overrides", sessions::ExportFormat::BridgeOverrides}};
    for (const auto& [key, format] : formats) {
        sessions::ExportResult r = sessions::exportConfig(*config, format);
        out[key] = r.text;
        notes[key] = r.notes;
    }
    out["notes"] = notes;
    return out;
}

Result<json> runFileConfig(const std::string& runFile) {
    auto config = sessions::configOfRunFile(runFile);
    if (!config) return config.status();
    json out;
    out["config"] = engine::configToJson(*config);
    auto store = profiler::TraceStore::open(runFile, true);
    if (!store) return store.status();
    if (auto info = (*store)->runInfo()) {
        out["name"] = info->name;
        out["id"] = info->id;
        out["status"] = info->status;
        out["status_reason"] = info->statusReason;
        out["layout"] = info->layout;
    }
    json steps = json::array();
    if (auto metrics = (*store)->stepMetrics())
        for (const auto& m : *metrics)
            steps.push_back({{"step", m.step}, {"loss", m.loss}, {"step_time_s", m.stepTimeS},
                             {"tokens_per_s", m.tokensPerS}, {"model_tflops", m.modelTflops},
                             {"peak_memory_bytes", m.peakMemoryBytes}});
    out["steps"] = steps;
    if (auto peak = (*store)->metadata("peak_tflops"); peak && *peak) {
        try { out["peak_tflops_per_device"] = std::stod(**peak); } catch (...) {}
    }
    if (auto formula = (*store)->metadata("flops_formula"); formula && *formula) out["flops_formula"] = **formula;
    return out;
}

Result<std::string> importTraceFiles(const std::vector<std::string>& paths, const std::string& workspaceDir) {
    if (paths.empty()) return Status::invalid("no trace files to import");
    auto ws = sessions::Workspace::open(workspaceDir);
    if (!ws) return ws.status();
    auto out = ws->newRunFile(profiler::import::traceStem(paths.front()));
    if (!out) return out.status();
    auto report = profiler::import::importToRunFile(paths, *out);
    if (!report) return report.status();
    if (Status st = ws->indexRun(*out); !st.isOk()) return st.withContext("imported into " + *out + ", but indexing failed");
    return *out;
}

}  // namespace ts::gui

namespace ts::gui {

Result<json> memorySeries(const std::string& runFile, int rank, size_t maxPoints) {
    auto store = profiler::TraceStore::open(runFile, true);
    if (!store) return store.status();
    auto names = (*store)->strings();
    if (!names) return names.status();
    auto counters = (*store)->counters(rank);
    if (!counters) return counters.status();
    json ranks = json::array();
    if (auto rs = (*store)->ranks()) ranks = *rs;
    // The categories that make the rank's total (profiler::memoryTotalCategories: an imported
    // trace's allocated and reserved views are never stacked); category index per name id.
    std::vector<std::string> present;
    for (const auto& c : *counters) {
        const std::string& n = c.name < names->size() ? (*names)[c.name] : std::string();
        if (n.rfind("memory.", 0) == 0 && std::find(present.begin(), present.end(), n.substr(7)) == present.end())
            present.push_back(n.substr(7));
    }
    std::string measure;
    const std::vector<std::string> summed = profiler::memoryTotalCategories(present, &measure);
    std::map<uint32_t, int> catOf;
    std::vector<std::string> cats;
    std::vector<const trace::Counter*> events;
    for (const auto& c : *counters) {
        const std::string& n = c.name < names->size() ? (*names)[c.name] : std::string();
        if (n.rfind("memory.", 0) != 0) continue;
        if (std::find(summed.begin(), summed.end(), n.substr(7)) == summed.end()) continue;
        if (!catOf.count(c.name)) {
            catOf[c.name] = int(cats.size());
            cats.push_back(n.substr(7));
        }
        events.push_back(&c);
    }
    std::stable_sort(events.begin(), events.end(), [](const auto* a, const auto* b) { return a->tsNs < b->tsNs; });
    std::vector<double> current(cats.size(), 0.0);
    std::vector<int64_t> ts;
    std::vector<std::vector<double>> samples;
    for (size_t i = 0; i < events.size(); ++i) {
        current[size_t(catOf[events[i]->name])] = events[i]->value;
        // Several categories change at one instant: one sample after the last of them.
        if (i + 1 < events.size() && events[i + 1]->tsNs == events[i]->tsNs) continue;
        ts.push_back(events[i]->tsNs);
        samples.push_back(current);
    }
    auto total = [](const std::vector<double>& v) {
        double s = 0;
        for (double x : v) s += x;
        return s;
    };
    json out = {{"categories", cats}, {"ranks", ranks}, {"rank", rank}, {"measure", measure}};
    json outTs = json::array(), outBytes = json::array();
    json peak = {{"ts_ns", 0}, {"bytes", 0.0}};
    double peakBytes = -1;
    for (size_t i = 0; i < samples.size(); ++i)
        if (total(samples[i]) > peakBytes) {
            peakBytes = total(samples[i]);
            peak = {{"ts_ns", ts[i]}, {"bytes", peakBytes}};
        }
    if (!samples.empty()) {
        const int64_t t0 = ts.front(), t1 = ts.back();
        const size_t buckets = std::max<size_t>(1, maxPoints);
        size_t i = 0;
        for (size_t b = 0; b < buckets && i < samples.size(); ++b) {
            const int64_t end = b + 1 == buckets ? INT64_MAX : t0 + int64_t(double(t1 - t0) * double(b + 1) / double(buckets));
            size_t best = i;
            for (; i < samples.size() && ts[i] <= end; ++i)
                if (total(samples[i]) > total(samples[best])) best = i;
            if (best < samples.size() && (outTs.empty() || outTs.back().get<int64_t>() != ts[best])) {
                outTs.push_back(ts[best]);
                outBytes.push_back(samples[best]);
            }
            if (i == best) ++i;
        }
    }
    out["ts_ns"] = outTs;
    out["bytes"] = outBytes;
    out["peak"] = peak;
    return out;
}

}  // namespace ts::gui
