// In-process communicator: the ranks are threads of one process (CPU backend virtual devices).
// A CommWorld owns the shared state; each rank joins the groups it belongs to and gets its own
// Communicator. Ops are enqueued on the caller's stream and execute on that stream's thread;
// the members of a group rendezvous through shared memory (mutex + condition variable) and
// copy/reduce directly out of each other's buffers (zero-copy, like NCCL's P2P/SHM transport).
// Buffers of an emulated device (emulated_backend.h) are reached through their host view
// (hostAlias), so the communicator works on that backend as NCCL does on a GPU.
//
// Matching: as in NCCL, every member issues the same collectives of a group in the same order;
// op i of one member meets op i of the others (a per-member sequence number taken at enqueue).
// Point-to-point ops match FIFO per (source, destination, tag).
//
// Reductions: F32, BF16 (uint16 bits; accumulated in fp32 in rank order, rounded once to
// nearest-even), I32, I64. Every member gets bitwise identical results: chunk k of the result
// is reduced by member k and copied by the others. Data-movement ops accept every dtype.
//
// Deadlock guard: every wait has a deadline (CommOptions::timeout, default 60 s). An op that
// times out fails with ErrorCode::Timeout naming the group, the op, this rank and the ranks that
// never arrived, and aborts its group so that the other members fail fast with the same
// explanation. CommWorld::abort / Communicator::abort make every pending and future op of the
// world fail with CommError within one wake-up.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"

namespace ts::engine {

struct CommOptions {
    std::chrono::milliseconds timeout{60'000};
    // join() returns only once every member of the group has joined, as ncclCommInitRank does
    // (a member that does not come within `timeout` fails the join, naming how many came; an
    // abort fails it at once). Emulated devices use it, so their runs keep NCCL's rule.
    bool blockingJoins = false;
};

class CommWorld final : public CommGroups {
public:
    explicit CommWorld(int worldSize, CommOptions options = {});
    ~CommWorld() override;
    CommWorld(const CommWorld&) = delete;
    CommWorld& operator=(const CommWorld&) = delete;

    int worldSize() const override;
    // The communicator of `globalRank` in the group `name` whose members are `ranks` (global
    // ranks, in group-rank order). Every member calls this with the same name and ranks; the
    // k-th join of the same (name, ranks) by one rank pairs with the k-th join of the others,
    // so a rank may hold several communicators over the same members (e.g. one per stream).
    // Communicators must not outlive the CommWorld.
    Result<std::unique_ptr<Communicator>> join(const std::string& name, const std::vector<int>& ranks,
                                               int globalRank) override;
    // Fails every pending and future op of every group of this world.
    void abort(const Status& why) override;
    // Ok, or why the world was aborted.
    Status abortStatus() const override;
    void setTimeout(std::chrono::milliseconds timeout);

    struct State;

private:
    std::shared_ptr<State> m_state;
};

}  // namespace ts::engine
