// Config export to our YAML, Megatron-LM arguments and Megatron-Bridge overrides (export.h).
#include "sessions/export.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "engine/config/knobs.h"
#include "profiler/store.h"

namespace ts::sessions {

using nlohmann::json;
using engine::Config;
using engine::KnobDef;
using engine::KnobType;

namespace {

// Value text for a command line / override: integers and strings as-is, floats in JSON form
// (Python parses "0.0003" and "1e-08" alike), lists space-separated for argparse nargs='+'.
std::string valueText(const json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
    return v.dump();
}

// True when a knob holds a "not set / derived" sentinel that Megatron expresses by leaving
// the flag out, or when the knob only matters with a feature that is off.
bool leaveOut(const KnobDef& k, const Config& c) {
    static const Config defaults;
    const json v = k.get(c), d = k.get(defaults);
    if ((k.type == KnobType::Int) && v == 0 && d == 0) return true;       // 0 = derived / unset
    if ((k.type == KnobType::String || k.type == KnobType::Enum) && v == "") return true;
    if (k.name == "virtual_pipeline_model_parallel_size" && c.virtual_pipeline_model_parallel_size <= 1) return true;
    if (k.group == "moe" && c.num_moe_experts == 0) return true;
    if ((k.name == "expert_model_parallel_size" || k.name == "expert_tensor_parallel_size") && c.num_moe_experts == 0)
        return true;
    if (k.name.rfind("fp8_", 0) == 0 && c.fp8.empty()) return true;
    if (k.name == "cp_comm_type" && c.context_parallel_size <= 1) return true;
    if (k.name == "recompute_modules" && c.recompute_granularity != "selective") return true;
    if ((k.name == "recompute_method" || k.name == "recompute_num_layers") && c.recompute_granularity != "full")
        return true;
    return false;
}

std::string quoteIfNeeded(const std::string& s) {
    bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.' || ch == '/';
    });
    if (plain) return s;
    std::string out = "\"";
    for (char ch : s) {
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch;
    }
    return out + "\"";
}

}  // namespace

Result<ExportFormat> parseExportFormat(const std::string& t) {
    if (t == "yaml") return ExportFormat::Yaml;
    if (t == "megatron-args" || t == "megatron") return ExportFormat::MegatronArgs;
    if (t == "bridge-overrides" || t == "bridge") return ExportFormat::BridgeOverrides;
    return Status::invalid("unknown export format '" + t + "'; use yaml, megatron-args or bridge-overrides");
}

std::vector<std::string> megatronArgs(const Config& c, std::vector<std::string>* notes) {
    std::vector<std::string> out;
    const engine::DerivedSizes ds = engine::deriveSizes(c);
    for (const KnobDef& k : engine::knobRegistry()) {
        const json v = k.get(c);
        if (k.type == KnobType::Bool) {
            const bool on = v.get<bool>();
            // Only a false-flag means Megatron defaults to true (knobs.h); emit the flag that
            // moves Megatron to our value, nothing when Megatron's default already matches.
            std::string flag = on ? k.megatronFlag : k.megatronFalseFlag;
            if (k.name == "bias_activation_fusion" && !on && c.swiglu) flag = "--no-bias-swiglu-fusion";
            if (!flag.empty()) {
                out.push_back(flag);
            } else if (k.megatronFlag.empty() && k.megatronFalseFlag.empty() && notes &&
                       v != k.get(Config{})) {
                notes->push_back(k.name + "=" + valueText(v) + ": Megatron-LM has no flag for it");
            }
            continue;
        }
        if (k.name == "global_batch_size") {
            out.push_back(k.megatronFlag);
            out.push_back(std::to_string(ds.global_batch_size));
            continue;
        }
        if (k.name == "data_path") {
            if (c.data_path == "synthetic") out.push_back("--mock-data");
            else if (!c.data_path.empty()) { out.push_back(k.megatronFlag); out.push_back(c.data_path); }
            else if (notes) notes->push_back("data_path=\"\" (the shipped text corpus): give Megatron-LM --data-path "
                                             "and a tokenizer (--tokenizer-type ...)");
            continue;
        }
        if (k.megatronFlag.empty()) {
            if (notes && v != k.get(Config{}))
                notes->push_back(k.name + "=" + engine::knobValueText(k, c) + ": Megatron-LM has no flag for it" +
                                 (k.group == "parallel" || k.group == "batch" ? " (it follows from the launcher's world size)" : ""));
            continue;
        }
        if (leaveOut(k, c)) continue;
        out.push_back(k.megatronFlag);
        if (v.is_array()) {
            for (const auto& e : v) out.push_back(valueText(e));
        } else {
            out.push_back(valueText(v));
        }
        if (k.name == "num_query_groups") out.push_back("--group-query-attention");
        if (k.name == "seq_length") {
            // Megatron sizes position tables (and checks RoPE) against this; ours equals s.
            out.push_back("--max-position-embeddings");
            out.push_back(valueText(v));
        }
    }
    return out;
}

std::vector<std::string> bridgeOverrides(const Config& c, std::vector<std::string>* notes) {
    std::vector<std::string> out;
    const engine::DerivedSizes ds = engine::deriveSizes(c);
    for (const KnobDef& k : engine::knobRegistry()) {
        json v = k.get(c);
        if (k.bridgePath.empty()) {
            if (notes && v != k.get(Config{}))
                notes->push_back(k.name + "=" + engine::knobValueText(k, c) + ": no Megatron-Bridge field");
            continue;
        }
        if (k.name == "global_batch_size") {
            out.push_back(k.bridgePath + "=" + std::to_string(ds.global_batch_size));
            continue;
        }
        if (k.name == "data_path") {
            if (notes) notes->push_back("data_path: set the recipe's dataset (Bridge dataset configs are not a single path)");
            continue;
        }
        if (k.type != KnobType::Bool && leaveOut(k, c)) continue;
        if (k.type == KnobType::Bool) {
            bool on = v.get<bool>();
            if (k.bridgeNegate) on = !on;
            out.push_back(k.bridgePath + "=" + (on ? "true" : "false"));
        } else if (v.is_array()) {
            std::string list = "[";
            for (size_t i = 0; i < v.size(); ++i) list += (i ? "," : "") + quoteIfNeeded(valueText(v[i]));
            out.push_back(k.bridgePath + "=" + list + "]");
        } else if (v.is_string()) {
            out.push_back(k.bridgePath + "=" + quoteIfNeeded(v.get<std::string>()));
        } else {
            out.push_back(k.bridgePath + "=" + valueText(v));
        }
    }
    return out;
}

ExportResult exportConfig(const Config& c, ExportFormat format) {
    ExportResult r;
    switch (format) {
        case ExportFormat::Yaml:
            r.text = engine::configToYaml(c, /*onlyNonDefault=*/true);
            break;
        case ExportFormat::MegatronArgs: {
            r.args = megatronArgs(c, &r.notes);
            for (size_t i = 0; i < r.args.size(); ++i) {
                const std::string& a = r.args[i];
                bool quote = a.find_first_of(" \t'\"$`\\") != std::string::npos;
                r.text += (i ? " " : "") + (quote ? "'" + a + "'" : a);
            }
            r.text += "\n";
            break;
        }
        case ExportFormat::BridgeOverrides:
            r.args = bridgeOverrides(c, &r.notes);
            for (const auto& a : r.args) r.text += a + "\n";
            break;
    }
    return r;
}

Result<Config> configOfRunFile(const std::string& path) {
    TS_ASSIGN_OR_RETURN(auto store, profiler::TraceStore::open(path, /*readOnly=*/true));
    auto info = store->runInfo();
    if (!info) return info.status().withContext("run file " + path + " has no run info");
    json j = json::parse(info->configJson, nullptr, false);
    if (!j.is_object())
        return Status::invalid("run file " + path + " holds no config (imported traces have none)");
    return engine::configFromJson(j);
}

}  // namespace ts::sessions
