// bench_moe: the CPU step time of the bench "tiny"/"small" GPT with every MLP an MoE layer of 8
// experts, top-2 (expert hidden = ffn/2, so the routed FLOPs equal the dense MLP's), with the
// experts run as one grouped op (moe_grouped_gemm) or one op per expert, next to the dense
// model. Then the same MoE model on 2 ranks (dp 2) with expert_model_parallel_size 1 and 2: step
// time and, from the run's trace, the all-to-all time of the "ep" group on rank 0 and its share
// of the step (analysis commBreakdown). Prints tables and one JSON line.
//
// usage: bench_moe [--config tiny|small] [--steps N] [--warmup N] [--threads N]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "apps/bench/bench_common.h"
#include <filesystem>

#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/parallel/parallel_trainer.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"
#include "profiler/analysis.h"
#include "profiler/store.h"

using namespace ts;
using namespace ts::engine;

namespace {

struct EpRun {
    double stepMs = 0, a2aMs = 0, a2aExposedMs = 0;
};

// Median step of a 2-rank run and the "ep" group's communication per step on rank 0.
Result<EpRun> runEp(const Config& c, int steps) {
    const std::string file = (std::filesystem::temp_directory_path() /
                              ("bench_moe_" + std::to_string(::getpid()) + "_ep" +
                               std::to_string(c.expert_model_parallel_size) + "_" + c.moe_token_dispatcher_type + ".sqlite"))
                                 .string();
    std::filesystem::remove(file);
    std::vector<double> times;
    {
        TS_ASSIGN_OR_RETURN(auto rec, profiler::CaptureRecorder::create(file));
        {
            TS_ASSIGN_OR_RETURN(auto t, ParallelTrainer::create(c, rec.get()));
            for (int s = 0; s < steps; ++s) {
                StepProgress p;
                TS_RETURN_IF_ERROR(t->step(&p));
                times.push_back(p.stepTimeS);
            }
        }
        TS_RETURN_IF_ERROR(rec->close());
    }
    EpRun r;
    TS_ASSIGN_OR_RETURN(auto store, profiler::TraceStore::open(file));
    TS_ASSIGN_OR_RETURN(auto groups, profiler::commBreakdown(*store, 0));
    for (const auto& g : groups)
        if (g.group == "ep") {
            r.a2aMs += g.totalNs / 1e6 / steps;
            r.a2aExposedMs += g.exposedNs / 1e6 / steps;
        }
    store.reset();
    for (const char* ext : {"", "-wal", "-shm"}) std::filesystem::remove(file + ext);
    std::sort(times.begin(), times.end());
    r.stepMs = times[times.size() / 2] * 1e3;
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    const char* usage = "usage: bench_moe [--config tiny|small] [--steps N] [--warmup N] [--threads N]";
    if (int rc = ts::bench::checkArgs(argc, argv, usage); rc >= 0) return rc;
    std::string config = "tiny";
    int steps = 10, warmup = 2, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--config") config = v;
        else if (k == "--steps") steps = std::max(1, std::stoi(v));
        else if (k == "--warmup") warmup = std::max(0, std::stoi(v));
        else if (k == "--threads") threads = std::max(1, std::stoi(v));
        else {
            std::fprintf(stderr, "unknown option %s\n%s\n", k.c_str(), usage);
            return 2;
        }
    }
    struct Variant {
        const char* name;
        int experts;
        bool grouped;
    };
    const Variant variants[] = {{"dense", 0, false}, {"moe8_top2_grouped", 8, true}, {"moe8_top2_per_expert", 8, false}};
    nlohmann::json out = {{"bench", "moe"}, {"config", config}, {"threads", threads}, {"steps", steps}};
    std::printf("%-22s %12s %10s %10s\n", "variant", "step ms", "vs dense", "loss");
    double base = 0;
    for (const Variant& v : variants) {
        Config c = ts::bench::benchConfig(config);
        c.add_bias_linear = false;
        c.num_moe_experts = v.experts;
        c.moe_router_topk = 2;
        c.moe_grouped_gemm = v.grouped;
        c.moe_aux_loss_coeff = 0.01;
        c.moe_ffn_hidden_size = 2 * c.hidden_size;  // 4h / topk
        auto run = ts::bench::timeSteps(c, steps, warmup, threads);
        if (!run) {
            std::fprintf(stderr, "%s: %s\n", argv[0], run.status().toString().c_str());
            return 1;
        }
        const double med = run->medianS, loss = run->loss;
        if (base == 0) base = med;
        std::printf("%-22s %12.2f %9.2fx %10.4f\n", v.name, med * 1e3, med / base, loss);
        out[v.name] = {{"step_ms", med * 1e3}, {"vs_dense", med / base}, {"loss", loss}};
    }
    // Expert parallel on 2 ranks: the all-to-all's share of the step.
    std::printf("\n%-28s %12s %14s %14s %10s\n", "2 ranks, dp 2", "step ms", "ep comm ms", "ep exposed", "share");
    struct EpVariant {
        int ep;
        const char* dispatcher;
    };
    for (const EpVariant v : {EpVariant{1, "alltoall"}, EpVariant{2, "alltoall"}, EpVariant{2, "allgather"}}) {
        const int ep = v.ep;
        Config c = ts::bench::benchConfig(config);
        c.add_bias_linear = false;
        c.num_moe_experts = 8;
        c.moe_router_topk = 2;
        c.moe_grouped_gemm = true;
        c.moe_aux_loss_coeff = 0.01;
        c.moe_ffn_hidden_size = 2 * c.hidden_size;
        c.world_size = 2;
        c.data_parallel_size = 2;
        c.global_batch_size = 2 * c.micro_batch_size;
        c.expert_model_parallel_size = ep;
        c.moe_token_dispatcher_type = v.dispatcher;
        auto r = runEp(c, steps);
        if (!r) {
            std::fprintf(stderr, "%s: %s\n", argv[0], r.status().toString().c_str());
            return 1;
        }
        const std::string name = "moe8_top2_dp2_ep" + std::to_string(ep) + (ep > 1 ? std::string("_") + v.dispatcher : "");
        std::printf("%-28s %12.2f %14.2f %14.2f %9.1f%%\n", name.c_str(), r->stepMs, r->a2aMs, r->a2aExposedMs,
                    100.0 * r->a2aMs / r->stepMs);
        out[name] = {{"step_ms", r->stepMs}, {"ep_a2a_ms", r->a2aMs}, {"ep_a2a_exposed_ms", r->a2aExposedMs},
                     {"ep_a2a_share", r->a2aMs / r->stepMs}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
