// The knob registry table and the generic machinery around it (typed access to Config fields,
// text forms, suggestions). YAML parsing and rule checks live in config_yaml.cpp /
// config_rules.cpp.
#include "engine/config/knobs.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

namespace ts::engine {

using nlohmann::json;

const char* knobTypeName(KnobType t) {
    switch (t) {
        case KnobType::Int: return "int";
        case KnobType::Float: return "float";
        case KnobType::Bool: return "bool";
        case KnobType::String: return "string";
        case KnobType::Enum: return "enum";
        case KnobType::StringList: return "list";
        case KnobType::IntList: return "int_list";
        case KnobType::EnumOrList: return "enum_or_list";
        case KnobType::FloatOrList: return "float_or_list";
    }
    return "?";
}

namespace {

// Typed binding of a knob to its Config field.
template <typename T>
void bind(KnobDef& k, T Config::*member);

template <>
void bind<int>(KnobDef& k, int Config::*m) {
    k.get = [m](const Config& c) { return json(c.*m); };
    k.set = [m, name = k.name](Config& c, const json& v) -> std::string {
        if (v.is_number_integer() || v.is_number_unsigned()) {
            const auto x = v.get<int64_t>();
            if (x < INT32_MIN || x > INT32_MAX) return "value out of range for an integer";
            c.*m = int(x);
            return "";
        }
        if (v.is_number_float()) {
            const double d = v.get<double>();
            if (d == double(int64_t(d))) { c.*m = int(d); return ""; }
        }
        return "expected an integer, got " + v.dump();
    };
}

template <>
void bind<int64_t>(KnobDef& k, int64_t Config::*m) {
    k.get = [m](const Config& c) { return json(c.*m); };
    k.set = [m](Config& c, const json& v) -> std::string {
        if (v.is_number_integer() || v.is_number_unsigned()) { c.*m = v.get<int64_t>(); return ""; }
        if (v.is_number_float()) {
            const double d = v.get<double>();  // 4e7 in YAML is a float
            if (d == double(int64_t(d))) { c.*m = int64_t(d); return ""; }
        }
        return "expected an integer, got " + v.dump();
    };
}

template <>
void bind<double>(KnobDef& k, double Config::*m) {
    k.get = [m](const Config& c) { return json(c.*m); };
    k.set = [m](Config& c, const json& v) -> std::string {
        if (v.is_number()) { c.*m = v.get<double>(); return ""; }
        return "expected a number, got " + v.dump();
    };
}

template <>
void bind<bool>(KnobDef& k, bool Config::*m) {
    k.get = [m](const Config& c) { return json(c.*m); };
    k.set = [m](Config& c, const json& v) -> std::string {
        if (v.is_boolean()) { c.*m = v.get<bool>(); return ""; }
        return "expected true or false, got " + v.dump();
    };
}

template <>
void bind<std::string>(KnobDef& k, std::string Config::*m) {
    k.get = [m](const Config& c) { return json(c.*m); };
    k.set = [m, allowed = k.allowed](Config& c, const json& v) -> std::string {
        std::string s;
        if (v.is_string()) s = v.get<std::string>();
        else if (v.is_null()) s = "";
        else if (v.is_number() || v.is_boolean()) s = v.dump();
        else return "expected a string, got " + v.dump();
        if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
            std::string list;
            for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + (a.empty() ? std::string("\"\" (off)") : a);
            return "'" + s + "' is not one of: " + list;
        }
        c.*m = s;
        return "";
    };
}

template <>
void bind<std::vector<std::string>>(KnobDef& k, std::vector<std::string> Config::*m) {
    k.get = [m](const Config& c) { return json(c.*m); };
    k.set = [m, allowed = k.allowed](Config& c, const json& v) -> std::string {
        std::vector<std::string> out;
        if (v.is_string()) out.push_back(v.get<std::string>());
        else if (v.is_array()) {
            for (const auto& e : v) {
                if (!e.is_string()) return "expected a list of strings, got " + v.dump();
                out.push_back(e.get<std::string>());
            }
        } else return "expected a list of strings, got " + v.dump();
        for (const auto& s : out) {
            if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
                std::string list;
                for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
                return "'" + s + "' is not one of: " + list;
            }
        }
        c.*m = out;
        return "";
    };
}

// A list of positive integers (Megatron's nargs='+' type=int); [] or null = not set.
template <>
void bind<std::vector<int>>(KnobDef& k, std::vector<int> Config::*m) {
    k.get = [m](const Config& c) { return json(c.*m); };
    k.set = [m](Config& c, const json& v) -> std::string {
        std::vector<int> out;
        auto one = [&](const json& e) -> bool {
            if (e.is_number_integer() || e.is_number_unsigned()) {
                const auto x = e.get<int64_t>();
                if (x < 1 || x > INT32_MAX) return false;
                out.push_back(int(x));
                return true;
            }
            return false;
        };
        if (v.is_null()) {
            c.*m = {};
            return "";
        }
        if (v.is_array()) {
            for (const auto& e : v)
                if (!one(e)) return "expected a list of positive integers, got " + v.dump();
        } else if (!one(v)) {
            return "expected a list of positive integers, got " + v.dump();
        }
        c.*m = out;
        return "";
    };
}

// Megatron's Union[T, List[T]] knobs: a scalar, or an array (one element: the scalar; empty: an error).
// Read back as a scalar when there is one value, so YAML and exports keep the scalar form.
template <>
void bind<OneOrList<std::string>>(KnobDef& k, OneOrList<std::string> Config::*m) {
    k.get = [m](const Config& c) { return (c.*m).isList() ? json((c.*m).items) : json((c.*m).items[0]); };
    k.set = [m, allowed = k.allowed](Config& c, const json& v) -> std::string {
        std::vector<std::string> out;
        if (v.is_string()) out.push_back(v.get<std::string>());
        else if (v.is_array()) {
            for (const auto& e : v) {
                if (!e.is_string()) return "expected a value or a list of values, got " + v.dump();
                out.push_back(e.get<std::string>());
            }
        } else return "expected a value or a list of values, got " + v.dump();
        if (out.empty()) return "expected a value or a list of values, got []";
        for (const auto& s : out) {
            if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
                std::string list;
                for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
                return "'" + s + "' is not one of: " + list;
            }
        }
        c.*m = OneOrList<std::string>(std::move(out));
        return "";
    };
}

template <>
void bind<OneOrList<double>>(KnobDef& k, OneOrList<double> Config::*m) {
    k.get = [m](const Config& c) { return (c.*m).isList() ? json((c.*m).items) : json((c.*m).items[0]); };
    k.set = [m](Config& c, const json& v) -> std::string {
        std::vector<double> out;
        if (v.is_number()) out.push_back(v.get<double>());
        else if (v.is_array()) {
            for (const auto& e : v) {
                if (!e.is_number()) return "expected a number or a list of numbers, got " + v.dump();
                out.push_back(e.get<double>());
            }
        } else return "expected a number or a list of numbers, got " + v.dump();
        if (out.empty()) return "expected a number or a list of numbers, got []";
        c.*m = OneOrList<double>(std::move(out));
        return "";
    };
}

struct Builder {
    std::vector<KnobDef> knobs;
    std::string group;

    template <typename T>
    KnobDef& add(const char* name, T Config::*m, KnobType type, const char* flag,
                 const char* bridge, const char* help, std::vector<std::string> allowed = {}) {
        KnobDef k;
        k.name = name;
        k.type = type;
        k.group = group;
        k.megatronFlag = flag;
        k.bridgePath = bridge;
        k.help = help;
        k.allowed = std::move(allowed);
        bind<T>(k, m);
        knobs.push_back(std::move(k));
        return knobs.back();
    }
    KnobDef& i(const char* n, int Config::*m, const char* f, const char* b, const char* h) {
        return add(n, m, KnobType::Int, f, b, h);
    }
    KnobDef& f(const char* n, double Config::*m, const char* fl, const char* b, const char* h) {
        return add(n, m, KnobType::Float, fl, b, h);
    }
    // Bool: trueFlag sets it, falseFlag clears it (either may be "").
    KnobDef& b(const char* n, bool Config::*m, const char* trueFlag, const char* falseFlag,
               const char* br, const char* h) {
        KnobDef& k = add(n, m, KnobType::Bool, trueFlag, br, h);
        k.megatronFalseFlag = falseFlag;
        return k;
    }
    KnobDef& s(const char* n, std::string Config::*m, const char* f, const char* br, const char* h) {
        return add(n, m, KnobType::String, f, br, h);
    }
    KnobDef& e(const char* n, std::string Config::*m, std::vector<std::string> allowed,
               const char* f, const char* br, const char* h) {
        return add(n, m, KnobType::Enum, f, br, h, std::move(allowed));
    }
};

KnobDef& rules(KnobDef& k, const char* r) { k.rules = r; return k; }
KnobDef& notInEngine(KnobDef& k) { k.engineSupported = false; return k; }
KnobDef& engineRuns(KnobDef& k, std::vector<std::string> values) { k.engineValues = std::move(values); return k; }
KnobDef& unsetWhenZero(KnobDef& k) { k.zeroIsUnset = true; return k; }

// moe_layer_freq holds Megatron's int-or-list: stored as text, read back as a number when it is one
// (so YAML and JSON keep `moe_layer_freq: 2`), set from an integer, a list of 0/1 or an expression.
KnobDef& moeLayerFreqKnob(KnobDef& k) {
    k.get = [](const Config& c) -> json {
        const std::string& s = c.moe_layer_freq;
        if (!s.empty() && s.size() < 7 && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
            return json(std::stoi(s));
        return json(s);
    };
    k.set = [](Config& c, const json& v) -> std::string {
        std::string text;
        if (v.is_null()) text = "1";  // Bridge's None: Megatron's default
        else if (v.is_number_integer() || v.is_number_unsigned()) text = std::to_string(v.get<int64_t>());
        else if (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>())))
            text = std::to_string(int64_t(v.get<double>()));
        else if (v.is_string()) text = v.get<std::string>();
        else if (v.is_array()) {
            text = "[";
            for (size_t i = 0; i < v.size(); ++i) {
                if (!v[i].is_number_integer() && !v[i].is_number_unsigned()) return "expected a list of 0/1, got " + v.dump();
                text += (i ? "," : "") + std::to_string(v[i].get<int64_t>());
            }
            text += "]";
        } else {
            return "expected an integer or a list of 0/1, got " + v.dump();
        }
        // Canonical text: no blanks (Megatron's _eval_pattern accepts only digits , [ ] ( ) + *), and
        // one level of quotes that launch scripts pass through ("'([1]*48)'") removed.
        std::erase_if(text, [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) != 0; });
        if (text.size() >= 2 && (text.front() == '\'' || text.front() == '"') && text.back() == text.front())
            text = text.substr(1, text.size() - 2);
        std::string err;
        if (moeLayerPattern(text, -1, &err).empty()) return err;
        c.moe_layer_freq = text;
        return "";
    };
    return k;
}

std::vector<KnobDef> buildRegistry() {
    Builder r;
    using C = Config;

    r.group = "model";
    rules(r.i("num_layers", &C::num_layers, "--num-layers", "model.num_layers", "Number of transformer layers."),
          "divisible by pipeline_model_parallel_size * virtual_pipeline_model_parallel_size");
    rules(r.i("hidden_size", &C::hidden_size, "--hidden-size", "model.hidden_size", "Transformer hidden size h."),
          "divisible by num_attention_heads unless kv_channels is set");
    rules(r.i("ffn_hidden_size", &C::ffn_hidden_size, "--ffn-hidden-size", "model.ffn_hidden_size",
              "MLP hidden size; 0 = derived as Megatron-LM does: 4*hidden_size, or int(4*hidden_size*2/3/64)*64 "
              "with swiglu."), "divisible by tensor_model_parallel_size");
    rules(r.i("num_attention_heads", &C::num_attention_heads, "--num-attention-heads", "model.num_attention_heads",
              "Number of attention (query) heads."), "divisible by tensor_model_parallel_size");
    rules(r.i("num_query_groups", &C::num_query_groups, "--num-query-groups", "model.num_query_groups",
              "Key/value head groups for GQA; 0 = num_attention_heads (MHA)."),
          "divides num_attention_heads; divisible by tensor_model_parallel_size");
    r.i("kv_channels", &C::kv_channels, "--kv-channels", "model.kv_channels", "Head dimension; 0 = hidden_size / num_attention_heads.");
    rules(r.i("seq_length", &C::seq_length, "--seq-length", "model.seq_length", "Sequence length s (tokens per sample)."),
          "divisible by tensor_model_parallel_size with sequence_parallel; by 2*context_parallel_size with CP");
    r.i("vocab_size", &C::vocab_size, "--vocab-size", "model.vocab_size",
        "Tokenizer vocabulary size before padding (byte tokenizer: 256 used, rest unused rows).");
    r.i("make_vocab_size_divisible_by", &C::make_vocab_size_divisible_by, "--make-vocab-size-divisible-by",
        "model.make_vocab_size_divisible_by", "Pad the vocab to a multiple of this times tensor_model_parallel_size.");
    r.e("normalization", &C::normalization, {"LayerNorm", "RMSNorm"}, "--normalization", "model.normalization",
        "Normalization layer type.");
    r.f("norm_epsilon", &C::norm_epsilon, "--norm-epsilon", "model.layernorm_epsilon", "Epsilon of LayerNorm/RMSNorm.");
    r.b("swiglu", &C::swiglu, "--swiglu", "", "model.gated_linear_unit",
        "SwiGLU MLP (gated, SiLU) instead of GeLU (Bridge: gated_linear_unit plus activation_func=silu).");
    r.e("position_embedding_type", &C::position_embedding_type, {"learned_absolute", "rope", "none"},
        "--position-embedding-type", "model.position_embedding_type",
        "Position embedding type: learned_absolute (Megatron's default; a learned [seq_length, h] table, "
        "max_position_embeddings = seq_length), rope or none.");
    rules(r.f("rotary_base", &C::rotary_base, "--rotary-base", "model.rotary_base",
              "RoPE base theta (Megatron-LM reads an integer)."),
          "an integer; only used with position_embedding_type=rope");
    KnobDef& untie = r.b("untie_embeddings_and_output_weights", &C::untie_embeddings_and_output_weights,
                         "--untie-embeddings-and-output-weights", "", "model.share_embeddings_and_output_weights",
                         "Separate output-layer weights instead of reusing the word embedding.");
    untie.bridgeNegate = true;
    r.b("add_bias_linear", &C::add_bias_linear, "", "--disable-bias-linear", "model.add_bias_linear",
        "Bias terms in all linear layers; with MoE also the router's bias and each expert's fc1/fc2 biases "
        "(Megatron allows them only with expert_tensor_parallel_size 1, no shared experts, and with "
        "moe_grouped_gemm bias_dropout_fusion: false).");
    r.f("hidden_dropout", &C::hidden_dropout, "--hidden-dropout", "model.hidden_dropout",
        "Dropout after attention projection and MLP.");
    r.f("attention_dropout", &C::attention_dropout, "--attention-dropout", "model.attention_dropout",
        "Dropout on attention probabilities.");
    r.f("init_method_std", &C::init_method_std, "--init-method-std", "model.init_method_std",
        "Std of the normal weight initialization.");
    rules(r.i("num_moe_experts", &C::num_moe_experts, "--num-experts", "model.num_moe_experts",
              "Number of MoE experts; 0 = dense MLP. The layers moe_layer_freq marks (every layer by default) "
              "become MoE layers."),
          "divisible by expert_model_parallel_size");

    r.group = "parallel";
    rules(r.i("world_size", &C::world_size, "", "",
              "Number of ranks; 0 = tp*cp*pp*data_parallel_size (torchrun/mpirun decide it in Megatron)."),
          "a multiple of tp*cp*pp");
    rules(r.i("tensor_model_parallel_size", &C::tensor_model_parallel_size, "--tensor-model-parallel-size",
              "model.tensor_model_parallel_size", "Tensor (intra-layer) model parallel size t."),
          "divides num_attention_heads, num_query_groups and ffn_hidden_size");
    rules(r.i("pipeline_model_parallel_size", &C::pipeline_model_parallel_size, "--pipeline-model-parallel-size",
              "model.pipeline_model_parallel_size", "Pipeline (inter-layer) model parallel size p."),
          "divides num_layers");
    rules(r.i("virtual_pipeline_model_parallel_size", &C::virtual_pipeline_model_parallel_size,
              "--num-virtual-stages-per-pipeline-rank", "model.virtual_pipeline_model_parallel_size",
              "Model chunks per pipeline rank v for the interleaved 1F1B schedule; 1 = not interleaved."),
          "needs pipeline_model_parallel_size > 2 (or > 1 with overlap_p2p_comm) and num_microbatches % pipeline_model_parallel_size == 0");
    notInEngine(rules(r.i("num_layers_per_virtual_pipeline_stage", &C::num_layers_per_virtual_pipeline_stage,
                          "--num-layers-per-virtual-pipeline-stage", "",
                          "Interleaving given as layers per model chunk; 0 = unset (Megatron derives the "
                          "virtual stages as num_layers / pp / this)."),
                      "excludes virtual_pipeline_model_parallel_size > 1"));
    notInEngine(r.i("decoder_first_pipeline_num_layers", &C::decoder_first_pipeline_num_layers,
                    "--decoder-first-pipeline-num-layers", "model.num_layers_in_first_pipeline_stage",
                    "Layers on the first pipeline stage; 0 = even split."));
    notInEngine(r.i("decoder_last_pipeline_num_layers", &C::decoder_last_pipeline_num_layers,
                    "--decoder-last-pipeline-num-layers", "model.num_layers_in_last_pipeline_stage",
                    "Layers on the last pipeline stage; 0 = even split."));
    rules(r.i("context_parallel_size", &C::context_parallel_size, "--context-parallel-size",
              "model.context_parallel_size",
              "Context parallel size c (sequence split across ranks in 2c load-balanced chunks; dropout masks are "
              "drawn from global positions, so a CP run equals the cp=1 run)."),
          "seq_length divisible by 2*context_parallel_size");
    r.e("cp_comm_type", &C::cp_comm_type, {"p2p", "all_gather", "a2a", "a2a+p2p"}, "--cp-comm-type",
        "model.cp_comm_type",
        "Context-parallel attention communication: p2p (ring attention, KV blocks passed on a comm stream while "
        "the held block is computed), all_gather (KV all-gathered, not overlapped), a2a (Ulysses: heads "
        "scattered, needs heads and query groups divisible by tp*cp) or a2a+p2p (hierarchical: a2a inside the "
        "hcp-a2a group, ring attention over hcp-p2p; needs hierarchical_context_parallel_sizes).");
    rules(r.add("hierarchical_context_parallel_sizes", &C::hierarchical_context_parallel_sizes, KnobType::IntList,
                "--hierarchical-context-parallel-sizes", "model.hierarchical_context_parallel_sizes",
                "Sizes [a2a, p2p] of the two CP sub-groups for cp_comm_type=a2a+p2p: hcp-a2a holds consecutive CP "
                "ranks (all-to-all of heads, e.g. inside a node), hcp-p2p every a2a-th one (ring attention across "
                "them); [] = not set. a2a+p2p takes exactly two levels (Transformer Engine's CP attention takes two "
                "groups); the other cp_comm_types do not use the list."),
          "product = context_parallel_size; required by cp_comm_type=a2a+p2p; heads and query groups divisible "
          "by tp*a2a");
    rules(r.i("expert_model_parallel_size", &C::expert_model_parallel_size, "--expert-model-parallel-size",
              "model.expert_model_parallel_size",
              "Expert parallel size (experts split across ranks of the expert layout etp-ep-edp-pp; tokens reach "
              "them by all-to-all or all-gather)."),
          "needs num_moe_experts > 0 and divides it");
    r.i("expert_tensor_parallel_size", &C::expert_tensor_parallel_size, "--expert-tensor-parallel-size",
        "model.expert_tensor_parallel_size",
        "Tensor parallel size inside experts (ETP); 0 = tensor_model_parallel_size, as Megatron. Each expert's fc1 is "
        "split column-wise and fc2 row-wise over the etp group; dispatched tokens are all-gathered over it before the "
        "experts and reduce-scattered after. etp*ep*pp must divide the world size; etp must divide "
        "moe_ffn_hidden_size.");
    rules(r.i("data_parallel_size", &C::data_parallel_size, "", "",
              "Data parallel size d; 0 = world_size/(tp*cp*pp) (Megatron derives it from the world size)."),
          "tp*cp*pp*data_parallel_size == world_size");
    rules(r.b("sequence_parallel", &C::sequence_parallel, "--sequence-parallel", "", "model.sequence_parallel",
              "Shard LayerNorm/dropout activations along the sequence in TP regions (all-gather/reduce-scatter instead of all-reduce)."),
          "requires tensor_model_parallel_size > 1");

    r.group = "batch";
    r.i("micro_batch_size", &C::micro_batch_size, "--micro-batch-size", "train.micro_batch_size", "Samples per microbatch b.");
    rules(r.i("global_batch_size", &C::global_batch_size, "--global-batch-size", "train.global_batch_size",
              "Samples per iteration; 0 = micro_batch_size * data_parallel_size * num_microbatches."),
          "divisible by micro_batch_size * data_parallel_size");
    rules(r.i("num_microbatches", &C::num_microbatches, "", "",
              "Microbatches per iteration m (Megatron derives it: global_batch_size / (micro_batch_size*dp)); 0 = derived."),
          "consistent with global_batch_size if both are set");

    r.group = "dp_comm";
    r.b("overlap_grad_reduce", &C::overlap_grad_reduce, "--overlap-grad-reduce", "", "comm_overlap.overlap_grad_reduce",
        "Launch each gradient bucket's reduction as soon as its grads are ready, overlapping backward.");
    rules(r.b("overlap_param_gather", &C::overlap_param_gather, "--overlap-param-gather", "", "comm_overlap.overlap_param_gather",
              "Overlap the distributed optimizer's parameter all-gather with the next forward."),
          "requires use_distributed_optimizer and overlap_grad_reduce");
    r.b("use_distributed_optimizer", &C::use_distributed_optimizer, "--use-distributed-optimizer", "",
        "ddp.use_distributed_optimizer", "Shard optimizer state across DP ranks (reduce-scatter grads, all-gather params); with bf16 the fp32 main params too (6 + 12/dp bytes a parameter).");
    notInEngine(rules(r.b("overlap_param_gather_with_optimizer_step", &C::overlap_param_gather_with_optimizer_step,
                          "--overlap-param-gather-with-optimizer-step", "",
                          "comm_overlap.overlap_param_gather_with_optimizer_step",
                          "Overlap the first bucket's parameter all-gather with the optimizer step."),
                      "requires overlap_param_gather"));
    notInEngine(r.b("align_param_gather", &C::align_param_gather, "", "--no-align-param-gather",
                    "comm_overlap.align_param_gather",
                    "All pipeline stages launch their parameter all-gathers together (interleaved schedule only)."));
    notInEngine(rules(r.i("num_distributed_optimizer_instances", &C::num_distributed_optimizer_instances,
                          "--num-distributed-optimizer-instances", "ddp.num_distributed_optimizer_instances",
                          "Shard the distributed optimizer within groups of dp/N ranks (partial DistOpt); 1 = whole DP."),
                      "divides data_parallel_size; > 1 requires use_distributed_optimizer"));
    notInEngine(r.e("data_parallel_sharding_strategy", &C::data_parallel_sharding_strategy,
                    {"no_shard", "optim", "optim_grads", "optim_grads_params"}, "--data-parallel-sharding-strategy",
                    "ddp.data_parallel_sharding_strategy", "Megatron-FSDP sharding (used only with Megatron-FSDP)."));
    notInEngine(r.b("use_precision_aware_optimizer", &C::use_precision_aware_optimizer,
                    "--use-precision-aware-optimizer", "", "optimizer.use_precision_aware_optimizer",
                    "TE's precision-aware optimizer: main grads and Adam states may be kept in lower precision."));
    notInEngine(rules(r.e("main_grads_dtype", &C::main_grads_dtype, {"fp32", "bf16"}, "--main-grads-dtype",
                          "optimizer.main_grads_dtype", "Main gradient dtype with the precision-aware optimizer."),
                      "non-default only with use_precision_aware_optimizer"));
    notInEngine(rules(r.e("exp_avg_dtype", &C::exp_avg_dtype, {"fp32", "fp16", "bf16", "fp8"}, "--exp-avg-dtype",
                          "optimizer.exp_avg_dtype", "Adam first-moment dtype with the precision-aware optimizer."),
                      "non-default only with use_precision_aware_optimizer"));
    notInEngine(rules(r.e("exp_avg_sq_dtype", &C::exp_avg_sq_dtype, {"fp32", "fp16", "bf16", "fp8"},
                          "--exp-avg-sq-dtype", "optimizer.exp_avg_sq_dtype",
                          "Adam second-moment dtype with the precision-aware optimizer."),
                      "non-default only with use_precision_aware_optimizer"));
    r.add("bucket_size", &C::bucket_size, KnobType::Int, "--ddp-bucket-size", "comm_overlap.bucket_size",
          "Gradient bucket size in elements; 0 = Megatron default max(40M, 1M*dp) (one bucket without overlap_grad_reduce).");
    r.b("average_in_collective", &C::average_in_collective, "--ddp-average-in-collective", "",
        "ddp.average_in_collective", "Average gradients inside the collective (AVG op) instead of pre-scaling by 1/dp.");
    r.b("grad_reduce_in_fp32", &C::grad_reduce_in_fp32, "--accumulate-allreduce-grads-in-fp32", "--grad-reduce-in-bf16",
        "ddp.grad_reduce_in_fp32", "Accumulate and reduce gradients in fp32 (Megatron forces this for bf16 unless --grad-reduce-in-bf16).");

    r.group = "tp_pp_comm";
    rules(r.b("tp_comm_overlap", &C::tp_comm_overlap, "--tp-comm-overlap", "", "comm_overlap.tp_comm_overlap",
              "Overlap the sequence-parallel all-gathers/reduce-scatters of QKV, proj, fc1, fc2 with their GEMMs "
              "(CPU backend: chunked collectives on the rank's tp_comm stream pipelined with chunk GEMMs, as TE "
              "userbuffers; same math, GEMMs split by rows)."),
          "requires sequence_parallel");
    rules(r.b("tp_comm_overlap_ag", &C::tp_comm_overlap_ag, "", "--disable-tp-comm-overlap-ag", "model.tp_comm_overlap_ag",
              "With tp_comm_overlap: ring-exchange all-gather pipelined with the GEMM shard by shard (fprop of "
              "QKV/fc1, dgrad of proj/fc2)."),
          "only used with tp_comm_overlap");
    rules(r.b("tp_comm_overlap_rs", &C::tp_comm_overlap_rs, "", "--disable-tp-comm-overlap-rs", "model.tp_comm_overlap_rs",
              "With tp_comm_overlap: proj/fc2 fprop GEMM split into 4 row chunks, each chunk's reduce-scatter "
              "overlapping the next chunk's GEMM."),
          "only used with tp_comm_overlap");
    rules(r.b("tp_comm_overlap_rs_dgrad", &C::tp_comm_overlap_rs_dgrad, "--tp-comm-overlap-rs-dgrad", "",
              "model.tp_comm_overlap_rs_dgrad",
              "With tp_comm_overlap: QKV/fc1 dgrad GEMM pipelined with chunked reduce-scatters (replaces the bulk "
              "dgrad/wgrad overlaps)."),
          "only used with tp_comm_overlap");
    rules(r.b("tp_comm_bulk_dgrad", &C::tp_comm_bulk_dgrad, "", "--disable-tp-comm-bulk-dgrad", "model.tp_comm_bulk_dgrad",
              "With tp_comm_overlap: QKV/fc1 backward re-gathers the saved input on the tp_comm stream while the "
              "dgrad GEMM runs."),
          "only used with tp_comm_overlap");
    rules(r.b("tp_comm_bulk_wgrad", &C::tp_comm_bulk_wgrad, "", "--disable-tp-comm-bulk-wgrad", "model.tp_comm_bulk_wgrad",
              "With tp_comm_overlap: QKV/fc1 backward reduce-scatters the dgrad on the tp_comm stream while the "
              "wgrad GEMM runs."),
          "only used with tp_comm_overlap");
    rules(r.b("overlap_p2p_comm", &C::overlap_p2p_comm, "", "--no-overlap-p2p-communication", "comm_overlap.overlap_p2p_comm",
              "Overlap pipeline send/recv with compute; as in Megatron-LM it is in effect only with the "
              "interleaved schedule (virtual_pipeline_model_parallel_size > 1)."),
          "needed for interleaving with pipeline_model_parallel_size=2");
    rules(r.b("batch_p2p_comm", &C::batch_p2p_comm, "", "", "comm_overlap.batch_p2p_comm",
              "Post pipeline send/recv pairs as one batched isend/irecv where overlap_p2p_comm is not in effect "
              "(Megatron derives it: not overlap_p2p_comm)."),
          "ignored while overlap_p2p_comm is in effect");

    r.group = "fusion";
    rules(r.b("masked_softmax_fusion", &C::masked_softmax_fusion, "", "--no-masked-softmax-fusion",
              "model.masked_softmax_fusion", "Fuse scale + causal mask + softmax into one kernel."),
          "applies where attention_backend is unfused or local (flash attention is always fused)");
    r.e("attention_backend", &C::attention_backend, {"flash", "fused", "unfused", "local", "auto"},
        "--attention-backend", "model.attention_backend",
        "Core attention: flash, fused and auto (Transformer Engine's flash or cuDNN attention, Megatron's default) "
        "keep each softmax row's max and 1/sum and rebuild the probabilities in backward, so the 5as/h activation term "
        "is gone; unfused and local keep the [b, a, s, s] probabilities (masked_softmax_fusion applies to them). On "
        "both backends flash and fused run our own flash kernel (cuDNN's is not wired yet).");
    r.b("bias_activation_fusion", &C::bias_activation_fusion, "", "--no-bias-gelu-fusion", "model.bias_activation_fusion",
        "Fuse bias add + GeLU/SwiGLU (Megatron flag --no-bias-swiglu-fusion when swiglu).");
    r.b("bias_dropout_fusion", &C::bias_dropout_fusion, "", "--no-bias-dropout-fusion", "model.bias_dropout_fusion",
        "Fuse bias add + dropout + residual add.");
    r.b("apply_rope_fusion", &C::apply_rope_fusion, "", "--no-rope-fusion", "model.apply_rope_fusion",
        "Fused rotary position embedding kernel.");
    r.b("cross_entropy_loss_fusion", &C::cross_entropy_loss_fusion, "--cross-entropy-loss-fusion", "",
        "model.cross_entropy_loss_fusion", "Fused cross entropy: loss and gradient without materializing the softmax.");
    notInEngine(r.e("cross_entropy_fusion_impl", &C::cross_entropy_fusion_impl, {"native", "te"},
                    "--cross-entropy-fusion-impl", "model.cross_entropy_fusion_impl",
                    "Which fused cross entropy: Megatron-Core's (native) or Transformer Engine's (te)."));
    r.b("gradient_accumulation_fusion", &C::gradient_accumulation_fusion, "", "--no-gradient-accumulation-fusion",
        "model.gradient_accumulation_fusion", "Weight-gradient GEMM accumulates straight into the fp32 main grad.");
    r.b("persist_layer_norm", &C::persist_layer_norm, "", "--no-persist-layer-norm", "model.persist_layer_norm",
        "Persistent (single-pass) fused LayerNorm kernel.");

    r.group = "precision";
    r.b("bf16", &C::bf16, "--bf16", "", "mixed_precision", "bf16 mixed precision: bf16 params/activations, fp32 main weights and grads (Bridge: the mixed_precision "
        "preset bf16_mixed, or with fp8 the bf16_with_fp8_* preset of fp8_recipe).");
    rules(r.e("fp8", &C::fp8, {"", "e4m3", "hybrid"}, "--fp8-format", "model.fp8",
              "FP8 GEMMs of the transformer layers' linears and MoE experts (emulated on the CPU): e4m3 "
              "everywhere, or hybrid (e4m3 forward, e5m2 gradients); \"\" = off."),
          "requires bf16");
    r.e("fp8_recipe", &C::fp8_recipe, {"delayed", "tensorwise", "mxfp8", "blockwise"}, "--fp8-recipe",
        "model.fp8_recipe",
        "FP8 scaling recipe: delayed (amax history), tensorwise (per-tensor current scaling), mxfp8 "
        "(1x32 blocks, E8M0 scales) or blockwise (1x128 / 128x128 blocks, power-of-two fp32 scales); "
        "emulated on the CPU. Differs from the single device where Transformer Engine's semantics make "
        "it so (validate warns): tensorwise MoE experts take the amax of their rows and weight shard on "
        "the rank (with TP/SP, CP, EP or ETP unless the expert-parallel group is one microbatch's "
        "tp-cp group and etp is 1); mxfp8/blockwise quantize the wgrad along each rank's own tokens "
        "(with CP where a sequence chunk's rows are not whole 32/128 blocks, and in experts split "
        "over ranks).");
    r.i("fp8_amax_history_len", &C::fp8_amax_history_len, "--fp8-amax-history-len",
        "model.fp8_amax_history_len", "Amax history length of delayed scaling.");
    r.e("fp8_amax_compute_algo", &C::fp8_amax_compute_algo, {"most_recent", "max"},
        "--fp8-amax-compute-algo", "model.fp8_amax_compute_algo", "How the scale's amax is taken from the history.");
    r.i("fp8_margin", &C::fp8_margin, "--fp8-margin", "model.fp8_margin",
        "Scale margin: scale = fp8_max / amax / 2^margin.");
    r.b("fp8_wgrad", &C::fp8_wgrad, "", "--no-fp8-wgrad", "model.fp8_wgrad",
        "FP8 weight-gradient GEMM; false keeps its output gradient in high precision.");
    r.b("first_last_layers_bf16", &C::first_last_layers_bf16, "--first-last-layers-bf16", "",
        "model.first_last_layers_bf16", "Under fp8, keep the linears of the first and last layers in bf16.");
    r.i("num_layers_at_start_in_bf16", &C::num_layers_at_start_in_bf16, "--num-layers-at-start-in-bf16",
        "model.num_layers_at_start_in_bf16", "Layers at the start kept in bf16 with first_last_layers_bf16.");
    r.i("num_layers_at_end_in_bf16", &C::num_layers_at_end_in_bf16, "--num-layers-at-end-in-bf16",
        "model.num_layers_at_end_in_bf16", "Layers at the end kept in bf16 with first_last_layers_bf16.");

    r.group = "recompute";
    r.e("recompute_granularity", &C::recompute_granularity, {"", "selective", "full"}, "--recompute-granularity",
        "model.recompute_granularity", "Activation recompute: selective (core attention) or full layers; \"\" = off.");
    rules(r.e("recompute_method", &C::recompute_method, {"", "uniform", "block"}, "--recompute-method",
              "model.recompute_method", "Full recompute: uniform chunks of layers, or the first N layers of each stage."),
          "only with recompute_granularity=full");
    rules(r.i("recompute_num_layers", &C::recompute_num_layers, "--recompute-num-layers", "model.recompute_num_layers",
              "Layers per recompute chunk (uniform) or recomputed layers per stage (block)."),
          "> 0 with recompute_granularity=full");
    notInEngine(rules(r.b("recompute_activations", &C::recompute_activations, "--recompute-activations", "", "",
                          "Megatron-LM's shorthand for recompute_granularity=selective."),
                      "excludes recompute_granularity=full"));
    r.add("recompute_modules", &C::recompute_modules, KnobType::StringList, "--recompute-modules",
          "model.recompute_modules", "Modules recomputed with selective granularity.",
          {"core_attn", "mlp", "layernorm", "moe_act", "moe", "shared_experts", "mla_up_proj"});

    r.group = "moe";
    r.i("moe_router_topk", &C::moe_router_topk, "--moe-router-topk", "model.moe_router_topk",
        "Experts each token is routed to.");
    rules(r.add("moe_aux_loss_coeff", &C::moe_aux_loss_coeff, KnobType::FloatOrList, "--moe-aux-loss-coeff",
                "model.moe_aux_loss_coeff",
                "Load-balancing auxiliary loss coefficient (Megatron suggests 1e-2 to start); with a list of "
                "moe_router_load_balancing_type a list of as many coefficients, one per type "
                "([1e-2, 1e-3]; CLI --set 'moe_aux_loss_coeff=[1e-2,1e-3]')."),
          "a list exactly when moe_router_load_balancing_type is one, of the same length; 0 with sinkhorn and "
          "quantile_balancing");
    unsetWhenZero(r.f("moe_z_loss_coeff", &C::moe_z_loss_coeff, "--moe-z-loss-coeff", "model.moe_z_loss_coeff",
                      "Router z-loss coefficient; 0 = unset (no z-loss term)."));
    r.b("moe_grouped_gemm", &C::moe_grouped_gemm, "--moe-grouped-gemm", "", "model.moe_grouped_gemm",
        "One grouped GEMM for all local experts.");
    r.e("moe_token_dispatcher_type", &C::moe_token_dispatcher_type, {"allgather", "alltoall", "flex"},
        "--moe-token-dispatcher-type", "model.moe_token_dispatcher_type",
        "How tokens reach their experts: allgather (every rank of the EP group gets every token, outputs "
        "reduce-scattered), alltoall (each token copy sent to its expert's rank), or flex (Megatron's fused "
        "DeepEP/HybridEP dispatch over the expert TP x EP group; the CPU backend moves the same tokens with "
        "the alltoall dispatcher's collectives). With expert_model_parallel_size 1 every type is the same "
        "local computation.");
    unsetWhenZero(r.f("moe_expert_capacity_factor", &C::moe_expert_capacity_factor, "--moe-expert-capacity-factor",
                      "model.moe_expert_capacity_factor",
                      "Expert capacity factor: each expert takes at most ceil(tokens*topk/experts * factor) token copies "
                      "of a microbatch, the rest are dropped; 0 = unset (dropless, Megatron's None)."));
    rules(r.b("moe_pad_expert_input_to_capacity", &C::moe_pad_expert_input_to_capacity,
              "--moe-pad-expert-input-to-capacity", "", "model.moe_pad_expert_input_to_capacity",
              "Pad every expert's input to exactly its capacity (with zero-prob tokens). On one rank the expert "
              "shapes are then static: the router waits for nothing, and cuda_graph_impl: full_iteration "
              "captures MoE layers."),
          "needs moe_expert_capacity_factor");
    r.e("moe_token_drop_policy", &C::moe_token_drop_policy, {"probs", "position"}, "--moe-token-drop-policy",
        "model.moe_token_drop_policy",
        "Which token copies an over-capacity expert keeps: the highest routing probs, or the first positions.");
    moeLayerFreqKnob(r.s("moe_layer_freq", &C::moe_layer_freq, "--moe-layer-freq", "model.moe_layer_freq",
                         "Which layers are MoE (the others keep the dense MLP): an integer f makes layer i MoE iff "
                         "i % f == 0; a list gives 0/1 per layer, written [1,0,1,0] or as Megatron's expression "
                         "\"([1]*3+[0]*1)*2\"."));
    r.i("moe_ffn_hidden_size", &C::moe_ffn_hidden_size, "--moe-ffn-hidden-size", "model.moe_ffn_hidden_size",
        "Expert MLP hidden size; 0 = ffn_hidden_size.");
    r.i("moe_shared_expert_intermediate_size", &C::moe_shared_expert_intermediate_size,
        "--moe-shared-expert-intermediate-size", "model.moe_shared_expert_intermediate_size",
        "Total hidden size of the shared experts (number of shared experts x each one's ffn size): a dense MLP of "
        "this ffn size beside the routed experts of every MoE layer, applied to every token and TP-sharded like "
        "the dense MLP, its output added to the routed experts'; 0 = no shared expert.");
    rules(r.b("moe_shared_expert_overlap", &C::moe_shared_expert_overlap, "--moe-shared-expert-overlap", "",
              "model.moe_shared_expert_overlap",
              "Overlap the shared experts' compute with the token dispatcher's communication: after the router "
              "they run on their own stream (parallel runs) from the dispatch on, beside the all-to-all and the routed "
              "experts (off: before the router, on the compute stream); the same numbers."),
          "requires moe_shared_expert_intermediate_size > 0 and moe_token_dispatcher_type alltoall");
    rules(r.b("moe_shared_expert_gate", &C::moe_shared_expert_gate, "--moe-shared-expert-gate", "",
              "model.moe_shared_expert_gate",
              "Gate the shared experts' output per token: output *= sigmoid(x w_gate), w_gate a [1, hidden] weight."),
          "only with moe_shared_expert_intermediate_size > 0");
    notInEngine(r.b("moe_permute_fusion", &C::moe_permute_fusion, "--moe-permute-fusion", "", "model.moe_permute_fusion",
                    "Fuse the token permutation of the dispatcher."));
    rules(r.add("moe_router_load_balancing_type", &C::moe_router_load_balancing_type, KnobType::EnumOrList,
                "--moe-router-load-balancing-type", "model.moe_router_load_balancing_type",
                "Router load-balancing strategy: aux_loss (Switch loss per microbatch), seq_aux_loss (per "
                "sequence), global_aux_loss (tokens per expert summed over tp-dp-cp and averaged over the step's "
                "microbatches), sinkhorn (S-BASE: the top-k of the sinkhorn-normalised logits), quantile_balancing "
                "(each token's top-k of the logits minus a per-expert bias qb_beta; qb_beta becomes, after every "
                "step, the mean over the step's microbatches and the dp-cp ranks of each expert's column "
                "quantile that would give it tokens*topk/experts tokens (logits gathered over tp-cp), blended by "
                "moe_router_quantile_balancing_ema and centred; saved in checkpoints) or none. A list of aux-loss "
                "types ([aux_loss, seq_aux_loss] with moe_aux_loss_coeff [1e-2, 1e-3]) runs each with its "
                "coefficient and sums their losses.",
                {"aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none"}),
          "a list holds only aux_loss, seq_aux_loss, global_aux_loss and none, each once; sinkhorn and "
          "quantile_balancing need moe_aux_loss_coeff 0; quantile_balancing: no group-limited routing, no "
          "capacity, micro_batch_size*seq_length*moe_router_topk divisible by num_moe_experts");
    r.f("moe_router_quantile_balancing_ema", &C::moe_router_quantile_balancing_ema,
        "--moe-router-quantile-balancing-ema", "model.moe_router_quantile_balancing_ema",
        "quantile_balancing: qb_beta = ema * qb_beta + (1 - ema) * the step's quantile, then centred; 0 = "
        "no memory (Megatron's default).");
    rules(r.e("moe_router_score_function", &C::moe_router_score_function, {"softmax", "sigmoid", "sqrtsoftplus"},
              "--moe-router-score-function", "model.moe_router_score_function",
              "Router score function: softmax, or sigmoid / sqrtsoftplus scores renormalised over the k chosen "
              "experts (DeepSeek-V3); the aux loss uses them renormalised over all experts."),
          "sigmoid or sqrtsoftplus with moe_router_enable_expert_bias");
    rules(r.b("moe_router_pre_softmax", &C::moe_router_pre_softmax, "--moe-router-pre-softmax", "",
              "model.moe_router_pre_softmax",
              "Softmax over all experts before the top-k (probs not renormalised over the k); off: top-k of "
              "the logits, then a softmax over the k chosen."),
          "needed with moe_router_topk 1 and the softmax score function (except sinkhorn)");
    unsetWhenZero(r.f("moe_router_topk_scaling_factor", &C::moe_router_topk_scaling_factor,
                      "--moe-router-topk-scaling-factor", "model.moe_router_topk_scaling_factor",
                      "Multiplies the routing probs of the chosen experts; 0 = unset (no scaling)."));
    rules(r.e("moe_router_dtype", &C::moe_router_dtype, {"", "fp32", "fp64"}, "--moe-router-dtype",
              "model.moe_router_dtype",
              "Precision of the router's logits and routing math; \"\" = unset (Megatron: the input's dtype). "
              "The engine computes the router in fp32 in every case; fp64 is refused."),
          "fp64 is not run by the engine");
    rules(r.i("moe_router_num_groups", &C::moe_router_num_groups, "--moe-router-num-groups",
              "model.moe_router_num_groups",
              "Group-limited routing: experts in this many equal groups (e.g. one per EP rank or node); each "
              "token picks moe_router_group_topk groups by the sum of their top topk/group_topk scores, then "
              "its top-k inside them; 0 = off."),
          "divides num_moe_experts; needed with moe_router_group_topk");
    rules(r.i("moe_router_group_topk", &C::moe_router_group_topk, "--moe-router-group-topk",
              "model.moe_router_group_topk", "Groups each token may route to (group-limited routing); 0 = off."),
          "<= moe_router_num_groups; moe_router_topk <= group_topk * experts per group");
    rules(r.b("moe_router_enable_expert_bias", &C::moe_router_enable_expert_bias, "--moe-router-enable-expert-bias",
              "", "model.moe_router_enable_expert_bias",
              "Aux-loss-free load balancing: a per-expert bias added to the scores for the top-k choice only, "
              "moved by moe_router_bias_update_rate * sign(mean - count) after every step from the tokens per "
              "expert summed over tp-dp-cp; saved in checkpoints."),
          "needs moe_router_score_function sigmoid or sqrtsoftplus");
    r.f("moe_router_bias_update_rate", &C::moe_router_bias_update_rate, "--moe-router-bias-update-rate",
        "model.moe_router_bias_update_rate", "Step of the expert bias update per iteration (DeepSeek-V3: 1e-3).");

    r.group = "misc";
    engineRuns(rules(r.e("cuda_graph_impl", &C::cuda_graph_impl, {"none", "local", "transformer_engine", "full_iteration"},
                         "--cuda-graph-impl", "model.cuda_graph_impl",
                         "CUDA graph capture: none, Megatron-Core's per-layer graphs (local), Transformer Engine's, or "
                         "the whole iteration (replaces the deprecated enable_cuda_graph). The engine's full_iteration "
                         "captures the forward and backward of all microbatches after cuda_graph_warmup_steps eager "
                         "steps, on one device, dropout and FP8 included; MoE layers need "
                         "moe_pad_expert_input_to_capacity (docs/engine.md, \"CUDA graphs\")."),
                     "not none only with device_backend=cuda"),
               {"none", "full_iteration"});
    r.i("cuda_graph_warmup_steps", &C::cuda_graph_warmup_steps, "--cuda-graph-warmup-steps",
        "model.cuda_graph_warmup_steps",
        "Eager steps before the CUDA graph is captured (library handles, tables and caches are made outside the "
        "graph); counted again after a checkpoint load.");
    notInEngine(r.b("defer_embedding_wgrad_compute", &C::defer_embedding_wgrad_compute,
                    "--defer-embedding-wgrad-compute", "", "comm_overlap.defer_embedding_wgrad_compute",
                    "Defer the output-embedding weight-gradient GEMMs into the pipeline flush."));
    notInEngine(rules(r.b("cpu_offloading", &C::cpu_offloading, "", "", "model.cpu_offloading",
                          "Offload activations to host memory (Megatron-LM turns it on when cpu_offloading_num_layers > 0)."),
                      "needs cpu_offloading_num_layers > 0"));
    notInEngine(r.i("cpu_offloading_num_layers", &C::cpu_offloading_num_layers, "--cpu-offloading-num-layers",
                    "model.cpu_offloading_num_layers", "Layers whose activations are offloaded."));
    notInEngine(r.b("account_for_embedding_in_pipeline_split", &C::account_for_embedding_in_pipeline_split,
                    "--account-for-embedding-in-pipeline-split", "", "model.account_for_embedding_in_pipeline_split",
                    "Count the embedding as a layer when splitting layers over pipeline stages."));
    notInEngine(r.b("account_for_loss_in_pipeline_split", &C::account_for_loss_in_pipeline_split,
                    "--account-for-loss-in-pipeline-split", "", "model.account_for_loss_in_pipeline_split",
                    "Count the loss as a layer when splitting layers over pipeline stages."));

    r.group = "run";
    r.i("train_iters", &C::train_iters, "--train-iters", "train.train_iters", "Training iterations (steps) to run.");
    r.i("seed", &C::seed, "--seed", "rng.seed", "Random seed (init, data order, dropout).");
    r.f("lr", &C::lr, "--lr", "optimizer.lr", "Peak learning rate.");
    r.f("min_lr", &C::min_lr, "--min-lr", "optimizer.min_lr", "Minimum learning rate at the end of decay.");
    r.e("lr_decay_style", &C::lr_decay_style, {"linear", "constant", "cosine"}, "--lr-decay-style",
        "scheduler.lr_decay_style", "Learning rate decay.");
    r.i("lr_warmup_iters", &C::lr_warmup_iters, "--lr-warmup-iters", "scheduler.lr_warmup_iters", "Linear warmup iterations.");
    r.f("weight_decay", &C::weight_decay, "--weight-decay", "optimizer.weight_decay", "AdamW decoupled weight decay.");
    r.f("clip_grad", &C::clip_grad, "--clip-grad", "optimizer.clip_grad", "Clip gradients to this global L2 norm; 0 = off.");
    r.f("adam_beta1", &C::adam_beta1, "--adam-beta1", "optimizer.adam_beta1", "Adam beta1.");
    r.f("adam_beta2", &C::adam_beta2, "--adam-beta2", "optimizer.adam_beta2", "Adam beta2.");
    r.f("adam_eps", &C::adam_eps, "--adam-eps", "optimizer.adam_eps", "Adam epsilon.");
    r.s("data_path", &C::data_path, "--data-path", "dataset.blend",
        "\"\" = the shipped text corpus, \"synthetic\" = random tokens, or a Megatron .bin/.idx prefix.");
    r.e("tokenizer_type", &C::tokenizer_type, {"byte", "bpe"}, "", "", "Tokenizer for the text corpus.");
    r.e("device_backend", &C::device_backend, {"cpu", "cuda"}, "", "",
        "Device backend that runs the ranks. cuda: one rank trains on GPU 0 (checked against the CPU backend on "
        "an H200); layouts over several GPUs (one rank per GPU, NCCL between them; mpirun: one process per GPU) "
        "have not yet run on a machine with several, so a run refuses them unless TS_CUDA_UNVERIFIED=1. "
        "cuda_share_gpus runs a layout's ranks on fewer GPUs to check its results.");
    rules(r.b("cuda_share_gpus", &C::cuda_share_gpus, "", "", "",
              "device_backend: cuda: the ranks share the visible GPUs (rank i on GPU i % count, each with its own "
              "memory accounting and streams) and their collectives go through host memory instead of NCCL, so a "
              "layout's results (losses, weights, memory) can be checked on fewer GPUs than ranks, down to one. Its "
              "step times and communication are not the layout's; analyze says so. Not a Megatron-LM option."),
          "needs device_backend=cuda");
    r.i("cpu_threads", &C::cpu_threads, "", "", "GEMM threads per rank on the CPU backend; 0 = cores / ranks.");
    r.i("log_interval", &C::log_interval, "--log-interval", "logger.log_interval", "Steps between progress lines.");
    r.s("save", &C::save, "--save", "checkpoint.save", "Checkpoint directory to save to; \"\" = no checkpoints.");
    r.s("load", &C::load, "--load", "checkpoint.load", "Checkpoint directory to resume from.");
    r.i("save_interval", &C::save_interval, "--save-interval", "checkpoint.save_interval", "Steps between checkpoints; 0 = only at the end.");
    r.b("profile", &C::profile, "", "", "", "Record the full trace into the run file.");
    r.s("name", &C::name, "", "", "Run name shown in the runs list.");
    return r.knobs;
}

size_t editDistance(std::string_view a, std::string_view b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::string jsonToText(const json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_array()) {
        std::string out = "[";
        for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + jsonToText(v[i]);
        return out + "]";
    }
    if (v.is_number_float()) {
        std::string s = v.dump();
        return s;
    }
    return v.dump();
}

}  // namespace

const std::vector<KnobDef>& knobRegistry() {
    static const std::vector<KnobDef> kKnobs = buildRegistry();
    return kKnobs;
}

const KnobDef* findKnob(std::string_view name) {
    for (const auto& k : knobRegistry())
        if (k.name == name) return &k;
    return nullptr;
}

std::vector<std::string> suggestKnobs(std::string_view unknown, size_t maxSuggestions) {
    // Accept the Megatron flag spelling too ("--overlap-grad-reduce" / "overlap-grad-reduce").
    std::string key(unknown);
    while (!key.empty() && key[0] == '-') key.erase(0, 1);
    std::replace(key.begin(), key.end(), '-', '_');
    std::vector<std::pair<size_t, std::string>> scored;
    for (const auto& k : knobRegistry()) {
        size_t d = editDistance(key, k.name);
        std::string flag = k.megatronFlag;
        while (!flag.empty() && flag[0] == '-') flag.erase(0, 1);
        std::replace(flag.begin(), flag.end(), '-', '_');
        if (!flag.empty()) d = std::min(d, editDistance(key, flag));
        if (!key.empty() && k.name.find(key) != std::string::npos) d = std::min<size_t>(d, 2);
        scored.emplace_back(d, k.name);
    }
    std::stable_sort(scored.begin(), scored.end(), [](auto& a, auto& b) { return a.first < b.first; });
    const size_t limit = std::max<size_t>(3, key.size() / 3);
    std::vector<std::string> out;
    for (auto& [d, n] : scored) {
        if (d > limit || out.size() >= maxSuggestions) break;
        out.push_back(n);
    }
    return out;
}

std::string knobDefaultText(const KnobDef& k) { return jsonToText(k.get(Config{})); }
std::string knobValueText(const KnobDef& k, const Config& c) { return jsonToText(k.get(c)); }

namespace {
// Whether the engine executes knob k at value v (its text).
bool engineRunsValue(const KnobDef& k, const std::string& v) {
    return k.engineSupported &&
           (k.engineValues.empty() || std::find(k.engineValues.begin(), k.engineValues.end(), v) != k.engineValues.end());
}
}  // namespace

std::vector<std::string> unsupportedKnobs(const Config& c) {
    std::vector<std::string> out;
    const Config defaults;
    for (const auto& k : knobRegistry()) {
        if (k.get(c) == k.get(defaults)) continue;
        const std::string v = knobValueText(k, c);
        if (!engineRunsValue(k, v)) out.push_back(k.name + "=" + v);
    }
    return out;
}

std::string knobNotExecutedText(const KnobDef& k) {
    if (!k.engineSupported) return "not executed yet";
    std::string rest;
    for (const auto& a : k.allowed)
        if (!engineRunsValue(k, a)) rest += (rest.empty() ? "" : ", ") + a;
    return rest.empty() ? "" : "not executed yet: " + rest;
}

json configToJson(const Config& c) {
    json j = json::object();
    for (const auto& k : knobRegistry()) j[k.name] = k.get(c);
    return j;
}

Result<Config> configFromJson(const json& j) {
    if (!j.is_object()) return Status::invalid("config JSON must be an object of knob: value");
    Config c;
    std::string problems;
    for (auto it = j.begin(); it != j.end(); ++it) {
        const KnobDef* k = findKnob(it.key());
        if (!k && it.key() == "enable_cuda_graph") {
            // Run files written before cuda_graph_impl replaced it (Megatron deprecated the flag).
            if (it.value() == json(true)) c.cuda_graph_impl = "local";
            continue;
        }
        if (!k) {
            problems += (problems.empty() ? "" : "; ") + ("unknown knob '" + it.key() + "'");
            continue;
        }
        std::string err = k->set(c, it.value());
        if (!err.empty()) problems += (problems.empty() ? "" : "; ") + (it.key() + ": " + err);
    }
    if (!problems.empty()) return Status::invalid(problems);
    return c;
}

}  // namespace ts::engine
