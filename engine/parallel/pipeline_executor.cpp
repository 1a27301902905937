// Pipeline op-list executor (see pipeline_executor.h).
#include "engine/parallel/pipeline_executor.h"

#include "engine/backend/backend_trace.h"

namespace ts::engine {

namespace {
constexpr int kTagActivation = 0;
constexpr int kTagGradient = 1;
}  // namespace

PipelineExecutor::PipelineExecutor(PipelineSchedule schedule, std::vector<Chunk> chunks, Device& dev,
                                   Stream& compute, Stream& p2p, Communicator* ppComm,
                                   const PipelineExecutorOptions& opts)
    : m_schedule(std::move(schedule)), m_chunks(std::move(chunks)), m_dev(dev), m_compute(compute), m_p2p(p2p),
      m_pp(ppComm), m_opts(opts) {
    if (!m_chunks.empty() && m_chunks[0].model) {
        // [s, b, h], or [s/t, b, h] with sequence parallel (schedules.py tensor_shape).
        m_tensorElems = m_chunks[0].model->stageTensorElems();
    }
}

bool PipelineExecutor::lastVirtual(int chunk) const {
    return m_opts.ppRank == m_opts.pp - 1 && chunk == int(m_chunks.size()) - 1;
}

void PipelineExecutor::waitRecv(const Key& key) {
    auto it = m_pendingRecv.find(key);
    if (it == m_pendingRecv.end()) return;
    m_compute.wait(*it->second);
    m_pendingRecv.erase(it);
}

Status PipelineExecutor::run(int step, const DataFn& data, const IdFn& id, const StopFn& stop) {
    for (const PipeOp& op : m_schedule.ops) {
        if (stop) TS_RETURN_IF_ERROR(stop());
        if (!op.isCompute()) {
            TS_RETURN_IF_ERROR(runP2P(op));
            continue;
        }
        if (op.chunk < 0 || op.chunk >= int(m_chunks.size()))
            return Status::internal("schedule op " + op.text() + " names a chunk this rank does not hold");
        GptModel& model = *m_chunks[size_t(op.chunk)].model;
        const Key key{op.microbatch, op.chunk};
        const int mbId = id(op.microbatch);
        const bool first = firstVirtual(op.chunk), last = lastVirtual(op.chunk);
        RangeScope mbRange(m_dev, range::kMicrobatch, {step, mbId, op.chunk, -1});
        RangeScope stageRange(m_dev, range::kStage, {step, mbId, op.chunk, -1});
        if (op.kind == PipeOpKind::Forward) {
            TensorPtr input, output;
            if (!first) {
                auto it = m_actIn.find(key);
                if (it == m_actIn.end())
                    return Status::internal("pipeline rank " + std::to_string(m_opts.ppRank) + ": " + op.text() +
                                            " runs before its input activation was received");
                input = it->second;
                waitRecv(key);
            }
            if (!last) {
                TS_ASSIGN_OR_RETURN(output, model.exec().alloc(m_tensorElems));
                m_actOut[key] = output;
            }
            auto mb = (first || last) ? data(op.microbatch) : nullptr;
            TS_RETURN_IF_ERROR(model.forward(mbId, mb, input, output).withContext("pipeline op " + op.text()));
        } else {
            TensorPtr gradOutput, gradInput;
            if (!last) {
                auto it = m_gradIn.find(key);
                if (it == m_gradIn.end())
                    return Status::internal("pipeline rank " + std::to_string(m_opts.ppRank) + ": " + op.text() +
                                            " runs before its output gradient was received");
                gradOutput = it->second;
                waitRecv({-1 - op.microbatch, op.chunk});
            }
            if (!first) {
                TS_ASSIGN_OR_RETURN(gradInput, model.exec().alloc(m_tensorElems));
                m_gradOut[key] = gradInput;
            }
            GradSync* sync = m_chunks[size_t(op.chunk)].sync;
            if (sync) sync->setLastMicrobatch(op.gradSync);
            Status st = model.backward(mbId, gradOutput, gradInput);
            if (sync) sync->setLastMicrobatch(false);
            TS_RETURN_IF_ERROR(st.withContext("pipeline op " + op.text()));
        }
    }
    return Status::ok();
}

Status PipelineExecutor::runP2P(const PipeOp& op) {
    if (!m_pp || m_opts.pp < 2) return Status::internal("p2p op " + op.text() + " without a pp communicator");
    const int next = (m_opts.ppRank + 1) % m_opts.pp, prev = (m_opts.ppRank - 1 + m_opts.pp) % m_opts.pp;
    const size_t n = size_t(m_tensorElems);
    Exec& ex = m_chunks[0].model->exec();
    P2POp sendNext, recvPrev, sendPrev, recvNext;
    bool hasSendNext = false, hasRecvPrev = false, hasSendPrev = false, hasRecvNext = false;
    std::vector<Key> received;  // keys of m_pendingRecv to set (gradients as -1-mb)
    if (op.sendForward.valid()) {
        auto it = m_actOut.find({op.sendForward.microbatch, op.sendForward.chunk});
        if (it == m_actOut.end()) return Status::internal("p2p op " + op.text() + " sends an activation never computed");
        sendNext = {P2POp::Send, next, it->second->data(), n, DType::F32, kTagActivation};
        hasSendNext = true;
    }
    if (op.recvForward.valid()) {
        const Key key{op.recvForward.microbatch, op.recvForward.chunk};
        TS_ASSIGN_OR_RETURN(TensorPtr buf, ex.alloc(m_tensorElems));
        m_actIn[key] = buf;
        recvPrev = {P2POp::Recv, prev, buf->data(), n, DType::F32, kTagActivation};
        hasRecvPrev = true;
        received.push_back(key);
    }
    if (op.sendBackward.valid()) {
        auto it = m_gradOut.find({op.sendBackward.microbatch, op.sendBackward.chunk});
        if (it == m_gradOut.end()) return Status::internal("p2p op " + op.text() + " sends a gradient never computed");
        sendPrev = {P2POp::Send, prev, it->second->data(), n, DType::F32, kTagGradient};
        hasSendPrev = true;
    }
    if (op.recvBackward.valid()) {
        const Key key{op.recvBackward.microbatch, op.recvBackward.chunk};
        TS_ASSIGN_OR_RETURN(TensorPtr buf, ex.alloc(m_tensorElems));
        m_gradIn[key] = buf;
        recvNext = {P2POp::Recv, next, buf->data(), n, DType::F32, kTagGradient};
        hasRecvNext = true;
        received.push_back({-1 - key.first, key.second});
    }
    // Megatron's _p2p_ops order (deadlock avoidance when every op is its own transfer).
    std::vector<P2POp> ops;
    auto add = [&](bool has, const P2POp& p) {
        if (has) ops.push_back(p);
    };
    if (m_opts.ppRank % 2 == 0) {
        add(hasSendNext, sendNext);
        add(hasRecvPrev, recvPrev);
        add(hasSendPrev, sendPrev);
        add(hasRecvNext, recvNext);
    } else {
        add(hasRecvPrev, recvPrev);
        add(hasSendNext, sendNext);
        add(hasRecvNext, recvNext);
        add(hasSendPrev, sendPrev);
    }
    auto ready = m_dev.createEvent();
    m_compute.record(*ready);
    m_p2p.wait(*ready);
    if (m_opts.batchP2P) {
        m_pp->batchSendRecv(m_p2p, ops);
    } else {
        for (const P2POp& p : ops) m_pp->batchSendRecv(m_p2p, {p});
    }
    std::shared_ptr<Event> done = m_dev.createEvent();
    m_p2p.record(*done);
    if (!m_opts.overlapP2P) {
        m_compute.wait(*done);
    } else {
        for (const Key& k : received) m_pendingRecv[k] = done;
    }
    return Status::ok();
}

void PipelineExecutor::endStep() {
    m_actIn.clear();
    m_actOut.clear();
    m_gradIn.clear();
    m_gradOut.clear();
    m_pendingRecv.clear();
}

}  // namespace ts::engine
