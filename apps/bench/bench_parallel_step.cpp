// bench_parallel_step: step time of the tiny and small GPT configs (as bench_step: fp32, tied
// embedding, GeLU 4h, synthetic data) with the same global batch of 16 sequences run as
//   dp=1 on one device (1 and 2 GEMM threads), and
//   dp=2 through the parallel engine (2 rank threads x 1 GEMM thread), overlap_grad_reduce
//   off (one bucket reduced after backward) and on (buckets of ~1/4 of the grads launched
//   from backward), without and with the distributed optimizer.
// Prints median step time, tokens/s and the speed-up over dp=1 with 1 thread, then one JSON
// line. On a 2-core machine dp=2 competes with itself for the cores: it shows the cost and
// overlap of the DP machinery more than a scaling win.
// --tp-overlap 1 instead runs tp=2 with sequence_parallel, tp_comm_overlap off and on (the
// speed-up column is then relative to overlap off).
//
// usage: bench_parallel_step [--steps N] [--warmup N] [--configs tiny,small] [--tp-overlap 0|1]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "apps/bench/bench_common.h"
#include "engine/parallel/parallel_trainer.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"

namespace {

using ts::bench::benchConfig;
using ts::bench::split;

using namespace ts::engine;

struct Variant {
    std::string label;
    int dp = 1;
    int threads = 1;  // dp = 1 only
    bool overlap = false;
    bool distOpt = false;
    int tp = 1;
    bool tpCommOverlap = false;
};

// Median / min step time over `steps` measured steps, or a negative value on error.
template <typename T>
bool timeSteps(T& trainer, int warmup, int steps, std::vector<double>& times) {
    for (int s = 0; s < warmup + steps; ++s) {
        StepProgress p;
        const ts::Status st = trainer.step(&p);
        if (!st) {
            std::fprintf(stderr, "bench_parallel_step: %s\n", st.toString().c_str());
            return false;
        }
        if (s >= warmup) times.push_back(p.stepTimeS);
    }
    std::sort(times.begin(), times.end());
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 6, warmup = 2;
    std::vector<std::string> configs = {"tiny", "small"};
    bool tpOverlapMode = false;
    if (const int rc = ts::bench::checkArgs(argc, argv, "usage: bench_parallel_step [--steps N] [--warmup N] [--configs tiny,small] [--tp-overlap 0|1]"); rc >= 0) return rc;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--steps") steps = std::max(1, std::stoi(v));
        else if (a == "--warmup") warmup = std::max(0, std::stoi(v));
        else if (a == "--configs") configs = split(v);
        else if (a == "--tp-overlap") tpOverlapMode = v != "0";
        else {
            std::fprintf(stderr, "unknown option %s\n", a.c_str());
            return 2;
        }
    }
    std::vector<Variant> variants = {
        {"dp1 thr1", 1, 1, false, false},
        {"dp1 thr2", 1, 2, false, false},
        {"dp2 no-overlap", 2, 1, false, false},
        {"dp2 overlap", 2, 1, true, false},
        {"dp2 distopt no-overlap", 2, 1, false, true},
        {"dp2 distopt overlap", 2, 1, true, true},
    };
    if (tpOverlapMode)
        variants = {
            {"tp2 sp", 1, 1, false, false, 2, false},
            {"tp2 sp tp_comm_overlap", 1, 1, false, false, 2, true},
        };
    nlohmann::json results = nlohmann::json::array();
    std::printf("%-6s %-24s %8s %12s %12s %12s %8s\n", "config", "variant", "buckets", "median_ms", "min_ms",
                "tokens/s", "speedup");
    for (const std::string& name : configs) {
        double base = 0;
        for (const Variant& v : variants) {
            Config c = benchConfig(name);
            const int globalSeqs = 16;
            c.data_parallel_size = v.dp;
            c.num_microbatches = globalSeqs / (c.micro_batch_size * v.dp);
            c.global_batch_size = globalSeqs;
            c.overlap_grad_reduce = v.overlap;
            c.use_distributed_optimizer = v.distOpt;
            c.tensor_model_parallel_size = v.tp;
            c.sequence_parallel = v.tp > 1;
            c.tp_comm_overlap = v.tpCommOverlap;
            std::vector<double> times;
            int buckets = 1;
            if (v.dp == 1 && v.tp == 1) {
                c.cpu_threads = v.threads;
                auto t = Trainer::create(c);
                if (!t) {
                    std::fprintf(stderr, "bench_parallel_step: %s\n", t.status().toString().c_str());
                    return 1;
                }
                ts::kernels::cpu::setNumThreads(v.threads);
                if (!timeSteps(**t, warmup, steps, times)) return 1;
            } else {
                if (v.overlap) {
                    // ~4 buckets: the grads of ~one layer each.
                    auto probe = ParallelTrainer::create(c);
                    if (!probe) {
                        std::fprintf(stderr, "bench_parallel_step: %s\n", probe.status().toString().c_str());
                        return 1;
                    }
                    c.bucket_size = std::max<int64_t>(1, (*probe)->gradSync(0, 0).layout().numel / 4);
                }
                auto t = ParallelTrainer::create(c);
                if (!t) {
                    std::fprintf(stderr, "bench_parallel_step: %s\n", t.status().toString().c_str());
                    return 1;
                }
                buckets = int((*t)->gradSync(0, 0).layout().buckets.size());
                if (!timeSteps(**t, warmup, steps, times)) return 1;
            }
            const double med = times[times.size() / 2];
            if (base == 0) base = med;
            const double tokens = double(globalSeqs) * c.seq_length;
            std::printf("%-6s %-24s %8d %12.2f %12.2f %12.0f %7.2fx\n", name.c_str(), v.label.c_str(), buckets,
                        med * 1e3, times.front() * 1e3, tokens / med, base / med);
            std::fflush(stdout);
            results.push_back({{"config", name},
                               {"variant", v.label},
                               {"dp", v.dp},
                               {"tp", v.tp},
                               {"sequence_parallel", v.tp > 1},
                               {"tp_comm_overlap", v.tpCommOverlap},
                               {"gemm_threads_per_rank", v.dp == 1 && v.tp == 1 ? v.threads : 1},
                               {"overlap_grad_reduce", v.overlap},
                               {"use_distributed_optimizer", v.distOpt},
                               {"buckets", buckets},
                               {"median_step_s", med},
                               {"min_step_s", times.front()},
                               {"tokens_per_s", tokens / med},
                               {tpOverlapMode ? "speedup_vs_tp_comm_overlap_off" : "speedup_vs_dp1_thr1", base / med}});
        }
    }
    // The machine may be shared: the 1-minute load average says how much the numbers mean.
    double load[1] = {-1};
    if (getloadavg(load, 1) != 1) load[0] = -1;
    std::printf("load average (1 min): %.2f\n", load[0]);
    std::printf("%s\n",
                nlohmann::json{{"bench", "bench_parallel_step"}, {"steps", steps}, {"global_batch_seqs", 16},
                               {"load_avg_1min", load[0]}, {"results", results}}
                    .dump()
                    .c_str());
    return 0;
}
