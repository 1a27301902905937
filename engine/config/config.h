// Config: every tunable of a run, one field per knob, named with Megatron's spelling.
// The knob registry (engine/config/knobs.h) declares each field once (type, default, group, flags,
// help, rules); YAML loading, validation, the CLI, GUI toggles, export and docs all read it.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace ts::engine {

// A knob Megatron types as Union[T, List[T]] (moe_router_load_balancing_type,
// moe_aux_loss_coeff: argparse nargs='+'): one value, or several (the list form). A one-element
// list is the single value, as Megatron's validate_args unwraps it. Assigning or comparing a
// single value works as with a plain field (`c.moe_aux_loss_coeff = 0.01`, `lb == "sinkhorn"`);
// a list equals no single value (Megatron's `routing_type == "sinkhorn"` is False for a list).
template <typename T>
struct OneOrList {
    std::vector<T> items;  // never empty
    template <typename U>
        requires std::is_convertible_v<U, T> && (!std::is_same_v<std::decay_t<U>, OneOrList>)
    OneOrList(U&& v) : items{T(std::forward<U>(v))} {}
    explicit OneOrList(std::vector<T> v) : items(std::move(v)) {}
    bool isList() const { return items.size() > 1; }
    template <typename U>
        requires requires(const T& a, const U& b) { { a == b } -> std::convertible_to<bool>; } &&
                 (!std::is_same_v<U, OneOrList>)
    bool operator==(const U& v) const { return items.size() == 1 && items[0] == v; }
    bool same(const OneOrList& o) const { return items == o.items; }
    bool contains(const T& v) const {
        for (const T& x : items)
            if (x == v) return true;
        return false;
    }
};

struct Config {
    // --- model shape ----------------------------------------------------------------------
    int num_layers = 4;
    int hidden_size = 256;
    int ffn_hidden_size = 0;         // 0 = derived as Megatron does: 4*h, or int(8h/3/64)*64 with swiglu
    int num_attention_heads = 4;
    int num_query_groups = 0;        // 0 = num_attention_heads (no GQA)
    int kv_channels = 0;             // 0 = hidden / heads
    int seq_length = 128;
    int vocab_size = 4096;           // tokenizer vocab; padded per make_vocab_size_divisible_by
    int make_vocab_size_divisible_by = 128;
    std::string normalization = "LayerNorm";  // LayerNorm | RMSNorm
    double norm_epsilon = 1e-5;
    bool swiglu = false;
    std::string position_embedding_type = "learned_absolute";  // Megatron's default | rope | none
    double rotary_base = 10000;
    bool untie_embeddings_and_output_weights = false;
    bool add_bias_linear = true;
    double hidden_dropout = 0.1;     // Megatron's defaults; tests and examples that need 0 say so
    double attention_dropout = 0.1;
    double init_method_std = 0.02;
    int num_moe_experts = 0;         // 0 = dense

    // --- parallel layout ------------------------------------------------------------------
    int world_size = 0;              // 0 = derived: tp*cp*pp*dp
    int tensor_model_parallel_size = 1;
    int pipeline_model_parallel_size = 1;
    int virtual_pipeline_model_parallel_size = 1;  // 1 = no interleaving
    int num_layers_per_virtual_pipeline_stage = 0;   // 0 = unset (the other way to ask for interleaving)
    int decoder_first_pipeline_num_layers = 0;       // 0 = even split
    int decoder_last_pipeline_num_layers = 0;
    bool defer_embedding_wgrad_compute = false;
    int context_parallel_size = 1;
    std::string cp_comm_type = "p2p";  // p2p | all_gather | a2a | a2a+p2p
    // Megatron's hierarchical_context_parallel_sizes: [a2a size, p2p size] of the two CP
    // sub-groups ("hcp-a2a" = consecutive CP ranks, "hcp-p2p"); empty = not set (None).
    std::vector<int> hierarchical_context_parallel_sizes;
    int expert_model_parallel_size = 1;
    int expert_tensor_parallel_size = 0;  // 0 = tensor_model_parallel_size
    int data_parallel_size = 0;      // 0 = derived: world/(tp*cp*pp)
    bool sequence_parallel = false;

    // --- batch ----------------------------------------------------------------------------
    int micro_batch_size = 8;
    int global_batch_size = 0;       // 0 = micro_batch_size * dp * num_microbatches
    int num_microbatches = 0;        // 0 = derived from global_batch_size (default 1)

    // --- data-parallel communication ------------------------------------------------------
    bool overlap_grad_reduce = false;
    bool overlap_param_gather = false;
    bool use_distributed_optimizer = false;
    bool overlap_param_gather_with_optimizer_step = false;
    bool align_param_gather = true;  // Megatron: in effect only with the interleaved schedule
    int num_distributed_optimizer_instances = 1;
    std::string data_parallel_sharding_strategy = "optim_grads_params";  // Megatron-FSDP only
    bool use_precision_aware_optimizer = false;
    std::string main_grads_dtype = "fp32";   // fp32 | bf16
    std::string exp_avg_dtype = "fp32";      // fp32 | fp16 | bf16 | fp8
    std::string exp_avg_sq_dtype = "fp32";   // fp32 | fp16 | bf16 | fp8
    int64_t bucket_size = 0;         // elements; 0 = Megatron default max(40M, 1M*dp)
    bool average_in_collective = false;
    bool grad_reduce_in_fp32 = true;

    // --- tensor/pipeline communication ----------------------------------------------------
    bool tp_comm_overlap = false;
    // Sub-knobs of tp_comm_overlap (Megatron's --disable-tp-comm-* / --tp-comm-overlap-rs-dgrad).
    bool tp_comm_overlap_ag = true;
    bool tp_comm_overlap_rs = true;
    bool tp_comm_overlap_rs_dgrad = false;
    bool tp_comm_bulk_dgrad = true;
    bool tp_comm_bulk_wgrad = true;
    // Megatron: overlap_p2p_comm defaults to true and is in effect only with the interleaved
    // schedule; batch_p2p_comm applies where overlap is not in effect (see config_rules.cpp).
    bool overlap_p2p_comm = true;
    bool batch_p2p_comm = true;

    // --- fusions --------------------------------------------------------------------------
    bool masked_softmax_fusion = true;
    bool bias_activation_fusion = true;
    bool bias_dropout_fusion = true;
    bool apply_rope_fusion = true;
    bool cross_entropy_loss_fusion = false;
    std::string cross_entropy_fusion_impl = "native";  // native | te
    bool gradient_accumulation_fusion = true;
    bool persist_layer_norm = true;

    // --- precision ------------------------------------------------------------------------
    bool bf16 = false;
    std::string fp8 = "";            // "" (off) | e4m3 | hybrid
    std::string fp8_recipe = "delayed";  // delayed | tensorwise | mxfp8 | blockwise
    int fp8_amax_history_len = 1;
    std::string fp8_amax_compute_algo = "most_recent";  // most_recent | max
    int fp8_margin = 0;
    bool fp8_wgrad = true;               // false: the wgrad GEMM's output gradient stays high precision
    bool first_last_layers_bf16 = false; // keep the first/last layers' linears in bf16 under fp8
    int num_layers_at_start_in_bf16 = 1;
    int num_layers_at_end_in_bf16 = 1;

    // --- recompute ------------------------------------------------------------------------
    std::string recompute_granularity = "";  // "" | selective | full
    std::string recompute_method = "";       // "" | uniform | block
    int recompute_num_layers = 0;
    std::vector<std::string> recompute_modules = {"core_attn"};
    bool recompute_activations = false;  // Megatron's shorthand for recompute_granularity=selective

    // --- MoE ------------------------------------------------------------------------------
    int moe_router_topk = 2;
    // One coefficient, or one per moe_router_load_balancing_type of its list form.
    OneOrList<double> moe_aux_loss_coeff = 0.0;
    double moe_z_loss_coeff = 0.0;   // 0 = unset (Megatron None): no z-loss term
    bool moe_grouped_gemm = false;
    std::string moe_token_dispatcher_type = "allgather";  // allgather | alltoall | flex
    double moe_expert_capacity_factor = 0.0;             // 0 = unset (Megatron None): dropless
    bool moe_pad_expert_input_to_capacity = false;       // with a capacity: every expert gets exactly it
    std::string moe_token_drop_policy = "probs";         // probs | position: which tokens an expert keeps
    // Which layers are MoE, as Megatron's --moe-layer-freq: an integer f (layer i iff i % f == 0),
    // a list of 0/1 per layer ("[1,0,1,0]") or Megatron's expression ("([1]*3+[0]*1)*2").
    std::string moe_layer_freq = "1";
    int moe_ffn_hidden_size = 0;
    int moe_shared_expert_intermediate_size = 0;  // 0 = no shared expert
    bool moe_shared_expert_overlap = false;
    bool moe_shared_expert_gate = false;          // shared expert output *= sigmoid(x w_gate)
    bool moe_permute_fusion = false;
    // aux_loss | seq_aux_loss | global_aux_loss | sinkhorn | quantile_balancing | none, or a list of
    // aux-loss types (each with its moe_aux_loss_coeff; their losses are summed).
    OneOrList<std::string> moe_router_load_balancing_type = "aux_loss";
    double moe_router_quantile_balancing_ema = 0.0;      // quantile_balancing: qb_beta's EMA over global batches
    std::string moe_router_score_function = "softmax";  // softmax | sigmoid | sqrtsoftplus
    bool moe_router_pre_softmax = false;                 // softmax before the top-k
    double moe_router_topk_scaling_factor = 0.0;         // 0 = unset (Megatron None): no scaling
    std::string moe_router_dtype;                        // "" (Megatron None) | fp32 | fp64
    int moe_router_num_groups = 0;                       // group-limited routing; 0 = off
    int moe_router_group_topk = 0;                       // groups chosen per token; 0 = off
    bool moe_router_enable_expert_bias = false;          // aux-loss-free load balancing
    double moe_router_bias_update_rate = 1e-3;

    // --- misc -----------------------------------------------------------------------------
    std::string cuda_graph_impl = "none";  // none | local | transformer_engine | full_iteration
    int cuda_graph_warmup_steps = 3;       // eager steps before the capture (Megatron's default)
    // flash | fused | unfused | local | auto (attentionIsFlash: which keep no probabilities)
    std::string attention_backend = "auto";
    bool cpu_offloading = false;
    int cpu_offloading_num_layers = 0;
    bool account_for_embedding_in_pipeline_split = false;
    bool account_for_loss_in_pipeline_split = false;

    // --- run / optimizer ------------------------------------------------------------------
    int train_iters = 20;
    int seed = 1234;
    double lr = 3e-4;
    double min_lr = 0.0;
    std::string lr_decay_style = "linear";  // constant | linear | cosine (Megatron's default: linear)
    int lr_warmup_iters = 0;
    double weight_decay = 0.01;
    double clip_grad = 1.0;          // 0 = no clipping
    double adam_beta1 = 0.9;
    double adam_beta2 = 0.999;
    double adam_eps = 1e-8;
    std::string data_path = "";      // "" = shipped corpus; "synthetic"; or Megatron .bin/.idx prefix
    std::string tokenizer_type = "byte";  // byte | bpe
    std::string device_backend = "cpu";   // cpu | cuda
    bool cuda_share_gpus = false;    // cuda: the ranks share the visible GPUs (checks, not timings)
    int cpu_threads = 0;             // GEMM threads per rank on the CPU backend; 0 = auto
    int log_interval = 100;
    std::string save = "";           // checkpoint dir ("" = none)
    std::string load = "";           // resume from checkpoint dir
    int save_interval = 0;
    bool profile = true;             // record a trace into the run file
    std::string name = "";           // run name
};

// Sizes after derivation (world/dp/microbatches/padded vocab/ffn/groups). Only valid on a
// config that passed validation.
struct DerivedSizes {
    int world = 1, tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1, etp = 1, dp = 1;
    int num_microbatches = 1;
    int global_batch_size = 1;
    int padded_vocab_size = 0;
    int ffn_hidden_size = 0;
    int num_query_groups = 0;
    int kv_channels = 0;
};
DerivedSizes deriveSizes(const Config& c);

// Megatron's TopKRouter.get_aux_loss_coeff: the coefficient of an aux-loss type ("aux_loss",
// "seq_aux_loss", "global_aux_loss"): moe_aux_loss_coeff when the load-balancing type is that one,
// the matching entry of the coefficient list when it is in the list form, else 0.
double moeAuxLossCoeff(const Config& c, std::string_view type);
// The load-balancing type(s) as written: "aux_loss" or "[aux_loss, seq_aux_loss]".
std::string moeLoadBalancingText(const Config& c);

// moe_layer_freq read as Megatron's moe_freq_type reads it (an integer, or a Python list expression
// of 0/1 built from list literals, '+' (concatenation) and '*' (repetition by an integer)), expanded
// to one flag per layer: 1 = MoE. numLayers < 0 checks only the syntax (returns the pattern as
// written, or {f} for an integer f). On error returns {} and *error says what is wrong.
std::vector<int> moeLayerPattern(const std::string& freq, int numLayers, std::string* error);
// The per-layer flags of a config (num_layers long; all 0 when num_moe_experts is 0 or the
// pattern is invalid, which validation reports).
std::vector<int> moeLayerPattern(const Config& c);

// Whether attention_backend runs flash attention (per-row softmax stats kept between forward
// and backward, no [b, a, s, s] probabilities): flash, fused and auto, as Transformer Engine
// picks its flash or cuDNN fused attention on GPUs; unfused and local keep the probabilities.
inline bool attentionIsFlash(const std::string& backend) { return backend != "unfused" && backend != "local"; }

}  // namespace ts::engine
