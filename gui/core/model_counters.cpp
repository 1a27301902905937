// moeViewOf, fp8ViewOf (model_counters.h).
#include "gui/core/model_counters.h"

#include <algorithm>
#include <numeric>

#include <QStringList>

namespace ts::gui {

using nlohmann::json;

namespace {
double num(const json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}
int integer(const json& j, const char* key, int missing) {
    return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<int>() : missing;
}
QString str(const json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_string() ? QString::fromStdString(j[key].get<std::string>()) : QString();
}
std::vector<double> numbers(const json& j, const char* key) {
    std::vector<double> out;
    if (j.is_object() && j.contains(key) && j[key].is_array())
        for (const auto& v : j[key]) out.push_back(v.is_number() ? v.get<double>() : 0.0);
    return out;
}
// The profiler's max_expert rule (lowest index on ties, none without tokens), for the last
// step, which the document does not name.
int argmaxExpert(const std::vector<double>& tokens) {
    int best = -1;
    for (int e = 0; e < int(tokens.size()); ++e)
        if (tokens[size_t(e)] > 0 && (best < 0 || tokens[size_t(e)] > tokens[size_t(best)])) best = e;
    return best;
}
}  // namespace

double MoeLayerRow::loadOf(int expert, bool last) const {
    const std::vector<double>& t = tokensOf(last);
    if (expert < 0 || expert >= int(t.size())) return 0;
    const double mean = std::accumulate(t.begin(), t.end(), 0.0) / double(t.size());
    return mean > 0 ? t[size_t(expert)] / mean : 0.0;
}

int MoeView::mostImbalancedRow(bool last) const {
    int best = -1;
    for (int i = 0; i < int(layers.size()); ++i)
        if (best < 0 || layers[size_t(i)].imbalanceOf(last) > layers[size_t(best)].imbalanceOf(last)) best = i;
    return best;
}

MoeView moeViewOf(const json& doc) {
    MoeView v;
    if (!doc.is_object() || !doc.contains("moe") || !doc["moe"].is_object()) return v;
    const json& moe = doc["moe"];
    v.present = true;
    v.samplesOutsideSteps = moe.contains("samples_outside_steps") && moe["samples_outside_steps"].is_number()
                                ? moe["samples_outside_steps"].get<long long>()
                                : 0;
    if (moe.contains("layers") && moe["layers"].is_array())
        for (const auto& l : moe["layers"]) {
            MoeLayerRow r;
            r.layer = integer(l, "layer", 0);
            r.steps = integer(l, "steps", 0);
            r.lastStep = integer(l, "last_step", -1);
            r.auxLoss = num(l, "aux_loss_mean");
            r.zLoss = num(l, "z_loss_mean");
            r.auxLossLast = num(l, "aux_loss_last");
            r.zLossLast = num(l, "z_loss_last");
            r.tokens = numbers(l, "tokens_per_expert");
            r.tokensLast = numbers(l, "tokens_per_expert_last");
            r.imbalance = num(l, "imbalance");
            r.imbalanceLast = num(l, "imbalance_last");
            r.maxExpert = integer(l, "max_expert", -1);  // null without tokens
            r.maxExpertLast = argmaxExpert(r.tokensLast);
            v.experts = std::max({v.experts, int(r.tokens.size()), int(r.tokensLast.size())});
            v.lastStep = std::max(v.lastStep, r.lastStep);
            v.layers.push_back(std::move(r));
        }
    std::sort(v.layers.begin(), v.layers.end(), [](const MoeLayerRow& a, const MoeLayerRow& b) { return a.layer < b.layer; });
    if (doc.contains("definitions")) v.definition = str(doc["definitions"], "moe");
    return v;
}

Fp8View fp8ViewOf(const json& doc) {
    Fp8View v;
    if (!doc.is_object() || !doc.contains("fp8") || !doc["fp8"].is_object()) return v;
    const json& fp8 = doc["fp8"];
    v.present = true;
    if (fp8.contains("tensors") && fp8["tensors"].is_array())
        for (const auto& t : fp8["tensors"]) {
            Fp8TensorRow r;
            r.tensor = str(t, "tensor");
            // layer<L>.<linear>.<slot>, or with the expert / shared experts in between
            // (layer<L>.expert<E>.<linear>.<slot>): sortable by linear or by slot.
            const QStringList parts = r.tensor.split(QLatin1Char('.'));
            if (parts.size() >= 3) {
                r.linear = parts.mid(1, parts.size() - 2).join(QLatin1Char('.'));
                r.slot = parts.last();
            }
            r.layer = integer(t, "layer", -1);
            r.amax = num(t, "amax");
            r.scaleMin = num(t, "scale_min");
            r.scaleMax = num(t, "scale_max");
            r.ranks = integer(t, "ranks", 0);
            if (r.ranksDisagree()) ++v.disagreeing;
            v.tensors.push_back(std::move(r));
        }
    v.tensorCount = integer(fp8, "tensor_count", int(v.tensors.size()));
    const json none = json::object();
    const json& lo = fp8.contains("smallest_scale") ? fp8["smallest_scale"] : none;
    const json& hi = fp8.contains("largest_scale") ? fp8["largest_scale"] : none;
    v.smallestTensor = str(lo, "tensor");
    v.smallestScale = num(lo, "scale");
    v.largestTensor = str(hi, "tensor");
    v.largestScale = num(hi, "scale");
    // Tensor names are unique in the document (layer<L>.<linear>.<slot>), so the name finds the row.
    for (int i = 0; i < int(v.tensors.size()); ++i) {
        if (v.smallestRow < 0 && v.tensors[size_t(i)].tensor == v.smallestTensor) v.smallestRow = i;
        if (v.largestRow < 0 && v.tensors[size_t(i)].tensor == v.largestTensor) v.largestRow = i;
    }
    if (doc.contains("definitions")) v.definition = str(doc["definitions"], "fp8");
    return v;
}

}  // namespace ts::gui
