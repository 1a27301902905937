// NCCL communicator (see nccl_communicator.h).
#include "engine/comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#ifdef TS_HAVE_MPI
#include <mpi.h>
#endif

namespace ts::engine {

namespace {

Status fromNccl(ncclResult_t r, const std::string& what, ncclComm_t comm = nullptr) {
    if (r == ncclSuccess) return Status::ok();
    std::string msg = what + ": " + ncclGetErrorString(r);
    if (const char* last = ncclGetLastError(comm); last && *last) msg += std::string(" (") + last + ")";
    switch (r) {
        case ncclInvalidArgument:
        case ncclInvalidUsage: return Status::invalid(msg);
        case ncclSystemError:
        case ncclRemoteError: return Status::comm(msg);
        default: return Status::internal(msg);
    }
}

Status fromCuda(cudaError_t err, const std::string& what) {
    if (err == cudaSuccess) return Status::ok();
    (void)cudaGetLastError();
    return Status::internal(what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

Result<ncclDataType_t> ncclTypeOf(DType t) {
    switch (t) {
        case DType::F32: return ncclFloat32;
        case DType::BF16: return ncclBfloat16;
        case DType::F16: return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
        case DType::FP8E4M3: return ncclFloat8e4m3;
        case DType::FP8E5M2: return ncclFloat8e5m2;
#endif
        case DType::I32: return ncclInt32;
        case DType::I64: return ncclInt64;
        case DType::U8: return ncclUint8;
        default: break;
    }
    return Status::unsupported(std::string("dtype ") + dtypeName(t) + " is not supported by this NCCL (" +
                               std::to_string(NCCL_VERSION_CODE) + "; FP8 needs NCCL 2.24 or newer)");
}

ncclRedOp_t ncclOpOf(ReduceOp op) {
    switch (op) {
        case ReduceOp::Sum: return ncclSum;
        case ReduceOp::Max: return ncclMax;
        case ReduceOp::Min: return ncclMin;
        case ReduceOp::Avg: return ncclAvg;
    }
    return ncclSum;
}

// Sets `device` current for the scope, restores the caller's afterwards.
class DeviceScope {
public:
    explicit DeviceScope(int device) {
        if (cudaGetDevice(&m_prev) != cudaSuccess) m_prev = -1;
        if (m_prev != device) m_status = fromCuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
        m_device = device;
    }
    ~DeviceScope() {
        if (m_prev >= 0 && m_prev != m_device) (void)cudaSetDevice(m_prev);
    }
    const Status& status() const { return m_status; }

private:
    int m_prev = -1, m_device = -1;
    Status m_status;
};

// One NCCL communicator handle and what the ops share with abort().
struct CommShared {
    ncclComm_t comm = nullptr;
    std::string name;
    std::vector<int> ranks;  // group rank -> global rank
    int rank = 0, size = 0, device = 0;
    std::timed_mutex mutex;       // held while an op or destroy uses `comm`
    std::atomic<bool> aborted{false};
    std::mutex abortMutex;
    Status abortReason;           // guarded by abortMutex
    CommCounters counters;

    std::string where(const char* op) const {
        return std::string(op) + " in NCCL group '" + name + "' (global ranks " + rankList(ranks) + ") on rank " +
               std::to_string(rank) + " (global " + std::to_string(ranks[size_t(rank)]) + ")";
    }
    Status abortedStatus(const char* op) {
        std::lock_guard<std::mutex> lock(abortMutex);
        return Status::comm(where(op) + " failed because the communicator was aborted: " + abortReason.message());
    }
    void abort(const Status& why) {
        {
            std::lock_guard<std::mutex> lock(abortMutex);
            if (aborted.load()) return;
            abortReason = why.isOk() ? Status::comm("aborted") : why;
            aborted.store(true);
        }
        // An op being enqueued returns within microseconds; one that does not is stuck in NCCL,
        // which ncclCommAbort is made to interrupt.
        const bool locked = mutex.try_lock_for(std::chrono::milliseconds(100));
        if (comm) {
            DeviceScope d(device);
            (void)ncclCommAbort(comm);
            comm = nullptr;
        }
        if (locked) mutex.unlock();
    }
    ~CommShared() {
        if (!comm) return;
        DeviceScope d(device);
        (void)ncclCommDestroy(comm);
    }
};

// Element counts (size_t) -> byte offsets of a contiguous, rank-ordered layout.
std::vector<size_t> offsetsOf(const std::vector<size_t>& counts) {
    std::vector<size_t> off(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) off[i] = off[i - 1] + counts[i - 1];
    return off;
}

class NcclCommunicator final : public Communicator {
public:
    NcclCommunicator(std::shared_ptr<CommShared> shared, std::function<void(const Status&)> abortAll)
        : m_s(std::move(shared)), m_abortAll(std::move(abortAll)) {}

    int rank() const override { return m_s->rank; }
    int size() const override { return m_s->size; }
    const std::string& name() const override { return m_s->name; }
    std::vector<int> globalRanks() const override { return m_s->ranks; }

    void allReduce(Stream& s, const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
        const auto bytes = uint64_t(double(count * dtypeSize(t)) * busBwFactor(CollectiveKind::AllReduce, size()));
        enqueue(s, CollectiveKind::AllReduce, bytes, bytes, [=](ncclComm_t c, cudaStream_t st) -> Status {
            TS_ASSIGN_OR_RETURN(ncclDataType_t dt, ncclTypeOf(t));
            return fromNccl(ncclAllReduce(send, recv, count, dt, ncclOpOf(op), c, st), "ncclAllReduce", c);
        });
    }
    void reduceScatter(Stream& s, const void* send, void* recv, size_t recvCount, DType t, ReduceOp op) override {
        const uint64_t bytes = recvCount * dtypeSize(t) * uint64_t(size() - 1);
        enqueue(s, CollectiveKind::ReduceScatter, bytes, bytes, [=](ncclComm_t c, cudaStream_t st) -> Status {
            TS_ASSIGN_OR_RETURN(ncclDataType_t dt, ncclTypeOf(t));
            return fromNccl(ncclReduceScatter(send, recv, recvCount, dt, ncclOpOf(op), c, st), "ncclReduceScatter", c);
        });
    }
    void allGather(Stream& s, const void* send, void* recv, size_t sendCount, DType t) override {
        const uint64_t bytes = sendCount * dtypeSize(t) * uint64_t(size() - 1);
        enqueue(s, CollectiveKind::AllGather, bytes, bytes, [=](ncclComm_t c, cudaStream_t st) -> Status {
            TS_ASSIGN_OR_RETURN(ncclDataType_t dt, ncclTypeOf(t));
            return fromNccl(ncclAllGather(send, recv, sendCount, dt, c, st), "ncclAllGather", c);
        });
    }
    void broadcast(Stream& s, void* buffer, size_t count, DType t, int root) override {
        const uint64_t bytes = size() > 1 ? count * dtypeSize(t) : 0;
        const bool isRoot = rank() == root;
        const int n = size();
        enqueue(s, CollectiveKind::Broadcast, isRoot ? bytes : 0, isRoot ? 0 : bytes,
                [=](ncclComm_t c, cudaStream_t st) -> Status {
                    if (root < 0 || root >= n)
                        return Status::invalid("broadcast root " + std::to_string(root) + " is not a member of a group of " +
                                               std::to_string(n));
                    TS_ASSIGN_OR_RETURN(ncclDataType_t dt, ncclTypeOf(t));
                    return fromNccl(ncclBroadcast(buffer, buffer, count, dt, root, c, st), "ncclBroadcast", c);
                });
    }
    void batchSendRecv(Stream& s, const std::vector<P2POp>& ops) override {
        uint64_t sent = 0, received = 0;
        for (const P2POp& p : ops) (p.kind == P2POp::Send ? sent : received) += p.count * dtypeSize(p.dtype);
        const int n = size();
        enqueue(s, CollectiveKind::SendRecv, sent, received, [ops, n](ncclComm_t c, cudaStream_t st) -> Status {
            for (const P2POp& p : ops) {
                if (p.peer < 0 || p.peer >= n)
                    return Status::invalid("send_recv: peer " + std::to_string(p.peer) + " is not a member (size " +
                                           std::to_string(n) + ")");
                if (p.count && !p.buffer) return Status::invalid("send_recv: null buffer");
                TS_RETURN_IF_ERROR(ncclTypeOf(p.dtype).status());
            }
            TS_RETURN_IF_ERROR(fromNccl(ncclGroupStart(), "ncclGroupStart", c));
            Status first;
            for (const P2POp& p : ops) {
                const ncclDataType_t dt = *ncclTypeOf(p.dtype);
                const ncclResult_t r = p.kind == P2POp::Send ? ncclSend(p.buffer, p.count, dt, p.peer, c, st)
                                                             : ncclRecv(p.buffer, p.count, dt, p.peer, c, st);
                if (first.isOk()) first = fromNccl(r, p.kind == P2POp::Send ? "ncclSend" : "ncclRecv", c);
            }
            // Always close the group, also after an error inside it.
            const Status end = fromNccl(ncclGroupEnd(), "ncclGroupEnd", c);
            return first.isOk() ? end : first;
        });
    }
    void allToAllv(Stream& s, const void* send, const std::vector<size_t>& sendCounts, void* recv,
                   const std::vector<size_t>& recvCounts, DType t) override {
        uint64_t sent = 0, received = 0;
        for (size_t q = 0; q < sendCounts.size(); ++q)
            if (int(q) != rank()) sent += sendCounts[q] * dtypeSize(t);
        for (size_t q = 0; q < recvCounts.size(); ++q)
            if (int(q) != rank()) received += recvCounts[q] * dtypeSize(t);
        const int n = size(), me = rank();
        enqueue(s, CollectiveKind::AllToAll, sent, received,
                [=](ncclComm_t c, cudaStream_t st) -> Status {
                    if (sendCounts.size() != size_t(n) || recvCounts.size() != size_t(n))
                        return Status::invalid("all_to_all: " + std::to_string(sendCounts.size()) + " send counts and " +
                                               std::to_string(recvCounts.size()) + " receive counts for a group of " +
                                               std::to_string(n));
                    if (sendCounts[size_t(me)] != recvCounts[size_t(me)])
                        return Status::invalid("all_to_all: rank " + std::to_string(me) + " sends " +
                                               std::to_string(sendCounts[size_t(me)]) + " elements to itself but expects " +
                                               std::to_string(recvCounts[size_t(me)]));
                    TS_ASSIGN_OR_RETURN(ncclDataType_t dt, ncclTypeOf(t));
                    const size_t es = dtypeSize(t);
                    const std::vector<size_t> so = offsetsOf(sendCounts), ro = offsetsOf(recvCounts);
                    const auto* sp = static_cast<const char*>(send);
                    auto* rp = static_cast<char*>(recv);
                    if (sendCounts[size_t(me)])
                        TS_RETURN_IF_ERROR(fromCuda(cudaMemcpyAsync(rp + ro[size_t(me)] * es, sp + so[size_t(me)] * es,
                                                                    sendCounts[size_t(me)] * es, cudaMemcpyDeviceToDevice, st),
                                                    "all_to_all: copy of the own part"));
                    TS_RETURN_IF_ERROR(fromNccl(ncclGroupStart(), "ncclGroupStart", c));
                    Status first;
                    // Zero counts are skipped on both sides (sender's count == receiver's count).
                    for (int q = 0; q < n; ++q) {
                        if (q == me) continue;
                        const size_t cs = sendCounts[size_t(q)], cr = recvCounts[size_t(q)];
                        if (cs && first.isOk())
                            first = fromNccl(ncclSend(sp + so[size_t(q)] * es, cs, dt, q, c, st), "ncclSend", c);
                        if (cr && first.isOk())
                            first = fromNccl(ncclRecv(rp + ro[size_t(q)] * es, cr, dt, q, c, st), "ncclRecv", c);
                    }
                    const Status end = fromNccl(ncclGroupEnd(), "ncclGroupEnd", c);
                    return first.isOk() ? end : first;
                });
    }

    CommStats stats() const override { return m_s->counters.stats(); }

    void abort(const Status& why) override {
        if (m_abortAll) m_abortAll(why);
        else m_s->abort(why);
    }

private:
    using Launch = std::function<Status(ncclComm_t, cudaStream_t)>;

    void enqueue(Stream& s, CollectiveKind kind, uint64_t sent, uint64_t received, Launch launch) {
        OpDesc d;
        d.name = collectiveName(kind);
        d.category = kind == CollectiveKind::SendRecv ? trace::Category::P2P : trace::Category::Collective;
        d.group = m_s->name.c_str();
        d.bytes = kind == CollectiveKind::SendRecv ? sent + received : sent;
        void* native = s.native();
        const char* opName = d.name;
        s.submit(d, [sh = m_s, launch = std::move(launch), native, opName, sent, received]() -> Status {
            if (!native)
                return Status::invalid(sh->where(opName) +
                                       ": the NCCL communicator needs a stream of the CUDA backend (this stream has no "
                                       "cudaStream_t)");
            if (sh->aborted.load()) return sh->abortedStatus(opName);
            int current = -1;
            if (cudaGetDevice(&current) != cudaSuccess) (void)cudaGetLastError();
            if (current != sh->device)
                return Status::invalid(sh->where(opName) + ": the stream's device " + std::to_string(current) +
                                       " is not the communicator's CUDA device " + std::to_string(sh->device));
            std::unique_lock<std::timed_mutex> lock(sh->mutex);
            if (sh->aborted.load() || !sh->comm) return sh->abortedStatus(opName);
            ncclComm_t comm = sh->comm;
            Status st = launch(comm, static_cast<cudaStream_t>(native));
            // An abort that gave up waiting for this op (stuck in NCCL past 100 ms) has called
            // ncclCommAbort and cleared sh->comm meanwhile: the handle is freed, do not touch it.
            if (sh->aborted.load()) return sh->abortedStatus(opName);
            if (st.isOk()) {
                ncclResult_t async = ncclSuccess;
                if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess)
                    st = fromNccl(async, "asynchronous NCCL error", comm);
            }
            if (!st.isOk()) return st.withContext(sh->where(opName));
            sh->counters.add(sent, received);
            return Status::ok();
        });
    }

    std::shared_ptr<CommShared> m_s;
    std::function<void(const Status&)> m_abortAll;  // the world's abort (NcclWorld), or empty
};

// ncclCommInitRank; on failure *out stays null (a half-made communicator is aborted).
Status initComm(ncclComm_t* out, int n, const ncclUniqueId& id, int rank, const std::string& what) {
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRank(&c, n, id, rank);
    if (r != ncclSuccess) {
        Status s = fromNccl(r, what, c);
        if (c) (void)ncclCommAbort(c);
        return s;
    }
    *out = c;
    return Status::ok();
}

struct PendingGroup {
    ncclUniqueId id{};
    Status idStatus;
    int joined = 0;
};

}  // namespace

// ----- in-process world -----------------------------------------------------------------------

struct NcclWorld::State {
    int worldSize = 0;
    std::vector<int> deviceOfRank;
    mutable std::mutex mutex;
    std::map<std::string, std::shared_ptr<PendingGroup>> groups;  // key: name|ranks|instance
    std::map<std::string, int> joins;                             // "rank|name|ranks" -> count
    std::vector<std::weak_ptr<CommShared>> comms;
    Status aborted;

    void abortAll(const Status& why) {
        std::vector<std::shared_ptr<CommShared>> live;
        {
            std::lock_guard<std::mutex> lock(mutex);
            if (aborted.isOk()) aborted = why.isOk() ? Status::comm("aborted") : why;
            for (auto& w : comms)
                if (auto c = w.lock()) live.push_back(std::move(c));
        }
        for (auto& c : live) c->abort(why);
    }
};

NcclWorld::NcclWorld(int worldSize, std::vector<int> deviceOfRank) : m_state(std::make_shared<State>()) {
    m_state->worldSize = worldSize;
    m_state->deviceOfRank = std::move(deviceOfRank);
}

NcclWorld::~NcclWorld() = default;

int NcclWorld::worldSize() const { return m_state->worldSize; }

void NcclWorld::abort(const Status& why) { m_state->abortAll(why); }

Status NcclWorld::abortStatus() const {
    std::lock_guard<std::mutex> lock(m_state->mutex);
    return m_state->aborted;
}

Result<std::unique_ptr<Communicator>> NcclWorld::join(const std::string& name, const std::vector<int>& ranks,
                                                      int globalRank) {
    int me = 0;
    TS_RETURN_IF_ERROR(checkGroupRanks(name, ranks, m_state->worldSize, globalRank, &me));
    const int n = int(ranks.size());

    int device = 0;
    if (!m_state->deviceOfRank.empty()) {
        if (size_t(globalRank) >= m_state->deviceOfRank.size())
            return Status::invalid("NCCL world: no CUDA device given for rank " + std::to_string(globalRank));
        device = m_state->deviceOfRank[size_t(globalRank)];
    } else {
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
            (void)cudaGetLastError();
            return Status::unsupported("NCCL world: no CUDA device is visible for rank " + std::to_string(globalRank));
        }
        device = globalRank % count;
    }

    const std::string members = name + "|" + rankList(ranks);
    std::shared_ptr<PendingGroup> pending;
    std::string key;
    {
        std::lock_guard<std::mutex> lock(m_state->mutex);
        if (!m_state->aborted.isOk())
            return Status::comm("cannot join NCCL group '" + name + "': the world was aborted: " +
                                m_state->aborted.message());
        const int instance = m_state->joins[std::to_string(globalRank) + "|" + members]++;
        key = members + "|" + std::to_string(instance);
        auto& g = m_state->groups[key];
        if (!g) {
            g = std::make_shared<PendingGroup>();
            g->idStatus = fromNccl(ncclGetUniqueId(&g->id), "ncclGetUniqueId");
        }
        pending = g;
        if (++g->joined == n) m_state->groups.erase(key);  // every member has the id now
    }
    if (!pending->idStatus.isOk()) return pending->idStatus.withContext("NCCL group '" + name + "'");

    auto shared = std::make_shared<CommShared>();
    shared->name = name;
    shared->ranks = ranks;
    shared->rank = me;
    shared->size = n;
    shared->device = device;
    {
        DeviceScope d(device);
        TS_RETURN_IF_ERROR(d.status());
        // Blocks until all n members called it (each on its own thread).
        TS_RETURN_IF_ERROR(initComm(&shared->comm, n, pending->id, me,
                                    "ncclCommInitRank for group '" + name + "' (global ranks " + rankList(ranks) +
                                        ") on rank " + std::to_string(me) + ", CUDA device " + std::to_string(device)));
    }
    {
        std::lock_guard<std::mutex> lock(m_state->mutex);
        auto& comms = m_state->comms;
        comms.erase(std::remove_if(comms.begin(), comms.end(), [](const auto& w) { return w.expired(); }), comms.end());
        comms.push_back(shared);
    }
    std::weak_ptr<State> world = m_state;
    auto abortAll = [world](const Status& why) {
        if (auto w = world.lock()) w->abortAll(why);
    };
    return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(std::move(shared), abortAll));
}

// ----- across processes (MPI bootstrap) --------------------------------------------------------

#ifdef TS_HAVE_MPI
Result<std::unique_ptr<Communicator>> createNcclGroupMpi(const std::string& name, const std::vector<int>& ranks,
                                                         int cudaDevice) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) return Status::invalid("createNcclGroupMpi('" + name + "'): MPI is not initialized");
    int worldRank = 0, worldSize = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &worldRank);
    MPI_Comm_size(MPI_COMM_WORLD, &worldSize);
    int me = -1;
    for (size_t i = 0; i < ranks.size(); ++i) {
        if (ranks[i] < 0 || ranks[i] >= worldSize)
            return Status::invalid("NCCL group '" + name + "': rank " + std::to_string(ranks[i]) +
                                   " is outside the MPI world of " + std::to_string(worldSize));
        // MPI_Group_incl with a repeated rank is erroneous (MPI aborts the job): refuse it here.
        if (std::find(ranks.begin(), ranks.begin() + std::ptrdiff_t(i), ranks[i]) != ranks.begin() + std::ptrdiff_t(i))
            return Status::invalid("NCCL group '" + name + "' lists MPI rank " + std::to_string(ranks[i]) + " twice");
        if (ranks[i] == worldRank) me = int(i);
    }
    if (me < 0)
        return Status::invalid("MPI rank " + std::to_string(worldRank) + " is not a member of NCCL group '" + name + "'");
    const int n = int(ranks.size());

    ncclUniqueId id{};
    Status idStatus;
    if (me == 0) idStatus = fromNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    // Tag by name so concurrent creations of different groups do not mix (members agree on it).
    const int tag = int(std::hash<std::string>{}("nccl|" + name + "|" + std::to_string(n)) % 30000);
    MPI_Group world = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, n, ranks.data(), &group);
    int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    if (rc != MPI_SUCCESS) return Status::comm("creating the MPI bootstrap group of NCCL group '" + name + "' failed");
    // Rank 0 sends a flag with the id, so a failed ncclGetUniqueId fails every member alike.
    struct {
        int ok;
        char id[sizeof(ncclUniqueId)];
    } msg{};
    msg.ok = idStatus.isOk() ? 1 : 0;
    std::memcpy(msg.id, &id, sizeof id);
    rc = MPI_Bcast(&msg, int(sizeof msg), MPI_BYTE, 0, comm);
    MPI_Comm_free(&comm);
    if (rc != MPI_SUCCESS) return Status::comm("broadcasting the NCCL unique id of group '" + name + "' over MPI failed");
    if (!msg.ok)
        return me == 0 ? idStatus : Status::comm("group rank 0 of NCCL group '" + name + "' could not make a unique id");
    std::memcpy(&id, msg.id, sizeof id);

    auto shared = std::make_shared<CommShared>();
    shared->name = name;
    shared->ranks = ranks;
    shared->rank = me;
    shared->size = n;
    shared->device = cudaDevice;
    {
        DeviceScope d(cudaDevice);
        TS_RETURN_IF_ERROR(d.status());
        TS_RETURN_IF_ERROR(initComm(&shared->comm, n, id, me,
                                    "ncclCommInitRank for group '" + name + "' (MPI ranks " + rankList(ranks) +
                                        ") on CUDA device " + std::to_string(cudaDevice)));
    }
    return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(std::move(shared), nullptr));
}
#endif

}  // namespace ts::engine
