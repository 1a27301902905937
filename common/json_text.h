// JSON text that never throws on the text inside it: nlohmann::json::dump() throws
// type_error 316 on invalid UTF-8, and JSON output of trainscope carries outside text (run
// names, kernel names from imported traces, paths). Every dump of data that can hold such
// text goes through dumpJson, which writes ill-formed sequences as U+FFFD.
// Header-only; users link nlohmann_json themselves (ts_common has no dependencies).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ts {

inline std::string dumpJson(const nlohmann::json& j, int indent = -1) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ts
