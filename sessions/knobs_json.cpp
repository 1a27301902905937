// knobRegistryJson (knobs_json.h).
#include "sessions/knobs_json.h"

#include <algorithm>

#include "engine/config/config.h"
#include "engine/config/knobs.h"

namespace ts::sessions {

nlohmann::json knobRegistryJson() {
    using nlohmann::json;
    const engine::Config defaults;
    json groups = json::array();
    json knobs = json::array();
    for (const auto& k : engine::knobRegistry()) {
        if (std::find(groups.begin(), groups.end(), k.group) == groups.end()) groups.push_back(k.group);
        knobs.push_back({{"name", k.name},
                         {"type", engine::knobTypeName(k.type)},
                         {"group", k.group},
                         {"allowed", k.allowed},
                         {"default", k.get(defaults)},
                         {"megatron_flag", k.megatronFlag},
                         {"megatron_false_flag", k.megatronFalseFlag},
                         {"bridge_path", k.bridgePath},
                         {"help", k.help},
                         {"rules", k.rules},
                         {"executed", k.engineSupported}});
    }
    return {{"groups", groups}, {"knobs", knobs}};
}

}  // namespace ts::sessions
