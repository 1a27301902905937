// `trainscope run` under mpirun (see mpi_launch.h). One global rank per process: MPI world
// rank r runs global rank r of the Megatron layout; every process group of the layout that
// contains r becomes an MPI communicator over the same members (MPI_Comm_create_group, in the
// same order on every member, since every process builds its groups in the trainer's order).
// Per-step host results (losses, peak memory, failure flags) travel over one extra MPI group
// "host" spanning the world, with an all-gather on a dedicated stream.
#include "apps/trainscope/mpi_launch.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/trainscope/commands.h"
#include "engine/backend/backend.h"
#include "engine/comm/communicator.h"
#include "engine/config/config.h"

#ifdef TS_HAVE_MPI
#include "engine/comm/mpi/mpi_communicator.h"
#endif

namespace ts::cli {

int launcherProcessCount() {
    // OpenMPI (mpirun/prterun), MPICH/Intel hydra (PMI), PMIx-based launchers.
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
        if (const char* v = std::getenv(var)) {
            const int n = std::atoi(v);
            if (n > 0) return n;
        }
    }
    return 1;
}

#ifdef TS_HAVE_MPI

namespace {

// What the host gather needs; destroyed (communicator first) before MPI finalizes, since the
// runtime outlives every copy of the options.
struct HostExchange {
    std::unique_ptr<engine::Backend> backend;  // one CPU device that only runs this stream
    std::unique_ptr<engine::Stream> stream;
    std::unique_ptr<engine::Communicator> comm;
    ~HostExchange() {
        if (stream) (void)stream->synchronize();
        comm.reset();
        stream.reset();
        backend.reset();
    }
};

}  // namespace

Result<MpiLaunch> mpiLaunchFor(const engine::Config& c) {
    MpiLaunch l;
    if (launcherProcessCount() <= 1) return l;
    TS_ASSIGN_OR_RETURN(std::unique_ptr<engine::MpiRuntime> rt, engine::MpiRuntime::init(nullptr, nullptr));
    const int world = engine::deriveSizes(c).world;
    if (rt->worldSize() != world)
        return Status::invalid("the config's world size is " + std::to_string(world) + " ranks (tp x cp x pp x dp) but " +
                               "mpirun started " + std::to_string(rt->worldSize()) +
                               " processes; trainscope runs one rank per process: use `mpirun -np " +
                               std::to_string(world) + "`, or --world-size " + std::to_string(rt->worldSize()) +
                               " if the layout allows it");
    l.active = true;
    l.process = rt->worldRank();
    l.processes = rt->worldSize();
    engine::MpiRuntime* raw = rt.get();
    l.runtime = std::shared_ptr<engine::MpiRuntime>(std::move(rt));

    auto host = std::make_shared<HostExchange>();
    host->backend = engine::makeCpuBackend(1);
    host->stream = host->backend->device(0).createStream(trace::TrackKind::Comm, "host_exchange");
    std::vector<int> all;
    for (int r = 0; r < world; ++r) all.push_back(r);
    TS_ASSIGN_OR_RETURN(host->comm, raw->createGroup("host", all));

    l.options.localRanks = {l.process};
    l.options.makeGroup = [raw, timeout = l.options.commTimeout](const std::string& name, const std::vector<int>& members,
                                                                 int) { return raw->createGroup(name, members, timeout); };
    l.options.gatherHost = [host](const std::vector<double>& in, int recordSize, std::vector<double>& out) -> Status {
        if (in.size() != size_t(recordSize))
            return Status::internal("one rank per process expects one record, got " + std::to_string(in.size()) +
                                    " values for records of " + std::to_string(recordSize));
        out.assign(size_t(host->comm->size()) * in.size(), 0.0);
        // Doubles moved bit for bit (8-byte elements; all-gather does no arithmetic).
        host->comm->allGather(*host->stream, in.data(), out.data(), in.size(), engine::DType::I64);
        return host->stream->synchronize();
    };
    return l;
}

int runMpiFollower(const engine::Config& c, MpiLaunch& launch, const std::atomic<bool>* cancel) {
    auto t = engine::ParallelTrainer::create(c, nullptr, launch.options);
    if (!t) return fail(1, "process " + std::to_string(launch.process) + ": " + t.status().message());
    const Status st = (*t)->train(-1, {}, cancel);
    if (st.code() == ErrorCode::Cancelled) return 130;
    if (!st) return fail(1, "process " + std::to_string(launch.process) + ": " + st.message());
    return 0;
}

#else  // no MPI in this build

Result<MpiLaunch> mpiLaunchFor(const engine::Config&) {
    const int n = launcherProcessCount();
    if (n > 1)
        return Status::unsupported("started by an MPI launcher with " + std::to_string(n) +
                                   " processes, but this trainscope was built without MPI; rebuild with MPI "
                                   "(TS_ENABLE_MPI=ON and an MPI found by CMake) or run one process with "
                                   "world_size ranks as threads");
    return MpiLaunch{};
}

int runMpiFollower(const engine::Config&, MpiLaunch&, const std::atomic<bool>*) {
    return fail(1, "this trainscope was built without MPI");
}

#endif

}  // namespace ts::cli
