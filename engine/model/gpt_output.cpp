// GptModel's output side (last pipeline stage): final norm, the vocab-parallel output layer
// (column parallel, the input gathered along s with sequence parallel), the cross entropy
// (vocab-parallel with tp > 1, REFERENCE.md §2.6; fused or unfused otherwise) and the
// per-token gradient seed; and their backward.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

namespace ts::engine {

Status GptModel::finalForward(MbState& st) {
    m_exec.setLayer(-1);
    TS_RETURN_IF_ERROR(useWeights({m_lnfW, m_lnfB, m_outW}));
    WeightsInUse weights{*this};
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden, Vl = m_vocabL;
    const int TL = localTokens();
    const int64_t ThL = int64_t(TL) * h, TV = int64_t(T) * Vl;
    const bool bf = m_o.bf16;
    st.xL = st.hidden;
    TS_ASSIGN_OR_RETURN(st.xf, m_exec.alloc(ThL));
    if (!m_d.rmsNorm) { TS_ASSIGN_OR_RETURN(st.meanf, m_exec.alloc(TL)); }
    TS_ASSIGN_OR_RETURN(st.rstdf, m_exec.alloc(TL));
    normForward("final_layernorm.fwd", m_lnfW, m_lnfB, st.xL, st.xf, st.meanf, st.rstdf, TL);
    // overwritten by the output-layer GEMM (beta = 0): no zero fill of the [T, V] buffer
    TS_ASSIGN_OR_RETURN(st.logits, allocUninitialized(m_exec, TV));
    {
        const float* W = m_params.modelParam(m_outW);
        // SP: the output layer is column parallel, its input is gathered along s.
        TensorPtr xf = st.xf, logits = st.logits;
        if (m_sp) { TS_ASSIGN_OR_RETURN(xf, seqGather(st.xf, ThL)); }
        m_exec.op("output_layer.fwd", Category::Gemm, 2.0 * T * h * Vl,
                  uint64_t(4) * (uint64_t(T) * (h + Vl) + uint64_t(h) * Vl), [=] {
                      k::linearForward(fp(xf), W, nullptr, fp(logits), T, h, Vl);
                      if (bf) k::roundToBf16(fp(logits), TV);
                  });
        if (m_captureLogits) {
            auto store = m_logits;
            const int mb = m_exec.microbatch();
            m_exec.op("capture_logits", Category::Memcpy, 0, uint64_t(TV) * 4,
                      [=] { (*store)[mb].assign(fp(logits), fp(logits) + TV); });
        }
    }
    // Gradient seed per token: mask / (num_tokens * num_microbatches) (Megatron §1.1).
    TS_ASSIGN_OR_RETURN(st.dloss, m_exec.alloc(T));
    const StagedInputs* in = staged(m_exec.microbatch(), st.data);
    // The per-token losses stay until the step's end (microbatchLoss reads them back then): not an
    // activation the backward frees, a step's workspace (stageInputs': one that keeps its address).
    TensorPtr loss;
    if (in) loss = in->loss;
    else { TS_ASSIGN_OR_RETURN(loss, m_exec.alloc(T, MemCategory::Workspace)); }
    auto data = st.data;
    const KernelIds labels = st.labels;
    TensorPtr dloss = st.dloss;
    if (in) {  // uploaded by stageInputs
        const TensorPtr seed = in->seed;
        m_exec.op("loss_scale", Category::Loss, double(T), uint64_t(T) * 8,
                  [=] { k::copyBytes(fp(dloss), fp(seed), size_t(T) * sizeof(float)); });
    } else {  // the seed depends only on the host's loss mask: computed here, uploaded by the op
        auto seed = lossSeed(*data);
        m_exec.op("loss_scale", Category::Loss, double(T), uint64_t(T) * 8,
                  [=] { k::copyBytes(fp(dloss), seed->data(), size_t(T) * sizeof(float)); });
    }
    TensorPtr logits = st.logits;
    if (m_ctx.tpSize > 1) {
        // Vocab-parallel cross entropy: 3 all-reduces of [T] (REFERENCE.md §2.6).
        TS_ASSIGN_OR_RETURN(st.rowMax, m_exec.alloc(T));
        TS_ASSIGN_OR_RETURN(st.sumExp, m_exec.alloc(T));
        TS_ASSIGN_OR_RETURN(TensorPtr target, m_exec.alloc(T));
        TensorPtr rowMax = st.rowMax, sumExp = st.sumExp;
        const int vStart = m_vocabStart;
        m_exec.op("cross_entropy.max", Category::Loss, double(TV), uint64_t(TV) * 4,
                  [=] { k::crossEntropyRowMax(fp(logits), fp(rowMax), T, Vl); });
        m_ctx.tp->allReduce(m_exec.stream(), rowMax->data(), rowMax->data(), size_t(T), DType::F32, ReduceOp::Max);
        m_exec.op("cross_entropy.stats", Category::Loss, 3.0 * TV, uint64_t(TV) * 4, [=] {
            k::crossEntropyStats(fp(logits), labels.ptr, fp(rowMax), fp(target), fp(sumExp), T, Vl, vStart);
        });
        m_ctx.tp->allReduce(m_exec.stream(), target->data(), target->data(), size_t(T), DType::F32, ReduceOp::Sum);
        m_ctx.tp->allReduce(m_exec.stream(), sumExp->data(), sumExp->data(), size_t(T), DType::F32, ReduceOp::Sum);
        m_exec.op("cross_entropy.loss", Category::Loss, double(T), uint64_t(T) * 12, [=] {
            k::crossEntropyLoss(fp(target), fp(sumExp), fp(loss), T);
        });
    } else if (m_o.fusedCrossEntropy) {
        // Loss and dlogits in one sweep; the logits buffer now holds the gradient.
        const int V = Vl;
        m_exec.op("cross_entropy.fused", Category::Loss, 5.0 * TV, uint64_t(TV) * 8, [=] {
            k::crossEntropyFused(fp(logits), labels.ptr, fp(dloss), fp(loss), T, V);
        });
    } else {
        TS_ASSIGN_OR_RETURN(st.ceProbs, m_exec.alloc(TV));
        TensorPtr probs = st.ceProbs;
        const int V = Vl;
        m_exec.op("cross_entropy.fwd", Category::Loss, 4.0 * TV, uint64_t(TV) * 8, [=] {
            k::crossEntropyForwardUnfused(fp(logits), labels.ptr, fp(probs), fp(loss), T, V);
        });
        st.logits.reset();  // the naive path keeps probs, not logits
    }
    // Read back after the step (microbatchLoss), not here: on a device that would wait for the stream.
    m_pendingLosses[m_exec.microbatch()] = {loss, T, data};
    return Status::ok();
}

Status GptModel::finalBackward(MbState& st, TensorPtr* dhidden) {
    m_exec.setLayer(-1);
    TS_RETURN_IF_ERROR(useWeights({m_lnfW, m_lnfB, m_outW}));
    WeightsInUse weights{*this};
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden, Vl = m_vocabL;
    const int TL = localTokens();
    const int64_t Th = int64_t(T) * h, ThL = int64_t(TL) * h, TV = int64_t(T) * Vl;
    auto data = st.data;
    const KernelIds labels = st.labels;
    TensorPtr dloss = st.dloss;
    TensorPtr dlogits;
    if (m_ctx.tpSize > 1) {
        dlogits = st.logits;
        TensorPtr rowMax = st.rowMax, sumExp = st.sumExp;
        const int vStart = m_vocabStart;
        m_exec.op("cross_entropy.bwd", Category::Loss, 4.0 * TV, uint64_t(TV) * 8, [=] {
            k::crossEntropyBackward(fp(dlogits), labels.ptr, fp(rowMax), fp(sumExp), fp(dloss), fp(dlogits), T, Vl,
                                    vStart);
        });
    } else if (m_o.fusedCrossEntropy) {
        dlogits = st.logits;  // already the gradient
    } else {
        TS_ASSIGN_OR_RETURN(dlogits, m_exec.alloc(TV));
        TensorPtr probs = st.ceProbs;
        m_exec.op("cross_entropy.bwd", Category::Loss, 2.0 * TV, uint64_t(TV) * 8, [=] {
            k::crossEntropyBackwardUnfused(fp(probs), labels.ptr, fp(dloss), fp(dlogits), T, Vl);
        });
        st.ceProbs.reset();
    }
    if (m_o.bf16) roundBf16(dlogits, TV);
    st.logits.reset();
    TensorPtr xfFull = st.xf;
    if (m_sp) { TS_ASSIGN_OR_RETURN(xfFull, seqGather(st.xf, ThL)); }
    TS_ASSIGN_OR_RETURN(TensorPtr dxf, m_exec.alloc(Th));
    TS_RETURN_IF_ERROR(linearBackward("output_layer.bwd", m_outW, -1, dlogits, xfFull, dxf, T, h, Vl));
    dlogits.reset();
    xfFull.reset();
    if (m_sp) { TS_ASSIGN_OR_RETURN(dxf, seqReduceScatter(dxf, ThL)); }
    else tpAllReduce(dxf, Th);
    TS_ASSIGN_OR_RETURN(TensorPtr dh, m_exec.alloc(ThL));
    normBackward("final_layernorm.bwd", m_lnfW, m_lnfB, dxf, st.xL, st.meanf, st.rstdf, dh, TL);
    st.xf.reset(); st.xL.reset(); st.meanf.reset(); st.rstdf.reset(); st.dloss.reset();
    *dhidden = dh;
    return Status::ok();
}

}  // namespace ts::engine
