// Commands of the 'run' group: `trainscope run CONFIG.yaml` trains on this node's CPU backend
// and writes a run file (SQLite, through profiler::CaptureRecorder) into the workspace;
// `trainscope demo` trains resources/examples/tiny.yaml and prints where the step time went.
//
// `run --json` prints one JSON object per line on stdout: {"event":"start",...}, one
// {"event":"step",...} per iteration and {"event":"end","status":"completed|failed|cancelled"}.
// SIGINT/SIGTERM cancel cleanly (the run is marked cancelled, exit code 130).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/trainscope/commands.h"
#include "apps/trainscope/gpu_capture.h"
#include "apps/trainscope/mpi_launch.h"
#include "common/clock.h"
#include "common/json_text.h"
#include "common/text.h"
#include "engine/config/knobs.h"
#include "engine/parallel/parallel_trainer.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"
#include "profiler/store.h"
#include "sessions/workspace.h"

#ifndef TS_SOURCE_DIR
#define TS_SOURCE_DIR "."
#endif

namespace ts::cli {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::atomic<bool> g_cancel{false};
std::atomic<int> g_signal{0};

extern "C" void onSignal(int sig) {
    g_signal.store(sig);
    g_cancel.store(true);
}

// SIGINT/SIGTERM (a user, a cancel), SIGHUP (the terminal went away) and SIGPIPE (whoever reads
// our output went away: the agent that started this run died) all stop the run at the next
// step boundary; it is then recorded as cancelled with the signal in its reason, never left
// "running".
struct SignalGuard {
    using Handler = void (*)(int);
    static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    Handler old[4];
    SignalGuard() {
        g_cancel = false;
        g_signal = 0;
        for (size_t i = 0; i < 4; ++i) old[i] = std::signal(kSignals[i], onSignal);
    }
    ~SignalGuard() {
        for (size_t i = 0; i < 4; ++i) std::signal(kSignals[i], old[i]);
    }
};

// The cancelled run's reason: which signal stopped it.
std::string cancelReason(const std::string& engineReason) {
    switch (g_signal.load()) {
        case SIGINT: return "cancelled by SIGINT (interrupt)";
        case SIGTERM: return "cancelled by SIGTERM";
        case SIGHUP: return "stopped by SIGHUP: the terminal or session that started it went away";
        case SIGPIPE: return "stopped: whoever read its output went away (SIGPIPE; e.g. the agent that started it died)";
        default: return engineReason;
    }
}

std::string isoNow() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string hostName() {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
}

std::string fmtBytes(int64_t b) {
    char buf[32];
    if (b >= (int64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1 << 30));
    else if (b >= (int64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1 << 20));
    else std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
    return buf;
}

json stepJson(const engine::StepProgress& p) {
    json mem = json::object();
    for (size_t c = 0; c < size_t(engine::MemCategory::Count); ++c)
        mem[trace::memCategoryName(engine::MemCategory(c))] = p.peakMemoryByCategory[c];
    return {{"event", "step"},       {"step", p.step},
            {"loss", p.loss},        {"step_time_s", p.stepTimeS},
            {"tokens_per_s", p.tokensPerS}, {"model_tflops", p.modelTflops},
            {"peak_memory_bytes", p.peakMemoryBytes}, {"peak_memory", mem},
            {"grad_norm", p.gradNorm}, {"lr", p.lr}};
}

void progressBar(const engine::StepProgress& p, int total) {
    const int width = 24;
    const int filled = total > 0 ? std::min(width, p.step * width / total) : width;
    std::string bar(size_t(filled), '#');
    bar.resize(size_t(width), '.');
    std::fprintf(stderr, "\r[%s] step %d/%d  loss %.4f  %.3f s/step  %.0f tok/s  %.4f TFLOP/s  peak %s   ",
                 bar.c_str(), p.step, total, p.loss, p.stepTimeS, p.tokensPerS, p.modelTflops,
                 fmtBytes(p.peakMemoryBytes).c_str());
    std::fflush(stderr);
}

// Aggregates execution time per op name and category on the compute streams (for `demo`).
class TimeSummaryRecorder : public trace::Recorder {
public:
    uint32_t track(const trace::TrackDesc& d) override {
        std::lock_guard<std::mutex> l(m_mu);
        m_kinds.push_back(d.kind);
        return uint32_t(m_kinds.size());
    }
    uint32_t intern(std::string_view text) override {
        std::lock_guard<std::mutex> l(m_mu);
        auto it = m_ids.find(std::string(text));
        if (it != m_ids.end()) return it->second;
        m_names.emplace_back(text);
        const uint32_t id = uint32_t(m_names.size());
        m_ids.emplace(std::string(text), id);
        return id;
    }
    void slice(const trace::Slice& s) override {
        std::lock_guard<std::mutex> l(m_mu);
        if (s.track == 0 || s.track > m_kinds.size() || m_kinds[s.track - 1] != trace::TrackKind::Compute) return;
        if (s.category == trace::Category::Range || s.category == trace::Category::Launch) return;
        const std::string name = s.name > 0 && s.name <= m_names.size() ? m_names[s.name - 1] : "?";
        auto& e = m_byName[name];
        e.ns += s.durNs;
        e.flops += s.flops;
        e.category = s.category;
        m_byCat[s.category] += s.durNs;
        m_total += s.durNs;
    }
    void counter(const trace::Counter&) override {}
    void metadata(std::string_view, std::string_view) override {}
    uint64_t nextCorrelation() override { return ++m_corr; }

    void reset() {
        std::lock_guard<std::mutex> l(m_mu);
        m_byName.clear();
        m_byCat.clear();
        m_total = 0;
    }
    void print(int steps) const {
        std::lock_guard<std::mutex> l(m_mu);
        if (m_total <= 0) return;
        std::printf("\nWhere the time went (compute stream, %d measured steps):\n", steps);
        std::vector<std::pair<int64_t, trace::Category>> cats;
        for (auto& [c, ns] : m_byCat) cats.push_back({ns, c});
        std::sort(cats.rbegin(), cats.rend());
        for (auto& [ns, c] : cats)
            std::printf("  %-12s %8.1f ms/step  %5.1f%%\n", trace::categoryName(c), double(ns) / 1e6 / steps,
                        100.0 * double(ns) / double(m_total));
        std::vector<std::pair<int64_t, std::string>> ops;
        for (auto& [n, e] : m_byName) ops.push_back({e.ns, n});
        std::sort(ops.rbegin(), ops.rend());
        std::printf("Top ops:\n");
        for (size_t i = 0; i < ops.size() && i < 8; ++i) {
            const auto& e = m_byName.at(ops[i].second);
            const double gf = e.ns > 0 ? e.flops / double(e.ns) : 0;  // flops/ns = GFLOP/s
            std::printf("  %-28s %8.1f ms/step  %5.1f%%", ops[i].second.c_str(), double(ops[i].first) / 1e6 / steps,
                        100.0 * double(ops[i].first) / double(m_total));
            if (gf > 0) std::printf("  %7.1f GFLOP/s", gf);
            std::printf("\n");
        }
    }

private:
    struct Entry {
        int64_t ns = 0;
        double flops = 0;
        trace::Category category = trace::Category::Other;
    };
    mutable std::mutex m_mu;
    std::vector<trace::TrackKind> m_kinds;
    std::vector<std::string> m_names;
    std::map<std::string, uint32_t> m_ids;
    std::map<std::string, Entry> m_byName;
    std::map<trace::Category, int64_t> m_byCat;
    int64_t m_total = 0;
    std::atomic<uint64_t> m_corr{0};
};

Result<engine::Config> loadRunConfig(const std::string& path, const Args& a) {
    const engine::LoadedConfig loaded = engine::loadConfigFile(path);
    if (!loaded.ok()) return engine::issuesToStatus(loaded.issues);
    engine::Config c = loaded.config;
    for (const auto& kv : a.values("--set")) TS_RETURN_IF_ERROR(engine::applyOverride(c, kv));
    TS_ASSIGN_OR_RETURN(auto steps, intFlag(a, "--steps", 1, kMaxSteps));
    if (steps) c.train_iters = int(*steps);
    TS_ASSIGN_OR_RETURN(auto world, intFlag(a, "--world-size", 1, kMaxWorldSize));
    if (world) c.world_size = int(*world);
    if (auto n = a.value("--name")) c.name = sanitizeUtf8(*n);
    TS_RETURN_IF_ERROR(engine::issuesToStatus(engine::validateConfig(c)));
    return c;
}

int exitCodeFor(const Status& s) { return exitCodeOf(s); }

}  // namespace

int cmdRun(const Args& a) {
    if (a.value("--node")) return cmdRunOnNode(a);
    if (auto bad = a.unknownFlags({"--steps", "--json", "--run-file", "--workspace", "--name", "--set",
                                   "--world-size", "--node", "--no-trace"});
        !bad.empty())
        return fail(2, "unknown option " + bad[0] + " for `run`; see `trainscope --help`");
    if (a.positional().size() != 1)
        return fail(2, "usage: trainscope run CONFIG.yaml [--steps N] [--json] [--run-file PATH] [--workspace DIR] "
                       "[--name NAME] [--set key=value ...]");
    auto cfg = loadRunConfig(a.positional()[0], a);
    if (!cfg) return fail(exitCodeFor(cfg.status()), cfg.status().message());
    engine::Config c = *cfg;
    const bool jsonOut = a.has("--json");
    const bool traceOn = c.profile && !a.has("--no-trace");
    // Under mpirun/srun: one rank per process; process 0 writes the run file (every rank's
    // trace and logs reach it) and prints, the others train and ship what they recorded
    // (apps/trainscope/cmd_run_mpi.cpp). `mpi` outlives the trainer below.
    auto mpiR = mpiLaunchFor(c);
    if (!mpiR) return fail(exitCodeFor(mpiR.status()), mpiR.status().message());
    MpiLaunch mpi = std::move(*mpiR);
    if (mpi.active && mpi.process != 0) {
        SignalGuard guard;
        return runMpiFollower(c, mpi, traceOn, &g_cancel);
    }

    // Run file: --run-file PATH, else a new file in the workspace.
    std::string runFile;
    std::optional<sessions::Workspace> ws;
    if (auto rf = a.value("--run-file")) {
        runFile = *rf;
        // Like `import --out`: an existing run is never merged into (it would take over its
        // identity and mix two runs' steps). An empty file (a path reserved beforehand) is fine.
        std::error_code ec;
        if (fs::exists(runFile, ec) && (!fs::is_regular_file(runFile, ec) || fs::file_size(runFile, ec) > 0))
            return fail(2, "run file " + runFile + " already exists; pick a new path (or leave out --run-file to "
                           "get a fresh run in the workspace)");
    } else {
        auto w = sessions::Workspace::open(a.value("--workspace").value_or(""));
        if (!w) return fail(1, w.status().message());
        ws.emplace(std::move(*w));
        auto p = ws->newRunFile(c.name);
        if (!p) return fail(1, p.status().message());
        runFile = *p;
    }
    auto recR = profiler::CaptureRecorder::create(runFile);
    if (!recR) return fail(1, "cannot create run file " + runFile + ": " + recR.status().message());
    std::unique_ptr<profiler::CaptureRecorder> rec = std::move(*recR);
    // The first error writing the run file (a full disk, a file size limit): it fails the run.
    Status writeError;
    auto noteWrite = [&](Status s) {
        if (!s && writeError) writeError = s;
        return writeError.isOk();
    };
    profiler::RunInfo info;
    info.id = sanitizeUtf8(fs::path(runFile).stem().string());
    info.name = c.name.empty() ? info.id : c.name;
    info.status = "running";
    info.createdAt = isoNow();
    info.node = "local";
    info.host = hostName();
    if (const char* u = std::getenv("USER")) info.user = u;
    info.configJson = dumpJson(engine::configToJson(c));
    const engine::DerivedSizes ds = engine::deriveSizes(c);
    info.layout = "tp" + std::to_string(ds.tp) + (ds.cp > 1 ? " cp" + std::to_string(ds.cp) : std::string()) + " pp" +
                  std::to_string(ds.pp) + " dp" + std::to_string(ds.dp);
    rec->setRunInfo(info);
    // Which process writes this file: a reader can then tell a run still going from one whose
    // process died without finishing (sessions::finalizeStaleRuns), and `runs delete --force`
    // can cancel it. The run exists (readers see it "running") only once this batch is committed.
    for (const auto& [key, value] : sessions::writerProcessMetadata()) rec->metadata(key, value);
    noteWrite(rec->flush());

    // Ends the run: the status goes into the file and the file is closed. When writing fails
    // (now or earlier) the run has failed, whatever the training said: the status becomes
    // "failed" with the write error as the reason, written again through a fresh connection
    // (the file may still accept a small update), and reported on stdout/stderr. Returns the
    // final status.
    auto finish = [&](std::string status, std::string reason) {
        if (!writeError) {
            status = "failed";
            reason = "writing the run file failed: " + writeError.message();
        }
        rec->setRunStatus(status, reason);
        if (!reason.empty()) rec->appendLog(status == "completed" ? "info" : "error", reason);
        Status closed = rec->close();
        if (!closed && status != "failed") {
            status = "failed";
            reason = "writing the run file failed: " + closed.message();
        }
        if (!closed) {
            auto store = profiler::TraceStore::open(runFile, /*readOnly=*/false);
            Status marked = store ? (*store)->setRunStatus(status, reason) : store.status();
            if (marked) marked = (*store)->checkpoint();
            if (!marked) reason += " (the run file could not record this either: " + marked.message() + ")";
        }
        if (ws) (void)ws->indexRun(runFile);
        if (jsonOut) {
            std::printf("%s\n", dumpJson(json{{"event", "end"}, {"status", status}, {"reason", reason}, {"run_file", runFile}})
                                    .c_str());
            std::fflush(stdout);
        }
        return std::make_pair(status, reason);
    };

    SignalGuard guard;
    // world > 1 runs on the parallel engine (one virtual CPU device per rank, all ranks traced
    // into the same run file); world 1 on the single-device Trainer. Both are driven through
    // the few calls below.
    std::unique_ptr<engine::Backend> backend;
    std::unique_ptr<engine::Stream> stream;
    std::unique_ptr<engine::Trainer> single;
    std::unique_ptr<engine::ParallelTrainer> parallel;
    engine::Device* dev = nullptr;
    Status created;
    if (ds.world > 1) {
        auto p = engine::ParallelTrainer::create(c, traceOn ? rec.get() : nullptr, mpi.options);
        if (p) parallel = std::move(*p);
        else created = p.status();
    } else if (Status ok = engine::checkDeviceBackend(c, engine::unverifiedCudaRequested()); !ok) {
        created = ok;  // before making a backend: cuda where it cannot run says why
    } else {
        // device_backend: cuda: GPU 0 of the CUDA backend
        if (c.device_backend == "cuda") {
            auto be = engine::makeCudaBackend();
            if (be) backend = std::move(*be);
            else created = be.status();
        } else {
            backend = engine::makeCpuBackend(1);
        }
        if (backend) {
            dev = &backend->device(0);
            if (traceOn) dev->setTrace(rec.get(), 0);
            stream = dev->createStream(trace::TrackKind::Compute, "compute");
            auto t = engine::Trainer::create(c, dev, stream.get(), nullptr);
            if (t) single = std::move(*t);
            else created = t.status();
        }
    }
    if (parallel)
        for (const std::string& w : parallel->warnings()) {
            rec->appendLog("warning", w);
            if (!jsonOut) std::fprintf(stderr, "trainscope run: warning: %s\n", forTerminal(w).c_str());
        }
    mpi.attachWriter(*rec);
    if (!created) {
        if (dev) dev->setTrace(nullptr, 0);
        const std::string why = mpi.announceFailure(created.message());
        (void)mpi.shipTrace(true);
        (void)finish("failed", why);
        return fail(exitCodeFor(created), created.message());
    }
    // Peak of one device (the parallel engine runs one GEMM thread per rank).
    const double peakTflops =
        devicePeakTflops(c, single ? *dev : parallel->backend().device(0),
                         parallel ? 1 : (c.cpu_threads > 0 ? c.cpu_threads : kernels::cpu::numThreads()));
    if (single) single->setPeakTflops(peakTflops);
    else parallel->setPeakTflops(peakTflops);
    json meta = single ? single->runMetadata() : parallel->runMetadata();
    if (c.device_backend == "cuda") {
        // What `analyze` looks MFU's peak up by (resources/peak_flops.json), as an imported
        // Nsight or Kineto trace says it; a CPU run keeps its measured peak_tflops instead.
        meta["device_name"] = (single ? *dev : parallel->backend().device(0)).info().name;
        // FP8 runs count against the bf16 peak too (Megatron's MFU; our FP8 GEMMs are not FP8 yet).
        meta["dtype"] = c.bf16 ? "bf16" : "fp32";
    }
    for (auto it = meta.begin(); it != meta.end(); ++it)
        rec->metadata(it.key(), it->is_string() ? it->get<std::string>() : dumpJson(*it));
    const std::string dataText = single ? single->data().description() : meta.value("data", std::string());
    const int64_t numParams = single ? single->model().params().numel() : meta.value("num_parameters", int64_t(0));
    const double flopsPerStep = single ? single->modelFlopsPerStep() : parallel->modelFlopsPerStep();
    rec->appendLog("info", "data: " + dataText);
    if (jsonOut) {
        std::printf("%s\n", dumpJson(json{{"event", "start"},
                                 {"run_file", runFile},
                                 {"name", info.name},
                                 {"steps", c.train_iters},
                                 {"world_size", ds.world},
                                 {"model_flops_per_step", flopsPerStep},
                                 {"num_parameters", numParams},
                                 {"peak_tflops_per_device", peakTflops},
                                 {"flops_formula", meta.value("flops_formula", std::string())},
                                 {"data", dataText}})
                                .c_str());
        std::fflush(stdout);
    } else {
        std::fprintf(stderr, "trainscope run: %s, %lld parameters, %s, %s; run file %s\n", forTerminal(info.name).c_str(),
                     (long long)numParams, info.layout.c_str(), forTerminal(dataText).c_str(),
                     forTerminal(runFile).c_str());
    }
    // GPUs: their kernels, copies and API calls come from CUPTI (the engine records the host side).
    std::unique_ptr<GpuCapture> gpuCapture;
    if (traceOn && c.device_backend == "cuda") {
        std::string why;
        gpuCapture = GpuCapture::start(*rec, single ? std::vector<std::pair<int, const engine::Device*>>{{0, dev}}
                                                    : parallel->localDevices(),
                                       &why);
        if (!gpuCapture)
            rec->appendLog("warning", "the trace has no GPU kernels (only the host side): " + why);
    }
    engine::TrainerCallbacks cb;
    cb.onStep = [&](const engine::StepProgress& p) {
        if (gpuCapture)
            if (Status f = gpuCapture->flush(); !f) rec->appendLog("warning", "GPU capture: " + f.message());
        profiler::StepMetrics m;
        m.step = p.step;
        m.loss = p.loss;
        m.stepTimeS = p.stepTimeS;
        m.tokensPerS = p.tokensPerS;
        m.modelTflops = p.modelTflops;
        m.gradNorm = p.gradNorm;
        m.lr = p.lr;
        m.peakMemoryBytes = p.peakMemoryBytes;
        m.tsNs = monotonicNs();
        rec->appendStepMetrics(m);
        // The other processes' trace and log lines of this step (a collective over them).
        if (Status shipped = mpi.shipTrace(); !shipped)
            rec->appendLog("warning", "the other processes' trace of step " + std::to_string(p.step) +
                                          " did not arrive: " + shipped.message());
        // A step is reported only once it is committed to the run file: whoever reads the
        // report (a terminal, the agent, the GUI) never sees a step the file lacks after a
        // kill. A failed write stops the run (it is then reported as failed).
        if (!noteWrite(rec->flush())) {
            g_cancel.store(true);
            return;
        }
        if (jsonOut) {
            std::printf("%s\n", dumpJson(stepJson(p)).c_str());
            std::fflush(stdout);
        } else {
            progressBar(p, c.train_iters);
        }
    };
    cb.onLog = [&](const std::string& s) { rec->appendLog("info", sanitizeUtf8(s)); };
    if (parallel) {
        applyInjectedFailure(*parallel);
        mpi.watch(*parallel, &g_cancel);
    }
    Status st = single ? single->train(-1, cb, &g_cancel) : parallel->train(-1, cb, &g_cancel);
    mpi.unwatch();
    if (mpi.active) {
        // The first failure anywhere is the run's reason (another process's notice, if one came).
        if (!st && st.code() != ErrorCode::Cancelled) st = Status(st.code(), mpi.announceFailure(st.message()));
        // Recorded before the last exchange: when the launcher is tearing the job down (a process
        // was killed), this process may be killed next.
        if (st.code() == ErrorCode::Cancelled) {
            // Stopped by a signal: under a launcher that usually means another process died.
            // Then the run failed: a process is gone, and the launcher stopped the others.
            const std::string gone = mpi.deadPeers();
            st = gone.empty() ? Status(ErrorCode::Cancelled, cancelReason(st.message()))
                              : Status::comm(gone + "; the launcher then stopped this process (" +
                                             cancelReason(st.message()) + ")");
        }
        if (!st) {
            rec->setRunStatus(st.code() == ErrorCode::Cancelled ? "cancelled" : "failed", st.message());
            (void)rec->flush();
        }
        if (Status shipped = mpi.shipTrace(true); !shipped)
            rec->appendLog("warning", "the other processes' last trace did not arrive: " + shipped.message());
    }
    const int iterations = single ? single->iteration() : parallel->iteration();
    if (!jsonOut) std::fprintf(stderr, "\n");
    // Every rank's streams are drained and detached before the recorder closes.
    if (dev) dev->setTrace(nullptr, 0);
    single.reset();
    parallel.reset();
    if (gpuCapture) {
        if (Status s = gpuCapture->stop(); !s) rec->appendLog("warning", "GPU capture: " + s.message());
        gpuCapture.reset();
    }
    const bool cancelled = st.code() == ErrorCode::Cancelled && writeError.isOk();
    auto [status, reason] = cancelled ? finish("cancelled", mpi.active ? st.message() : cancelReason(st.message()))
                            : !st && writeError.isOk() ? finish("failed", st.message())
                                                       : finish("completed", "");
    if (status == "cancelled") {
        if (!jsonOut) std::fprintf(stderr, "trainscope run: cancelled; run file %s\n", forTerminal(runFile).c_str());
        return 130;
    }
    if (status == "failed") return fail(1, reason + " (run file " + runFile + ")");
    if (!jsonOut)
        std::fprintf(stderr, "trainscope run: completed %d steps; run file %s\n", iterations, forTerminal(runFile).c_str());
    return 0;
}

int cmdDemo(const Args& a) {
    if (auto bad = a.unknownFlags({"--steps"}); !bad.empty())
        return fail(2, "unknown option " + bad[0] + " for `demo`");
    std::string path = std::string(TS_SOURCE_DIR) + "/resources/examples/tiny.yaml";
    std::error_code ec;
    if (!fs::exists(path, ec)) path = "resources/examples/tiny.yaml";
    auto cfg = loadRunConfig(path, a);
    if (!cfg) return fail(exitCodeFor(cfg.status()), cfg.status().message());
    engine::Config c = *cfg;
    if (!a.value("--steps")) c.train_iters = 20;
    SignalGuard guard;
    TimeSummaryRecorder summary;
    std::unique_ptr<engine::Backend> backend = engine::makeCpuBackend(1);
    engine::Device& dev = backend->device(0);
    dev.setTrace(&summary, 0);
    auto stream = dev.createStream(trace::TrackKind::Compute, "compute");
    auto trainer = engine::Trainer::create(c, &dev, stream.get(), nullptr);
    if (!trainer) return fail(exitCodeFor(trainer.status()), trainer.status().message());
    engine::Trainer& t = **trainer;
    std::printf("trainscope demo: %s (%lld parameters), %d steps on the CPU backend\n", path.c_str(),
                (long long)t.model().params().numel(), c.train_iters);
    std::printf("data: %s\n", t.data().description().c_str());
    double first = 0, last = 0, timeSum = 0, tflopsSum = 0;
    int measured = 0;
    engine::TrainerCallbacks cb;
    cb.onStep = [&](const engine::StepProgress& p) {
        if (p.step == 1) {
            first = p.loss;
            summary.reset();  // the first step includes one-time costs
        } else {
            timeSum += p.stepTimeS;
            tflopsSum += p.modelTflops;
            ++measured;
        }
        last = p.loss;
        progressBar(p, c.train_iters);
    };
    const Status st = t.train(-1, cb, &g_cancel);
    std::fprintf(stderr, "\n");
    dev.setTrace(nullptr, 0);
    if (!st && st.code() != ErrorCode::Cancelled) return fail(1, st.message());
    std::printf("loss %.4f -> %.4f (ln(vocab) = %.4f)\n", first, last, std::log(double(c.vocab_size)));
    if (measured > 0)
        std::printf("mean step %.3f s, %.4f model TFLOP/s (%s)\n", timeSum / measured, tflopsSum / measured,
                    "Megatron FLOPs formula");
    summary.print(std::max(1, measured));
    return st.code() == ErrorCode::Cancelled ? 130 : 0;
}

}  // namespace ts::cli
