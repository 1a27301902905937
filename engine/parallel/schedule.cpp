// Pipeline schedules (see schedule.h). The loops mirror Megatron-Core's
// forward_backward_pipelining_without_interleaving / _with_interleaving (non-overlapped p2p,
// i.e. batch_p2p_comm, plus the overlap_p2p_comm split) so that op i here is op i there.
#include "engine/parallel/schedule.h"

#include <algorithm>

namespace ts::engine {

const char* pipeOpKindName(PipeOpKind k) {
    switch (k) {
        case PipeOpKind::Forward: return "forward";
        case PipeOpKind::Backward: return "backward";
        case PipeOpKind::RecvForward: return "recv_forward";
        case PipeOpKind::SendForward: return "send_forward";
        case PipeOpKind::RecvBackward: return "recv_backward";
        case PipeOpKind::SendBackward: return "send_backward";
        case PipeOpKind::SendForwardRecvBackward: return "send_forward_recv_backward";
        case PipeOpKind::SendBackwardRecvForward: return "send_backward_recv_forward";
        case PipeOpKind::SendForwardRecvForward: return "send_forward_recv_forward";
        case PipeOpKind::SendBackwardRecvBackward: return "send_backward_recv_backward";
        case PipeOpKind::SendForwardBackwardRecvForwardBackward: return "send_forward_backward_recv_forward_backward";
    }
    return "unknown";
}

namespace {

std::string refText(const char* what, const TensorRef& r) {
    return std::string(what) + " " + std::to_string(r.microbatch) + ".c" + std::to_string(r.chunk);
}

}  // namespace

std::string PipeOp::text() const {
    if (kind == PipeOpKind::Forward || kind == PipeOpKind::Backward)
        return std::string(kind == PipeOpKind::Forward ? "F" : "B") + std::to_string(microbatch) + ".c" +
               std::to_string(chunk);
    std::string parts;
    auto add = [&](const char* what, const TensorRef& r) {
        if (!r.valid()) return;
        parts += (parts.empty() ? "" : ", ") + refText(what, r);
    };
    add("send act", sendForward);
    add("recv act", recvForward);
    add("send grad", sendBackward);
    add("recv grad", recvBackward);
    return std::string(pipeOpKindName(kind)) + "(" + parts + ")";
}

std::vector<PipeOp> PipelineSchedule::computeOps() const {
    std::vector<PipeOp> out;
    for (const auto& op : ops)
        if (op.isCompute()) out.push_back(op);
    return out;
}

std::string PipelineSchedule::text(bool withP2P) const {
    std::string s;
    for (const auto& op : ops) {
        if (!withP2P && !op.isCompute()) continue;
        s += (s.empty() ? "" : " ") + op.text();
    }
    return s;
}

std::vector<TensorRef> scheduleTable(int m, int v, int g) {
    std::vector<TensorRef> table;
    if (m <= 0 || v <= 0 || g <= 0) return table;
    table.reserve(size_t(m) * size_t(v));
    for (int lo = 0; lo < m; lo += g) {
        const int hi = lo + g >= m ? m : lo + g;
        for (int c = 0; c < v; ++c)
            for (int mb = lo; mb < hi; ++mb) table.push_back({mb, c});
    }
    return table;
}

Status validateSchedule(const ScheduleParams& p) {
    if (p.pp < 1) return Status::invalid("pipeline_model_parallel_size=" + std::to_string(p.pp) + " must be at least 1");
    if (p.vpp < 1)
        return Status::invalid("virtual_pipeline_model_parallel_size=" + std::to_string(p.vpp) + " must be at least 1");
    if (p.microbatches < 1)
        return Status::invalid("num_microbatches=" + std::to_string(p.microbatches) + " must be at least 1");
    if (p.rank < 0 || p.rank >= p.pp)
        return Status::invalid("pipeline rank " + std::to_string(p.rank) + " is outside [0, " + std::to_string(p.pp) + ")");
    // The schedule is built as a list of ops (about four per microbatch and virtual stage), so
    // its size is bounded; real steps use hundreds to a few thousand microbatches.
    if (int64_t(p.microbatches) * p.vpp > kMaxScheduleMicrobatches)
        return Status::invalid("num_microbatches=" + std::to_string(p.microbatches) +
                               (p.vpp > 1 ? " x virtual_pipeline_model_parallel_size=" + std::to_string(p.vpp) : "") +
                               " is more than " + std::to_string(kMaxScheduleMicrobatches) +
                               " microbatches per step: the schedule is an explicit list of ops per microbatch "
                               "and would not fit in memory; real steps use at most a few thousand");
    if (p.vpp > 1) {
        if (p.pp == 1)
            return Status::invalid("non-pipeline-parallel schedule does not support model chunking "
                                   "(virtual_pipeline_model_parallel_size > 1 needs pipeline_model_parallel_size > 1)");
        // arguments.py: interleaving needs p > 2 unless p2p communication is overlapped.
        if (p.overlapP2PComm) {
            if (p.pp <= 1)
                return Status::invalid("When interleaved schedule is used, pipeline-model-parallel size should be "
                                       "greater than 1");
        } else if (p.pp <= 2) {
            return Status::invalid(
                "When interleaved schedule is used and p2p communication overlap is disabled, "
                "pipeline-model-parallel size should be greater than 2 to avoid having multiple p2p sends and recvs "
                "between same 2 ranks per communication batch (pipeline_model_parallel_size=" +
                std::to_string(p.pp) + "; set overlap_p2p_comm or use pp > 2)");
        }
        const int g = p.microbatchGroupSize > 0 ? p.microbatchGroupSize : p.pp;
        const int m = p.microbatches;
        if (g > m || g < p.pp)
            return Status::invalid("The number of contiguous micro-batches in a virtual pipeline stage should range in "
                                   "[PP=" + std::to_string(p.pp) + " , M=" + std::to_string(m) +
                                   "] (microbatch_group_size_per_vp_stage=" + std::to_string(g) +
                                   (p.microbatchGroupSize > 0 ? "" : ", its default = pp") + ")");
        const int finalGroup = m % g;
        if (finalGroup > 0 && finalGroup < p.pp)
            return Status::invalid(
                "The remainder of M (the total micro-batches) divided by N (number of contiguous micro-batches in a "
                "virtual pipeline stage) should be 0, or larger than or equal to the pipeline-parallel size, but it is " +
                std::to_string(finalGroup) +
                ". Otherwise, it introduces dependency bubbles in the pipeline and reduces throughput. (num_microbatches=" +
                std::to_string(m) + ", N=" + std::to_string(g) + "; with the default N = pp, num_microbatches must be "
                "divisible by pipeline_model_parallel_size)");
    }
    return Status::ok();
}

namespace {

PipeOp compute(PipeOpKind kind, int mb, int chunk, int k, bool gradSync) {
    PipeOp op;
    op.kind = kind;
    op.microbatch = mb;
    op.chunk = chunk;
    op.virtualMicrobatch = k;
    op.gradSync = gradSync;
    return op;
}

void pushP2P(std::vector<PipeOp>& ops, PipeOpKind kind, TensorRef sendF, TensorRef recvF, TensorRef sendB,
             TensorRef recvB) {
    if (!sendF.valid() && !recvF.valid() && !sendB.valid() && !recvB.valid()) return;  // Megatron: no-op
    PipeOp op;
    op.kind = kind;
    op.sendForward = sendF;
    op.recvForward = recvF;
    op.sendBackward = sendB;
    op.recvBackward = recvB;
    ops.push_back(op);
}

void noPipelining(PipelineSchedule& s) {
    const int m = s.params.microbatches;
    s.total = m;
    for (int i = 0; i < m; ++i) {
        s.ops.push_back(compute(PipeOpKind::Forward, i, 0, i, false));
        s.ops.push_back(compute(PipeOpKind::Backward, i, 0, i, i == m - 1));
    }
}

void oneFOneB(PipelineSchedule& s) {
    const int p = s.params.pp, r = s.params.rank, m = s.params.microbatches;
    const bool first = r == 0, last = r == p - 1;
    const int W = std::min(p - r - 1, m), R = m - W;
    s.warmup = W;
    s.remaining = R;
    s.total = m;
    auto act = [](int mb) { return TensorRef{mb, 0}; };
    const TensorRef none;
    auto& ops = s.ops;
    for (int i = 0; i < W; ++i) {
        if (!first) pushP2P(ops, PipeOpKind::RecvForward, none, act(i), none, none);
        ops.push_back(compute(PipeOpKind::Forward, i, 0, i, false));
        if (!last) pushP2P(ops, PipeOpKind::SendForward, act(i), none, none, none);
    }
    if (R > 0 && !first) pushP2P(ops, PipeOpKind::RecvForward, none, act(W), none, none);
    for (int i = 0; i < R; ++i) {
        const bool lastIteration = i == R - 1;
        ops.push_back(compute(PipeOpKind::Forward, W + i, 0, W + i, false));
        if (!last) pushP2P(ops, PipeOpKind::SendForwardRecvBackward, act(W + i), none, none, act(i));
        ops.push_back(compute(PipeOpKind::Backward, i, 0, i, i == m - 1));
        if (lastIteration) {
            if (!first) pushP2P(ops, PipeOpKind::SendBackward, none, none, act(i), none);
        } else if (!first) {
            pushP2P(ops, PipeOpKind::SendBackwardRecvForward, none, act(W + i + 1), act(i), none);
        }
    }
    for (int i = 0; i < W; ++i) {
        if (!last) pushP2P(ops, PipeOpKind::RecvBackward, none, none, none, act(R + i));
        ops.push_back(compute(PipeOpKind::Backward, R + i, 0, R + i, R + i == m - 1));
        if (!first) pushP2P(ops, PipeOpKind::SendBackward, none, none, act(R + i), none);
    }
}

void interleaved(PipelineSchedule& s) {
    const ScheduleParams& P = s.params;
    const int p = P.pp, r = P.rank, m = P.microbatches, v = P.vpp;
    const int g = P.microbatchGroupSize > 0 ? P.microbatchGroupSize : p;
    const bool firstPP = r == 0, lastPP = r == p - 1;
    const std::vector<TensorRef> table = scheduleTable(m, v, g);
    const int total = m * v;
    int W = (p - r - 1) * 2 + (v - 1) * g;
    bool allWarmup = false;
    if (W >= total) {
        W = total;
        allWarmup = true;
    }
    const int R = total - W;
    s.warmup = W;
    s.remaining = R;
    s.total = total;
    s.allWarmup = allWarmup;

    auto chunkOf = [&](int k, bool forward) {
        const int c = table[size_t(k % total)].chunk;
        return forward ? c : v - 1 - c;
    };
    // Received tensors of one chunk arrive in ascending microbatch order (each chunk runs its
    // microbatches in table order), so the j-th receive for chunk c carries microbatch j.
    std::vector<int> fwdRecvs(size_t(v), 0), bwdRecvs(size_t(v), 0);
    auto recvAct = [&](int chunk) { return TensorRef{fwdRecvs[size_t(chunk)]++, chunk}; };
    auto recvGrad = [&](int chunk) { return TensorRef{bwdRecvs[size_t(chunk)]++, chunk}; };
    // Megatron's recv_tensor_from_previous_stage: does a peer send to us after step k, and to
    // which chunk does it belong? The leading stage (rank 0 forward, last rank backward) is
    // p-1 steps ahead of the stage that feeds it around the ring.
    auto recvFromPrevious = [&](int k, bool forward, int& nextChunk) {
        bool recv = true;
        const bool leading = forward ? firstPP : lastPP;
        const int lastChunk = forward ? v - 1 : 0;
        if (leading) {
            if (k < p - 1) {
                recv = false;
                nextChunk = chunkOf(k + 1, forward);
            } else {
                nextChunk = chunkOf(k - (p - 1), forward);
            }
            if (nextChunk == lastChunk) recv = false;
            nextChunk += forward ? 1 : -1;
        } else {
            nextChunk = chunkOf(k + 1, forward);
        }
        return recv;
    };
    auto isFirstVirtual = [&](int chunk) { return firstPP && chunk == 0; };
    auto isLastVirtual = [&](int chunk) { return lastPP && chunk == v - 1; };
    auto gradSyncAt = [&](int k) { return table[size_t(k)].microbatch == m - 1; };
    const TensorRef none;
    auto& ops = s.ops;

    if (!firstPP) pushP2P(ops, PipeOpKind::RecvForward, none, recvAct(0), none, none);

    for (int k = 0; k < W; ++k) {
        const int c = chunkOf(k, true);
        ops.push_back(compute(PipeOpKind::Forward, table[size_t(k)].microbatch, c, k, false));
        int nextChunk = 0;
        bool recvPrev = recvFromPrevious(k, true, nextChunk);
        if (k == total - 1) recvPrev = false;
        const TensorRef sendF = isLastVirtual(c) ? none : TensorRef{table[size_t(k)].microbatch, c};
        const bool lastWarmup = k == W - 1 && !allWarmup;
        if (!P.overlapP2PComm && lastWarmup) {
            const bool recvNext = !lastPP;
            const TensorRef rf = recvPrev ? recvAct(nextChunk) : none;
            const TensorRef rb = recvNext ? recvGrad(v - 1) : none;
            pushP2P(ops, PipeOpKind::SendForwardBackwardRecvForwardBackward, sendF, rf, none, rb);
        } else {
            pushP2P(ops, PipeOpKind::SendForwardRecvForward, sendF, recvPrev ? recvAct(nextChunk) : none, none, none);
            if (P.overlapP2PComm && lastWarmup)
                pushP2P(ops, PipeOpKind::SendBackwardRecvBackward, none, none, none, !lastPP ? recvGrad(v - 1) : none);
        }
    }

    for (int k = 0; k < R; ++k) {
        const int fk = k + W, bk = k;
        const int fc = chunkOf(fk, true), bc = chunkOf(bk, false);
        const TensorRef sendF = isLastVirtual(fc) ? none : TensorRef{table[size_t(fk)].microbatch, fc};
        const TensorRef sendB = isFirstVirtual(bc) ? none : TensorRef{table[size_t(bk)].microbatch, bc};
        ops.push_back(compute(PipeOpKind::Forward, table[size_t(fk)].microbatch, fc, fk, false));
        int nextF = 0, nextB = 0;
        if (P.overlapP2PComm) {
            bool recvPrev = recvFromPrevious(fk, true, nextF);
            if (k == R - 1) recvPrev = false;
            pushP2P(ops, PipeOpKind::SendForwardRecvForward, sendF, recvPrev ? recvAct(nextF) : none, none, none);
            ops.push_back(compute(PipeOpKind::Backward, table[size_t(bk)].microbatch, bc, bk, gradSyncAt(bk)));
            const bool recvNext = recvFromPrevious(bk, false, nextB);
            pushP2P(ops, PipeOpKind::SendBackwardRecvBackward, none, none, sendB, recvNext ? recvGrad(nextB) : none);
        } else {
            ops.push_back(compute(PipeOpKind::Backward, table[size_t(bk)].microbatch, bc, bk, gradSyncAt(bk)));
            bool recvPrev = recvFromPrevious(fk, true, nextF);
            const bool recvNext = recvFromPrevious(bk, false, nextB);
            if (k == R - 1) recvPrev = false;
            // Order of the receives' bookkeeping matches Megatron: forward first, then backward.
            const TensorRef rf = recvPrev ? recvAct(nextF) : none;
            const TensorRef rb = recvNext ? recvGrad(nextB) : none;
            pushP2P(ops, PipeOpKind::SendForwardBackwardRecvForwardBackward, sendF, rf, sendB, rb);
        }
    }

    if (allWarmup && !lastPP) pushP2P(ops, PipeOpKind::RecvBackward, none, none, none, recvGrad(v - 1));
    for (int k = R; k < total; ++k) {
        const int bc = chunkOf(k, false);
        ops.push_back(compute(PipeOpKind::Backward, table[size_t(k)].microbatch, bc, k, gradSyncAt(k)));
        int nextB = 0;
        bool recvNext = recvFromPrevious(k, false, nextB);
        if (k == total - 1) recvNext = false;
        const TensorRef sendB = isFirstVirtual(bc) ? none : TensorRef{table[size_t(k)].microbatch, bc};
        pushP2P(ops, PipeOpKind::SendBackwardRecvBackward, none, none, sendB, recvNext ? recvGrad(nextB) : none);
    }
}

}  // namespace

Result<PipelineSchedule> buildSchedule(const ScheduleParams& p) {
    TS_RETURN_IF_ERROR(validateSchedule(p));
    PipelineSchedule s;
    s.params = p;
    if (p.pp == 1) {
        s.name = "no_pipelining";
        noPipelining(s);
    } else if (p.vpp == 1) {
        s.name = "1f1b";
        oneFOneB(s);
    } else {
        s.name = "interleaved_1f1b";
        interleaved(s);
    }
    return s;
}

Result<int> layerOffset(int numLayers, int pp, int vpp, int rank, int chunk) {
    if (pp < 1 || vpp < 1 || rank < 0 || rank >= pp || chunk < 0 || chunk >= vpp)
        return Status::invalid("layerOffset: rank " + std::to_string(rank) + " chunk " + std::to_string(chunk) +
                               " outside pp=" + std::to_string(pp) + " vpp=" + std::to_string(vpp));
    if (numLayers % (pp * vpp) != 0)
        return Status::invalid("num_layers=" + std::to_string(numLayers) +
                               " must be divisible by pipeline_model_parallel_size (" + std::to_string(pp) +
                               ") x virtual_pipeline_model_parallel_size (" + std::to_string(vpp) + ") = " +
                               std::to_string(pp * vpp));
    return chunk * (numLayers / vpp) + rank * (numLayers / (pp * vpp));
}

}  // namespace ts::engine
