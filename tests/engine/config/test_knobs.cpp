// Knob registry: every knob the issue lists exists with its Megatron flag, typed access works,
// YAML parsing reports one message per problem with file and line, rules fire, round trips hold.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/config/knobs.h"

namespace ts::engine {
namespace {

bool hasIssue(const std::vector<ConfigIssue>& issues, const std::string& knob, const std::string& text) {
    for (const auto& i : issues)
        if (i.knob == knob && i.message.find(text) != std::string::npos) return true;
    return false;
}

TEST(Knobs, EveryRequiredKnobIsDeclaredOnce) {
    const char* required[] = {
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
        "context_parallel_size", "cp_comm_type", "expert_model_parallel_size", "expert_tensor_parallel_size",
        "sequence_parallel", "num_microbatches", "global_batch_size", "micro_batch_size", "overlap_grad_reduce",
        "overlap_param_gather", "use_distributed_optimizer", "bucket_size", "average_in_collective",
        "grad_reduce_in_fp32", "tp_comm_overlap", "overlap_p2p_comm", "batch_p2p_comm", "masked_softmax_fusion",
        "bias_activation_fusion", "bias_dropout_fusion", "apply_rope_fusion", "cross_entropy_loss_fusion",
        "gradient_accumulation_fusion", "persist_layer_norm", "fp8", "fp8_recipe", "fp8_amax_history_len",
        "fp8_amax_compute_algo", "fp8_margin", "bf16", "recompute_granularity", "recompute_method",
        "recompute_num_layers", "recompute_modules", "moe_router_topk", "moe_aux_loss_coeff", "moe_z_loss_coeff",
        "moe_grouped_gemm", "moe_token_dispatcher_type", "moe_expert_capacity_factor", "cuda_graph_impl",
        "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "num_layers",
        "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "seq_length", "vocab_size",
        "normalization", "swiglu", "position_embedding_type", "untie_embeddings_and_output_weights",
        "num_moe_experts", "world_size", "data_parallel_size", "train_iters", "seed", "lr", "weight_decay",
        "clip_grad", "adam_beta1", "adam_beta2", "data_path", "device_backend"};
    for (const char* name : required) {
        const KnobDef* k = findKnob(name);
        ASSERT_NE(k, nullptr) << name;
        EXPECT_FALSE(k->help.empty()) << name;
        EXPECT_FALSE(k->group.empty()) << name;
    }
    std::set<std::string> names;
    for (const auto& k : knobRegistry()) EXPECT_TRUE(names.insert(k.name).second) << "duplicate " << k.name;
}

TEST(Knobs, MegatronFlagsUseMegatronSpelling) {
    EXPECT_EQ(findKnob("tensor_model_parallel_size")->megatronFlag, "--tensor-model-parallel-size");
    EXPECT_EQ(findKnob("overlap_grad_reduce")->megatronFlag, "--overlap-grad-reduce");
    EXPECT_EQ(findKnob("masked_softmax_fusion")->megatronFalseFlag, "--no-masked-softmax-fusion");
    EXPECT_EQ(findKnob("bucket_size")->megatronFlag, "--ddp-bucket-size");
    EXPECT_EQ(findKnob("fp8")->megatronFlag, "--fp8-format");
    for (const auto& k : knobRegistry()) {
        for (const std::string& f : {k.megatronFlag, k.megatronFalseFlag}) {
            if (f.empty()) continue;
            EXPECT_EQ(f.rfind("--", 0), 0u) << k.name;
            EXPECT_EQ(f.find('_'), std::string::npos) << k.name << " flag " << f;
        }
    }
}

TEST(Knobs, TypedSetRejectsWrongTypes) {
    Config c;
    const KnobDef* tp = findKnob("tensor_model_parallel_size");
    EXPECT_EQ(tp->set(c, nlohmann::json(4)), "");
    EXPECT_EQ(c.tensor_model_parallel_size, 4);
    EXPECT_NE(tp->set(c, nlohmann::json("four")), "");
    EXPECT_NE(tp->set(c, nlohmann::json(2.5)), "");
    const KnobDef* norm = findKnob("normalization");
    EXPECT_NE(norm->set(c, nlohmann::json("BatchNorm")), "");
    EXPECT_EQ(norm->set(c, nlohmann::json("RMSNorm")), "");
    EXPECT_EQ(c.normalization, "RMSNorm");
}

TEST(Knobs, SuggestsNearestKnob) {
    auto s = suggestKnobs("overlap_grad_reduse");
    ASSERT_FALSE(s.empty());
    EXPECT_EQ(s[0], "overlap_grad_reduce");
    s = suggestKnobs("--tensor-model-parallel-size");
    ASSERT_FALSE(s.empty());
    EXPECT_EQ(s[0], "tensor_model_parallel_size");
}

TEST(ConfigYaml, ParsesFlatAndSectionedMappings) {
    auto a = parseConfigYaml("num_layers: 8\nhidden_size: 512\nnum_attention_heads: 8\nbf16: true\nlr: 1.0e-4\n");
    ASSERT_TRUE(a.ok()) << issuesToStatus(a.issues).toString();
    EXPECT_EQ(a.config.num_layers, 8);
    EXPECT_EQ(a.config.hidden_size, 512);
    EXPECT_TRUE(a.config.bf16);
    EXPECT_DOUBLE_EQ(a.config.lr, 1e-4);
    auto b = parseConfigYaml("model:\n  num_layers: 6\nparallel:\n  tensor_model_parallel_size: 2\n");
    ASSERT_TRUE(b.ok()) << issuesToStatus(b.issues).toString();
    EXPECT_EQ(b.config.num_layers, 6);
    EXPECT_EQ(b.config.tensor_model_parallel_size, 2);
}

TEST(ConfigYaml, OneMessagePerProblemWithLines) {
    auto r = parseConfigYaml("num_layers: four\nsequence_parral: true\nnormalization: BatchNorm\n", "x.yaml");
    ASSERT_EQ(r.issues.size(), 3u);
    EXPECT_EQ(r.issues[0].line, 1);
    EXPECT_EQ(r.issues[0].knob, "num_layers");
    EXPECT_EQ(r.issues[1].line, 2);
    EXPECT_NE(r.issues[1].message.find("did you mean 'sequence_parallel'"), std::string::npos);
    EXPECT_EQ(r.issues[2].line, 3);
    EXPECT_NE(r.issues[2].toString().find("x.yaml:3: normalization:"), std::string::npos);
}

TEST(ConfigYaml, SyntaxErrorsAndDuplicates) {
    auto r = parseConfigYaml("num_layers: 4\n  hidden_size: [256\n", "s.yaml");
    ASSERT_EQ(r.issues.size(), 1u);
    EXPECT_NE(r.issues[0].message.find("YAML"), std::string::npos);
    auto d = parseConfigYaml("num_layers: 4\nnum_layers: 6\n");
    EXPECT_FALSE(d.ok());
    auto list = parseConfigYaml("- a\n- b\n");
    EXPECT_FALSE(list.ok());
}

TEST(ConfigRules, LayoutRules) {
    Config c;
    c.num_attention_heads = 8;
    c.tensor_model_parallel_size = 3;
    auto issues = validateConfig(c);
    EXPECT_TRUE(hasIssue(issues, "tensor_model_parallel_size", "does not divide num_attention_heads=8"));

    Config w;
    w.tensor_model_parallel_size = 2;
    w.pipeline_model_parallel_size = 2;
    w.world_size = 6;
    EXPECT_TRUE(hasIssue(validateConfig(w), "world_size", "not a multiple of tp*cp*pp"));

    Config i;
    i.num_layers = 8;
    i.pipeline_model_parallel_size = 4;
    i.virtual_pipeline_model_parallel_size = 2;
    i.num_microbatches = 6;
    EXPECT_TRUE(hasIssue(validateConfig(i), "num_microbatches", "% pipeline_model_parallel_size"));
    i.num_microbatches = 8;
    EXPECT_TRUE(validateConfig(i).empty());

    Config p2;
    p2.pipeline_model_parallel_size = 2;
    p2.virtual_pipeline_model_parallel_size = 2;
    p2.num_microbatches = 4;
    p2.overlap_p2p_comm = false;
    EXPECT_TRUE(hasIssue(validateConfig(p2), "virtual_pipeline_model_parallel_size", "overlap_p2p_comm"));
    p2.overlap_p2p_comm = true;
    p2.batch_p2p_comm = false;
    EXPECT_TRUE(validateConfig(p2).empty());
}

TEST(ConfigRules, RequiresAndExcludes) {
    Config c;
    c.overlap_param_gather = true;
    auto issues = validateConfig(c);
    EXPECT_TRUE(hasIssue(issues, "overlap_param_gather", "use_distributed_optimizer"));
    EXPECT_TRUE(hasIssue(issues, "overlap_param_gather", "overlap_grad_reduce"));
    c.use_distributed_optimizer = c.overlap_grad_reduce = true;
    EXPECT_TRUE(validateConfig(c).empty());

    Config sp;
    sp.sequence_parallel = true;
    EXPECT_TRUE(hasIssue(validateConfig(sp), "sequence_parallel", "tensor_model_parallel_size > 1"));

    // As in Megatron-LM, overlap_p2p_comm (default on) acts only with interleaving and
    // batch_p2p_comm only where overlap is not in effect: the defaults together are valid.
    Config ob;
    EXPECT_TRUE(ob.overlap_p2p_comm && ob.batch_p2p_comm);
    EXPECT_TRUE(validateConfig(ob).empty());

    Config pg;
    pg.overlap_param_gather_with_optimizer_step = true;
    EXPECT_TRUE(hasIssue(validateConfig(pg), "overlap_param_gather_with_optimizer_step", "overlap_param_gather"));
    Config pa;
    pa.exp_avg_dtype = "bf16";
    EXPECT_TRUE(hasIssue(validateConfig(pa), "exp_avg_dtype", "use_precision_aware_optimizer"));
    pa.use_precision_aware_optimizer = true;
    EXPECT_TRUE(validateConfig(pa).empty());
    Config cg;
    cg.cuda_graph_impl = "local";
    EXPECT_TRUE(hasIssue(validateConfig(cg), "cuda_graph_impl", "device_backend"));
    Config off;
    off.cpu_offloading = true;
    EXPECT_TRUE(hasIssue(validateConfig(off), "cpu_offloading", "cpu_offloading_num_layers"));
    off.cpu_offloading_num_layers = 2;
    EXPECT_TRUE(validateConfig(off).empty());
    off.pipeline_model_parallel_size = 2;
    EXPECT_TRUE(hasIssue(validateConfig(off), "cpu_offloading", "pipeline parallelism"));
    Config sh;
    sh.num_moe_experts = 4;
    sh.moe_shared_expert_intermediate_size = 256;
    sh.moe_shared_expert_overlap = true;
    EXPECT_TRUE(hasIssue(validateConfig(sh), "moe_shared_expert_overlap", "alltoall"));  // default allgather
    sh.moe_token_dispatcher_type = "alltoall";
    // Megatron's SharedExpertMLP asserts add_bias_linear=False (true by default).
    EXPECT_TRUE(hasIssue(validateConfig(sh), "add_bias_linear", "shared experts"));
    sh.add_bias_linear = false;
    EXPECT_TRUE(validateConfig(sh).empty());
    Config rb;
    rb.rotary_base = 10000.5;
    EXPECT_TRUE(hasIssue(validateConfig(rb), "rotary_base", "integer"));

    Config rc;
    rc.recompute_granularity = "full";
    EXPECT_TRUE(hasIssue(validateConfig(rc), "recompute_method", "uniform or block"));
    EXPECT_TRUE(hasIssue(validateConfig(rc), "recompute_num_layers", "> 0"));

    Config f8;
    f8.fp8 = "hybrid";
    EXPECT_TRUE(hasIssue(validateConfig(f8), "fp8", "bf16"));
}

TEST(ConfigRules, DerivedSizes) {
    Config c;
    c.tensor_model_parallel_size = 2;
    c.pipeline_model_parallel_size = 2;
    c.world_size = 8;
    c.micro_batch_size = 2;
    c.global_batch_size = 16;
    c.vocab_size = 50257;
    auto d = deriveSizes(c);
    EXPECT_EQ(d.dp, 2);
    EXPECT_EQ(d.num_microbatches, 4);
    EXPECT_EQ(d.padded_vocab_size, 50432);  // multiple of 128*2 = 256 (GPT-2's 50257 -> 50432 at tp 2)
    EXPECT_EQ(d.ffn_hidden_size, 4 * c.hidden_size);
}

TEST(ConfigRules, SwigluFfnSizeIsDerivedAsMegatronDoes) {
    // megatron/training/arguments.py: ffn_hidden_size = int((4 * h * 2 / 3) / 64) * 64 with swiglu.
    Config c;
    c.swiglu = true;
    c.hidden_size = 256;
    EXPECT_EQ(deriveSizes(c).ffn_hidden_size, 640);  // 682.67 -> 10 * 64
    c.hidden_size = 4096;
    EXPECT_EQ(deriveSizes(c).ffn_hidden_size, 10880);
    c.ffn_hidden_size = 11008;  // an explicit size wins
    EXPECT_EQ(deriveSizes(c).ffn_hidden_size, 11008);
    c.ffn_hidden_size = 0;
    c.swiglu = false;
    EXPECT_EQ(deriveSizes(c).ffn_hidden_size, 4 * 4096);
    // Small hidden sizes derive 0, as upstream would; validation says so.
    Config tiny;
    tiny.swiglu = true;
    tiny.hidden_size = 16;
    tiny.num_attention_heads = 2;
    EXPECT_TRUE(hasIssue(validateConfig(tiny), "ffn_hidden_size", "set ffn_hidden_size"));
}

TEST(Knobs, DefaultsAreMegatronLMs) {
    // The nine defaults issue #14 found different from Megatron-LM's (arguments.py and the
    // config dataclasses at the commit in resources/megatron/megatron_lm_args.tsv).
    Config c;
    EXPECT_EQ(c.position_embedding_type, "learned_absolute");
    EXPECT_DOUBLE_EQ(c.hidden_dropout, 0.1);
    EXPECT_DOUBLE_EQ(c.attention_dropout, 0.1);
    EXPECT_TRUE(c.overlap_p2p_comm);
    EXPECT_FALSE(c.cross_entropy_loss_fusion);
    EXPECT_EQ(c.moe_token_dispatcher_type, "allgather");
    EXPECT_EQ(c.lr_decay_style, "linear");
    EXPECT_DOUBLE_EQ(c.adam_beta2, 0.999);
    EXPECT_EQ(c.log_interval, 100);
    EXPECT_EQ(knobDefaultText(*findKnob("position_embedding_type")), "learned_absolute");
}

TEST(ConfigYaml, YamlRoundTripIsExact) {
    Config c;
    c.num_layers = 6;
    c.lr = 3.3e-4;
    c.adam_eps = 1e-8;
    c.init_method_std = 0.0125;
    c.fp8 = "hybrid";
    c.bf16 = true;
    c.recompute_modules = {"core_attn", "mlp"};
    c.data_path = "/data/my corpus: v2";
    for (bool onlyNonDefault : {false, true}) {
        auto back = parseConfigYaml(configToYaml(c, onlyNonDefault));
        ASSERT_TRUE(back.ok()) << issuesToStatus(back.issues).toString() << "\n" << configToYaml(c, onlyNonDefault);
        EXPECT_EQ(configToJson(back.config), configToJson(c));
    }
    auto viaJson = configFromJson(configToJson(c));
    ASSERT_TRUE(viaJson.isOk());
    EXPECT_EQ(configToJson(*viaJson), configToJson(c));
}

// moe_layer_freq is Megatron's moe_freq_type: an integer, a list, or a Python list expression.
TEST(Knobs, MoeLayerFreqTakesAnIntegerAListOrMegatronsExpression) {
    std::string err;
    EXPECT_EQ(moeLayerPattern("2", 4, &err), (std::vector<int>{1, 0, 1, 0}));
    EXPECT_EQ(moeLayerPattern("3", 5, &err), (std::vector<int>{1, 0, 0, 1, 0}));
    EXPECT_EQ(moeLayerPattern("[0,1,1,0]", 4, &err), (std::vector<int>{0, 1, 1, 0}));
    EXPECT_EQ(moeLayerPattern(" ([1]*3 + [0]*1)*2 ", 8, &err), (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 0}));
    EXPECT_EQ(moeLayerPattern("[0]+2*[1,0]+[1]", 6, &err), (std::vector<int>{0, 1, 0, 1, 0, 1}));
    for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
             {"0", "at least 1"},
             {"[1,2,0,1]", "only 0 (dense) and 1"},
             {"[1,0]", "one per layer (num_layers=4)"},
             {"([1]*3", "expected ')'"},
             {"[1]*[2]", "'*' of two lists"},
             {"[1,0]+1", "joins a list and an integer"},
             {"[[1],0,1,0]", "a list inside a list"},
             {"every other", "is not an integer or a list expression"},
             {"", "empty"},
             {"[1]*99999999", "too large"}}) {
        err.clear();
        EXPECT_TRUE(moeLayerPattern(text, 4, &err).empty()) << text;
        EXPECT_NE(err.find(why), std::string::npos) << text << ": " << err;
    }
    // YAML takes the integer, the list and the expression; the integer reads back as a number.
    auto y = parseConfigYaml("num_layers: 4\nnum_moe_experts: 4\nmoe_layer_freq: [0, 1, 1, 0]\n");
    ASSERT_TRUE(y.ok()) << issuesToStatus(y.issues).toString();
    EXPECT_EQ(y.config.moe_layer_freq, "[0,1,1,0]");
    EXPECT_EQ(moeLayerPattern(y.config), (std::vector<int>{0, 1, 1, 0}));
    y = parseConfigYaml("num_layers: 4\nnum_moe_experts: 4\nmoe_layer_freq: 2\n");
    ASSERT_TRUE(y.ok());
    EXPECT_EQ(findKnob("moe_layer_freq")->get(y.config), nlohmann::json(2));
    y = parseConfigYaml("num_layers: 8\nnum_moe_experts: 4\nmoe_layer_freq: \"([1]*3+[0]*1)*2\"\n");
    ASSERT_TRUE(y.ok()) << issuesToStatus(y.issues).toString();
    auto back = parseConfigYaml(configToYaml(y.config, true));
    ASSERT_TRUE(back.ok()) << configToYaml(y.config, true);
    EXPECT_EQ(back.config.moe_layer_freq, "([1]*3+[0]*1)*2");
    // A bad value is an issue on its line; a list of the wrong length is caught by validation.
    y = parseConfigYaml("num_moe_experts: 4\nmoe_layer_freq: [1, 2]\n");
    EXPECT_TRUE(hasIssue(y.issues, "moe_layer_freq", "only 0 (dense) and 1"));
    y = parseConfigYaml("num_layers: 4\nnum_moe_experts: 4\nmoe_layer_freq: [1, 0]\n");
    EXPECT_TRUE(hasIssue(y.issues, "moe_layer_freq", "one per layer"));
    y = parseConfigYaml("num_layers: 4\nnum_moe_experts: 4\nmoe_layer_freq: [0, 0, 0, 0]\n");
    EXPECT_TRUE(hasIssue(y.issues, "moe_layer_freq", "makes no layer MoE"));
    Config c;
    EXPECT_TRUE(applyOverride(c, "moe_layer_freq=[1,0,1,0]").isOk());
    EXPECT_EQ(c.moe_layer_freq, "[1,0,1,0]");
    // Stored without blanks (Megatron's pattern check refuses them) and without the quotes a
    // launch script may pass through.
    EXPECT_EQ(findKnob("moe_layer_freq")->set(c, nlohmann::json("'([1]*2 + [0]*2)'")), "");
    EXPECT_EQ(c.moe_layer_freq, "([1]*2+[0]*2)");
}

TEST(ConfigYaml, Overrides) {
    Config c;
    EXPECT_TRUE(applyOverride(c, "tensor_model_parallel_size=2").isOk());
    EXPECT_EQ(c.tensor_model_parallel_size, 2);
    EXPECT_TRUE(applyOverride(c, "bf16=true").isOk());
    EXPECT_TRUE(c.bf16);
    EXPECT_FALSE(applyOverride(c, "tensor_model_paralel_size=2").isOk());
    EXPECT_FALSE(applyOverride(c, "bf16").isOk());
    EXPECT_FALSE(applyOverride(c, "num_layers=x").isOk());
}

TEST(ConfigYaml, ShippedExamplesValidateAndBrokenOnesDoNot) {
    const std::string root = TS_SOURCE_DIR;
    for (const char* f : {"tp2_sp", "pp2_1f1b", "pp4_interleaved", "dp2_overlap", "dp2_distopt", "llama_style",
                          "bf16_recompute", "world8_3d"}) {
        auto r = loadConfigFile(root + "/resources/examples/" + f + ".yaml");
        EXPECT_TRUE(r.ok()) << f << ": " << issuesToStatus(r.issues).toString();
    }
    for (const char* f : {"bad_tp_heads", "bad_unknown_key", "bad_types", "bad_interleave", "bad_param_gather",
                          "bad_world", "bad_syntax"}) {
        auto r = loadConfigFile(root + "/tests/data/configs/" + std::string(f) + ".yaml");
        EXPECT_FALSE(r.ok()) << f;
        for (const auto& i : r.issues) EXPECT_NE(i.file.find(f), std::string::npos);
    }
    auto missing = loadConfigFile(root + "/does/not/exist.yaml");
    ASSERT_EQ(missing.issues.size(), 1u);
    EXPECT_NE(missing.issues[0].message.find("cannot open"), std::string::npos);
}

TEST(Knobs, UnsupportedKnobsAreReported) {
    Config c;
    // Megatron-LM's defaults (learned_absolute position embedding included) all run.
    EXPECT_TRUE(unsupportedKnobs(c).empty());
    c.position_embedding_type = "rope";
    EXPECT_TRUE(unsupportedKnobs(c).empty());
    c.position_embedding_type = "none";
    EXPECT_TRUE(unsupportedKnobs(c).empty());
    c.context_parallel_size = 2;  // executed now (issue #16)
    EXPECT_TRUE(unsupportedKnobs(c).empty());
    c.expert_model_parallel_size = 2;  // executed now (issue #16)
    EXPECT_TRUE(unsupportedKnobs(c).empty());
    c.moe_expert_capacity_factor = 1.5;  // executed now (issue #16)
    EXPECT_TRUE(unsupportedKnobs(c).empty());
    c.moe_shared_expert_intermediate_size = 64;  // executed now, with its gate and overlap
    c.moe_shared_expert_gate = true;
    c.moe_shared_expert_overlap = true;
    EXPECT_TRUE(unsupportedKnobs(c).empty());
    c.cuda_graph_impl = "full_iteration";  // executed (single device); local and TE's per-layer graphs not yet
    EXPECT_TRUE(unsupportedKnobs(c).empty());
    c.moe_permute_fusion = true;
    auto u = unsupportedKnobs(c);
    ASSERT_EQ(u.size(), 1u);
    EXPECT_EQ(u[0], "moe_permute_fusion=true");
    c.cuda_graph_impl = "local";
    u = unsupportedKnobs(c);
    ASSERT_EQ(u.size(), 2u);
    EXPECT_EQ(u[0], "moe_permute_fusion=true");
    EXPECT_EQ(u[1], "cuda_graph_impl=local");
    const KnobDef* cg = findKnob("cuda_graph_impl");
    ASSERT_NE(cg, nullptr);
    EXPECT_EQ(knobNotExecutedText(*cg), "not executed yet: local, transformer_engine");
    EXPECT_EQ(knobNotExecutedText(*findKnob("moe_permute_fusion")), "not executed yet");
    EXPECT_EQ(knobNotExecutedText(*findKnob("tensor_model_parallel_size")), "");
}

}  // namespace
}  // namespace ts::engine

namespace ts::engine {
namespace {
TEST(Knobs, DocsAreGeneratedFromTheRegistry) {
    std::ifstream in(std::string(TS_SOURCE_DIR) + "/docs/knobs.md");
    ASSERT_TRUE(in.good()) << "docs/knobs.md missing: run `trainscope knobs --markdown > docs/knobs.md`";
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, knobsMarkdown()) << "docs/knobs.md is stale: run `trainscope knobs --markdown > docs/knobs.md`";
}
}  // namespace
}  // namespace ts::engine

namespace ts::engine {
namespace {

// masked_softmax_fusion=false does nothing under flash attention (the default): warned, naming
// the backend that would run it; not warned where it applies.
TEST(Knobs, UnfusedSoftmaxUnderFlashAttentionIsWarned) {
    Config c;
    EXPECT_TRUE(configWarnings(c).empty());
    c.masked_softmax_fusion = false;
    ASSERT_EQ(configWarnings(c).size(), 1u);
    EXPECT_NE(configWarnings(c)[0].find("attention_backend: unfused"), std::string::npos) << configWarnings(c)[0];
    for (const char* kept : {"unfused", "local"}) {
        c.attention_backend = kept;
        EXPECT_TRUE(configWarnings(c).empty()) << kept;
    }
}

// configWarnings (printed by `trainscope validate`): where the layout makes FP8 scales or blocks
// differ from the single device's, and nothing where they are the single device's.
TEST(Knobs, Fp8LayoutDependenceIsWarned) {
    Config c;
    c.bf16 = true;
    c.fp8 = "e4m3";
    c.seq_length = 16;
    c.micro_batch_size = 2;
    c.num_attention_heads = 4;
    c.hidden_size = 64;
    c.fp8_recipe = "mxfp8";
    ASSERT_TRUE(validateConfig(c).empty()) << validateConfig(c)[0].toString();
    EXPECT_TRUE(configWarnings(c).empty());
    c.context_parallel_size = 2;  // chunks of 16 / 4 x 2 = 8 rows: not whole 32-blocks
    ASSERT_EQ(configWarnings(c).size(), 1u);
    EXPECT_NE(configWarnings(c)[0].find("= 8 rows"), std::string::npos) << configWarnings(c)[0];
    c.micro_batch_size = 8;  // 32 rows: whole blocks
    EXPECT_TRUE(configWarnings(c).empty());
    c.fp8_recipe = "blockwise";  // 128-row blocks
    EXPECT_EQ(configWarnings(c).size(), 1u);
    c.fp8_recipe = "tensorwise";  // dense layers: the single device's scales on every layout
    EXPECT_TRUE(configWarnings(c).empty());
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.add_bias_linear = false;
    ASSERT_TRUE(validateConfig(c).empty()) << validateConfig(c)[0].toString();
    ASSERT_EQ(configWarnings(c).size(), 1u) << "experts on a CP rank's chunks";
    EXPECT_NE(configWarnings(c)[0].find("this rank's share"), std::string::npos) << configWarnings(c)[0];
    c.expert_model_parallel_size = 2;  // the ep group is the CP group: one microbatch's rows
    EXPECT_TRUE(configWarnings(c).empty());
    c.fp8_recipe = "delayed";
    c.expert_model_parallel_size = 1;
    EXPECT_TRUE(configWarnings(c).empty());
    c.fp8 = "";
    c.fp8_recipe = "tensorwise";
    EXPECT_TRUE(configWarnings(c).empty());
}

}  // namespace
}  // namespace ts::engine
