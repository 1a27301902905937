// A/B comparison of two run files (compare.h).
#include "sessions/compare.h"

#include <algorithm>
#include <cmath>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "engine/config/knobs.h"
#include "profiler/analysis.h"
#include "profiler/store.h"

namespace ts::sessions {

using nlohmann::json;

namespace {

struct RunData {
    RunSummary summary;
    json config;  // configToJson form, null when the run has none (imported traces)
    std::vector<profiler::StepMetrics> steps;
    double peakTflops = 0;  // metadata peak_tflops (per device), 0 when absent
};

Result<RunData> load(const std::string& path) {
    RunData d;
    TS_ASSIGN_OR_RETURN(d.summary, summarizeRunFile(path));
    TS_ASSIGN_OR_RETURN(auto store, profiler::TraceStore::open(path, true));
    auto info = store->runInfo();
    if (info) d.config = json::parse(info->configJson, nullptr, false);
    if (d.config.is_discarded()) d.config = nullptr;
    auto steps = store->stepMetrics();
    if (steps) d.steps = *steps;
    if (auto peak = store->metadata("peak_tflops"); peak && peak->has_value()) d.peakTflops = std::atof((*peak)->c_str());
    return d;
}

double medianOf(const std::vector<profiler::StepMetrics>& v, double profiler::StepMetrics::*field) {
    std::vector<double> x;
    for (size_t i = v.size() > 1 ? 1 : 0; i < v.size(); ++i) x.push_back(v[i].*field);
    if (x.empty()) return 0;
    std::sort(x.begin(), x.end());
    size_t n = x.size();
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

std::string fmt(double v, const std::string& unit) {
    char buf[64];
    if (unit == "bytes") {
        const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
        int u = 0;
        double x = v;
        while (std::fabs(x) >= 1024 && u < 4) { x /= 1024; ++u; }
        std::snprintf(buf, sizeof buf, "%.2f %s", x, units[u]);
    } else if (unit == "s") {
        if (std::fabs(v) < 1) std::snprintf(buf, sizeof buf, "%.2f ms", v * 1e3);
        else std::snprintf(buf, sizeof buf, "%.3f s", v);
    } else if (unit == "%") {
        std::snprintf(buf, sizeof buf, "%.1f%%", v * 100);
    } else {
        std::snprintf(buf, sizeof buf, "%.4g%s%s", v, unit.empty() ? "" : " ", unit.c_str());
    }
    return buf;
}

void addTraceMetrics(Comparison& c, const json& ta, const json& tb, const CompareOptions& o) {
    struct Spec { const char* key; const char* name; const char* scopePrefix; const char* unit; };
    const Spec specs[] = {{"bubble_fraction", "bubble_fraction", "stage ", "%"},
                          {"exposed_comm_s", "exposed_comm_s", "group ", "s"},
                          {"peak_memory_bytes_by_rank", "peak_memory_bytes", "rank ", "bytes"}};
    for (const auto& s : specs) {
        json a = ta.value(s.key, json::object()), b = tb.value(s.key, json::object());
        std::vector<std::string> keys;
        for (auto& [k, v] : a.items()) keys.push_back(k);
        for (auto& [k, v] : b.items())
            if (!a.contains(k)) keys.push_back(k);
        for (const auto& k : keys) {
            double va = a.contains(k) && a[k].is_number() ? a[k].get<double>() : 0;
            double vb = b.contains(k) && b[k].is_number() ? b[k].get<double>() : 0;
            MetricDelta d = makeDelta(s.name, s.scopePrefix + k, s.unit, va, vb, true, o.noiseThreshold);
            if (o.all || d.better != "=") c.metrics.push_back(d);
        }
    }
}

}  // namespace

Result<json> analyzeTraceMetrics(const std::string& path) {
    TS_ASSIGN_OR_RETURN(auto store, profiler::TraceStore::open(path, true));
    TS_ASSIGN_OR_RETURN(auto windows, profiler::stepWindows(*store));
    TS_ASSIGN_OR_RETURN(auto ranks, store->ranks());
    json out = {{"bubble_fraction", json::object()}, {"exposed_comm_s", json::object()},
                {"peak_memory_bytes_by_rank", json::object()}};
    int firstStep = INT32_MAX, lastStep = INT32_MIN;
    for (const auto& w : windows) {
        firstStep = std::min(firstStep, w.step);
        lastStep = std::max(lastStep, w.step);
    }
    const bool skipFirst = lastStep > firstStep;
    int pp = 1;
    auto ppText = store->metadata("pp");
    if (ppText && ppText->has_value()) pp = std::max(1, std::atoi((*ppText)->c_str()));
    const int nranks = std::max<int>(1, int(ranks.size()));
    const int perStage = std::max(1, nranks / pp);
    std::map<int, std::pair<double, int>> bubble;            // stage -> (sum, n)
    std::map<std::string, double> exposed;                    // group -> ns summed
    int windowsUsed = 0;
    for (const auto& w : windows) {
        if (skipFirst && w.step == firstStep) continue;
        ++windowsUsed;
        auto b = profiler::pipelineBubble(*store, w);
        if (b) {
            auto& acc = bubble[w.rank / perStage];
            acc.first += b->fraction;
            acc.second += 1;
        }
        auto comm = profiler::commBreakdown(*store, w.rank, w.startNs, w.endNs);
        if (comm)
            for (const auto& g : *comm) exposed[g.group.empty() ? "unknown" : g.group] += g.exposedNs;
    }
    for (auto& [stage, acc] : bubble)
        if (acc.second > 0) out["bubble_fraction"][std::to_string(stage)] = acc.first / acc.second;
    if (windowsUsed > 0)
        for (auto& [g, ns] : exposed) out["exposed_comm_s"][g] = ns * 1e-9 / windowsUsed;
    for (int r : ranks) {
        auto mem = profiler::memorySummary(*store, r, 2);
        if (mem && mem->peakTotalBytes > 0) out["peak_memory_bytes_by_rank"][std::to_string(r)] = mem->peakTotalBytes;
    }
    return out;
}

MetricDelta makeDelta(std::string name, std::string scope, std::string unit, double a, double b,
                      bool lowerIsBetter, double noiseThreshold) {
    MetricDelta d;
    d.name = std::move(name);
    d.scope = std::move(scope);
    d.unit = std::move(unit);
    d.a = a;
    d.b = b;
    d.delta = b - a;
    d.relative = a != 0 ? (b - a) / std::fabs(a) : (b != 0 ? (b > 0 ? 1.0 : -1.0) : 0.0);
    d.lowerIsBetter = lowerIsBetter;
    if (std::fabs(d.relative) < noiseThreshold) d.better = "=";
    else d.better = ((b < a) == lowerIsBetter) ? "B" : "A";
    return d;
}

Result<Comparison> compareRuns(const std::string& pathA, const std::string& pathB, const CompareOptions& o) {
    TS_ASSIGN_OR_RETURN(RunData A, load(pathA));
    TS_ASSIGN_OR_RETURN(RunData B, load(pathB));
    Comparison c;
    c.a = A.summary;
    c.b = B.summary;

    // ---- knobs
    if (A.config.is_object() && B.config.is_object()) {
        auto ca = engine::configFromJson(A.config), cb = engine::configFromJson(B.config);
        if (ca && cb) {
            for (const auto& k : engine::knobRegistry()) {
                json va = k.get(*ca), vb = k.get(*cb);
                if (va == vb && !o.all) continue;
                if (k.name == "name" && !o.all) continue;  // a label, not a tuning knob
                c.knobs.push_back({k.name, k.group, engine::knobValueText(k, *ca), engine::knobValueText(k, *cb)});
            }
        } else {
            c.notes.push_back("a config could not be read: " +
                              (!ca ? ca.status().message() : cb.status().message()));
        }
    } else {
        c.notes.push_back("knobs: at least one run has no config (an imported trace); only metrics are compared");
    }

    // ---- metrics from step_metrics
    using SM = profiler::StepMetrics;
    auto add = [&](const char* name, const char* unit, double a, double b, bool lower) {
        MetricDelta d = makeDelta(name, "", unit, a, b, lower, o.noiseThreshold);
        if (o.all || d.better != "=") c.metrics.push_back(d);
    };
    if (A.steps.empty() || B.steps.empty()) {
        c.notes.push_back("step metrics: a run has no steps recorded");
    } else {
        add("step_time_s", "s", medianOf(A.steps, &SM::stepTimeS), medianOf(B.steps, &SM::stepTimeS), true);
        add("tokens_per_s", "tokens/s", medianOf(A.steps, &SM::tokensPerS), medianOf(B.steps, &SM::tokensPerS), false);
        add("model_tflops", "TFLOP/s", medianOf(A.steps, &SM::modelTflops), medianOf(B.steps, &SM::modelTflops), false);
        if (c.a.mfu > 0 && c.b.mfu > 0) {
            // MFU divides by each run's peak. Where both peaks are measurements (the CPU
            // backend times a GEMM at run start) they move with machine load, and two MFUs
            // over different peaks compare the machine's mood, not the runs. Both are then
            // taken against A's peak, so B/A equals the ratio of achieved FLOP/s per device.
            double mfuB = c.b.mfu;
            const double pa = A.peakTflops, pb = B.peakTflops;
            std::string scope;
            if (pa > 0 && pb > 0 && std::fabs(pb - pa) > o.noiseThreshold * pa) {
                mfuB = c.b.mfu * pb / pa;
                scope = "vs A's peak";
                char buf[256];
                std::snprintf(buf, sizeof buf,
                              "mfu: both runs against A's peak %.4g TFLOP/s per device; B's own peak measured "
                              "%.4g (B's MFU over its own peak: %.1f%%). A peak measured at run start moves with "
                              "machine load.",
                              pa, pb, c.b.mfu * 100);
                c.notes.push_back(buf);
            }
            MetricDelta d = makeDelta("mfu", scope, "%", c.a.mfu, mfuB, false, o.noiseThreshold);
            if (o.all || d.better != "=") c.metrics.push_back(d);
        } else {
            c.notes.push_back("mfu: unknown for at least one run (no peak FLOP/s for its device)");
        }
        add("peak_memory_bytes", "bytes", double(c.a.peakMemoryBytes), double(c.b.peakMemoryBytes), true);
        // Loss is only comparable at the same step.
        int common = std::min(A.steps.back().step, B.steps.back().step);
        auto lossAt = [&](const std::vector<SM>& v) {
            double loss = 0;
            for (const auto& m : v)
                if (m.step <= common) loss = m.loss;
            return loss;
        };
        MetricDelta d = makeDelta("loss", "step " + std::to_string(common), "", lossAt(A.steps), lossAt(B.steps),
                                  true, 1e-6);  // loss differences are meaningful far below 1%
        if (o.all || d.better != "=") c.metrics.push_back(d);
    }

    // ---- trace metrics
    if (o.traceAnalyzer) {
        auto ta = o.traceAnalyzer(c.a.path), tb = o.traceAnalyzer(c.b.path);
        if (ta && tb) addTraceMetrics(c, *ta, *tb, o);
        else c.notes.push_back("trace metrics: " + (!ta ? ta.status().message() : tb.status().message()));
    } else {
        c.notes.push_back("trace metrics (bubble per stage, exposed communication per group, peak memory per "
                          "rank): not available in this build (no trace analyzer)");
    }
    return c;
}

json Comparison::toJson() const {
    json knobsJ = json::array();
    for (const auto& k : knobs) knobsJ.push_back({{"knob", k.knob}, {"group", k.group}, {"a", k.a}, {"b", k.b}});
    json metricsJ = json::array();
    for (const auto& m : metrics)
        metricsJ.push_back({{"name", m.name}, {"scope", m.scope}, {"unit", m.unit}, {"a", m.a}, {"b", m.b},
                            {"delta", m.delta}, {"relative", m.relative},
                            {"lower_is_better", m.lowerIsBetter}, {"better", m.better}});
    return {{"a", a.toJson()}, {"b", b.toJson()}, {"knobs", knobsJ}, {"metrics", metricsJ}, {"notes", notes}};
}

std::string Comparison::toText() const {
    std::string out;
    auto line = [&](const std::string& s) { out += s + "\n"; };
    line("A: " + a.id + (a.name.empty() ? "" : " (" + a.name + ")") + "  " + a.status);
    line("B: " + b.id + (b.name.empty() ? "" : " (" + b.name + ")") + "  " + b.status);
    line("");
    if (knobs.empty()) {
        line("knobs: identical");
    } else {
        line("knobs that differ:");
        size_t w = 0;
        for (const auto& k : knobs) w = std::max(w, k.knob.size());
        for (const auto& k : knobs) {
            char buf[512];
            std::snprintf(buf, sizeof buf, "  %-*s  %s -> %s", int(w), k.knob.c_str(), k.a.c_str(), k.b.c_str());
            line(buf);
        }
    }
    line("");
    if (metrics.empty()) {
        line("metrics: no difference above noise");
    } else {
        line("metrics (B vs A, and which run is better):");
        for (const auto& m : metrics) {
            std::string name = m.name + (m.scope.empty() ? "" : " [" + m.scope + "]");
            char buf[512];
            std::snprintf(buf, sizeof buf, "  %-34s %12s -> %-12s %+7.1f%%  %s", name.c_str(), fmt(m.a, m.unit).c_str(),
                          fmt(m.b, m.unit).c_str(), m.relative * 100,
                          m.better == "=" ? "(same)" : m.better == "B" ? "B better" : "A better");
            line(buf);
        }
    }
    for (const auto& n : notes) line("note: " + n);
    return out;
}

}  // namespace ts::sessions
