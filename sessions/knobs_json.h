// The knob registry as JSON (the agent's `knobs` method, docs/protocol.md): what a GUI needs to
// generate a config editor for the knobs of the node it talks to, which may be a different
// trainscope version than the GUI's own.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/config/knobs.h"

namespace ts::sessions {

// One knob as JSON, the form `trainscope knobs --json` prints and the agent's `knobs` sends:
// {name, type, default, group, allowed, megatron_flag, megatron_false_flag, bridge_path,
//  bridge_negate, help, rules, engine_supported, engine_values}. `default` is the value as JSON;
// `engine_supported` is false for knobs the engine accepts and exports but does not execute;
// `engine_values`, when not empty, the only values of an enum knob it executes.
nlohmann::json knobDefJson(const engine::KnobDef& k);

// {"groups": [group names in registry order], "knobs": [knobDefJson of each knob]}
nlohmann::json knobRegistryJson();

}  // namespace ts::sessions
