// MPI communicator (see mpi_communicator.h).
#include "engine/comm/mpi/mpi_communicator.h"

// The C++ bindings are deprecated and not warning-clean; only the C API is used.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <atomic>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

namespace ts::engine {

namespace {

// Serializes every MPI call of the process (see header).
std::mutex& mpiMutex() {
    static std::mutex m;
    return m;
}

std::string mpiError(int code) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, buf, &len);
    return std::string(buf, size_t(len));
}

Status check(int code, const std::string& what) {
    if (code == MPI_SUCCESS) return Status::ok();
    return Status::comm(what + ": " + mpiError(code));
}

// Datatype used to move (not reduce) elements of t.
MPI_Datatype moveType(DType t) {
    switch (dtypeSize(t)) {
        case 1: return MPI_UINT8_T;
        case 2: return MPI_UINT16_T;
        case 4: return MPI_UINT32_T;
        default: return MPI_UINT64_T;
    }
}

inline float bf16ToFloat(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t floatToBf16(float f) {  // round to nearest even; NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

struct Counters {
    std::atomic<uint64_t> ops{0}, bytesSent{0}, bytesReceived{0};
};

struct Shared {
    MPI_Comm comm = MPI_COMM_NULL;
    std::string name;
    std::vector<int> ranks;
    int rank = 0, size = 1;
    std::chrono::milliseconds timeout{60'000};
    std::atomic<bool> aborted{false};
    std::mutex abortMutex;
    Status abortStatus;
    Counters counters;

    ~Shared() {
        if (comm != MPI_COMM_NULL) {
            int finalized = 0;
            MPI_Finalized(&finalized);
            if (!finalized) {
                std::lock_guard<std::mutex> lock(mpiMutex());
                MPI_Comm_free(&comm);
            }
        }
    }

    std::string where(const char* op) const {
        return std::string(op) + " in group '" + name + "' on rank " + std::to_string(rank) + " (global " +
               std::to_string(ranks[size_t(rank)]) + ")";
    }
    Status abortedStatus(const char* op) {
        std::lock_guard<std::mutex> lock(abortMutex);
        return Status::comm(where(op) + " failed because the group was aborted: " + abortStatus.message());
    }

    // Polls the requests until done, aborted or timed out.
    Status wait(std::vector<MPI_Request>& reqs, const char* op) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            if (aborted.load()) return abortedStatus(op);
            int done = 0;
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                const int rc = MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
                if (rc != MPI_SUCCESS) return check(rc, where(op));
            }
            if (done) return Status::ok();
            if (std::chrono::steady_clock::now() > deadline) {
                char secs[32];
                std::snprintf(secs, sizeof secs, "%.1f", double(timeout.count()) / 1000.0);
                return Status::timeout(where(op) + ": timed out after " + secs +
                                       " s waiting for the other members (which ranks are missing is not known "
                                       "over MPI; check the other processes' logs)");
            }
            std::this_thread::yield();
        }
    }
};

Status reduceArgs(DType t, ReduceOp op, MPI_Datatype& type, MPI_Op& mop, const char* where) {
    switch (t) {
        case DType::F32: type = MPI_FLOAT; break;
        case DType::BF16: type = MPI_FLOAT; break;  // reduced as fp32 copies
        case DType::I32: type = MPI_INT32_T; break;
        case DType::I64: type = MPI_INT64_T; break;
        default:
            return Status::unsupported(std::string(where) + ": reduction of " + dtypeName(t) +
                                       " is not supported by the MPI communicator (f32, bf16, i32, i64)");
    }
    mop = op == ReduceOp::Max ? MPI_MAX : op == ReduceOp::Min ? MPI_MIN : MPI_SUM;
    return Status::ok();
}

void finishAvg(void* data, size_t count, DType t, int n) {
    switch (t) {
        case DType::F32:
        case DType::BF16: {  // BF16 is an fp32 copy here
            auto* f = static_cast<float*>(data);
            for (size_t i = 0; i < count; ++i) f[i] /= float(n);
            break;
        }
        case DType::I32: {
            auto* x = static_cast<int32_t*>(data);
            for (size_t i = 0; i < count; ++i) x[i] /= n;
            break;
        }
        case DType::I64: {
            auto* x = static_cast<int64_t*>(data);
            for (size_t i = 0; i < count; ++i) x[i] /= n;
            break;
        }
        default: break;
    }
}

std::vector<float> toFloat(const void* src, size_t count) {
    std::vector<float> out(count);
    const auto* b = static_cast<const uint16_t*>(src);
    for (size_t i = 0; i < count; ++i) out[i] = bf16ToFloat(b[i]);
    return out;
}

void fromFloat(const std::vector<float>& src, void* dst) {
    auto* b = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < src.size(); ++i) b[i] = floatToBf16(src[i]);
}

Status intCount(size_t count, const char* where) {
    if (count > size_t(INT_MAX))
        return Status::unsupported(std::string(where) + ": " + std::to_string(count) +
                                   " elements exceed MPI's int count; split the buffer");
    return Status::ok();
}

class MpiCommunicator final : public Communicator {
public:
    explicit MpiCommunicator(std::shared_ptr<Shared> s) : m_s(std::move(s)) {}
    int rank() const override { return m_s->rank; }
    int size() const override { return m_s->size; }
    const std::string& name() const override { return m_s->name; }
    std::vector<int> globalRanks() const override { return m_s->ranks; }

    void allReduce(Stream& st, const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
        const uint64_t bytes = uint64_t(double(count * dtypeSize(t)) * busBwFactor(CollectiveKind::AllReduce, size()));
        enqueue(st, CollectiveKind::AllReduce, bytes, bytes, [s = m_s, send, recv, count, t, op]() -> Status {
            const char* name = "all_reduce";
            MPI_Datatype type;
            MPI_Op mop;
            TS_RETURN_IF_ERROR(reduceArgs(t, op, type, mop, s->where(name).c_str()));
            TS_RETURN_IF_ERROR(intCount(count, name));
            std::vector<float> tmp;
            const void* in = send;
            void* out = recv;
            if (t == DType::BF16) {
                tmp = toFloat(send, count);
                in = MPI_IN_PLACE;
                out = tmp.data();
            } else if (send == recv) {
                in = MPI_IN_PLACE;
            }
            std::vector<MPI_Request> req(1);
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                TS_RETURN_IF_ERROR(check(MPI_Iallreduce(in, out, int(count), type, mop, s->comm, &req[0]), s->where(name)));
            }
            TS_RETURN_IF_ERROR(s->wait(req, name));
            if (op == ReduceOp::Avg) finishAvg(out, count, t, s->size);
            if (t == DType::BF16) fromFloat(tmp, recv);
            return Status::ok();
        });
    }

    void reduceScatter(Stream& st, const void* send, void* recv, size_t recvCount, DType t, ReduceOp op) override {
        const uint64_t bytes = recvCount * dtypeSize(t) * uint64_t(size() - 1);
        enqueue(st, CollectiveKind::ReduceScatter, bytes, bytes, [s = m_s, send, recv, recvCount, t, op]() -> Status {
            const char* name = "reduce_scatter";
            MPI_Datatype type;
            MPI_Op mop;
            TS_RETURN_IF_ERROR(reduceArgs(t, op, type, mop, s->where(name).c_str()));
            TS_RETURN_IF_ERROR(intCount(recvCount * size_t(s->size), name));
            const size_t total = recvCount * size_t(s->size);
            // Inputs are copied when bf16 (fp32 staging) or when recv aliases send (in place).
            std::vector<uint8_t> stage;
            std::vector<float> in32, out32;
            const void* in = send;
            void* out = recv;
            if (t == DType::BF16) {
                in32 = toFloat(send, total);
                out32.resize(recvCount);
                in = in32.data();
                out = out32.data();
            } else {
                const auto* sb = static_cast<const uint8_t*>(send);
                const auto* rb = static_cast<const uint8_t*>(recv);
                const size_t es = dtypeSize(t);
                if (rb >= sb && rb < sb + total * es) {
                    stage.assign(sb, sb + total * es);
                    in = stage.data();
                }
            }
            std::vector<MPI_Request> req(1);
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                TS_RETURN_IF_ERROR(check(
                    MPI_Ireduce_scatter_block(in, out, int(recvCount), type, mop, s->comm, &req[0]), s->where(name)));
            }
            TS_RETURN_IF_ERROR(s->wait(req, name));
            if (op == ReduceOp::Avg) finishAvg(out, recvCount, t, s->size);
            if (t == DType::BF16) fromFloat(out32, recv);
            return Status::ok();
        });
    }

    void allGather(Stream& st, const void* send, void* recv, size_t sendCount, DType t) override {
        const uint64_t bytes = sendCount * dtypeSize(t) * uint64_t(size() - 1);
        enqueue(st, CollectiveKind::AllGather, bytes, bytes, [s = m_s, send, recv, sendCount, t]() -> Status {
            const char* name = "all_gather";
            TS_RETURN_IF_ERROR(intCount(sendCount * size_t(s->size), name));
            const auto* mine = static_cast<const uint8_t*>(recv) + size_t(s->rank) * sendCount * dtypeSize(t);
            const void* in = (send == mine) ? MPI_IN_PLACE : send;
            std::vector<MPI_Request> req(1);
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                TS_RETURN_IF_ERROR(check(MPI_Iallgather(in, int(sendCount), moveType(t), recv, int(sendCount),
                                                        moveType(t), s->comm, &req[0]),
                                         s->where(name)));
            }
            return s->wait(req, name);
        });
    }

    void broadcast(Stream& st, void* buffer, size_t count, DType t, int root) override {
        const uint64_t bytes = size() > 1 ? count * dtypeSize(t) : 0;
        enqueue(st, CollectiveKind::Broadcast, rank() == root ? bytes : 0, rank() == root ? 0 : bytes,
                [s = m_s, buffer, count, t, root]() -> Status {
                    const char* name = "broadcast";
                    TS_RETURN_IF_ERROR(intCount(count, name));
                    if (root < 0 || root >= s->size)
                        return Status::invalid(s->where(name) + ": root " + std::to_string(root) + " is not a member");
                    std::vector<MPI_Request> req(1);
                    {
                        std::lock_guard<std::mutex> lock(mpiMutex());
                        TS_RETURN_IF_ERROR(
                            check(MPI_Ibcast(buffer, int(count), moveType(t), root, s->comm, &req[0]), s->where(name)));
                    }
                    return s->wait(req, name);
                });
    }

    void batchSendRecv(Stream& st, const std::vector<P2POp>& ops) override {
        uint64_t sent = 0, received = 0;
        for (const auto& p : ops) (p.kind == P2POp::Send ? sent : received) += p.count * dtypeSize(p.dtype);
        OpDesc d;
        d.name = "send_recv";
        d.category = trace::Category::P2P;
        d.group = m_s->name.c_str();
        d.bytes = sent;
        st.submit(d, [s = m_s, ops, sent, received]() -> Status {
            const char* name = "send_recv";
            std::vector<MPI_Request> reqs(ops.size(), MPI_REQUEST_NULL);
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                // Receives first so that matching sends find them posted.
                for (size_t i = 0; i < ops.size(); ++i) {
                    const auto& p = ops[i];
                    if (p.peer < 0 || p.peer >= s->size)
                        return Status::invalid(s->where(name) + ": peer " + std::to_string(p.peer) + " is not a member");
                    if (p.kind != P2POp::Recv) continue;
                    TS_RETURN_IF_ERROR(check(
                        MPI_Irecv(p.buffer, int(p.count), moveType(p.dtype), p.peer, p.tag, s->comm, &reqs[i]),
                        s->where(name)));
                }
                for (size_t i = 0; i < ops.size(); ++i) {
                    const auto& p = ops[i];
                    if (p.kind != P2POp::Send) continue;
                    TS_RETURN_IF_ERROR(check(
                        MPI_Isend(p.buffer, int(p.count), moveType(p.dtype), p.peer, p.tag, s->comm, &reqs[i]),
                        s->where(name)));
                }
            }
            TS_RETURN_IF_ERROR(s->wait(reqs, name));
            s->counters.ops++;
            s->counters.bytesSent += sent;
            s->counters.bytesReceived += received;
            return Status::ok();
        });
    }

    void allToAllv(Stream& st, const void* send, const std::vector<size_t>& sendCounts, void* recv,
                   const std::vector<size_t>& recvCounts, DType t) override {
        uint64_t sent = 0, received = 0;
        for (size_t q = 0; q < sendCounts.size(); ++q)
            if (int(q) != rank()) sent += sendCounts[q] * dtypeSize(t);
        for (size_t q = 0; q < recvCounts.size(); ++q)
            if (int(q) != rank()) received += recvCounts[q] * dtypeSize(t);
        enqueue(st, CollectiveKind::AllToAll, sent, received, [s = m_s, send, sendCounts, recv, recvCounts, t]() -> Status {
            const char* name = "all_to_all";
            if (sendCounts.size() != size_t(s->size) || recvCounts.size() != size_t(s->size))
                return Status::invalid(s->where(name) + ": expected " + std::to_string(s->size) + " send and receive counts");
            std::vector<int> sc(size_t(s->size)), rc(size_t(s->size)), sd(size_t(s->size)), rd(size_t(s->size));
            size_t so = 0, ro = 0;
            for (int q = 0; q < s->size; ++q) {
                TS_RETURN_IF_ERROR(intCount(so + sendCounts[size_t(q)], name));
                TS_RETURN_IF_ERROR(intCount(ro + recvCounts[size_t(q)], name));
                sc[size_t(q)] = int(sendCounts[size_t(q)]);
                rc[size_t(q)] = int(recvCounts[size_t(q)]);
                sd[size_t(q)] = int(so);
                rd[size_t(q)] = int(ro);
                so += sendCounts[size_t(q)];
                ro += recvCounts[size_t(q)];
            }
            std::vector<MPI_Request> req(1);
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                TS_RETURN_IF_ERROR(check(MPI_Ialltoallv(send, sc.data(), sd.data(), moveType(t), recv, rc.data(),
                                                        rd.data(), moveType(t), s->comm, &req[0]),
                                         s->where(name)));
            }
            return s->wait(req, name);
        });
    }

    CommStats stats() const override {
        CommStats c;
        c.ops = m_s->counters.ops.load();
        c.bytesSent = m_s->counters.bytesSent.load();
        c.bytesReceived = m_s->counters.bytesReceived.load();
        return c;
    }

    void abort(const Status& why) override {
        {
            std::lock_guard<std::mutex> lock(m_s->abortMutex);
            if (m_s->abortStatus.isOk()) m_s->abortStatus = why.isOk() ? Status::comm("aborted") : why;
        }
        m_s->aborted = true;
    }

private:
    template <typename Fn>
    void enqueue(Stream& st, CollectiveKind kind, uint64_t sent, uint64_t received, Fn fn) {
        OpDesc d;
        d.name = collectiveName(kind);
        d.category = trace::Category::Collective;
        d.group = m_s->name.c_str();
        d.bytes = sent;
        st.submit(d, [s = m_s, fn = std::move(fn), sent, received]() mutable -> Status {
            if (s->aborted.load()) return s->abortedStatus("collective");
            Status r = fn();
            if (r.isOk()) {
                s->counters.ops++;
                s->counters.bytesSent += sent;
                s->counters.bytesReceived += received;
            }
            return r;
        });
    }

    std::shared_ptr<Shared> m_s;
};

}  // namespace

Result<std::unique_ptr<MpiRuntime>> MpiRuntime::init(int* argc, char*** argv) {
    std::unique_ptr<MpiRuntime> rt(new MpiRuntime());
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        int provided = 0;
        const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) return Status::comm("MPI_Init_thread failed: " + mpiError(rc));
        rt->m_ownsInit = true;
        rt->m_threadLevel = provided;
    } else {
        MPI_Query_thread(&rt->m_threadLevel);
    }
    if (rt->m_threadLevel < MPI_THREAD_SERIALIZED)
        return Status::unsupported("the MPI library provides thread level " + std::to_string(rt->m_threadLevel) +
                                   "; trainscope needs at least MPI_THREAD_SERIALIZED");
    MPI_Comm_rank(MPI_COMM_WORLD, &rt->m_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &rt->m_size);
    // Errors come back as codes (turned into Status), not as aborts.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return rt;
}

struct MpiRuntime::Notices {
    MPI_Comm comm = MPI_COMM_NULL;
    std::function<void(int, const std::string&)> onNotice;
    std::atomic<bool> stop{false};
    std::thread thread;
    static constexpr int kTag = 7117;

    void loop() {
        while (!stop.load()) {
            int flag = 0;
            MPI_Status st;
            std::string text;
            int from = -1;
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                if (MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm, &flag, &st) == MPI_SUCCESS && flag) {
                    int n = 0;
                    MPI_Get_count(&st, MPI_CHAR, &n);
                    text.resize(size_t(std::max(n, 0)));
                    from = st.MPI_SOURCE;
                    // The whole message has arrived (probe matched it): this receive returns at once.
                    MPI_Recv(text.data(), n, MPI_CHAR, from, kTag, comm, MPI_STATUS_IGNORE);
                }
            }
            if (flag && onNotice) onNotice(from, text);
            else std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
};

Status MpiRuntime::startNotices(std::function<void(int from, const std::string& text)> onNotice) {
    if (m_notices) return Status::invalid("failure notices already started");
    auto n = std::make_unique<Notices>();
    n->onNotice = std::move(onNotice);
    {
        std::lock_guard<std::mutex> lock(mpiMutex());
        const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &n->comm);
        if (rc != MPI_SUCCESS) return Status::comm("creating the failure-notice communicator: " + mpiError(rc));
        MPI_Comm_set_errhandler(n->comm, MPI_ERRORS_RETURN);
    }
    Notices* raw = n.get();
    n->thread = std::thread([raw] { raw->loop(); });
    m_notices = std::move(n);
    return Status::ok();
}

Status MpiRuntime::announce(const std::string& text, std::chrono::milliseconds wait) {
    if (!m_notices) return Status::invalid("failure notices not started");
    std::vector<MPI_Request> reqs;
    {
        std::lock_guard<std::mutex> lock(mpiMutex());
        for (int r = 0; r < m_size; ++r) {
            if (r == m_rank) continue;
            MPI_Request q = MPI_REQUEST_NULL;
            if (MPI_Isend(text.data(), int(text.size()), MPI_CHAR, r, Notices::kTag, m_notices->comm, &q) == MPI_SUCCESS)
                reqs.push_back(q);
        }
    }
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
        int done = 0;
        {
            std::lock_guard<std::mutex> lock(mpiMutex());
            MPI_Testall(int(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
            if (!done && std::chrono::steady_clock::now() > deadline) {
                for (MPI_Request& q : reqs)
                    if (q != MPI_REQUEST_NULL) MPI_Request_free(&q);
                return Status::timeout("a failure notice was not taken by every process within " +
                                       std::to_string(wait.count()) + " ms (a process is gone)");
            }
        }
        if (done) return Status::ok();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

void MpiRuntime::stopNotices() {
    if (!m_notices) return;
    m_notices->stop = true;
    if (m_notices->thread.joinable()) m_notices->thread.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        std::lock_guard<std::mutex> lock(mpiMutex());
        MPI_Comm_free(&m_notices->comm);
    }
    m_notices.reset();
}

MpiRuntime::~MpiRuntime() {
    stopNotices();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (m_ownsInit && !finalized) MPI_Finalize();
}

Result<std::unique_ptr<Communicator>> MpiRuntime::createGroup(const std::string& name, const std::vector<int>& ranks,
                                                              std::chrono::milliseconds timeout) {
    int me = -1;
    for (size_t i = 0; i < ranks.size(); ++i) {
        if (ranks[i] < 0 || ranks[i] >= m_size)
            return Status::invalid("group '" + name + "': rank " + std::to_string(ranks[i]) + " is outside the MPI world of " +
                                   std::to_string(m_size));
        if (ranks[i] == m_rank) me = int(i);
    }
    if (me < 0) return Status::invalid("MPI rank " + std::to_string(m_rank) + " is not a member of group '" + name + "'");
    auto s = std::make_shared<Shared>();
    s->name = name;
    s->ranks = ranks;
    s->rank = me;
    s->size = int(ranks.size());
    s->timeout = timeout;
    // Tag by name so concurrent creations of different groups do not mix (members agree on it).
    const int tag = int(std::hash<std::string>{}(name + "|" + std::to_string(ranks.size())) % 30000);
    std::lock_guard<std::mutex> lock(mpiMutex());
    MPI_Group world = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_incl(world, int(ranks.size()), ranks.data(), &group);
    const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &s->comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    if (rc != MPI_SUCCESS) return Status::comm("creating MPI group '" + name + "': " + mpiError(rc));
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(std::move(s)));
}

}  // namespace ts::engine
