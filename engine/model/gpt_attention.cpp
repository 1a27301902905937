// GptModel's self-attention block (Megatron's SelfAttention): linear_qkv (column parallel,
// sequence-parallel all-gather before it), the QKV split with RoPE, core attention (causal,
// GQA, attention dropout), linear_proj (row parallel, reduce-scatter or all-reduce after it);
// and the backward of each. Its input is the input_layernorm output A.a1, its output the
// linear_proj output before the bias, which the layer adds in bias-dropout-add.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

namespace ts::engine {

namespace {
// Core-attention dims (nq, ng: this rank's heads). Attention-dropout masks are keyed by (seed,
// step, microbatch, layer): `seed`, GptModel::dropSeed; they are numbered over all heads, so TP
// ranks draw the single-device mask of their heads and recompute/backward regenerate the
// forward's mask.
k::AttnDims attnDims(const ModelDims& md, const ModelOptions& o, const ParallelContext& ctx, int nq,
                     int ng, kernels::hd::DropoutSeed seed) {
    k::AttnDims ad{md.seq, md.microBatch, nq, ng, md.headDim, 1.0f / std::sqrt(float(md.headDim))};
    ad.dropout = o.attentionDropout;
    ad.dropoutSeed = seed;
    ad.headOffset = ctx.tpRank * nq;
    ad.nqTotal = md.heads;
    return ad;
}
}  // namespace

Result<TensorPtr> GptModel::attentionForward(LayerActs& A, const LayerParams& P, int gl) {
    const int s = m_d.seq, b = m_d.microBatch, T = s * b, h = m_d.hidden, d = m_d.headDim;
    const int nq = m_nqL, ng = m_ngL;
    const int qkvOut = (nq + 2 * ng) * d;
    const int TL = localTokens();
    const int64_t Th = int64_t(T) * h, ThL = int64_t(TL) * h;
    const bool bf = m_o.bf16;
    // Activations here are fully written by the op that produces them: skip zeroing.
    auto alloc = [&](int64_t n) { return allocUninitialized(m_exec, n); };
    // SP: only the local a1 [TL, h] is saved; the gathered [T, h] lives until the GEMM ran.
    // tp_comm_overlap_ag: the all-gather is pipelined with the GEMM shard by shard instead.
    const bool agOverlap = m_tpo && m_tpo->options().overlapAg;
    const bool rsOverlap = m_tpo && m_tpo->options().overlapRs;
    const int li = gl - m_ctx.layerBegin;
    const bool fp8 = fp8Layer(li);
    // FP8: the saved input shard is quantized in place (one scale for the whole tensor).
    if (fp8) TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Qkv, kFp8Input, A.a1, ThL));
    TensorPtr a1Full = A.a1;
    if (m_sp && !agOverlap) { TS_ASSIGN_OR_RETURN(a1Full, seqGather(A.a1, ThL)); }

    // linear_qkv (column parallel; bias sharded with the rows)
    TS_ASSIGN_OR_RETURN(TensorPtr qkv, alloc(int64_t(T) * qkvOut));
    {
        const float* W = nullptr;
        if (fp8) { TS_ASSIGN_OR_RETURN(W, fp8Weight(li, kFp8Qkv, P.qkvW)); }
        else W = m_params.modelParam(P.qkvW);
        const float* B = P.qkvB >= 0 ? m_params.modelParam(P.qkvB) : nullptr;
        const Fp8Recipe r8 = m_o.fp8;
        const bool blk = fp8 && r8.isBlock();  // block recipes: the input quantized per block here
        TensorPtr q8;  // the quantized input rows (the GEMM chunks run in order on the compute stream)
        if (blk) { TS_ASSIGN_OR_RETURN(q8, allocUninitialized(m_exec, int64_t(T) * h, MemCategory::Workspace)); }
        const bool fp32 = fp8 && !fp8GemmsBf16();  // FP8 operands the bf16 GEMMs would round
        auto gemm = [=](const float* x, float* y, int rows) {
            k::Fp32GemmScope gemms(fp32);
            if (blk) x = fp8BlockOperand(r8, x, rows, h, true, false, false, fp(q8));
            k::linearForward(x, W, B, y, rows, h, qkvOut);
            if (bf) k::roundToBf16(y, int64_t(rows) * qkvOut);
        };
        if (agOverlap) {
            TS_RETURN_IF_ERROR(m_tpo->agGemm("linear_qkv.fwd", A.a1, TL, h, qkv, qkvOut, 2.0 * h * qkvOut, gemm).status());
        } else {
            TensorPtr a1 = a1Full;
            m_exec.op("linear_qkv.fwd", Category::Gemm, 2.0 * T * h * qkvOut,
                      uint64_t(4) * (uint64_t(T) * (h + qkvOut) + uint64_t(h) * qkvOut),
                      [=] { gemm(fp(a1), fp(qkv), T); });
        }
    }
    a1Full.reset();
    TS_ASSIGN_OR_RETURN(A.q, alloc(int64_t(T) * nq * d));
    TS_ASSIGN_OR_RETURN(A.k, alloc(int64_t(T) * ng * d));
    TS_ASSIGN_OR_RETURN(A.v, alloc(int64_t(T) * ng * d));
    {
        TensorPtr q = A.q, kk = A.k, v = A.v;
        const bool rope = m_d.rope, fusedRope = m_o.fusedRope;
        const float theta = m_d.ropeTheta;
        const auto segs = m_ropeSegs;
        if (rope && fusedRope) {
            // apply_rope_fusion: the layout copy and the rotation in one pass over qkv
            m_exec.op("qkv_split_rope.fwd", Category::Elementwise, 6.0 * T * (nq + ng) * d,
                      uint64_t(T) * qkvOut * 8, [=] {
                          for (const auto& sg : segs) {
                              const size_t r0 = size_t(sg.start) * size_t(b);
                              k::splitQkvRopeForward(fp(qkv) + r0 * qkvOut, fp(q) + r0 * nq * d, fp(kk) + r0 * ng * d,
                                                     fp(v) + r0 * ng * d, sg.len, b, nq, ng, d, theta, sg.pos, bf);
                          }
                      });
        } else {
            m_exec.op("qkv_split", Category::Elementwise, 0, uint64_t(T) * qkvOut * 8,
                      [=] { k::splitQkv(fp(qkv), fp(q), fp(kk), fp(v), T, nq, ng, d); });
        }
        if (rope && !fusedRope) {
            m_exec.op("rope.fwd", Category::Elementwise, 6.0 * T * (nq + ng) * d,
                      uint64_t(T) * (nq + ng) * d * 8, [=] {
                          for (const auto& sg : segs) {
                              const size_t r0 = size_t(sg.start) * size_t(b);
                              k::ropeForward(fp(q) + r0 * nq * d, sg.len, b, nq, d, theta, sg.pos);
                              k::ropeForward(fp(kk) + r0 * ng * d, sg.len, b, ng, d, theta, sg.pos);
                          }
                          if (bf) {
                              k::roundToBf16(fp(q), int64_t(T) * nq * d);
                              k::roundToBf16(fp(kk), int64_t(T) * ng * d);
                          }
                      });
        }
    }
    // core attention
    const k::AttnDims ad = attnDims(m_d, m_o, m_ctx, nq, ng, dropSeed(m_exec.microbatch(), gl, 3));
    if (m_ctx.cpSize > 1) {
        TS_RETURN_IF_ERROR(cpCoreAttentionForward(A, nq, ng, ad));
        if (fp8 && !m_o.fp8.isBlock() && A.lse && !A.ctxHeads) {
            // linear_proj's FP8 quantizes A.ctx in place below, and the backward of ring blocks
            // reads the attention output itself (rowsum(dout * out)): it keeps its own copy, as
            // Transformer Engine's attention saves its output apart from linear_proj's FP8 input.
            A.attnOut = A.ctx;
            TS_ASSIGN_OR_RETURN(A.ctx, alloc(int64_t(T) * nq * d));
            TensorPtr from = A.attnOut, to = A.ctx;
            const int64_t n = int64_t(T) * nq * d;
            m_exec.op("core_attention.out_copy", Category::Memcpy, 0, uint64_t(n) * 8,
                      [=] { k::copyBytes(fp(to), fp(from), size_t(n) * sizeof(float)); });
        }
    } else {
        TS_ASSIGN_OR_RETURN(A.ctx, alloc(int64_t(T) * nq * d));
        TS_RETURN_IF_ERROR(coreAttentionForward(A, ad, A.q, A.k, A.v, A.ctx));
    }

    // linear_proj (row parallel; its bias is added after the reduction, in the layer's
    // bias-dropout-add)
    TensorPtr proj;
    {
        const float* W = nullptr;
        if (fp8) {
            TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Proj, kFp8Input, A.ctx, int64_t(T) * nq * d));
            TS_ASSIGN_OR_RETURN(W, fp8Weight(li, kFp8Proj, P.projW));
        } else {
            W = m_params.modelParam(P.projW);
        }
        TensorPtr ctx = A.ctx;
        const int in = nq * d;
        const Fp8Recipe r8 = m_o.fp8;
        const bool blk = fp8 && r8.isBlock();
        TensorPtr q8;
        if (blk) { TS_ASSIGN_OR_RETURN(q8, allocUninitialized(m_exec, int64_t(T) * in, MemCategory::Workspace)); }
        const bool fp32 = fp8 && !fp8GemmsBf16();  // FP8 operands the bf16 GEMMs would round
        auto gemm = [=](const float* x, float* y, int rows) {
            k::Fp32GemmScope gemms(fp32);
            if (blk) x = fp8BlockOperand(r8, x, rows, in, true, false, false, fp(q8));
            k::linearForward(x, W, nullptr, y, rows, in, h);
        };
        if (rsOverlap) {
            // tp_comm_overlap_rs: chunk GEMMs pipelined with chunk reduce-scatters.
            TS_ASSIGN_OR_RETURN(proj, m_tpo->gemmRs("linear_proj.fwd", ctx, TL, in, h, 2.0 * in * h, gemm));
        } else {
            TS_ASSIGN_OR_RETURN(proj, alloc(Th));
            TensorPtr y = proj;
            m_exec.op("linear_proj.fwd", Category::Gemm, 2.0 * T * in * h,
                      uint64_t(4) * (uint64_t(T) * (in + h) + uint64_t(in) * h), [=] { gemm(fp(ctx), fp(y), T); });
            if (m_sp) { TS_ASSIGN_OR_RETURN(proj, seqReduceScatter(proj, ThL)); }
            else tpAllReduce(proj, Th);
        }
    }
    return proj;
}

Status GptModel::coreAttentionForward(LayerActs& A, const k::AttnDims& ad, TensorPtr q, TensorPtr kk,
                                      TensorPtr v, TensorPtr out) {
    const int64_t outElems = int64_t(ad.s) * ad.b * ad.nq * ad.d;
    const uint64_t qkvoBytes = uint64_t(4) * uint64_t(ad.s) * ad.b * (2 * ad.nq + 2 * ad.nkv) * ad.d;
    const double flops = 4.0 * ad.b * ad.nq * double(ad.s) * ad.s * ad.d;
    const bool bf = m_o.bf16;
    if (m_o.flashAttention) {
        // Only each row's max and 1/sum are kept: nothing of the "5as/h" term, whatever the
        // recompute granularity (the backward rebuilds the probabilities from them).
        TS_ASSIGN_OR_RETURN(TensorPtr stats, allocUninitialized(m_exec, int64_t(k::attentionStatsSize(ad))));
        m_exec.op("core_attention.fwd", Category::Attention, flops, qkvoBytes + uint64_t(4) * k::attentionStatsSize(ad),
                  [=] {
                      k::attentionFlashForward(ad, fp(q), fp(kk), fp(v), fp(stats), fp(out));
                      if (bf) k::roundToBf16(fp(out), outElems);
                  });
        A.attnStats = std::move(stats);
        return Status::ok();
    }
    TS_ASSIGN_OR_RETURN(TensorPtr probs, allocUninitialized(m_exec, int64_t(k::attentionProbsSize(ad))));
    const bool fs = m_o.fusedSoftmax;
    m_exec.op("core_attention.fwd", Category::Attention, flops, qkvoBytes + uint64_t(4) * k::attentionProbsSize(ad),
              [=] {
                  k::attentionForward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(out), fs);
                  if (bf) k::roundToBf16(fp(out), outElems);
              });
    if (m_o.recomputeGranularity != "selective") A.probs = std::move(probs);
    return Status::ok();
}

Status GptModel::coreAttentionBackward(LayerActs& A, const k::AttnDims& ad, TensorPtr q, TensorPtr kk,
                                       TensorPtr v, TensorPtr dout, TensorPtr dq, TensorPtr dk, TensorPtr dv) {
    const double fwdFlops = 4.0 * ad.b * ad.nq * double(ad.s) * ad.s * ad.d;
    if (A.attnStats) {
        TensorPtr stats = A.attnStats;
        TS_ASSIGN_OR_RETURN(TensorPtr scratch, allocUninitialized(m_exec, int64_t(k::attentionFlashScratchSize(ad)),
                                                                  MemCategory::Workspace));
        // The scores GEMM again (a quarter more than the backward's own FLOPs), as flash attention.
        m_exec.op("core_attention.bwd", Category::Attention, 2.5 * fwdFlops,
                  uint64_t(4) * uint64_t(ad.s) * ad.b * (4 * ad.nq + 4 * ad.nkv) * ad.d, [=] {
                      k::attentionFlashBackward(ad, fp(q), fp(kk), fp(v), fp(stats), fp(dout), fp(dq), fp(dk),
                                                fp(dv), fp(scratch));
                  });
        return Status::ok();
    }
    TensorPtr probs = A.probs;
    const bool fs = m_o.fusedSoftmax;
    if (!probs) {
        // Selective recompute: redo QK^T/softmax (the "5as/h" activations were not kept).
        TS_ASSIGN_OR_RETURN(probs, allocUninitialized(m_exec, int64_t(k::attentionProbsSize(ad))));
        TS_ASSIGN_OR_RETURN(TensorPtr ctxTmp, allocUninitialized(m_exec, int64_t(ad.s) * ad.b * ad.nq * ad.d));
        m_exec.op("core_attention.recompute", Category::Attention, fwdFlops, uint64_t(4) * k::attentionProbsSize(ad),
                  [=] { k::attentionForward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(ctxTmp), fs); });
    }
    TS_ASSIGN_OR_RETURN(TensorPtr scratch, allocUninitialized(m_exec, int64_t(k::attentionScratchSize(ad)),
                                                              MemCategory::Workspace));
    m_exec.op("core_attention.bwd", Category::Attention, 2.0 * fwdFlops, uint64_t(8) * k::attentionProbsSize(ad), [=] {
        k::attentionBackward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(dout), fp(dq), fp(dk), fp(dv), fp(scratch), fs);
    });
    return Status::ok();
}

Result<TensorPtr> GptModel::attentionBackward(LayerActs& A, const LayerParams& P, int gl, TensorPtr dproj) {
    const int s = m_d.seq, b = m_d.microBatch, T = s * b, h = m_d.hidden, d = m_d.headDim;
    const int nq = m_nqL, ng = m_ngL;
    const int qkvOut = (nq + 2 * ng) * d;
    const int TL = localTokens();
    const int64_t Th = int64_t(T) * h, ThL = int64_t(TL) * h;
    const bool bf = m_o.bf16;
    // Activations here are fully written by the op that produces them: skip zeroing.
    auto alloc = [&](int64_t n) { return allocUninitialized(m_exec, n); };
    // SP: the backward of the forward reduce-scatter is an all-gather of dY along s.
    const bool agOverlap = m_tpo && m_tpo->options().overlapAg;
    TS_ASSIGN_OR_RETURN(TensorPtr dctx, alloc(int64_t(T) * nq * d));
    const int li = gl - m_ctx.layerBegin;
    const bool fp8 = fp8Layer(li);
    const float* projW = nullptr;
    if (fp8) {
        // The output gradient in FP8 (its bias grad was taken in high precision before).
        TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Proj, kFp8Grad, dproj, ThL));
        TS_ASSIGN_OR_RETURN(projW, fp8Weight(li, kFp8Proj, P.projW));
    }
    if (agOverlap) {
        TS_RETURN_IF_ERROR(rowParallelBackwardOverlapped("linear_proj.dgrad", "linear_proj.wgrad", P.projW, dproj,
                                                         A.ctx, dctx, T, nq * d, h, projW));
    } else {
        if (m_sp) { TS_ASSIGN_OR_RETURN(dproj, seqGather(dproj, ThL)); }
        TS_RETURN_IF_ERROR(linearBackward("linear_proj.bwd", P.projW, -1, dproj, A.ctx, dctx, T, nq * d, h, projW));
    }
    dproj.reset();

    // same dims (and so the same dropout mask) as the forward
    const k::AttnDims ad = attnDims(m_d, m_o, m_ctx, nq, ng, dropSeed(m_exec.microbatch(), gl, 3));
    TS_ASSIGN_OR_RETURN(TensorPtr dq, alloc(int64_t(T) * nq * d));
    TS_ASSIGN_OR_RETURN(TensorPtr dk, alloc(int64_t(T) * ng * d));
    TS_ASSIGN_OR_RETURN(TensorPtr dv, alloc(int64_t(T) * ng * d));
    if (m_ctx.cpSize > 1) {
        TS_RETURN_IF_ERROR(cpCoreAttentionBackward(A, nq, ng, ad, dctx, dq, dk, dv));
    } else {
        TS_RETURN_IF_ERROR(coreAttentionBackward(A, ad, A.q, A.k, A.v, dctx, dq, dk, dv));
    }
    dctx.reset();
    const bool ropeMerge = m_d.rope && m_o.fusedRope;  // rope backward fused into the merge copy
    if (m_d.rope && !ropeMerge) {
        const float theta = m_d.ropeTheta;
        const auto segs = m_ropeSegs;
        m_exec.op("rope.bwd", Category::Elementwise, 6.0 * T * (nq + ng) * d, uint64_t(T) * (nq + ng) * d * 8, [=] {
            for (const auto& sg : segs) {
                const size_t r0 = size_t(sg.start) * size_t(b);
                k::ropeBackward(fp(dq) + r0 * nq * d, sg.len, b, nq, d, theta, sg.pos);
                k::ropeBackward(fp(dk) + r0 * ng * d, sg.len, b, ng, d, theta, sg.pos);
            }
        });
    }
    TS_ASSIGN_OR_RETURN(TensorPtr dqkv, alloc(int64_t(T) * qkvOut));
    if (ropeMerge) {
        const float theta = m_d.ropeTheta;
        const auto segs = m_ropeSegs;
        m_exec.op("qkv_merge_rope.bwd", Category::Elementwise, 6.0 * T * (nq + ng) * d, uint64_t(T) * qkvOut * 8, [=] {
            for (const auto& sg : segs) {
                const size_t r0 = size_t(sg.start) * size_t(b);
                k::ropeBackwardMergeQkv(fp(dq) + r0 * nq * d, fp(dk) + r0 * ng * d, fp(dv) + r0 * ng * d,
                                        fp(dqkv) + r0 * qkvOut, sg.len, b, nq, ng, d, theta, sg.pos);
            }
            if (bf) k::roundToBf16(fp(dqkv), int64_t(T) * qkvOut);
        });
    } else {
        m_exec.op("qkv_merge", Category::Elementwise, 0, uint64_t(T) * qkvOut * 8, [=] {
            k::mergeQkv(fp(dq), fp(dk), fp(dv), fp(dqkv), T, nq, ng, d);
            if (bf) k::roundToBf16(fp(dqkv), int64_t(T) * qkvOut);
        });
    }
    dq.reset(); dk.reset(); dv.reset();
    TensorPtr da1;
    int qkvB = P.qkvB;
    const float* qkvW = nullptr;
    if (fp8) {
        // Bias grad from the high-precision gradient, then the gradient in FP8 (the TP region's
        // [T, qkvOut/t] columns; tensorwise: amax over TP), with or without tp_comm_overlap.
        if (qkvB >= 0) {
            float* GB = m_params.mainGrad(qkvB);
            TensorPtr g = dqkv;
            m_exec.op("linear_qkv.bgrad", Category::Elementwise, double(T) * qkvOut, uint64_t(T) * qkvOut * 4,
                      [=] { k::biasGradAccumulate(fp(g), GB, T, qkvOut); });
            qkvB = -1;
        }
        TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Qkv, kFp8Grad, dqkv, int64_t(T) * qkvOut));
        TS_ASSIGN_OR_RETURN(qkvW, fp8Weight(li, kFp8Qkv, P.qkvW));
    }
    if (m_tpo) {
        TS_ASSIGN_OR_RETURN(da1, columnParallelBackwardOverlapped("linear_qkv.dgrad", "linear_qkv.wgrad", P.qkvW, qkvB,
                                                                  dqkv, A.a1, T, h, qkvOut, qkvW));
    } else {
        TensorPtr a1Full = A.a1;
        if (m_sp) { TS_ASSIGN_OR_RETURN(a1Full, seqGather(A.a1, ThL)); }
        TS_ASSIGN_OR_RETURN(da1, alloc(Th));
        TS_RETURN_IF_ERROR(linearBackward("linear_qkv.bwd", P.qkvW, qkvB, dqkv, a1Full, da1, T, h, qkvOut, qkvW));
        a1Full.reset();
        if (m_sp) { TS_ASSIGN_OR_RETURN(da1, seqReduceScatter(da1, ThL)); }
        else tpAllReduce(da1, Th);
    }
    dqkv.reset();
    return da1;
}

}  // namespace ts::engine
