// GptModel's context-parallel core attention (cp_comm_type=all_gather; REFERENCE.md §4.5):
// every CP rank holds the query/key/value rows of its two sequence chunks (§4.1). K and V are
// all-gathered over "cp" and laid out in global sequence order; each rank computes causal
// attention of its queries (with their global positions) against the whole sequence; in the
// backward the full-length dK/dV of every rank are put back in rank order and
// reduce-scattered (summed) to their owners. The collectives run on the compute stream, in the
// trace as group "cp" (all-gather exposed, as TE's all-gather variant does without overlap).
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

namespace ts::engine {

Result<TensorPtr> GptModel::cpGatherKv(const TensorPtr& local, int heads) {
    const int b = m_d.microBatch, d = m_d.headDim, cp = m_ctx.cpSize, S = m_seqGlobal;
    const int sl = m_d.seq;
    const int64_t n = int64_t(sl) * b * heads * d;
    TS_ASSIGN_OR_RETURN(TensorPtr gathered, allocUninitialized(m_exec, n * cp));
    m_ctx.cp->allGather(m_exec.stream(), local->data(), gathered->data(), size_t(n), DType::F32);
    holdUntilDone(local, gathered);
    TS_ASSIGN_OR_RETURN(TensorPtr global, allocUninitialized(m_exec, n * cp));
    const int64_t row = int64_t(b) * heads * d;  // one sequence position, every sample and head
    m_exec.op("cp_kv_reorder", Category::Memcpy, 0, uint64_t(n) * cp * 8, [=] {
        const int chunk = S / (2 * cp);
        for (int r = 0; r < cp; ++r)
            for (int half = 0; half < 2; ++half) {
                const int c = half == 0 ? r : 2 * cp - 1 - r;
                std::memcpy(fp(global) + int64_t(c) * chunk * row, fp(gathered) + r * n + int64_t(half) * chunk * row,
                            size_t(chunk * row) * sizeof(float));
            }
    });
    return global;
}

Result<TensorPtr> GptModel::cpScatterKvGrad(const TensorPtr& global, int heads) {
    const int b = m_d.microBatch, d = m_d.headDim, cp = m_ctx.cpSize, S = m_seqGlobal;
    const int sl = m_d.seq;
    const int64_t n = int64_t(sl) * b * heads * d;
    const int64_t row = int64_t(b) * heads * d;
    TS_ASSIGN_OR_RETURN(TensorPtr rankMajor, allocUninitialized(m_exec, n * cp));
    m_exec.op("cp_kv_grad_reorder", Category::Memcpy, 0, uint64_t(n) * cp * 8, [=] {
        const int chunk = S / (2 * cp);
        for (int r = 0; r < cp; ++r)
            for (int half = 0; half < 2; ++half) {
                const int c = half == 0 ? r : 2 * cp - 1 - r;
                std::memcpy(fp(rankMajor) + r * n + int64_t(half) * chunk * row, fp(global) + int64_t(c) * chunk * row,
                            size_t(chunk * row) * sizeof(float));
            }
    });
    TS_ASSIGN_OR_RETURN(TensorPtr local, allocUninitialized(m_exec, n));
    m_ctx.cp->reduceScatter(m_exec.stream(), rankMajor->data(), local->data(), size_t(n), DType::F32, ReduceOp::Sum);
    holdUntilDone(rankMajor, local);
    return local;
}

Status GptModel::cpCoreAttentionForward(LayerActs& A, int nq, int ng) {
    const int b = m_d.microBatch, d = m_d.headDim, sl = m_d.seq, S = m_seqGlobal;
    const int64_t T = int64_t(sl) * b;
    TS_ASSIGN_OR_RETURN(TensorPtr kg, cpGatherKv(A.k, ng));
    TS_ASSIGN_OR_RETURN(TensorPtr vg, cpGatherKv(A.v, ng));
    const k::CpAttnDims ad{sl, S, b, nq, ng, d, 1.0f / std::sqrt(float(d))};
    TS_ASSIGN_OR_RETURN(TensorPtr probs, allocUninitialized(m_exec, int64_t(b) * nq * sl * S));
    TS_ASSIGN_OR_RETURN(A.ctx, allocUninitialized(m_exec, T * nq * d));
    TensorPtr q = A.q, ctx = A.ctx;
    const bool bf = m_o.bf16;
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

Status GptModel::cpCoreAttentionBackward(LayerActs& A, int nq, int ng, TensorPtr dctx, TensorPtr dq, TensorPtr dk,
                                         TensorPtr dv) {
    const int b = m_d.microBatch, d = m_d.headDim, sl = m_d.seq, S = m_seqGlobal;
    const int64_t T = int64_t(sl) * b;
    // K and V of the whole sequence again (TE's all-gather variant re-gathers too).
    TS_ASSIGN_OR_RETURN(TensorPtr kg, cpGatherKv(A.k, ng));
    TS_ASSIGN_OR_RETURN(TensorPtr vg, cpGatherKv(A.v, ng));
    const k::CpAttnDims ad{sl, S, b, nq, ng, d, 1.0f / std::sqrt(float(d))};
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
