// GptModel's MLP block: linear_fc1 (column parallel, sequence-parallel all-gather before it),
// bias + GeLU or SwiGLU, linear_fc2 (row parallel, reduce-scatter or all-reduce after it); and
// the backward of each. Its input is the pre_mlp_layernorm output A.a2, its output the
// linear_fc2 output before the bias, which the layer adds in bias-dropout-add.
// The same code runs an MoE layer's shared experts (Megatron's SharedExpertMLP, an MLP with
// ffn_hidden_size = moe_shared_expert_intermediate_size and its own SP collectives), with their
// optional gate: output *= sigmoid(x w_gate) per token, x the SP-local input.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

namespace ts::engine {

// Op names of the two kinds of MLP (string literals: the trace keeps the pointers).
struct MlpOpNames {
    const char *fc1Fwd, *swigluFwd, *geluFwd, *fc2Fwd;
    const char *fc2Dgrad, *fc2Wgrad, *fc2Bwd, *swigluBwd, *geluBwd, *fc1Dgrad, *fc1Wgrad, *fc1Bwd;
};

namespace {

const MlpOpNames* denseNames() {
    static const MlpOpNames n{"linear_fc1.fwd",   "bias_swiglu.fwd",  "bias_gelu.fwd",    "linear_fc2.fwd",
                                        "linear_fc2.dgrad", "linear_fc2.wgrad", "linear_fc2.bwd",   "bias_swiglu.bwd",
                                        "bias_gelu.bwd",    "linear_fc1.dgrad", "linear_fc1.wgrad", "linear_fc1.bwd"};
    return &n;
}

const MlpOpNames* sharedNames() {
    static const MlpOpNames n{
        "shared_experts.linear_fc1.fwd",   "shared_experts.bias_swiglu.fwd",   "shared_experts.bias_gelu.fwd",
        "shared_experts.linear_fc2.fwd",   "shared_experts.linear_fc2.dgrad",  "shared_experts.linear_fc2.wgrad",
        "shared_experts.linear_fc2.bwd",   "shared_experts.bias_swiglu.bwd",   "shared_experts.bias_gelu.bwd",
        "shared_experts.linear_fc1.dgrad", "shared_experts.linear_fc1.wgrad",  "shared_experts.linear_fc1.bwd"};
    return &n;
}

}  // namespace

Result<TensorPtr> GptModel::mlpForward(LayerActs& A, const LayerParams& P) {
    const int li = int(&P - m_layers.data());
    const MlpWeights W{P.fc1W, P.fc1B, P.fc2W, m_ffnL, fp8Layer(li), denseNames()};
    return mlpBlockForward(li, W, A.a2, &A.fc1, &A.act);
}

Result<TensorPtr> GptModel::mlpBackward(LayerActs& A, const LayerParams& P, TensorPtr dfc2) {
    const int li = int(&P - m_layers.data());
    const MlpWeights W{P.fc1W, P.fc1B, P.fc2W, m_ffnL, fp8Layer(li), denseNames()};
    return mlpBlockBackward(li, W, A.a2, A.fc1, A.act, std::move(dfc2));
}

Result<TensorPtr> GptModel::mlpBlockForward(int li, const MlpWeights& MW, const TensorPtr& xLocal, TensorPtr* fc1Out,
                                            TensorPtr* actOut) {
    const bool fp8 = MW.fp8;
    const MlpOpNames& N = *MW.names;
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int F = MW.ffnL, F1 = m_d.swiglu ? 2 * F : F;
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
    if (fp8) TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Fc1, kFp8Input, xLocal, ThL));
    TensorPtr a2Full = xLocal;
    if (m_sp && !agOverlap) { TS_ASSIGN_OR_RETURN(a2Full, seqGather(xLocal, ThL)); }
    TS_ASSIGN_OR_RETURN(*fc1Out, alloc(int64_t(T) * F1));
    TS_ASSIGN_OR_RETURN(*actOut, alloc(int64_t(T) * F));
    {
        const float* W = nullptr;
        if (fp8) { TS_ASSIGN_OR_RETURN(W, fp8Weight(li, kFp8Fc1, MW.fc1W)); }
        else W = m_params.modelParam(MW.fc1W);
        const float* B = MW.fc1B >= 0 ? m_params.modelParam(MW.fc1B) : nullptr;
        TensorPtr a2 = a2Full, fc1 = *fc1Out, act = *actOut;
        const bool swiglu = m_d.swiglu, fusedAct = m_o.fusedBiasAct;
        const Fp8Recipe r8 = m_o.fp8;
        const bool blk = fp8 && r8.isBlock();  // block recipes: the input quantized per block here
        TensorPtr q8;  // the quantized input rows (the GEMM chunks run in order on the compute stream)
        if (blk) { TS_ASSIGN_OR_RETURN(q8, allocUninitialized(m_exec, int64_t(T) * h, MemCategory::Workspace)); }
        const bool fp32 = fp8 && !fp8GemmsBf16();  // FP8 operands the bf16 GEMMs would round
        auto gemm = [=](const float* x, float* y, int rows) {
            k::Fp32GemmScope gemms(fp32);
            if (blk) x = fp8BlockOperand(r8, x, rows, h, true, false, false, fp(q8));
            k::linearForward(x, W, nullptr, y, rows, h, F1);
            if (bf) k::roundToBf16(y, int64_t(rows) * F1);
        };
        if (agOverlap) {
            TS_RETURN_IF_ERROR(m_tpo->agGemm(N.fc1Fwd, xLocal, TL, h, fc1, F1, 2.0 * h * F1, gemm).status());
        } else {
            m_exec.op(N.fc1Fwd, Category::Gemm, 2.0 * T * h * F1,
                      uint64_t(4) * (uint64_t(T) * (h + F1) + uint64_t(h) * F1), [=] { gemm(fp(a2), fp(fc1), T); });
        }
        m_exec.op(swiglu ? N.swigluFwd : N.geluFwd, Category::Elementwise, 10.0 * T * F,
                  uint64_t(T) * (F1 + F) * 4, [=] {
                      if (swiglu) {
                          if (B) k::addBias(fp(fc1), B, T, F1);  // saved fc1 includes the bias
                          k::swigluForward(fp(fc1), fp(act), T, F, bf);
                      } else if (fusedAct) {
                          k::biasGeluForward(fp(fc1), B, fp(act), T, F, bf);
                      } else {
                          // (unfused: the rounding a pass of its own, as the bias add's)
                          k::biasGeluForwardUnfused(fp(fc1), B, fp(act), T, F);
                          if (bf) k::roundToBf16(fp(act), int64_t(T) * F);
                      }
                  });
    }
    a2Full.reset();
    TensorPtr fc2;
    {
        const float* W = nullptr;
        if (fp8) {
            TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Fc2, kFp8Input, *actOut, int64_t(T) * F));
            TS_ASSIGN_OR_RETURN(W, fp8Weight(li, kFp8Fc2, MW.fc2W));
        } else {
            W = m_params.modelParam(MW.fc2W);
        }
        TensorPtr act = *actOut;
        const Fp8Recipe r8 = m_o.fp8;
        const bool blk = fp8 && r8.isBlock();
        TensorPtr q8;
        if (blk) { TS_ASSIGN_OR_RETURN(q8, allocUninitialized(m_exec, int64_t(T) * F, MemCategory::Workspace)); }
        const bool fp32 = fp8 && !fp8GemmsBf16();  // FP8 operands the bf16 GEMMs would round
        auto gemm = [=](const float* x, float* y, int rows) {
            k::Fp32GemmScope gemms(fp32);
            if (blk) x = fp8BlockOperand(r8, x, rows, F, true, false, false, fp(q8));
            k::linearForward(x, W, nullptr, y, rows, F, h);
        };
        if (rsOverlap) {
            TS_ASSIGN_OR_RETURN(fc2, m_tpo->gemmRs(N.fc2Fwd, act, TL, F, h, 2.0 * F * h, gemm));
        } else {
            TS_ASSIGN_OR_RETURN(fc2, alloc(Th));
            TensorPtr y = fc2;
            m_exec.op(N.fc2Fwd, Category::Gemm, 2.0 * T * F * h,
                      uint64_t(4) * (uint64_t(T) * (F + h) + uint64_t(F) * h), [=] { gemm(fp(act), fp(y), T); });
            if (m_sp) { TS_ASSIGN_OR_RETURN(fc2, seqReduceScatter(fc2, ThL)); }
            else tpAllReduce(fc2, Th);
        }
    }
    return fc2;
}

Result<TensorPtr> GptModel::mlpBlockBackward(int li, const MlpWeights& MW, const TensorPtr& xLocal,
                                             const TensorPtr& fc1Saved, const TensorPtr& actSaved, TensorPtr dfc2) {
    const bool fp8 = MW.fp8;
    const MlpOpNames& N = *MW.names;
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int F = MW.ffnL, F1 = m_d.swiglu ? 2 * F : F;
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
        TS_ASSIGN_OR_RETURN(fc2W, fp8Weight(li, kFp8Fc2, MW.fc2W));
    }
    if (agOverlap) {
        TS_RETURN_IF_ERROR(rowParallelBackwardOverlapped(N.fc2Dgrad, N.fc2Wgrad, MW.fc2W, dfc2, actSaved,
                                                         dact, T, F, h, fc2W));
    } else {
        if (m_sp) { TS_ASSIGN_OR_RETURN(dfc2, seqGather(dfc2, ThL)); }
        TS_RETURN_IF_ERROR(linearBackward(N.fc2Bwd, MW.fc2W, -1, dfc2, actSaved, dact, T, F, h, fc2W));
    }
    dfc2.reset();
    TS_ASSIGN_OR_RETURN(TensorPtr dfc1, alloc(int64_t(T) * F1));
    {
        float* GB = MW.fc1B >= 0 ? m_params.mainGrad(MW.fc1B) : nullptr;
        const float* B = MW.fc1B >= 0 ? m_params.modelParam(MW.fc1B) : nullptr;
        TensorPtr fc1 = fc1Saved;
        const bool swiglu = m_d.swiglu;
        m_exec.op(swiglu ? N.swigluBwd : N.geluBwd, Category::Elementwise, 16.0 * T * F,
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
    const float* fc1W = nullptr;
    if (fp8) {
        TS_RETURN_IF_ERROR(fp8Quantize(li, kFp8Fc1, kFp8Grad, dfc1, int64_t(T) * F1));
        TS_ASSIGN_OR_RETURN(fc1W, fp8Weight(li, kFp8Fc1, MW.fc1W));
    }
    if (m_tpo) {
        TS_ASSIGN_OR_RETURN(da2, columnParallelBackwardOverlapped(N.fc1Dgrad, N.fc1Wgrad, MW.fc1W, -1, dfc1, xLocal, T,
                                                                  h, F1, fc1W));
    } else {
        TensorPtr a2Full = xLocal;
        if (m_sp) { TS_ASSIGN_OR_RETURN(a2Full, seqGather(xLocal, ThL)); }
        TS_ASSIGN_OR_RETURN(da2, alloc(Th));
        TS_RETURN_IF_ERROR(linearBackward(N.fc1Bwd, MW.fc1W, -1, dfc1, a2Full, da2, T, h, F1, fc1W));
        a2Full.reset();
        if (m_sp) { TS_ASSIGN_OR_RETURN(da2, seqReduceScatter(da2, ThL)); }
        else tpAllReduce(da2, Th);
    }
    dfc1.reset();
    return da2;
}

// Shared experts (Megatron's SharedExpertMLP.forward): the MLP on the layer's SP-local input with
// the shared weights; with the gate, output = mlp(x) * sigmoid(x w_gate) per token (the gate
// weight is replicated over TP and sees this rank's rows only: its grad is summed over TP).
Result<TensorPtr> GptModel::sharedExpertForward(LayerActs& A, const LayerParams& P) {
    const int li = int(&P - m_layers.data());
    const MlpWeights W{P.shFc1W, -1, P.shFc2W, m_sharedFfnL, fp8Layer(li), sharedNames()};
    // FP8 quantizes the MLP's saved input in place; the shared experts share a2 with the router
    // and the routed experts, so they quantize a copy of it (TE's FP8 cast of their input).
    TensorPtr xIn = A.a2;
    A.shX.reset();
    if (W.fp8) {
        const int64_t n = int64_t(localTokens()) * m_d.hidden;
        TS_ASSIGN_OR_RETURN(A.shX, allocUninitialized(m_exec, n));
        TensorPtr src = A.a2, dst = A.shX;
        m_exec.op("shared_experts.input_copy", Category::Elementwise, 0, uint64_t(n) * 8,
                  [=] { k::copyBytes(fp(dst), fp(src), size_t(n) * sizeof(float)); });
        xIn = A.shX;
    }
    TS_ASSIGN_OR_RETURN(TensorPtr y, mlpBlockForward(li, W, xIn, &A.shFc1, &A.shAct));
    if (P.shGateW < 0) return y;
    const int TL = localTokens(), h = m_d.hidden;
    const bool bf = m_o.bf16;
    TS_ASSIGN_OR_RETURN(A.shGate, allocUninitialized(m_exec, TL));
    TS_ASSIGN_OR_RETURN(TensorPtr out, allocUninitialized(m_exec, int64_t(TL) * h));
    A.shOut = y;
    const float* Wg = m_params.modelParam(P.shGateW);
    TensorPtr x = A.a2, gate = A.shGate;
    // x: [TL, h], w_gate: [1, h] -> gate [TL]; out = y * gate (row-wise)
    m_exec.op("shared_experts.gate.fwd", Category::Elementwise, 4.0 * TL * h, uint64_t(TL) * h * 12, [=] {
        k::sigmoidGateForward(fp(x), Wg, fp(y), fp(gate), fp(out), TL, h, bf);
        if (bf) k::roundToBf16(fp(out), int64_t(TL) * h);
    });
    return out;
}

Result<TensorPtr> GptModel::sharedExpertBackward(LayerActs& A, const LayerParams& P, TensorPtr dout) {
    const int li = int(&P - m_layers.data());
    const MlpWeights W{P.shFc1W, -1, P.shFc2W, m_sharedFfnL, fp8Layer(li), sharedNames()};
    if (!A.shFc1) return Status::internal("shared experts backward without saved activations");
    const int TL = localTokens(), h = m_d.hidden;
    const int64_t ThL = int64_t(TL) * h;
    const bool bf = m_o.bf16;
    TensorPtr dy = dout, dxGate;
    if (P.shGateW >= 0) {
        // d(mlp out) = dout * g; dz = sum_i dout_i y_i * g (1 - g); dw_gate += dz x; dx += dz w_gate.
        TS_ASSIGN_OR_RETURN(dy, allocUninitialized(m_exec, ThL));
        TS_ASSIGN_OR_RETURN(dxGate, allocUninitialized(m_exec, ThL));
        const float* Wg = m_params.modelParam(P.shGateW);
        float* Gg = m_params.mainGrad(P.shGateW);
        TensorPtr x = A.a2, gate = A.shGate, y = A.shOut, dyOut = dy, dxg = dxGate;
        m_exec.op("shared_experts.gate.bwd", Category::Elementwise, 8.0 * ThL, uint64_t(ThL) * 20, [=] {
            k::sigmoidGateBackward(fp(dout), fp(y), fp(x), fp(gate), Wg, fp(dyOut), fp(dxg), Gg, TL, h);
            if (bf) {
                k::roundToBf16(fp(dyOut), ThL);
                k::roundToBf16(fp(dxg), ThL);
            }
        });
    }
    if (W.fp8 && dy == dout) {
        // FP8 quantizes the output gradient in place; the routed experts read the same dout.
        TS_ASSIGN_OR_RETURN(dy, allocUninitialized(m_exec, ThL));
        TensorPtr src = dout, dst = dy;
        m_exec.op("shared_experts.grad_copy", Category::Elementwise, 0, uint64_t(ThL) * 8,
                  [=] { k::copyBytes(fp(dst), fp(src), size_t(ThL) * sizeof(float)); });
    }
    dout.reset();
    TS_ASSIGN_OR_RETURN(TensorPtr dx, mlpBlockBackward(li, W, A.shX ? A.shX : A.a2, A.shFc1, A.shAct, std::move(dy)));
    if (dxGate) {
        m_exec.op("shared_experts.gate.dgrad_add", Category::Elementwise, double(ThL), uint64_t(ThL) * 12, [=] {
            k::addInPlace(fp(dx), fp(dxGate), ThL);
            if (bf) k::roundToBf16(fp(dx), ThL);
        });
    }
    return dx;
}

}  // namespace ts::engine
