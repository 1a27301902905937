// Summaries of the model counters the engine records next to the trace: the MoE router's
// losses and tokens per expert, and the FP8 amax / scale of every FP8 tensor. Definitions in
// analysis.h and docs/profiler.md.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "profiler/analysis.h"

namespace ts::profiler {

namespace {

bool startsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool endsWith(std::string_view s, std::string_view p) {
    return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Leading decimal digits of s as an int; the rest is left in s. nullopt without digits.
std::optional<int> takeInt(std::string_view& s) {
    int v = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (r.ec != std::errc() || r.ptr == s.data() || v < 0) return std::nullopt;
    s.remove_prefix(size_t(r.ptr - s.data()));
    return v;
}

// "moe.layer<L>.aux_loss" | ".z_loss" | ".tokens.expert<E>" | ".dropped_tokens"
struct MoeName {
    int layer = 0;
    enum Kind { Aux, Z, Tokens, Dropped } kind = Aux;
    int expert = -1;
};
std::optional<MoeName> parseMoe(std::string_view n) {
    if (!startsWith(n, "moe.layer")) return std::nullopt;
    n.remove_prefix(9);
    MoeName m;
    auto layer = takeInt(n);
    if (!layer) return std::nullopt;
    m.layer = *layer;
    if (n == ".aux_loss") {
        m.kind = MoeName::Aux;
    } else if (n == ".z_loss") {
        m.kind = MoeName::Z;
    } else if (n == ".dropped_tokens") {
        m.kind = MoeName::Dropped;
    } else if (startsWith(n, ".tokens.expert")) {
        n.remove_prefix(14);
        auto e = takeInt(n);
        if (!e || !n.empty()) return std::nullopt;
        m.kind = MoeName::Tokens;
        m.expert = *e;
    } else {
        return std::nullopt;
    }
    return m;
}

// "fp8.layer<L>.<linear>.<slot>.amax" | ".scale" -> tensor "layer<L>.<linear>.<slot>"
struct Fp8Name {
    std::string tensor;
    int layer = -1;
    bool scale = false;
};
std::optional<Fp8Name> parseFp8(std::string_view n) {
    if (!startsWith(n, "fp8.layer")) return std::nullopt;
    Fp8Name f;
    if (endsWith(n, ".amax")) {
        n.remove_suffix(5);
    } else if (endsWith(n, ".scale")) {
        n.remove_suffix(6);
        f.scale = true;
    } else {
        return std::nullopt;
    }
    n.remove_prefix(4);
    f.tensor = std::string(n);
    n.remove_prefix(5);  // "layer"
    auto layer = takeInt(n);
    if (!layer || n.size() < 2 || n[0] != '.') return std::nullopt;
    f.layer = *layer;
    return f;
}

// Step of a sample: the window of the sample's rank that contains ts, if any.
class StepIndex {
public:
    explicit StepIndex(const std::vector<StepWindow>& windows) {
        for (const auto& w : windows) m_byRank[w.rank].push_back(w);
        for (auto& [rank, ws] : m_byRank)
            std::sort(ws.begin(), ws.end(), [](const StepWindow& a, const StepWindow& b) { return a.startNs < b.startNs; });
    }
    std::optional<int> stepOf(int rank, int64_t ts) const {
        auto it = m_byRank.find(rank);
        if (it == m_byRank.end()) return std::nullopt;
        const auto& ws = it->second;
        // Last window starting at or before ts; step windows of one rank do not overlap.
        auto w = std::upper_bound(ws.begin(), ws.end(), ts, [](int64_t t, const StepWindow& x) { return t < x.startNs; });
        if (w == ws.begin()) return std::nullopt;
        --w;
        if (ts >= w->endNs) return std::nullopt;
        return w->step;
    }

private:
    std::map<int, std::vector<StepWindow>> m_byRank;
};

// max / mean of the values, and the index of the first maximum; (0, -1) when they sum to 0.
std::pair<double, int> imbalanceOf(const std::vector<double>& v) {
    double sum = 0, mx = 0;
    int arg = -1;
    for (size_t i = 0; i < v.size(); ++i) {
        sum += v[i];
        if (arg < 0 || v[i] > mx) {
            mx = v[i];
            arg = int(i);
        }
    }
    if (sum <= 0) return {0.0, -1};
    return {mx / (sum / double(v.size())), arg};
}

}  // namespace

Result<MoeSummary> moeSummary(TraceStore& store, const std::vector<StepWindow>& windows, int step) {
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    // Parse each interned name once; a run without MoE counters never reads the counter table.
    std::vector<std::optional<MoeName>> names(strings.size());
    bool any = false;
    for (size_t i = 0; i < strings.size(); ++i) any |= bool(names[i] = parseMoe(strings[i]));
    MoeSummary out;
    if (!any) return out;
    TS_ASSIGN_OR_RETURN(auto counters, store.counters(-1));
    const StepIndex index(windows);

    struct StepAcc {
        double aux = 0, z = 0, dropped = 0;
        int64_t auxN = 0, zN = 0, droppedN = 0;
        std::vector<double> tokens;
    };
    std::map<int, std::map<int, StepAcc>> acc;  // layer -> step -> sums
    for (const auto& c : counters) {
        if (c.name >= names.size() || !names[c.name]) continue;
        const MoeName& n = *names[c.name];
        auto s = index.stepOf(c.rank, c.tsNs);
        if (!s) {
            ++out.samplesOutsideSteps;
            continue;
        }
        if (step >= 0 && *s != step) continue;
        StepAcc& a = acc[n.layer][*s];
        switch (n.kind) {
            case MoeName::Aux:
                a.aux += c.value;
                ++a.auxN;
                break;
            case MoeName::Z:
                a.z += c.value;
                ++a.zN;
                break;
            case MoeName::Tokens:
                if (a.tokens.size() <= size_t(n.expert)) a.tokens.resize(size_t(n.expert) + 1, 0.0);
                a.tokens[size_t(n.expert)] += c.value;
                break;
            case MoeName::Dropped:
                a.dropped += c.value;
                ++a.droppedN;
                break;
        }
    }
    for (auto& [layer, steps] : acc) {
        MoeLayerStats l;
        l.layer = layer;
        l.steps = int(steps.size());
        size_t experts = 0;
        for (auto& [s, a] : steps) experts = std::max(experts, a.tokens.size());
        l.tokensPerExpert.assign(experts, 0.0);
        int auxSteps = 0, zSteps = 0, tokenSteps = 0, droppedSteps = 0;
        for (auto& [s, a] : steps) {
            if (a.droppedN) {
                l.droppedMean += a.dropped;
                ++droppedSteps;
                l.hasDropped = true;
            }
            if (a.auxN) {
                l.auxLossMean += a.aux / double(a.auxN);
                ++auxSteps;
            }
            if (a.zN) {
                l.zLossMean += a.z / double(a.zN);
                ++zSteps;
            }
            if (!a.tokens.empty()) {
                for (size_t e = 0; e < a.tokens.size(); ++e) l.tokensPerExpert[e] += a.tokens[e];
                ++tokenSteps;
            }
        }
        if (auxSteps) l.auxLossMean /= auxSteps;
        if (droppedSteps) l.droppedMean /= droppedSteps;
        if (zSteps) l.zLossMean /= zSteps;
        if (tokenSteps)
            for (double& t : l.tokensPerExpert) t /= tokenSteps;
        std::tie(l.imbalance, l.maxExpert) = imbalanceOf(l.tokensPerExpert);
        const auto& [lastStep, last] = *steps.rbegin();
        l.lastStep = lastStep;
        l.auxLossLast = last.auxN ? last.aux / double(last.auxN) : 0.0;
        l.zLossLast = last.zN ? last.z / double(last.zN) : 0.0;
        l.droppedLast = last.dropped;
        l.tokensPerExpertLast = last.tokens;
        l.tokensPerExpertLast.resize(experts, 0.0);
        l.imbalanceLast = imbalanceOf(l.tokensPerExpertLast).first;
        out.layers.push_back(std::move(l));
    }
    return out;
}

const Fp8TensorStats* Fp8Summary::smallestScale() const {
    auto it = std::min_element(tensors.begin(), tensors.end(),
                               [](const Fp8TensorStats& a, const Fp8TensorStats& b) { return a.scaleMin < b.scaleMin; });
    return it == tensors.end() ? nullptr : &*it;
}

const Fp8TensorStats* Fp8Summary::largestScale() const {
    auto it = std::max_element(tensors.begin(), tensors.end(),
                               [](const Fp8TensorStats& a, const Fp8TensorStats& b) { return a.scaleMax < b.scaleMax; });
    return it == tensors.end() ? nullptr : &*it;
}

Result<Fp8Summary> fp8Summary(TraceStore& store, const std::vector<StepWindow>& windows, int step) {
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    std::vector<std::optional<Fp8Name>> names(strings.size());
    bool any = false;
    for (size_t i = 0; i < strings.size(); ++i) any |= bool(names[i] = parseFp8(strings[i]));
    Fp8Summary out;
    if (!any) return out;
    TS_ASSIGN_OR_RETURN(auto counters, store.counters(-1));
    const StepIndex index(windows);

    // (layer, tensor) -> rank -> latest (ts, value) of amax and of scale
    struct Latest {
        int64_t ts = INT64_MIN;
        double value = 0;
        bool seen = false;
    };
    std::map<std::pair<int, std::string>, std::map<int, std::pair<Latest, Latest>>> last;
    for (const auto& c : counters) {
        if (c.name >= names.size() || !names[c.name]) continue;
        const Fp8Name& n = *names[c.name];
        if (step >= 0 && index.stepOf(c.rank, c.tsNs) != step) continue;
        auto& pair = last[{n.layer, n.tensor}][c.rank];
        Latest& l = n.scale ? pair.second : pair.first;
        // >=: of samples at the same time the one stored last wins.
        if (!l.seen || c.tsNs >= l.ts) l = {c.tsNs, c.value, true};
    }
    for (auto& [key, byRank] : last) {
        Fp8TensorStats t;
        t.layer = key.first;
        t.tensor = key.second;
        bool anyScale = false;
        for (auto& [rank, l] : byRank) {
            ++t.ranks;
            if (l.first.seen) t.amax = std::max(t.amax, l.first.value);
            if (l.second.seen) {
                t.scaleMin = anyScale ? std::min(t.scaleMin, l.second.value) : l.second.value;
                t.scaleMax = anyScale ? std::max(t.scaleMax, l.second.value) : l.second.value;
                anyScale = true;
            }
        }
        out.tensors.push_back(std::move(t));
    }
    return out;
}

}  // namespace ts::profiler
