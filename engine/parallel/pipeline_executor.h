// Executes one pipeline rank's op list (engine/parallel/schedule.h, Megatron-Core's order) on the rank's
// streams: Forward/Backward of (microbatch, chunk) on the compute stream through the rank's
// GptModel chunks, send/recv of activations [s*b, h] (tag 0) and their gradients (tag 1) over
// the pp group on the p2p stream.
//
// Stream dependencies: a p2p op waits for an event recorded on the compute stream when the op
// is reached (what it sends has been computed); received tensors carry an event recorded on
// the p2p stream after the op. Without overlap_p2p_comm the compute stream waits for it right
// away (Megatron's blocking p2p); with it, only just before the compute op that consumes the
// tensor, so the transfer overlaps the compute in between (Megatron posts those receives early
// and waits for them lazily).
// batch_p2p_comm: one batched send/recv per schedule op (batch_isend_irecv); otherwise every
// send and receive is its own op, in Megatron's even/odd-rank order (_p2p_ops).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/comm/communicator.h"
#include "engine/model/gpt.h"
#include "engine/parallel/ddp.h"
#include "engine/parallel/schedule.h"

namespace ts::engine {

struct PipelineExecutorOptions {
    int pp = 1;
    int ppRank = 0;
    bool batchP2P = true;
    bool overlapP2P = false;
};

class PipelineExecutor {
public:
    struct Chunk {
        GptModel* model = nullptr;
        GradSync* sync = nullptr;  // may be null (dp == 1 still has one, harmless)
    };
    // Data of local microbatch j (first / last virtual stage), and the microbatch id passed to
    // the model (the microbatch's index in the equivalent single-device iteration, so dropout
    // seeds and trace annotations match it).
    using DataFn = std::function<std::shared_ptr<const Microbatch>(int j)>;
    using IdFn = std::function<int(int j)>;
    // Checked between ops: a non-ok Status stops the rank (world aborted, cancel).
    using StopFn = std::function<Status()>;

    PipelineExecutor(PipelineSchedule schedule, std::vector<Chunk> chunks, Device& dev, Stream& compute,
                     Stream& p2p, Communicator* ppComm, const PipelineExecutorOptions& opts);

    const PipelineSchedule& schedule() const { return m_schedule; }
    // Enqueues the whole iteration. Returns the first enqueue error (or StopFn's Status).
    Status run(int step, const DataFn& data, const IdFn& id, const StopFn& stop);
    // Drops the step's p2p buffers; only after the streams were synchronized.
    void endStep();

private:
    using Key = std::pair<int, int>;  // (microbatch, chunk)
    bool firstVirtual(int chunk) const { return m_opts.ppRank == 0 && chunk == 0; }
    bool lastVirtual(int chunk) const;
    void waitRecv(const Key& key);
    Status runP2P(const PipeOp& op);

    PipelineSchedule m_schedule;
    std::vector<Chunk> m_chunks;
    Device& m_dev;
    Stream& m_compute;
    Stream& m_p2p;
    Communicator* m_pp;
    PipelineExecutorOptions m_opts;
    int64_t m_tensorElems = 0;  // s*b*h
    std::map<Key, TensorPtr> m_actIn, m_actOut, m_gradIn, m_gradOut;
    std::map<Key, std::shared_ptr<Event>> m_pendingRecv;
};

}  // namespace ts::engine
