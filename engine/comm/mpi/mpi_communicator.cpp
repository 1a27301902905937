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

struct Shared {
    MPI_Comm comm = MPI_COMM_NULL;
    std::string name;
    std::vector<int> ranks;
    int rank = 0, size = 1;
    std::chrono::milliseconds timeout{60'000};
    std::atomic<bool> aborted{false};
    std::mutex abortMutex;
    Status abortStatus;
    CommCounters counters;

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

// What both MPI communicators share: identity, counters, abort, and how a collective is
// enqueued (the stream runs it; an aborted group fails it at once). S: Shared or a subtype.
template <typename S>
class MpiCommBase : public Communicator {
public:
    explicit MpiCommBase(std::shared_ptr<S> s) : m_s(std::move(s)) {}
    int rank() const override { return m_s->rank; }
    int size() const override { return m_s->size; }
    const std::string& name() const override { return m_s->name; }
    std::vector<int> globalRanks() const override { return m_s->ranks; }

    CommStats stats() const override { return m_s->counters.stats(); }

    void abort(const Status& why) override {
        {
            std::lock_guard<std::mutex> lock(m_s->abortMutex);
            if (m_s->abortStatus.isOk()) m_s->abortStatus = why.isOk() ? Status::comm("aborted") : why;
        }
        m_s->aborted = true;
    }

protected:
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
            if (r.isOk()) s->counters.add(sent, received);
            return r;
        });
    }

    std::shared_ptr<S> m_s;
};

class MpiCommunicator final : public MpiCommBase<Shared> {
public:
    using MpiCommBase::MpiCommBase;

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
            s->counters.add(sent, received);
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
};

// ---- thread groups: several ranks per process (MpiRuntime::createThreadGroup) ----------------
// Every op is a set of tagged nonblocking sends/receives over the runtime's private duplicate of
// MPI_COMM_WORLD, between member indices; reductions are done here, over the members' buffers
// in member order, so every member gets the same bits. Members in this process exchange
// through MPI as well (self-sends), which keeps one mechanism for any mixture.
struct ThreadShared : Shared {
    MPI_Comm tcomm = MPI_COMM_NULL;  // the runtime's; not freed here
    std::vector<int> procOf;         // member index -> MPI world rank of its process
    int64_t tagBase = 0;             // (key, first member, instance), see tagFor
    int64_t maxMembers = 1;
    int tagFor(int src, int dst) const { return int((tagBase * maxMembers + src) * maxMembers + dst); }
};

struct PostedOps {
    std::vector<MPI_Request> reqs;
    Status post(ThreadShared& s, bool isSend, int peer, void* buf, size_t bytes, const char* op) {
        if (bytes > size_t(INT_MAX))
            return Status::unsupported(s.where(op) + ": " + std::to_string(bytes) + " bytes exceed MPI's int count");
        MPI_Request q = MPI_REQUEST_NULL;
        const int proc = s.procOf[size_t(peer)];
        const int rc = isSend ? MPI_Isend(buf, int(bytes), MPI_BYTE, proc, s.tagFor(s.rank, peer), s.tcomm, &q)
                              : MPI_Irecv(buf, int(bytes), MPI_BYTE, proc, s.tagFor(peer, s.rank), s.tcomm, &q);
        TS_RETURN_IF_ERROR(check(rc, s.where(op)));
        reqs.push_back(q);
        return Status::ok();
    }
};

// acc (n elements of t, fp32 copies for BF16 in acc32) op= other.
template <typename T> void reduceInto(T* acc, const T* other, size_t n, ReduceOp op) {
    for (size_t i = 0; i < n; ++i) {
        switch (op) {
            case ReduceOp::Max: acc[i] = std::max(acc[i], other[i]); break;
            case ReduceOp::Min: acc[i] = std::min(acc[i], other[i]); break;
            default: acc[i] += other[i]; break;
        }
    }
}

// Reduces `parts` (one buffer of `count` elements per member, member order) into `out`.
Status reduceParts(const std::vector<const void*>& parts, void* out, size_t count, DType t, ReduceOp op, int n,
                   const std::string& where) {
    switch (t) {
        case DType::F32: {
            std::vector<float> acc(static_cast<const float*>(parts[0]), static_cast<const float*>(parts[0]) + count);
            for (size_t j = 1; j < parts.size(); ++j) reduceInto(acc.data(), static_cast<const float*>(parts[j]), count, op);
            if (op == ReduceOp::Avg) finishAvg(acc.data(), count, t, n);
            std::memcpy(out, acc.data(), count * 4);
            return Status::ok();
        }
        case DType::BF16: {
            std::vector<float> acc = toFloat(parts[0], count);
            for (size_t j = 1; j < parts.size(); ++j) {
                const std::vector<float> o = toFloat(parts[j], count);
                reduceInto(acc.data(), o.data(), count, op);
            }
            if (op == ReduceOp::Avg) finishAvg(acc.data(), count, DType::F32, n);
            fromFloat(acc, out);
            return Status::ok();
        }
        case DType::I32: {
            std::vector<int32_t> acc(static_cast<const int32_t*>(parts[0]), static_cast<const int32_t*>(parts[0]) + count);
            for (size_t j = 1; j < parts.size(); ++j) reduceInto(acc.data(), static_cast<const int32_t*>(parts[j]), count, op);
            if (op == ReduceOp::Avg) finishAvg(acc.data(), count, t, n);
            std::memcpy(out, acc.data(), count * 4);
            return Status::ok();
        }
        case DType::I64: {
            std::vector<int64_t> acc(static_cast<const int64_t*>(parts[0]), static_cast<const int64_t*>(parts[0]) + count);
            for (size_t j = 1; j < parts.size(); ++j) reduceInto(acc.data(), static_cast<const int64_t*>(parts[j]), count, op);
            if (op == ReduceOp::Avg) finishAvg(acc.data(), count, t, n);
            std::memcpy(out, acc.data(), count * 8);
            return Status::ok();
        }
        default:
            return Status::unsupported(where + ": reduction of " + dtypeName(t) +
                                       " is not supported by the MPI communicator (f32, bf16, i32, i64)");
    }
}

class MpiThreadCommunicator final : public MpiCommBase<ThreadShared> {
public:
    using MpiCommBase::MpiCommBase;

    void allReduce(Stream& st, const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
        const uint64_t bytes = uint64_t(double(count * dtypeSize(t)) * busBwFactor(CollectiveKind::AllReduce, size()));
        enqueue(st, CollectiveKind::AllReduce, bytes, bytes, [s = m_s, send, recv, count, t, op]() -> Status {
            const char* name = "all_reduce";
            const size_t b = count * dtypeSize(t);
            std::vector<std::vector<uint8_t>> bufs(size_t(s->size));
            bufs[size_t(s->rank)].assign(static_cast<const uint8_t*>(send), static_cast<const uint8_t*>(send) + b);
            PostedOps ops;
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                for (int j = 0; j < s->size; ++j) {
                    if (j == s->rank) continue;
                    bufs[size_t(j)].resize(b);
                    TS_RETURN_IF_ERROR(ops.post(*s, false, j, bufs[size_t(j)].data(), b, name));
                    TS_RETURN_IF_ERROR(ops.post(*s, true, j, bufs[size_t(s->rank)].data(), b, name));
                }
            }
            TS_RETURN_IF_ERROR(s->wait(ops.reqs, name));
            std::vector<const void*> parts;
            for (auto& v : bufs) parts.push_back(v.data());
            return reduceParts(parts, recv, count, t, op, s->size, s->where(name));
        });
    }

    void reduceScatter(Stream& st, const void* send, void* recv, size_t recvCount, DType t, ReduceOp op) override {
        const uint64_t bytes = recvCount * dtypeSize(t) * uint64_t(size() - 1);
        enqueue(st, CollectiveKind::ReduceScatter, bytes, bytes, [s = m_s, send, recv, recvCount, t, op]() -> Status {
            const char* name = "reduce_scatter";
            const size_t b = recvCount * dtypeSize(t);
            const auto* in = static_cast<const uint8_t*>(send);
            // Own input copied first: recv may alias send.
            std::vector<uint8_t> all(in, in + b * size_t(s->size));
            std::vector<std::vector<uint8_t>> got(size_t(s->size));
            PostedOps ops;
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                for (int j = 0; j < s->size; ++j) {
                    if (j == s->rank) continue;
                    got[size_t(j)].resize(b);
                    TS_RETURN_IF_ERROR(ops.post(*s, false, j, got[size_t(j)].data(), b, name));
                    TS_RETURN_IF_ERROR(ops.post(*s, true, j, all.data() + size_t(j) * b, b, name));
                }
            }
            TS_RETURN_IF_ERROR(s->wait(ops.reqs, name));
            std::vector<const void*> parts;
            for (int j = 0; j < s->size; ++j)
                parts.push_back(j == s->rank ? all.data() + size_t(j) * b : got[size_t(j)].data());
            return reduceParts(parts, recv, recvCount, t, op, s->size, s->where(name));
        });
    }

    void allGather(Stream& st, const void* send, void* recv, size_t sendCount, DType t) override {
        const uint64_t bytes = sendCount * dtypeSize(t) * uint64_t(size() - 1);
        enqueue(st, CollectiveKind::AllGather, bytes, bytes, [s = m_s, send, recv, sendCount, t]() -> Status {
            const char* name = "all_gather";
            const size_t b = sendCount * dtypeSize(t);
            auto* out = static_cast<uint8_t*>(recv);
            std::vector<uint8_t> mine(static_cast<const uint8_t*>(send), static_cast<const uint8_t*>(send) + b);
            PostedOps ops;
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                for (int j = 0; j < s->size; ++j) {
                    if (j == s->rank) continue;
                    TS_RETURN_IF_ERROR(ops.post(*s, false, j, out + size_t(j) * b, b, name));
                    TS_RETURN_IF_ERROR(ops.post(*s, true, j, mine.data(), b, name));
                }
            }
            TS_RETURN_IF_ERROR(s->wait(ops.reqs, name));
            std::memcpy(out + size_t(s->rank) * b, mine.data(), b);
            return Status::ok();
        });
    }

    void broadcast(Stream& st, void* buffer, size_t count, DType t, int root) override {
        const uint64_t bytes = size() > 1 ? count * dtypeSize(t) : 0;
        enqueue(st, CollectiveKind::Broadcast, rank() == root ? bytes : 0, rank() == root ? 0 : bytes,
                [s = m_s, buffer, count, t, root]() -> Status {
                    const char* name = "broadcast";
                    if (root < 0 || root >= s->size)
                        return Status::invalid(s->where(name) + ": root " + std::to_string(root) + " is not a member");
                    const size_t b = count * dtypeSize(t);
                    PostedOps ops;
                    {
                        std::lock_guard<std::mutex> lock(mpiMutex());
                        if (s->rank == root) {
                            for (int j = 0; j < s->size; ++j)
                                if (j != root) TS_RETURN_IF_ERROR(ops.post(*s, true, j, buffer, b, name));
                        } else {
                            TS_RETURN_IF_ERROR(ops.post(*s, false, root, buffer, b, name));
                        }
                    }
                    return s->wait(ops.reqs, name);
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
            PostedOps posted;
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                for (const P2POp& p : ops) {
                    if (p.peer < 0 || p.peer >= s->size || p.peer == s->rank)
                        return Status::invalid(s->where(name) + ": peer " + std::to_string(p.peer) +
                                               " is not another member");
                    TS_RETURN_IF_ERROR(posted.post(*s, p.kind == P2POp::Send, p.peer, p.buffer,
                                                   p.count * dtypeSize(p.dtype), name));
                }
            }
            TS_RETURN_IF_ERROR(s->wait(posted.reqs, name));
            s->counters.add(sent, received);
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
            const size_t es = dtypeSize(t);
            const auto* in = static_cast<const uint8_t*>(send);
            auto* out = static_cast<uint8_t*>(recv);
            std::vector<size_t> so(size_t(s->size)), ro(size_t(s->size));
            for (int q = 1; q < s->size; ++q) {
                so[size_t(q)] = so[size_t(q - 1)] + sendCounts[size_t(q - 1)] * es;
                ro[size_t(q)] = ro[size_t(q - 1)] + recvCounts[size_t(q - 1)] * es;
            }
            PostedOps ops;
            {
                std::lock_guard<std::mutex> lock(mpiMutex());
                for (int q = 0; q < s->size; ++q) {
                    if (q == s->rank) continue;
                    TS_RETURN_IF_ERROR(ops.post(*s, false, q, out + ro[size_t(q)], recvCounts[size_t(q)] * es, name));
                    TS_RETURN_IF_ERROR(ops.post(*s, true, q, const_cast<uint8_t*>(in) + so[size_t(q)],
                                                sendCounts[size_t(q)] * es, name));
                }
            }
            TS_RETURN_IF_ERROR(s->wait(ops.reqs, name));
            const size_t me = size_t(s->rank);
            if (sendCounts[me] != recvCounts[me])
                return Status::invalid(s->where(name) + ": this member sends itself " + std::to_string(sendCounts[me]) +
                                       " elements but expects " + std::to_string(recvCounts[me]));
            std::memmove(out + ro[me], in + so[me], recvCounts[me] * es);
            return Status::ok();
        });
    }
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

Status MpiRuntime::enableThreadGroups() {
    if (m_threadComm) return Status::ok();
    std::lock_guard<std::mutex> lock(mpiMutex());
    MPI_Comm c = MPI_COMM_NULL;
    const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c);
    if (rc != MPI_SUCCESS) return Status::comm("creating the thread-group communicator: " + mpiError(rc));
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    m_threadComm = std::shared_ptr<void>(new MPI_Comm(c), [](void* p) {
        auto* comm = static_cast<MPI_Comm*>(p);
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) {
            std::lock_guard<std::mutex> l(mpiMutex());
            MPI_Comm_free(comm);
        }
        delete comm;
    });
    int flag = 0;
    int* ub = nullptr;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    m_tagUpperBound = flag && ub ? int64_t(*ub) : 32767;
    return Status::ok();
}

Result<std::unique_ptr<Communicator>> MpiRuntime::createThreadGroup(const std::string& name, int key,
                                                                    const std::vector<int>& members, int globalRank,
                                                                    const std::vector<int>& processOf,
                                                                    std::chrono::milliseconds timeout) {
    if (!m_threadComm) return Status::invalid("thread groups are not enabled (call enableThreadGroups first)");
    int me = -1;
    for (size_t i = 0; i < members.size(); ++i) {
        if (members[i] < 0 || size_t(members[i]) >= processOf.size())
            return Status::invalid("group '" + name + "': rank " + std::to_string(members[i]) +
                                   " has no process (" + std::to_string(processOf.size()) + " ranks)");
        if (members[i] == globalRank) me = int(i);
    }
    if (me < 0 || members.empty())
        return Status::invalid("rank " + std::to_string(globalRank) + " is not a member of group '" + name + "'");
    auto s = std::make_shared<ThreadShared>();
    s->name = name;
    s->ranks = members;
    s->rank = me;
    s->size = int(members.size());
    s->timeout = timeout;
    s->tcomm = *static_cast<MPI_Comm*>(m_threadComm.get());
    for (int g : members) s->procOf.push_back(processOf[size_t(g)]);
    // Every member numbers its communicators of a (key, first member) group in creation order;
    // all members create them in the same order, so the instance agrees.
    int instance = 0;
    {
        std::lock_guard<std::mutex> lock(m_threadMutex);
        instance = m_threadInstances[{key, members[0], globalRank}]++;
    }
    const int64_t world = int64_t(processOf.size());
    s->maxMembers = world;
    s->tagBase = ((int64_t(key) * world + members[0]) * 4 + instance);
    const int64_t maxTag = (s->tagBase * world + world - 1) * world + world - 1;
    if (key < 0 || instance >= 4 || maxTag > m_tagUpperBound)
        return Status::unsupported("group '" + name + "' of " + std::to_string(world) +
                                   " ranks needs MPI tags up to " + std::to_string(maxTag) + " (this MPI allows " +
                                   std::to_string(m_tagUpperBound) + "); run fewer ranks per process group");
    return std::unique_ptr<Communicator>(std::make_unique<MpiThreadCommunicator>(std::move(s)));
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
    m_threadComm.reset();
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
