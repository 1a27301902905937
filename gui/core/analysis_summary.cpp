// summarizeAnalysis (analysis_summary.h).
#include "gui/core/analysis_summary.h"

#include <algorithm>
#include <set>

namespace ts::gui {

using nlohmann::json;

namespace {
double num(const json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}
QString str(const json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_string() ? QString::fromStdString(j[key].get<std::string>()) : QString();
}
const json& arr(const json& j, const char* key) {
    static const json empty = json::array();
    return j.is_object() && j.contains(key) && j[key].is_array() ? j[key] : empty;
}
}  // namespace

QString AnalysisSummary::definition(const QString& key) const {
    auto it = definitions.find(key);
    return it == definitions.end() ? QString() : it->second;
}

AnalysisSummary summarizeAnalysis(const json& doc, int step) {
    AnalysisSummary s;
    if (doc.is_object() && doc.contains("definitions") && doc["definitions"].is_object())
        for (auto it = doc["definitions"].begin(); it != doc["definitions"].end(); ++it)
            if (it->is_string()) s.definitions[QString::fromStdString(it.key())] = QString::fromStdString(it->get<std::string>());
    s.worldSize = int(num(doc, "world_size"));
    s.pp = std::max(1, int(num(doc, "pp")));

    const json& steps = arr(doc, "steps");
    s.stepsInTrace = int(steps.size());
    std::vector<const json*> chosen;
    for (const auto& st : steps)
        if (step >= 0 ? int(num(st, "step")) == step : true) chosen.push_back(&st);
    if (step < 0 && chosen.size() > 1) chosen.erase(chosen.begin());  // warm-up
    const double n = std::max<size_t>(1, chosen.size());

    std::map<int, RankTime> ranks;
    std::map<int, StageBubble> stages;
    std::map<std::pair<QString, QString>, CommRow> comm;
    for (const json* st : chosen) {
        s.steps.push_back(int(num(*st, "step")));
        s.stepTimeS += num(*st, "step_time_s") / n;
        s.modelTflops += num(*st, "model_tflops") / n;
        s.modelTflopsPerDevice += num(*st, "model_tflops_per_device") / n;
        if (st->contains("mfu") && (*st)["mfu"].is_number()) s.mfu = (std::isnan(s.mfu) ? 0.0 : s.mfu) + (*st)["mfu"].get<double>() / n;
        for (const auto& r : arr(*st, "ranks")) {
            RankTime& rt = ranks[int(num(r, "rank"))];
            rt.rank = int(num(r, "rank"));
            rt.stage = int(num(r, "pp_stage"));
            const double stepS = num(r, "step_time_s"), bubble = num(r, "bubble_s"), exposed = num(r, "exposed_comm_s");
            rt.stepS += stepS / n;
            rt.computeS += std::max(0.0, stepS - bubble) / n;
            rt.exposedCommS += std::min(exposed, bubble) / n;
            rt.idleS += std::max(0.0, bubble - exposed) / n;
            for (const auto& c : arr(r, "comm")) {
                CommRow& row = comm[{str(c, "group"), str(c, "kind")}];
                row.group = str(c, "group");
                row.kind = str(c, "kind");
                row.commS += num(c, "comm_s") / n;
                row.overlappedS += num(c, "overlapped_comm_s") / n;
                row.exposedS += num(c, "exposed_comm_s") / n;
                row.bytes += num(c, "bytes") / n;
                row.count += num(c, "count") / n;
            }
        }
        for (const auto& sg : arr(*st, "stages")) {
            StageBubble& b = stages[int(num(sg, "pp_stage"))];
            b.stage = int(num(sg, "pp_stage"));
            b.fraction += num(sg, "bubble_fraction") / n;
            b.theory += num(sg, "bubble_fraction_theory") / n;
            b.bubbleS += num(sg, "bubble_s") / n;
        }
    }
    for (auto& [r, rt] : ranks) s.ranks.push_back(rt);
    for (auto& [i, b] : stages) s.stages.push_back(b);
    for (auto& [k, row] : comm) {
        s.comm.push_back(row);
        s.exposedCommByGroup[row.group.isEmpty() ? QStringLiteral("(none)") : row.group] += row.exposedS;
    }
    std::sort(s.comm.begin(), s.comm.end(), [](const CommRow& a, const CommRow& b) { return a.exposedS + a.overlappedS > b.exposedS + b.overlappedS; });

    std::map<QString, double> cats;
    bool first = true;
    for (const auto& r : arr(doc, "ranks")) {
        const json kernels = r.contains("kernels") ? r["kernels"] : json::object();
        for (const auto& c : arr(kernels, "by_category")) cats[str(c, "category")] += num(c, "total_s");
        if (first) {
            s.topKernelsRank = r.contains("rank") && r["rank"].is_number_integer() ? r["rank"].get<int>() : 0;
            for (const auto& k : arr(kernels, "top"))
                s.topKernels.push_back({str(k, "name"), str(k, "category"), num(k, "total_s"), num(k, "max_s"), num(k, "pct"),
                                        num(k, "flops"), num(k, "count")});
        }
        first = false;
    }
    for (auto& [c, t] : cats) s.categories.push_back({c, t});
    std::sort(s.categories.begin(), s.categories.end(), [](const auto& a, const auto& b) { return a.totalS > b.totalS; });

    for (const auto& c : arr(doc, "caveats"))
        if (c.is_string()) s.caveats.push_back(QString::fromStdString(c.get<std::string>()));
    const json in = doc.is_object() && doc.contains("mfu_inputs") ? doc["mfu_inputs"] : json::object();
    s.device = str(in, "device");
    s.dtype = str(in, "dtype");
    s.peakSource = str(in, "peak_source");
    s.flopsFormula = str(in, "flops_formula");
    s.flopsSource = str(in, "flops_source");
    if (in.contains("peak_tflops_per_device") && in["peak_tflops_per_device"].is_number())
        s.peakTflopsPerDevice = in["peak_tflops_per_device"].get<double>();
    return s;
}

}  // namespace ts::gui
