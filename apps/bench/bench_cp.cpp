// bench_cp: context parallelism at a long sequence: steps of a small GPT at seq 4096 on one
// device (cp=1) and on 2 ranks with context_parallel_size 2 for each cp_comm_type (all_gather,
// p2p ring attention, a2a). Prints step time, peak activation memory per rank and, from the
// trace of the CP run, the time of the "cp" group's transfers on rank 0 and the share of it that
// compute overlapped (analysis commBreakdown: the same numbers `trainscope analyze` prints), then
// a JSON line.
// The cp=1 run uses the tuned causal-attention kernel; the all_gather and p2p ranks use the
// straightforward CP kernels (kernels/cpu/attention_cp.cpp) and a2a the tuned kernel on c times
// fewer heads, so the time comparison across variants is not like for like; the memory is.
//
// usage: bench_cp [--seq N] [--steps N]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "engine/parallel/parallel_trainer.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"
#include "profiler/analysis.h"
#include "profiler/store.h"

using namespace ts;
using namespace ts::engine;

namespace {

struct Measured {
    double stepMs = 0, activations = 0, cpNs = 0, cpOverlappedNs = 0;
};

Result<Measured> runOne(const Config& cc, int steps) {
    Measured m;
    std::vector<double> times;
    auto record = [&](const StepProgress& p) {
        times.push_back(p.stepTimeS);
        m.activations = std::max(m.activations, double(p.peakMemoryByCategory[size_t(trace::MemCategory::Activations)]));
    };
    if (cc.context_parallel_size == 1) {
        TS_ASSIGN_OR_RETURN(auto t, Trainer::create(cc));
        for (int s = 0; s < steps; ++s) {
            StepProgress p;
            TS_RETURN_IF_ERROR(t->step(&p));
            record(p);
        }
    } else {
        const std::string file = (std::filesystem::temp_directory_path() /
                                  ("bench_cp_" + std::to_string(::getpid()) + "_" + cc.cp_comm_type + ".sqlite"))
                                     .string();
        std::filesystem::remove(file);
        {
            TS_ASSIGN_OR_RETURN(auto rec, profiler::CaptureRecorder::create(file));
            {
                TS_ASSIGN_OR_RETURN(auto t, ParallelTrainer::create(cc, rec.get()));
                for (int s = 0; s < steps; ++s) {
                    StepProgress p;
                    TS_RETURN_IF_ERROR(t->step(&p));
                    record(p);
                }
            }
            TS_RETURN_IF_ERROR(rec->close());
        }
        TS_ASSIGN_OR_RETURN(auto store, profiler::TraceStore::open(file));
        TS_ASSIGN_OR_RETURN(auto groups, profiler::commBreakdown(*store, 0));
        for (const auto& g : groups)
            if (g.group == "cp") {
                m.cpNs += g.totalNs;
                m.cpOverlappedNs += g.overlappedNs;
            }
        store.reset();
        for (const char* ext : {"", "-wal", "-shm"}) std::filesystem::remove(file + ext);
    }
    std::sort(times.begin(), times.end());
    m.stepMs = times[times.size() / 2] * 1e3;
    return m;
}

}  // namespace

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
    nlohmann::json out = {{"bench", "cp"}, {"seq", seq}, {"steps", steps}};
    std::printf("%-14s %10s %22s %12s %14s\n", "layout", "step ms", "peak activations MiB", "cp comm ms",
                "cp overlapped");
    struct Variant {
        int cp;
        const char* comm;
    };
    for (const Variant v : {Variant{1, "p2p"}, Variant{2, "all_gather"}, Variant{2, "p2p"}, Variant{2, "a2a"}}) {
        Config cc = c;
        cc.context_parallel_size = v.cp;
        cc.cp_comm_type = v.comm;
        auto r = runOne(cc, steps);
        if (!r) return std::fprintf(stderr, "bench_cp: %s\n", r.status().toString().c_str()), 1;
        const std::string name = v.cp == 1 ? "cp1" : std::string("cp2_") + v.comm;
        const double share = r->cpNs > 0 ? r->cpOverlappedNs / r->cpNs : 0;
        std::printf("%-14s %10.1f %22.1f %12.2f %13.0f%%\n", name.c_str(), r->stepMs, r->activations / (1 << 20),
                    r->cpNs / 1e6 / steps, 100 * share);
        out[name] = {{"step_ms", r->stepMs},
                     {"peak_activations_bytes", r->activations},
                     {"cp_comm_ms_per_step", r->cpNs / 1e6 / steps},
                     {"cp_overlapped_share", share}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
}
