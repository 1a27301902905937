// The knob registry: every tunable declared once (DESIGN.md "Knob registry"). Config
// validation, YAML loading, the CLI (`trainscope knobs`), GUI toggles, export to
// Megatron-LM arguments / Megatron-Bridge overrides, and docs all read this one table.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "engine/config/config.h"

namespace ts::engine {

// EnumOrList / FloatOrList: Megatron's Union[str, List[str]] / Union[float, List[float]] knobs (nargs='+'):
// one value, or a list (JSON: a scalar or an array of two or more).
enum class KnobType { Int, Float, Bool, String, Enum, StringList, IntList, EnumOrList, FloatOrList };
const char* knobTypeName(KnobType t);

struct KnobDef {
    std::string name;          // Megatron spelling: "overlap_grad_reduce"
    KnobType type = KnobType::Int;
    std::string group;         // "model", "parallel", "batch", "dp_comm", "tp_pp_comm", "fusion",
                               // "precision", "recompute", "moe", "misc", "run"
    std::vector<std::string> allowed;  // Enum values ("" = off where allowed)
    // Megatron-LM flag. Value knobs: "--tensor-model-parallel-size". Bool knobs: the flag that
    // sets it true ("--overlap-grad-reduce"); megatronFalseFlag the one that sets it false
    // ("--no-masked-softmax-fusion"). Empty when Megatron has none in that direction (which
    // also tells Megatron's default: only a false-flag means Megatron defaults to true).
    std::string megatronFlag;
    std::string megatronFalseFlag;
    std::string bridgePath;    // Megatron-Bridge override path ("" when none)
    bool bridgeNegate = false; // Bridge field is the negation (untie_* vs share_*)
    std::string help;          // one line
    std::string rules;         // human text of requires/excludes, e.g. "requires use_distributed_optimizer"
    bool engineSupported = true;  // false: accepted and exported, not yet executed by our engine
    // Enum knobs the engine executes some values of: those (empty: all of them). The others are
    // accepted and exported like a knob with engineSupported false.
    std::vector<std::string> engineValues;
    // Float knobs whose 0 stands for Megatron's None ("not set"): export leaves them out, since
    // Megatron reads an explicit 0 as a value (capacity factor 0 = no tokens; z-loss 0 = a term).
    bool zeroIsUnset = false;
    // Access to the Config field, as JSON (number/bool/string/array).
    std::function<nlohmann::json(const Config&)> get;
    // Sets from JSON; returns a message on a type/range error ("" when ok).
    std::function<std::string(Config&, const nlohmann::json&)> set;
};

// What the engine does not execute of k, for help texts: "" (all of it), "not executed yet", or
// "not executed yet: local, transformer_engine" (the values outside engineValues).
std::string knobNotExecutedText(const KnobDef& k);

const std::vector<KnobDef>& knobRegistry();
const KnobDef* findKnob(std::string_view name);
// Closest knob names for "did you mean" (edit distance), best first.
std::vector<std::string> suggestKnobs(std::string_view unknown, size_t maxSuggestions = 3);
// Default value of a knob as text ("1", "true", "p2p", "[core_attn]").
std::string knobDefaultText(const KnobDef& k);
std::string knobValueText(const KnobDef& k, const Config& c);

// One problem found in a config: where, which knob, what is wrong and how to fix it.
struct ConfigIssue {
    std::string file;     // "" when not from a file
    int line = 0;         // 1-based; 0 unknown
    std::string knob;     // "" for file-level problems
    std::string message;  // "tensor_model_parallel_size=3 does not divide num_attention_heads=8; ..."
    std::string toString() const;  // "cfg.yaml:12: tensor_model_parallel_size: ..."
};

// Parses YAML text (flat mapping of knob: value; nested mappings `model:`/`parallel:` etc. are
// flattened and their keys must still be knob names) onto defaults. Type errors and unknown
// keys become issues; rule checks (validateConfig) are added too.
struct LoadedConfig {
    Config config;
    std::vector<ConfigIssue> issues;
    bool ok() const { return issues.empty(); }
};
LoadedConfig parseConfigYaml(const std::string& text, const std::string& fileName = "");
LoadedConfig loadConfigFile(const std::string& path);
// Cross-knob rules (divisibility, requires/excludes, ranges). Issues carry no line numbers.
std::vector<ConfigIssue> validateConfig(const Config& c);
// What a valid config runs but a user should know (`trainscope validate` prints them as
// warnings): where the layout makes FP8 scales or blocks differ from the single device's
// (fp8_recipe=tensorwise with MoE experts split over ranks; block recipes with context
// parallelism or with experts split over ranks), and a knob that changes nothing as set
// (masked_softmax_fusion=false under flash attention). Empty for an invalid config.
std::vector<std::string> configWarnings(const Config& c);
// Joins issues into one Status (InvalidArgument) or ok.
Status issuesToStatus(const std::vector<ConfigIssue>& issues);

// Knobs set to a non-default value that the engine accepts (and exports) but does not execute
// yet, e.g. "context_parallel_size=2 (context parallelism is not implemented yet)".
std::vector<std::string> unsupportedKnobs(const Config& c);

// "key=value" override (value parsed as YAML scalar); used by CLI flags and sweeps.
Status applyOverride(Config& c, const std::string& keyEqualsValue);

// Serialization. onlyNonDefault=false writes every knob, grouped with comments.
// Markdown reference of every knob (docs/knobs.md is this text).
std::string knobsMarkdown();

std::string configToYaml(const Config& c, bool onlyNonDefault = false);
nlohmann::json configToJson(const Config& c);
Result<Config> configFromJson(const nlohmann::json& j);

}  // namespace ts::engine
