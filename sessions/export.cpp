// Config export to our YAML, Megatron-LM arguments and Megatron-Bridge overrides (export.h).
#include "sessions/export.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "engine/config/knobs.h"
#include "sessions/bridge_import.h"
#include "profiler/store.h"

namespace ts::sessions {

using nlohmann::json;
using engine::Config;
using engine::KnobDef;
using engine::KnobType;

namespace {

// Value text for a command line / override: integers and strings as-is, floats in JSON form
// (Python parses "0.0003" and "1e-08" alike), lists space-separated for argparse nargs='+'.
std::string valueText(const json& v);

// A knob's value as the type Megatron declares: Float knobs that upstream reads as int
// (rotary_base: `type=int`) are written without a fraction (validation keeps them whole).
std::string knobValueForMegatron(const KnobDef& k, const json& v) {
    if (k.name == "rotary_base" && v.is_number()) return std::to_string(int64_t(v.get<double>()));
    return valueText(v);
}

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
    if (k.zeroIsUnset && v == 0.0) return true;                            // Megatron's None
    if (k.name == "rotary_base" && c.position_embedding_type != "rope") return true;
    if ((k.name == "main_grads_dtype" || k.name == "exp_avg_dtype" || k.name == "exp_avg_sq_dtype") &&
        !c.use_precision_aware_optimizer)
        return true;
    if ((k.type == KnobType::String || k.type == KnobType::Enum) && v == "") return true;
    if (k.name == "virtual_pipeline_model_parallel_size" && c.virtual_pipeline_model_parallel_size <= 1) return true;
    if (k.group == "moe" && c.num_moe_experts == 0) return true;
    if ((k.name == "expert_model_parallel_size" || k.name == "expert_tensor_parallel_size") && c.num_moe_experts == 0)
        return true;
    if (k.name.rfind("fp8_", 0) == 0 && c.fp8.empty()) return true;
    if (k.name == "cp_comm_type" && c.context_parallel_size <= 1) return true;
    if (k.type == KnobType::IntList && v.empty()) return true;  // [] = Megatron's None
    if (k.name == "data_parallel_sharding_strategy" && v == d) return true;  // Megatron-FSDP only
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
            } else if (k.megatronFlag.empty() && k.megatronFalseFlag.empty() && notes && v != k.get(Config{}) &&
                       k.name != "cpu_offloading") {  // Megatron-LM derives it from --cpu-offloading-num-layers
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
            out.push_back(knobValueForMegatron(k, v));
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
    // Written against a recipe that is already loaded: every knob is set, and a feature that is
    // off is written as null, so the recipe's own values (recompute, vpp, fp8 ...) cannot leak
    // through. Precision goes through the mixed_precision preset (Bridge overwrites model.bf16
    // and model.fp8* from it), overlap through comm_overlap.* (which Bridge applies to the ddp,
    // optimizer and model configs last).
    std::vector<std::string> out;
    const engine::DerivedSizes ds = engine::deriveSizes(c);
    const Config defaults;
    auto emit = [&](const std::string& path, const std::string& value) { out.push_back(path + "=" + value); };
    for (const KnobDef& k : engine::knobRegistry()) {
        json v = k.get(c);
        if (k.bridgePath.empty()) {
            if (notes && v != k.get(defaults))
                notes->push_back(k.name + "=" + engine::knobValueText(k, c) + ": no Megatron-Bridge field");
            continue;
        }
        const std::string& path = k.bridgePath;
        if (k.name == "global_batch_size") { emit(path, std::to_string(ds.global_batch_size)); continue; }
        if (k.name == "data_path") {
            if (notes) notes->push_back("data_path: set the recipe's dataset (Bridge dataset configs are not a single path)");
            continue;
        }
        if (k.name == "bf16") {
            std::vector<std::string> diffs;
            const std::string preset = bridgePrecisionPreset(c, &diffs);
            emit("mixed_precision", preset.empty() ? "null" : preset);
            if (preset.empty()) {  // fp32: nothing a recipe set may stay in bf16
                emit("model.bf16", "false");
                emit("optimizer.bf16", "false");
                emit("model.fp8", "null");
            }
            if (!preset.empty() && !c.grad_reduce_in_fp32)
                diffs.push_back("grad_reduce_in_fp32=false: the preset sets ddp.grad_reduce_in_fp32=true");
            if (notes)
                for (const auto& d : diffs) notes->push_back(d + " (Bridge applies the preset's value)");
            continue;
        }
        if (k.name.rfind("fp8", 0) == 0) continue;  // part of the mixed_precision preset
        if (k.name == "swiglu") {
            emit(path, c.swiglu ? "true" : "false");
            emit("model.activation_func", c.swiglu ? "silu" : "gelu");
            continue;
        }
        if (k.name == "seq_length") {  // Bridge asserts model and dataset agree
            emit(path, valueText(v));
            emit("dataset.seq_length", valueText(v));
            continue;
        }
        if (k.name == "ffn_hidden_size") {  // Bridge's provider derives 4h, not Megatron-LM's swiglu size
            emit(path, std::to_string(ds.ffn_hidden_size));
            continue;
        }
        if (k.name == "rotary_base") { emit(path, knobValueForMegatron(k, v)); continue; }
        if (k.name == "moe_layer_freq" && v.is_string()) {
            // Bridge's TransformerConfig takes an int or a list, not Megatron-LM's expression.
            std::string list = "[";
            for (int x : engine::moeLayerPattern(c.moe_layer_freq, c.num_layers, nullptr))
                list += (list.size() > 1 ? "," : "") + std::to_string(x);
            emit(path, list + "]");
            continue;
        }
        if (k.name == "position_embedding_type" && c.position_embedding_type == "none") {
            if (notes) notes->push_back("position_embedding_type=none: Bridge's GPT provider has no such choice");
            continue;
        }
        if (k.name == "cp_comm_type" && c.context_parallel_size <= 1) continue;
        if (k.group == "moe" && k.name != "num_moe_experts" && c.num_moe_experts == 0) continue;
        if ((k.name == "main_grads_dtype" || k.name == "exp_avg_dtype" || k.name == "exp_avg_sq_dtype") &&
            !c.use_precision_aware_optimizer)
            continue;
        // Off / unset / derived -> null.
        const bool unsetInt = (k.type == KnobType::Int && v == 0 && k.get(defaults) == 0) ||
                              (k.type == KnobType::IntList && v.empty());
        const bool offEnum = (k.type == KnobType::Enum || k.type == KnobType::String) && v == "";
        const bool noVpp = k.name == "virtual_pipeline_model_parallel_size" && c.virtual_pipeline_model_parallel_size <= 1;
        const bool noModules = k.name == "recompute_modules" && c.recompute_granularity != "selective";
        const bool noFull = (k.name == "recompute_method" || k.name == "recompute_num_layers") &&
                            c.recompute_granularity != "full";
        if (unsetInt || offEnum || noVpp || noModules || noFull || (k.zeroIsUnset && v == 0.0)) {
            if (k.name == "cpu_offloading_num_layers" || k.name == "lr_warmup_iters" || k.name == "train_iters")
                emit(path, "0");
            else
                emit(path, "null");
            continue;
        }
        if (k.type == KnobType::Bool) {
            bool on = v.get<bool>();
            if (k.bridgeNegate) on = !on;
            emit(path, on ? "true" : "false");
        } else if (v.is_array()) {
            std::string list = "[";
            for (size_t i = 0; i < v.size(); ++i) list += (i ? "," : "") + quoteIfNeeded(valueText(v[i]));
            emit(path, list + "]");
        } else if (v.is_string()) {
            emit(path, quoteIfNeeded(v.get<std::string>()));
        } else {
            emit(path, valueText(v));
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
                // Shell words: single-quoted when bash would read anything in them ('...' inside
                // becomes '\'').
                std::string word = a;
                if (a.empty() || a.find_first_of(" \t'\"$`\\()[]{}*?;&|<>!#~") != std::string::npos) {
                    word = "'";
                    for (char ch : a) word += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
                    word += "'";
                }
                r.text += (i ? " " : "") + word;
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
