// What the analysis panels and the A/B view draw, reduced from the `analyze --json` document
// (profiler/report.cpp, docs/profiler.md) in one tested place. Per-step numbers are means over
// the chosen steps: one selected step, or every step after the first (the first carries
// warm-up) when the run has more than one.
#pragma once

#include <cmath>
#include <map>
#include <vector>

#include <QString>

#include <nlohmann/json.hpp>

namespace ts::gui {

struct RankTime {
    int rank = 0, stage = 0;
    double stepS = 0;
    double computeS = 0;      // step - bubble: the compute stream was busy
    double exposedCommS = 0;  // communication no compute hid (part of the bubble)
    double idleS = 0;         // bubble - exposed comm: waiting on the pipeline, the host, ...
};
struct StageBubble {
    int stage = 0;
    double fraction = 0, theory = 0, bubbleS = 0;
};
struct CommRow {
    QString group, kind;
    double commS = 0, overlappedS = 0, exposedS = 0, bytes = 0;  // summed over ranks, mean per step
    double count = 0;
};
struct CategoryTime {
    QString category;
    double totalS = 0;  // summed over ranks, whole trace
};
struct KernelRow {
    QString name, category;
    double totalS = 0, maxS = 0, pct = 0, flops = 0, count = 0;
};

struct AnalysisSummary {
    std::vector<int> steps;          // the steps averaged
    int stepsInTrace = 0;            // every step of the run
    std::vector<RankTime> ranks;
    std::vector<StageBubble> stages;
    std::vector<CommRow> comm;       // by exposed time, largest first
    std::map<QString, double> exposedCommByGroup;  // summed over ranks, mean per step
    std::vector<CategoryTime> categories;          // by total time, largest first
    std::vector<KernelRow> topKernels;             // the first rank's top kernels (rank 0 of our runs)
    int topKernelsRank = 0;                        // which rank that is (an imported trace's own)
    double stepTimeS = 0;            // mean of the steps' step time (max over ranks)
    double modelTflops = 0, modelTflopsPerDevice = 0;
    double mfu = NAN;                // NaN: no peak known
    double peakTflopsPerDevice = NAN;
    int worldSize = 0, pp = 1;
    QString device, dtype, peakSource, flopsFormula, flopsSource;
    std::vector<QString> caveats;    // what the run's numbers are not (the document's `caveats`)
    std::map<QString, QString> definitions;  // the document's own (one source with the CLI)
    QString definition(const QString& key) const;
};

AnalysisSummary summarizeAnalysis(const nlohmann::json& doc, int step = -1);

}  // namespace ts::gui
