// A/B comparison of two runs (docs/workspace.md "Compare"): which knobs differ (from the run
// files' config JSON), then metric deltas with the direction that is better for each metric.
//
// Metrics from step_metrics (medians over steps after the first, which carries warm-up):
// step time (lower is better), tokens/s, model TFLOP/s, MFU (higher), peak memory (lower),
// loss at the last step both runs reached (lower). Trace metrics (bubble per pipeline stage,
// exposed communication per group, peak memory per rank) come from a TraceAnalyzer callback
// over the profiler's analyses; without one they are listed as unavailable in notes.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "sessions/workspace.h"

namespace ts::sessions {

struct KnobDiff {
    std::string knob, group;
    std::string a, b;  // value text
};

struct MetricDelta {
    std::string name;     // "step_time_s", "bubble_fraction", "exposed_comm_s", "peak_memory_bytes"
    std::string scope;    // "" (whole run), "stage 1", "group dp", "rank 3"
    std::string unit;     // "s", "tokens/s", "TFLOP/s", "", "bytes"
    double a = 0, b = 0;
    double delta = 0;     // b - a
    double relative = 0;  // (b - a) / |a|; 0 when a == 0
    bool lowerIsBetter = true;
    std::string better;   // "A", "B" or "=" (|relative| below the noise threshold)
};

// Trace metrics of one run in a fixed shape:
//   {"bubble_fraction": {"0": 0.25, ...}            per pipeline stage (pp rank)
//    "exposed_comm_s":  {"dp": 0.012, "tp": ...}    per process group, per step
//    "peak_memory_bytes_by_rank": {"0": 123, ...}}
using TraceAnalyzer = std::function<Result<nlohmann::json>(const std::string& runFilePath)>;

// The trace metrics above computed with the profiler's analyses (profiler/analysis.h) over
// every step after the first (warm-up), when the run has more than one:
//   bubble_fraction[stage]  mean pipelineBubble().fraction over the stage's ranks and steps;
//                           stage = rank / (ranks / metadata "pp") (Megatron order, pp outermost)
//   exposed_comm_s[group]   commBreakdown() exposed time, summed over the group's kinds, mean
//                           per rank per step
//   peak_memory_bytes_by_rank[rank]  memorySummary().peakTotalBytes
Result<nlohmann::json> analyzeTraceMetrics(const std::string& runFilePath);

struct CompareOptions {
    bool all = false;                 // include knobs/metrics that do not differ
    double noiseThreshold = 0.01;     // |relative| below this counts as "="
    TraceAnalyzer traceAnalyzer;      // null: trace metrics unavailable
};

struct Comparison {
    RunSummary a, b;
    std::vector<KnobDiff> knobs;
    std::vector<MetricDelta> metrics;
    std::vector<std::string> notes;

    nlohmann::json toJson() const;
    std::string toText() const;
};

Result<Comparison> compareRuns(const std::string& runFileA, const std::string& runFileB,
                               const CompareOptions& options = {});

// The MetricDelta for two values (exposed for tests).
MetricDelta makeDelta(std::string name, std::string scope, std::string unit, double a, double b,
                      bool lowerIsBetter, double noiseThreshold);

}  // namespace ts::sessions
