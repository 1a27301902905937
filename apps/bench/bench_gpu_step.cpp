// bench_gpu_step: the GPU speed check. Trains a GPT on GPU 0 through the single-device
// trainer (device_backend: cuda, TrainerOptions::allowUnverifiedCuda: the engine has not yet been
// checked against the CPU backend on a GPU) and prints the median step time, tokens/s, achieved
// model TFLOP/s (Megatron's formula) and MFU against the device's bf16 peak
// (resources/peak_flops.json), then one JSON line. Configs: 1b (the issue's ~1.3B GPT: hidden
// 2048, 24 layers, 16 heads, seq 2048, micro-batch 1, bf16; target MFU >= 45% on an H100) and
// small (hidden 1024, 8 layers, seq 1024: a quick look). --fp8 hybrid|e4m3 adds FP8 (delayed
// scaling; the target: FP8 step >= 1.3x bf16). Without a GPU it says why and exits 1.
//
// usage: bench_gpu_step [--config 1b|small] [--steps N] [--warmup N] [--fp8 ""|hybrid|e4m3]
//                       [--micro-batch N]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "engine/backend/backend.h"
#include "engine/train/trainer.h"

namespace {

using namespace ts::engine;

constexpr const char* kUsage =
    "usage: bench_gpu_step [--config 1b|small] [--steps N] [--warmup N] [--fp8 \"\"|hybrid|e4m3] [--micro-batch N]";

Config gpuConfig(const std::string& name) {
    Config c;
    if (name == "1b") {
        c.hidden_size = 2048;
        c.num_layers = 24;
        c.num_attention_heads = 16;
        c.seq_length = 2048;
    } else {
        c.hidden_size = 1024;
        c.num_layers = 8;
        c.num_attention_heads = 16;
        c.seq_length = 1024;
    }
    c.vocab_size = 50304;
    c.micro_batch_size = 1;
    c.bf16 = true;
    c.position_embedding_type = "rope";
    c.hidden_dropout = 0;
    c.attention_dropout = 0;
    c.data_path = "synthetic";
    c.lr = 1e-4;
    c.lr_decay_style = "constant";
    c.train_iters = 1000000;
    c.device_backend = "cuda";
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    if (int rc = ts::bench::checkArgs(argc, argv, kUsage); rc >= 0) return rc;
    std::string config = "1b", fp8;
    int steps = 10, warmup = 3, microBatch = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--config") config = v;
        else if (a == "--steps") steps = std::max(1, std::stoi(v));
        else if (a == "--warmup") warmup = std::max(0, std::stoi(v));
        else if (a == "--fp8") fp8 = v;
        else if (a == "--micro-batch") microBatch = std::stoi(v);
        else {
            std::fprintf(stderr, "unknown option %s\n%s\n", a.c_str(), kUsage);
            return 2;
        }
    }
    if (config != "1b" && config != "small") {
        std::fprintf(stderr, "--config %s: use 1b or small\n", config.c_str());
        return 2;
    }
    Config c = gpuConfig(config);
    c.fp8 = fp8;
    if (microBatch > 0) c.micro_batch_size = microBatch;
    TrainerOptions o;
    o.emulateDevice = false;
    o.allowUnverifiedCuda = true;
    auto t = Trainer::create(c, nullptr, nullptr, nullptr, o);
    if (!t) {
        std::fprintf(stderr, "bench_gpu_step: %s\n", t.status().toString().c_str());
        return 1;
    }
    const DeviceInfo& dev = (*t)->model().exec().device().info();
    std::vector<double> times;
    double loss = 0;
    for (int s = 0; s < warmup + steps; ++s) {
        StepProgress p;
        const ts::Status st = (*t)->step(&p);
        if (!st) {
            std::fprintf(stderr, "bench_gpu_step: step %d: %s\n", s + 1, st.toString().c_str());
            return 1;
        }
        if (s >= warmup) times.push_back(p.stepTimeS);
        loss = p.loss;
    }
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2];
    const double tokens = double(c.micro_batch_size) * c.seq_length;
    const double tflops = (*t)->modelFlopsPerStep() / med / 1e12;
    const double peak = dev.peakTflopsBf16;
    const double mfu = peak > 0 ? tflops / peak : 0;
    std::printf("%s on %s (%s%s): median step %.1f ms, %.0f tokens/s, %.1f model TFLOP/s, MFU %.1f%% of %.0f "
                "bf16 TFLOP/s; loss %.4f (%lld parameters)\n",
                config.c_str(), dev.name.c_str(), c.bf16 ? "bf16" : "fp32", fp8.empty() ? "" : (", fp8 " + fp8).c_str(),
                med * 1e3, tokens / med, tflops, 100 * mfu, peak, loss, (long long)(*t)->model().params().numel());
    std::printf("%s\n", nlohmann::json{{"bench", "bench_gpu_step"},
                                       {"config", config},
                                       {"device", dev.name},
                                       {"fp8", fp8},
                                       {"micro_batch_size", c.micro_batch_size},
                                       {"steps", steps},
                                       {"median_step_s", med},
                                       {"min_step_s", times.front()},
                                       {"tokens_per_s", tokens / med},
                                       {"model_flops_per_step", (*t)->modelFlopsPerStep()},
                                       {"model_tflops", tflops},
                                       {"peak_bf16_tflops", peak},
                                       {"mfu", mfu},
                                       {"loss", loss}}
                            .dump()
                            .c_str());
    return 0;
}
