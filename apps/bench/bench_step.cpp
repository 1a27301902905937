// bench_step: one full training step (forward, backward, AdamW) of the tiny and small GPT
// configs on the CPU backend (fp32, tied embedding, GeLU 4h, micro-batch 8, synthetic data),
// for 1 and 2 threads, fused vs unfused. Prints median step time, tokens/s, achieved model
// GFLOP/s (Megatron formula) and its fraction of the measured sgemm peak, then one JSON line.
// Compare with apps/bench/bench_step_torch.py (same model in PyTorch).
//
// usage: bench_step [--steps N] [--warmup N] [--threads 1,2] [--configs tiny,small]
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/trainer.h"
#include "apps/bench/bench_common.h"
#include "kernels/cpu/ops.h"

namespace {

using ts::bench::benchConfig;
using ts::bench::split;

using namespace ts::engine;

void setFused(Config& c, bool on) {
    c.masked_softmax_fusion = c.bias_activation_fusion = c.bias_dropout_fusion = on;
    c.apply_rope_fusion = c.cross_entropy_loss_fusion = on;
    c.gradient_accumulation_fusion = c.persist_layer_norm = on;
}

// Process CPU seconds: with a loaded machine, CPU time is the load-independent measure
// for 1 thread (wall time is reported too).
double cpuSeconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 8, warmup = 2;
    std::vector<std::string> threadList = {"1", "2"}, configs = {"tiny", "small"};
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--steps") steps = std::max(1, std::stoi(v));
        else if (a == "--warmup") warmup = std::max(0, std::stoi(v));
        else if (a == "--threads") threadList = split(v);
        else if (a == "--configs") configs = split(v);
        else {
            std::fprintf(stderr, "unknown option %s\n", a.c_str());
            return 2;
        }
    }
    nlohmann::json results = nlohmann::json::array();
    std::printf("%-6s %-3s %-8s %12s %12s %12s %12s %10s %8s\n", "config", "thr", "path", "median_ms", "cpu_ms",
                "tokens/s", "GFLOP/s", "peak", "of_peak");
    for (const std::string& threadsText : threadList) {
        const int threads = std::stoi(threadsText);
        const double peak = ts::kernels::cpu::measureSgemmPeakGflops(threads);
        for (const std::string& name : configs) {
            for (bool fused : {true, false}) {
                Config c = benchConfig(name);
                setFused(c, fused);
                c.cpu_threads = threads;
                auto t = Trainer::create(c);
                if (!t) {
                    std::fprintf(stderr, "bench_step: %s\n", t.status().toString().c_str());
                    return 1;
                }
                ts::kernels::cpu::setNumThreads(threads);
                std::vector<double> times, cpu;
                for (int s = 0; s < warmup + steps; ++s) {
                    StepProgress p;
                    const double c0 = cpuSeconds();
                    const ts::Status st = (*t)->step(&p);
                    if (s >= warmup) cpu.push_back(cpuSeconds() - c0);
                    if (!st) {
                        std::fprintf(stderr, "bench_step: %s\n", st.toString().c_str());
                        return 1;
                    }
                    if (s >= warmup) times.push_back(p.stepTimeS);
                }
                std::sort(times.begin(), times.end());
                std::sort(cpu.begin(), cpu.end());
                const double med = times[times.size() / 2];
                const double medCpu = cpu[cpu.size() / 2];
                const double tokens = double(c.micro_batch_size) * c.seq_length;
                const double gflops = (*t)->modelFlopsPerStep() / med / 1e9;
                std::printf("%-6s %-3d %-8s %12.2f %12.2f %12.0f %12.2f %10.2f %7.1f%%\n", name.c_str(), threads,
                            fused ? "fused" : "unfused", med * 1e3, medCpu * 1e3, tokens / med, gflops, peak,
                            100 * gflops / peak);
                std::fflush(stdout);
                results.push_back({{"config", name},
                                   {"threads", threads},
                                   {"path", fused ? "fused" : "unfused"},
                                   {"median_step_s", med},
                                   {"min_step_s", times.front()},
                                   {"median_cpu_s", medCpu},
                                   {"tokens_per_s", tokens / med},
                                   {"model_flops_per_step", (*t)->modelFlopsPerStep()},
                                   {"gflops", gflops},
                                   {"sgemm_peak_gflops", peak},
                                   {"fraction_of_peak", gflops / peak}});
            }
        }
    }
    std::printf("%s\n", nlohmann::json{{"bench", "bench_step"}, {"steps", steps}, {"results", results}}.dump().c_str());
    return 0;
}
