// knobDefJson and knobRegistryJson (knobs_json.h).
#include "sessions/knobs_json.h"

#include <algorithm>

#include "engine/config/config.h"

namespace ts::sessions {

nlohmann::json knobDefJson(const engine::KnobDef& k) {
    return {{"name", k.name},
            {"type", engine::knobTypeName(k.type)},
            {"default", k.get(engine::Config{})},
            {"group", k.group},
            {"allowed", k.allowed},
            {"megatron_flag", k.megatronFlag},
            {"megatron_false_flag", k.megatronFalseFlag},
            {"bridge_path", k.bridgePath},
            {"bridge_negate", k.bridgeNegate},
            {"help", k.help},
            {"rules", k.rules},
            {"engine_supported", k.engineSupported},
            {"engine_values", k.engineValues}};
}

nlohmann::json knobRegistryJson() {
    using nlohmann::json;
    json groups = json::array();
    json knobs = json::array();
    for (const auto& k : engine::knobRegistry()) {
        if (std::find(groups.begin(), groups.end(), k.group) == groups.end()) groups.push_back(k.group);
        knobs.push_back(knobDefJson(k));
    }
    return {{"groups", groups}, {"knobs", knobs}};
}

}  // namespace ts::sessions
