// Ops the parts of GptModel share: the norms, the linear backward (wgrad into the main grad),
// the tensor/sequence-parallel collectives on the compute stream, the tp_comm_overlap
// backward of the column/row-parallel linears, and the TP sum of the SP params' grads.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"
#include "kernels/common/fp8_codes.h"

namespace ts::engine {

void GptModel::tpAllReduce(const TensorPtr& t, int64_t n) {
    if (m_ctx.tp && m_ctx.tpSize > 1)
        m_ctx.tp->allReduce(m_exec.stream(), t->data(), t->data(), size_t(n), DType::F32, ReduceOp::Sum);
}

Result<TensorPtr> GptModel::seqGather(const TensorPtr& local, int64_t n) {
    TS_ASSIGN_OR_RETURN(TensorPtr full, m_exec.alloc(n * m_ctx.tpSize));
    m_ctx.tp->allGather(m_exec.stream(), local->data(), full->data(), size_t(n), DType::F32);
    kernels::fp8codes::map().bindLike(fp(full), n * m_ctx.tpSize, fp(local), n);  // FP8 codes stay codes
    keepUntilPassed(m_exec.stream(), {local, full});
    return full;
}

Result<TensorPtr> GptModel::seqReduceScatter(const TensorPtr& full, int64_t n) {
    TS_ASSIGN_OR_RETURN(TensorPtr local, m_exec.alloc(n));
    m_ctx.tp->reduceScatter(m_exec.stream(), full->data(), local->data(), size_t(n), DType::F32, ReduceOp::Sum);
    keepUntilPassed(m_exec.stream(), {full, local});
    return local;
}

void GptModel::setTpCommOverlap(Stream& commStream, Communicator& comm) {
    if (!m_sp || !m_cfg.tp_comm_overlap) return;
    TpOverlapOptions o;
    o.overlapAg = m_cfg.tp_comm_overlap_ag;
    o.overlapRs = m_cfg.tp_comm_overlap_rs;
    o.overlapRsDgrad = m_cfg.tp_comm_overlap_rs_dgrad;
    // TE: pipelined RS of the dgrad replaces the bulk overlaps of that layer.
    o.bulkDgrad = m_cfg.tp_comm_bulk_dgrad && !o.overlapRsDgrad;
    o.bulkWgrad = m_cfg.tp_comm_bulk_wgrad && !o.overlapRsDgrad;
    m_tpo = std::make_unique<TpOverlap>(m_exec, commStream, comm, o);
}

Status GptModel::rowParallelBackwardOverlapped(const char* dgradName, const char* wgradName, int wIdx,
                                               TensorPtr dyLocal, TensorPtr x, TensorPtr dx, int T, int in,
                                               int out, const float* Wq) {
    // dY [TL, out] is ring-gathered while the dgrad GEMM of the shards already here runs;
    // the wgrad (a sum over all T rows) runs once on the gathered dY.
    TS_ASSIGN_OR_RETURN(auto dgrad, overlappedDgrad(wIdx, T, in, out, Wq));
    TS_ASSIGN_OR_RETURN(TensorPtr dyFull,
                        m_tpo->agGemm(dgradName, dyLocal, localTokens(), out, dx, in, 2.0 * in * out, dgrad));
    return linearBackward(wgradName, wIdx, -1, dyFull, x, nullptr, T, in, out, Wq);
}

Result<std::function<void(const float*, float*, int)>> GptModel::overlappedDgrad(int wIdx, int T, int in, int out,
                                                                                  const float* Wq) {
    const float* W = Wq ? Wq : m_params.modelParam(wIdx);
    const bool bf = m_o.bf16;
    // FP8 block recipes: dY quantized along `out` (within each row, so chunk by chunk as in one
    // piece) against the weight's copy along `out` (Wq is the forward's, along `in`), as
    // linearBackward's dgrad; the chunks run in order on the compute stream and share one scratch.
    const Fp8Recipe r8 = m_o.fp8;
    const bool fp32 = Wq && !fp8GemmsBf16();  // FP8 operands the bf16 GEMMs would round
    TensorPtr q8;
    if (Wq && r8.isBlock()) {
        TS_ASSIGN_OR_RETURN(W, fp8BlockWeight(wIdx, false));
        TS_ASSIGN_OR_RETURN(q8, allocUninitialized(m_exec, int64_t(T) * out, MemCategory::Workspace));
    }
    return std::function<void(const float*, float*, int)>([=](const float* dy, float* dxr, int rows) {
        k::Fp32GemmScope gemms(fp32);
        if (q8) dy = fp8BlockOperand(r8, dy, rows, out, true, false, true, fp(q8));
        k::linearBackward(dy, nullptr, W, dxr, nullptr, nullptr, rows, in, out);
        if (bf) k::roundToBf16(dxr, int64_t(rows) * in);
    });
}

Result<TensorPtr> GptModel::columnParallelBackwardOverlapped(const char* dgradName, const char* wgradName, int wIdx,
                                                             int bIdx, TensorPtr dy, TensorPtr xLocal, int T, int in,
                                                             int out, const float* Wq) {
    // dy: [T, out] (TP region), xLocal: the saved s-shard [TL, in]. Returns dX's shard [TL, in].
    const int TL = localTokens();
    const int64_t n = int64_t(TL) * in;
    const TpOverlapOptions& o = m_tpo->options();
    TS_ASSIGN_OR_RETURN(auto dgrad, overlappedDgrad(wIdx, T, in, out, Wq));
    // Bulk dgrad: the re-gather of the saved input for the wgrad runs during the dgrad GEMM.
    TpOverlap::Pending xFull, dxPending;
    if (o.bulkDgrad) { TS_ASSIGN_OR_RETURN(xFull, m_tpo->gatherAsync(xLocal, n)); }
    TensorPtr dxLocal;
    if (o.overlapRsDgrad) {
        TS_ASSIGN_OR_RETURN(dxLocal, m_tpo->gemmRs(dgradName, dy, TL, out, in, 2.0 * in * out, dgrad));
    } else {
        TS_ASSIGN_OR_RETURN(TensorPtr dxFull, m_exec.alloc(int64_t(T) * in));
        m_exec.op(dgradName, Category::Gemm, 2.0 * T * in * out, uint64_t(4) * uint64_t(T) * (in + out),
                  [=] { dgrad(fp(dy), fp(dxFull), T); });
        // Bulk wgrad: the reduce-scatter of dX runs during the wgrad GEMM.
        if (o.bulkWgrad) { TS_ASSIGN_OR_RETURN(dxPending, m_tpo->reduceScatterAsync(dxFull, n)); }
        else { TS_ASSIGN_OR_RETURN(dxLocal, seqReduceScatter(dxFull, n)); }
    }
    TensorPtr x;
    if (o.bulkDgrad) x = m_tpo->wait(xFull);
    else { TS_ASSIGN_OR_RETURN(x, seqGather(xLocal, n)); }
    TS_RETURN_IF_ERROR(linearBackward(wgradName, wIdx, bIdx, dy, x, nullptr, T, in, out, Wq));
    if (dxPending.tensor) dxLocal = m_tpo->wait(dxPending);
    return dxLocal;
}

Status GptModel::syncSequenceParallelGrads(const std::vector<int>& params) {
    if (!m_sp || !m_lastBackward) return Status::ok();
    // Grads accumulate over the step's microbatches; the TP sum runs once, after the last one.
    std::vector<std::pair<float*, int64_t>> grads;
    int64_t n = 0;
    for (int i : params) {
        if (i < 0 || !m_params.info(i).sequenceParallel) continue;
        grads.push_back({m_params.mainGrad(i), m_params.info(i).numel});
        n += m_params.info(i).numel;
    }
    if (grads.empty()) return Status::ok();
    // One coalesced all-reduce per call (pack -> all-reduce -> unpack), as Megatron flattens them.
    TS_ASSIGN_OR_RETURN(TensorPtr pack, m_exec.alloc(n, MemCategory::CommBuffers));
    m_exec.op("sp_grads.pack", Category::Memcpy, 0, uint64_t(n) * 8, [=] {
        float* dst = fp(pack);
        for (const auto& [g, len] : grads) {
            k::copyBytes(dst, g, size_t(len) * sizeof(float));
            dst += len;
        }
    });
    m_ctx.tp->allReduce(m_exec.stream(), pack->data(), pack->data(), size_t(n), DType::F32, ReduceOp::Sum);
    m_exec.op("sp_grads.unpack", Category::Memcpy, 0, uint64_t(n) * 8, [=] {
        const float* src = fp(pack);
        for (const auto& [g, len] : grads) {
            k::copyBytes(g, src, size_t(len) * sizeof(float));
            src += len;
        }
    });
    return Status::ok();
}

Status GptModel::gradsReady(const std::vector<int>& params) {
    TS_RETURN_IF_ERROR(syncSequenceParallelGrads(params));
    if (m_gradReadyHook) m_gradReadyHook(params);
    return Status::ok();
}

void GptModel::roundBf16(const TensorPtr& t, int64_t n) {
    if (!m_o.bf16) return;
    m_exec.op("bf16_round", Category::Elementwise, 0, uint64_t(n) * 8, [t, n] { k::roundToBf16(fp(t), n); });
}

void GptModel::normForward(const char* name, int wIdx, int bIdx, TensorPtr x, TensorPtr y,
                           TensorPtr mean, TensorPtr rstd, int T) {
    const float* W = m_params.modelParam(wIdx);
    const float* B = bIdx >= 0 ? m_params.modelParam(bIdx) : nullptr;
    const int C = m_d.hidden;
    const float eps = m_d.normEps;
    const bool rms = m_d.rmsNorm, fused = m_o.fusedLayerNorm, bf = m_o.bf16;
    // bf16: the output is a bf16 tensor, written so by the norm's kernel (roundBf16).
    m_exec.op(name, Category::Norm, 8.0 * T * C, uint64_t(T) * C * 8, [=] {
        if (rms) k::rmsNormForward(fp(x), W, fp(y), fp(rstd), T, C, eps, bf);
        else if (fused) k::layerNormForwardFused(fp(x), W, B, fp(y), fp(mean), fp(rstd), T, C, eps, bf);
        else k::layerNormForward(fp(x), W, B, fp(y), fp(mean), fp(rstd), T, C, eps, bf);
    });
}

void GptModel::normBackward(const char* name, int wIdx, int bIdx, TensorPtr dy, TensorPtr x,
                            TensorPtr mean, TensorPtr rstd, TensorPtr dx, int T) {
    const float* W = m_params.modelParam(wIdx);
    float* dW = m_params.mainGrad(wIdx);
    float* dB = bIdx >= 0 ? m_params.mainGrad(bIdx) : nullptr;
    const int C = m_d.hidden;
    const bool rms = m_d.rmsNorm, fused = m_o.fusedLayerNorm, bf = m_o.bf16;
    m_exec.op(name, Category::Norm, 12.0 * T * C, uint64_t(T) * C * 12, [=] {
        // bf16: the input gradient is a bf16 tensor, as every activation gradient (TE's norms
        // write their dgrad in the input's dtype), rounded by the kernel that writes it.
        if (rms) k::rmsNormBackward(fp(dy), fp(x), W, fp(rstd), fp(dx), dW, T, C, bf);
        else if (fused) k::layerNormBackwardFused(fp(dy), fp(x), W, fp(mean), fp(rstd), fp(dx), dW, dB, T, C, bf);
        else k::layerNormBackward(fp(dy), fp(x), W, fp(mean), fp(rstd), fp(dx), dW, dB, T, C, bf);
    });
}

Status GptModel::linearBackward(const char* name, int wIdx, int bIdx, TensorPtr dy, TensorPtr x,
                                TensorPtr dx, int T, int in, int out, const float* Wq) {
    const float* W = Wq ? Wq : dx ? m_params.modelParam(wIdx) : nullptr;  // only the dgrad reads it
    float* G = m_params.mainGrad(wIdx);
    float* GB = bIdx >= 0 ? m_params.mainGrad(bIdx) : nullptr;
    const double flops = (dx ? 4.0 : 2.0) * double(T) * in * out;
    const uint64_t bytes = uint64_t(4) * (uint64_t(T) * (in + out) + uint64_t(in) * out);
    const bool bf = m_o.bf16;
    const bool fp32 = Wq && !fp8GemmsBf16();  // FP8 operands the bf16 GEMMs would round
    if (Wq && m_o.fp8.isBlock()) {
        // FP8 block recipes (mxfp8, blockwise): each GEMM's operands quantized per block along its
        // reduction dimension, all from high precision: dgrad dy (along out) x W (along out), wgrad
        // dy^T x (both along T). The FP8 sites take their bias grads before (bIdx = -1).
        TS_ASSIGN_OR_RETURN(const float* Wc, fp8BlockWeight(wIdx, false));
        const Fp8Recipe r = m_o.fp8;
        const int64_t n = int64_t(out) * in;
        TensorPtr tmp;
        if (!m_o.gradAccumFusion) { TS_ASSIGN_OR_RETURN(tmp, m_exec.alloc(n, MemCategory::Workspace)); }
        TS_ASSIGN_OR_RETURN(TensorPtr work, m_exec.alloc(fp8BlockBackwardWorkElems(T, in, out), MemCategory::Workspace));
        m_exec.op(name, Category::Gemm, flops, bytes, [=] {
            k::Fp32GemmScope gemms(fp32);
            if (tmp) k::setBytes(fp(tmp), 0, size_t(n) * sizeof(float));
            fp8BlockLinearBackward(r, fp(dy), fp(x), Wc, dx ? fp(dx) : nullptr, tmp ? fp(tmp) : G, T, in, out,
                                   fp(work));
            if (GB) k::biasGradAccumulate(fp(dy), GB, T, out);
            if (bf && dx) k::roundToBf16(fp(dx), int64_t(T) * in);
        });
        if (tmp) {
            m_exec.op("wgrad_accumulate", Category::Elementwise, double(n), uint64_t(n) * 12, [=] {
                if (bf) k::roundToBf16(fp(tmp), n);
                k::addInPlace(G, fp(tmp), n);
            });
        }
        return Status::ok();
    }
    if (m_o.gradAccumFusion) {
        // wgrad GEMM accumulates straight into the fp32 main grad.
        m_exec.op(name, Category::Gemm, flops, bytes, [=] {
            k::Fp32GemmScope gemms(fp32);
            k::linearBackward(fp(dy), fp(x), W, fp(dx), G, GB, T, in, out);
            if (bf && dx) k::roundToBf16(fp(dx), int64_t(T) * in);
        });
        return Status::ok();
    }
    // Unfused: wgrad into a temporary (in the model's precision), then added to the main grad.
    const int64_t n = int64_t(out) * in;
    TS_ASSIGN_OR_RETURN(TensorPtr tmp, m_exec.alloc(n, MemCategory::Workspace));
    m_exec.op(name, Category::Gemm, flops, bytes, [=] {
        k::Fp32GemmScope gemms(fp32);
        k::setBytes(fp(tmp), 0, size_t(n) * sizeof(float));
        k::linearBackward(fp(dy), fp(x), W, fp(dx), fp(tmp), GB, T, in, out);
        if (bf && dx) k::roundToBf16(fp(dx), int64_t(T) * in);
    });
    m_exec.op("wgrad_accumulate", Category::Elementwise, double(n), uint64_t(n) * 12, [=] {
        if (bf) k::roundToBf16(fp(tmp), n);
        k::addInPlace(G, fp(tmp), n);
    });
    return Status::ok();
}

}  // namespace ts::engine
