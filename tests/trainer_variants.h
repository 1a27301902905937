// The single-device knob paths every backend must train alike: the emulated device checks them
// bit for bit against the CPU backend (tests/engine/train/test_trainer_emulated.cpp), the CUDA
// backend within a tolerance per precision (tests/gpu/test_cuda_trainer.cpp). One list, so every
// path a GPU session checks is one the CPU side already trains.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/config/config.h"

namespace ts::testing {

struct TrainerVariant {
    std::string name;
    std::function<void(engine::Config&)> edit;
};

inline std::vector<TrainerVariant> trainerVariants() {
    using engine::Config;
    return {
        {"defaults (rope, fused)", [](Config&) {}},
        {"bf16", [](Config& c) { c.bf16 = true; }},
        {"2 microbatches", [](Config& c) { c.num_microbatches = 2; }},
        {"learned_absolute (Megatron's default: splitQkv/mergeQkv)",
         [](Config& c) { c.position_embedding_type = "learned_absolute"; }},
        {"rope unfused", [](Config& c) { c.apply_rope_fusion = false; }},
        {"RMSNorm, SwiGLU, no biases, GQA",
         [](Config& c) {
             c.normalization = "RMSNorm";
             c.swiglu = true;
             c.add_bias_linear = false;
             c.num_query_groups = 2;
         }},
        {"untied, unfused attention and cross entropy",
         [](Config& c) {
             c.untie_embeddings_and_output_weights = true;
             c.attention_backend = "unfused";
             c.cross_entropy_loss_fusion = false;
         }},
        {"dropout, selective recompute (probabilities kept, then dropped and rebuilt)", [](Config& c) {
             c.hidden_dropout = 0.1;
             c.attention_dropout = 0.1;
             c.recompute_granularity = "selective";
             c.attention_backend = "unfused";
         }},
        {"full recompute, gradient_accumulation_fusion off, bf16", [](Config& c) {
             c.recompute_granularity = "full";
             c.recompute_method = "uniform";
             c.recompute_num_layers = 1;
             c.gradient_accumulation_fusion = false;
             c.bf16 = true;
         }},
        {"fp8 hybrid, delayed scaling", [](Config& c) {
             c.bf16 = true;
             c.fp8 = "hybrid";
         }},
        {"fp8 e4m3, tensorwise", [](Config& c) {
             c.bf16 = true;
             c.fp8 = "e4m3";
             c.fp8_recipe = "tensorwise";
         }},
        {"fp8 mxfp8, unfused gradient accumulation", [](Config& c) {
             c.bf16 = true;
             c.fp8 = "e4m3";
             c.fp8_recipe = "mxfp8";
             c.gradient_accumulation_fusion = false;
         }},
        {"fp8 blockwise", [](Config& c) {
             c.bf16 = true;
             c.fp8 = "e4m3";
             c.fp8_recipe = "blockwise";
         }},
        // MoE (gpt_moe.cpp): the router's choice and plan by kernels in every mode, the permutes
        // and the combine as gather kernels, the experts' scratch in workspaces.
        {"MoE top-2, grouped GEMM, aux and z loss, bf16", [](Config& c) {
             c.bf16 = true;
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.moe_grouped_gemm = true;
             c.add_bias_linear = false;
             c.moe_aux_loss_coeff = 1e-2;
             c.moe_z_loss_coeff = 1e-3;
         }},
        {"MoE per-expert loop, biases, capacity with padding", [](Config& c) {
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.moe_grouped_gemm = false;
             c.add_bias_linear = true;
             c.moe_expert_capacity_factor = 1.0;
             c.moe_pad_expert_input_to_capacity = true;
         }},
        {"MoE gated shared experts, SwiGLU, bf16", [](Config& c) {
             c.bf16 = true;
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.add_bias_linear = false;
             c.swiglu = true;
             c.moe_shared_expert_intermediate_size = 32;
             c.moe_shared_expert_gate = true;
         }},
        {"MoE sigmoid router with expert bias, seq_aux_loss, full recompute", [](Config& c) {
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.moe_router_score_function = "sigmoid";
             c.moe_router_enable_expert_bias = true;
             c.moe_router_load_balancing_type = "seq_aux_loss";
             c.moe_aux_loss_coeff = 1e-2;
             c.recompute_granularity = "full";
             c.recompute_method = "uniform";
             c.recompute_num_layers = 1;
         }},
        {"MoE fp8 delayed, biases", [](Config& c) {
             c.bf16 = true;
             c.fp8 = "hybrid";
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.add_bias_linear = true;
             c.bias_dropout_fusion = false;
         }},
        {"MoE fp8 mxfp8", [](Config& c) {
             c.bf16 = true;
             c.fp8 = "e4m3";
             c.fp8_recipe = "mxfp8";
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
         }},
        {"bf16, 2 microbatches, dropout", [](Config& c) {
             c.bf16 = true;
             c.num_microbatches = 2;
             c.hidden_dropout = 0.1;
             c.attention_dropout = 0.1;
         }},
        {"unfused masked softmax, bias-activation and bias-dropout", [](Config& c) {
             c.attention_backend = "unfused";
             c.masked_softmax_fusion = false;
             c.bias_activation_fusion = false;
             c.bias_dropout_fusion = false;
         }},
        {"MoE top-2, grouped GEMM, aux and z loss, fp32", [](Config& c) {
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.moe_grouped_gemm = true;
             c.add_bias_linear = false;
             c.moe_aux_loss_coeff = 1e-2;
             c.moe_z_loss_coeff = 1e-3;
         }},
        {"MoE sinkhorn router, top-1", [](Config& c) {
             c.num_moe_experts = 4;
             c.moe_router_topk = 1;
             c.moe_router_load_balancing_type = "sinkhorn";
             c.moe_aux_loss_coeff = 0;
         }},
        {"MoE quantile balancing, 2 microbatches, full recompute", [](Config& c) {
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.moe_router_load_balancing_type = "quantile_balancing";
             c.moe_aux_loss_coeff = 0;
             c.num_microbatches = 2;
             c.recompute_granularity = "full";
             c.recompute_method = "uniform";
             c.recompute_num_layers = 1;
         }},
        {"precision-aware optimizer, bf16 main grads", [](Config& c) {
             c.bf16 = true;
             c.use_precision_aware_optimizer = true;
             c.main_grads_dtype = "bf16";
             c.exp_avg_dtype = "bf16";
         }},
    };
}

}  // namespace ts::testing
