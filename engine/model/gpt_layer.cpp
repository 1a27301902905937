// GptModel's transformer layer (Megatron's TransformerLayer, pre-norm): input_layernorm ->
// self attention (gpt_attention.cpp) -> bias-dropout-add into the residual -> pre_mlp_layernorm
// -> MLP (gpt_mlp.cpp), or routed experts (gpt_moe.cpp) plus shared experts (gpt_mlp.cpp) ->
// bias-dropout-add; backward in reverse. The layer owns the norms, the
// residual stream and the dropouts; the blocks own their linears and collectives.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

namespace ts::engine {

Status GptModel::layerForward(MbState& st, int li, bool keep) {
    LayerActs& A = st.layers[size_t(li)];
    const LayerParams& P = m_layers[size_t(li)];
    const int gl = m_ctx.layerBegin + li;
    m_exec.setLayer(gl);
    RangeScope range(m_exec.device(), range::kLayer, {m_step, m_exec.microbatch(), m_ctx.vppChunk, gl});
    TS_RETURN_IF_ERROR(useWeights(layerParamList(li)));
    WeightsInUse weights{*this};
    const int h = m_d.hidden;
    // SP regions hold TL = T/t rows (this rank's s-shard); the TP region between the
    // all-gather and the reduce-scatter holds all T rows. Without SP, TL = T.
    const int TL = localTokens();
    const int64_t ThL = int64_t(TL) * h;
    // Dropout mask elements are numbered as in the single device's [T, h] tensor, so the SP/CP
    // masks are exactly the single-device mask's rows of this shard (hiddenDropPieces).
    auto pieces = std::make_shared<const std::vector<DropPiece>>(hiddenDropPieces());
    const bool bf = m_o.bf16;
    const float p = m_o.hiddenDropout;
    const bool rms = m_d.rmsNorm;
    // Activations here are fully written by the op that produces them: skip zeroing.
    auto alloc = [&](int64_t n) { return allocUninitialized(m_exec, n); };

    A.x = st.hidden;
    TS_ASSIGN_OR_RETURN(A.a1, alloc(ThL));
    if (!rms) { TS_ASSIGN_OR_RETURN(A.mean1, alloc(TL)); }
    TS_ASSIGN_OR_RETURN(A.rstd1, alloc(TL));
    normForward("input_layernorm.fwd", P.ln1w, P.ln1b, A.x, A.a1, A.mean1, A.rstd1, TL);

    // self attention; proj: linear_proj output [TL, h], its bias not yet added
    TS_ASSIGN_OR_RETURN(TensorPtr proj, attentionForward(A, P, gl));
    TS_ASSIGN_OR_RETURN(A.x2, alloc(ThL));
    if (p > 0) { TS_ASSIGN_OR_RETURN(A.mask1, m_exec.alloc(ThL, MemCategory::Activations, 1)); }
    {
        const float* B = P.projB >= 0 ? m_params.modelParam(P.projB) : nullptr;
        TensorPtr x = A.x, x2 = A.x2, mask = A.mask1;
        const kernels::hd::DropoutSeed seed = dropSeed(m_exec.microbatch(), gl, 1);
        const bool fused = m_o.fusedBiasDropout;
        m_exec.op("bias_dropout_add.attn", Category::Elementwise, 3.0 * ThL, uint64_t(ThL) * 16, [=] {
            uint8_t* mk = mask ? mask->as<uint8_t>() : nullptr;
            for (const DropPiece& pc : *pieces) {
                const int rows = int(pc.n / h);
                uint8_t* m = mk ? mk + pc.local : nullptr;
                const float *xs = fp(proj) + pc.local, *rs = fp(x) + pc.local;
                float* os = fp(x2) + pc.local;
                if (fused) k::biasDropoutAddFused(xs, B, rs, os, m, rows, h, p, seed, uint64_t(pc.global), bf);
                else k::biasDropoutAddUnfused(xs, B, rs, os, m, rows, h, p, seed, uint64_t(pc.global));
            }
            if (bf && !fused) k::roundToBf16(fp(x2), ThL);  // (fused: rounded as written)
        });
    }
    proj.reset();

    // MLP
    TS_ASSIGN_OR_RETURN(A.a2, alloc(ThL));
    if (!rms) { TS_ASSIGN_OR_RETURN(A.mean2, alloc(TL)); }
    TS_ASSIGN_OR_RETURN(A.rstd2, alloc(TL));
    normForward("pre_mlp_layernorm.fwd", P.ln2w, P.ln2b, A.x2, A.a2, A.mean2, A.rstd2, TL);
    TensorPtr fc2;
    if (P.routerW >= 0) { TS_ASSIGN_OR_RETURN(fc2, moeLayerForward(A, P, gl)); }
    else { TS_ASSIGN_OR_RETURN(fc2, mlpForward(A, P)); }
    TS_ASSIGN_OR_RETURN(TensorPtr out, alloc(ThL));
    if (p > 0) { TS_ASSIGN_OR_RETURN(A.mask2, m_exec.alloc(ThL, MemCategory::Activations, 1)); }
    {
        const float* B = P.fc2B >= 0 ? m_params.modelParam(P.fc2B) : nullptr;
        TensorPtr x2 = A.x2, mask = A.mask2;
        const kernels::hd::DropoutSeed seed = dropSeed(m_exec.microbatch(), gl, 2);
        const bool fused = m_o.fusedBiasDropout;
        m_exec.op("bias_dropout_add.mlp", Category::Elementwise, 3.0 * ThL, uint64_t(ThL) * 16, [=] {
            uint8_t* mk = mask ? mask->as<uint8_t>() : nullptr;
            for (const DropPiece& pc : *pieces) {
                const int rows = int(pc.n / h);
                uint8_t* m = mk ? mk + pc.local : nullptr;
                const float *xs = fp(fc2) + pc.local, *rs = fp(x2) + pc.local;
                float* os = fp(out) + pc.local;
                if (fused) k::biasDropoutAddFused(xs, B, rs, os, m, rows, h, p, seed, uint64_t(pc.global), bf);
                else k::biasDropoutAddUnfused(xs, B, rs, os, m, rows, h, p, seed, uint64_t(pc.global));
            }
            if (bf && !fused) k::roundToBf16(fp(out), ThL);  // (fused: rounded as written)
        });
    }
    st.hidden = out;
    if (!keep) {
        TensorPtr x = A.x;
        A = LayerActs{};
        if (recomputeGroupStart(li) == li) A.x = x;  // checkpoint: the group input only
    }
    return Status::ok();
}

Status GptModel::layerBackward(MbState& st, int li, TensorPtr dout, TensorPtr* dxOut) {
    LayerActs& A = st.layers[size_t(li)];
    const LayerParams& P = m_layers[size_t(li)];
    const int gl = m_ctx.layerBegin + li;
    m_exec.setLayer(gl);
    RangeScope range(m_exec.device(), range::kLayer, {m_step, m_exec.microbatch(), m_ctx.vppChunk, gl});
    TS_RETURN_IF_ERROR(useWeights(layerParamList(li)));
    WeightsInUse weights{*this};
    const int h = m_d.hidden;
    const int TL = localTokens();  // rows in SP regions (= T without SP)
    const int64_t ThL = int64_t(TL) * h;
    const float p = m_o.hiddenDropout;
    const bool bf = m_o.bf16;
    // Activations here are fully written by the op that produces them: skip zeroing.
    auto alloc = [&](int64_t n) { return allocUninitialized(m_exec, n); };
    if (!A.a1) return Status::internal("layer " + std::to_string(gl) + " backward without saved activations");

    // bias-dropout-add (mlp): d(fc2 out) = dropout'(dout); residual grad passes through.
    TS_ASSIGN_OR_RETURN(TensorPtr dfc2, alloc(ThL));
    {
        float* GB = P.fc2B >= 0 ? m_params.mainGrad(P.fc2B) : nullptr;
        TensorPtr mask = A.mask2;
        m_exec.op("bias_dropout_add.mlp.bwd", Category::Elementwise, 2.0 * ThL, uint64_t(ThL) * 8, [=] {
            k::biasDropoutAddBackward(fp(dout), mask ? mask->as<uint8_t>() : nullptr, fp(dfc2), GB, TL, h, p);
            if (bf) k::roundToBf16(fp(dfc2), ThL);  // dropout's 1/(1-p) leaves bf16
        });
    }
    TensorPtr da2;
    if (P.routerW >= 0) { TS_ASSIGN_OR_RETURN(da2, moeLayerBackward(A, P, std::move(dfc2))); }
    else { TS_ASSIGN_OR_RETURN(da2, mlpBackward(A, P, std::move(dfc2))); }
    TS_ASSIGN_OR_RETURN(TensorPtr dx2, alloc(ThL));
    normBackward("pre_mlp_layernorm.bwd", P.ln2w, P.ln2b, da2, A.x2, A.mean2, A.rstd2, dx2, TL);
    da2.reset();
    m_exec.op("residual_grad_add", Category::Elementwise, double(ThL), uint64_t(ThL) * 12, [=] {
        k::addInPlace(fp(dx2), fp(dout), ThL);
        if (bf) k::roundToBf16(fp(dx2), ThL);
    });

    // attention block
    TS_ASSIGN_OR_RETURN(TensorPtr dproj, alloc(ThL));
    {
        float* GB = P.projB >= 0 ? m_params.mainGrad(P.projB) : nullptr;
        TensorPtr mask = A.mask1;
        m_exec.op("bias_dropout_add.attn.bwd", Category::Elementwise, 2.0 * ThL, uint64_t(ThL) * 8, [=] {
            k::biasDropoutAddBackward(fp(dx2), mask ? mask->as<uint8_t>() : nullptr, fp(dproj), GB, TL, h, p);
            if (bf) k::roundToBf16(fp(dproj), ThL);
        });
    }
    TS_ASSIGN_OR_RETURN(TensorPtr da1, attentionBackward(A, P, gl, std::move(dproj)));
    TS_ASSIGN_OR_RETURN(TensorPtr dx, alloc(ThL));
    normBackward("input_layernorm.bwd", P.ln1w, P.ln1b, da1, A.x, A.mean1, A.rstd1, dx, TL);
    m_exec.op("residual_grad_add", Category::Elementwise, double(ThL), uint64_t(ThL) * 12, [=] {
        k::addInPlace(fp(dx), fp(dx2), ThL);
        if (bf) k::roundToBf16(fp(dx), ThL);
    });
    *dxOut = dx;
    return Status::ok();
}

// bf16 runs keep a layer's saved activations as bf16 bits between its forward and its backward,
// 2 bytes an element as Megatron-LM keeps its bf16 tensors: each was rounded to bf16 by the op
// that made it, so the bits hold it exactly and restoreBf16 gives the same floats back. The ops in
// between keep computing on floats, so only the layer being run holds its tensors in fp32 words.
// MoE layers pack their routed experts' rows too (moeBf16SavedTensors). Not packed: what is not a
// bf16 value (the norms' statistics, the flash and ring statistics, the attention probabilities,
// the router's logits and probs, FP8 linears' inputs, which the per-tensor recipes quantize in
// place, SwiGLU's fc1 with its bias) and the dropout masks (bytes already). Ops read what they
// use through their own pointers, never through LayerActs or MoeSaved when they run, so the host
// may swap the fields meanwhile.
// A test packs every path both ways: GptPaths.Bf16SavedActivationsAreTheSameBitsInHalfTheBytes,
// ParallelTrainer.Bf16SavedActivationsGiveTheSameRunOnEveryLayout.
std::vector<GptModel::SavedTensor> GptModel::bf16SavedTensors(LayerActs& A) const {
    // An MoE layer's a2 is the router's input, which FP8 leaves alone (the shared experts quantize
    // their own copy, shX; the experts their rows).
    const bool moe = A.moe != nullptr;
    std::vector<SavedTensor> t = {
        {&A.x, false},     {&A.a1, true},    {&A.q, false},       {&A.k, false},
        {&A.v, false},     {&A.ctx, true},   {&A.attnOut, false}, {&A.ctxHeads, false},
        {&A.x2, false},    {&A.a2, !moe},    {&A.act, true},
        {&A.shFc1, false}, {&A.shAct, true}};  // not shOut: linear_fc2's output, not rounded before the gate
    // SwiGLU's saved fc1 includes the bias added after the GEMM's rounding: not a bf16 value then.
    if (!(m_d.swiglu && m_d.bias)) t.push_back({&A.fc1, false});
    if (MoeSaved* m = A.moe.get()) moeBf16SavedTensors(*m, t);
    return t;
}

Status GptModel::saveBf16(LayerActs& A, int li) {
    if (!m_o.bf16SavedPacked || !A.packed.empty()) return Status::ok();
    // FP8 quantizes those inputs in place under the per-tensor recipes; the block recipes
    // quantize into workspaces and leave them bf16.
    const bool fp8 = fp8Layer(li) && !m_o.fp8.isBlock();
    const std::vector<SavedTensor> all = bf16SavedTensors(A);
    std::vector<const Buffer*> made;  // the bits made here: a tensor already pointing at them is done
    for (const SavedTensor& sv : all) {
        TensorPtr& t = *sv.tensor;
        if (!t || (fp8 && sv.fp8Input) || std::find(made.begin(), made.end(), t.get()) != made.end()) continue;
        const int64_t n = int64_t(t->bytes() / sizeof(float));
        TS_ASSIGN_OR_RETURN(TensorPtr bits, allocUninitialized(m_exec, (n + 1) / 2));
        TensorPtr src = t;
        m_exec.op("bf16.save", Category::Elementwise, 0, uint64_t(n) * 6,
                  [=] { k::floatToBf16(fp(src), bits->as<uint16_t>(), n); });
        // One tensor under two names (an alias) gets one copy of its bits.
        for (const SavedTensor& g : all)
            if (g.tensor->get() == src.get()) *g.tensor = bits;
        made.push_back(bits.get());
        A.packed.push_back({sv.tensor, n});
    }
    return Status::ok();
}

Status GptModel::restoreBf16(LayerActs& A) {
    if (A.packed.empty()) return Status::ok();
    const std::vector<SavedTensor> all = bf16SavedTensors(A);
    // Nothing in a layer's backward writes into what it saved, so the bits stay its floats' bits.
    const bool bind = kern::streamOnDevice(m_exec.stream());
    if (bind && !A.twins) A.twins = std::make_shared<LayerActs::TwinBinding>();
    for (const LayerActs::Packed& pk : A.packed) {
        TensorPtr bits = *pk.tensor;
        const int64_t n = pk.n;
        TS_ASSIGN_OR_RETURN(TensorPtr floats, allocUninitialized(m_exec, n));
        m_exec.op("bf16.restore", Category::Elementwise, 0, uint64_t(n) * 6,
                  [=] { k::bf16ToFloat(bits->as<uint16_t>(), fp(floats), n); });
        for (const SavedTensor& g : all)
            if (g.tensor->get() == bits.get()) *g.tensor = floats;
        if (bind) {
            kern::bindBf16Twin(fp(floats), bits->as<uint16_t>(), n);
            A.twins->floatsAndBits.push_back({floats, bits});
        }
    }
    A.packed.clear();
    return Status::ok();
}

// An MoE layer's MLP part (Megatron's MoELayer.forward): the routed experts (gpt_moe.cpp) plus,
// with moe_shared_expert_intermediate_size > 0, the shared experts, whose output is added to the
// routed experts' (postprocess). They run before the router (Megatron's default), or with
// moe_shared_expert_overlap after it, from the point between the token dispatch and the routed
// experts' GEMMs (gpt_moe.cpp calls A.beforeExperts there): on their own stream when the trainer
// gave one (setSharedExpertStream; the compute stream waits for them before the sum), so they run
// while the dispatcher's all-to-all and the routed experts run, else in that place of the compute
// stream. The backward mirrors it. The sums are taken in one order, so the numbers are the same
// either way.
void GptModel::setSharedExpertStream(Stream& stream, Communicator* tp) {
    if (m_sharedFfnL <= 0 || !m_cfg.moe_shared_expert_overlap) return;
    m_sharedStream = &stream;
    m_sharedTp = tp;
}

Result<std::shared_ptr<Event>> GptModel::onSharedStream(const std::shared_ptr<Event>& ready,
                                                        const std::function<Status()>& fn) {
    if (m_ctx.tpSize > 1 && !m_sharedTp)
        return Status::internal("shared experts on their own stream need a \"tp\" communicator for it");
    m_sharedStream->wait(*ready);
    Stream& compute = m_exec.setStream(*m_sharedStream);
    Communicator* tp = m_ctx.tp;
    if (m_ctx.tpSize > 1) m_ctx.tp = m_sharedTp;
    // Megatron turns the userbuffers overlap off in the overlapped shared experts' linears: their
    // SP collectives run on their stream, plainly.
    std::unique_ptr<TpOverlap> tpo = std::move(m_tpo);
    const Status st = fn();
    m_tpo = std::move(tpo);
    m_ctx.tp = tp;
    m_exec.setStream(compute);
    TS_RETURN_IF_ERROR(st);
    std::shared_ptr<Event> done(m_exec.device().createEvent());
    m_sharedStream->record(*done);
    return done;
}

Result<TensorPtr> GptModel::moeLayerForward(LayerActs& A, const LayerParams& P, int gl) {
    if (P.shFc1W < 0) return moeForward(A, P, gl);
    TensorPtr shared;
    std::shared_ptr<Event> sharedDone, inputReady;  // both outlive the hook, called inside moeForward
    if (m_cfg.moe_shared_expert_overlap) {
        if (m_sharedStream) {
            inputReady = m_exec.device().createEvent();
            m_exec.stream().record(*inputReady);  // A.a2 is written
        }
        A.beforeExperts = [&]() -> Status {
            auto run = [&]() -> Status {
                TS_ASSIGN_OR_RETURN(shared, sharedExpertForward(A, P));
                return Status::ok();
            };
            if (!inputReady) return run();
            TS_ASSIGN_OR_RETURN(sharedDone, onSharedStream(inputReady, run));
            return Status::ok();
        };
    } else {
        TS_ASSIGN_OR_RETURN(shared, sharedExpertForward(A, P));
    }
    auto routed = moeForward(A, P, gl);
    A.beforeExperts = nullptr;
    // Before anything returns: the shared experts' ops read the layer's working weights, which
    // the compute stream frees after the layer.
    if (sharedDone) m_exec.stream().wait(*sharedDone);
    if (!routed.isOk()) return routed.status();
    if (!shared) return Status::internal("MoE layer " + std::to_string(gl) + ": the shared experts did not run");
    TensorPtr out = std::move(routed).value();
    const int64_t ThL = int64_t(localTokens()) * m_d.hidden;
    const bool bf = m_o.bf16;
    m_exec.op("moe.add_shared_experts", Category::Elementwise, double(ThL), uint64_t(ThL) * 12, [=] {
        k::addInPlace(fp(out), fp(shared), ThL);
        if (bf) k::roundToBf16(fp(out), ThL);
    });
    return out;
}

Result<TensorPtr> GptModel::moeLayerBackward(LayerActs& A, const LayerParams& P, TensorPtr dout) {
    if (P.shFc1W < 0) return moeBackward(A, P, std::move(dout));
    TensorPtr dshared;
    std::shared_ptr<Event> sharedDone;
    std::shared_ptr<Event> gradReady;  // outlives the hook, called inside moeBackward
    const bool overlap = m_cfg.moe_shared_expert_overlap;
    if (overlap) {
        if (m_sharedStream) {
            gradReady = m_exec.device().createEvent();
            m_exec.stream().record(*gradReady);  // dout is written
        }
        A.beforeExperts = [&]() -> Status {
            auto run = [&]() -> Status {
                TS_ASSIGN_OR_RETURN(dshared, sharedExpertBackward(A, P, dout));
                return Status::ok();
            };
            if (!gradReady) return run();
            TS_ASSIGN_OR_RETURN(sharedDone, onSharedStream(gradReady, run));
            return Status::ok();
        };
    }
    auto routed = moeBackward(A, P, dout);
    A.beforeExperts = nullptr;
    // Before anything returns (the shared experts' ops read the layer's working weights); also
    // orders the shared weights' grads (accumulated on their stream) before the grad-ready hook.
    if (sharedDone) m_exec.stream().wait(*sharedDone);
    if (!routed.isOk()) return routed.status();
    if (!overlap) { TS_ASSIGN_OR_RETURN(dshared, sharedExpertBackward(A, P, dout)); }
    if (!dshared) return Status::internal("MoE layer backward: the shared experts did not run");
    TensorPtr dx = std::move(routed).value();
    const int64_t ThL = int64_t(localTokens()) * m_d.hidden;
    const bool bf = m_o.bf16;
    m_exec.op("moe.add_shared_experts.bwd", Category::Elementwise, double(ThL), uint64_t(ThL) * 12, [=] {
        k::addInPlace(fp(dx), fp(dshared), ThL);
        if (bf) k::roundToBf16(fp(dx), ThL);
    });
    return dx;
}

}  // namespace ts::engine
