// MPI communicators: CPU ranks in several processes. createGroup: one rank per process (global
// rank = MPI_COMM_WORLD rank); createThreadGroup: several ranks per process (see below). Built
// only when MPI is found (TS_HAVE_MPI).
//
// Every op is enqueued on a stream and executed on that stream's thread as a nonblocking MPI
// call (MPI_Iallreduce, MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Ialltoallv,
// MPI_Isend/Irecv) that the thread then polls with MPI_Test. All MPI calls of the process are
// serialized by one mutex that is released between polls, so several streams can have ops in
// flight on different groups without deadlocking even where MPI gives only
// MPI_THREAD_SERIALIZED. Polling also gives the deadlock guard (timeout) and abort().
//
// BF16 reductions are converted to fp32, reduced in fp32 and rounded once (as the in-process
// communicator does); Avg is a sum followed by a division. F16 reductions are Unsupported.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <string>
#include <vector>

#include "engine/comm/communicator.h"

namespace ts::engine {

class MpiRuntime {
public:
    // Initializes MPI (MPI_THREAD_MULTIPLE requested) unless it already is. Finalizes on
    // destruction only if this object initialized it.
    static Result<std::unique_ptr<MpiRuntime>> init(int* argc, char*** argv);
    ~MpiRuntime();
    int worldRank() const { return m_rank; }
    int worldSize() const { return m_size; }
    int threadLevel() const { return m_threadLevel; }  // MPI_THREAD_* provided

    // Communicator over `ranks` (MPI world ranks, group-rank order); collective over those
    // ranks only (MPI_Comm_create_group). This process must be one of them. Create groups
    // from one thread, before ops are in flight (creation blocks while holding the MPI lock).
    Result<std::unique_ptr<Communicator>> createGroup(const std::string& name, const std::vector<int>& ranks,
                                                      std::chrono::milliseconds timeout = std::chrono::seconds(60));

    // Several ranks per process (issue #18: P processes x T rank threads). enableThreadGroups()
    // is collective over every process (once, before any thread group); createThreadGroup()
    // then makes the communicator of member `globalRank` of `members` (global ranks, group-rank
    // order), where global rank g runs in MPI process processOf[g]. Any mixture of members in
    // this and other processes works: every op is tagged point-to-point traffic over a private
    // duplicate of MPI_COMM_WORLD, reductions done here in member order (every member gets the
    // same bits). `key` identifies the group's kind (its name) as a small integer the same on
    // every process; groups of one kind must be disjoint (as the layout's are). Thread-safe.
    Status enableThreadGroups();
    Result<std::unique_ptr<Communicator>> createThreadGroup(const std::string& name, int key, const std::vector<int>& members,
                                                            int globalRank, const std::vector<int>& processOf,
                                                            std::chrono::milliseconds timeout = std::chrono::seconds(60));

    // Failure notices between processes (issue #18), outside every group's traffic: a private
    // duplicate of MPI_COMM_WORLD that a background thread polls. onNotice(fromWorldRank, text)
    // runs on that thread for every notice another process announces. Collective (every process
    // calls it once, before ops are in flight); stopped by stopNotices() or the destructor.
    Status startNotices(std::function<void(int from, const std::string& text)> onNotice);
    // Sends `text` to every other process; waits up to `wait` for the sends to complete (a dead
    // process never completes: the send is then abandoned).
    Status announce(const std::string& text, std::chrono::milliseconds wait = std::chrono::seconds(2));
    void stopNotices();

private:
    MpiRuntime() = default;
    struct Notices;
    std::unique_ptr<Notices> m_notices;
    std::shared_ptr<void> m_threadComm;  // MPI_Comm* (thread groups)
    int64_t m_tagUpperBound = 32767;
    std::mutex m_threadMutex;
    std::map<std::tuple<int, int, int>, int> m_threadInstances;  // (key, first member, rank) -> count
    bool m_ownsInit = false;
    int m_rank = 0, m_size = 1, m_threadLevel = 0;
};

}  // namespace ts::engine
