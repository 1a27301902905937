// Communicator: one interface for collectives and point-to-point, each op enqueued on a
// stream (DESIGN.md "Communicators"). Implementations: in-process (rank threads of one
// process, shared memory), MPI (CPU ranks in several processes), NCCL (GPU).
// Semantics follow NCCL: all members call the same collectives in the same order; buffers
// must stay alive until the stream has executed the op.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/backend/backend.h"

namespace ts::engine {

enum class ReduceOp : uint8_t { Sum = 0, Max, Min, Avg };

struct P2POp {
    enum Kind : uint8_t { Send, Recv } kind = Send;
    int peer = 0;          // rank within this communicator
    void* buffer = nullptr;
    size_t count = 0;      // elements
    DType dtype = DType::F32;
    int tag = 0;
};

// Bytes actually moved by this rank (for the trace and bandwidth reports).
struct CommStats {
    uint64_t ops = 0;
    uint64_t bytesSent = 0;
    uint64_t bytesReceived = 0;
};

// The running totals behind Communicator::stats(), shared by every implementation: an op that
// succeeded counts once with its bytes; ops may finish on several streams' threads at once.
class CommCounters {
public:
    void add(uint64_t sent, uint64_t received) {
        m_ops.fetch_add(1, std::memory_order_relaxed);
        m_bytesSent.fetch_add(sent, std::memory_order_relaxed);
        m_bytesReceived.fetch_add(received, std::memory_order_relaxed);
    }
    CommStats stats() const {
        CommStats c;
        c.ops = m_ops.load();
        c.bytesSent = m_bytesSent.load();
        c.bytesReceived = m_bytesReceived.load();
        return c;
    }

private:
    std::atomic<uint64_t> m_ops{0}, m_bytesSent{0}, m_bytesReceived{0};
};

// nccl-tests accounting (doc/PERFORMANCE.md of nccl-tests): for a collective of `size` bytes
// (the "size" column: allReduce/broadcast: count*elemSize; reduceScatter: recvCount*n*elemSize;
// allGather: sendCount*n*elemSize; allToAll: total bytes sent by one rank),
//   algBw = size / time,   busBw = algBw * busBwFactor,
// with busBwFactor = 2(n-1)/n (allReduce), (n-1)/n (reduceScatter, allGather, allToAll),
// 1 (broadcast, sendRecv). busBw is what each rank's link carries in a ring implementation.
enum class CollectiveKind : uint8_t { AllReduce = 0, ReduceScatter, AllGather, Broadcast, AllToAll, SendRecv };
const char* collectiveName(CollectiveKind k);  // "all_reduce", "reduce_scatter", ...
double busBwFactor(CollectiveKind k, int groupSize);

// A group's global ranks as messages print them: "0,2,4".
std::string rankList(const std::vector<int>& ranks);
// What a world's join() checks of a group: members (global ranks, in group order) that are
// distinct ranks of a world of `worldSize`, among them globalRank, whose group rank goes to
// *groupRank. Else Invalid, naming the group and the offending rank.
Status checkGroupRanks(const std::string& name, const std::vector<int>& ranks, int worldSize, int globalRank,
                       int* groupRank);

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;             // rank within the group
    virtual int size() const = 0;
    virtual const std::string& name() const = 0;  // group name: "tp", "dp", "pp", "world", ...
    virtual std::vector<int> globalRanks() const = 0;  // group member -> global rank

    // count = number of elements of the full (per-rank) buffer unless stated otherwise.
    virtual void allReduce(Stream& s, const void* send, void* recv, size_t count, DType t,
                           ReduceOp op) = 0;
    // recv holds count elements; send holds count * size() elements.
    virtual void reduceScatter(Stream& s, const void* send, void* recv, size_t recvCount, DType t,
                               ReduceOp op) = 0;
    // send holds sendCount elements, recv holds sendCount * size() (rank order).
    virtual void allGather(Stream& s, const void* send, void* recv, size_t sendCount, DType t) = 0;
    virtual void broadcast(Stream& s, void* buffer, size_t count, DType t, int root) = 0;
    // All ops of the batch progress together (batch_isend_irecv); no ordering deadlock.
    virtual void batchSendRecv(Stream& s, const std::vector<P2POp>& ops) = 0;
    // sendCounts/recvCounts per peer (elements), displacements derived (contiguous, rank order).
    virtual void allToAllv(Stream& s, const void* send, const std::vector<size_t>& sendCounts,
                           void* recv, const std::vector<size_t>& recvCounts, DType t) = 0;
    virtual CommStats stats() const = 0;
    // Make every pending and future op fail fast (a peer failed); used for clean shutdown.
    virtual void abort(const Status& why) = 0;
};

// `inner` with every op complete when the call returns: the op first waits for everything
// submitted to its stream before it, runs, and is waited for. For ranks that share a GPU
// (makeSharedCudaBackend): there the in-process communicator's op runs at submit, on the calling
// thread, and reads and writes managed memory from the host, so the kernels that wrote its
// buffers must have finished and the kernels after it must not start before it has. Every op
// then holds its rank's host thread until the whole group has come, so the order in which a
// rank's host issues ops of different groups (and streams) matters, as for blocking
// collectives: TS_HOST_SYNC_COLLECTIVES=1 uses this wrapper on the CPU and emulated backends too,
// which is how the suite checks that the engine's order has no cycle.
std::unique_ptr<Communicator> hostSynchronized(std::unique_ptr<Communicator> inner);

// Where a process's communicators come from: the in-process CommWorld (CPU and emulated
// devices) or the NCCL world of one process's rank threads (CUDA). join(): the communicator of
// `globalRank` in the group `name` whose members are `ranks` (global ranks, group order); the
// k-th join of the same (name, ranks) by one rank pairs with the k-th join of the others. A join
// may block until every member has joined (NCCL's does), so the members of one process join
// from their own threads, concurrently. abort(): every pending and future op (and join) of the
// world fails with `why`; abortStatus(): Ok, or why it was aborted.
class CommGroups {
public:
    virtual ~CommGroups() = default;
    virtual int worldSize() const = 0;
    virtual Result<std::unique_ptr<Communicator>> join(const std::string& name, const std::vector<int>& ranks,
                                                       int globalRank) = 0;
    virtual void abort(const Status& why) = 0;
    virtual Status abortStatus() const = 0;
};

}  // namespace ts::engine
