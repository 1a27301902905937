// The single-device trainer on GPU 0 (device_backend: cuda, TrainerOptions::allowUnverifiedCuda)
// against the same run on the CPU backend: every step's loss and grad norm, and the final
// weights, within a tolerance per variant. The two backends differ only in summation order
// (cuBLAS vs OpenBLAS GEMMs, the CUDA reductions) and CUDA's expf in the activations, so fp32
// runs agree to float rounding amplified by three Adam steps; bf16 and FP8 runs round those
// differences to their own precision (a value near a rounding boundary may go either way), so
// their tolerances are wider. The tolerances are first estimates, to be tightened with the
// numbers of the first GPU run (docs/cuda_port.md). Skips without a CUDA build or device.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "tests/trainer_backend_run.h"

namespace ts::engine {
namespace {

using ts::testing::TrainRun;

TrainRun train(const Config& c) {
    TrainerOptions o;
    o.emulateDevice = false;
    o.allowUnverifiedCuda = true;
    return ts::testing::trainRun(c, o);
}

struct Variant {
    std::string name;
    std::function<void(Config&)> edit;
    double lossTol, paramTol;  // relative: per-step loss / grad norm; L2 norm of the weight difference
};

TEST(CudaTrainer, EveryStepMatchesTheCpuBackend) {
    if (auto be = makeCudaBackend(); !be) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
    const std::vector<Variant> variants = {
        {"fp32 defaults (rope fused)", [](Config&) {}, 1e-5, 1e-4},
        {"learned_absolute, unfused attention and cross entropy, untied",
         [](Config& c) {
             c.position_embedding_type = "learned_absolute";
             c.attention_backend = "unfused";
             c.cross_entropy_loss_fusion = false;
             c.untie_embeddings_and_output_weights = true;
         },
         1e-5, 1e-4},
        {"bf16, 2 microbatches, dropout", [](Config& c) {
             c.bf16 = true;
             c.num_microbatches = 2;
             c.hidden_dropout = 0.1;
             c.attention_dropout = 0.1;
         }, 2e-3, 2e-2},
        {"MoE top-2 grouped GEMM, aux and z loss", [](Config& c) {
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.moe_grouped_gemm = true;
             c.add_bias_linear = false;
             c.moe_aux_loss_coeff = 1e-2;
             c.moe_z_loss_coeff = 1e-3;
         }, 1e-4, 1e-3},
        {"fp8 hybrid, delayed scaling", [](Config& c) {
             c.bf16 = true;
             c.fp8 = "hybrid";
         }, 5e-3, 5e-2},
        {"fp8 mxfp8", [](Config& c) {
             c.bf16 = true;
             c.fp8 = "e4m3";
             c.fp8_recipe = "mxfp8";
         }, 5e-3, 5e-2},
    };
    for (const Variant& v : variants) {
        Config c = ts::testing::tinyTrainerConfig();
        v.edit(c);
        const TrainRun cpu = train(c);
        c.device_backend = "cuda";
        const TrainRun gpu = train(c);
        ASSERT_EQ(cpu.losses.size(), size_t(c.train_iters)) << v.name;
        ASSERT_EQ(gpu.losses.size(), cpu.losses.size()) << v.name << " on " << gpu.device;
        for (size_t s = 0; s < cpu.losses.size(); ++s) {
            EXPECT_NEAR(gpu.losses[s], cpu.losses[s], v.lossTol * std::fabs(cpu.losses[s]))
                << v.name << ": loss, step " << s + 1 << " on " << gpu.device;
            EXPECT_NEAR(gpu.gradNorms[s], cpu.gradNorms[s], v.lossTol * std::fabs(cpu.gradNorms[s]) + 1e-7)
                << v.name << ": grad norm, step " << s + 1;
        }
        EXPECT_LT(cpu.losses.back(), cpu.losses.front()) << v.name << ": the run did not train";
        ASSERT_EQ(gpu.params.size(), cpu.params.size()) << v.name;
        double diff = 0, norm = 0;
        for (size_t i = 0; i < cpu.params.size(); ++i) {
            diff += (double(gpu.params[i]) - cpu.params[i]) * (double(gpu.params[i]) - cpu.params[i]);
            norm += double(cpu.params[i]) * cpu.params[i];
        }
        EXPECT_LE(std::sqrt(diff), v.paramTol * std::sqrt(norm)) << v.name << ": final weights";
        std::printf("[cuda trainer] %s on %s: loss %.9g (cpu %.9g), weights rel. L2 diff %.3g\n", v.name.c_str(),
                    gpu.device.c_str(), gpu.losses.back(), cpu.losses.back(), std::sqrt(diff / std::max(norm, 1e-30)));
    }
}

}  // namespace
}  // namespace ts::engine
