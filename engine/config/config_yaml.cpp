// YAML config files <-> Config, through the knob registry. Every problem becomes one
// ConfigIssue with file and line; nothing is silently dropped.
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "common/text.h"
#include "engine/config/knobs.h"
#include "engine/config/yaml_json.h"

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

// Bounds on what a config may hold. A config is a few hundred lines; the bounds are far above
// that and far below what hurts. yaml-cpp resolves an alias to the node it names (shared, not
// copied), so a few hundred bytes of nested aliases ("billion laughs") describe a document of
// billions of nodes: every walk below counts node visits, which is exactly the expanded size.
constexpr size_t kMaxConfigBytes = size_t(1) << 20;  // 1 MiB
constexpr int64_t kMaxConfigNodes = 100000;          // nodes after alias expansion
constexpr int kMaxConfigDepth = 64;                  // nesting of mappings/sequences
// "Did you mean" costs an edit distance against every knob: offered for the first unknown keys
// only, and never for keys longer than any suggestion could match (suggestKnobs accepts a
// distance of at most a third of the key's length, and knob names are < 50 characters).
constexpr int kMaxSuggestedKeys = 20;
constexpr size_t kMaxSuggestedKeyLength = 80;
// Issues kept per file; the rest are counted in a last one.
constexpr size_t kMaxIssues = 200;

// Thrown by the walks below when a bound is passed; turned into one issue.
struct LimitExceeded {
    std::string message;
    int line = 0;
};

struct Walk {
    int64_t visits = 0;
    void enter(const YAML::Node& n, int depth) {
        if (++visits > kMaxConfigNodes)
            throw LimitExceeded{"the document expands to more than " + std::to_string(kMaxConfigNodes) +
                                    " values (nested YAML aliases?); a config is a flat mapping of knob: value",
                                n.Mark().line + 1};
        if (depth > kMaxConfigDepth)
            throw LimitExceeded{"values are nested more than " + std::to_string(kMaxConfigDepth) +
                                    " levels deep; a config is a flat mapping of knob: value",
                                n.Mark().line + 1};
    }
};

// Counts the document's nodes (aliases expanded) so that every later walk is bounded.
void checkBounds(const YAML::Node& n, Walk& w, int depth) {
    w.enter(n, depth);
    if (n.IsSequence()) {
        for (const auto& e : n) checkBounds(e, w, depth + 1);
    } else if (n.IsMap()) {
        for (const auto& kv : n) {
            checkBounds(kv.first, w, depth + 1);
            checkBounds(kv.second, w, depth + 1);
        }
    }
}

// Plain YAML scalar -> JSON value with YAML 1.2 core-schema typing; quoted scalars stay strings.
// Text is made valid UTF-8 here: it is echoed in messages and written as JSON.
json scalarToJson(const YAML::Node& n) {
    const std::string s = sanitizeUtf8(n.Scalar());
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
        // YAML 1.2 core-schema floats only: digits, '.', sign, exponent. strtod alone would also
        // take "nan", "inf" and hex floats, which YAML reads as strings.
        const bool floatChars = s.find_first_not_of("0123456789.+-eE") == std::string::npos &&
                                s.find_first_of("0123456789") != std::string::npos;
        char* end = nullptr;
        errno = 0;
        double d = std::strtod(s.c_str(), &end);
        if (floatChars && errno == 0 && end && *end == '\0') return d;
    }
    return s;
}

// A mapping key as text; nullopt when it is not a scalar (a key that is a list or mapping).
std::optional<std::string> keyText(const YAML::Node& k) {
    if (!k.IsScalar()) return std::nullopt;
    return sanitizeUtf8(k.Scalar());
}

json nodeToJson(const YAML::Node& n, Walk& w, int depth) {
    w.enter(n, depth);
    if (n.IsScalar()) return scalarToJson(n);
    if (n.IsSequence()) {
        json arr = json::array();
        for (const auto& e : n) arr.push_back(nodeToJson(e, w, depth + 1));
        return arr;
    }
    if (n.IsNull() || !n.IsMap()) return nullptr;
    json obj = json::object();
    for (const auto& kv : n) {
        auto k = keyText(kv.first);
        obj[k ? *k : std::string("?")] = nodeToJson(kv.second, w, depth + 1);
    }
    return obj;
}

bool isGroupName(const std::string& key) {
    for (const auto& k : knobRegistry())
        if (k.group == key) return true;
    return false;
}

// key quoted in a message: long keys are cut (a key may be up to the whole file).
std::string quotedKey(const std::string& key) {
    if (key.size() <= kMaxSuggestedKeyLength) return "'" + key + "'";
    return "'" + sanitizeUtf8(key.substr(0, kMaxSuggestedKeyLength)) + "...' (" + std::to_string(key.size()) +
           " characters)";
}

void unknownKeyIssue(LoadedConfig& out, const std::string& file, int line, const std::string& key,
                     bool suggest = true) {
    std::string msg = "unknown key " + quotedKey(key);
    auto sugg = suggest && key.size() <= kMaxSuggestedKeyLength ? suggestKnobs(key) : std::vector<std::string>{};
    if (!sugg.empty()) {
        msg += "; did you mean ";
        for (size_t i = 0; i < sugg.size(); ++i) msg += (i ? " or " : "") + ("'" + sugg[i] + "'");
        msg += "?";
    } else {
        msg += "; run `trainscope knobs` for the list of knobs";
    }
    out.issues.push_back({file, line, "", msg});
}

// Applies every key of map; each problem becomes an issue and the walk goes on, so one pass
// reports all of a file's problems. rejected collects knobs whose value was not applied.
void applyMapping(const YAML::Node& map, const std::string& file, LoadedConfig& out, std::set<std::string>& seen,
                  std::set<std::string>& rejected, std::map<std::string, int>& lines, bool topLevel, Walk& w,
                  int& unknownKeys) {
    for (const auto& kv : map) {
        const int line = kv.first.Mark().line + 1;
        const auto keyOpt = keyText(kv.first);
        if (!keyOpt) {
            out.issues.push_back({file, line, "", "a key must be a plain knob name, not a list or mapping"});
            continue;
        }
        const std::string& key = *keyOpt;
        const KnobDef* k = findKnob(key);
        if (!k) {
            if (topLevel && kv.second.IsMap() && isGroupName(key)) {
                applyMapping(kv.second, file, out, seen, rejected, lines, false, w, unknownKeys);  // `parallel:` section
                continue;
            }
            unknownKeyIssue(out, file, line, key, ++unknownKeys <= kMaxSuggestedKeys);
            continue;
        }
        if (!seen.insert(key).second) {
            out.issues.push_back({file, line, key, "set more than once (first on line " +
                                                       std::to_string(lines[key]) + "); keep one"});
            continue;
        }
        lines[key] = line;
        const json value = nodeToJson(kv.second, w, 1);
        std::string err;
        if (value.is_null() && k->type != KnobType::String && k->type != KnobType::Enum)
            err = "has no value; give a " + std::string(knobTypeName(k->type)) + " or remove the line";
        else
            err = k->set(out.config, value);
        if (!err.empty()) {
            rejected.insert(key);
            out.issues.push_back({file, line, key, err + " (default: " + knobDefaultText(*k) + ")"});
        }
    }
}

}  // namespace

LoadedConfig parseConfigYaml(const std::string& text, const std::string& fileName) {
    LoadedConfig out;
    if (text.size() > kMaxConfigBytes) {
        out.issues.push_back({fileName, 0, "", "the file is " + std::to_string(text.size()) +
                                                   " bytes; a config may be at most 1 MiB (a config is a "
                                                   "mapping of a few hundred knobs)"});
        return out;
    }
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
        out.issues.push_back({fileName, e.mark.line >= 0 ? e.mark.line + 1 : 0, "",
                              "YAML syntax error: " + sanitizeUtf8(e.msg)});
        return out;
    } catch (const std::exception& e) {
        out.issues.push_back({fileName, 0, "", std::string("cannot parse the YAML: ") + e.what()});
        return out;
    }
    if (root.IsNull()) return out;  // empty file = all defaults
    if (!root.IsMap()) {
        out.issues.push_back({fileName, root.Mark().line + 1, "",
                              "a config must be a mapping of knob: value (e.g. `num_layers: 4`)"});
        return out;
    }
    std::set<std::string> seen, rejected;
    std::map<std::string, int> lines;  // knob -> line where it was set
    try {
        Walk bounds;
        checkBounds(root, bounds, 0);
        Walk w;
        int unknownKeys = 0;
        applyMapping(root, fileName, out, seen, rejected, lines, true, w, unknownKeys);
    } catch (const LimitExceeded& e) {
        out.issues.push_back({fileName, e.line, "", e.message});
        return out;
    } catch (const YAML::Exception& e) {
        out.issues.push_back({fileName, e.mark.line + 1, "", "YAML error: " + sanitizeUtf8(e.msg)});
        return out;
    }
    // Rule checks run even when some keys had problems, so one pass reports everything; a
    // rule about a knob whose value was rejected would only repeat that problem.
    const bool keyProblems = !out.issues.empty();
    for (auto issue : validateConfig(out.config)) {
        if (rejected.count(issue.knob)) continue;
        if (keyProblems && issue.knob.empty()) continue;
        issue.file = fileName;
        if (auto it = lines.find(issue.knob); it != lines.end()) issue.line = it->second;
        out.issues.push_back(issue);
    }
    if (out.issues.size() > kMaxIssues) {
        const size_t more = out.issues.size() - kMaxIssues;
        out.issues.resize(kMaxIssues);
        out.issues.push_back({fileName, 0, "", "and " + std::to_string(more) + " more problems"});
    }
    return out;
}

LoadedConfig loadConfigFile(const std::string& path) {
    LoadedConfig out;
    auto problem = [&](const std::string& msg) {
        out.issues.push_back({path, 0, "", msg});
        return out;
    };
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        return problem(std::string("cannot open config file: ") + std::strerror(errno) + " (check the path)");
    if (S_ISDIR(st.st_mode)) return problem("is a directory; give a YAML config file");
    if (!S_ISREG(st.st_mode)) return problem("is not a regular file (a pipe or device?); give a YAML config file");
    if (uint64_t(st.st_size) > kMaxConfigBytes)
        return problem("the file is " + std::to_string(st.st_size) +
                       " bytes; a config may be at most 1 MiB (a config is a mapping of a few hundred knobs)");
    std::ifstream in(path, std::ios::binary);
    if (!in) return problem("cannot open config file (check the path and its permissions)");
    // Read at most one byte past the bound: the file may have grown since stat.
    std::string text(kMaxConfigBytes + 1, '\0');
    in.read(text.data(), std::streamsize(text.size()));
    text.resize(size_t(in.gcount()));
    if (in.bad()) return problem("cannot read config file");
    return parseConfigYaml(text, path);
}

Status applyOverride(Config& c, const std::string& kv) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
        return Status::invalid("override '" + sanitizeUtf8(kv) + "' must look like knob=value");
    const std::string key = sanitizeUtf8(kv.substr(0, eq));
    const KnobDef* k = findKnob(key);
    if (!k) {
        LoadedConfig tmp;
        unknownKeyIssue(tmp, "", 0, key);
        return Status::invalid(tmp.issues[0].message);
    }
    if (kv.size() - eq - 1 > kMaxConfigBytes) return Status::invalid(key + ": the value is longer than 1 MiB");
    YAML::Node n;
    try {
        n = YAML::Load(kv.substr(eq + 1));
    } catch (const YAML::Exception& e) {
        return Status::invalid(key + ": cannot parse value '" + sanitizeUtf8(kv.substr(eq + 1)) + "': " + sanitizeUtf8(e.msg));
    }
    json value;
    try {
        Walk w;
        value = n.IsNull() ? json("") : nodeToJson(n, w, 0);
    } catch (const LimitExceeded& e) {
        return Status::invalid(key + ": " + e.message);
    }
    std::string err = k->set(c, value);
    if (!err.empty()) return Status::invalid(key + ": " + err);
    return Status::ok();
}

Result<json> yamlToJson(const std::string& text) {
    if (text.size() > kMaxConfigBytes) return Status::invalid("the text is larger than 1 MiB");
    try {
        YAML::Node root = YAML::Load(text);
        Walk bounds;
        checkBounds(root, bounds, 0);
        Walk w;
        return nodeToJson(root, w, 0);
    } catch (const LimitExceeded& e) {
        return Status::invalid(e.message);
    } catch (const YAML::Exception& e) {
        return Status::invalid("YAML error at line " + std::to_string(e.mark.line + 1) + ": " + sanitizeUtf8(e.msg));
    }
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
        // One scalar: strings quoted, floats as the shortest text that parses back to the same
        // double and keeps a '.' or exponent (so it stays a float), the rest as JSON writes it.
        auto scalar = [&](const json& x) {
            if (x.is_string()) {
                e << YAML::DoubleQuoted << x.get<std::string>();
            } else if (x.is_boolean()) {
                e << (x.get<bool>() ? "true" : "false");
            } else if (x.is_number_float()) {
                const double d = x.get<double>();
                std::string s;
                for (int prec = 1; prec <= 17; ++prec) {
                    std::ostringstream num;
                    num.precision(prec);
                    num << d;
                    s = num.str();
                    if (std::strtod(s.c_str(), nullptr) == d) break;
                }
                // Whole numbers as digits (rotary_base: 500000.0, not 5e+05).
                if (std::fabs(d) < 1e15 && d == std::floor(d)) s = std::to_string(int64_t(d)) + ".0";
                if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
                e << s;
            } else {
                e << x.dump();
            }
        };
        if (v.is_array()) {
            // string lists unquoted as before ([core_attn, mlp]); numbers as numbers
            e << YAML::BeginSeq;
            for (const auto& x : v) {
                if (x.is_string()) e << x.get<std::string>();
                else scalar(x);
            }
            e << YAML::EndSeq;
        } else {
            scalar(v);
        }
        out << k.name << ": " << e.c_str() << "\n";
    }
    return out.str();
}

}  // namespace ts::engine
