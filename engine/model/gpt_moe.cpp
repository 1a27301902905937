// GptModel's MoE block (Megatron's MoELayer with its TopKRouter and experts; REFERENCE.md §5),
// in place of the MLP on every layer when num_moe_experts > 0 (moe_layer_freq 1):
//   router: logits = x W_r^T (fp32); top-k per token on the logits, probs = softmax over the k
//     chosen (Megatron's default: post-softmax, renormalised); the Switch load-balancing aux loss
//     aux = E*coeff/(k*T^2) * sum_i (sum_x s_xi) c_i with the full softmax s and the tokens per
//     expert c_i; the z-loss coeff/T * sum_x logsumexp(logits_x)^2. Neither is added to the LM
//     loss: as MoEAuxLossAutoScaler does, their gradients join the backward scaled like the
//     main loss (1/num_microbatches), and their values are counters of the trace.
//   dispatch (dropless): token copies sorted expert-major, token-ascending (Megatron's permute);
//   experts: fc1 -> GeLU/SwiGLU -> multiply by the token's prob -> fc2, per expert
//     (moe_grouped_gemm: one op over all experts; else one op per expert — same math);
//   combine: scatter-add of the k expert outputs back to each token, in permuted order.
// This version runs experts on every rank (expert_model_parallel_size 1, tensor parallel 1,
// no expert biases, dropless): modelDimsFromConfig refuses the rest with the knob to change.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

#include "common/clock.h"

namespace ts::engine {

// What the backward needs from one MoE forward (host-side routing lives here; the ops fill it).
struct GptModel::MoeSaved {
    int T = 0, E = 0, k = 0;
    std::vector<int> tokenOf;    // [T*k] permuted row -> token
    std::vector<int> expertOf;   // [T*k] permuted row -> expert
    std::vector<int> offset;     // [E+1] first permuted row of each expert
    std::vector<float> prob;     // [T*k] the row's routing prob
    std::vector<int> slotOf;     // [T*k] which of the token's k choices
    std::vector<float> topv;     // [T*k] the chosen logits (token-major)
    std::vector<int> topi;       // [T*k] the chosen experts (token-major)
    TensorPtr logits;            // [T, E]
    TensorPtr xp, fc1, act;      // permuted input [T*k, h], fc1 output [T*k, F1], activation [T*k, F]
};

namespace {

// Softmax of v[0..n) into out, in double.
void softmax(const float* v, int n, double* out) {
    double mx = v[0];
    for (int i = 1; i < n; ++i) mx = std::max(mx, double(v[i]));
    double s = 0;
    for (int i = 0; i < n; ++i) s += (out[i] = std::exp(double(v[i]) - mx));
    for (int i = 0; i < n; ++i) out[i] /= s;
}

}  // namespace

Result<TensorPtr> GptModel::moeForward(LayerActs& A, const LayerParams& P, int gl) {
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int E = m_cfg.num_moe_experts, K = m_cfg.moe_router_topk;
    const int F = m_moeFfn, F1 = m_d.swiglu ? 2 * F : F;
    const bool bf = m_o.bf16, swiglu = m_d.swiglu, grouped = m_cfg.moe_grouped_gemm;
    auto s = std::make_shared<MoeSaved>();
    s->T = T;
    s->E = E;
    s->k = K;
    A.moe = s;
    TS_ASSIGN_OR_RETURN(s->logits, allocUninitialized(m_exec, int64_t(T) * E));
    TS_ASSIGN_OR_RETURN(s->xp, allocUninitialized(m_exec, int64_t(T) * K * h));
    TS_ASSIGN_OR_RETURN(s->fc1, allocUninitialized(m_exec, int64_t(T) * K * F1));
    TS_ASSIGN_OR_RETURN(s->act, allocUninitialized(m_exec, int64_t(T) * K * F));
    TS_ASSIGN_OR_RETURN(TensorPtr out, m_exec.alloc(int64_t(T) * h));
    TS_ASSIGN_OR_RETURN(TensorPtr outp, allocUninitialized(m_exec, int64_t(T) * K * h));
    TensorPtr x = A.a2;
    const float* Wr = m_params.modelParam(P.routerW);
    const double auxCoeff = m_cfg.moe_router_load_balancing_type == "aux_loss" ? m_cfg.moe_aux_loss_coeff : 0.0;
    const double zCoeff = m_cfg.moe_z_loss_coeff;
    const TraceTarget tt = m_exec.device().traceTarget();
    m_exec.op("router.fwd", Category::Gemm, 2.0 * T * h * E, uint64_t(4) * (uint64_t(T) * (h + E) + uint64_t(E) * h),
              [=] { k::linearForward(fp(x), Wr, nullptr, fp(s->logits), T, h, E); });
    m_exec.op("router.topk_permute", Category::Elementwise, double(T) * E * 4, uint64_t(T) * (E + K * h) * 4, [=] {
        const float* L = fp(s->logits);
        s->topv.assign(size_t(T) * K, 0.f);
        s->topi.assign(size_t(T) * K, 0);
        std::vector<int> counts(static_cast<size_t>(E), 0);
        std::vector<int> order(static_cast<size_t>(E));
        std::vector<double> full(static_cast<size_t>(E));
        double probSum[64] = {};
        std::vector<double> P(static_cast<size_t>(E), 0.0);  // sum over tokens of the full softmax
        double z = 0;
        for (int t = 0; t < T; ++t) {
            const float* l = L + size_t(t) * E;
            for (int e = 0; e < E; ++e) order[size_t(e)] = e;
            // top-k by logit, ties to the lower expert index
            std::partial_sort(order.begin(), order.begin() + K, order.end(),
                              [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
            for (int j = 0; j < K; ++j) {
                s->topi[size_t(t) * K + size_t(j)] = order[size_t(j)];
                s->topv[size_t(t) * K + size_t(j)] = l[order[size_t(j)]];
                counts[size_t(order[size_t(j)])]++;
            }
            softmax(l, E, full.data());
            for (int e = 0; e < E; ++e) P[size_t(e)] += full[size_t(e)];
            double mx = l[0];
            for (int e = 1; e < E; ++e) mx = std::max(mx, double(l[e]));
            double se = 0;
            for (int e = 0; e < E; ++e) se += std::exp(double(l[e]) - mx);
            const double lse = mx + std::log(se);
            z += lse * lse;
        }
        (void)probSum;
        // expert-major, token-ascending permutation
        s->offset.assign(size_t(E) + 1, 0);
        for (int e = 0; e < E; ++e) s->offset[size_t(e) + 1] = s->offset[size_t(e)] + counts[size_t(e)];
        std::vector<int> fill(s->offset.begin(), s->offset.end() - 1);
        s->tokenOf.assign(size_t(T) * K, 0);
        s->expertOf.assign(size_t(T) * K, 0);
        s->prob.assign(size_t(T) * K, 0.f);
        s->slotOf.assign(size_t(T) * K, 0);
        std::vector<double> kp(static_cast<size_t>(K));
        for (int t = 0; t < T; ++t) {
            softmax(s->topv.data() + size_t(t) * K, K, kp.data());
            for (int j = 0; j < K; ++j) {
                const int e = s->topi[size_t(t) * K + size_t(j)];
                const int r = fill[size_t(e)]++;
                s->tokenOf[size_t(r)] = t;
                s->expertOf[size_t(r)] = e;
                s->slotOf[size_t(r)] = j;
                float p = float(kp[size_t(j)]);
                if (bf) k::roundToBf16(&p, 1);
                s->prob[size_t(r)] = p;
                std::memcpy(fp(s->xp) + size_t(r) * h, fp(x) + size_t(t) * h, size_t(h) * sizeof(float));
            }
        }
        if (tt.recorder) {
            double aux = 0;
            for (int e = 0; e < E; ++e) aux += P[size_t(e)] * counts[size_t(e)];
            aux *= double(E) * auxCoeff / (double(K) * double(T) * double(T));
            const int64_t ts = monotonicNs();
            const std::string base = "moe.layer" + std::to_string(gl) + ".";
            tt.recorder->counter({tt.rank, tt.recorder->intern(base + "aux_loss"), ts, aux});
            tt.recorder->counter({tt.rank, tt.recorder->intern(base + "z_loss"), ts, zCoeff * z / double(T)});
            for (int e = 0; e < E; ++e)
                tt.recorder->counter({tt.rank, tt.recorder->intern(base + "tokens.expert" + std::to_string(e)), ts,
                                      double(counts[size_t(e)])});
        }
    });
    // experts: fc1 -> activation -> * prob -> fc2, rows [offset[e], offset[e+1])
    std::vector<const float*> W1(static_cast<size_t>(E)), W2(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        W1[size_t(e)] = m_params.modelParam(P.expFc1W[size_t(e)]);
        W2[size_t(e)] = m_params.modelParam(P.expFc2W[size_t(e)]);
    }
    auto expert = [=](int e) {
        const int r0 = s->offset[size_t(e)], rows = s->offset[size_t(e) + 1] - r0;
        if (rows == 0) return;
        float* f1 = fp(s->fc1) + size_t(r0) * F1;
        float* ac = fp(s->act) + size_t(r0) * F;
        k::linearForward(fp(s->xp) + size_t(r0) * h, W1[size_t(e)], nullptr, f1, rows, h, F1);
        if (bf) k::roundToBf16(f1, int64_t(rows) * F1);
        if (swiglu) k::swigluForward(f1, ac, rows, F);
        else k::biasGeluForward(f1, nullptr, ac, rows, F);
        if (bf) k::roundToBf16(ac, int64_t(rows) * F);
        std::vector<float> scaled(static_cast<size_t>(rows) * F);
        for (int r = 0; r < rows; ++r)
            for (int f = 0; f < F; ++f) scaled[size_t(r) * F + f] = ac[size_t(r) * F + f] * s->prob[size_t(r0 + r)];
        if (bf) k::roundToBf16(scaled.data(), int64_t(rows) * F);
        k::linearForward(scaled.data(), W2[size_t(e)], nullptr, fp(outp) + size_t(r0) * h, rows, F, h);
    };
    // Average FLOPs of the experts' GEMMs (the routing is known only when the ops run).
    const double expertFlops = 2.0 * T * K * (double(h) * F1 + double(F) * h);
    if (grouped) {
        m_exec.op("experts.grouped_mlp.fwd", Category::Gemm, expertFlops, uint64_t(T) * K * (h + F1 + F) * 4, [=] {
            for (int e = 0; e < E; ++e) expert(e);
        });
    } else {
        for (int e = 0; e < E; ++e)
            m_exec.op("experts.local_expert.fwd", Category::Gemm, expertFlops / E, uint64_t(T) * K * (h + F1 + F) * 4 / E,
                      [=] { expert(e); });
    }
    m_exec.op("moe.unpermute", Category::Elementwise, double(T) * K * h, uint64_t(T) * K * h * 8, [=] {
        float* o = fp(out);
        for (int r = 0; r < T * K; ++r) {
            const int t = s->tokenOf[size_t(r)];
            const float* src = fp(outp) + size_t(r) * h;
            for (int i = 0; i < h; ++i) o[size_t(t) * h + i] += src[i];
        }
        if (bf) k::roundToBf16(o, int64_t(T) * h);
    });
    return out;
}

Result<TensorPtr> GptModel::moeBackward(LayerActs& A, const LayerParams& P, TensorPtr dout) {
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int E = m_cfg.num_moe_experts, K = m_cfg.moe_router_topk;
    const int F = m_moeFfn, F1 = m_d.swiglu ? 2 * F : F;
    const bool bf = m_o.bf16, swiglu = m_d.swiglu, grouped = m_cfg.moe_grouped_gemm;
    std::shared_ptr<MoeSaved> s = A.moe;
    if (!s) return Status::internal("MoE backward without saved activations");
    TensorPtr x = A.a2;
    TS_ASSIGN_OR_RETURN(TensorPtr dx, m_exec.alloc(int64_t(T) * h));
    TS_ASSIGN_OR_RETURN(TensorPtr dxp, allocUninitialized(m_exec, int64_t(T) * K * h));
    auto dprob = std::make_shared<std::vector<float>>(size_t(T) * K, 0.f);  // per permuted row
    std::vector<const float*> W1(static_cast<size_t>(E)), W2(static_cast<size_t>(E));
    std::vector<float*> G1(static_cast<size_t>(E)), G2(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
        W1[size_t(e)] = m_params.modelParam(P.expFc1W[size_t(e)]);
        W2[size_t(e)] = m_params.modelParam(P.expFc2W[size_t(e)]);
        G1[size_t(e)] = m_params.mainGrad(P.expFc1W[size_t(e)]);
        G2[size_t(e)] = m_params.mainGrad(P.expFc2W[size_t(e)]);
    }
    auto expert = [=](int e) {
        const int r0 = s->offset[size_t(e)], rows = s->offset[size_t(e) + 1] - r0;
        if (rows == 0) return;
        const float* ac = fp(s->act) + size_t(r0) * F;
        std::vector<float> dy(static_cast<size_t>(rows) * h), scaled(size_t(rows) * F), da(size_t(rows) * F), dact(size_t(rows) * F),
            dfc1(size_t(rows) * F1);
        for (int r = 0; r < rows; ++r) {
            std::memcpy(dy.data() + size_t(r) * h, fp(dout) + size_t(s->tokenOf[size_t(r0 + r)]) * h,
                        size_t(h) * sizeof(float));
            for (int f = 0; f < F; ++f) scaled[size_t(r) * F + f] = ac[size_t(r) * F + f] * s->prob[size_t(r0 + r)];
        }
        if (bf) k::roundToBf16(scaled.data(), int64_t(rows) * F);
        k::linearBackward(dy.data(), scaled.data(), W2[size_t(e)], da.data(), G2[size_t(e)], nullptr, rows, F, h);
        for (int r = 0; r < rows; ++r) {
            double dp = 0;
            const float p = s->prob[size_t(r0 + r)];
            for (int f = 0; f < F; ++f) {
                dp += double(da[size_t(r) * F + f]) * ac[size_t(r) * F + f];
                dact[size_t(r) * F + f] = da[size_t(r) * F + f] * p;
            }
            (*dprob)[size_t(r0 + r)] = float(dp);
        }
        const float* f1 = fp(s->fc1) + size_t(r0) * F1;
        if (swiglu) k::swigluBackward(dact.data(), f1, dfc1.data(), rows, F);
        else k::biasGeluBackward(dact.data(), f1, nullptr, dfc1.data(), nullptr, rows, F);
        if (bf) k::roundToBf16(dfc1.data(), int64_t(rows) * F1);
        k::linearBackward(dfc1.data(), fp(s->xp) + size_t(r0) * h, W1[size_t(e)], fp(dxp) + size_t(r0) * h,
                          G1[size_t(e)], nullptr, rows, h, F1);
    };
    const double expertFlops = 4.0 * T * K * (double(h) * F1 + double(F) * h);
    if (grouped) {
        m_exec.op("experts.grouped_mlp.bwd", Category::Gemm, expertFlops, uint64_t(T) * K * (h + F1 + F) * 8, [=] {
            for (int e = 0; e < E; ++e) expert(e);
        });
    } else {
        for (int e = E; e-- > 0;)
            m_exec.op("experts.local_expert.bwd", Category::Gemm, expertFlops / E, uint64_t(T) * K * (h + F1 + F) * 8 / E,
                      [=] { expert(e); });
    }
    // Router: the gradient of the renormalised top-k probs, the aux loss and the z-loss on the
    // logits, then into W_r and x. The aux/z gradients are scaled like the main loss (1/m).
    const float* Wr = m_params.modelParam(P.routerW);
    float* Gr = m_params.mainGrad(P.routerW);
    const double auxCoeff = m_cfg.moe_router_load_balancing_type == "aux_loss" ? m_cfg.moe_aux_loss_coeff : 0.0;
    const double zCoeff = m_cfg.moe_z_loss_coeff;
    const double lossScale = 1.0 / double(m_numMicrobatches);
    m_exec.op("router.bwd", Category::Gemm, 4.0 * T * h * E, uint64_t(T) * (2 * h + E) * 4, [=] {
        const float* L = fp(s->logits);
        std::vector<float> dl(static_cast<size_t>(T) * E, 0.f);
        std::vector<int> counts(static_cast<size_t>(E), 0);
        for (int r = 0; r < T * K; ++r) counts[size_t(s->expertOf[size_t(r)])]++;
        // per token: dprob of its k slots
        std::vector<double> dpk(static_cast<size_t>(T) * K, 0.0);
        for (int r = 0; r < T * K; ++r) dpk[size_t(s->tokenOf[size_t(r)]) * K + size_t(s->slotOf[size_t(r)])] = (*dprob)[size_t(r)];
        std::vector<double> kp(static_cast<size_t>(K)), full(static_cast<size_t>(E));
        for (int t = 0; t < T; ++t) {
            softmax(s->topv.data() + size_t(t) * K, K, kp.data());
            double dot = 0;
            for (int j = 0; j < K; ++j) dot += kp[size_t(j)] * dpk[size_t(t) * K + size_t(j)];
            for (int j = 0; j < K; ++j)
                dl[size_t(t) * E + size_t(s->topi[size_t(t) * K + size_t(j)])] +=
                    float(kp[size_t(j)] * (dpk[size_t(t) * K + size_t(j)] - dot));
            if (auxCoeff == 0 && zCoeff == 0) continue;
            const float* l = L + size_t(t) * E;
            softmax(l, E, full.data());
            double g = 0;
            for (int e = 0; e < E; ++e) g += full[size_t(e)] * double(counts[size_t(e)]);
            const double a = double(E) * auxCoeff / (double(K) * double(T) * double(T));
            double mx = l[0];
            for (int e = 1; e < E; ++e) mx = std::max(mx, double(l[e]));
            double se = 0;
            for (int e = 0; e < E; ++e) se += std::exp(double(l[e]) - mx);
            const double lse = mx + std::log(se);
            for (int e = 0; e < E; ++e) {
                const double aux = a * full[size_t(e)] * (double(counts[size_t(e)]) - g);
                const double zl = zCoeff / double(T) * 2.0 * lse * full[size_t(e)];
                dl[size_t(t) * E + size_t(e)] += float(lossScale * (aux + zl));
            }
        }
        // dx += dl W_r ; dW_r += dl^T x
        k::linearBackward(dl.data(), fp(x), Wr, fp(dx), Gr, nullptr, T, h, E);
        // experts' input grads, combined per token in permuted order
        for (int r = 0; r < T * K; ++r) {
            const int t = s->tokenOf[size_t(r)];
            const float* src = fp(dxp) + size_t(r) * h;
            for (int i = 0; i < h; ++i) fp(dx)[size_t(t) * h + i] += src[i];
        }
        if (bf) k::roundToBf16(fp(dx), int64_t(T) * h);
    });
    return dx;
}

}  // namespace ts::engine
