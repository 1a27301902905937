// YAML config files <-> Config, through the knob registry. Every problem becomes one
// ConfigIssue with file and line; nothing is silently dropped.
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/config/knobs.h"

namespace ts::engine {

using nlohmann::json;

std::string ConfigIssue::toString() const {
    std::string out;
    if (!file.empty()) out += file + ":";
    if (line > 0) out += std::to_string(line) + ":";
    if (!out.empty()) out += " ";
    if (!knob.empty()) out += knob + ": ";
    return out + message;
}

Status issuesToStatus(const std::vector<ConfigIssue>& issues) {
    if (issues.empty()) return Status::ok();
    std::string msg;
    for (const auto& i : issues) msg += (msg.empty() ? "" : "\n") + i.toString();
    return Status::invalid(msg);
}

namespace {

// Plain YAML scalar -> JSON value with YAML 1.2 core-schema typing; quoted scalars stay strings.
json scalarToJson(const YAML::Node& n) {
    const std::string& s = n.Scalar();
    if (n.Tag() == "!") return s;  // quoted
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    {
        char* end = nullptr;
        errno = 0;
        long long v = std::strtoll(s.c_str(), &end, 10);
        if (errno == 0 && end && *end == '\0') return v;
    }
    {
        char* end = nullptr;
        errno = 0;
        double d = std::strtod(s.c_str(), &end);
        if (errno == 0 && end && *end == '\0') return d;
    }
    return s;
}

json nodeToJson(const YAML::Node& n) {
    if (n.IsScalar()) return scalarToJson(n);
    if (n.IsSequence()) {
        json arr = json::array();
        for (const auto& e : n) arr.push_back(nodeToJson(e));
        return arr;
    }
    if (n.IsNull()) return nullptr;
    json obj = json::object();
    for (const auto& kv : n) obj[kv.first.as<std::string>()] = nodeToJson(kv.second);
    return obj;
}

bool isGroupName(const std::string& key) {
    for (const auto& k : knobRegistry())
        if (k.group == key) return true;
    return false;
}

void unknownKeyIssue(LoadedConfig& out, const std::string& file, int line, const std::string& key) {
    std::string msg = "unknown key '" + key + "'";
    auto sugg = suggestKnobs(key);
    if (!sugg.empty()) {
        msg += "; did you mean ";
        for (size_t i = 0; i < sugg.size(); ++i) msg += (i ? " or " : "") + ("'" + sugg[i] + "'");
        msg += "?";
    } else {
        msg += "; run `trainscope knobs` for the list of knobs";
    }
    out.issues.push_back({file, line, "", msg});
}

void applyMapping(const YAML::Node& map, const std::string& file, LoadedConfig& out,
                  std::set<std::string>& seen, bool topLevel) {
    for (const auto& kv : map) {
        const int line = kv.first.Mark().line + 1;
        const std::string key = kv.first.as<std::string>();
        const KnobDef* k = findKnob(key);
        if (!k) {
            if (topLevel && kv.second.IsMap() && isGroupName(key)) {
                applyMapping(kv.second, file, out, seen, false);  // `parallel:` section
                continue;
            }
            unknownKeyIssue(out, file, line, key);
            continue;
        }
        if (!seen.insert(key).second) {
            out.issues.push_back({file, line, key, "set more than once; keep one"});
            continue;
        }
        const json value = nodeToJson(kv.second);
        std::string err;
        if (value.is_null() && k->type != KnobType::String && k->type != KnobType::Enum)
            err = "has no value; give a " + std::string(knobTypeName(k->type)) + " or remove the line";
        else
            err = k->set(out.config, value);
        if (!err.empty()) {
            std::string fix = k->allowed.empty() ? "" : "";
            out.issues.push_back({file, line, key, err + " (default: " + knobDefaultText(*k) + ")"});
        }
    }
}

}  // namespace

LoadedConfig parseConfigYaml(const std::string& text, const std::string& fileName) {
    LoadedConfig out;
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
        out.issues.push_back({fileName, e.mark.line >= 0 ? e.mark.line + 1 : 0, "",
                              "YAML syntax error: " + e.msg});
        return out;
    }
    if (root.IsNull()) return out;  // empty file = all defaults
    if (!root.IsMap()) {
        out.issues.push_back({fileName, root.Mark().line + 1, "",
                              "a config must be a mapping of knob: value (e.g. `num_layers: 4`)"});
        return out;
    }
    std::set<std::string> seen;
    try {
        applyMapping(root, fileName, out, seen, true);
    } catch (const YAML::Exception& e) {
        out.issues.push_back({fileName, e.mark.line + 1, "", "YAML error: " + e.msg});
        return out;
    }
    if (out.issues.empty()) {
        // Rule checks carry no line; point them at the line where the knob was set.
        for (auto issue : validateConfig(out.config)) {
            issue.file = fileName;
            for (const auto& kv : root) {
                const std::string key = kv.first.as<std::string>();
                if (key == issue.knob) issue.line = kv.first.Mark().line + 1;
                if (kv.second.IsMap())
                    for (const auto& kv2 : kv.second)
                        if (kv2.first.as<std::string>() == issue.knob) issue.line = kv2.first.Mark().line + 1;
            }
            out.issues.push_back(issue);
        }
    }
    return out;
}

LoadedConfig loadConfigFile(const std::string& path) {
    std::ifstream in(path);
    if (!in) {
        LoadedConfig out;
        out.issues.push_back({path, 0, "", "cannot open config file (check the path)"});
        return out;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    return parseConfigYaml(ss.str(), path);
}

Status applyOverride(Config& c, const std::string& kv) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
        return Status::invalid("override '" + kv + "' must look like knob=value");
    const std::string key = kv.substr(0, eq);
    const KnobDef* k = findKnob(key);
    if (!k) {
        LoadedConfig tmp;
        unknownKeyIssue(tmp, "", 0, key);
        return Status::invalid(tmp.issues[0].message);
    }
    YAML::Node n;
    try {
        n = YAML::Load(kv.substr(eq + 1));
    } catch (const YAML::Exception& e) {
        return Status::invalid(key + ": cannot parse value '" + kv.substr(eq + 1) + "': " + e.msg);
    }
    const json value = n.IsNull() ? json("") : nodeToJson(n);
    std::string err = k->set(c, value);
    if (!err.empty()) return Status::invalid(key + ": " + err);
    return Status::ok();
}

std::string configToYaml(const Config& c, bool onlyNonDefault) {
    const Config defaults;
    std::ostringstream out;
    std::string group;
    for (const auto& k : knobRegistry()) {
        const json v = k.get(c);
        if (onlyNonDefault && v == k.get(defaults)) continue;
        if (!onlyNonDefault && k.group != group) {
            group = k.group;
            out << "\n# --- " << group << "\n";
        }
        YAML::Emitter e;
        e << YAML::Flow;
        if (v.is_array()) {
            e << YAML::BeginSeq;
            for (const auto& s : v) e << s.get<std::string>();
            e << YAML::EndSeq;
        } else if (v.is_string()) {
            e << YAML::DoubleQuoted << v.get<std::string>();
        } else if (v.is_boolean()) {
            e << (v.get<bool>() ? "true" : "false");
        } else if (v.is_number_float()) {
            // Shortest text that parses back to the same double; keep a '.' or exponent so it
            // stays a float.
            const double d = v.get<double>();
            std::string s;
            for (int prec = 1; prec <= 17; ++prec) {
                std::ostringstream num;
                num.precision(prec);
                num << d;
                s = num.str();
                if (std::strtod(s.c_str(), nullptr) == d) break;
            }
            if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
            e << s;
        } else {
            e << v.dump();
        }
        out << k.name << ": " << e.c_str() << "\n";
    }
    return out.str();
}

}  // namespace ts::engine
