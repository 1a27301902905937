// `trainscope run` under mpirun / srun (see mpi_launch.h). One global rank per process: MPI
// world rank r runs global rank r of the Megatron layout; every process group of the layout
// that contains r becomes an MPI communicator over the same members (MPI_Comm_create_group,
// in the same order on every member, since every process builds its groups in the trainer's
// order). Per-step host results (losses, peak memory, failure flags) travel over one extra MPI
// group "host" spanning the world; the followers' traces over two more ("trace" after every
// step, "trace-final" once at the end, so a run aborted mid-step still ships its last part),
// each on a dedicated stream of a private one-device CPU backend (never traced).
#include "apps/trainscope/mpi_launch.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/trainscope/commands.h"
#include "apps/trainscope/gpu_capture.h"
#include "common/clock.h"
#include "engine/backend/backend.h"
#include "engine/comm/communicator.h"
#ifdef TS_HAVE_NCCL
#include "engine/comm/nccl/nccl_communicator.h"
#endif
#include "engine/config/config.h"
#include "engine/parallel/layout.h"
#include "kernels/cpu/ops.h"
#include "profiler/forwarding_recorder.h"
#include "profiler/store.h"

#ifdef TS_HAVE_MPI
#include "engine/comm/mpi/mpi_communicator.h"
#endif

namespace ts::cli {

namespace {

// Strict non-negative int parse; nullopt-like -1 on malformed input.
int parseCount(const char* v) {
    if (!v || !*v) return -1;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (errno || *end || n < 0 || n > (1L << 30)) return -1;
    return int(n);
}

std::string thisHost() {
    char buf[256] = {};
    if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
    return buf;
}

}  // namespace

Result<LauncherEnv> detectLauncher(const std::function<const char*(const char*)>& getenv) {
    struct Scheme {
        const char* launcher;
        const char* rank;
        const char* size;
        const char* local;  // may be absent in the environment
    };
    // Order matters: see mpi_launch.h.
    static const Scheme kSchemes[] = {
        {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
        {"slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
        {"pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK"},
    };
    for (const Scheme& s : kSchemes) {
        const char* sizeText = getenv(s.size);
        if (!sizeText) continue;
        const char* rankText = getenv(s.rank);
        LauncherEnv e;
        e.launcher = s.launcher;
        e.size = parseCount(sizeText);
        e.rank = parseCount(rankText);
        const char* localText = getenv(s.local);
        e.localRank = localText ? parseCount(localText) : 0;
        e.variables = std::string(s.rank) + "=" + (rankText ? rankText : "(unset)") + " " + s.size + "=" + sizeText;
        if (localText) e.variables += std::string(" ") + s.local + "=" + localText;
        if (e.size < 1)
            return Status::invalid(std::string(s.size) + "='" + sizeText + "' is not a process count (" + s.launcher +
                                   " launch); unset it or start trainscope through the launcher");
        if (e.rank < 0 || e.rank >= e.size)
            return Status::invalid(std::string(s.rank) + "='" + (rankText ? rankText : "") + "' is not a rank below " +
                                   s.size + "=" + sizeText + " (" + s.launcher +
                                   " launch); unset them or start trainscope through the launcher");
        if (e.localRank < 0)
            return Status::invalid(std::string(s.local) + "='" + localText + "' is not a local rank (" + s.launcher +
                                   " launch)");
        return e;
    }
    return LauncherEnv{};
}

Result<LauncherEnv> detectLauncher() {
    return detectLauncher([](const char* name) -> const char* { return std::getenv(name); });
}

void applyInjectedFailure(engine::ParallelTrainer& trainer) {
    const char* v = std::getenv("TRAINSCOPE_INJECT_FAILURE");
    if (!v) return;
    const std::string text = v;
    const size_t colon = text.find(':');
    if (colon == std::string::npos) return;
    const int rank = parseCount(text.substr(0, colon).c_str());
    const int step = parseCount(text.substr(colon + 1).c_str());
    if (rank < 0 || step < 0) return;
    trainer.injectFailure(rank, step, "injected_failure");
}

int launcherProcessCount() {
    auto e = detectLauncher();
    return e ? e->size : 1;
}

double devicePeakTflops(const engine::Config& c, const engine::Device& dev, int cpuThreads) {
    if (c.device_backend == "cuda") return c.bf16 ? dev.info().peakTflopsBf16 : dev.info().peakTflopsFp32;
    return kernels::cpu::measureSgemmPeakGflops(cpuThreads, 512, 0.2) / 1e3;
}

#ifdef TS_HAVE_MPI

namespace {

// Everything the launch shares with the trainer's callbacks and the watcher threads. Destroyed
// (threads first, then communicators) before MPI finalizes: the runtime outlives every copy of
// MpiLaunch's shared pointers because MpiLaunch declares it first.
struct Link {
    engine::MpiRuntime* rt = nullptr;
    int process = 0, processes = 1, perProcess = 1;
    std::unique_ptr<engine::Backend> backend;  // one CPU device that only runs these streams
    std::unique_ptr<engine::Stream> hostStream, traceStream;
    std::unique_ptr<engine::Communicator> host, trace, traceFinal;
    std::vector<std::string> hosts;
    std::vector<int64_t> pids;
    std::vector<int64_t> offsetNs, errorNs;  // per process, vs process 0's clock
    std::vector<bool> measured;

    // writer side (process 0)
    profiler::CaptureRecorder* rec = nullptr;
    std::vector<std::unique_ptr<profiler::TraceReplayer>> replayers;

    // failures
    std::mutex mu;
    std::string firstNotice;       // the first other process's failure notice
    engine::ParallelTrainer* trainer = nullptr;
    std::thread cancelWatch;
    std::atomic<bool> stopWatch{false};
    std::string announcedText;  // this process's own notice, once sent
    std::atomic<bool> peerGone{false};  // a process of this run is known dead: no final ship

    ~Link() {
        stopCancelWatch();
        if (rt) rt->stopNotices();
        for (auto* s : {hostStream.get(), traceStream.get()})
            if (s) (void)s->synchronize();
        host.reset();
        trace.reset();
        traceFinal.reset();
        hostStream.reset();
        traceStream.reset();
        backend.reset();
    }
    void stopCancelWatch() {
        stopWatch = true;
        if (cancelWatch.joinable()) cancelWatch.join();
        stopWatch = false;
    }
    // Stops everything in flight in this process (not traceFinal: the last ship still runs).
    void abortAll(const Status& why) {
        std::lock_guard<std::mutex> lock(mu);
        if (trainer) trainer->abort(why);
        if (host) host->abort(why);
        if (trace) trace->abort(why);
    }
    // See MpiLaunch::announceFailure.
    std::string announce(const std::string& why) {
        std::string text;
        {
            std::lock_guard<std::mutex> lock(mu);
            if (!firstNotice.empty()) return firstNotice;  // another process failed first
            if (!announcedText.empty()) return announcedText;
            text = announcedText = who(process) + " failed: " + why;
        }
        (void)rt->announce(text);
        return text;
    }
    std::string deadPeers() const {
        std::string out;
        for (int p = 0; p < processes; ++p) {
            if (p == process || hosts[size_t(p)] != hosts[size_t(process)]) continue;
            const pid_t pid = pid_t(pids[size_t(p)]);
            bool gone = kill(pid, 0) != 0 && errno == ESRCH;
            if (!gone) {  // a zombie (killed, not yet reaped by the launcher) is gone too
                std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
                std::string pidText, comm, state;
                if (stat >> pidText >> comm >> state) gone = state == "Z" || state == "X";
            }
            if (gone) out += (out.empty() ? "" : ", ") + who(p) + " is gone (killed or crashed)";
        }
        return out;
    }
    std::string who(int p) const {
        const std::string ranks = perProcess == 1 ? "rank " + std::to_string(p)
                                                  : "ranks " + std::to_string(p * perProcess) + "-" +
                                                        std::to_string((p + 1) * perProcess - 1);
        return "process " + std::to_string(p) + " (" + ranks + ", host " + hosts[size_t(p)] + ", pid " +
               std::to_string(pids[size_t(p)]) + ")";
    }
};

// Gathers every process's `mine` at process 0 (`out` filled there only).
Status gatherToRoot(engine::Communicator& c, engine::Stream& s, const std::string& mine, std::vector<std::string>* out) {
    const int n = c.size();
    std::vector<int64_t> sizes(size_t(n), 0);
    const int64_t my = int64_t(mine.size());
    c.allGather(s, &my, sizes.data(), 1, engine::DType::I64);
    TS_RETURN_IF_ERROR(s.synchronize());
    std::vector<size_t> sendCounts(size_t(n), 0), recvCounts(size_t(n), 0);
    sendCounts[0] = mine.size();
    size_t total = 0;
    if (c.rank() == 0)
        for (int p = 0; p < n; ++p) total += (recvCounts[size_t(p)] = size_t(sizes[size_t(p)]));
    std::string buf(total, '\0');
    c.allToAllv(s, mine.data(), sendCounts, buf.data(), recvCounts, engine::DType::U8);
    TS_RETURN_IF_ERROR(s.synchronize());
    if (out && c.rank() == 0) {
        out->assign(size_t(n), std::string());
        size_t at = 0;
        for (int p = 0; p < n; ++p) {
            (*out)[size_t(p)] = buf.substr(at, recvCounts[size_t(p)]);
            at += recvCounts[size_t(p)];
        }
    }
    return Status::ok();
}

// Clock offset of process p vs process 0 by ping-pong over `c` (group rank = process): the
// round trip with the smallest delay gives offset = t_p - (t_send + t_recv) / 2, error <= rtt/2.
Status measureClock(engine::Communicator& c, engine::Stream& s, int p, int64_t* offset, int64_t* error) {
    constexpr int kRounds = 16;
    int64_t best = INT64_MAX;
    for (int k = 0; k < kRounds; ++k) {
        int64_t ping = k, pong = 0;
        if (c.rank() == 0) {
            const int64_t t0 = monotonicNs();
            c.batchSendRecv(s, {engine::P2POp{engine::P2POp::Send, p, &ping, 1, engine::DType::I64, 0}});
            c.batchSendRecv(s, {engine::P2POp{engine::P2POp::Recv, p, &pong, 1, engine::DType::I64, 0}});
            TS_RETURN_IF_ERROR(s.synchronize());
            const int64_t t1 = monotonicNs();
            if (t1 - t0 < best) {
                best = t1 - t0;
                *offset = pong - (t0 + t1) / 2;
                *error = (t1 - t0 + 1) / 2;
            }
        } else if (c.rank() == p) {
            c.batchSendRecv(s, {engine::P2POp{engine::P2POp::Recv, 0, &ping, 1, engine::DType::I64, 0}});
            TS_RETURN_IF_ERROR(s.synchronize());
            pong = monotonicNs();
            c.batchSendRecv(s, {engine::P2POp{engine::P2POp::Send, 0, &pong, 1, engine::DType::I64, 0}});
            TS_RETURN_IF_ERROR(s.synchronize());
        }
    }
    return Status::ok();
}

Link& linkOf(const MpiLaunch& l) { return *static_cast<Link*>(l.link.get()); }

}  // namespace

Result<MpiLaunch> mpiLaunchFor(const engine::Config& c) {
    MpiLaunch l;
    TS_ASSIGN_OR_RETURN(l.env, detectLauncher());
    if (l.env.size <= 1) return l;
    TS_ASSIGN_OR_RETURN(std::unique_ptr<engine::MpiRuntime> rt, engine::MpiRuntime::init(nullptr, nullptr));
    if (rt->worldSize() != l.env.size || rt->worldRank() != l.env.rank)
        return Status::invalid("the launcher (" + l.env.launcher + ": " + l.env.variables + ") and MPI (rank " +
                               std::to_string(rt->worldRank()) + " of " + std::to_string(rt->worldSize()) +
                               ") disagree about this process; with srun, start MPI programs through srun's PMI "
                               "(e.g. srun --mpi=pmix), or use mpirun");
    const int world = engine::deriveSizes(c).world;
    const int processes = rt->worldSize();
    if (world % processes != 0)
        return Status::invalid("the config's world size is " + std::to_string(world) + " ranks (tp x cp x pp x dp) but " +
                               "mpirun started " + std::to_string(processes) +
                               " processes; each process runs world/processes ranks, so use `mpirun -np " +
                               std::to_string(world) + "` (one rank each) or a divisor of " + std::to_string(world) +
                               ", or --world-size with a multiple of " + std::to_string(processes) +
                               " if the layout allows it");
    // Process p runs global ranks [p*T, (p+1)*T): with Megatron's order (tp fastest) a process
    // holds whole TP groups, as a node does.
    const int perProcess = world / processes;
    l.active = true;
    l.process = rt->worldRank();
    l.processes = processes;
    l.ranksPerProcess = perProcess;
    engine::MpiRuntime* raw = rt.get();
    l.runtime = std::shared_ptr<engine::MpiRuntime>(std::move(rt));

    auto link = std::make_shared<Link>();
    Link& L = *link;
    L.rt = raw;
    L.process = l.process;
    L.processes = l.processes;
    L.perProcess = perProcess;
    L.backend = engine::makeCpuBackend(1);
    L.hostStream = L.backend->device(0).createStream(trace::TrackKind::Comm, "host_exchange");
    L.traceStream = L.backend->device(0).createStream(trace::TrackKind::Comm, "trace_exchange");
    std::vector<int> all;  // every process
    for (int p = 0; p < processes; ++p) all.push_back(p);
    TS_ASSIGN_OR_RETURN(L.host, raw->createGroup("host", all, l.options.commTimeout));
    TS_ASSIGN_OR_RETURN(L.trace, raw->createGroup("trace", all, l.options.commTimeout));
    TS_ASSIGN_OR_RETURN(L.traceFinal, raw->createGroup("trace-final", all, std::chrono::seconds(5)));

    // Host name and pid of every process (fixed 256-byte records: name, NUL padded, then pid).
    {
        constexpr size_t kRec = 256;
        std::string mine(kRec, '\0');
        const std::string h = thisHost();
        std::memcpy(mine.data(), h.data(), std::min(h.size(), kRec - 9));
        const int64_t pid = int64_t(getpid());
        std::memcpy(mine.data() + kRec - 8, &pid, 8);
        std::string allRecs(kRec * size_t(processes), '\0');
        L.host->allGather(*L.hostStream, mine.data(), allRecs.data(), kRec, engine::DType::U8);
        TS_RETURN_IF_ERROR(L.hostStream->synchronize());
        for (int p = 0; p < processes; ++p) {
            const char* r = allRecs.data() + size_t(p) * kRec;
            L.hosts.emplace_back(r, strnlen(r, kRec - 8));
            int64_t q = 0;
            std::memcpy(&q, r + kRec - 8, 8);
            L.pids.push_back(q);
        }
        l.hosts = L.hosts;
    }
    // Clocks: one monotonic clock per host; other hosts measured (TS_CLOCK_ALIGN=measure
    // measures every process, e.g. to check the method on one machine).
    {
        const char* mode = std::getenv("TS_CLOCK_ALIGN");
        const bool force = mode && std::string(mode) == "measure";
        L.offsetNs.assign(size_t(processes), 0);
        L.errorNs.assign(size_t(processes), 0);
        L.measured.assign(size_t(processes), false);
        for (int p = 1; p < processes; ++p) {
            if (!force && L.hosts[size_t(p)] == L.hosts[0]) continue;
            L.measured[size_t(p)] = true;
            TS_RETURN_IF_ERROR(measureClock(*L.trace, *L.traceStream, p, &L.offsetNs[size_t(p)], &L.errorNs[size_t(p)]));
        }
        // Every process learns the offsets (its own is what it would subtract; process 0 uses them).
        std::vector<int64_t> both(size_t(processes) * 2, 0);
        std::vector<int64_t> mine = {L.offsetNs[size_t(l.process)], L.errorNs[size_t(l.process)]};
        if (l.process == 0) {
            for (int p = 0; p < processes; ++p) {
                both[size_t(p) * 2] = L.offsetNs[size_t(p)];
                both[size_t(p) * 2 + 1] = L.errorNs[size_t(p)];
            }
        }
        L.trace->broadcast(*L.traceStream, both.data(), both.size(), engine::DType::I64, 0);
        TS_RETURN_IF_ERROR(L.traceStream->synchronize());
        for (int p = 0; p < processes; ++p) {
            L.offsetNs[size_t(p)] = both[size_t(p) * 2];
            L.errorNs[size_t(p)] = both[size_t(p) * 2 + 1];
        }
    }
    // Failure notices from the other processes: the first one is the run's cause.
    Link* lp = &L;
    TS_RETURN_IF_ERROR(raw->startNotices([lp](int from, const std::string& text) {
        {
            std::lock_guard<std::mutex> lock(lp->mu);
            if (lp->firstNotice.empty()) lp->firstNotice = text;
        }
        (void)from;
        lp->abortAll(Status::comm(text));
    }));

    l.options.localRanks.clear();
    for (int r = 0; r < perProcess; ++r) l.options.localRanks.push_back(l.process * perProcess + r);
    if (c.device_backend == "cuda") {
        // GPUs: one rank per process, on the GPU of its place among this host's processes; each
        // group is an NCCL communicator bootstrapped over MPI.
        if (perProcess != 1)
            return Status::unsupported("device_backend: cuda under " + l.env.launcher + " runs one rank per process, on "
                                       "one GPU each, but " + std::to_string(processes) + " processes share " +
                                       std::to_string(world) + " ranks; start `mpirun -np " + std::to_string(world) +
                                       "` (one process per GPU)");
#ifdef TS_HAVE_NCCL
        int gpu = 0;
        for (int p = 0; p < l.process; ++p) gpu += L.hosts[size_t(p)] == L.hosts[size_t(l.process)] ? 1 : 0;
        l.options.cudaDevices = {gpu};
        l.options.makeGroup = [gpu](const std::string& name, const std::vector<int>& members, int) {
            return engine::createNcclGroupMpi(name, members, gpu);
        };
#else
        return Status::unsupported("device_backend: cuda across processes needs NCCL, and this build has none; "
                                   "install NCCL (libnccl-dev) and rebuild");
#endif
    } else if (perProcess == 1) {
        // One rank per process: each group is an MPI communicator over its members' processes.
        l.options.makeGroup = [raw, timeout = l.options.commTimeout](
                                  const std::string& name, const std::vector<int>& members,
                                  int) { return raw->createGroup(name, members, timeout); };
    } else {
        // Several rank threads per process: groups of tagged point-to-point traffic between ranks.
        TS_RETURN_IF_ERROR(raw->enableThreadGroups());
        std::vector<int> processOf;
        for (int g = 0; g < world; ++g) processOf.push_back(g / perProcess);
        l.options.makeGroup = [raw, processOf, timeout = l.options.commTimeout](
                                  const std::string& name, const std::vector<int>& members, int globalRank) {
            const auto& names = engine::ParallelLayout::groupNames();
            const auto it = std::find(names.begin(), names.end(), name);
            const int key = it != names.end() ? int(it - names.begin())
                                              : int(names.size() + std::hash<std::string>{}(name) % 16);
            return raw->createThreadGroup(name, key, members, globalRank, processOf, timeout);
        };
    }
    l.options.gatherHost = [lp](const std::vector<double>& in, int recordSize, std::vector<double>& out) -> Status {
        if (in.size() != size_t(recordSize) * size_t(lp->perProcess))
            return Status::internal("a process of " + std::to_string(lp->perProcess) + " ranks expects as many records, got " +
                                    std::to_string(in.size()) + " values for records of " + std::to_string(recordSize));
        out.assign(size_t(lp->host->size()) * in.size(), 0.0);
        // Doubles moved bit for bit (8-byte elements; all-gather does no arithmetic).
        lp->host->allGather(*lp->hostStream, in.data(), out.data(), in.size(), engine::DType::I64);
        return lp->hostStream->synchronize();
    };
    // Checkpoints: the parameter table and the partial images travel over the "host" group.
    l.options.gatherText = [lp](const std::string& mine, std::vector<std::string>& all) -> Status {
        engine::Communicator& c = *lp->host;
        const int n = c.size();
        std::vector<int64_t> sizes(size_t(n), 0);
        const int64_t my = int64_t(mine.size());
        c.allGather(*lp->hostStream, &my, sizes.data(), 1, engine::DType::I64);
        TS_RETURN_IF_ERROR(lp->hostStream->synchronize());
        std::vector<size_t> sendCounts(static_cast<size_t>(n), mine.size()), recvCounts(static_cast<size_t>(n), 0);
        size_t total = 0;
        for (int p = 0; p < n; ++p) total += (recvCounts[size_t(p)] = size_t(sizes[size_t(p)]));
        std::string buf(total, '\0');
        std::string out;  // one copy of `mine` per destination, in process order
        for (int p = 0; p < n; ++p) out += mine;
        c.allToAllv(*lp->hostStream, out.data(), sendCounts, buf.data(), recvCounts, engine::DType::U8);
        TS_RETURN_IF_ERROR(lp->hostStream->synchronize());
        all.clear();
        size_t at = 0;
        for (int p = 0; p < n; ++p) {
            all.push_back(buf.substr(at, recvCounts[size_t(p)]));
            at += recvCounts[size_t(p)];
        }
        return Status::ok();
    };
    // The words' integer sum: each is nonzero in at most one process, so it is that one's bits.
    l.options.mergeHost = [lp](uint32_t* words, size_t n) -> Status {
        constexpr size_t kChunk = size_t(1) << 28;  // MPI counts are ints
        for (size_t at = 0; at < n; at += kChunk) {
            const size_t len = std::min(kChunk, n - at);
            lp->host->allReduce(*lp->hostStream, words + at, words + at, len, engine::DType::I32, engine::ReduceOp::Sum);
            TS_RETURN_IF_ERROR(lp->hostStream->synchronize());
        }
        return Status::ok();
    };
    // The first failing rank of this process tells the others at once, then stops this
    // process's own exchanges (nobody will answer them).
    l.options.onFailure = [lp](const Status& st) {
        const std::string text = lp->announce(st.message());
        lp->abortAll(Status::comm(text));
    };
    if (l.process != 0) l.forward = std::make_shared<profiler::ForwardingRecorder>();
    l.link = link;
    return l;
}

void MpiLaunch::attachWriter(profiler::CaptureRecorder& rec) {
    if (!active) return;
    Link& L = linkOf(*this);
    L.rec = &rec;
    L.replayers.clear();
    L.replayers.resize(size_t(processes));
    nlohmann::json align = nlohmann::json::array();
    int64_t worst = 0;
    for (int p = 0; p < processes; ++p) {
        align.push_back({{"process", p},
                         {"host", L.hosts[size_t(p)]},
                         {"pid", L.pids[size_t(p)]},
                         {"method", p == 0 ? "reference" : L.measured[size_t(p)] ? "ping-pong" : "same host clock"},
                         {"offset_ns", L.offsetNs[size_t(p)]},
                         {"error_ns", L.errorNs[size_t(p)]}});
        worst = std::max(worst, L.errorNs[size_t(p)]);
        if (p == 0) continue;
        profiler::TraceReplayer::Options o;
        o.clockOffsetNs = L.offsetNs[size_t(p)];
        o.correlationTag = profiler::correlationTagFor(p);
        const std::string prefix = "[" + L.who(p) + "] ";
        o.onLog = [&rec, prefix](int64_t ts, const std::string& level, const std::string& text) {
            rec.appendLog(ts, level, prefix + text);
        };
        L.replayers[size_t(p)] = std::make_unique<profiler::TraceReplayer>(rec, o);
    }
    rec.metadata("clock_alignment", align.dump());
    rec.metadata("launcher", env.launcher);
    bool anyMeasured = false;
    for (bool m : L.measured) anyMeasured = anyMeasured || m;
    char err[96];
    if (anyMeasured) std::snprintf(err, sizeof err, "clock alignment error at most %.3f us (ping-pong)", double(worst) * 1e-3);
    else std::snprintf(err, sizeof err, "one host, one clock (alignment error 0)");
    rec.appendLog("info", env.launcher + " launch: " + std::to_string(processes) + " processes, " +
                              (ranksPerProcess == 1 ? std::string("one rank each")
                                                    : std::to_string(ranksPerProcess) + " rank threads each") +
                              ", on " + [&] {
                                  std::vector<std::string> u;
                                  for (const auto& h : L.hosts)
                                      if (std::find(u.begin(), u.end(), h) == u.end()) u.push_back(h);
                                  std::string s = std::to_string(u.size()) + " host(s) (";
                                  for (size_t i = 0; i < u.size(); ++i) s += (i ? ", " : "") + u[i];
                                  return s + ")";
                              }() + "; every rank's trace is in this run file; " + err);
}

Status MpiLaunch::shipTrace(bool final) {
    if (!active) return Status::ok();
    Link& L = linkOf(*this);
    if (final && L.peerGone.load())
        return Status::comm("not shipped: a process of this run is gone (" + L.deadPeers() + ")");
    engine::Communicator& c = final ? *L.traceFinal : *L.trace;
    const std::string blob = forward ? forward->drain() : std::string();
    std::vector<std::string> got;
    TS_RETURN_IF_ERROR(gatherToRoot(c, *L.traceStream, blob, process == 0 ? &got : nullptr));
    if (process != 0 || !L.rec) return Status::ok();
    for (int p = 1; p < processes && size_t(p) < got.size(); ++p) {
        if (got[size_t(p)].empty() || !L.replayers[size_t(p)]) continue;
        Status st = L.replayers[size_t(p)]->apply(got[size_t(p)]);
        if (!st) L.rec->appendLog("warning", "trace of " + L.who(p) + ": " + st.message());
    }
    return Status::ok();
}

void MpiLaunch::watch(engine::ParallelTrainer& trainer, const std::atomic<bool>* cancel) {
    if (!active) return;
    Link& L = linkOf(*this);
    {
        std::lock_guard<std::mutex> lock(L.mu);
        L.trainer = &trainer;
        // A notice that came before the trainer existed still stops it.
        if (!L.firstNotice.empty()) trainer.abort(Status::comm(L.firstNotice));
    }
    if (!cancel) return;
    L.stopCancelWatch();
    Link* lp = &L;
    L.cancelWatch = std::thread([lp, cancel] {
        while (!lp->stopWatch.load()) {
            if (cancel->load()) {
                const std::string gone = lp->deadPeers();
                if (!gone.empty()) lp->peerGone = true;
                lp->abortAll(Status::cancelled("stopped by a signal" +
                                               (gone.empty() ? std::string() : "; gone from this host: " + gone)));
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    });
}

void MpiLaunch::unwatch() {
    if (!active) return;
    Link& L = linkOf(*this);
    L.stopCancelWatch();
    std::lock_guard<std::mutex> lock(L.mu);
    L.trainer = nullptr;
}

std::string MpiLaunch::announceFailure(const std::string& why) {
    return active ? linkOf(*this).announce(why) : why;
}

std::string MpiLaunch::deadPeers() const { return active ? linkOf(*this).deadPeers() : std::string(); }

int runMpiFollower(const engine::Config& c, MpiLaunch& launch, bool traceOn, const std::atomic<bool>* cancel) {
    profiler::ForwardingRecorder* fwd = launch.forward.get();
    auto t = engine::ParallelTrainer::create(c, traceOn ? fwd : nullptr, launch.options);
    if (!t) {
        const std::string why = launch.announceFailure(t.status().message());
        if (fwd) fwd->log("error", why);
        (void)launch.shipTrace(true);
        return fail(1, "process " + std::to_string(launch.process) + ": " + t.status().message());
    }
    // The same peak measurement as process 0 (which does it before training), so that every
    // process starts its first step at the same time and knows its own device's peak.
    (*t)->setPeakTflops(devicePeakTflops(c, (*t)->backend().device(0), 1));
    std::unique_ptr<GpuCapture> gpuCapture;
    if (fwd && c.device_backend == "cuda") {
        std::string why;
        gpuCapture = GpuCapture::start(*fwd, (*t)->localDevices(), &why);
        if (!gpuCapture) fwd->log("warning", "the trace has no GPU kernels (only the host side): " + why);
    }
    engine::TrainerCallbacks cb;
    cb.onStep = [&](const engine::StepProgress&) {
        if (gpuCapture) (void)gpuCapture->flush();
        (void)launch.shipTrace();
    };
    cb.onLog = [&](const std::string& s) {
        if (fwd) fwd->log("info", s);
    };
    applyInjectedFailure(**t);
    launch.watch(**t, cancel);
    const Status st = (*t)->train(-1, cb, cancel);
    launch.unwatch();
    int rc = 0;
    if (!st) {
        const bool cancelled = st.code() == ErrorCode::Cancelled;
        const std::string why = cancelled ? st.message() : launch.announceFailure(st.message());
        if (fwd) fwd->log(cancelled ? "warning" : "error", why);
        std::fprintf(stderr, "trainscope run: process %d: %s\n", launch.process, forTerminal(st.message()).c_str());
        rc = cancelled ? 130 : 1;
    }
    if (gpuCapture) {
        (void)(*t)->synchronize();
        if (Status s = gpuCapture->stop(); !s) fwd->log("warning", "GPU capture: " + s.message());
    }
    (void)launch.shipTrace(true);
    t->reset();
    return rc;
}

#else  // no MPI in this build

Result<MpiLaunch> mpiLaunchFor(const engine::Config&) {
    const int n = launcherProcessCount();
    if (n > 1)
        return Status::unsupported("started by a launcher with " + std::to_string(n) +
                                   " processes, but this trainscope was built without MPI; rebuild with MPI "
                                   "(TS_ENABLE_MPI=ON and an MPI found by CMake) or run one process with "
                                   "world_size ranks as threads");
    return MpiLaunch{};
}

void MpiLaunch::attachWriter(profiler::CaptureRecorder&) {}
Status MpiLaunch::shipTrace(bool) { return Status::ok(); }
void MpiLaunch::watch(engine::ParallelTrainer&, const std::atomic<bool>*) {}
void MpiLaunch::unwatch() {}
std::string MpiLaunch::announceFailure(const std::string& why) { return why; }
std::string MpiLaunch::deadPeers() const { return {}; }

int runMpiFollower(const engine::Config&, MpiLaunch&, bool, const std::atomic<bool>*) {
    return fail(1, "this trainscope was built without MPI");
}

#endif

}  // namespace ts::cli
