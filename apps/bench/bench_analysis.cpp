// bench_analysis: time `analyze` (analyzeRun: every metric, every step, every rank, critical
// path) on a synthetic pipeline-parallel trace of N slices written to a temporary run file.
// Usage: bench_analysis [--slices N] [--ranks R] [--steps S] [--keep PATH (reused when it exists)]
// Prints a table and one JSON line.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "profiler/analysis.h"
#include "profiler/store.h"

using namespace ts;
using namespace ts::profiler;

namespace {
double nowS() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double cpuS() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}
}  // namespace

int main(int argc, char** argv) {
    int64_t n = 10'000'000;
    int ranks = 8, steps = 10;
    std::string keep;
    if (const int rc = ts::bench::checkArgs(argc, argv, "usage: bench_analysis [--slices N] [--ranks R] [--steps S] [--keep PATH]"); rc >= 0) return rc;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--slices") n = std::atoll(argv[i + 1]);
        else if (a == "--ranks") ranks = std::atoi(argv[i + 1]);
        else if (a == "--steps") steps = std::atoi(argv[i + 1]);
        else if (a == "--keep") keep = argv[i + 1];
        else {
            std::fprintf(stderr, "unknown option %s\nusage: bench_analysis [--slices N] [--ranks R] [--steps S] [--keep PATH]\n", a.c_str());
            return 2;
        }
    }
    std::string path = keep.empty()
        ? (std::filesystem::temp_directory_path() / ("bench_analysis_" + std::to_string(::getpid()) + ".db")).string()
        : keep;
    // --keep PATH: an existing file is reused (time the analysis alone), a new one is kept.
    bool reuse = !keep.empty() && std::filesystem::exists(path);
    if (!reuse)
        for (const char* suf : {"", "-wal", "-shm"}) std::filesystem::remove(path + suf);

    // Per rank per step: K microbatch kernels on compute, every 4th followed by a tp
    // all-reduce on comm (half overlapped), a p2p send per 16 kernels, and launches on host.
    double t0 = nowS();
    if (!reuse) {
        auto store = TraceStore::create(path);
        if (!store) {
            std::fprintf(stderr, "bench_analysis: %s\n", store.status().toString().c_str());
            return 1;
        }
        TraceWriter w(**store, 1 << 18);
        w.metadata("pp", std::to_string(std::max(1, ranks / 2)));
        w.metadata("num_microbatches", "8");
        w.metadata("model_flops_per_step", "1e15");
        w.metadata("peak_tflops", "1.0");
        const uint32_t names[] = {w.intern("gemm_fwd"), w.intern("flash_attn"), w.intern("layernorm"), w.intern("gelu"),
                                  w.intern("gemm_bwd")};
        const trace::Category cats[] = {trace::Category::Gemm, trace::Category::Attention, trace::Category::Norm,
                                        trace::Category::Elementwise, trace::Category::Gemm};
        uint32_t ar = w.intern("all_reduce"), send = w.intern("send_forward"), launch = w.intern("cudaLaunchKernel");
        uint32_t tp = w.intern("tp"), pp = w.intern("pp");
        // Slices per (rank, step): k compute + k/4 comm + k/16 p2p + k/8 host launches + 1 step range.
        const int64_t perKernelGroup = 16 + 4 + 1 + 2;  // per 16 compute kernels
        int64_t k16 = std::max<int64_t>(1, n / (int64_t(ranks) * steps * perKernelGroup));
        const int64_t kernels = k16 * 16;
        const int64_t stepLen = kernels * 1200 + 10000;
        uint64_t corr = 1;
        for (int r = 0; r < ranks; ++r) {
            uint32_t host = w.track({r, r, trace::TrackKind::HostThread, 0, "rank " + std::to_string(r) + " host"});
            uint32_t comp = w.track({r, r, trace::TrackKind::Compute, 0, "rank " + std::to_string(r) + " compute"});
            uint32_t comm = w.track({r, r, trace::TrackKind::Comm, 0, "rank " + std::to_string(r) + " comm tp"});
            uint32_t p2p = w.track({r, r, trace::TrackKind::P2P, 0, "rank " + std::to_string(r) + " p2p"});
            for (int s = 0; s < steps; ++s) {
                int64_t base = int64_t(s) * stepLen;
                trace::Slice st;
                st.track = host;
                st.name = w.intern("step " + std::to_string(s));
                st.category = trace::Category::Range;
                st.startNs = base;
                st.durNs = stepLen - 100;
                st.step = s;
                w.slice(st);
                for (int64_t i = 0; i < kernels; ++i) {
                    trace::Slice k;
                    k.track = comp;
                    k.name = names[i % 5];
                    k.category = cats[i % 5];
                    k.startNs = base + 5000 + i * 1200 + (r * 37) % 200;
                    k.durNs = 1000;
                    k.step = s;
                    k.microbatch = int32_t(i * 8 / kernels);
                    k.flops = 1e6;
                    if (i % 8 == 0) {
                        k.correlation = corr++;
                        trace::Slice l;
                        l.track = host;
                        l.name = launch;
                        l.category = trace::Category::Launch;
                        l.startNs = k.startNs - 300;
                        l.durNs = 50;
                        l.correlation = k.correlation;
                        w.slice(l);
                        l.startNs += 100;
                        l.correlation = 0;
                        w.slice(l);
                    }
                    w.slice(k);
                    if (i % 4 == 3) {
                        trace::Slice c;
                        c.track = comm;
                        c.name = ar;
                        c.group = tp;
                        c.category = trace::Category::Collective;
                        c.startNs = k.startNs + 600;
                        c.durNs = 900;
                        c.bytes = 1 << 20;
                        w.slice(c);
                    }
                    if (i % 16 == 15) {
                        trace::Slice p;
                        p.track = p2p;
                        p.name = send;
                        p.group = pp;
                        p.category = trace::Category::P2P;
                        p.startNs = k.startNs + 1000;
                        p.durNs = 150;
                        p.microbatch = k.microbatch;
                        w.slice(p);
                    }
                }
            }
            for (int i = 0; i < 1000; ++i)
                w.counter({r, w.intern("memory.activations"), int64_t(i) * stepLen * steps / 1000, double(i % 100) * 1e6});
        }
        Status st = w.flush();
        if (!st) {
            std::fprintf(stderr, "bench_analysis: %s\n", st.toString().c_str());
            return 1;
        }
    }
    double t1 = nowS();
    auto store = TraceStore::open(path, true);
    if (!store) {
        std::fprintf(stderr, "bench_analysis: %s\n", store.status().toString().c_str());
        return 1;
    }
    int64_t slices = (*store)->sliceCount().value();
    double a0 = nowS(), c0 = cpuS();
    AnalyzeOptions opt;
    auto doc = analyzeRun(**store, opt);
    double a1 = nowS(), c1 = cpuS();
    if (!doc) {
        std::fprintf(stderr, "bench_analysis: %s\n", doc.status().toString().c_str());
        return 1;
    }
    size_t jsonBytes = doc->dump().size();
    store->reset();
    if (keep.empty())
        for (const char* suf : {"", "-wal", "-shm"}) std::filesystem::remove(path + suf);

    std::printf("bench_analysis: %lld slices, %d ranks, %d steps\n", (long long)slices, ranks, steps);
    if (reuse)
        std::printf("  write trace                 reused %s\n", path.c_str());
    else
        std::printf("  write trace (TraceWriter)   %8.2f s  (%.0f slices/s)\n", t1 - t0, double(slices) / (t1 - t0));
    std::printf("  analyzeRun                  %8.2f s wall, %.2f s CPU  (%.0f slices/s)\n", a1 - a0, c1 - c0,
                double(slices) / (a1 - a0));
    std::printf("  report                      %8zu bytes of JSON\n", jsonBytes);
    nlohmann::json j = {{"bench", "analysis"}, {"slices", slices}, {"ranks", ranks}, {"steps", steps},
                        {"write_s", t1 - t0}, {"analyze_s", a1 - a0}, {"analyze_cpu_s", c1 - c0},
                        {"analyze_slices_per_s", double(slices) / (a1 - a0)}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
}
