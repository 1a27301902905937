// bench_step: one full training step (forward, backward, AdamW) of the tiny and small GPT
// configs on the CPU backend (fp32, tied embedding, GeLU 4h, micro-batch 8, synthetic data),
// for 1 and 2 threads, fused vs unfused. Paths: fused (every fusion, flash attention: the
// default), probs (every fusion, attention_backend unfused: the fused softmax keeping the
// [b, a, s, s] probabilities, what PyTorch's eager attention keeps), unfused. Prints median step time, tokens/s, achieved model
// GFLOP/s (Megatron formula) and its fraction of the measured sgemm peak, then one JSON line.
// Compare with apps/bench/bench_step_torch.py (same model in PyTorch).
//
// usage: bench_step [--steps N] [--warmup N] [--threads 1,2] [--configs tiny,small]
//                   [--paths fused,probs,unfused] [--breakdown 1]
// --breakdown 1 traces the timed steps and prints, per op name, the time per step, its share
// of the step and its GFLOP/s (where the op declares FLOPs), longest first.
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <map>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "apps/bench/bench_common.h"
#include "engine/backend/backend.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"

namespace {

using ts::bench::benchConfig;
using ts::bench::split;

using namespace ts::engine;

void setPath(Config& c, const std::string& path) {
    const bool on = path != "unfused";
    c.masked_softmax_fusion = c.bias_activation_fusion = c.bias_dropout_fusion = on;
    c.apply_rope_fusion = c.cross_entropy_loss_fusion = on;
    c.gradient_accumulation_fusion = c.persist_layer_norm = on;
    c.attention_backend = path == "fused" ? "auto" : "unfused";  // flash attention is always fused
}

// Process CPU seconds: with a loaded machine, CPU time is the load-independent measure
// for 1 thread (wall time is reported too).
double cpuSeconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Sums the stream-executed slices per op name (launches and ranges are left out).
class BreakdownRecorder final : public ts::trace::Recorder {
public:
    struct Op {
        double ns = 0, flops = 0;
        int64_t calls = 0;
    };
    bool enabled = false;

    uint32_t track(const ts::trace::TrackDesc&) override { return 1; }
    uint32_t intern(std::string_view text) override {
        std::lock_guard<std::mutex> lock(m_mutex);
        auto it = m_ids.find(std::string(text));
        if (it != m_ids.end()) return it->second;
        m_names.emplace_back(text);
        const uint32_t id = uint32_t(m_names.size());
        m_ids.emplace(std::string(text), id);
        return id;
    }
    void slice(const ts::trace::Slice& sl) override {
        using ts::trace::Category;
        if (!enabled || sl.category == Category::Launch || sl.category == Category::Range) return;
        std::lock_guard<std::mutex> lock(m_mutex);
        Op& op = m_ops[sl.name];
        op.ns += double(sl.durNs);
        op.flops += sl.flops;
        ++op.calls;
    }
    void counter(const ts::trace::Counter&) override {}
    void metadata(std::string_view, std::string_view) override {}
    uint64_t nextCorrelation() override { return ++m_corr; }

    void print(int steps, double stepS) const {
        std::vector<std::pair<std::string, Op>> rows;
        for (const auto& [id, op] : m_ops) rows.push_back({m_names[id - 1], op});
        std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
        double total = 0;
        for (const auto& r : rows) total += r.second.ns;
        std::printf("    %-32s %10s %7s %9s\n", "op", "ms/step", "share", "GFLOP/s");
        for (const auto& [name, op] : rows) {
            const double ms = op.ns / 1e6 / steps;
            if (op.flops > 0)
                std::printf("    %-32s %10.2f %6.1f%% %9.1f\n", name.c_str(), ms, 100 * op.ns / total, op.flops / op.ns);
            else
                std::printf("    %-32s %10.2f %6.1f%% %9s\n", name.c_str(), ms, 100 * op.ns / total, "-");
        }
        std::printf("    %-32s %10.2f (step median %.2f)\n", "sum of ops", total / 1e6 / steps, stepS * 1e3);
    }

private:
    std::mutex m_mutex;
    std::map<std::string, uint32_t> m_ids;
    std::vector<std::string> m_names;
    std::map<uint32_t, Op> m_ops;
    uint64_t m_corr = 0;
};

}  // namespace

int main(int argc, char** argv) {
    int steps = 8, warmup = 2;
    std::vector<std::string> threadList = {"1", "2"}, configs = {"tiny", "small"};
    std::vector<std::string> paths = {"fused", "unfused"};
    bool breakdown = false;
    if (const int rc = ts::bench::checkArgs(argc, argv, "usage: bench_step [--steps N] [--warmup N] [--threads 1,2] [--configs tiny,small] [--paths fused,probs,unfused] [--breakdown 0|1]"); rc >= 0) return rc;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--steps") steps = std::max(1, std::stoi(v));
        else if (a == "--warmup") warmup = std::max(0, std::stoi(v));
        else if (a == "--threads") threadList = split(v);
        else if (a == "--configs") configs = split(v);
        else if (a == "--paths") paths = split(v);
        else if (a == "--breakdown") breakdown = v != "0";
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
        const double peak = ts::kernels::cpu::measureSgemmPeakGflops(threads, 1024, 1.0);
        for (const std::string& name : configs) {
            for (const std::string& path : paths) {
                if (path != "fused" && path != "probs" && path != "unfused") {
                    std::fprintf(stderr, "bench_step: unknown path %s (fused, probs or unfused)\n", path.c_str());
                    return 2;
                }
                Config c = benchConfig(name);
                setPath(c, path);
                c.cpu_threads = threads;
                // Own backend so that the trace (when asked for) can be attached to the device.
                std::unique_ptr<Backend> backend = makeCpuBackend(1);
                Device& dev = backend->device(0);
                std::unique_ptr<Stream> compute = dev.createStream(ts::trace::TrackKind::Compute, "compute");
                auto rec = std::make_unique<BreakdownRecorder>();
                if (breakdown) dev.setTrace(rec.get(), 0);
                // declared last: destroyed before the stream and device it uses
                auto t = Trainer::create(c, &dev, compute.get(), breakdown ? rec.get() : nullptr);
                if (!t) {
                    std::fprintf(stderr, "bench_step: %s\n", t.status().toString().c_str());
                    return 1;
                }
                ts::kernels::cpu::setNumThreads(threads);
                std::vector<double> times, cpu;
                for (int s = 0; s < warmup + steps; ++s) {
                    rec->enabled = s >= warmup;
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
                            path.c_str(), med * 1e3, medCpu * 1e3, tokens / med, gflops, peak,
                            100 * gflops / peak);
                if (breakdown) rec->print(steps, med);
                std::fflush(stdout);
                results.push_back({{"config", name},
                                   {"threads", threads},
                                   {"path", path},
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
