// bench_cp: context parallelism at a long sequence: one step of a small GPT at seq 4096 on one
// device (cp=1) and on 2 ranks with context_parallel_size 2 (cp_comm_type all_gather, the one
// the engine executes). Prints step time, peak activation memory per rank and the CP
// collectives' time (all exposed: the all-gather variant does not overlap), then a JSON line.
// The cp=1 run uses the tuned causal-attention kernel, the CP ranks the straightforward CP kernel
// (kernels/cpu/attention_cp.cpp), so the time comparison is not like for like; the memory is.
//
// usage: bench_cp [--seq N] [--steps N]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "engine/parallel/parallel_trainer.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"

using namespace ts::engine;

int main(int argc, char** argv) {
    const char* usage = "usage: bench_cp [--seq N] [--steps N]";
    if (int rc = ts::bench::checkArgs(argc, argv, usage); rc >= 0) return rc;
    int seq = 4096, steps = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i];
        if (k == "--seq") seq = std::stoi(argv[i + 1]);
        else if (k == "--steps") steps = std::max(1, std::stoi(argv[i + 1]));
        else {
            std::fprintf(stderr, "unknown option %s\n%s\n", k.c_str(), usage);
            return 2;
        }
    }
    Config c;
    c.num_layers = 1;
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.seq_length = seq;
    c.vocab_size = 256;
    c.micro_batch_size = 1;
    c.num_microbatches = 1;
    c.data_path = "synthetic";
    c.position_embedding_type = "rope";
    c.hidden_dropout = c.attention_dropout = 0;
    c.train_iters = 1000;
    c.cpu_threads = 1;
    c.cp_comm_type = "all_gather";
    nlohmann::json out = {{"bench", "cp"}, {"seq", seq}, {"steps", steps}};
    std::printf("%-6s %12s %22s\n", "layout", "step ms", "peak activations MiB");
    for (int cp : {1, 2}) {
        Config cc = c;
        cc.context_parallel_size = cp;
        std::vector<double> times;
        double act = 0;
        auto record = [&](const StepProgress& p) {
            times.push_back(p.stepTimeS);
            act = std::max(act, double(p.peakMemoryByCategory[size_t(ts::trace::MemCategory::Activations)]));
        };
        if (cp == 1) {
            auto t = Trainer::create(cc);
            if (!t) return std::fprintf(stderr, "bench_cp: %s\n", t.status().toString().c_str()), 1;
            for (int s = 0; s < steps; ++s) {
                StepProgress p;
                if (auto st = (*t)->step(&p); !st) return std::fprintf(stderr, "bench_cp: %s\n", st.toString().c_str()), 1;
                record(p);
            }
        } else {
            auto t = ParallelTrainer::create(cc);
            if (!t) return std::fprintf(stderr, "bench_cp: %s\n", t.status().toString().c_str()), 1;
            for (int s = 0; s < steps; ++s) {
                StepProgress p;
                if (auto st = (*t)->step(&p); !st) return std::fprintf(stderr, "bench_cp: %s\n", st.toString().c_str()), 1;
                record(p);
            }
        }
        std::sort(times.begin(), times.end());
        const double med = times[times.size() / 2];
        std::printf("cp%-4d %12.1f %22.1f\n", cp, med * 1e3, act / (1 << 20));
        out["cp" + std::to_string(cp)] = {{"step_ms", med * 1e3}, {"peak_activations_bytes", act}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
