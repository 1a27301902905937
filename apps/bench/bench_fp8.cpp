// bench_fp8: the CPU step time of the bench "tiny"/"small" GPT in bf16 and with FP8 linears
// (e4m3 / hybrid x delayed / tensorwise, e4m3 mxfp8 / blockwise). FP8 is emulated on the CPU (quantize + dequantize
// around fp32 GEMMs), so it costs time here where a GPU's FP8 GEMM saves it: the number is
// the emulation's overhead, reported as it is (no target). Prints a table and one JSON line.
//
// usage: bench_fp8 [--config tiny|small] [--steps N] [--warmup N] [--threads N]
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
    const char* usage = "usage: bench_fp8 [--config tiny|small] [--steps N] [--warmup N] [--threads N]";
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
        const char *name, *fp8, *recipe;
    };
    const Variant variants[] = {{"bf16", "", "delayed"},
                                {"e4m3_delayed", "e4m3", "delayed"},
                                {"hybrid_delayed", "hybrid", "delayed"},
                                {"e4m3_tensorwise", "e4m3", "tensorwise"},
                                {"hybrid_tensorwise", "hybrid", "tensorwise"},
                                {"e4m3_mxfp8", "e4m3", "mxfp8"},
                                {"e4m3_blockwise", "e4m3", "blockwise"}};
    nlohmann::json out = {{"bench", "fp8"}, {"config", config}, {"threads", threads}, {"steps", steps}};
    std::printf("%-18s %12s %10s %10s\n", "variant", "step ms", "vs bf16", "loss");
    double base = 0;
    for (const Variant& v : variants) {
        Config c = ts::bench::benchConfig(config);
        c.bf16 = true;
        c.fp8 = v.fp8;
        c.fp8_recipe = v.recipe;
        auto run = ts::bench::timeSteps(c, steps, warmup, threads);
        if (!run) {
            std::fprintf(stderr, "%s: %s\n", argv[0], run.status().toString().c_str());
            return 1;
        }
        const double med = run->medianS, loss = run->loss;
        if (base == 0) base = med;
        std::printf("%-18s %12.2f %9.2fx %10.4f\n", v.name, med * 1e3, med / base, loss);
        out[v.name] = {{"step_ms", med * 1e3}, {"vs_bf16", med / base}, {"loss", loss}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
