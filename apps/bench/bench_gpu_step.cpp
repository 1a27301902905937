// bench_gpu_step: the GPU speed check. Trains a GPT on GPU 0 through the single-device
// trainer (device_backend: cuda) and prints the median step time, tokens/s, achieved
// model TFLOP/s (Megatron's formula) and MFU against the device's bf16 peak
// (resources/peak_flops.json), then one JSON line. Configs: 1b (the issue's ~1.3B GPT: hidden
// 2048, 24 layers, 16 heads, seq 2048, micro-batch 1, bf16; target MFU >= 45% on an H100) and
// small (hidden 1024, 8 layers, seq 1024: a quick look). --fp8 hybrid|e4m3 adds FP8 (delayed
// scaling unless --fp8-recipe says tensorwise, mxfp8 or blockwise; the target: FP8 step
// >= 1.3x bf16; TS_CUDA_FP8_GEMMS=1 multiplies delayed and tensorwise scaling's codes on the FP8
// tensor cores, and the line says how many GEMMs per step did). --trace 1 then runs as many steps again
// traced as `trainscope run` traces (the engine's recorder plus the CUPTI capture, flushed every
// step) and reports the overhead against the untraced steps (the target: <= 3%); --trace
// engine the same with the engine's recorder alone (no CUPTI), which splits that overhead into
// the host's recording of each launch and CUPTI's share. Without
// a GPU it says why and exits 1. --attention sets attention_backend (auto, flash attention, the
// default; unfused keeps the probabilities): the peak device memory is printed with the step.
//
// usage: bench_gpu_step [--config 1b|small] [--steps N] [--warmup N] [--fp8 ""|hybrid|e4m3]
//                       [--fp8-recipe delayed|tensorwise|mxfp8|blockwise] [--micro-batch N]
//                       [--trace 0|1|engine] [--attention auto|unfused]
//                       [--cuda-graph none|full_iteration]
// --cuda-graph full_iteration: the step's forward and backward as one CUDA graph (captured at the
// second step, cuda_graph_warmup_steps 1, launched from then on: docs/engine.md "CUDA graphs"); the
// untimed warm-up covers the capture.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "apps/trainscope/gpu_capture.h"
#include "common/clock.h"
#include "engine/backend/backend.h"
#include "engine/train/trainer.h"
#include "profiler/store.h"

#ifdef TS_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

namespace {

using namespace ts::engine;

constexpr const char* kUsage =
    "usage: bench_gpu_step [--config 1b|small] [--steps N] [--warmup N] [--fp8 \"\"|hybrid|e4m3] "
    "[--fp8-recipe delayed|tensorwise|mxfp8|blockwise] [--micro-batch N] "
    "[--trace 0|1|engine] [--attention auto|unfused] [--cuda-graph none|full_iteration]";

using ts::bench::median;

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
    std::string config = "1b", fp8, recipe = "delayed", attention = "auto", graph = "none";
    int steps = 10, warmup = 3, microBatch = 0;
    bool trace = false, cupti = true;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--config") config = v;
        else if (a == "--steps") steps = std::max(1, std::stoi(v));
        else if (a == "--warmup") warmup = std::max(0, std::stoi(v));
        else if (a == "--fp8") fp8 = v;
        else if (a == "--fp8-recipe") recipe = v;
        else if (a == "--micro-batch") microBatch = std::stoi(v);
        else if (a == "--trace") {
            if (v != "0" && v != "1" && v != "engine") {
                std::fprintf(stderr, "--trace %s: use 0, 1 or engine\n%s\n", v.c_str(), kUsage);
                return 2;
            }
            trace = v != "0";
            cupti = v != "engine";
        }
        else if (a == "--attention") attention = v;
        else if (a == "--cuda-graph") graph = v;
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
    c.fp8_recipe = recipe;  // the trainer's validation names a wrong one
    c.attention_backend = attention;
    c.cuda_graph_impl = graph;  // the trainer names what a graph cannot run
    if (graph != "none") {  // one eager step, then the capture: neither is timed
        c.cuda_graph_warmup_steps = 1;
        warmup = std::max(warmup, 2);
    }
    if (microBatch > 0) c.micro_batch_size = microBatch;
    TrainerOptions o;
    o.emulateDevice = false;
    auto backend = makeCudaBackend();
    if (!backend) {
        std::fprintf(stderr, "bench_gpu_step: %s\n", backend.status().toString().c_str());
        return 1;
    }
    Device& device = (*backend)->device(0);
    auto stream = device.createStream(ts::trace::TrackKind::Compute, "compute");
    auto t = Trainer::create(c, &device, stream.get(), nullptr, o);
    if (!t) {
        std::fprintf(stderr, "bench_gpu_step: %s\n", t.status().toString().c_str());
        return 1;
    }
    const DeviceInfo& dev = device.info();
    double loss = 0;
    // n steps; their step times and wall times (step plus what `after` does, e.g. a capture flush).
    auto run = [&](int n, std::vector<double>* stepTimes, std::vector<double>* walls,
                   const std::function<void()>& after) -> bool {
        for (int s = 0; s < n; ++s) {
            const int64_t t0 = ts::monotonicNs();
            StepProgress p;
            const ts::Status st = (*t)->step(&p);
            if (!st) {
                std::fprintf(stderr, "bench_gpu_step: step %d: %s\n", (*t)->iteration() + 1, st.toString().c_str());
                return false;
            }
            if (after) after();
            if (stepTimes) stepTimes->push_back(p.stepTimeS);
            if (walls) walls->push_back(double(ts::monotonicNs() - t0) * 1e-9);
            loss = p.loss;
        }
        return true;
    };
    std::vector<double> times, walls;
    if (!run(warmup, nullptr, nullptr, {})) return 1;
#ifdef TS_HAVE_CUDA
    const int64_t fp8GemmsBefore = ts::kernels::cuda::fp8GemmCount();
#endif
    if (!run(steps, &times, &walls, {})) return 1;
    // GEMMs per step on the FP8 tensor cores (TS_CUDA_FP8_GEMMS): 0 says none qualified.
#ifdef TS_HAVE_CUDA
    const double fp8GemmsPerStep = double(ts::kernels::cuda::fp8GemmCount() - fp8GemmsBefore) / std::max(steps, 1);
#else
    const double fp8GemmsPerStep = 0;
#endif
    const double med = median(times);
    const double peakGiB = double(device.memoryStats().peakTotal) / double(1 << 30);
    // Traced: the engine's trace into a run store plus the CUPTI capture, as `trainscope run` does.
    double tracedMed = 0, tracedWall = 0;
    std::string captureNote;
    if (trace) {
        // The recorder `trainscope run` uses (per-thread buffers, a writer thread), into a scratch
        // run file, committed after every step as run does.
        const std::string path = "/tmp/bench_gpu_step_" + std::to_string(::getpid()) + ".tsrun";
        auto rec = ts::profiler::CaptureRecorder::create(path);
        if (!rec) {
            std::fprintf(stderr, "bench_gpu_step: %s\n", rec.status().toString().c_str());
            return 1;
        }
        device.setTrace(rec->get(), 0);
        std::unique_ptr<ts::cli::GpuCapture> capture;
        if (cupti) capture = ts::cli::GpuCapture::start(**rec, {{0, &device}}, &captureNote);
        else captureNote = "--trace engine";
        auto flush = [&] {
            if (capture) (void)capture->flush();
            (void)(*rec)->flush();
        };
        std::vector<double> tt, tw;
        const bool ok = run(1, nullptr, nullptr, flush) && run(steps, &tt, &tw, flush);
        if (capture) (void)capture->stop();
        device.setTrace(nullptr, 0);
        (void)(*rec)->close();
        std::remove(path.c_str());
        if (!ok) return 1;
        tracedMed = median(tt);
        tracedWall = median(tw);
    }
    // The experiments of kernels/cuda/ops_cuda.h the run had on: flash attention by the tiled
    // kernels (TS_CUDA_FLASH_TILES), bf16 GEMMs on fp32 operands (TS_CUDA_GEMM_FAST_16BF), FP8
    // GEMMs on FP8 codes (TS_CUDA_FP8_GEMMS).
#ifdef TS_HAVE_CUDA
    const bool flashTiles = ts::kernels::cuda::flashTiles(), fast16bf = ts::kernels::cuda::fast16bfGemms();
    const bool fp8Gemms = ts::kernels::cuda::fp8Gemms();
#else
    const bool flashTiles = false, fast16bf = false, fp8Gemms = false;
#endif
    char fp8Shown[64] = "";
    if (fp8Gemms) std::snprintf(fp8Shown, sizeof fp8Shown, "; FP8 GEMMs, %.0f per step", fp8GemmsPerStep);
    const std::string attentionShown = attention + (flashTiles ? ", tiled flash kernels" : "") +
                                       (fast16bf ? "; GEMMs FAST_16BF" : "") + fp8Shown;
    const double tokens = double(c.micro_batch_size) * c.seq_length;
    const double tflops = (*t)->modelFlopsPerStep() / med / 1e12;
    const double peak = dev.peakTflopsBf16;
    const double mfu = peak > 0 ? tflops / peak : 0;
    std::printf("%s on %s (%s%s, attention %s): median step %.1f ms, %.0f tokens/s, %.1f model TFLOP/s, MFU %.1f%% "
                "of %.0f bf16 TFLOP/s; peak memory %.2f GiB; loss %.4f (%lld parameters)\n",
                config.c_str(), dev.name.c_str(), c.bf16 ? "bf16" : "fp32", fp8.empty() ? "" : (", fp8 " + fp8 + " " + recipe).c_str(),
                attentionShown.c_str(), med * 1e3, tokens / med, tflops, 100 * mfu, peak, peakGiB, loss,
                (long long)(*t)->model().params().numel());
    const double untracedWall = median(walls);
    if (trace)
        std::printf("traced (engine trace + %s): median step %.1f ms (%+.2f%%), wall per step with the flush %.1f ms "
                    "(%+.2f%%)\n",
                    captureNote.empty() ? "CUPTI capture" : ("no CUPTI capture: " + captureNote).c_str(), tracedMed * 1e3,
                    100 * (tracedMed / med - 1), tracedWall * 1e3, 100 * (tracedWall / untracedWall - 1));
    std::printf("%s\n", nlohmann::json{{"bench", "bench_gpu_step"},
                                       {"config", config},
                                       {"device", dev.name},
                                       {"fp8", fp8},
                                       {"fp8_recipe", fp8.empty() ? "" : recipe},
                                       {"attention_backend", attention},
                                       {"cuda_graph_impl", graph},
                                       {"flash_tiles", flashTiles},
                                       {"gemm_fast_16bf", fast16bf},
                                       {"fp8_gemms", fp8Gemms},
                                       {"fp8_gemms_per_step", fp8GemmsPerStep},
                                       {"peak_memory_bytes", device.memoryStats().peakTotal},
                                       {"micro_batch_size", c.micro_batch_size},
                                       {"steps", steps},
                                       {"median_step_s", med},
                                       {"min_step_s", times.front()},
                                       {"tokens_per_s", tokens / med},
                                       {"model_flops_per_step", (*t)->modelFlopsPerStep()},
                                       {"model_tflops", tflops},
                                       {"peak_bf16_tflops", peak},
                                       {"mfu", mfu},
                                       {"loss", loss},
                                       {"traced", trace},
                                       {"trace_mode", !trace ? "off" : cupti ? "engine+cupti" : "engine"},
                                       {"cupti", trace && captureNote.empty()},
                                       {"traced_median_step_s", tracedMed},
                                       {"trace_overhead", trace ? tracedMed / med - 1 : 0.0},
                                       {"trace_overhead_wall", trace ? tracedWall / untracedWall - 1 : 0.0}}
                            .dump()
                            .c_str());
    return 0;
}
