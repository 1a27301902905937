// Megatron-Bridge precision presets and Bridge YAML / overrides -> Config (bridge_import.h).
#include "sessions/bridge_import.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/config/knobs.h"
#include "engine/config/yaml_json.h"

namespace ts::sessions {

using nlohmann::json;
using engine::Config;
using engine::KnobDef;
using engine::KnobType;

namespace {

// What each preset sets of the knobs we carry (mixed_precision.py at the commit in
// resources/megatron/bridge_fields.tsv). MixedPrecisionConfig's own defaults fill the rest:
// fp8_margin 0, fp8_amax_history_len 1, fp8_amax_compute_algo most_recent.
struct Preset {
    const char* name;
    const char* fp8;     // "" = no fp8
    const char* recipe;  // fp8_recipe
    int amaxHistoryLen;
    const char* amaxAlgo;
};
constexpr Preset kPresets[] = {
    {"bf16_mixed", "", "", 1, "most_recent"},
    {"bf16_with_fp8_delayed_scaling_mixed", "hybrid", "delayed", 1024, "max"},
    {"bf16_with_fp8_current_scaling_mixed", "hybrid", "tensorwise", 1, "most_recent"},
    {"bf16_with_mxfp8_mixed", "e4m3", "mxfp8", 1, "most_recent"},
    {"bf16_with_fp8_subchannel_scaling_mixed", "hybrid", "blockwise", 1, "most_recent"},
};

const Preset* presetNamed(std::string name) {
    for (char& ch : name)
        if (ch == '-') ch = '_';  // Bridge registers bf16-mixed as well
    for (const auto& p : kPresets)
        if (name == p.name) return &p;
    return nullptr;
}

// Flattens nested mappings into dotted paths.
void flatten(const json& j, const std::string& prefix, std::vector<std::pair<std::string, json>>& out) {
    if (j.is_object() && !j.empty()) {
        for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
        return;
    }
    out.emplace_back(prefix, j);
}

std::string text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

std::string bridgePrecisionPreset(const Config& c, std::vector<std::string>* differences) {
    if (!c.bf16) return "";
    const Preset* chosen = &kPresets[0];
    if (!c.fp8.empty()) {
        for (const auto& p : kPresets)
            if (c.fp8_recipe == p.recipe) chosen = &p;
        if (chosen == &kPresets[0]) {
            if (differences) differences->push_back("fp8_recipe=" + c.fp8_recipe + ": no Bridge preset; bf16_mixed runs without fp8");
            return chosen->name;
        }
    }
    if (differences && !c.fp8.empty()) {
        if (c.fp8 != chosen->fp8)
            differences->push_back(std::string("fp8=") + c.fp8 + ": the Bridge preset " + chosen->name + " uses " + chosen->fp8);
        if (c.fp8_amax_history_len != chosen->amaxHistoryLen)
            differences->push_back("fp8_amax_history_len=" + std::to_string(c.fp8_amax_history_len) + ": the preset uses " +
                                   std::to_string(chosen->amaxHistoryLen));
        if (c.fp8_amax_compute_algo != chosen->amaxAlgo)
            differences->push_back("fp8_amax_compute_algo=" + c.fp8_amax_compute_algo + ": the preset uses " + chosen->amaxAlgo);
        if (c.fp8_margin != 0) differences->push_back("fp8_margin=" + std::to_string(c.fp8_margin) + ": the preset uses 0");
    }
    return chosen->name;
}

bool applyBridgePrecisionPreset(const std::string& name, Config& c) {
    const Preset* p = presetNamed(name);
    if (!p) return false;
    c.bf16 = true;
    c.fp8 = p->fp8;
    if (*p->recipe) c.fp8_recipe = p->recipe;
    c.fp8_amax_history_len = p->amaxHistoryLen;
    c.fp8_amax_compute_algo = p->amaxAlgo;
    c.fp8_margin = 0;
    return true;
}

Result<BridgeImport> configFromBridge(const std::string& input) {
    BridgeImport r;
    std::vector<std::pair<std::string, json>> entries;
    // The input's non-blank, non-comment lines, trailing CR/space trimmed, leading blanks cut.
    std::vector<std::string> lines;
    for (size_t pos = 0; pos <= input.size();) {
        size_t nl = input.find('\n', pos);
        if (nl == std::string::npos) nl = input.size();
        std::string line = input.substr(pos, nl - pos);
        pos = nl + 1;
        while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
        const size_t b = line.find_first_not_of(" \t");
        if (b == std::string::npos || line[b] == '#') continue;
        lines.push_back(line.substr(b));
    }
    // Override lines have '=' in every line and no "key:" YAML structure before it.
    const bool overrides = !lines.empty() && std::all_of(lines.begin(), lines.end(), [](const std::string& l) {
        const size_t eq = l.find('='), colon = l.find(':');
        return eq != std::string::npos && (colon == std::string::npos || eq < colon);
    });
    if (overrides) {
        for (std::string line : lines) {
            while (!line.empty() && line[0] == '+') line.erase(0, 1);  // Hydra's +key / ++key
            const size_t eq = line.find('=');
            const std::string path = line.substr(0, eq), value = line.substr(eq + 1);
            auto v = engine::yamlToJson(value.empty() ? "null" : value);
            if (!v) {
                r.unmapped.push_back(line + " (" + v.status().message() + ")");
                continue;
            }
            entries.emplace_back(path, *v);
        }
    } else {
        TS_ASSIGN_OR_RETURN(json doc, engine::yamlToJson(input));
        if (!doc.is_object()) return Status::invalid("a Bridge config must be a YAML mapping or lines of path=value");
        flatten(doc, "", entries);
    }

    std::map<std::string, std::vector<std::pair<const KnobDef*, bool>>> byPath;
    for (const auto& k : engine::knobRegistry())
        if (!k.bridgePath.empty()) byPath[k.bridgePath].push_back({&k, k.bridgeNegate});

    Config& c = r.config;
    json datasetSeq, activation;
    bool gated = false, sawGated = false;
    std::string presetName;
    json mpFields = json::object();  // mixed_precision.* of a ConfigContainer dump
    for (const auto& [path, v] : entries) {
        const std::string shown = path + "=" + text(v);
        if (path == "mixed_precision") {
            if (v.is_null()) { c.bf16 = false; c.fp8 = ""; }
            else if (!v.is_string() || !applyBridgePrecisionPreset(v.get<std::string>(), c))
                r.unmapped.push_back(shown + " (not a bf16 preset trainscope runs)");
            else presetName = v.get<std::string>();
            continue;
        }
        if (path.rfind("mixed_precision.", 0) == 0) {
            mpFields[path.substr(16)] = v;
            continue;
        }
        if (path == "model.activation_func") { activation = v; continue; }
        if (path == "model.gated_linear_unit") { sawGated = true; gated = v.is_boolean() && v.get<bool>(); continue; }
        if (path == "dataset.seq_length" || path == "dataset.sequence_length") { datasetSeq = v; continue; }
        if (path == "model.bf16" || path == "optimizer.bf16") {
            if (v.is_boolean()) c.bf16 = v.get<bool>();
            continue;
        }
        if (path == "model.fp16" || path == "optimizer.fp16") {
            if (v.is_boolean() && v.get<bool>()) r.unmapped.push_back(shown + " (fp16 is not a trainscope precision)");
            continue;
        }
        if (path == "model.fp8" || path == "model.fp8_recipe" || path == "model.fp8_amax_history_len" ||
            path == "model.fp8_amax_compute_algo" || path == "model.fp8_margin") {
            mpFields[path.substr(6)] = v;
            continue;
        }
        auto it = byPath.find(path);
        if (it == byPath.end()) {
            r.unmapped.push_back(shown);
            continue;
        }
        for (auto [k, negate] : it->second) {
            std::string err;
            if (v.is_null()) {
                // Bridge's None: the feature is off / the size is derived.
                const Config defaults;
                if (k->type == KnobType::Int && k->get(defaults) == 0) err = k->set(c, json(0));
                else if (k->name == "virtual_pipeline_model_parallel_size") err = k->set(c, json(1));
                else if (k->type == KnobType::Enum || k->type == KnobType::String) err = k->set(c, json(""));
                else if (k->zeroIsUnset) err = k->set(c, json(0.0));
                else if (k->type == KnobType::StringList) err = k->set(c, k->get(defaults));
                else if (k->name == "expert_tensor_parallel_size") err = k->set(c, json(0));
                else err = k->set(c, k->get(defaults));
            } else if (k->type == KnobType::Bool && negate && v.is_boolean()) {
                err = k->set(c, json(!v.get<bool>()));
            } else if (k->type == KnobType::Int && v.is_number_float()) {
                err = k->set(c, v);
            } else {
                err = k->set(c, v);
            }
            if (!err.empty()) r.unmapped.push_back(shown + " (" + k->name + ": " + err + ")");
        }
    }
    // A ConfigContainer dump spells the precision out field by field.
    if (!mpFields.empty()) {
        if (mpFields.contains("bf16") && mpFields["bf16"].is_boolean()) c.bf16 = mpFields["bf16"].get<bool>();
        if (mpFields.contains("fp8")) c.fp8 = mpFields["fp8"].is_string() ? mpFields["fp8"].get<std::string>() : "";
        for (const char* name : {"fp8_recipe", "fp8_amax_history_len", "fp8_amax_compute_algo", "fp8_margin"}) {
            if (!mpFields.contains(name) || mpFields[name].is_null()) continue;
            std::string err = engine::findKnob(name)->set(c, mpFields[name]);
            if (!err.empty()) r.unmapped.push_back(std::string("mixed_precision.") + name + " (" + err + ")");
        }
        for (auto it = mpFields.begin(); it != mpFields.end(); ++it) {
            static const char* known[] = {"bf16", "fp8", "fp8_recipe", "fp8_amax_history_len", "fp8_amax_compute_algo",
                                          "fp8_margin", "fp32", "fp16", "params_dtype", "pipeline_dtype", "autocast_dtype",
                                          "autocast_enabled", "grad_reduce_in_fp32"};
            if (std::find(std::begin(known), std::end(known), it.key()) == std::end(known) && !it.value().is_null() &&
                it.value() != json(false) && it.value() != json(0))
                r.notes.push_back("mixed_precision." + it.key() + "=" + text(it.value()) + " has no trainscope knob");
        }
    }
    // SwiGLU is a gated linear unit with SiLU; a gated unit with another activation is not.
    if (sawGated || !activation.is_null()) {
        const std::string act = activation.is_string() ? activation.get<std::string>() : "gelu";
        const bool silu = act == "silu" || act == "torch.nn.functional.silu";
        if (gated && silu) c.swiglu = true;
        else if (!gated && (act == "gelu" || act == "torch.nn.functional.gelu" || activation.is_null())) c.swiglu = false;
        else r.unmapped.push_back("model.gated_linear_unit=" + std::string(gated ? "true" : "false") +
                                  " with model.activation_func=" + act + " (trainscope runs GeLU or SwiGLU)");
    }
    if (!datasetSeq.is_null() && datasetSeq != json(c.seq_length))
        r.notes.push_back("dataset.seq_length=" + text(datasetSeq) + " differs from model.seq_length=" +
                          std::to_string(c.seq_length) + " (Bridge asserts them equal); seq_length follows the model");
    // An explicit ffn_hidden_size equal to what Megatron derives stays "derived".
    if (c.ffn_hidden_size > 0) {
        Config derived = c;
        derived.ffn_hidden_size = 0;
        if (engine::deriveSizes(derived).ffn_hidden_size == c.ffn_hidden_size) c.ffn_hidden_size = 0;
    }
    if (!presetName.empty()) r.notes.push_back("mixed_precision=" + presetName + " read as bf16" + (c.fp8.empty() ? "" : " with fp8=" + c.fp8 + " (" + c.fp8_recipe + ")"));
    return r;
}

}  // namespace ts::sessions
