// GptModel's MLP block: linear_fc1 (column parallel, sequence-parallel all-gather before it),
// bias + GeLU or SwiGLU, linear_fc2 (row parallel, reduce-scatter or all-reduce after it); and
// the backward of each. Its input is the pre_mlp_layernorm output A.a2, its output the
// linear_fc2 output before the bias, which the layer adds in bias-dropout-add.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

namespace ts::engine {

Result<TensorPtr> GptModel::mlpForward(LayerActs& A, const LayerParams& P) {
    const int li = int(&P - m_layers.data());
    const bool fp8 = fp8Layer(li);
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int F = m_ffnL, F1 = m_d.swiglu ? 2 * F : F;
    const int TL = localTokens();
    const int64_t Th = int64_t(T) * h, ThL = int64_t(TL) * h;
    const bool bf = m_o.bf16;
    // Activations here are fully written by the op that produces them: skip zeroing.
    auto alloc = [&](int64_t n) { return allocUninitialized(m_exec, n); };
    // tp_comm_overlap_ag / _rs: the all-gather before linear_fc1 and the reduce-scatter after
    // linear_fc2 are pipelined with the GEMM instead of running before / after it.
    const bool agOverlap = m_tpo && m_tpo->options().overlapAg;
    const bool rsOverlap = m_tpo && m_tpo->options().overlapRs;
    // FP8: the saved input shard is quantized in place (one scale for the whole tensor).
    if (fp8) TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Fc1, kFp8Input, A.a2, ThL));
    TensorPtr a2Full = A.a2;
    if (m_sp && !agOverlap) { TS_ASSIGN_OR_RETURN(a2Full, seqGather(A.a2, ThL)); }
    TS_ASSIGN_OR_RETURN(A.fc1, alloc(int64_t(T) * F1));
    TS_ASSIGN_OR_RETURN(A.act, alloc(int64_t(T) * F));
    {
        const float* W = m_params.modelParam(P.fc1W);
        if (fp8) { TS_ASSIGN_OR_RETURN(W, fp8Weight(li, kFp8Fc1, P.fc1W)); }
        const float* B = P.fc1B >= 0 ? m_params.modelParam(P.fc1B) : nullptr;
        TensorPtr a2 = a2Full, fc1 = A.fc1, act = A.act;
        const bool swiglu = m_d.swiglu, fusedAct = m_o.fusedBiasAct;
        const Fp8Recipe r8 = m_o.fp8;
        const bool blk = fp8 && r8.isBlock();  // block recipes: the input quantized per block here
        auto gemm = [=](const float* x, float* y, int rows) {
            std::vector<float> q;
            if (blk) x = fp8BlockOperand(r8, x, rows, h, true, false, false, q);
            k::linearForward(x, W, nullptr, y, rows, h, F1);
            if (bf) k::roundToBf16(y, int64_t(rows) * F1);
        };
        if (agOverlap) {
            TS_RETURN_IF_ERROR(m_tpo->agGemm("linear_fc1.fwd", A.a2, TL, h, fc1, F1, 2.0 * h * F1, gemm).status());
        } else {
            m_exec.op("linear_fc1.fwd", Category::Gemm, 2.0 * T * h * F1,
                      uint64_t(4) * (uint64_t(T) * (h + F1) + uint64_t(h) * F1), [=] { gemm(fp(a2), fp(fc1), T); });
        }
        m_exec.op(swiglu ? "bias_swiglu.fwd" : "bias_gelu.fwd", Category::Elementwise, 10.0 * T * F,
                  uint64_t(T) * (F1 + F) * 4, [=] {
                      if (swiglu) {
                          if (B) k::addBias(fp(fc1), B, T, F1);  // saved fc1 includes the bias
                          k::swigluForward(fp(fc1), fp(act), T, F);
                      } else if (fusedAct) {
                          k::biasGeluForward(fp(fc1), B, fp(act), T, F);
                      } else {
                          k::biasGeluForwardUnfused(fp(fc1), B, fp(act), T, F);
                      }
                      if (bf) k::roundToBf16(fp(act), int64_t(T) * F);
                  });
    }
    a2Full.reset();
    TensorPtr fc2;
    {
        const float* W = m_params.modelParam(P.fc2W);
        if (fp8) {
            TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Fc2, kFp8Input, A.act, int64_t(T) * F));
            TS_ASSIGN_OR_RETURN(W, fp8Weight(li, kFp8Fc2, P.fc2W));
        }
        TensorPtr act = A.act;
        const Fp8Recipe r8 = m_o.fp8;
        const bool blk = fp8 && r8.isBlock();
        auto gemm = [=](const float* x, float* y, int rows) {
            std::vector<float> q;
            if (blk) x = fp8BlockOperand(r8, x, rows, F, true, false, false, q);
            k::linearForward(x, W, nullptr, y, rows, F, h);
        };
        if (rsOverlap) {
            TS_ASSIGN_OR_RETURN(fc2, m_tpo->gemmRs("linear_fc2.fwd", act, TL, F, h, 2.0 * F * h, gemm));
        } else {
            TS_ASSIGN_OR_RETURN(fc2, alloc(Th));
            TensorPtr y = fc2;
            m_exec.op("linear_fc2.fwd", Category::Gemm, 2.0 * T * F * h,
                      uint64_t(4) * (uint64_t(T) * (F + h) + uint64_t(F) * h), [=] { gemm(fp(act), fp(y), T); });
            if (m_sp) { TS_ASSIGN_OR_RETURN(fc2, seqReduceScatter(fc2, ThL)); }
            else tpAllReduce(fc2, Th);
        }
    }
    return fc2;
}

Result<TensorPtr> GptModel::mlpBackward(LayerActs& A, const LayerParams& P, TensorPtr dfc2) {
    const int li = int(&P - m_layers.data());
    const bool fp8 = fp8Layer(li);
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int F = m_ffnL, F1 = m_d.swiglu ? 2 * F : F;
    const int TL = localTokens();
    const int64_t Th = int64_t(T) * h, ThL = int64_t(TL) * h;
    const bool bf = m_o.bf16;
    // Activations here are fully written by the op that produces them: skip zeroing.
    auto alloc = [&](int64_t n) { return allocUninitialized(m_exec, n); };
    // SP: the backward of the forward reduce-scatter is an all-gather of dY along s.
    const bool agOverlap = m_tpo && m_tpo->options().overlapAg;
    TS_ASSIGN_OR_RETURN(TensorPtr dact, alloc(int64_t(T) * F));
    const float* fc2W = nullptr;
    if (fp8) {
        TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Fc2, kFp8Grad, dfc2, ThL));
        TS_ASSIGN_OR_RETURN(fc2W, fp8Weight(li, kFp8Fc2, P.fc2W));
    }
    if (agOverlap) {
        TS_RETURN_IF_ERROR(rowParallelBackwardOverlapped("linear_fc2.dgrad", "linear_fc2.wgrad", P.fc2W, dfc2, A.act,
                                                         dact, T, F, h));
    } else {
        if (m_sp) { TS_ASSIGN_OR_RETURN(dfc2, seqGather(dfc2, ThL)); }
        TS_RETURN_IF_ERROR(linearBackward("linear_fc2.bwd", P.fc2W, -1, dfc2, A.act, dact, T, F, h, fc2W));
    }
    dfc2.reset();
    TS_ASSIGN_OR_RETURN(TensorPtr dfc1, alloc(int64_t(T) * F1));
    {
        float* GB = P.fc1B >= 0 ? m_params.mainGrad(P.fc1B) : nullptr;
        const float* B = P.fc1B >= 0 ? m_params.modelParam(P.fc1B) : nullptr;
        TensorPtr fc1 = A.fc1;
        const bool swiglu = m_d.swiglu;
        m_exec.op(swiglu ? "bias_swiglu.bwd" : "bias_gelu.bwd", Category::Elementwise, 16.0 * T * F,
                  uint64_t(T) * (2 * F1 + F) * 4, [=] {
                      if (swiglu) {
                          k::swigluBackward(fp(dact), fp(fc1), fp(dfc1), T, F);
                          if (GB) k::biasGradAccumulate(fp(dfc1), GB, T, F1);
                      } else {
                          k::biasGeluBackward(fp(dact), fp(fc1), B, fp(dfc1), GB, T, F);
                      }
                      if (bf) k::roundToBf16(fp(dfc1), int64_t(T) * F1);
                  });
    }
    dact.reset();
    // SP: re-gather the saved local input [TL, h] -> [T, h] for the wgrad (Korthikanti §4.2.2).
    TensorPtr da2;
    if (m_tpo) {
        TS_ASSIGN_OR_RETURN(da2, columnParallelBackwardOverlapped("linear_fc1.dgrad", "linear_fc1.wgrad", P.fc1W, -1,
                                                                  dfc1, A.a2, T, h, F1));
    } else {
        const float* fc1W = nullptr;
        if (fp8) {
            TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Fc1, kFp8Grad, dfc1, int64_t(T) * F1));
            TS_ASSIGN_OR_RETURN(fc1W, fp8Weight(li, kFp8Fc1, P.fc1W));
        }
        TensorPtr a2Full = A.a2;
        if (m_sp) { TS_ASSIGN_OR_RETURN(a2Full, seqGather(A.a2, ThL)); }
        TS_ASSIGN_OR_RETURN(da2, alloc(Th));
        TS_RETURN_IF_ERROR(linearBackward("linear_fc1.bwd", P.fc1W, -1, dfc1, a2Full, da2, T, h, F1, fc1W));
        a2Full.reset();
        if (m_sp) { TS_ASSIGN_OR_RETURN(da2, seqReduceScatter(da2, ThL)); }
        else tpAllReduce(da2, Th);
    }
    dfc1.reset();
    return da2;
}

}  // namespace ts::engine
