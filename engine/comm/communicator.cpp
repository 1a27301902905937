// Names, nccl-tests bandwidth factors and the group check shared by every Communicator
// implementation.
#include "engine/comm/communicator.h"

#include <algorithm>

namespace ts::engine {

const char* collectiveName(CollectiveKind k) {
    switch (k) {
        case CollectiveKind::AllReduce: return "all_reduce";
        case CollectiveKind::ReduceScatter: return "reduce_scatter";
        case CollectiveKind::AllGather: return "all_gather";
        case CollectiveKind::Broadcast: return "broadcast";
        case CollectiveKind::AllToAll: return "all_to_all";
        case CollectiveKind::SendRecv: return "send_recv";
    }
    return "unknown";
}

double busBwFactor(CollectiveKind k, int n) {
    if (n <= 1) return k == CollectiveKind::Broadcast || k == CollectiveKind::SendRecv ? 1.0 : 0.0;
    switch (k) {
        case CollectiveKind::AllReduce: return 2.0 * (n - 1) / n;
        case CollectiveKind::ReduceScatter:
        case CollectiveKind::AllGather:
        case CollectiveKind::AllToAll: return double(n - 1) / n;
        case CollectiveKind::Broadcast:
        case CollectiveKind::SendRecv: return 1.0;
    }
    return 1.0;
}

std::string rankList(const std::vector<int>& ranks) {
    std::string s;
    for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
    return s;
}

Status checkGroupRanks(const std::string& name, const std::vector<int>& ranks, int worldSize, int globalRank,
                       int* groupRank) {
    if (ranks.empty()) return Status::invalid("group '" + name + "' has no members");
    std::vector<int> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
        if (sorted[i] < 0 || sorted[i] >= worldSize)
            return Status::invalid("group '" + name + "': rank " + std::to_string(sorted[i]) +
                                   " is outside the world of " + std::to_string(worldSize) + " ranks");
        if (i && sorted[i] == sorted[i - 1])
            return Status::invalid("group '" + name + "' lists rank " + std::to_string(sorted[i]) + " twice");
    }
    const auto pos = std::find(ranks.begin(), ranks.end(), globalRank);
    if (pos == ranks.end())
        return Status::invalid("rank " + std::to_string(globalRank) + " is not a member of group '" + name +
                               "' (" + rankList(ranks) + ")");
    *groupRank = int(pos - ranks.begin());
    return Status::ok();
}

namespace {

class HostSyncCommunicator final : public Communicator {
public:
    explicit HostSyncCommunicator(std::unique_ptr<Communicator> inner) : m_inner(std::move(inner)) {}
    int rank() const override { return m_inner->rank(); }
    int size() const override { return m_inner->size(); }
    const std::string& name() const override { return m_inner->name(); }
    std::vector<int> globalRanks() const override { return m_inner->globalRanks(); }

    void allReduce(Stream& s, const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
        around(s, [&] { m_inner->allReduce(s, send, recv, count, t, op); });
    }
    void reduceScatter(Stream& s, const void* send, void* recv, size_t recvCount, DType t, ReduceOp op) override {
        around(s, [&] { m_inner->reduceScatter(s, send, recv, recvCount, t, op); });
    }
    void allGather(Stream& s, const void* send, void* recv, size_t sendCount, DType t) override {
        around(s, [&] { m_inner->allGather(s, send, recv, sendCount, t); });
    }
    void broadcast(Stream& s, void* buffer, size_t count, DType t, int root) override {
        around(s, [&] { m_inner->broadcast(s, buffer, count, t, root); });
    }
    void batchSendRecv(Stream& s, const std::vector<P2POp>& ops) override {
        around(s, [&] { m_inner->batchSendRecv(s, ops); });
    }
    void allToAllv(Stream& s, const void* send, const std::vector<size_t>& sendCounts, void* recv,
                   const std::vector<size_t>& recvCounts, DType t) override {
        around(s, [&] { m_inner->allToAllv(s, send, sendCounts, recv, recvCounts, t); });
    }
    CommStats stats() const override { return m_inner->stats(); }
    void abort(const Status& why) override { m_inner->abort(why); }

private:
    // A failed stream skips the op (the Stream contract) and keeps its error for the caller's
    // next synchronize. The members already waiting for this one would wait until the deadlock
    // guard's timeout: abort the group's world with the error instead, so they fail at once.
    template <typename Op>
    void around(Stream& s, Op op) {
        if (Status st = s.synchronize(); !st.isOk()) {
            const std::vector<int> ranks = globalRanks();
            const int me = rank() < int(ranks.size()) ? ranks[size_t(rank())] : rank();
            m_inner->abort(st.withContext("rank " + std::to_string(me) + " failed before a collective of group '" +
                                          name() + "'"));
            return;
        }
        op();
        (void)s.synchronize();
    }

    std::unique_ptr<Communicator> m_inner;
};

}  // namespace

std::unique_ptr<Communicator> hostSynchronized(std::unique_ptr<Communicator> inner) {
    if (!inner) return inner;
    return std::make_unique<HostSyncCommunicator>(std::move(inner));
}

}  // namespace ts::engine
