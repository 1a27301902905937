// YAML text -> JSON value with the config loader's typing (YAML 1.2 core schema; quoted
// scalars stay strings) and its bounds (size, alias expansion, nesting). Used by importers of
// other tools' configs (Megatron-Bridge YAML and override values).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ts::engine {

Result<nlohmann::json> yamlToJson(const std::string& text);

}  // namespace ts::engine
