// The parallel trainer on GPUs (device_backend: cuda, ParallelTrainerOptions::allowUnverifiedCuda):
// one rank thread per GPU, groups over NCCL, against the same layout on the CPU backend (the
// in-process communicator): every step's loss and grad norm, and the gathered weights. fp32, so
// the backends differ only in summation order (cuBLAS vs OpenBLAS, NCCL's ring vs the in-process
// reduction) amplified by three Adam steps; the tolerances are first estimates, as in
// test_cuda_trainer.cpp. A layout runs with NCCL when the machine has a GPU per rank; with fewer
// its ranks share the GPUs (the knob cuda_share_gpus), so one GPU checks them all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "tests/parallel/parallel_test_util.h"

namespace ts::engine {
namespace {

using ts::test::Layout;
using ts::test::relError;
using ts::test::RunResult;
using ts::test::tinyConfig;
using ts::test::trainParallel;
using ts::test::withLayout;

struct Case {
    std::string name;
    Layout layout;
    std::function<void(Config&)> knobs;
};

std::vector<Case> cases() {
    return {
        {"one rank", {1, 1, 1, 1, 2}, [](Config&) {}},
        {"tp2 sp overlap", {2, 1, 1, 1, 2}, [](Config& c) {
             c.sequence_parallel = true;
             c.tp_comm_overlap = true;
         }},
        {"pp2 interleaved", {1, 2, 2, 1, 4}, [](Config&) {}},
        {"dp2 distributed optimizer, overlapped", {1, 1, 1, 2, 2}, [](Config& c) {
             c.use_distributed_optimizer = true;
             c.overlap_grad_reduce = true;
             c.overlap_param_gather = true;
         }},
        {"cp2 p2p", {1, 1, 1, 2, 2}, [](Config& c) {
             c.context_parallel_size = 2;
             c.data_parallel_size = 1;
             c.cp_comm_type = "p2p";
         }},
        {"ep2 MoE alltoall", {1, 1, 1, 2, 2}, [](Config& c) {
             c.num_moe_experts = 4;
             c.moe_router_topk = 2;
             c.expert_model_parallel_size = 2;
             c.moe_token_dispatcher_type = "alltoall";
             c.add_bias_linear = false;
         }},
        {"tp2 pp2 dp2", {2, 2, 1, 2, 4}, [](Config& c) { c.sequence_parallel = true; }},
        // bf16: 2-byte params read through working copies bound to the bits, main params kept per
        // shard, the params' bf16 bits all-gathered in place.
        {"pp2 dp2 bf16 distributed optimizer, overlapped", {1, 2, 1, 2, 2}, [](Config& c) {
             c.bf16 = true;
             c.use_distributed_optimizer = true;
             c.overlap_grad_reduce = true;
             c.overlap_param_gather = true;
             c.bucket_size = 2500;
         }},
    };
}

TEST(CudaParallelTrainer, LayoutsMatchTheCpuBackend) {
    auto be = makeCudaBackend();
    if (!be) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
    const int gpus = (*be)->deviceCount();
    be->reset();
    ParallelTrainerOptions cpuOpts;
    cpuOpts.emulateDevice = false;
    cpuOpts.hostSyncCollectives = false;
    for (const Case& k : cases()) {
        Config c = withLayout(tinyConfig(), k.layout);
        k.knobs(c);
        const int world = deriveSizes(c).world;
        // A GPU per rank: NCCL between them. Fewer: the ranks share the GPUs, with the in-process
        // communicator through managed memory (cuda_share_gpus), which checks every CUDA path
        // of the layout but NCCL's.
        ParallelTrainerOptions gpuOpts;
        gpuOpts.allowUnverifiedCuda = true;
        gpuOpts.hostSyncCollectives = false;
        const bool share = world > gpus;
        const char* how = world == 1 ? "one GPU" : share ? "sharing the GPUs" : "NCCL, a GPU each";
        auto cpu = trainParallel(c, 3, "", "", nullptr, nullptr, cpuOpts);
        ASSERT_TRUE(cpu.isOk()) << k.name << ": " << cpu.status().toString();
        c.device_backend = "cuda";
        c.cuda_share_gpus = share;
        std::unique_ptr<ParallelTrainer> keep;
        auto gpu = trainParallel(c, 3, "", "", nullptr, &keep, gpuOpts);
        ASSERT_TRUE(gpu.isOk()) << k.name << " on the GPUs (" << how << "): " << gpu.status().toString();
        EXPECT_EQ(keep->runMetadata().value("cuda_shared_gpus", false), share) << k.name;
        keep.reset();
        ASSERT_EQ(gpu->losses.size(), cpu->losses.size());
        // bf16: the GPU's bf16 GEMMs sum in another order, and bf16 rounds that; MoE: a routing
        // tie can fall the other way (the single-GPU trainer test's loss tolerances).
        const double lossTol = c.bf16 ? 2e-3 : c.num_moe_experts > 0 ? 1e-4 : 1e-5;
        const double weightTol = c.bf16 ? 5e-2 : 1e-4;
        for (size_t s = 0; s < cpu->losses.size(); ++s) {
            EXPECT_NEAR(gpu->losses[s], cpu->losses[s], lossTol * std::fabs(cpu->losses[s])) << k.name << ": step " << s + 1;
            EXPECT_NEAR(gpu->gradNorms[s], cpu->gradNorms[s], lossTol * std::fabs(cpu->gradNorms[s]) + 1e-7)
                << k.name << ": grad norm, step " << s + 1;
        }
        double worst = 0;
        for (const auto& [name, w] : cpu->params) {
            ASSERT_TRUE(gpu->params.count(name)) << k.name << ": " << name << " missing on the GPUs";
            const double e = relError(gpu->params.at(name), w);
            EXPECT_LE(e, weightTol) << k.name << ": " << name;
            worst = std::max(worst, e);
        }
        std::printf("[cuda parallel] %s (world %d, %s): loss %.9g (cpu %.9g), worst weight rel. diff %.3g\n",
                    k.name.c_str(), world, how, gpu->losses.back(), cpu->losses.back(), worst);
    }
}

}  // namespace
}  // namespace ts::engine

namespace ts::engine {
namespace {

// What a user with fewer GPUs than ranks sees, on the real machine: a layout needing one GPU more
// than are visible is refused naming the counts and the way out; two ranks placed on one GPU are
// refused before NCCL would be.
TEST(CudaParallelTrainer, TooFewGpusAndSharedGpusAreRefusedWithTheReason) {
    auto be = makeCudaBackend();
    if (!be) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
    const int gpus = (*be)->deviceCount();
    be->reset();
    ParallelTrainerOptions o;
    o.allowUnverifiedCuda = true;
    Config c = withLayout(tinyConfig(), {1, 1, 1, gpus + 1, 1});
    c.device_backend = "cuda";
    auto t = ParallelTrainer::create(c, nullptr, o);
    ASSERT_FALSE(t.isOk()) << "world " << gpus + 1 << " on " << gpus << " GPU(s) was accepted";
    EXPECT_EQ(t.status().code(), ErrorCode::Unsupported) << t.status().toString();
    EXPECT_NE(t.status().message().find(std::to_string(gpus) + " GPU(s) are visible"), std::string::npos)
        << t.status().message();
    EXPECT_NE(t.status().message().find("mpirun"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("cuda_share_gpus: true"), std::string::npos) << t.status().message();

    Config two = withLayout(tinyConfig(), {1, 1, 1, 2, 1});
    two.device_backend = "cuda";
    o.cudaDevices = {0, 0};
    auto shared = ParallelTrainer::create(two, nullptr, o);
    ASSERT_FALSE(shared.isOk());
    EXPECT_NE(shared.status().message().find("both on GPU 0"), std::string::npos) << shared.status().message();

    // Asked to share, the ranks are placed round-robin: a placement of one's own is refused.
    two.cuda_share_gpus = true;
    auto placed = ParallelTrainer::create(two, nullptr, o);
    ASSERT_FALSE(placed.isOk());
    EXPECT_NE(placed.status().message().find("give no cudaDevices"), std::string::npos) << placed.status().message();
}

}  // namespace
}  // namespace ts::engine
