// bench_moe: the CPU step time of the bench "tiny"/"small" GPT with every MLP an MoE layer of 8
// experts, top-2 (expert hidden = ffn/2, so the routed FLOPs equal the dense MLP's), with the
// experts run as one grouped op (moe_grouped_gemm) or one op per expert, next to the dense
// model. Expert parallelism is not executed yet, so there is no all-to-all to time. Prints a
// table and one JSON line.
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
#include "engine/backend/backend.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"

using namespace ts::engine;

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
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
