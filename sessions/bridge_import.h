// Megatron-Bridge interop (issue #14): the precision presets both directions share, and the
// import of a Bridge YAML (a ConfigContainer dump or a recipe override file) or a list of
// `a.b.c=value` overrides into a trainscope Config. The path <-> knob mapping is each knob's
// bridgePath in the knob registry, as for export; every path that maps to no knob is listed.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/config.h"

namespace ts::sessions {

// Bridge's mixed_precision recipe (src/megatron/bridge/training/mixed_precision.py) that runs
// a config's precision: "" for fp32 (mixed_precision=null), bf16_mixed, or the bf16_with_fp8_*
// preset of fp8_recipe. Knobs the preset sets differently are described in *differences.
std::string bridgePrecisionPreset(const engine::Config& c, std::vector<std::string>* differences = nullptr);
// Sets bf16 / fp8 / fp8_recipe / amax knobs as the named preset does; false when unknown.
bool applyBridgePrecisionPreset(const std::string& preset, engine::Config& c);

struct BridgeImport {
    engine::Config config;
    std::vector<std::string> unmapped;  // "tokenizer.tokenizer_type=HuggingFaceTokenizer"
    std::vector<std::string> notes;
};

// text: a YAML mapping (nested sections: model:, ddp:, ...) or override lines `path=value`
// (Hydra's leading '+' / '++' are accepted; '#' comments and blank lines skipped).
Result<BridgeImport> configFromBridge(const std::string& text);

}  // namespace ts::sessions
