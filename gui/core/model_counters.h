// What the "MoE routing" and "FP8" panels draw, read from the optional "moe" and "fp8" sections
// of the `analyze --json` document (profiler/report.cpp addModelCounters, docs/profiler.md
// "Model counters"). The sections cover the whole run (or the step the document was made for):
// they are not re-averaged per selected step as AnalysisSummary is, because the analysis
// already reduced them (mean over steps, and the last step on its own).
#pragma once

#include <vector>

#include <QString>

#include <nlohmann/json.hpp>

namespace ts::gui {

// One MoE layer. "Mean" numbers are the document's means over the steps with samples; "last"
// ones are its last step alone.
struct MoeLayerRow {
    int layer = 0;
    int steps = 0;
    int lastStep = -1;
    double auxLoss = 0, zLoss = 0;          // aux_loss_mean, z_loss_mean
    double auxLossLast = 0, zLossLast = 0;
    std::vector<double> tokens;             // tokens_per_expert, index = expert
    std::vector<double> tokensLast;
    double imbalance = 0, imbalanceLast = 0;  // max / mean of the tokens (1 = balanced)
    int maxExpert = -1, maxExpertLast = -1;   // -1: no tokens

    // The values of one view: last = false for the means, true for the last step.
    const std::vector<double>& tokensOf(bool last) const { return last ? tokensLast : tokens; }
    double imbalanceOf(bool last) const { return last ? imbalanceLast : imbalance; }
    double auxLossOf(bool last) const { return last ? auxLossLast : auxLoss; }
    double zLossOf(bool last) const { return last ? zLossLast : zLoss; }
    int maxExpertOf(bool last) const { return last ? maxExpertLast : maxExpert; }
    // tokens[e] / mean(tokens): how many times its fair share expert e got (1 = balanced,
    // 0 when the layer routed no tokens). The heat map colours by it.
    double loadOf(int expert, bool last) const;
};

struct MoeView {
    bool present = false;          // the document has a "moe" section
    std::vector<MoeLayerRow> layers;  // by layer
    int experts = 0;               // the widest layer's expert count
    long long samplesOutsideSteps = 0;
    int lastStep = -1;             // the latest last_step over layers
    QString definition;            // definitions.moe
    // The layer with the largest imbalance (first on ties); -1 without layers.
    int mostImbalancedRow(bool last) const;
};

struct Fp8TensorRow {
    QString tensor;   // "layer0.linear_qkv.input"
    QString linear, slot;  // "linear_qkv", "input": the name's parts after the layer
    int layer = -1;
    double amax = 0, scaleMin = 0, scaleMax = 0;
    int ranks = 0;
    bool ranksDisagree() const { return scaleMin != scaleMax; }
};

struct Fp8View {
    bool present = false;          // the document has an "fp8" section
    int tensorCount = 0;           // tensor_count as the document states it
    std::vector<Fp8TensorRow> tensors;  // in the document's order (layer, then name)
    QString smallestTensor, largestTensor;
    double smallestScale = 0, largestScale = 0;
    int smallestRow = -1, largestRow = -1;  // index into tensors of smallest/largest_scale
    int disagreeing = 0;           // tensors whose scale differs across ranks
    QString definition;            // definitions.fp8
};

MoeView moeViewOf(const nlohmann::json& doc);
Fp8View fp8ViewOf(const nlohmann::json& doc);

}  // namespace ts::gui
