// Config export (docs/workspace.md "Export"): a run's config as
//   yaml              our YAML, only non-default knobs; loading it gives the identical Config
//   megatron-args     the equivalent Megatron-LM pretrain_gpt.py arguments, from each knob's
//                     megatronFlag / megatronFalseFlag in the knob registry
//   bridge-overrides  Megatron-Bridge `path=value` overrides, from each knob's bridgePath
// Knobs Megatron has no flag for (world_size, num_microbatches, tokenizer, backend ...) are
// listed in ExportResult::notes so the user knows what the launcher or recipe must supply.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/config.h"

namespace ts::sessions {

enum class ExportFormat { Yaml, MegatronArgs, BridgeOverrides };
Result<ExportFormat> parseExportFormat(const std::string& text);

struct ExportResult {
    std::string text;                 // what goes to the file / stdout
    std::vector<std::string> args;    // megatron-args: argv tokens; bridge: one "k=v" per entry
    std::vector<std::string> notes;   // knobs that could not be expressed, with why
};

ExportResult exportConfig(const engine::Config& config, ExportFormat format);

// Pieces, exposed for tests.
std::vector<std::string> megatronArgs(const engine::Config& config, std::vector<std::string>* notes = nullptr);
std::vector<std::string> bridgeOverrides(const engine::Config& config, std::vector<std::string>* notes = nullptr);

// The config stored in a run file (RunInfo.configJson).
Result<engine::Config> configOfRunFile(const std::string& runFilePath);

}  // namespace ts::sessions
