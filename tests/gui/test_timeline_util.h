// Shared by the timeline tests: the QApplication for widget tests (gui_test_util.h), and a
// small two-rank pipeline run file written with TraceWriter, the way real runs are.
#pragma once

#include <QApplication>

#include <filesystem>
#include <string>

#include "profiler/store.h"
#include "tests/gui/gui_test_util.h"

namespace ts::gui::testing {

// The program's one QApplication (gui_test_util.h: offscreen, test organisation name).
inline QApplication* ensureApp() { return ts::gui::test::ensureApp(); }

inline std::string tempRunPath(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / ("ts_timeline_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    auto p = dir / name;
    std::filesystem::remove(p);
    std::filesystem::remove(p.string() + "-wal");
    std::filesystem::remove(p.string() + "-shm");
    return p.string();
}

// What the tiny pipeline trace holds, for assertions.
struct TinyTrace {
    int64_t t0 = 5'000'000'000;  // a monotonic-looking origin
    int steps = 2, microbatches = 2;
    int64_t gemmNs = 40'000, allReduceNs = 30'000, p2pNs = 5'000;
    int gemmsPerRank = 0, allReduces = 0, launches = 0;
};

// Two pipeline ranks (pp = 2), 2 steps of 2 microbatches. Per rank: a host track with ranges
// (step > microbatch > forward/backward, depth 0/1/2) and a launch per kernel, a compute
// stream (gemms, with FLOPs), a comm stream (dp all_reduce at the end of each step, bytes) and
// a p2p stream (pp send/recv), and memory counters. Rank 1's compute starts later in each step
// than rank 0's, so its bubbles are larger.
inline TinyTrace writeTinyPipeline(const std::string& path, const std::string& status = "completed") {
    using namespace ts::trace;
    TinyTrace tt;
    auto created = profiler::TraceStore::create(path);
    if (!created.isOk()) return tt;
    auto store = std::move(created).value();
    profiler::RunInfo info;
    info.id = "tiny";
    info.name = "tiny pipeline";
    info.status = status;
    info.layout = "pp2";
    (void)store->setRunInfo(info);
    (void)store->setMetadata("pp", "2");
    (void)store->setMetadata("num_microbatches", "2");
    {
        profiler::TraceWriter w(*store, 64);
        for (int rank = 0; rank < 2; ++rank) {
            auto tn = [&](const char* k) { return "rank " + std::to_string(rank) + " " + k; };
            uint32_t host = w.track({rank, rank, TrackKind::HostThread, 0, tn("host")});
            uint32_t comp = w.track({rank, rank, TrackKind::Compute, 0, tn("compute")});
            uint32_t comm = w.track({rank, rank, TrackKind::Comm, 1, tn("comm dp")});
            uint32_t p2p = w.track({rank, rank, TrackKind::P2P, 2, tn("p2p")});
            auto slice = [&](uint32_t track, Category c, const std::string& name, int64_t s, int64_t d) {
                Slice x;
                x.track = track;
                x.category = c;
                x.name = w.intern(name);
                x.startNs = s;
                x.durNs = d;
                return x;
            };
            int64_t stepLen = 1'000'000;
            for (int step = 0; step < tt.steps; ++step) {
                int64_t s0 = tt.t0 + step * (stepLen + 100'000);
                Slice st = slice(host, Category::Range, "step " + std::to_string(step), s0, stepLen);
                st.step = step;
                w.slice(st);
                for (int mb = 0; mb < tt.microbatches; ++mb) {
                    int64_t m0 = s0 + 10'000 + mb * 400'000;
                    Slice ms = slice(host, Category::Range, "microbatch " + std::to_string(mb), m0, 380'000);
                    ms.depth = 1, ms.step = step, ms.microbatch = mb;
                    w.slice(ms);
                    for (int phase = 0; phase < 2; ++phase) {
                        int64_t p0 = m0 + phase * 190'000;
                        Slice ps = slice(host, Category::Range, phase ? "backward" : "forward", p0, 180'000);
                        ps.depth = 2, ps.step = step, ps.microbatch = mb;
                        w.slice(ps);
                        // Rank 1 waits for rank 0's activations: its kernels start later.
                        int64_t k0 = p0 + 5'000 + rank * 60'000;
                        for (int k = 0; k < 2; ++k) {
                            int64_t ks = k0 + k * (tt.gemmNs + 2'000);
                            uint64_t corr = w.nextCorrelation();
                            Slice l = slice(host, Category::Launch, "cudaLaunchKernel", ks - 1'000, 500);
                            l.correlation = corr;
                            w.slice(l);
                            ++tt.launches;
                            Slice g = slice(comp, Category::Gemm, phase ? "gemm_bwd" : "gemm_fwd", ks, tt.gemmNs);
                            g.step = step, g.microbatch = mb, g.layer = k, g.correlation = corr;
                            g.flops = 2.0 * 1024 * 1024 * 1024;
                            w.slice(g);
                            ++tt.gemmsPerRank;
                        }
                        Slice pp = slice(p2p, Category::P2P, phase ? "recv" : "send", k0 + 2 * (tt.gemmNs + 2'000), tt.p2pNs);
                        pp.group = w.intern("pp");
                        pp.bytes = 1 << 20;
                        pp.step = step, pp.microbatch = mb;
                        w.slice(pp);
                    }
                }
                Slice ar = slice(comm, Category::Collective, "all_reduce", s0 + stepLen - tt.allReduceNs - 10'000, tt.allReduceNs);
                ar.group = w.intern("dp");
                ar.bytes = 64ull << 20;
                ar.step = step;
                w.slice(ar);
                ++tt.allReduces;
                for (int i = 0; i < 4; ++i)
                    w.counter({rank, w.intern(i % 2 ? "memory.activations" : "memory.params"), s0 + i * 200'000,
                               double((i + 1) * (64 << 20))});
            }
        }
        (void)w.finish();
    }
    tt.gemmsPerRank /= 2;
    return tt;
}

}  // namespace ts::gui::testing
