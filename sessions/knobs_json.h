// The knob registry as JSON (the agent's `knobs` method, docs/protocol.md): what a GUI needs to
// generate a config editor for the knobs of the node it talks to, which may be a different
// trainscope version than the GUI's own.
#pragma once

#include <nlohmann/json.hpp>

namespace ts::sessions {

// {"groups": [group names in registry order],
//  "knobs": [{name, type, group, allowed, default, megatron_flag, megatron_false_flag,
//             bridge_path, help, rules, executed}]}
// `default` is the value as JSON (number, bool, string, array); `executed` is false for knobs the
// engine accepts and exports but does not execute yet.
nlohmann::json knobRegistryJson();

}  // namespace ts::sessions
