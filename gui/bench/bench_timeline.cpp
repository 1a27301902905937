// bench_timeline: opens a run of at least 10 million ops the way the workbench does and times
// what a user waits for (issue #13 "Speed"):
//   first paint  open + load (loadTimelineData, what TimelineLoader runs on its worker) + the
//                fit-all view rendered offscreen into a QImage;
//   repaint      median and p95 over a scripted zoom/pan sequence of a few hundred frames;
//   peak RSS     getrusage ru_maxrss of this process (generation runs in a forked child, so
//                it does not count).
// The run is generated with TraceWriter when --run-file is absent or does not exist yet:
// 8 ranks (tp2 dp2 pp2), per rank a host track (ranges step > microbatch > forward/backward >
// layer, one launch per kernel) and 5 streams (compute, comm tp, comm dp, p2p, copy), memory
// counters. --png PREFIX also writes PREFIX_fit.png, PREFIX_step.png and PREFIX_zoom.png.
// Usage: bench_timeline [--run-file PATH] [--ops N] [--frames F] [--width W] [--height H] [--png PREFIX]
// Prints a table and one JSON line.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <QApplication>
#include <QImage>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "gui/app/timeline_view.h"
#include "gui/app/timeline_widget.h"
#include "gui/core/timeline_data.h"
#include "profiler/store.h"

using namespace ts;
using namespace ts::gui;
using trace::Category;
using trace::TrackKind;

namespace {

double nowS() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double cpuS() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

double threadCpuS() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

double peakRssMb() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_maxrss) / 1024.0;
}

// Writes the synthetic run; returns the number of device ops written.
int64_t generate(const std::string& path, int64_t targetOps) {
    auto created = profiler::TraceStore::create(path);
    if (!created.isOk()) {
        std::fprintf(stderr, "bench_timeline: %s\n", created.status().toString().c_str());
        return -1;
    }
    auto store = std::move(created).value();
    profiler::RunInfo info;
    info.id = "bench-timeline";
    info.name = "bench_timeline synthetic";
    info.status = "completed";
    info.layout = "tp2 dp2 pp2";
    (void)store->setRunInfo(info);
    (void)store->setMetadata("pp", "2");
    (void)store->setMetadata("num_microbatches", "8");
    profiler::TraceWriter w(*store);
    const int ranks = 8, microbatches = 8, layers = 24;
    // Ops per layer and phase on all streams of one rank: ~70% compute, the rest comm/p2p/copy.
    const int computePerLayer = 14, tpPerLayer = 4;
    const int64_t perStepPerRank = int64_t(microbatches) * 2 * layers * (computePerLayer + tpPerLayer) + 2 * microbatches * 2 + 64;
    const int steps = int(std::max<int64_t>(1, (targetOps + ranks * perStepPerRank - 1) / (ranks * perStepPerRank)));
    const char* computeNames[] = {"ampere_bf16_gemm_128x256_qkv", "flash_fwd_kernel", "rmsnorm_fwd", "rope_apply",
                                  "ampere_bf16_gemm_128x128_proj", "gelu_fwd", "residual_add", "ampere_bf16_gemm_256x128_fc1",
                                  "ampere_bf16_gemm_128x256_fc2", "dropout_add", "softmax_fwd", "bias_add",
                                  "cast_bf16", "layernorm_fwd"};
    uint32_t cname[14], bname[14];
    for (int i = 0; i < 14; ++i) {
        cname[i] = w.intern(computeNames[i]);
        bname[i] = w.intern(std::string(computeNames[i]) + "_bwd");
    }
    const Category ccat[14] = {Category::Gemm, Category::Attention, Category::Norm, Category::Elementwise, Category::Gemm,
                               Category::Elementwise, Category::Elementwise, Category::Gemm, Category::Gemm,
                               Category::Elementwise, Category::Softmax, Category::Elementwise, Category::Elementwise,
                               Category::Norm};
    const uint32_t nAllGather = w.intern("ncclDevKernel_AllGather_RING_LL"), nReduceScatter = w.intern("ncclDevKernel_ReduceScatter_RING_LL"),
                   nAllReduce = w.intern("ncclDevKernel_AllReduce_Sum_bf16_RING_LL"), nSend = w.intern("ncclDevKernel_SendRecv_send"),
                   nRecv = w.intern("ncclDevKernel_SendRecv_recv"), nCopy = w.intern("Memcpy DtoD"),
                   nLaunch = w.intern("cudaLaunchKernel"), gTp = w.intern("tp"), gDp = w.intern("dp"), gPp = w.intern("pp"),
                   nForward = w.intern("forward"), nBackward = w.intern("backward"), nOpt = w.intern("optimizer");
    std::vector<uint32_t> layerNames, mbNames, stepNames;
    for (int l = 0; l < layers; ++l) layerNames.push_back(w.intern("layer " + std::to_string(l)));
    for (int m = 0; m < microbatches; ++m) mbNames.push_back(w.intern("microbatch " + std::to_string(m)));
    const uint32_t memNames[3] = {w.intern("memory.params"), w.intern("memory.activations"), w.intern("memory.grads")};
    int64_t ops = 0;
    for (int rank = 0; rank < ranks; ++rank) {
        std::mt19937_64 rng(uint64_t(rank) * 7919 + 1);
        auto dur = [&](int64_t lo, int64_t hi) { return lo + int64_t(rng() % uint64_t(hi - lo)); };
        auto tn = [&](const char* k) { return "rank " + std::to_string(rank) + " " + k; };
        const uint32_t host = w.track({rank, rank, TrackKind::HostThread, 0, tn("host")});
        const uint32_t comp = w.track({rank, rank, TrackKind::Compute, 0, tn("compute")});
        const uint32_t tp = w.track({rank, rank, TrackKind::Comm, 1, tn("comm tp")});
        const uint32_t dp = w.track({rank, rank, TrackKind::Comm, 2, tn("comm dp")});
        const uint32_t p2p = w.track({rank, rank, TrackKind::P2P, 3, tn("p2p")});
        const uint32_t copy = w.track({rank, rank, TrackKind::Copy, 4, tn("copy")});
        const int stage = rank / 4;  // tp2 dp2 pp2: ranks 0-3 stage 0, 4-7 stage 1
        int64_t t = 1'000'000'000'000LL;
        double mem = 0;
        auto counter = [&](int64_t ts, int which, double v) { w.counter({rank, memNames[which], ts, v}); };
        auto range = [&](uint32_t name, int64_t s, int64_t e, int depth, int step, int mb, int layer) {
            trace::Slice r;
            r.track = host, r.name = name, r.category = Category::Range, r.startNs = s, r.durNs = e - s;
            r.depth = depth, r.step = step, r.microbatch = mb, r.layer = layer;
            w.slice(r);
        };
        for (int step = 0; step < steps; ++step) {
            const int64_t stepStart = t;
            counter(t, 0, 2.0e9);
            // The later stage starts after the first microbatch's forward: the pipeline bubble.
            t += stage * 2'500'000;
            for (int mb = 0; mb < microbatches; ++mb) {
                const int64_t mbStart = t;
                for (int phase = 0; phase < 2; ++phase) {
                    const int64_t phaseStart = t;
                    for (int l = 0; l < layers; ++l) {
                        const int layer = phase ? layers - 1 - l : l;
                        const int64_t layerStart = t;
                        int64_t tpT = t;
                        for (int k = 0; k < computePerLayer; ++k) {
                            trace::Slice s;
                            s.track = comp, s.name = phase ? bname[k] : cname[k], s.category = ccat[k];
                            s.startNs = t;
                            s.durNs = ccat[k] == Category::Gemm ? dur(20'000, 90'000) : dur(2'000, 15'000);
                            if (phase) s.durNs *= 2;
                            s.step = step, s.microbatch = mb, s.layer = layer;
                            s.correlation = w.nextCorrelation();
                            if (ccat[k] == Category::Gemm) s.flops = 2.0 * 4096 * 4096 * 2048;
                            trace::Slice launch;
                            launch.track = host, launch.name = nLaunch, launch.category = Category::Launch;
                            launch.startNs = t - 3'000, launch.durNs = 1'500, launch.correlation = s.correlation;
                            w.slice(launch);
                            w.slice(s);
                            ops += 1;
                            t += s.durNs + dur(300, 3'000);
                            if (k % 4 == 3 && k / 4 < tpPerLayer) {
                                // A tensor-parallel collective overlapping the next kernels.
                                trace::Slice c;
                                c.track = tp, c.name = (k / 4) % 2 ? nReduceScatter : nAllGather;
                                c.category = Category::Collective, c.group = gTp;
                                c.startNs = std::max(tpT, t), c.durNs = dur(8'000, 30'000), c.bytes = 8u << 20;
                                c.step = step, c.microbatch = mb, c.layer = layer;
                                w.slice(c);
                                tpT = c.startNs + c.durNs;
                                ops += 1;
                            }
                        }
                        for (int k = computePerLayer / 4; k < tpPerLayer; ++k) {
                            trace::Slice c;
                            c.track = tp, c.name = nAllGather, c.category = Category::Collective, c.group = gTp;
                            c.startNs = std::max(tpT, t), c.durNs = dur(4'000, 12'000), c.bytes = 4u << 20;
                            c.step = step, c.microbatch = mb, c.layer = layer;
                            w.slice(c);
                            tpT = c.startNs + c.durNs;
                            t = std::max(t, tpT);  // exposed: compute waits for it
                            ops += 1;
                        }
                        range(layerNames[size_t(layer)], layerStart, t, 3, step, mb, layer);
                        mem += phase ? -40e6 : 40e6;
                        counter(t, 1, std::max(0.0, mem));
                    }
                    range(phase ? nBackward : nForward, phaseStart, t, 2, step, mb, -1);
                    // Activations/gradients to the other stage, a copy now and then.
                    trace::Slice p;
                    p.track = p2p, p.name = (phase == 0) == (stage == 0) ? nSend : nRecv, p.category = Category::P2P;
                    p.group = gPp, p.startNs = t, p.durNs = dur(40'000, 120'000), p.bytes = 16u << 20;
                    p.step = step, p.microbatch = mb;
                    w.slice(p);
                    trace::Slice cp;
                    cp.track = copy, cp.name = nCopy, cp.category = Category::Memcpy, cp.startNs = t + 5'000;
                    cp.durNs = dur(5'000, 20'000), cp.bytes = 32u << 20, cp.step = step;
                    w.slice(cp);
                    ops += 2;
                    t += dur(20'000, 200'000);
                }
                range(mbNames[size_t(mb)], mbStart, t, 1, step, mb, -1);
            }
            // Data-parallel gradient all-reduce buckets, then the optimizer.
            t += (1 - stage) * 2'500'000;
            const int64_t optStart = t;
            for (int b = 0; b < 64; ++b) {
                trace::Slice c;
                c.track = dp, c.name = nAllReduce, c.category = Category::Collective, c.group = gDp;
                c.startNs = t, c.durNs = dur(30'000, 90'000), c.bytes = 25u << 20, c.step = step;
                w.slice(c);
                t += c.durNs + 2'000;
                ops += 1;
            }
            counter(t, 2, 2.0e9);
            range(nOpt, optStart, t, 1, step, -1, -1);
            trace::Slice st;
            st.track = host, st.name = w.intern("step " + std::to_string(step)), st.category = Category::Range;
            st.startNs = stepStart, st.durNs = t - stepStart, st.step = step;
            w.slice(st);
            t += 500'000;
        }
    }
    Status s = w.finish();
    if (!s.isOk()) {
        std::fprintf(stderr, "bench_timeline: %s\n", s.toString().c_str());
        return -1;
    }
    (void)store->checkpoint();
    return ops;
}

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t i = size_t(std::clamp(q * double(v.size() - 1), 0.0, double(v.size() - 1)));
    return v[i];
}

}  // namespace

int main(int argc, char** argv) {
    const char* usage =
        "usage: bench_timeline [--run-file PATH] [--ops N] [--frames F] [--width W] [--height H] [--png PREFIX]";
    if (const int rc = ts::bench::checkArgs(argc, argv, usage); rc >= 0) return rc;
    std::string runFile, png;
    int64_t targetOps = 10'000'000;
    int frames = 300, width = 1920, height = 1080;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string a = argv[i];
        if (a == "--run-file") runFile = argv[i + 1];
        else if (a == "--ops") targetOps = std::atoll(argv[i + 1]);
        else if (a == "--frames") frames = std::atoi(argv[i + 1]);
        else if (a == "--width") width = std::atoi(argv[i + 1]);
        else if (a == "--height") height = std::atoi(argv[i + 1]);
        else if (a == "--png") png = argv[i + 1];
        else {
            std::fprintf(stderr, "unknown option %s\n%s\n", a.c_str(), usage);
            return 2;
        }
    }
    if (runFile.empty())
        runFile = (std::filesystem::temp_directory_path() / ("bench_timeline_" + std::to_string(targetOps) + ".sqlite")).string();

    // Generate in a child process so its memory does not count in this process' peak RSS.
    double genS = 0;
    if (!std::filesystem::exists(runFile)) {
        std::printf("bench_timeline: generating %s (%lld ops)...\n", runFile.c_str(), (long long)targetOps);
        std::fflush(stdout);
        double g0 = nowS();
        pid_t pid = fork();
        if (pid == 0) _exit(generate(runFile, targetOps) > 0 ? 0 : 1);
        int status = 0;
        waitpid(pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            std::fprintf(stderr, "bench_timeline: generation failed\n");
            return 1;
        }
        genS = nowS() - g0;
    }
    if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);

    // ---- first paint: open + the overview (chunk index) + render the fit-all view; then the
    // detail (every slice decoded) and the same view again, as TimelineLoader delivers them.
    const double rss0 = peakRssMb();
    const double t0 = nowS(), c0 = cpuS();
    TimelineWidget widget;
    widget.resize(width, height);
    QImage image(width, height, QImage::Format_ARGB32_Premultiplied);
    double overviewS = 0;
    if (auto quick = loadTimelineOverview(runFile); quick.isOk()) {
        overviewS = nowS() - t0;
        widget.setData(quick.value());
        widget.render(&image);
    }
    const double firstPaintS = nowS() - t0, firstPaintCpuS = cpuS() - c0;
    const double tDetail = nowS();
    auto loaded = loadTimelineData(runFile);
    if (!loaded.isOk()) {
        std::fprintf(stderr, "bench_timeline: %s\n", loaded.status().toString().c_str());
        return 1;
    }
    auto data = loaded.value();
    const double tLoaded = nowS();
    widget.setData(data);
    widget.fitAll();
    widget.render(&image);
    const double detailS = nowS() - t0, detailCpuS = cpuS() - c0;
    const double loadS = tLoaded - tDetail, paintMs = (nowS() - tLoaded) * 1e3;

    // ---- scripted zoom/pan: zoom into a step at several cursor positions, pan through it,
    // zoom to single kernels, pan, zoom back out, fit. Each frame is one full render.
    std::vector<double> frameMs, frameCpuMs;
    const double cw = width - TimelineWidget::kGutterPx;
    auto frame = [&](auto&& op) {
        op();
        double f0 = nowS(), fc0 = threadCpuS();
        widget.render(&image);
        frameMs.push_back((nowS() - f0) * 1e3);
        frameCpuMs.push_back((threadCpuS() - fc0) * 1e3);
    };
    int f = 0;
    while (f < frames) {
        for (int i = 0; i < 30 && f < frames; ++i, ++f) frame([&] { widget.zoomAtX(cw * (0.3 + 0.01 * i), 1.25); });
        for (int i = 0; i < 30 && f < frames; ++i, ++f) frame([&] { widget.panPixels(-40); });
        for (int i = 0; i < 20 && f < frames; ++i, ++f) frame([&] { widget.zoomAtX(cw * 0.7, 1.3); });
        for (int i = 0; i < 30 && f < frames; ++i, ++f) frame([&] { widget.panPixels(25); });
        for (int i = 0; i < 40 && f < frames; ++i, ++f) frame([&] { widget.zoomAtX(cw * 0.5, 1 / 1.3); });
        for (int i = 0; i < 20 && f < frames; ++i, ++f) frame([&] { widget.panPixels(i % 2 ? 300 : -300); });
        if (f < frames) frame([&] { widget.fitAll(); }), ++f;
    }
    const double medianMs = percentile(frameMs, 0.5), p95Ms = percentile(frameMs, 0.95), maxMs = percentile(frameMs, 1.0);
    const double rssMb = peakRssMb();
    const double cpuMedianMs = percentile(frameCpuMs, 0.5), cpuP95Ms = percentile(frameCpuMs, 0.95);

    if (!png.empty()) {
        TimelineView view;
        view.resize(width, std::min(height, 1000));
        view.setData(data);
        auto save = [&](const std::string& name) {
            QImage img(view.size(), QImage::Format_ARGB32_Premultiplied);
            view.render(&img);
            img.save(QString::fromStdString(png + name));
        };
        save("_fit.png");
        if (!data->steps.empty()) view.viewState()->setStep(data->steps[data->steps.size() / 2].step);
        save("_step.png");
        const auto& w0 = view.timeline()->axis();
        view.timeline()->setVisibleRange(w0.startNs + w0.spanNs() / 3, w0.startNs + w0.spanNs() / 3 + w0.spanNs() / 60);
        save("_zoom.png");
    }

    double load1 = 0, load5 = 0, load15 = 0;
    {
        double l[3] = {0, 0, 0};
        if (getloadavg(l, 3) == 3) load1 = l[0], load5 = l[1], load15 = l[2];
    }
    std::error_code ec;
    const double fileMb = double(std::filesystem::file_size(runFile, ec)) / 1e6;
    std::printf("bench_timeline: %s (%.0f MB), %lld ops in %zu rows, %zu ranks%s\n", runFile.c_str(), fileMb,
                (long long)data->sliceCount, data->rows.size(), data->ranks.size(),
                genS > 0 ? (" (generated in " + std::to_string(genS) + " s)").c_str() : "");
    std::printf("  first paint (open + overview + fit)   %8.3f s wall  (%.3f CPU-s; overview query %.3f s)\n",
                firstPaintS, firstPaintCpuS, overviewS);
    std::printf("  detail ready (+ decode all + fit)     %8.2f s wall  (%.2f CPU-s; load %.2f s, paint %.1f ms)\n",
                detailS, detailCpuS, loadS, paintMs);
    std::printf("  repaint over %d zoom/pan frames     median %6.2f ms  p95 %6.2f ms  max %6.2f ms (%dx%d)\n",
                int(frameMs.size()), medianMs, p95Ms, maxMs, width, height);
    std::printf("  repaint CPU time (UI thread)          median %6.2f ms  p95 %6.2f ms\n", cpuMedianMs, cpuP95Ms);
    std::printf("  peak RSS                              %8.0f MB (before open: %.0f MB)\n", rssMb, rss0);
    std::printf("  load average                          %.2f %.2f %.2f (%ld CPUs)\n", load1, load5, load15, sysconf(_SC_NPROCESSORS_ONLN));
    nlohmann::json j = {{"bench", "timeline"},
                        {"ops", data->sliceCount},
                        {"rows", data->rows.size()},
                        {"file_mb", fileMb},
                        {"first_paint_s", firstPaintS},
                        {"first_paint_cpu_s", firstPaintCpuS},
                        {"overview_s", overviewS},
                        {"detail_ready_s", detailS},
                        {"detail_ready_cpu_s", detailCpuS},
                        {"load_s", loadS},
                        {"fit_paint_ms", paintMs},
                        {"frames", frameMs.size()},
                        {"repaint_median_ms", medianMs},
                        {"repaint_p95_ms", p95Ms},
                        {"repaint_max_ms", maxMs},
                        {"repaint_cpu_median_ms", cpuMedianMs},
                        {"repaint_cpu_p95_ms", cpuP95Ms},
                        {"peak_rss_mb", rssMb},
                        {"width", width},
                        {"height", height},
                        {"loadavg_1m", load1}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
}
