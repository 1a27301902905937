// GptModel's context-parallel core attention (REFERENCE.md §4): every CP rank holds the
// query/key/value rows of its two sequence chunks (§4.1). cp_comm_type picks how the rest of
// the sequence reaches it; every variant is in the trace as group "cp":
//   all_gather (§4.5): K and V are all-gathered over "cp" and laid out in global sequence order;
//     each rank computes causal attention of its queries (with their global positions) against
//     the whole sequence; in the backward the full-length dK/dV of every rank are put back in
//     rank order and reduce-scattered (summed) to their owners. On the compute stream
//     (all-gather exposed, as TE's all-gather variant does without overlap).
//   p2p (§4.3, ring attention): engine/model/cp_ring.h, the blocks travel on the CP comm stream
//     while the block held is computed.
//   a2a (§4.4, Ulysses): all-to-all from "my rows, all heads" to "all rows, heads/c heads",
//     ordinary causal attention over the whole sequence, all-to-all back. Compute stream.
// Attention dropout (attention_dropout > 0) draws, in every variant, the mask element the cp=1
// run draws for the same (sample, global head, global query position, global key position)
// (kernels/cpu/ops.h AttnDims / CpAttnDims), so a CP run with dropout equals the cp=1 run.
// Transformer Engine passes dropout_p to every per-step attention kernel of all three variants
// and keeps the steps' RNG states for the backward (context_parallel.py), which is the same math
// with other random bits.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

namespace ts::engine {

namespace {

// The dropout part of the cp=1 core-attention dims on CP-variant dims.
template <class Dims>
void setDropout(Dims& ad, const k::AttnDims& drop) {
    ad.dropout = drop.dropout;
    ad.dropoutSeed = drop.dropoutSeed;
    ad.headOffset = drop.headOffset;
    ad.nqTotal = drop.nqTotal;
}

// CP rank r holds chunks r and 2c-1-r of the sequence (engine/model/model.h cpLocalPositions).
// Rank-major layout: rank r's two chunks at [2r, 2r+1] x chunkElems; global: chunk j at
// j x chunkElems. toGlobal copies rank-major -> global, else global -> rank-major.
void cpReorderChunks(float* dst, const float* src, int c, int64_t chunkElems, bool toGlobal) {
    for (int r = 0; r < c; ++r)
        for (int half = 0; half < 2; ++half) {
            const int64_t global = int64_t(half == 0 ? r : 2 * c - 1 - r) * chunkElems;
            const int64_t rankMajor = (int64_t(2) * r + half) * chunkElems;
            std::memcpy(dst + (toGlobal ? global : rankMajor), src + (toGlobal ? rankMajor : global),
                        size_t(chunkElems) * sizeof(float));
        }
}

}  // namespace

Result<TensorPtr> GptModel::cpGatherKv(const TensorPtr& local, int heads) {
    const int b = m_d.microBatch, d = m_d.headDim, cp = m_ctx.cpSize, S = m_seqGlobal;
    const int sl = m_d.seq;
    const int64_t n = int64_t(sl) * b * heads * d;
    TS_ASSIGN_OR_RETURN(TensorPtr gathered, allocUninitialized(m_exec, n * cp));
    m_ctx.cp->allGather(m_exec.stream(), local->data(), gathered->data(), size_t(n), DType::F32);
    holdUntilDone(local, gathered);
    TS_ASSIGN_OR_RETURN(TensorPtr global, allocUninitialized(m_exec, n * cp));
    const int64_t row = int64_t(b) * heads * d;  // one sequence position, every sample and head
    const int64_t chunkElems = int64_t(S / (2 * cp)) * row;
    m_exec.op("cp_kv_reorder", Category::Memcpy, 0, uint64_t(n) * cp * 8,
              [=] { cpReorderChunks(fp(global), fp(gathered), cp, chunkElems, true); });
    return global;
}

Result<TensorPtr> GptModel::cpScatterKvGrad(const TensorPtr& global, int heads) {
    const int b = m_d.microBatch, d = m_d.headDim, cp = m_ctx.cpSize, S = m_seqGlobal;
    const int sl = m_d.seq;
    const int64_t n = int64_t(sl) * b * heads * d;
    const int64_t row = int64_t(b) * heads * d;
    TS_ASSIGN_OR_RETURN(TensorPtr rankMajor, allocUninitialized(m_exec, n * cp));
    const int64_t chunkElems = int64_t(S / (2 * cp)) * row;
    m_exec.op("cp_kv_grad_reorder", Category::Memcpy, 0, uint64_t(n) * cp * 8,
              [=] { cpReorderChunks(fp(rankMajor), fp(global), cp, chunkElems, false); });
    TS_ASSIGN_OR_RETURN(TensorPtr local, allocUninitialized(m_exec, n));
    m_ctx.cp->reduceScatter(m_exec.stream(), rankMajor->data(), local->data(), size_t(n), DType::F32, ReduceOp::Sum);
    holdUntilDone(rankMajor, local);
    return local;
}

void GptModel::setCpRing(Stream& commStream, Communicator& comm) {
    if (m_ctx.cpSize <= 1 || m_cfg.cp_comm_type != "p2p") return;
    const int c = m_ctx.cpSize;
    std::vector<std::vector<int>> pos;
    for (int r = 0; r < c; ++r) pos.push_back(cpLocalPositions(m_seqGlobal, c, r));
    m_cpRing = std::make_unique<CpRing>(m_exec, commStream, comm, std::move(pos));
}

Result<TensorPtr> GptModel::cpToHeads(const TensorPtr& local, int heads) {
    const int b = m_d.microBatch, d = m_d.headDim, c = m_ctx.cpSize, sl = m_d.seq, hc = heads / c;
    const int chunk = m_seqGlobal / (2 * c);
    const int64_t n = int64_t(sl) * b * heads * d;  // elements held before and after
    const int64_t part = n / c;                      // sent to / received from one peer
    TS_ASSIGN_OR_RETURN(TensorPtr send, allocUninitialized(m_exec, n, MemCategory::CommBuffers));
    m_exec.op("cp_a2a_pack", Category::Memcpy, 0, uint64_t(n) * 8, [=] {
        // peer j gets heads [j*hc, (j+1)*hc) of every local row: [c][sl][b][hc][d]
        for (int j = 0; j < c; ++j)
            for (int64_t rb = 0; rb < int64_t(sl) * b; ++rb)
                std::memcpy(fp(send) + j * part + rb * hc * d, fp(local) + (rb * heads + int64_t(j) * hc) * d,
                            size_t(hc) * d * sizeof(float));
    });
    TS_ASSIGN_OR_RETURN(TensorPtr recv, allocUninitialized(m_exec, n, MemCategory::CommBuffers));
    const std::vector<size_t> counts(static_cast<size_t>(c), size_t(part));
    m_ctx.cp->allToAllv(m_exec.stream(), send->data(), counts, recv->data(), counts, DType::F32);
    holdUntilDone(send, recv);
    TS_ASSIGN_OR_RETURN(TensorPtr full, allocUninitialized(m_exec, n));
    const int64_t chunkElems = int64_t(chunk) * b * hc * d;  // one chunk of the head group
    // from rank i: its rows (chunks i and 2c-1-i) -> global order
    m_exec.op("cp_a2a_reorder", Category::Memcpy, 0, uint64_t(n) * 8,
              [=] { cpReorderChunks(fp(full), fp(recv), c, chunkElems, true); });
    return full;
}

Status GptModel::cpToSequence(const TensorPtr& full, int heads, const TensorPtr& out) {
    const int b = m_d.microBatch, d = m_d.headDim, c = m_ctx.cpSize, sl = m_d.seq, hc = heads / c;
    const int chunk = m_seqGlobal / (2 * c);
    const int64_t n = int64_t(sl) * b * heads * d, part = n / c, chunkElems = int64_t(chunk) * b * hc * d;
    TS_ASSIGN_OR_RETURN(TensorPtr send, allocUninitialized(m_exec, n, MemCategory::CommBuffers));
    m_exec.op("cp_a2a_reorder", Category::Memcpy, 0, uint64_t(n) * 8,
              [=] { cpReorderChunks(fp(send), fp(full), c, chunkElems, false); });
    TS_ASSIGN_OR_RETURN(TensorPtr recv, allocUninitialized(m_exec, n, MemCategory::CommBuffers));
    const std::vector<size_t> counts(static_cast<size_t>(c), size_t(part));
    m_ctx.cp->allToAllv(m_exec.stream(), send->data(), counts, recv->data(), counts, DType::F32);
    holdUntilDone(send, recv);
    m_exec.op("cp_a2a_unpack", Category::Memcpy, 0, uint64_t(n) * 8, [=] {
        // from peer j: heads [j*hc, (j+1)*hc) of this rank's rows
        for (int j = 0; j < c; ++j)
            for (int64_t rb = 0; rb < int64_t(sl) * b; ++rb)
                std::memcpy(fp(out) + (rb * heads + int64_t(j) * hc) * d, fp(recv) + j * part + rb * hc * d,
                            size_t(hc) * d * sizeof(float));
    });
    return Status::ok();
}

Status GptModel::cpCoreAttentionForward(LayerActs& A, int nq, int ng, const k::AttnDims& drop) {
    const int b = m_d.microBatch, d = m_d.headDim, sl = m_d.seq, S = m_seqGlobal;
    const int64_t T = int64_t(sl) * b;
    const bool bf = m_o.bf16;
    const float scale = 1.0f / std::sqrt(float(d));
    if (m_cfg.cp_comm_type == "p2p") {
        if (!m_cpRing) return Status::internal("cp_comm_type=p2p needs the CP comm stream (setCpRing)");
        TS_ASSIGN_OR_RETURN(A.ctx, allocUninitialized(m_exec, T * nq * d));
        TS_ASSIGN_OR_RETURN(A.lse, allocUninitialized(m_exec, int64_t(b) * nq * sl));
        CpRing::Dims rd{sl, b, nq, ng, d, scale};
        setDropout(rd, drop);
        rd.sTotal = S;
        TS_RETURN_IF_ERROR(m_cpRing->forward(rd, A.q, A.k, A.v, A.ctx, A.lse));
        // out and lse are all the backward needs: selective recompute has nothing left to redo.
        if (bf) roundBf16(A.ctx, T * nq * d);
        return Status::ok();
    }
    if (m_cfg.cp_comm_type == "a2a") {
        const int c = m_ctx.cpSize;
        // The head-sharded whole-sequence q/k/v replace the local ones for the backward.
        TS_ASSIGN_OR_RETURN(A.q, cpToHeads(A.q, nq));
        TS_ASSIGN_OR_RETURN(A.k, cpToHeads(A.k, ng));
        TS_ASSIGN_OR_RETURN(A.v, cpToHeads(A.v, ng));
        // Whole sequence of heads [cpRank*nq/c, (cpRank+1)*nq/c) of this TP rank's nq.
        k::AttnDims ad{S, b, nq / c, ng / c, d, scale};
        setDropout(ad, drop);
        ad.headOffset = drop.headOffset + m_ctx.cpRank * (nq / c);
        TS_ASSIGN_OR_RETURN(TensorPtr probs, allocUninitialized(m_exec, int64_t(k::attentionProbsSize(ad))));
        TS_ASSIGN_OR_RETURN(TensorPtr out, allocUninitialized(m_exec, T * nq * d));
        TensorPtr q = A.q, kk = A.k, v = A.v;
        const bool fs = m_o.fusedSoftmax;
        m_exec.op("core_attention.fwd", Category::Attention, 4.0 * b * (nq / c) * double(S) * S * d,
                  uint64_t(4) * (uint64_t(T) * (2 * nq + 2 * ng) * d + k::attentionProbsSize(ad)), [=] {
                      k::attentionForward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(out), fs);
                      if (bf) k::roundToBf16(fp(out), T * nq * d);
                  });
        TS_ASSIGN_OR_RETURN(A.ctx, allocUninitialized(m_exec, T * nq * d));
        TS_RETURN_IF_ERROR(cpToSequence(out, nq, A.ctx));
        if (m_o.recomputeGranularity != "selective") A.probs = probs;
        return Status::ok();
    }
    TS_ASSIGN_OR_RETURN(TensorPtr kg, cpGatherKv(A.k, ng));
    TS_ASSIGN_OR_RETURN(TensorPtr vg, cpGatherKv(A.v, ng));
    k::CpAttnDims ad{sl, S, b, nq, ng, d, scale};
    setDropout(ad, drop);
    TS_ASSIGN_OR_RETURN(TensorPtr probs, allocUninitialized(m_exec, int64_t(b) * nq * sl * S));
    TS_ASSIGN_OR_RETURN(A.ctx, allocUninitialized(m_exec, T * nq * d));
    TensorPtr q = A.q, ctx = A.ctx;
    auto pos = std::make_shared<std::vector<int>>(m_cpPos);
    // About half of the s_local x s key pairs are visible (causal).
    m_exec.op("core_attention.fwd", Category::Attention, 2.0 * b * nq * double(sl) * S * d,
              uint64_t(4) * (uint64_t(T) * nq * d * 2 + uint64_t(S) * b * ng * d * 2 + uint64_t(b) * nq * sl * S), [=] {
                  k::cpAttentionForward(ad, pos->data(), fp(q), fp(kg), fp(vg), fp(probs), fp(ctx));
                  if (bf) k::roundToBf16(fp(ctx), T * nq * d);
              });
    if (m_o.recomputeGranularity != "selective") A.probs = probs;
    return Status::ok();
}

Status GptModel::cpCoreAttentionBackward(LayerActs& A, int nq, int ng, const k::AttnDims& drop, TensorPtr dctx,
                                         TensorPtr dq, TensorPtr dk, TensorPtr dv) {
    const int b = m_d.microBatch, d = m_d.headDim, sl = m_d.seq, S = m_seqGlobal;
    const int64_t T = int64_t(sl) * b;
    const float scale = 1.0f / std::sqrt(float(d));
    if (m_cfg.cp_comm_type == "p2p") {
        CpRing::Dims rd{sl, b, nq, ng, d, scale};
        setDropout(rd, drop);
        rd.sTotal = S;
        return m_cpRing->backward(rd, A.q, A.k, A.v, A.ctx, A.lse, dctx, dq, dk, dv);
    }
    if (m_cfg.cp_comm_type == "a2a") {
        const int c = m_ctx.cpSize;
        // Whole sequence of heads [cpRank*nq/c, (cpRank+1)*nq/c) of this TP rank's nq.
        k::AttnDims ad{S, b, nq / c, ng / c, d, scale};
        setDropout(ad, drop);
        ad.headOffset = drop.headOffset + m_ctx.cpRank * (nq / c);
        TensorPtr q = A.q, kk = A.k, v = A.v, probs = A.probs;
        const bool fs = m_o.fusedSoftmax;
        if (!probs) {
            TS_ASSIGN_OR_RETURN(probs, allocUninitialized(m_exec, int64_t(k::attentionProbsSize(ad))));
            TS_ASSIGN_OR_RETURN(TensorPtr ctxTmp, allocUninitialized(m_exec, T * nq * d));
            m_exec.op("core_attention.recompute", Category::Attention, 4.0 * b * (nq / c) * double(S) * S * d,
                      uint64_t(4) * k::attentionProbsSize(ad),
                      [=] { k::attentionForward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(ctxTmp), fs); });
        }
        TS_ASSIGN_OR_RETURN(TensorPtr dout, cpToHeads(dctx, nq));
        TS_ASSIGN_OR_RETURN(TensorPtr dqh, allocUninitialized(m_exec, T * nq * d));
        TS_ASSIGN_OR_RETURN(TensorPtr dkh, allocUninitialized(m_exec, T * ng * d));
        TS_ASSIGN_OR_RETURN(TensorPtr dvh, allocUninitialized(m_exec, T * ng * d));
        TS_ASSIGN_OR_RETURN(TensorPtr scratch, allocUninitialized(m_exec, int64_t(k::attentionScratchSize(ad)),
                                                                  MemCategory::Workspace));
        m_exec.op("core_attention.bwd", Category::Attention, 8.0 * b * (nq / c) * double(S) * S * d,
                  uint64_t(8) * k::attentionProbsSize(ad), [=] {
                      k::attentionBackward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(dout), fp(dqh), fp(dkh), fp(dvh),
                                           fp(scratch), fs);
                  });
        TS_RETURN_IF_ERROR(cpToSequence(dqh, nq, dq));
        TS_RETURN_IF_ERROR(cpToSequence(dkh, ng, dk));
        return cpToSequence(dvh, ng, dv);
    }
    // K and V of the whole sequence again (TE's all-gather variant re-gathers too).
    TS_ASSIGN_OR_RETURN(TensorPtr kg, cpGatherKv(A.k, ng));
    TS_ASSIGN_OR_RETURN(TensorPtr vg, cpGatherKv(A.v, ng));
    k::CpAttnDims ad{sl, S, b, nq, ng, d, scale};
    setDropout(ad, drop);
    TensorPtr q = A.q, probs = A.probs;
    auto pos = std::make_shared<std::vector<int>>(m_cpPos);
    if (!probs) {
        TS_ASSIGN_OR_RETURN(probs, allocUninitialized(m_exec, int64_t(b) * nq * sl * S));
        TS_ASSIGN_OR_RETURN(TensorPtr ctxTmp, allocUninitialized(m_exec, T * nq * d));
        m_exec.op("core_attention.recompute", Category::Attention, 2.0 * b * nq * double(sl) * S * d,
                  uint64_t(4) * uint64_t(b) * nq * sl * S,
                  [=] { k::cpAttentionForward(ad, pos->data(), fp(q), fp(kg), fp(vg), fp(probs), fp(ctxTmp)); });
    }
    TS_ASSIGN_OR_RETURN(TensorPtr dkg, allocUninitialized(m_exec, int64_t(S) * b * ng * d));
    TS_ASSIGN_OR_RETURN(TensorPtr dvg, allocUninitialized(m_exec, int64_t(S) * b * ng * d));
    m_exec.op("core_attention.bwd", Category::Attention, 4.0 * b * nq * double(sl) * S * d,
              uint64_t(8) * uint64_t(b) * nq * sl * S, [=] {
                  k::cpAttentionBackward(ad, pos->data(), fp(q), fp(kg), fp(vg), fp(probs), fp(dctx), fp(dq), fp(dkg),
                                         fp(dvg));
              });
    TS_ASSIGN_OR_RETURN(TensorPtr dkl, cpScatterKvGrad(dkg, ng));
    TS_ASSIGN_OR_RETURN(TensorPtr dvl, cpScatterKvGrad(dvg, ng));
    const int64_t n = T * ng * d;
    m_exec.op("cp_kv_grad_copy", Category::Memcpy, 0, uint64_t(n) * 16, [=] {
        std::memcpy(fp(dk), fp(dkl), size_t(n) * sizeof(float));
        std::memcpy(fp(dv), fp(dvl), size_t(n) * sizeof(float));
    });
    return Status::ok();
}

}  // namespace ts::engine
