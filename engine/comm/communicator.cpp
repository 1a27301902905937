// Names and nccl-tests bandwidth factors shared by every Communicator implementation.
#include "engine/comm/communicator.h"

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

}  // namespace ts::engine
