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

}  // namespace ts::engine
