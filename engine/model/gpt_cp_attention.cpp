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
//   a2a+p2p (hierarchical, TE's AttnFuncWithCPAndKVP2P with cp_group=[a2a, p2p]; sizes [a, p] =
//     hierarchical_context_parallel_sizes): the all-to-all of a2a over "hcp-a2a" (a consecutive
//     CP ranks) turns the rows of the a ranks into heads/a heads of their 2a chunks, put in
//     TE's order (first chunks of ranks 0..a-1, then the second chunks of ranks a-1..0: global
//     chunks [pa, pa+a) and [2c-pa-a, 2c-pa) of p2p rank p, load balanced like §4.1 with chunks
//     a times larger); then the p2p ring over "hcp-p2p" on those rows and heads; all-to-all
//     back. The backward: dout all-to-all, ring backward, dQ/dK/dV all-to-all back. A level of
//     size 1 is TE's fallback: [1, c] runs p2p over hcp-p2p, [c, 1] a2a over hcp-a2a.
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
            k::copyBytes(dst + (toGlobal ? global : rankMajor), src + (toGlobal ? rankMajor : global),
                         size_t(chunkElems) * sizeof(float));
        }
}

// a2a+p2p: global positions of the rows p2p rank p holds after the all-to-all over its hcp-a2a
// group of size a (see the file comment); a == 1 gives cpLocalPositions(S, c, p).
std::vector<int> hcpRingPositions(int S, int c, int a, int p) {
    const int chunk = S / (2 * c);
    std::vector<int> pos;
    pos.reserve(size_t(2) * a * chunk);
    for (int first : {p * a, 2 * c - p * a - a})
        for (int i = first * chunk; i < (first + a) * chunk; ++i) pos.push_back(i);
    return pos;
}

}  // namespace

GptModel::CpMode GptModel::cpMode() const {
    const std::string& t = m_cfg.cp_comm_type;
    // p2p: the ring on all heads (rank 0 of a one-rank a2a level); a2a: heads of this CP rank.
    if (t != "a2a+p2p") return {t == "p2p", t == "a2a", 1, m_ctx.cp, t == "a2a" ? m_ctx.cpRank : 0};
    const int a = m_ctx.hcpA2aSize, p = m_ctx.cpSize / a;
    // [c, 1]: Ulysses over hcp-a2a (its ranks are the CP group's, in the same order).
    if (p == 1) return {false, true, 1, m_ctx.hcpA2a, m_ctx.hcpA2aRank};
    return {true, false, a, m_ctx.hcpA2a, m_ctx.hcpA2aRank};
}

Result<KernelIds> GptModel::cpPositions() {
    // Uploaded once per model where kernels see device memory; the host vector on the CPU.
    if (!m_cpPosK.keep) {
        auto host = std::make_shared<const std::vector<int>>(m_cpPos);
        TS_ASSIGN_OR_RETURN(m_cpPosK, kernelInts(m_exec, host->data(), host->size(), host, MemCategory::Workspace));
    }
    return m_cpPosK;
}

Result<KernelIds> GptModel::seqPositions() {
    if (!m_seqPosK.keep) {
        auto host = std::make_shared<std::vector<int>>(size_t(m_seqGlobal));
        for (int i = 0; i < m_seqGlobal; ++i) (*host)[size_t(i)] = i;
        std::shared_ptr<const std::vector<int>> keep = host;
        TS_ASSIGN_OR_RETURN(m_seqPosK, kernelInts(m_exec, keep->data(), keep->size(), keep, MemCategory::Workspace));
    }
    return m_seqPosK;
}

Result<TensorPtr> GptModel::cpGatherKv(const TensorPtr& local, int heads) {
    const int b = m_d.microBatch, d = m_d.headDim, cp = m_ctx.cpSize, S = m_seqGlobal;
    const int sl = m_d.seq;
    const int64_t n = int64_t(sl) * b * heads * d;
    TS_ASSIGN_OR_RETURN(TensorPtr gathered, allocUninitialized(m_exec, n * cp));
    m_ctx.cp->allGather(m_exec.stream(), local->data(), gathered->data(), size_t(n), DType::F32);
    keepUntilPassed(m_exec.stream(), {local, gathered});
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
    keepUntilPassed(m_exec.stream(), {rankMajor, local});
    return local;
}

void GptModel::setCpRing(Stream& commStream, Communicator& comm) {
    if (m_ctx.cpSize <= 1 || !cpMode().ring) return;
    const int c = m_ctx.cpSize, a = cpMode().a2a;
    std::vector<std::vector<int>> pos;
    for (int r = 0; r < c / a; ++r) pos.push_back(hcpRingPositions(m_seqGlobal, c, a, r));
    m_cpRing = std::make_unique<CpRing>(m_exec, commStream, comm, std::move(pos));
}

Result<TensorPtr> GptModel::cpToHeads(const TensorPtr& local, int heads, Communicator& comm) {
    // c: the all-to-all group ("cp", or hcp-a2a); chunk: one of the 2*cp chunks of the sequence
    const int b = m_d.microBatch, d = m_d.headDim, c = comm.size(), sl = m_d.seq, hc = heads / c;
    const int chunk = m_seqGlobal / (2 * m_ctx.cpSize);
    const int64_t n = int64_t(sl) * b * heads * d;  // elements held before and after
    const int64_t part = n / c;                      // sent to / received from one peer
    TS_ASSIGN_OR_RETURN(TensorPtr send, allocUninitialized(m_exec, n, MemCategory::CommBuffers));
    m_exec.op("cp_a2a_pack", Category::Memcpy, 0, uint64_t(n) * 8, [=] {
        // peer j gets heads [j*hc, (j+1)*hc) of every local row: [c][sl][b][hc][d]
        const size_t w = size_t(hc) * d * sizeof(float);
        for (int j = 0; j < c; ++j)
            k::copy2D(fp(send) + j * part, w, fp(local) + int64_t(j) * hc * d, size_t(heads) * d * sizeof(float), w,
                      size_t(sl) * b);
    });
    TS_ASSIGN_OR_RETURN(TensorPtr recv, allocUninitialized(m_exec, n, MemCategory::CommBuffers));
    const std::vector<size_t> counts(static_cast<size_t>(c), size_t(part));
    comm.allToAllv(m_exec.stream(), send->data(), counts, recv->data(), counts, DType::F32);
    keepUntilPassed(m_exec.stream(), {send, recv});
    TS_ASSIGN_OR_RETURN(TensorPtr full, allocUninitialized(m_exec, n));
    const int64_t chunkElems = int64_t(chunk) * b * hc * d;  // one chunk of the head group
    // from group rank i its two chunks -> slots i and 2c-1-i (with c = cp: global order; in
    // hcp-a2a TE's order: first chunks by rank, then second chunks by descending rank)
    m_exec.op("cp_a2a_reorder", Category::Memcpy, 0, uint64_t(n) * 8,
              [=] { cpReorderChunks(fp(full), fp(recv), c, chunkElems, true); });
    return full;
}

Status GptModel::cpToSequence(const TensorPtr& full, int heads, const TensorPtr& out, Communicator& comm) {
    const int b = m_d.microBatch, d = m_d.headDim, c = comm.size(), sl = m_d.seq, hc = heads / c;
    const int chunk = m_seqGlobal / (2 * m_ctx.cpSize);
    const int64_t n = int64_t(sl) * b * heads * d, part = n / c, chunkElems = int64_t(chunk) * b * hc * d;
    TS_ASSIGN_OR_RETURN(TensorPtr send, allocUninitialized(m_exec, n, MemCategory::CommBuffers));
    m_exec.op("cp_a2a_reorder", Category::Memcpy, 0, uint64_t(n) * 8,
              [=] { cpReorderChunks(fp(send), fp(full), c, chunkElems, false); });
    TS_ASSIGN_OR_RETURN(TensorPtr recv, allocUninitialized(m_exec, n, MemCategory::CommBuffers));
    const std::vector<size_t> counts(static_cast<size_t>(c), size_t(part));
    comm.allToAllv(m_exec.stream(), send->data(), counts, recv->data(), counts, DType::F32);
    keepUntilPassed(m_exec.stream(), {send, recv});
    m_exec.op("cp_a2a_unpack", Category::Memcpy, 0, uint64_t(n) * 8, [=] {
        // from peer j: heads [j*hc, (j+1)*hc) of this rank's rows
        const size_t w = size_t(hc) * d * sizeof(float);
        for (int j = 0; j < c; ++j)
            k::copy2D(fp(out) + int64_t(j) * hc * d, size_t(heads) * d * sizeof(float), fp(recv) + j * part, w, w,
                      size_t(sl) * b);
    });
    return Status::ok();
}

Status GptModel::cpCoreAttentionForward(LayerActs& A, int nq, int ng, const k::AttnDims& drop) {
    const int b = m_d.microBatch, d = m_d.headDim, sl = m_d.seq, S = m_seqGlobal;
    const int64_t T = int64_t(sl) * b;
    const bool bf = m_o.bf16;
    const float scale = 1.0f / std::sqrt(float(d));
    const CpMode mode = cpMode();
    if (mode.ring) {
        if (!m_cpRing) return Status::internal("cp_comm_type=" + m_cfg.cp_comm_type + " needs the CP comm stream (setCpRing)");
        const int a = mode.a2a;
        if (a > 1) {
            // a2a+p2p: heads [rank*nq/a, (rank+1)*nq/a) of the a2a group's rows; they replace the
            // local q/k/v for the backward.
            TS_ASSIGN_OR_RETURN(A.q, cpToHeads(A.q, nq, *mode.comm));
            TS_ASSIGN_OR_RETURN(A.k, cpToHeads(A.k, ng, *mode.comm));
            TS_ASSIGN_OR_RETURN(A.v, cpToHeads(A.v, ng, *mode.comm));
        }
        TS_ASSIGN_OR_RETURN(TensorPtr out, allocUninitialized(m_exec, T * nq * d));
        TS_ASSIGN_OR_RETURN(A.lse, allocUninitialized(m_exec, int64_t(b) * nq * sl));
        CpRing::Dims rd{sl * a, b, nq / a, ng / a, d, scale};
        setDropout(rd, drop);
        rd.headOffset = drop.headOffset + mode.rank * (nq / a);
        rd.sTotal = S;
        TS_RETURN_IF_ERROR(m_cpRing->forward(rd, A.q, A.k, A.v, out, A.lse));
        // out and lse are all the backward needs: selective recompute has nothing left to redo.
        if (bf) roundBf16(out, T * nq * d);
        if (a == 1) {
            A.ctx = out;
            return Status::ok();
        }
        A.ctxHeads = out;
        TS_ASSIGN_OR_RETURN(A.ctx, allocUninitialized(m_exec, T * nq * d));
        return cpToSequence(out, nq, A.ctx, *mode.comm);
    }
    if (mode.ulysses) {
        const int c = m_ctx.cpSize;
        Communicator& comm = *mode.comm;
        // The head-sharded whole-sequence q/k/v replace the local ones for the backward.
        TS_ASSIGN_OR_RETURN(A.q, cpToHeads(A.q, nq, comm));
        TS_ASSIGN_OR_RETURN(A.k, cpToHeads(A.k, ng, comm));
        TS_ASSIGN_OR_RETURN(A.v, cpToHeads(A.v, ng, comm));
        // Whole sequence of heads [cpRank*nq/c, (cpRank+1)*nq/c) of this TP rank's nq.
        k::AttnDims ad{S, b, nq / c, ng / c, d, scale};
        setDropout(ad, drop);
        ad.headOffset = drop.headOffset + mode.rank * (nq / c);
        TS_ASSIGN_OR_RETURN(TensorPtr out, allocUninitialized(m_exec, T * nq * d));
        TS_RETURN_IF_ERROR(coreAttentionForward(A, ad, A.q, A.k, A.v, out));
        TS_ASSIGN_OR_RETURN(A.ctx, allocUninitialized(m_exec, T * nq * d));
        return cpToSequence(out, nq, A.ctx, comm);
    }
    TS_ASSIGN_OR_RETURN(TensorPtr kg, cpGatherKv(A.k, ng));
    TS_ASSIGN_OR_RETURN(TensorPtr vg, cpGatherKv(A.v, ng));
    k::CpAttnDims ad{sl, S, b, nq, ng, d, scale};
    setDropout(ad, drop);
    TS_ASSIGN_OR_RETURN(A.ctx, allocUninitialized(m_exec, T * nq * d));
    TensorPtr q = A.q, ctx = A.ctx;
    TS_ASSIGN_OR_RETURN(const KernelIds pos, cpPositions());
    if (m_o.flashAttention) {
        // Flash: the gathered keys as one ring block (their positions 0 .. S-1), so only each
        // row's log-sum-exp is kept, as the p2p ring keeps it.
        TS_ASSIGN_OR_RETURN(const KernelIds kpos, seqPositions());
        TS_ASSIGN_OR_RETURN(TensorPtr lse, allocUninitialized(m_exec, int64_t(b) * nq * sl));
        m_exec.op("core_attention.fwd", Category::Attention, 2.0 * b * nq * double(sl) * S * d,
                  uint64_t(4) * (uint64_t(T) * nq * d * 2 + uint64_t(S) * b * ng * d * 2), [=] {
                      k::cpRingAttentionForward(ad, pos.ptr, kpos.ptr, fp(q), fp(kg), fp(vg), fp(ctx), fp(lse), true);
                      if (bf) k::roundToBf16(fp(ctx), T * nq * d);
                  });
        A.lse = std::move(lse);
        return Status::ok();
    }
    TS_ASSIGN_OR_RETURN(TensorPtr probs, allocUninitialized(m_exec, int64_t(b) * nq * sl * S));
    // About half of the s_local x s key pairs are visible (causal).
    m_exec.op("core_attention.fwd", Category::Attention, 2.0 * b * nq * double(sl) * S * d,
              uint64_t(4) * (uint64_t(T) * nq * d * 2 + uint64_t(S) * b * ng * d * 2 + uint64_t(b) * nq * sl * S), [=] {
                  k::cpAttentionForward(ad, pos.ptr, fp(q), fp(kg), fp(vg), fp(probs), fp(ctx));
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
    const CpMode mode = cpMode();
    if (mode.ring) {
        const int a = mode.a2a;
        CpRing::Dims rd{sl * a, b, nq / a, ng / a, d, scale};
        setDropout(rd, drop);
        rd.headOffset = drop.headOffset + mode.rank * (nq / a);
        rd.sTotal = S;
        if (a == 1) return m_cpRing->backward(rd, A.q, A.k, A.v, A.attentionOutput(), A.lse, dctx, dq, dk, dv);
        // a2a+p2p: dout to heads, the ring's backward, dQ/dK/dV back to this rank's rows.
        TS_ASSIGN_OR_RETURN(TensorPtr dout, cpToHeads(dctx, nq, *mode.comm));
        TS_ASSIGN_OR_RETURN(TensorPtr dqh, allocUninitialized(m_exec, T * nq * d));
        TS_ASSIGN_OR_RETURN(TensorPtr dkh, allocUninitialized(m_exec, T * ng * d));
        TS_ASSIGN_OR_RETURN(TensorPtr dvh, allocUninitialized(m_exec, T * ng * d));
        TS_RETURN_IF_ERROR(m_cpRing->backward(rd, A.q, A.k, A.v, A.ctxHeads, A.lse, dout, dqh, dkh, dvh));
        TS_RETURN_IF_ERROR(cpToSequence(dqh, nq, dq, *mode.comm));
        TS_RETURN_IF_ERROR(cpToSequence(dkh, ng, dk, *mode.comm));
        return cpToSequence(dvh, ng, dv, *mode.comm);
    }
    if (mode.ulysses) {
        const int c = m_ctx.cpSize;
        Communicator& comm = *mode.comm;
        // Whole sequence of heads [cpRank*nq/c, (cpRank+1)*nq/c) of this TP rank's nq.
        k::AttnDims ad{S, b, nq / c, ng / c, d, scale};
        setDropout(ad, drop);
        ad.headOffset = drop.headOffset + mode.rank * (nq / c);
        TS_ASSIGN_OR_RETURN(TensorPtr dout, cpToHeads(dctx, nq, comm));
        TS_ASSIGN_OR_RETURN(TensorPtr dqh, allocUninitialized(m_exec, T * nq * d));
        TS_ASSIGN_OR_RETURN(TensorPtr dkh, allocUninitialized(m_exec, T * ng * d));
        TS_ASSIGN_OR_RETURN(TensorPtr dvh, allocUninitialized(m_exec, T * ng * d));
        TS_RETURN_IF_ERROR(coreAttentionBackward(A, ad, A.q, A.k, A.v, dout, dqh, dkh, dvh));
        TS_RETURN_IF_ERROR(cpToSequence(dqh, nq, dq, comm));
        TS_RETURN_IF_ERROR(cpToSequence(dkh, ng, dk, comm));
        return cpToSequence(dvh, ng, dv, comm);
    }
    // K and V of the whole sequence again (TE's all-gather variant re-gathers too).
    TS_ASSIGN_OR_RETURN(TensorPtr kg, cpGatherKv(A.k, ng));
    TS_ASSIGN_OR_RETURN(TensorPtr vg, cpGatherKv(A.v, ng));
    k::CpAttnDims ad{sl, S, b, nq, ng, d, scale};
    setDropout(ad, drop);
    TensorPtr q = A.q, probs = A.probs;
    TS_ASSIGN_OR_RETURN(const KernelIds pos, cpPositions());
    TS_ASSIGN_OR_RETURN(TensorPtr dkg, allocUninitialized(m_exec, int64_t(S) * b * ng * d));
    TS_ASSIGN_OR_RETURN(TensorPtr dvg, allocUninitialized(m_exec, int64_t(S) * b * ng * d));
    if (A.lse) {
        // Flash (see the forward): the block's backward from the kept log-sum-exps; dq accumulates.
        TS_ASSIGN_OR_RETURN(const KernelIds kpos, seqPositions());
        TS_ASSIGN_OR_RETURN(TensorPtr delta, allocUninitialized(m_exec, int64_t(b) * nq * sl, MemCategory::Workspace));
        TensorPtr lse = A.lse, ctx = A.attentionOutput();  // the unquantized output
        m_exec.op("core_attention.bwd", Category::Attention, 5.0 * b * nq * double(sl) * S * d,
                  uint64_t(4) * (uint64_t(T) * nq * d * 4 + uint64_t(S) * b * ng * d * 4), [=] {
                      k::cpRingAttentionDelta(ad, fp(ctx), fp(dctx), fp(delta));
                      k::setBytes(fp(dq), 0, size_t(T) * nq * d * sizeof(float));
                      k::cpRingAttentionBackward(ad, pos.ptr, kpos.ptr, fp(q), fp(kg), fp(vg), fp(lse), fp(delta),
                                                 fp(dctx), fp(dq), fp(dkg), fp(dvg));
                  });
    } else {
        if (!probs) {
            TS_ASSIGN_OR_RETURN(probs, allocUninitialized(m_exec, int64_t(b) * nq * sl * S));
            TS_ASSIGN_OR_RETURN(TensorPtr ctxTmp, allocUninitialized(m_exec, T * nq * d));
            m_exec.op("core_attention.recompute", Category::Attention, 2.0 * b * nq * double(sl) * S * d,
                      uint64_t(4) * uint64_t(b) * nq * sl * S,
                      [=] { k::cpAttentionForward(ad, pos.ptr, fp(q), fp(kg), fp(vg), fp(probs), fp(ctxTmp)); });
        }
        m_exec.op("core_attention.bwd", Category::Attention, 4.0 * b * nq * double(sl) * S * d,
                  uint64_t(8) * uint64_t(b) * nq * sl * S, [=] {
                      k::cpAttentionBackward(ad, pos.ptr, fp(q), fp(kg), fp(vg), fp(probs), fp(dctx), fp(dq), fp(dkg),
                                             fp(dvg));
                  });
    }
    TS_ASSIGN_OR_RETURN(TensorPtr dkl, cpScatterKvGrad(dkg, ng));
    TS_ASSIGN_OR_RETURN(TensorPtr dvl, cpScatterKvGrad(dvg, ng));
    const int64_t n = T * ng * d;
    m_exec.op("cp_kv_grad_copy", Category::Memcpy, 0, uint64_t(n) * 16, [=] {
        k::copyBytes(fp(dk), fp(dkl), size_t(n) * sizeof(float));
        k::copyBytes(fp(dv), fp(dvl), size_t(n) * sizeof(float));
    });
    return Status::ok();
}

}  // namespace ts::engine
