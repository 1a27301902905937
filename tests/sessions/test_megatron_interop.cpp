// Megatron-LM interop (issue #14): every export of every example config (and of configs that
// switch every knob off and on) parses against Megatron-LM's own argument definitions, the
// committed table resources/megatron/megatron_lm_args.tsv that scripts/megatron_tables.py
// generates from upstream's source; and config -> megatron-args -> from-megatron gives the
// same config back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/config/knobs.h"
#include "sessions/bridge_import.h"
#include "sessions/export.h"
#include "sessions/megatron_import.h"

namespace ts::sessions {
namespace {

using engine::Config;
using engine::KnobDef;
using engine::KnobType;
using nlohmann::json;

// One argparse argument of Megatron-LM, as the table records it.
struct ArgDef {
    std::string dest, type, nargs, action;
    json choices;  // null when free
    json defaultValue;  // discarded (null) when computed upstream
};

struct ArgTable {
    std::string commit;
    std::map<std::string, ArgDef> byFlag;
};

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    for (char ch : s) {
        if (ch == sep) { out.push_back(cur); cur.clear(); }
        else cur += ch;
    }
    out.push_back(cur);
    return out;
}

const ArgTable& megatronTable() {
    static const ArgTable t = [] {
        ArgTable t;
        std::ifstream in(std::string(TS_SOURCE_DIR) + "/resources/megatron/megatron_lm_args.tsv");
        std::string line;
        while (std::getline(in, line)) {
            if (line.rfind("# upstream\tNVIDIA/Megatron-LM\t", 0) == 0) t.commit = split(line, '\t')[2];
            if (line.empty() || line[0] == '#') continue;
            auto f = split(line, '\t');
            if (f.size() != 7) continue;
            ArgDef d{f[1], f[2], f[3], f[6], f[4].empty() ? json() : json::parse(f[4], nullptr, false),
                     json::parse(f[5], nullptr, false)};
            for (const auto& flag : split(f[0], ',')) t.byFlag[flag] = d;
        }
        return t;
    }();
    return t;
}

// What argparse would say about one value of a typed argument ("" when it accepts it).
std::string checkValue(const ArgDef& d, const std::string& v) {
    if (d.type == "int") {
        char* end = nullptr;
        std::strtoll(v.c_str(), &end, 10);  // Python's int() takes no fraction or exponent
        if (v.empty() || *end != '\0') return "invalid int value: '" + v + "'";
    } else if (d.type == "float") {
        char* end = nullptr;
        std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0') return "invalid float value: '" + v + "'";
    }
    if (d.choices.is_array()) {
        for (const auto& c : d.choices) {
            if (c.is_string() && c.get<std::string>() == v) return "";
            if (c.is_number_integer() && std::to_string(c.get<int64_t>()) == v) return "";
        }
        return "invalid choice: '" + v + "' (choose from " + d.choices.dump() + ")";
    }
    return "";
}

// Parses argv the way Megatron-LM's argparse would; every problem as a message.
std::vector<std::string> parseAgainstMegatron(const std::vector<std::string>& argv) {
    const ArgTable& t = megatronTable();
    std::vector<std::string> problems;
    std::map<std::string, int> seen;
    for (size_t i = 0; i < argv.size();) {
        const std::string flag = argv[i++];
        auto it = t.byFlag.find(flag);
        if (it == t.byFlag.end()) {
            problems.push_back("unrecognized argument " + flag);
            continue;
        }
        if (++seen[it->second.dest] > 1) problems.push_back(flag + " given twice");
        const ArgDef& d = it->second;
        if (d.action == "store_true" || d.action == "store_false" || d.action == "store_const") continue;
        std::vector<std::string> values;
        const bool many = d.nargs == "+" || d.nargs == "*";
        while (i < argv.size() && argv[i].rfind("--", 0) != 0 && (many || values.empty())) values.push_back(argv[i++]);
        if (values.empty() && d.nargs != "*") problems.push_back(flag + ": expected one argument");
        for (const auto& v : values) {
            std::string e = checkValue(d, v);
            if (!e.empty()) problems.push_back(flag + ": " + e);
        }
    }
    return problems;
}

std::vector<std::pair<std::string, Config>> exampleConfigs() {
    std::vector<std::pair<std::string, Config>> out;
    for (const auto& e : std::filesystem::directory_iterator(std::string(TS_SOURCE_DIR) + "/resources/examples")) {
        if (e.path().extension() != ".yaml") continue;
        auto loaded = engine::loadConfigFile(e.path().string());
        EXPECT_TRUE(loaded.ok()) << e.path() << ": " << engine::issuesToStatus(loaded.issues).toString();
        out.emplace_back(e.path().filename().string(), loaded.config);
    }
    EXPECT_GE(out.size(), 10u);
    return out;
}

// Every bool knob set to `on`, and the features that gate other knobs' export turned on, so
// that every knob with a Megatron-LM flag is written.
Config everyKnob(bool on) {
    Config c;
    for (const auto& k : engine::knobRegistry())
        if (k.type == KnobType::Bool) {
            EXPECT_EQ(k.set(c, json(on)), "") << k.name;
        }
    c.position_embedding_type = "rope";
    c.rotary_base = 500000;
    c.num_moe_experts = 8;
    c.expert_model_parallel_size = 2;
    c.moe_expert_capacity_factor = on ? 1.5 : 0.0;
    c.moe_z_loss_coeff = on ? 1e-3 : 0.0;
    c.moe_shared_expert_intermediate_size = on ? 512 : 0;
    c.moe_router_load_balancing_type = on ? "seq_aux_loss" : "none";
    c.moe_token_dispatcher_type = on ? "alltoall" : "allgather";
    c.moe_layer_freq = on ? "([1]*3+[0]*1)*2" : "2";  // num_layers 8
    c.fp8 = on ? "hybrid" : "";
    c.recompute_granularity = on ? "selective" : "";
    if (on) {  // these are written only while their feature is on
        c.fp8_recipe = "tensorwise";
        c.recompute_modules = {"core_attn", "mlp"};
        c.main_grads_dtype = "bf16";
        c.exp_avg_dtype = "bf16";
        c.exp_avg_sq_dtype = "fp8";
        c.hierarchical_context_parallel_sizes = {1, 1};  // product = context_parallel_size 1
    }
    c.cpu_offloading_num_layers = on ? 2 : 0;
    c.cuda_graph_impl = on ? "transformer_engine" : "none";
    c.attention_backend = on ? "flash" : "unfused";
    c.cross_entropy_fusion_impl = on ? "te" : "native";
    c.num_distributed_optimizer_instances = on ? 2 : 1;
    c.data_parallel_sharding_strategy = on ? "optim" : "optim_grads_params";
    c.pipeline_model_parallel_size = 4;
    c.num_layers = 8;
    c.virtual_pipeline_model_parallel_size = on ? 2 : 1;
    c.decoder_first_pipeline_num_layers = on ? 1 : 0;
    c.ffn_hidden_size = 1024;
    c.lr_decay_style = on ? "cosine" : "constant";
    c.data_path = "synthetic";
    return c;
}

// Megatron's list form: several aux-loss types, a coefficient each (nargs='+').
Config listForm() {
    Config c = everyKnob(true);
    c.moe_router_load_balancing_type = engine::OneOrList<std::string>({"aux_loss", "seq_aux_loss"});
    c.moe_aux_loss_coeff = engine::OneOrList<double>({1e-2, 1e-3});
    return c;
}

std::vector<std::pair<std::string, Config>> allConfigs() {
    auto out = exampleConfigs();
    out.emplace_back("every knob on", everyKnob(true));
    out.emplace_back("every knob off", everyKnob(false));
    out.emplace_back("load-balancing list", listForm());
    return out;
}

// The list form in every format: Megatron-LM's words, Bridge's list, YAML and the CLI's --set,
// and each read back as the list; a one-element list is the scalar (validate_args unwraps it).
TEST(MegatronInterop, LoadBalancingListInEveryFormat) {
    const Config c = listForm();
    const auto args = megatronArgs(c);
    auto at = std::find(args.begin(), args.end(), "--moe-router-load-balancing-type");
    ASSERT_NE(at, args.end());
    ASSERT_LT(at + 2, args.end());
    EXPECT_EQ(at[1], "aux_loss");
    EXPECT_EQ(at[2], "seq_aux_loss");
    at = std::find(args.begin(), args.end(), "--moe-aux-loss-coeff");
    ASSERT_NE(at, args.end());
    ASSERT_LT(at + 2, args.end());
    EXPECT_EQ(std::stod(at[1]), 1e-2);
    EXPECT_EQ(std::stod(at[2]), 1e-3);
    auto back = configFromMegatronArgs(args);
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    EXPECT_TRUE(back->config.moe_router_load_balancing_type.same(c.moe_router_load_balancing_type));
    EXPECT_TRUE(back->config.moe_aux_loss_coeff.same(c.moe_aux_loss_coeff));
    auto one = configFromMegatronArgs({"--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.5"});
    ASSERT_TRUE(one.isOk());
    EXPECT_TRUE(one->config.moe_router_load_balancing_type == "seq_aux_loss");
    EXPECT_TRUE(one->config.moe_aux_loss_coeff == 0.5);

    const auto overrides = bridgeOverrides(c);
    EXPECT_NE(std::find(overrides.begin(), overrides.end(), "model.moe_router_load_balancing_type=[aux_loss,seq_aux_loss]"),
              overrides.end());
    EXPECT_NE(std::find(overrides.begin(), overrides.end(), "model.moe_aux_loss_coeff=[0.01,0.001]"), overrides.end());

    const auto yaml = engine::parseConfigYaml(engine::configToYaml(c));
    EXPECT_TRUE(yaml.config.moe_router_load_balancing_type.same(c.moe_router_load_balancing_type));
    EXPECT_TRUE(yaml.config.moe_aux_loss_coeff.same(c.moe_aux_loss_coeff));
    Config cli;
    ASSERT_TRUE(engine::applyOverride(cli, "moe_router_load_balancing_type=[aux_loss, global_aux_loss]").isOk());
    ASSERT_TRUE(engine::applyOverride(cli, "moe_aux_loss_coeff=[1e-2,1e-3]").isOk());
    EXPECT_EQ(engine::moeAuxLossCoeff(cli, "global_aux_loss"), 1e-3);
    EXPECT_EQ(engine::moeAuxLossCoeff(cli, "aux_loss"), 1e-2);
    EXPECT_EQ(engine::moeAuxLossCoeff(cli, "seq_aux_loss"), 0.0);
    ASSERT_TRUE(engine::applyOverride(cli, "moe_aux_loss_coeff=[0.25]").isOk());
    EXPECT_FALSE(cli.moe_aux_loss_coeff.isList());
    EXPECT_FALSE(engine::applyOverride(cli, "moe_aux_loss_coeff=[]").isOk());
    EXPECT_FALSE(engine::applyOverride(cli, "moe_router_load_balancing_type=[aux_loss, bogus]").isOk());
    // validate (MoE rules apply with experts): the lengths must match
    cli.num_moe_experts = 8;
    cli.moe_aux_loss_coeff = 0.01;
    auto issues = engine::validateConfig(cli);
    ASSERT_FALSE(issues.empty());
    bool lengths = false;
    for (const auto& i : issues) lengths |= i.knob == "moe_aux_loss_coeff" && i.message.find("same length") != std::string::npos;
    EXPECT_TRUE(lengths);
}

TEST(MegatronInterop, TableIsGeneratedFromARecordedUpstreamCommit) {
    const ArgTable& t = megatronTable();
    EXPECT_EQ(t.commit.size(), 40u) << "resources/megatron/megatron_lm_args.tsv has no upstream commit line";
    EXPECT_GT(t.byFlag.size(), 500u);
    // Spot checks of what issue #14 found: --rotary-base is an int, dropless is None.
    ASSERT_TRUE(t.byFlag.count("--rotary-base"));
    EXPECT_EQ(t.byFlag.at("--rotary-base").type, "int");
    EXPECT_EQ(t.byFlag.at("--no-overlap-p2p-communication").action, "store_false");
    EXPECT_EQ(checkValue(t.byFlag.at("--rotary-base"), "10000.0"), "invalid int value: '10000.0'");
}

TEST(MegatronInterop, EveryRegistryFlagExistsUpstreamWithItsDirection) {
    const ArgTable& t = megatronTable();
    for (const auto& k : engine::knobRegistry()) {
        if (!k.megatronFlag.empty()) {
            ASSERT_TRUE(t.byFlag.count(k.megatronFlag)) << k.name << ": " << k.megatronFlag << " is not a Megatron-LM flag";
            if (k.type == KnobType::Bool)
                EXPECT_EQ(t.byFlag.at(k.megatronFlag).action, "store_true") << k.megatronFlag;
            else
                EXPECT_EQ(t.byFlag.at(k.megatronFlag).action, "store") << k.megatronFlag;
        }
        if (!k.megatronFalseFlag.empty()) {
            ASSERT_TRUE(t.byFlag.count(k.megatronFalseFlag)) << k.name << ": " << k.megatronFalseFlag;
            const auto& d = t.byFlag.at(k.megatronFalseFlag);
            // --grad-reduce-in-bf16 is a store_true of the opposite dest; the rest store_false.
            EXPECT_TRUE(d.action == "store_false" || d.dest != k.name) << k.megatronFalseFlag;
        }
    }
}

TEST(MegatronInterop, RegistryDefaultsAreMegatronLMs) {
    // `trainscope knobs` teaches Megatron-LM's defaults: each knob's default is the upstream
    // argument's (a None upstream is a required or derived value: ours is a placeholder).
    const ArgTable& t = megatronTable();
    const Config defaults;
    for (const auto& k : engine::knobRegistry()) {
        if (k.type == KnobType::Bool) {
            // A knob with only a set-flag is one Megatron defaults off; only a clear-flag, on.
            if (!k.megatronFlag.empty() && k.megatronFalseFlag.empty()) {
                EXPECT_EQ(k.get(defaults), json(false)) << k.name;
            }
            if (k.megatronFlag.empty() && !k.megatronFalseFlag.empty()) {
                EXPECT_EQ(k.get(defaults), json(true)) << k.name;
            }
            continue;
        }
        if (k.megatronFlag.empty() || !t.byFlag.count(k.megatronFlag)) continue;
        const json& up = t.byFlag.at(k.megatronFlag).defaultValue;
        if (up.is_null() || up.is_discarded()) continue;
        // Spelled differently, meaning the same: 0 = MHA (upstream 1 only with
        // --group-query-attention); one cp_comm_type for every layer (upstream a list of one).
        if (k.name == "num_query_groups" || k.name == "cp_comm_type") continue;
        const json ours = k.get(defaults);
        if (ours.is_number() && up.is_number())
            EXPECT_DOUBLE_EQ(ours.get<double>(), up.get<double>()) << k.name;
        else
            EXPECT_EQ(ours, up) << k.name;
    }
}

TEST(MegatronInterop, EveryExportParsesWithMegatronTypesAndChoices) {
    for (const auto& [name, c] : allConfigs()) {
        const auto args = megatronArgs(c);
        for (const auto& p : parseAgainstMegatron(args)) ADD_FAILURE() << name << ": " << p;
    }
}

// The asserts of Megatron-LM's validate_args (megatron/training/arguments.py at the table's
// commit) that a parallel layout and its overlap knobs can trip, replayed on parsed arguments.
std::vector<std::string> validateArgsLikeMegatron(const std::vector<std::string>& argv) {
    std::map<std::string, std::string> a;  // flag -> value ("" for switches)
    for (size_t i = 0; i < argv.size(); ++i) {
        if (argv[i].rfind("--", 0) != 0) continue;
        a[argv[i]] = (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) ? argv[i + 1] : "";
    }
    auto num = [&](const char* f, int dflt) { return a.count(f) ? std::atoi(a[f].c_str()) : dflt; };
    std::vector<std::string> p;
    const int pp = num("--pipeline-model-parallel-size", 1);
    const bool overlapP2P = !a.count("--no-overlap-p2p-communication");
    const bool vpp = a.count("--num-virtual-stages-per-pipeline-rank") || a.count("--num-layers-per-virtual-pipeline-stage");
    if (vpp && !(overlapP2P ? pp > 1 : pp > 2)) p.push_back("interleaved schedule: pipeline-model-parallel size too small");
    if (a.count("--overlap-param-gather") && !(a.count("--use-distributed-optimizer") && a.count("--overlap-grad-reduce")))
        p.push_back("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce");
    if (a.count("--overlap-param-gather-with-optimizer-step") &&
        !(a.count("--use-distributed-optimizer") && a.count("--overlap-param-gather") && vpp))
        p.push_back("--overlap-param-gather-with-optimizer-step needs the distributed optimizer, param gather overlap, vpp");
    if (a.count("--tp-comm-overlap") && !a.count("--sequence-parallel"))
        p.push_back("tensor parallel communication/GEMM overlap needs sequence parallelism");
    if (!a.count("--decoder-first-pipeline-num-layers") && !a.count("--decoder-last-pipeline-num-layers") &&
        num("--num-layers", 0) % pp != 0)
        p.push_back("number of layers should be divisible by the pipeline-model-parallel size");
    if (a.count("--recompute-method") && a["--recompute-granularity"] != "full")
        p.push_back("--recompute-method needs --recompute-granularity full");
    return p;
}

TEST(MegatronInterop, ValidConfigsPassValidateArgsReplay) {
    for (const auto& [name, c] : exampleConfigs()) {
        ASSERT_TRUE(engine::validateConfig(c).empty()) << name;
        for (const auto& p : validateArgsLikeMegatron(megatronArgs(c))) ADD_FAILURE() << name << ": " << p;
    }
    // And the replay does fire: interleaving on pp=2 without p2p overlap.
    Config bad;
    bad.pipeline_model_parallel_size = 2;
    bad.virtual_pipeline_model_parallel_size = 2;
    bad.overlap_p2p_comm = false;
    EXPECT_FALSE(validateArgsLikeMegatron(megatronArgs(bad)).empty());
    EXPECT_FALSE(engine::validateConfig(bad).empty());  // and our own rules say so first
}

TEST(MegatronInterop, ParserCheckCanFail) {
    EXPECT_FALSE(parseAgainstMegatron({"--rotary-base", "10000.0"}).empty());
    EXPECT_FALSE(parseAgainstMegatron({"--position-embedding-type", "alibi"}).empty());
    EXPECT_FALSE(parseAgainstMegatron({"--not-a-megatron-flag"}).empty());
    EXPECT_FALSE(parseAgainstMegatron({"--num-layers"}).empty());
    EXPECT_TRUE(parseAgainstMegatron({"--num-layers", "4", "--bf16", "--recompute-modules", "core_attn", "mlp"}).empty());
}

// The knobs a Megatron-LM argument list carries (a flag in the registry), compared one by one;
// the global batch compares as the size Megatron reads.
void expectSameMegatronKnobs(const Config& a, const Config& b, const std::string& what) {
    for (const auto& k : engine::knobRegistry()) {
        if (k.megatronFlag.empty() && k.megatronFalseFlag.empty() && k.name != "cpu_offloading") continue;
        if (k.name == "global_batch_size") {
            EXPECT_EQ(engine::deriveSizes(a).global_batch_size, engine::deriveSizes(b).global_batch_size) << what;
            continue;
        }
        EXPECT_EQ(k.get(a), k.get(b)) << what << ": " << k.name;
    }
}

TEST(MegatronInterop, RoundTripThroughMegatronArgs) {
    for (const auto& [name, c] : allConfigs()) {
        auto back = configFromMegatronArgs(megatronArgs(c));
        ASSERT_TRUE(back.isOk()) << name << ": " << back.status().toString();
        EXPECT_TRUE(back->unmapped.empty()) << name << ": " << back->unmapped.front();
        expectSameMegatronKnobs(c, back->config, name);
    }
}

TEST(MegatronInterop, ImportsALaunchScript) {
    const std::string script = R"(#!/bin/bash
# A Megatron-LM launch as the upstream examples write it.
GPUS_PER_NODE=8
TP=4
GPT_MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096 # inline comment
    --num-attention-heads 32
    --seq-length 4096 --max-position-embeddings 4096
)
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    --tensor-model-parallel-size ${TP} \
    --sequence-parallel \
    --swiglu --no-bias-swiglu-fusion \
    --position-embedding-type=rope --rotary-base 500000 \
    --recompute-modules core_attn mlp \
    --tokenizer-type HuggingFaceTokenizer \
    --data-path "$DATA_DIR/corpus_text_document" \
    --enable-cuda-graph \
    --bf16
)";
    auto r = configFromMegatronScript(script);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    const Config& c = r->config;
    EXPECT_EQ(c.num_layers, 32);
    EXPECT_EQ(c.hidden_size, 4096);
    EXPECT_EQ(c.num_attention_heads, 32);
    EXPECT_EQ(c.seq_length, 4096);
    EXPECT_EQ(c.tensor_model_parallel_size, 4);
    EXPECT_TRUE(c.sequence_parallel);
    EXPECT_TRUE(c.swiglu);
    EXPECT_FALSE(c.bias_activation_fusion);
    EXPECT_EQ(c.position_embedding_type, "rope");
    EXPECT_DOUBLE_EQ(c.rotary_base, 500000);
    EXPECT_EQ(c.recompute_modules, (std::vector<std::string>{"core_attn", "mlp"}));
    EXPECT_EQ(c.cuda_graph_impl, "local");
    EXPECT_TRUE(c.bf16);
    // Unmapped arguments are listed by name, with their values.
    ASSERT_EQ(r->unmapped.size(), 1u);
    EXPECT_EQ(r->unmapped[0], "--tokenizer-type HuggingFaceTokenizer");
    // $DATA_DIR is not set in the script: reported, the word kept as written.
    bool dataNote = false;
    for (const auto& n : r->notes) dataNote |= n.find("$DATA_DIR") != std::string::npos;
    EXPECT_TRUE(dataNote);
    EXPECT_EQ(c.data_path, "$DATA_DIR/corpus_text_document");
}

TEST(MegatronInterop, ShellWordsHandleQuotesAndContinuations) {
    std::vector<std::string> notes;
    auto w = shellWords("A=x\necho 'a b' \"c $A\" d\\\n e # comment\n", &notes);
    EXPECT_EQ(w, (std::vector<std::string>{"echo", "a b", "c x", "d", "e"}));
    EXPECT_TRUE(notes.empty());
}

// The exported command line is the argument list, shell-quoted: bash reads back the same words
// (moe_layer_freq's "([1]*3+[0]*1)*2" would be a syntax error unquoted).
TEST(MegatronInterop, ExportedCommandLineReadsBackAsTheSameWords) {
    for (const auto& [name, c] : allConfigs()) {
        const ExportResult r = exportConfig(c, ExportFormat::MegatronArgs);
        EXPECT_EQ(shellWords(r.text), r.args) << name << ": " << r.text;
    }
    Config odd;
    odd.data_path = "/data/it's here (v2)";
    const ExportResult r = exportConfig(odd, ExportFormat::MegatronArgs);
    EXPECT_NE(r.text.find("'/data/it'\\''s here (v2)'"), std::string::npos) << r.text;
    EXPECT_EQ(shellWords(r.text), r.args) << r.text;
}

// ---- Megatron-Bridge -------------------------------------------------------------------------

struct BridgeField {
    std::string type;
    bool optional = false;
    json choices;
};

struct BridgeTable {
    std::string commit;
    std::map<std::string, BridgeField> byPath;
};

const BridgeTable& bridgeTable() {
    static const BridgeTable t = [] {
        BridgeTable t;
        std::ifstream in(std::string(TS_SOURCE_DIR) + "/resources/megatron/bridge_fields.tsv");
        std::string line;
        while (std::getline(in, line)) {
            if (line.rfind("# upstream\tNVIDIA-NeMo/Megatron-Bridge\t", 0) == 0) t.commit = split(line, '\t')[2];
            if (line.empty() || line[0] == '#') continue;
            auto f = split(line, '\t');
            if (f.size() != 5) continue;
            t.byPath[f[0]] = {f[1], f[2] == "optional", f[3].empty() ? json() : json::parse(f[3], nullptr, false)};
        }
        return t;
    }();
    return t;
}

// Whether Bridge would take `value` for the field (OmegaConf/Hydra value syntax).
std::string checkBridgeValue(const std::string& path, const BridgeField& f, const std::string& value) {
    if (value == "null") return f.optional ? "" : path + " is not optional; null is not accepted";
    const json v = json::parse(value, nullptr, false);
    auto inChoices = [&] {
        if (!f.choices.is_array()) return true;
        for (const auto& ch : f.choices)
            if (ch.is_string() && ch.get<std::string>() == value) return true;
        return false;
    };
    if (f.type == "int") {
        if (!v.is_number_integer()) return path + "=" + value + ": not an int";
    } else if (f.type == "float") {
        if (!v.is_number()) return path + "=" + value + ": not a float";
    } else if (f.type == "bool") {
        if (!v.is_boolean()) return path + "=" + value + ": not a bool";
    } else if (f.type == "str" || f.type == "enum") {
        if (!inChoices()) return path + "=" + value + ": not one of " + f.choices.dump();
    } else if (f.type == "torch.dtype") {
        if (value != "fp32" && value != "bf16" && value != "fp16" && value != "fp8") return path + "=" + value + ": not a dtype name";
    } else if (f.type.rfind("Callable", 0) == 0) {
        if (value != "silu" && value != "gelu") return path + "=" + value + ": not an activation Bridge maps";
    } else if (f.type == "List[str]" || f.type == "list[str]") {
        if (value.empty() || value.front() != '[' || value.back() != ']') return path + "=" + value + ": not a list";
    } else if (f.type == "Union[int, List[int]]") {
        bool ok = v.is_number_integer();
        if (v.is_array()) {
            ok = true;
            for (const auto& e : v) ok = ok && e.is_number_integer();
        }
        if (!ok) return path + "=" + value + ": not an int or a list of ints";
    } else if (f.type == "Union[float, List[float]]") {
        bool ok = v.is_number();
        if (v.is_array()) {
            ok = !v.empty();
            for (const auto& e : v) ok = ok && e.is_number();
        }
        if (!ok) return path + "=" + value + ": not a float or a list of floats";
    } else if (f.type.rfind("Union[float", 0) == 0) {
        if (!v.is_number()) return path + "=" + value + ": not a float";
    } else if (f.type == "Union[str, List[str]]") {
        if (value.empty()) return path + ": empty";
    }
    return "";
}

std::vector<std::string> checkAgainstBridge(const std::vector<std::string>& overrides) {
    std::vector<std::string> problems;
    std::map<std::string, int> seen;
    for (const auto& o : overrides) {
        const auto eq = o.find('=');
        if (eq == std::string::npos) { problems.push_back(o + ": no '='"); continue; }
        const std::string path = o.substr(0, eq), value = o.substr(eq + 1);
        if (++seen[path] > 1) problems.push_back(path + " set twice");
        auto it = bridgeTable().byPath.find(path);
        if (it == bridgeTable().byPath.end()) { problems.push_back(path + " is not a ConfigContainer field"); continue; }
        std::string e = checkBridgeValue(path, it->second, value);
        if (!e.empty()) problems.push_back(e);
    }
    return problems;
}

TEST(BridgeInterop, TableIsGeneratedFromARecordedUpstreamCommit) {
    EXPECT_EQ(bridgeTable().commit.size(), 40u);
    EXPECT_GT(bridgeTable().byPath.size(), 400u);
    EXPECT_EQ(bridgeTable().byPath.at("model.rotary_base").type, "int");
    EXPECT_TRUE(bridgeTable().byPath.count("dataset.seq_length"));
    EXPECT_TRUE(bridgeTable().byPath.count("comm_overlap.overlap_grad_reduce"));
    EXPECT_FALSE(checkAgainstBridge({"model.rotary_base=10000.0"}).empty());
    EXPECT_FALSE(checkAgainstBridge({"model.no_such_field=1"}).empty());
    EXPECT_FALSE(checkAgainstBridge({"model.num_layers=null"}).empty());
    EXPECT_TRUE(checkAgainstBridge({"model.num_query_groups=null", "model.num_layers=4"}).empty());
}

TEST(BridgeInterop, EveryRegistryPathIsAField) {
    for (const auto& k : engine::knobRegistry())
        if (!k.bridgePath.empty()) {
            EXPECT_TRUE(bridgeTable().byPath.count(k.bridgePath)) << k.name << ": " << k.bridgePath;
        }
}

TEST(BridgeInterop, EveryExportIsFieldsWithTheirTypes) {
    for (const auto& [name, c] : allConfigs())
        for (const auto& p : checkAgainstBridge(bridgeOverrides(c))) ADD_FAILURE() << name << ": " << p;
}

TEST(BridgeInterop, PrecisionSwigluSequenceAndOffFeatures) {
    auto has = [](const std::vector<std::string>& ov, const std::string& s) {
        return std::find(ov.begin(), ov.end(), s) != ov.end();
    };
    Config c;  // fp32, GeLU, no recompute, no vpp
    auto ov = bridgeOverrides(c);
    EXPECT_TRUE(has(ov, "mixed_precision=null"));
    EXPECT_TRUE(has(ov, "model.bf16=false"));
    EXPECT_TRUE(has(ov, "model.gated_linear_unit=false"));
    EXPECT_TRUE(has(ov, "model.activation_func=gelu"));
    EXPECT_TRUE(has(ov, "model.seq_length=128"));
    EXPECT_TRUE(has(ov, "dataset.seq_length=128"));
    EXPECT_TRUE(has(ov, "model.recompute_granularity=null"));
    EXPECT_TRUE(has(ov, "model.virtual_pipeline_model_parallel_size=null"));
    EXPECT_TRUE(has(ov, "model.rotary_base=10000"));
    EXPECT_TRUE(has(ov, "comm_overlap.overlap_grad_reduce=false"));
    for (const auto& o : ov) EXPECT_EQ(o.rfind("ddp.overlap_", 0), std::string::npos) << o;
    c.bf16 = true;
    c.swiglu = true;
    ov = bridgeOverrides(c);
    EXPECT_TRUE(has(ov, "mixed_precision=bf16_mixed"));
    EXPECT_FALSE(has(ov, "model.bf16=true"));
    EXPECT_TRUE(has(ov, "model.gated_linear_unit=true"));
    EXPECT_TRUE(has(ov, "model.activation_func=silu"));
    EXPECT_TRUE(has(ov, "model.ffn_hidden_size=640"));  // Megatron-LM's swiglu size, not Bridge's 4h
    c.fp8 = "hybrid";
    c.fp8_recipe = "delayed";
    std::vector<std::string> notes;
    ov = bridgeOverrides(c, &notes);
    EXPECT_TRUE(has(ov, "mixed_precision=bf16_with_fp8_delayed_scaling_mixed"));
    bool histNote = false;
    for (const auto& n : notes) histNote |= n.find("fp8_amax_history_len") != std::string::npos;
    EXPECT_TRUE(histNote);  // the preset's 1024 differs from the knob's 1
}

void expectSameBridgeKnobs(const Config& a, const Config& b, const std::string& what) {
    for (const auto& k : engine::knobRegistry()) {
        if (k.bridgePath.empty() || k.name == "data_path") continue;
        if (k.name == "global_batch_size") {
            EXPECT_EQ(engine::deriveSizes(a).global_batch_size, engine::deriveSizes(b).global_batch_size) << what;
            continue;
        }
        if (k.name == "ffn_hidden_size") {
            EXPECT_EQ(engine::deriveSizes(a).ffn_hidden_size, engine::deriveSizes(b).ffn_hidden_size) << what;
            continue;
        }
        if (k.name.rfind("fp8", 0) == 0 && !a.bf16) continue;  // no fp8 without bf16
        if (k.name == "moe_layer_freq") {  // Bridge gets Megatron-LM's expression expanded to its list
            EXPECT_EQ(engine::moeLayerPattern(a), engine::moeLayerPattern(b)) << what;
            continue;
        }
        EXPECT_EQ(k.get(a), k.get(b)) << what << ": " << k.name;
    }
}

TEST(BridgeInterop, RoundTripThroughBridgeOverrides) {
    for (const auto& [name, c] : allConfigs()) {
        std::string text;
        for (const auto& o : bridgeOverrides(c)) text += o + "\n";
        auto back = configFromBridge(text);
        ASSERT_TRUE(back.isOk()) << name << ": " << back.status().toString();
        for (const auto& u : back->unmapped) ADD_FAILURE() << name << ": unmapped " << u;
        expectSameBridgeKnobs(c, back->config, name);
    }
}

TEST(BridgeInterop, ImportsARecipeYamlAndListsWhatItCannotMap) {
    const std::string yaml = R"(
model:
  num_layers: 32
  hidden_size: 4096
  num_attention_heads: 32
  num_query_groups: 8
  seq_length: 8192
  gated_linear_unit: true
  activation_func: silu
  position_embedding_type: rope
  rotary_base: 500000
  tensor_model_parallel_size: 2
  virtual_pipeline_model_parallel_size: null
  recompute_granularity: null
ddp:
  use_distributed_optimizer: true
comm_overlap:
  overlap_grad_reduce: true
  tp_comm_overlap: false
mixed_precision: bf16_mixed
dataset:
  seq_length: 8192
tokenizer:
  tokenizer_type: HuggingFaceTokenizer
)";
    auto r = configFromBridge(yaml);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    const Config& c = r->config;
    EXPECT_EQ(c.num_layers, 32);
    EXPECT_EQ(c.num_query_groups, 8);
    EXPECT_TRUE(c.swiglu);
    EXPECT_EQ(c.position_embedding_type, "rope");
    EXPECT_DOUBLE_EQ(c.rotary_base, 500000);
    EXPECT_TRUE(c.use_distributed_optimizer);
    EXPECT_TRUE(c.overlap_grad_reduce);
    EXPECT_TRUE(c.bf16);
    EXPECT_EQ(c.fp8, "");
    ASSERT_EQ(r->unmapped.size(), 1u);
    EXPECT_EQ(r->unmapped[0], "tokenizer.tokenizer_type=HuggingFaceTokenizer");
}

TEST(MegatronInterop, ShrinkKeepsTheLayoutAndEveryPerformanceKnob) {
    // A 70B-style launch: 80 layers, GQA 64/8, tp 8, pp 4 with interleaving, SP, overlaps.
    const std::string launch =
        "pretrain_gpt.py --num-layers 80 --hidden-size 8192 --num-attention-heads 64 --group-query-attention "
        "--num-query-groups 8 --ffn-hidden-size 28672 --seq-length 4096 --max-position-embeddings 4096 "
        "--swiglu --normalization RMSNorm --position-embedding-type rope --vocab-size 128256 "
        "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 5 "
        "--sequence-parallel --tp-comm-overlap --use-distributed-optimizer --overlap-grad-reduce "
        "--overlap-param-gather --bf16 --recompute-granularity full --recompute-method block "
        "--recompute-num-layers 2 --micro-batch-size 1 --global-batch-size 64";
    auto r = configFromMegatronScript(launch);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    const Config before = r->config;
    Config c = before;
    auto changes = shrinkModelShape(c);
    EXPECT_FALSE(changes.empty());
    // Layout and performance knobs unchanged.
    for (const char* knob : {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                             "virtual_pipeline_model_parallel_size", "sequence_parallel", "tp_comm_overlap",
                             "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather", "bf16",
                             "recompute_granularity", "recompute_method", "swiglu", "normalization",
                             "micro_batch_size", "global_batch_size"})
        EXPECT_EQ(engine::findKnob(knob)->get(c), engine::findKnob(knob)->get(before)) << knob;
    // Shape: one or two layers per chunk, whole groups per TP rank, GQA ratio kept.
    EXPECT_EQ(c.num_layers % (4 * 5), 0);
    EXPECT_LE(c.num_layers, 40);
    EXPECT_EQ(c.num_query_groups % 8, 0);
    EXPECT_EQ(c.num_attention_heads / c.num_query_groups, 4);
    EXPECT_LE(c.hidden_size, 1024);
    EXPECT_LE(c.seq_length, 128);
    EXPECT_EQ(c.seq_length % 8, 0);
    EXPECT_LE(c.recompute_num_layers, c.num_layers / 20);
    // The shrunk config passes every rule (the layout still divides the shape).
    for (const auto& i : engine::validateConfig(c)) ADD_FAILURE() << i.toString();
}

}  // namespace
}  // namespace ts::sessions
