// Where the host waits for the device in a parallel step (emulatedHostWaits, emulated_backend.h).
// On a GPU each rank's host thread queues its step's kernels ahead of the device; an op whose host
// code reads device memory back stops that until the stream drains. Per step, one wait each for
// the gradient norm before clipping, the losses' read-back (last stage), FP8 delayed scaling's
// amax history, the MoE expert bias and quantile balancing's beta (at the step's end), and, as the
// run is traced, the MoE router's counters (their aux-loss counts) and tensorwise FP8's last
// amaxes. Within a
// microbatch only the MoE router, once per MoE layer (its experts' row offsets, or with EP / ETP
// the dispatcher's gathered ones, at a capacity with each expert's copies before dropping; every
// router mode, sinkhorn and quantile balancing included, routes with kernels), twice where, at a
// capacity, the allgather dispatcher's routing map needs the rows before its gather: Megatron's
// token dispatcher waits there too for its data-dependent sizes. Everything else waits for nothing: FP8 in every recipe, context parallel
// in every cp_comm_type, recompute.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/backend/emulated_backend.h"
#include "engine/parallel/parallel_trainer.h"
#include "fake_recorder.h"
#include "parallel_test_util.h"

namespace ts::engine {
namespace {

using namespace ts::test;

struct Case {
    const char* name;
    Config c;
};

Config moeModel() {
    Config c = tinyConfig(2);
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.add_bias_linear = false;
    c.moe_aux_loss_coeff = 1e-2;
    return c;
}

std::vector<Case> cases() {
    std::vector<Case> v;
    v.push_back({"tp2 sp", spConfig(tinyConfig(2), SpLayout{2, 1, 1, 1, 3})});
    v.push_back({"pp2", withLayout(tinyConfig(), Layout{1, 2, 1, 1, 3})});
    {
        Config c = withLayout(tinyConfig(), Layout{1, 2, 2, 1, 4});
        c.overlap_p2p_comm = true;
        v.push_back({"pp2 vpp2", c});
    }
    {
        Config c = withLayout(tinyConfig(), Layout{1, 1, 1, 2, 3});
        c.use_distributed_optimizer = true;
        c.overlap_grad_reduce = true;
        c.overlap_param_gather = true;
        v.push_back({"dp2 distributed optimizer, overlapped", c});
    }
    for (const char* comm : {"p2p", "a2a"}) {
        Config c = withLayout(tinyConfig(), Layout{1, 1, 1, 1, 3});
        c.context_parallel_size = 2;
        c.cp_comm_type = comm;
        v.push_back({comm[0] == 'p' ? "cp2 p2p" : "cp2 a2a", c});
    }
    {
        Config c = spConfig(tinyConfig(2), SpLayout{2, 1, 1, 1, 3});
        c.bf16 = true;
        c.fp8 = "hybrid";
        v.push_back({"tp2 fp8 delayed scaling", c});
    }
    {
        Config c = spConfig(tinyConfig(2), SpLayout{2, 1, 1, 1, 3});
        c.bf16 = true;
        c.tp_comm_overlap = true;
        v.push_back({"tp2 bf16 tp_comm_overlap", c});
    }
    v.push_back({"ep2 alltoall", moeLayoutConfig(moeModel(), ExpertLayout{1, 1, 2, 2})});
    {
        ExpertLayout L{1, 1, 2, 2};
        L.dispatcher = "allgather";
        v.push_back({"ep2 allgather", moeLayoutConfig(moeModel(), L)});
    }
    v.push_back({"tp2 sp, expert tp2", moeLayoutConfig(moeModel(), ExpertLayout{2, 2, 1, 1})});
    const auto fp8 = [&](const char* name, const char* format, const char* recipe, Config c) {
        c.bf16 = true;
        c.fp8 = format;
        if (recipe) c.fp8_recipe = recipe;
        v.push_back({name, c});
    };
    fp8("tp2 fp8 tensorwise", "e4m3", "tensorwise", spConfig(tinyConfig(2), SpLayout{2, 1, 1, 1, 3}));
    Config wide = tinyConfig(2);
    wide.hidden_size = 128;  // the block recipes' blocks of 32 and 128 along the reduction dims
    fp8("tp2 mxfp8", "e4m3", "mxfp8", spConfig(wide, SpLayout{2, 1, 1, 1, 3}));
    fp8("dp2 blockwise", "e4m3", "blockwise", withLayout(wide, Layout{1, 1, 1, 2, 3}));
    {
        Config c = withLayout(tinyConfig(), Layout{1, 1, 1, 1, 3});
        c.context_parallel_size = 2;
        fp8("cp2 fp8 delayed scaling", "hybrid", nullptr, c);
    }
    fp8("ep2 fp8 tensorwise", "e4m3", "tensorwise", moeLayoutConfig(moeModel(), ExpertLayout{1, 1, 2, 2}));
    fp8("ep2 fp8 delayed scaling", "hybrid", nullptr, moeLayoutConfig(moeModel(), ExpertLayout{1, 1, 2, 2}));
    {
        Config c = moeModel();
        c.moe_router_score_function = "sigmoid";
        c.moe_router_enable_expert_bias = true;
        c.moe_aux_loss_coeff = 0;
        v.push_back({"ep2 expert bias", moeLayoutConfig(c, ExpertLayout{1, 1, 2, 2})});
    }
    {
        Config c = moeModel();
        c.moe_router_load_balancing_type = "quantile_balancing";
        c.moe_aux_loss_coeff = 0;
        v.push_back({"ep2 quantile balancing", moeLayoutConfig(c, ExpertLayout{1, 1, 2, 2})});
        // the logits gathered over tp for the quantiles, no dispatcher's wait
        v.push_back({"tp2 quantile balancing", moeLayoutConfig(c, ExpertLayout{2, 1, 1, 1})});
        c.moe_router_load_balancing_type = "sinkhorn";
        v.push_back({"ep2 sinkhorn", moeLayoutConfig(c, ExpertLayout{1, 1, 2, 2})});
    }
    {
        // (moeLayoutConfig sets the capacity from the layout)
        ExpertLayout L{1, 1, 2, 2};
        L.capacity = 1.0;
        L.pad = true;
        v.push_back({"ep2 capacity, padded", moeLayoutConfig(moeModel(), L)});
        L.capacity = 0.5;  // tokens dropped: rows past the kept ones
        L.pad = false;
        v.push_back({"ep2 capacity, dropping", moeLayoutConfig(moeModel(), L)});
        ExpertLayout etp = L;
        etp.etp = 2;
        etp.dp = 4;
        v.push_back({"ep2 etp2 dp4 capacity, dropping", moeLayoutConfig(moeModel(), etp)});
        L.dispatcher = "allgather";
        v.push_back({"ep2 capacity, dropping, allgather", moeLayoutConfig(moeModel(), L)});
    }
    {
        Config c = moeModel();
        c.moe_router_load_balancing_type = "global_aux_loss";
        v.push_back({"dp2 global_aux_loss", moeLayoutConfig(c, ExpertLayout{1, 1, 1, 2})});
    }
    {
        Config c = moeModel();
        c.moe_shared_expert_intermediate_size = 32;
        c.moe_shared_expert_overlap = true;
        v.push_back({"ep2 shared experts, overlapped", moeLayoutConfig(c, ExpertLayout{1, 1, 2, 2})});
    }
    {
        Config c = withLayout(tinyConfig(), Layout{1, 2, 1, 2, 3});
        c.recompute_granularity = "full";
        c.recompute_method = "uniform";
        c.recompute_num_layers = 1;
        c.hidden_dropout = 0.1;
        v.push_back({"pp2 dp2 full recompute, dropout", c});
    }
    {
        Config c = withLayout(tinyConfig(), Layout{1, 1, 1, 1, 3});
        c.context_parallel_size = 2;
        c.cp_comm_type = "all_gather";
        v.push_back({"cp2 all_gather", c});
    }
    {
        Config c = withLayout(tinyConfig(), Layout{1, 1, 1, 1, 3});
        c.context_parallel_size = 4;
        c.cp_comm_type = "a2a+p2p";
        c.hierarchical_context_parallel_sizes = {2, 2};
        v.push_back({"cp4 a2a+p2p", c});
    }
    return v;
}

TEST(EmulatedDeviceWaits, OnlyTheRouterWaitsWithinAMicrobatch) {
    const int steps = 2;
    for (const Case& k : cases()) {
        ParallelTrainerOptions o;
        o.emulateDevice = true;
        o.hostSyncCollectives = false;  // the GPU's asynchronous collectives, whatever the environment
        FakeRecorder rec;  // traced: the MoE router's counters are read back once per step
        auto t = ParallelTrainer::create(k.c, &rec, o);
        ASSERT_TRUE(t.isOk()) << k.name << ": " << t.status().toString();
        for (int s = 0; s < steps; ++s) {
            StepProgress p;
            ASSERT_TRUE((*t)->step(&p).isOk()) << k.name;
        }
        const bool moe = k.c.num_moe_experts > 0;
        // Each rank's microbatches, times its layers, times their forwards: an upper bound of the
        // router's waits of each kind.
        const int64_t routings = int64_t(steps) * k.c.num_microbatches * k.c.num_layers;
        const std::set<std::string> perStep = {"optimizer.clip",         "loss_reduce",
                                               "fp8_scale_update",       "fp8_expert_scale_update",
                                               "moe.expert_bias_update", "moe.qb_beta_update",
                                               "moe.router_stats_read", "fp8_counters",  "fp8_expert_counters"};
        const std::set<std::string> router = {"router.topk_permute", "moe.dispatch_counts", "moe.allgather_routing"};
        // The router's waits per MoE layer and microbatch: one (the kernels route in every mode, and
        // the host reads back the offsets, or with EP / ETP the dispatcher's gathered ones, at a
        // capacity with the copies before dropping); two where, at a capacity, the allgather
        // dispatcher needs the rows before it gathers.
        const bool readsRowsFirst = k.c.moe_expert_capacity_factor > 0 && k.c.moe_token_dispatcher_type == "allgather";
        const int etp = k.c.expert_tensor_parallel_size > 0 ? k.c.expert_tensor_parallel_size
                                                            : k.c.tensor_model_parallel_size;
        const bool dispatched = k.c.expert_model_parallel_size > 1 || etp > 1;
        const int64_t routerWaits = moe ? routings * (readsRowsFirst && dispatched ? 2 : 1) : 0;
        for (const auto& [rank, dev] : (*t)->localDevices()) {
            const auto waits = emulatedHostWaits(const_cast<Device&>(*dev));
            EXPECT_EQ(waits.count("optimizer.clip"), 1u) << k.name << ", rank " << rank << ": the norm is read once";
            const bool lastStage = (*t)->layout().coordsOf(rank).pp == k.c.pipeline_model_parallel_size - 1;
            EXPECT_EQ(waits.count("loss_reduce"), lastStage ? 1u : 0u)
                << k.name << ", rank " << rank << ": the last stage reads its losses back";
            EXPECT_EQ(waits.count("moe.router_stats_read"), moe ? 1u : 0u)
                << k.name << ", rank " << rank << ": the router's counts and statistics are read back for the trace";
            int64_t routerSum = 0;
            for (const auto& [op, n] : waits) {
                if (perStep.count(op)) {
                    EXPECT_EQ(n, steps) << k.name << ", rank " << rank << ": " << op << " should wait once per step";
                } else if (moe && router.count(op)) {
                    routerSum += n;
                } else {
                    ADD_FAILURE() << k.name << ", rank " << rank << ": op " << op << " waited for the device " << n
                                  << " times";
                }
            }
            EXPECT_EQ(routerSum, routerWaits) << k.name << ", rank " << rank << ": the router's waits";
        }
    }
}

}  // namespace
}  // namespace ts::engine
