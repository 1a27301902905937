// Config: every tunable of a run, one field per knob, named with Megatron's spelling.
// The knob registry (engine/config/knobs.h) declares each field once (type, default, group, flags,
// help, rules); YAML loading, validation, the CLI, GUI toggles, export and docs all read it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ts::engine {

struct Config {
    // --- model shape ----------------------------------------------------------------------
    int num_layers = 4;
    int hidden_size = 256;
    int ffn_hidden_size = 0;         // 0 = 4*hidden (or Megatron's swiglu default)
    int num_attention_heads = 4;
    int num_query_groups = 0;        // 0 = num_attention_heads (no GQA)
    int kv_channels = 0;             // 0 = hidden / heads
    int seq_length = 128;
    int vocab_size = 4096;           // tokenizer vocab; padded per make_vocab_size_divisible_by
    int make_vocab_size_divisible_by = 128;
    std::string normalization = "LayerNorm";  // LayerNorm | RMSNorm
    double norm_epsilon = 1e-5;
    bool swiglu = false;
    std::string position_embedding_type = "rope";  // rope | learned_absolute | none
    double rotary_base = 10000;
    bool untie_embeddings_and_output_weights = false;
    bool add_bias_linear = true;
    double hidden_dropout = 0.0;
    double attention_dropout = 0.0;
    double init_method_std = 0.02;
    int num_moe_experts = 0;         // 0 = dense

    // --- parallel layout ------------------------------------------------------------------
    int world_size = 0;              // 0 = derived: tp*cp*pp*dp
    int tensor_model_parallel_size = 1;
    int pipeline_model_parallel_size = 1;
    int virtual_pipeline_model_parallel_size = 1;  // 1 = no interleaving
    int context_parallel_size = 1;
    std::string cp_comm_type = "p2p";  // p2p | all_gather | a2a
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
    bool overlap_p2p_comm = false;
    bool batch_p2p_comm = true;

    // --- fusions --------------------------------------------------------------------------
    bool masked_softmax_fusion = true;
    bool bias_activation_fusion = true;
    bool bias_dropout_fusion = true;
    bool apply_rope_fusion = true;
    bool cross_entropy_loss_fusion = true;
    bool gradient_accumulation_fusion = true;
    bool persist_layer_norm = true;

    // --- precision ------------------------------------------------------------------------
    bool bf16 = false;
    std::string fp8 = "";            // "" (off) | e4m3 | hybrid
    std::string fp8_recipe = "delayed";  // delayed | tensorwise | mxfp8 | blockwise
    int fp8_amax_history_len = 1;
    std::string fp8_amax_compute_algo = "most_recent";  // most_recent | max
    int fp8_margin = 0;

    // --- recompute ------------------------------------------------------------------------
    std::string recompute_granularity = "";  // "" | selective | full
    std::string recompute_method = "";       // "" | uniform | block
    int recompute_num_layers = 0;
    std::vector<std::string> recompute_modules = {"core_attn"};

    // --- MoE ------------------------------------------------------------------------------
    int moe_router_topk = 2;
    double moe_aux_loss_coeff = 0.0;
    double moe_z_loss_coeff = 0.0;
    bool moe_grouped_gemm = false;
    std::string moe_token_dispatcher_type = "alltoall";  // allgather | alltoall
    double moe_expert_capacity_factor = 0.0;             // 0 = dropless
    int moe_ffn_hidden_size = 0;

    // --- misc -----------------------------------------------------------------------------
    bool enable_cuda_graph = false;
    bool account_for_embedding_in_pipeline_split = false;
    bool account_for_loss_in_pipeline_split = false;

    // --- run / optimizer ------------------------------------------------------------------
    int train_iters = 20;
    int seed = 1234;
    double lr = 3e-4;
    double min_lr = 0.0;
    std::string lr_decay_style = "constant";  // constant | linear | cosine
    int lr_warmup_iters = 0;
    double weight_decay = 0.01;
    double clip_grad = 1.0;          // 0 = no clipping
    double adam_beta1 = 0.9;
    double adam_beta2 = 0.95;
    double adam_eps = 1e-8;
    std::string data_path = "";      // "" = shipped corpus; "synthetic"; or Megatron .bin/.idx prefix
    std::string tokenizer_type = "byte";  // byte | bpe
    std::string device_backend = "cpu";   // cpu | cuda
    int cpu_threads = 0;             // GEMM threads per rank on the CPU backend; 0 = auto
    int log_interval = 1;
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

}  // namespace ts::engine
