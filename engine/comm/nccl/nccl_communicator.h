// NCCL communicator: the Communicator interface over NCCL, for ranks on CUDA devices. Built
// only with CUDA and NCCL (TS_HAVE_NCCL); this header needs neither's headers.
//
// Ops: every op is submitted to the given Stream, which must be a stream of the CUDA backend
// on the communicator's device (its native() cudaStream_t; CUDA's submit runs the op at once on
// the caller's thread, so the NCCL call enqueues the collective there). allReduce /
// reduceScatter (Sum, Max, Min, Avg = ncclAvg), allGather, broadcast map to the NCCL call of
// the same name; batchSendRecv is ncclSend/ncclRecv inside ncclGroupStart/End; allToAllv is
// grouped send/recv over contiguous, rank-ordered displacements (the self part is a
// cudaMemcpyAsync). DTypes: F32, BF16, F16, FP8E4M3/FP8E5M2 (NCCL >= 2.24; reductions of FP8
// need sm_90), I32, I64, U8.
//
// Differences from the in-process communicator (inproc_communicator.h), all NCCL's:
// - Reductions run in NCCL's order and precision (bf16 is added in bf16 steps along the ring,
//   not accumulated in fp32 and rounded once), so with more than 2 ranks bf16 sums may differ
//   by rounding; fp32 sums differ in the last bits. Every rank still gets the same result.
// - P2P tags are ignored: NCCL matches the sends and receives between two ranks in issue
//   order, so both sides must issue them in the same order (Megatron's schedules do).
// - No deadlock guard: a member that never calls blocks the others on the GPU (NCCL's own
//   NCCL_TIMEOUT / watchdog applies); abort() is the way out.
// - Argument mismatches between members are not detected (NCCL would hang or corrupt).
// - stats() counts an op when it is enqueued (its bytes as the in-process communicator counts
//   them), not when the GPU has finished it.
//
// Lifetime and threads (NCCL's rules): ncclCommInitRank blocks until every member of the group
// has called it, so the members of one process must join from different threads at the same
// time (one thread per rank, as the trainer runs them), never one after another from one
// thread. Destroy a group's communicators on their rank threads too (NCCL may wait for the
// peers while it finalizes). A communicator must not be used from two threads at once.
// abort(): ncclCommAbort on every communicator of the world (NcclWorld) or on this one (MPI
// bootstrap); pending and future ops fail with CommError. It waits up to 100 ms for an op being
// enqueued on another thread to return, then aborts anyway (an op stuck inside NCCL is what
// abort is for).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"

namespace ts::engine {

// In-process bootstrap: the rank threads of one process, each on its own GPU. One unique id
// per group instance, made by the first member that joins; join() then calls ncclCommInitRank
// (blocking until every member joined, see above). Same join(name, ranks, globalRank) shape
// as CommWorld: the k-th join of the same (name, ranks) by one rank pairs with the k-th join of
// the others.
class NcclWorld final : public CommGroups {
public:
    // deviceOfRank[g]: the CUDA device ordinal global rank g uses; empty = g % device count.
    explicit NcclWorld(int worldSize, std::vector<int> deviceOfRank = {});
    ~NcclWorld() override;
    NcclWorld(const NcclWorld&) = delete;
    NcclWorld& operator=(const NcclWorld&) = delete;

    int worldSize() const override;
    Result<std::unique_ptr<Communicator>> join(const std::string& name, const std::vector<int>& ranks,
                                               int globalRank) override;
    // ncclCommAbort on every communicator of this world; later joins fail too (a join already
    // blocked in ncclCommInitRank waits for its peers: see above).
    void abort(const Status& why) override;
    Status abortStatus() const override;

    struct State;

private:
    std::shared_ptr<State> m_state;
};

#ifdef TS_HAVE_MPI
// Across processes: the communicator of this process in the group `ranks` (MPI_COMM_WORLD
// ranks, group-rank order; one rank per process) on CUDA device `cudaDevice`. Group rank 0
// makes the unique id and broadcasts it over an MPI communicator of the group's ranks
// (MPI_Comm_create_group: collective over those ranks only). MPI must be initialized
// (MpiRuntime::init); call it from one thread, before ops are in flight, like
// MpiRuntime::createGroup.
Result<std::unique_ptr<Communicator>> createNcclGroupMpi(const std::string& name, const std::vector<int>& ranks,
                                                         int cudaDevice);
#endif

}  // namespace ts::engine
