// Megatron-LM launch -> Config through the knob registry's flags (megatron_import.h).
#include "sessions/megatron_import.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/config/knobs.h"

namespace ts::sessions {

using nlohmann::json;
using engine::KnobDef;
using engine::KnobType;

namespace {

bool isName(char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; }

// A small POSIX-shell word splitter: enough for launch scripts (quotes, backslash
// continuations, comments, $VAR / ${VAR} / ${ARR[@]} of variables the script sets).
struct Lexer {
    const std::string& s;
    size_t i = 0;
    std::map<std::string, std::string> vars;
    std::map<std::string, std::vector<std::string>> arrays;
    std::vector<std::string>* notes = nullptr;

    // Expands $NAME at s[i] (i on '$'); appends to cur, or to extra words for arrays.
    void expand(std::string& cur, std::vector<std::string>& words, bool& have) {
        ++i;
        std::string name;
        bool braces = false, array = false;
        if (i < s.size() && s[i] == '{') {
            braces = true;
            ++i;
            while (i < s.size() && s[i] != '}') name += s[i++];
            if (i < s.size()) ++i;
            if (name.size() > 3 && name.compare(name.size() - 3, 3, "[@]") == 0) {
                array = true;
                name.resize(name.size() - 3);
            }
        } else {
            while (i < s.size() && isName(s[i])) name += s[i++];
        }
        if (name.empty()) { cur += '$'; have = true; return; }
        if (array && arrays.count(name)) {
            const auto& a = arrays[name];
            for (size_t k = 0; k < a.size(); ++k) {
                if (k + 1 < a.size() || !cur.empty()) {
                    cur += a[k];
                    words.push_back(cur);
                    cur.clear();
                } else {
                    cur += a[k];
                }
            }
            have = !cur.empty() || have;
            return;
        }
        if (auto it = vars.find(name); it != vars.end()) { cur += it->second; have = true; return; }
        if (auto it = arrays.find(name); it != arrays.end() && !it->second.empty()) { cur += it->second[0]; have = true; return; }
        const std::string raw = braces ? "${" + name + (array ? "[@]" : "") + "}" : "$" + name;
        if (notes) notes->push_back(raw + " is not set in the script; the word holding it is kept as written");
        cur += raw;
        have = true;
    }

    // Next words (usually one; an array expansion gives several). "\n" and ";" come back as
    // words of their own; returns false at the end.
    bool next(std::vector<std::string>& out) {
        out.clear();
        // Skip blanks and continuations.
        while (i < s.size()) {
            if (s[i] == ' ' || s[i] == '\t' || s[i] == '\r') { ++i; continue; }
            if (s[i] == '\\' && i + 1 < s.size() && (s[i + 1] == '\n' || s[i + 1] == '\r')) {
                i += 2;
                if (i < s.size() && s[i - 1] == '\r' && s[i] == '\n') ++i;
                continue;
            }
            if (s[i] == '#') {  // comment to the end of the line
                while (i < s.size() && s[i] != '\n') ++i;
                continue;
            }
            break;
        }
        if (i >= s.size()) return false;
        if (s[i] == '\n' || s[i] == ';') { out.push_back(std::string(1, s[i] == ';' ? ';' : '\n')); ++i; return true; }
        if (s[i] == '&' || s[i] == '|') {
            while (i < s.size() && (s[i] == '&' || s[i] == '|')) ++i;
            out.push_back(";");
            return true;
        }
        std::string cur;
        bool have = false;
        while (i < s.size()) {
            const char ch = s[i];
            if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == ';' || ch == '&' || ch == '|') break;
            if (ch == '\\' && i + 1 < s.size()) {
                if (s[i + 1] == '\n') { i += 2; continue; }
                cur += s[i + 1];
                i += 2;
                have = true;
                continue;
            }
            if (ch == '\'') {
                ++i;
                while (i < s.size() && s[i] != '\'') cur += s[i++];
                ++i;
                have = true;
                continue;
            }
            if (ch == '"') {
                ++i;
                while (i < s.size() && s[i] != '"') {
                    if (s[i] == '\\' && i + 1 < s.size() && std::string("\"\\$`\n").find(s[i + 1]) != std::string::npos) {
                        if (s[i + 1] != '\n') cur += s[i + 1];
                        i += 2;
                    } else if (s[i] == '$') {
                        expand(cur, out, have);
                    } else {
                        cur += s[i++];
                    }
                }
                ++i;
                have = true;
                continue;
            }
            if (ch == '$') { expand(cur, out, have); continue; }
            cur += ch;
            have = true;
            ++i;
        }
        if (have) out.push_back(cur);
        return true;
    }
};

// Statements of a script as word lists, with assignments applied (and dropped).
std::vector<std::vector<std::string>> statements(const std::string& text, std::vector<std::string>* notes) {
    Lexer lx{text};
    lx.notes = notes;
    std::vector<std::vector<std::string>> out;
    std::vector<std::string> cur;
    std::vector<std::string> ws;
    std::string arrayName;  // collecting NAME=( ... )
    std::vector<std::string> arrayWords;
    auto flush = [&] {
        if (!cur.empty()) out.push_back(cur);
        cur.clear();
    };
    while (lx.next(ws)) {
        for (const auto& w : ws) {
            if (!arrayName.empty()) {
                if (w == "\n" || w == ";") continue;
                if (w == ")") { lx.arrays[arrayName] = arrayWords; arrayName.clear(); continue; }
                if (!w.empty() && w.back() == ')') {
                    if (w.size() > 1) arrayWords.push_back(w.substr(0, w.size() - 1));
                    lx.arrays[arrayName] = arrayWords;
                    arrayName.clear();
                    continue;
                }
                arrayWords.push_back(w);
                continue;
            }
            if (w == "\n" || w == ";") { flush(); continue; }
            const bool first = cur.empty() || (cur.size() == 1 && cur[0] == "export");
            const auto eq = w.find('=');
            if (first && eq != std::string::npos && eq > 0 &&
                std::all_of(w.begin(), w.begin() + long(eq), isName) && !std::isdigit(static_cast<unsigned char>(w[0]))) {
                const std::string name = w.substr(0, eq), value = w.substr(eq + 1);
                if (value == "(" || (!value.empty() && value[0] == '(')) {
                    arrayName = name;
                    arrayWords.clear();
                    std::string rest = value.substr(1);
                    if (!rest.empty() && rest.back() == ')') {
                        rest.pop_back();
                        if (!rest.empty()) arrayWords.push_back(rest);
                        lx.arrays[name] = arrayWords;
                        arrayName.clear();
                    } else if (!rest.empty()) {
                        arrayWords.push_back(rest);
                    }
                } else {
                    lx.vars[name] = value;
                }
                if (!cur.empty()) cur.clear();  // "export NAME=..."
                continue;
            }
            cur.push_back(w);
        }
    }
    flush();
    return out;
}

bool endsWith(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Flag -> (knob, value the flag sets for bool knobs) from the registry.
struct FlagMap {
    std::map<std::string, std::pair<const KnobDef*, bool>> flags;
    FlagMap() {
        for (const auto& k : engine::knobRegistry()) {
            if (!k.megatronFlag.empty()) flags[k.megatronFlag] = {&k, true};
            if (!k.megatronFalseFlag.empty()) flags[k.megatronFalseFlag] = {&k, false};
        }
    }
};

json valueFor(const KnobDef& k, const std::vector<std::string>& values, std::string& err) {
    if (k.type == KnobType::StringList) return json(values);
    // nargs='+' knobs of Megatron's Union[T, List[T]]: one value is the scalar (validate_args).
    if ((k.type == KnobType::EnumOrList || k.type == KnobType::FloatOrList) && values.size() > 1) {
        json out = json::array();
        for (const std::string& v : values) {
            if (k.type == KnobType::EnumOrList) {
                out.push_back(v);
                continue;
            }
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            if (v.empty() || *end != '\0') {
                err = "'" + v + "' is not a number";
                return nullptr;
            }
            out.push_back(x);
        }
        return out;
    }
    if (k.type == KnobType::IntList) {
        json out = json::array();
        for (const std::string& v : values) {
            char* end = nullptr;
            const long long x = std::strtoll(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0') {
                err = "'" + v + "' is not an integer";
                return nullptr;
            }
            out.push_back(x);
        }
        return out;
    }
    if (values.size() != 1) {
        err = "expects one value, got " + std::to_string(values.size());
        return nullptr;
    }
    const std::string& v = values[0];
    if (k.type == KnobType::Int || k.type == KnobType::Float || k.type == KnobType::FloatOrList) {
        char* end = nullptr;
        if (k.type == KnobType::Int) {
            const long long x = std::strtoll(v.c_str(), &end, 10);
            if (end && *end == '\0' && !v.empty()) return json(x);
        }
        const double d = std::strtod(v.c_str(), &end);
        if (end && *end == '\0' && !v.empty()) return json(d);
        err = "'" + v + "' is not a number";
        return nullptr;
    }
    return json(v);
}

}  // namespace

std::vector<std::string> shellWords(const std::string& text, std::vector<std::string>* notes) {
    std::vector<std::string> out;
    for (const auto& st : statements(text, notes)) out.insert(out.end(), st.begin(), st.end());
    return out;
}

Result<MegatronImport> configFromMegatronArgs(const std::vector<std::string>& argvIn) {
    static const FlagMap fm;
    MegatronImport r;
    // Skip a launcher prefix ("torchrun --nproc-per-node 8 pretrain_gpt.py").
    size_t start = 0;
    for (size_t i = 0; i < argvIn.size(); ++i)
        if (endsWith(argvIn[i], ".py")) start = i + 1;
    std::vector<std::string> argv(argvIn.begin() + long(start), argvIn.end());
    int maxPositions = 0;
    bool sawCpuOffloadLayers = false;
    for (size_t i = 0; i < argv.size();) {
        std::string flag = argv[i];
        std::vector<std::string> values;
        if (flag.rfind("--", 0) != 0) {
            r.unmapped.push_back(flag);
            ++i;
            continue;
        }
        ++i;
        if (auto eq = flag.find('='); eq != std::string::npos) {
            values.push_back(flag.substr(eq + 1));
            flag.resize(eq);
        } else {
            while (i < argv.size() && argv[i].rfind("--", 0) != 0) values.push_back(argv[i++]);
        }
        auto joined = [&] {
            std::string s = flag;
            for (const auto& v : values) s += " " + v;
            return s;
        };
        // Flags that stand for a knob in another way than the registry's one flag.
        if (flag == "--group-query-attention") continue;  // implied by --num-query-groups
        if (flag == "--max-position-embeddings") {
            if (values.size() == 1) maxPositions = std::atoi(values[0].c_str());
            continue;
        }
        if (flag == "--mock-data") { r.config.data_path = "synthetic"; continue; }
        if (flag == "--no-bias-swiglu-fusion") { r.config.bias_activation_fusion = false; continue; }
        if (flag == "--enable-cuda-graph") {
            r.config.cuda_graph_impl = "local";
            r.notes.push_back("--enable-cuda-graph is deprecated upstream: imported as cuda_graph_impl=local");
            continue;
        }
        if (flag == "--data-path" && values.size() > 1) {
            r.unmapped.push_back(joined() + " (a blend of several datasets; trainscope reads one prefix)");
            continue;
        }
        auto it = fm.flags.find(flag);
        if (it == fm.flags.end()) {
            r.unmapped.push_back(joined());
            continue;
        }
        const KnobDef& k = *it->second.first;
        if (k.type == KnobType::Bool) {
            if (!values.empty()) {
                r.unmapped.push_back(joined() + " (a switch takes no value)");
                continue;
            }
            std::string err = k.set(r.config, json(it->second.second));
            if (!err.empty()) r.unmapped.push_back(joined() + " (" + err + ")");
            continue;
        }
        std::string err;
        json v = valueFor(k, values, err);
        if (err.empty()) err = k.set(r.config, v);
        if (!err.empty()) {
            r.unmapped.push_back(joined() + " (" + k.name + ": " + err + ")");
            continue;
        }
        if (k.name == "cpu_offloading_num_layers") sawCpuOffloadLayers = true;
    }
    // Megatron-LM turns offloading on from the layer count (arguments.py).
    if (sawCpuOffloadLayers) r.config.cpu_offloading = r.config.cpu_offloading_num_layers > 0;
    if (maxPositions > 0 && maxPositions != r.config.seq_length)
        r.notes.push_back("--max-position-embeddings " + std::to_string(maxPositions) +
                          " differs from --seq-length; trainscope sizes positions by seq_length");
    return r;
}

Result<MegatronImport> configFromMegatronScript(const std::string& text) {
    std::vector<std::string> notes;
    auto sts = statements(text, &notes);
    // The launch: the statement that runs a .py (pretrain_gpt.py), else the one with most flags.
    const std::vector<std::string>* best = nullptr;
    size_t bestFlags = 0;
    for (const auto& st : sts) {
        bool py = false;
        size_t flags = 0;
        for (const auto& w : st) {
            py |= endsWith(w, ".py");
            flags += w.rfind("--", 0) == 0;
        }
        if (py && flags > 0 && (!best || flags + 100000 >= bestFlags)) { best = &st; bestFlags = flags + 100000; }
        else if (!py && flags > bestFlags) { best = &st; bestFlags = flags; }
    }
    if (!best) return Status::invalid("no Megatron-LM argument list found (expected a pretrain_gpt.py command line)");
    // A file of arguments only (no .py launch): every line that starts with a flag is part of
    // the list, one flag per line or many.
    std::vector<std::string> argsOnly;
    if (bestFlags < 100000) {
        for (const auto& st : sts)
            if (!st.empty() && st[0].rfind("--", 0) == 0) argsOnly.insert(argsOnly.end(), st.begin(), st.end());
        if (!argsOnly.empty()) best = &argsOnly;  // else: the command with the most flags
    }
    TS_ASSIGN_OR_RETURN(MegatronImport r, configFromMegatronArgs(*best));
    r.notes.insert(r.notes.begin(), notes.begin(), notes.end());
    return r;
}

std::vector<std::string> shrinkModelShape(engine::Config& c) {
    std::vector<std::string> changes;
    auto set = [&](const char* name, int& field, int value) {
        if (field == value) return;
        changes.push_back(std::string(name) + " " + std::to_string(field) + " -> " + std::to_string(value));
        field = value;
    };
    const engine::DerivedSizes d = engine::deriveSizes(c);
    const int tp = d.tp, pp = d.pp, cp = d.cp;
    const int vpp = std::max(1, c.virtual_pipeline_model_parallel_size);
    // Layers: one per model chunk keeps every stage and chunk of the layout; the first/last
    // stage split keeps its shape with one layer where it was set.
    if (c.decoder_first_pipeline_num_layers > 0 || c.decoder_last_pipeline_num_layers > 0) {
        if (c.decoder_first_pipeline_num_layers > 0) set("decoder_first_pipeline_num_layers", c.decoder_first_pipeline_num_layers, 1);
        if (c.decoder_last_pipeline_num_layers > 0) set("decoder_last_pipeline_num_layers", c.decoder_last_pipeline_num_layers, 1);
        set("num_layers", c.num_layers, pp);
    } else if (c.num_layers_per_virtual_pipeline_stage > 0) {
        set("num_layers_per_virtual_pipeline_stage", c.num_layers_per_virtual_pipeline_stage, 1);
        set("num_layers", c.num_layers, pp * std::max(1, c.num_layers / std::max(1, pp * c.num_layers_per_virtual_pipeline_stage)));
    } else {
        set("num_layers", c.num_layers, std::min(c.num_layers, pp * vpp * std::max(1, std::min(2, c.num_layers / (pp * vpp)))));
    }
    // Heads: whole query groups per TP rank, the GQA ratio kept (at most 4), head dim 16.
    const int groups = d.num_query_groups;
    const int ratio = groups > 0 ? std::max(1, std::min(4, c.num_attention_heads / groups)) : 1;
    const bool gqa = c.num_query_groups > 0 && c.num_query_groups != c.num_attention_heads;
    const int groupsNew = gqa ? tp : 2 * tp;
    const int headsNew = gqa ? groupsNew * ratio : groupsNew;
    set("num_attention_heads", c.num_attention_heads, headsNew);
    if (gqa) set("num_query_groups", c.num_query_groups, groupsNew);
    set("kv_channels", c.kv_channels, 0);
    set("hidden_size", c.hidden_size, headsNew * 16);
    // MLP: derived from the new hidden size (Megatron's rule), kept a multiple of tp.
    int ffn = 0;
    if (c.swiglu) {
        engine::Config probe = c;
        probe.ffn_hidden_size = 0;
        if (engine::deriveSizes(probe).ffn_hidden_size % tp != 0) ffn = 64 * tp;
    } else if (4 * c.hidden_size % tp != 0) {
        ffn = 4 * c.hidden_size * tp;
    }
    set("ffn_hidden_size", c.ffn_hidden_size, ffn);
    if (c.moe_ffn_hidden_size > 0) set("moe_ffn_hidden_size", c.moe_ffn_hidden_size, 2 * c.hidden_size);
    if (c.moe_shared_expert_intermediate_size > 0)
        set("moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size, 2 * c.hidden_size);
    // Sequence: 128 tokens, a multiple of what SP and CP need.
    int seqMult = 1;
    if (c.sequence_parallel) seqMult = std::max(seqMult, tp);
    if (cp > 1) seqMult = std::max(seqMult, 2 * cp) * (seqMult % (2 * cp) ? 2 : 1);
    const int seq = std::max(seqMult, (128 / seqMult) * seqMult);
    if (c.seq_length > seq) set("seq_length", c.seq_length, seq);
    set("vocab_size", c.vocab_size, std::min(c.vocab_size, 4096));
    // Counts tied to the layer count.
    if (c.recompute_num_layers > 0)
        set("recompute_num_layers", c.recompute_num_layers,
            std::min(c.recompute_num_layers, std::max(1, c.num_layers / (pp * vpp))));
    if (c.cpu_offloading_num_layers > 0)
        set("cpu_offloading_num_layers", c.cpu_offloading_num_layers, std::max(1, std::min(c.cpu_offloading_num_layers, c.num_layers - 1)));
    // Data: a dataset of the big run is rarely on this node; synthetic tokens keep the step's work.
    if (!c.data_path.empty() && c.data_path != "synthetic" && !std::filesystem::exists(c.data_path + ".bin")) {
        changes.push_back("data_path " + c.data_path + " -> synthetic (no " + c.data_path + ".bin here)");
        c.data_path = "synthetic";
    }
    return changes;
}

}  // namespace ts::sessions
