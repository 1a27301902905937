// The single-device trainer on the emulated device (engine/backend/emulated_backend.h: the GPU's
// execution model on the CPU: an op's host code runs at submit, its kernels later; buffer memory
// traps host access) against the same run on the CPU backend, bit for bit: every step's loss and
// grad norm, and the final weights.
//
// What runs there is the dense and the MoE single-device path (docs/cuda_port.md, "Status"). A knob
// whose path still touches device memory from the host stops the process with the emulated
// device's message and a backtrace naming the op; the variants below are the ones that run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/gpt.h"
#include "engine/train/trainer.h"
#include "tests/trainer_backend_run.h"

namespace ts::engine {
namespace {

using ts::testing::TrainRun;

TrainRun train(const Config& c, bool emulate) {
    TrainerOptions o;
    o.emulateDevice = emulate;
    return ts::testing::trainRun(c, o);
}

Config tinyConfig() { return ts::testing::tinyTrainerConfig(); }

void expectBitEqual(const Config& c, const std::string& what) {
    const TrainRun cpu = train(c, false), emu = train(c, true);
    ASSERT_EQ(cpu.losses.size(), size_t(c.train_iters)) << what;
    ASSERT_EQ(emu.losses.size(), cpu.losses.size()) << what;
    for (size_t s = 0; s < cpu.losses.size(); ++s) {
        EXPECT_EQ(emu.losses[s], cpu.losses[s]) << what << ": loss, step " << s + 1;
        EXPECT_EQ(emu.gradNorms[s], cpu.gradNorms[s]) << what << ": grad norm, step " << s + 1;
    }
    EXPECT_LT(cpu.losses.back(), cpu.losses.front()) << what << ": the run did not train";
    ASSERT_EQ(emu.params.size(), cpu.params.size()) << what;
    size_t diff = 0;
    for (size_t i = 0; i < cpu.params.size(); ++i) diff += emu.params[i] != cpu.params[i];
    EXPECT_EQ(diff, 0u) << what << ": final weights differ in " << diff << " of " << cpu.params.size();
}

TEST(EmulatedDeviceTrainer, EveryStepEqualsTheCpuBackendBitForBit) {
    const std::vector<std::pair<std::string, std::function<void(Config&)>>> variants = {
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
        {"dropout, selective recompute", [](Config& c) {
             c.hidden_dropout = 0.1;
             c.attention_dropout = 0.1;
             c.recompute_granularity = "selective";
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
        // MoE (gpt_moe.cpp): the router read back and routed on the host, the plan uploaded,
        // the permutes and the combine as gather kernels, the experts' scratch in workspaces.
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
        {"precision-aware optimizer, bf16 main grads", [](Config& c) {
             c.bf16 = true;
             c.use_precision_aware_optimizer = true;
             c.main_grads_dtype = "bf16";
             c.exp_avg_dtype = "bf16";
         }},
    };
    for (const auto& [name, edit] : variants) {
        Config c = tinyConfig();
        edit(c);
        expectBitEqual(c, name);
    }
}

}  // namespace
}  // namespace ts::engine
