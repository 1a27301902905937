// GptModel, the driver: creation and parameter registration, init, and forward()/backward()
// of a microbatch through this rank's parts in order (embedding on the first stage, the
// transformer layers with their recompute groups, output layer and loss on the last stage).
// The parts live beside it: gpt_embedding.cpp, gpt_layer.cpp (input_layernorm, attention,
// pre_mlp_layernorm, MLP, residuals) with gpt_attention.cpp and gpt_mlp.cpp, gpt_output.cpp;
// gpt_ops.cpp holds the norm/linear ops and the TP collectives they share.
#include "engine/model/gpt.h"

#include <cstdio>
#include <cstdlib>

#include "engine/model/gpt_internal.h"

namespace ts::engine {

GptModel::GptModel(const Config& cfg, const ModelDims& d, const ModelOptions& o, Device& dev,
                   Stream& compute, const ParallelContext& ctx)
    : m_cfg(cfg), m_d(d), m_o(o), m_ctx(ctx), m_exec(dev, compute),
      m_sp(ctx.sequenceParallel && ctx.tpSize > 1),
      m_logits(std::make_shared<std::map<int, std::vector<float>>>()) {
    // bf16 runs store bf16 values, so their GEMMs may take bf16 operands on a GPU's tensor cores
    // (the same products; kernels.h Bf16GemmScope; kern::setCheckBf16Gemms checks it on the host
    // backends). FP8 linears take dequantized FP8 values: with power-of-two scales (mxfp8's E8M0,
    // blockwise's) a code times its scale is a bf16 value too, so their GEMMs are bf16 GEMMs;
    // delayed scaling's are codes at the step's scale and tensorwise scaling's codes at a scale
    // made from the amax, both on the device, where the GEMM reads them (a GPU's GEMM takes the
    // codes with the scales' inverses in alpha, kernels/common/fp8_codes.h); block recipes without power-of-two
    // scales run their FP8 linears' GEMMs in fp32 (kern::Fp32GemmScope where fp8GemmsBf16() does
    // not hold), the rest of the model keeps its bf16 GEMMs.
    m_exec.setBf16Gemms(o.bf16);
}

GptModel::~GptModel() {
    (void)m_exec.synchronize();
    if (m_sharedStream) (void)m_sharedStream->synchronize();
}

Result<std::unique_ptr<GptModel>> GptModel::create(const Config& cfg, Device& dev, Stream& compute,
                                                   const ParallelContext& ctxIn, const PlaceParams& place) {
    TS_ASSIGN_OR_RETURN(ModelDims d, modelDimsFromConfig(cfg));
    ParallelContext ctx = ctxIn;
    if (ctx.layerEnd < 0) ctx.layerEnd = d.layers;
    if (ctx.layerBegin < 0 || ctx.layerBegin > ctx.layerEnd || ctx.layerEnd > d.layers)
        return Status::invalid("layer range [" + std::to_string(ctx.layerBegin) + ", " +
                               std::to_string(ctx.layerEnd) + ") does not fit num_layers=" +
                               std::to_string(d.layers));
    if (ctx.tpSize < 1 || ctx.tpRank < 0 || ctx.tpRank >= ctx.tpSize)
        return Status::invalid("bad tensor-parallel rank/size in ParallelContext");
    if (ctx.tpSize > 1 && (!ctx.tp || ctx.tp->size() != ctx.tpSize))
        return Status::invalid("tensor parallel size > 1 needs a TP communicator of that size");
    if (d.heads % ctx.tpSize || d.groups % ctx.tpSize || d.ffn % ctx.tpSize || d.paddedVocab % ctx.tpSize)
        return Status::invalid("tensor_model_parallel_size=" + std::to_string(ctx.tpSize) +
                               " must divide heads, query groups, ffn_hidden_size and the padded vocab");
    if (ctx.sequenceParallel && ctx.tpSize > 1 && d.seq % ctx.tpSize)
        return Status::invalid("sequence_parallel: seq_length=" + std::to_string(d.seq) +
                               " must be divisible by tensor_model_parallel_size=" + std::to_string(ctx.tpSize));
    if (ctx.etpSize < 1 || ctx.etpRank < 0 || ctx.etpRank >= ctx.etpSize)
        return Status::invalid("bad expert-tensor-parallel rank/size in ParallelContext");
    if (ctx.etpSize > 1 && (!ctx.etp || ctx.etp->size() != ctx.etpSize ||
                            !ctx.etpEp || ctx.etpEp->size() != ctx.etpSize * ctx.epSize))
        return Status::invalid("expert tensor parallel size > 1 needs \"etp\" and \"etp-ep\" communicators of those sizes");
    if (ctx.epSize > 1 && cfg.num_moe_experts > 0 && (!ctx.ep || ctx.ep->size() != ctx.epSize))
        return Status::invalid("expert parallel size > 1 needs an EP communicator of that size");
    const ModelOptions o = modelOptionsFromConfig(cfg);
    const int seqGlobal = d.seq;
    if (ctx.cpSize > 1) {
        if (d.seq % (2 * ctx.cpSize) != 0)
            return Status::invalid("seq_length=" + std::to_string(d.seq) + " must be divisible by 2 x context_parallel_size = " +
                                   std::to_string(2 * ctx.cpSize));
        if (!ctx.cp || ctx.cp->size() != ctx.cpSize)
            return Status::invalid("context parallel size > 1 needs a CP communicator of that size");
        if (cfg.cp_comm_type == "a2a+p2p") {
            const std::vector<int>& hcp = cfg.hierarchical_context_parallel_sizes;
            if (hcp.size() != 2 || hcp[0] * hcp[1] != ctx.cpSize || ctx.hcpA2aSize != hcp[0] ||
                ctx.hcpA2aRank < 0 || ctx.hcpA2aRank >= ctx.hcpA2aSize || ctx.hcpA2aRank != ctx.cpRank % hcp[0] ||
                (ctx.hcpA2aSize > 1 && (!ctx.hcpA2a || ctx.hcpA2a->size() != ctx.hcpA2aSize)))
                return Status::invalid("cp_comm_type=a2a+p2p needs the \"hcp-a2a\" communicator of size "
                                       "hierarchical_context_parallel_sizes[0] and this rank's place in it");
        }
        d.seq /= ctx.cpSize;  // this rank's rows
    }
    if (!o.recomputeGranularity.empty() && o.recomputeGranularity != "selective" &&
        o.recomputeGranularity != "full")
        return Status::invalid("recompute_granularity must be '', selective or full");
    if (o.recomputeGranularity == "full") {
        if (o.recomputeMethod != "uniform" && o.recomputeMethod != "block")
            return Status::invalid("recompute_granularity=full needs recompute_method uniform or block");
        if (o.recomputeNumLayers < 1)
            return Status::invalid("recompute_granularity=full needs recompute_num_layers >= 1");
    }
    std::unique_ptr<GptModel> m(new GptModel(cfg, d, o, dev, compute, ctx));
    m->m_seqGlobal = seqGlobal;
    if (ctx.cpSize > 1) {
        const int chunk = seqGlobal / (2 * ctx.cpSize);
        m->m_ropeSegs = {{0, chunk, ctx.cpRank * chunk}, {chunk, chunk, (2 * ctx.cpSize - 1 - ctx.cpRank) * chunk}};
        m->m_cpPos = cpLocalPositions(seqGlobal, ctx.cpSize, ctx.cpRank);
    } else {
        m->m_ropeSegs = {{0, d.seq, 0}};
    }
    TS_RETURN_IF_ERROR(m->registerParams());
    if (place) {
        TS_ASSIGN_OR_RETURN(const ParamPlacement pl, place(m->m_params.params()));
        TS_RETURN_IF_ERROR(m->m_params.finalize(dev, o.bf16, m->m_exec.bf16Gemms(), &pl));
    } else {
        TS_RETURN_IF_ERROR(m->m_params.finalize(dev, o.bf16, m->m_exec.bf16Gemms()));
    }
    TS_RETURN_IF_ERROR(m->initWeights());
    m->fp8Init();
    m->fp8ExpertInit();
    m->m_router = std::make_shared<std::vector<RouterState>>(m->m_layers.size());
    int qbSlots = 0;
    for (size_t li = 0; li < m->m_layers.size(); ++li) {
        if (m->m_layers[li].routerW < 0) continue;
        RouterState& rs = (*m->m_router)[li];
        const size_t E = size_t(cfg.num_moe_experts);
        rs.expertBias.assign(E, 0.f);
        rs.localTokens.assign(E, 0.0);
        if (cfg.moe_router_load_balancing_type == "quantile_balancing") {
            rs.qbBeta.assign(E, 0.f);
            rs.qbSlot = qbSlots++;
        }
    }
    if (qbSlots > 0) {  // zeroed
        TS_ASSIGN_OR_RETURN(m->m_qbSumDev, m->m_exec.alloc(int64_t(qbSlots) * cfg.num_moe_experts, MemCategory::Workspace));
    }
    if (o.hiddenDropout > 0 || o.attentionDropout > 0) {
        TS_ASSIGN_OR_RETURN(m->m_dropKey, m->m_exec.alloc(1, MemCategory::Workspace, sizeof(uint64_t)));
    }
    return m;
}

Status GptModel::registerParams() {
    const int t = m_ctx.tpSize;
    const int h = m_d.hidden, d = m_d.headDim;
    m_nqL = m_d.heads / t;
    m_ngL = m_d.groups / t;
    m_ffnL = m_d.ffn / t;
    m_vocabL = m_d.paddedVocab / t;
    m_vocabStart = m_ctx.tpRank * m_vocabL;
    const int64_t qkvFull = int64_t(m_d.heads + 2 * m_d.groups) * d;
    const int64_t fc1Full = int64_t(m_d.swiglu ? 2 : 1) * m_d.ffn;

    auto add = [&](std::string name, std::vector<int64_t> full, ShardKind kind, int stride = 1, bool expert = false) {
        ParamInfo p;
        p.fullShape = full;
        p.shape = full;
        if (kind == ShardKind::ColumnParallel || kind == ShardKind::VocabParallel) p.shape[0] /= t;
        if (kind == ShardKind::RowParallel) p.shape[1] /= t;
        p.shard = t > 1 ? kind : ShardKind::Replicated;
        if (t == 1 && kind != ShardKind::Replicated) p.shard = kind;  // keep the role for docs/DP
        p.noWeightDecay = full.size() == 1;
        p.partitionStride = stride;
        p.expert = expert;
        p.name = std::move(name);
        return m_params.add(std::move(p));
    };
    const bool ln = !m_d.rmsNorm;
    if (m_ctx.firstStage)
    {
        m_embW = add("embedding.word_embeddings.weight", {m_d.paddedVocab, h}, ShardKind::VocabParallel);
        // learned_absolute: Megatron's LanguageModelEmbedding.position_embeddings, a plain
        // torch.nn.Embedding [max_position_embeddings, h], replicated on every TP rank.
        if (m_d.learnedPos)
            m_posW = add("embedding.position_embeddings.weight", {m_d.maxPos, h}, ShardKind::Replicated);
    }
    const std::vector<int> moePattern = moeLayerPattern(m_cfg);
    for (int gl = m_ctx.layerBegin; gl < m_ctx.layerEnd; ++gl) {
        const std::string pre = "decoder.layers." + std::to_string(gl) + ".";
        LayerParams P;
        P.ln1w = add(pre + "input_layernorm.weight", {h}, ShardKind::Replicated);
        if (ln) P.ln1b = add(pre + "input_layernorm.bias", {h}, ShardKind::Replicated);
        P.qkvW = add(pre + "self_attention.linear_qkv.weight", {qkvFull, h}, ShardKind::ColumnParallel);
        if (m_d.bias) P.qkvB = add(pre + "self_attention.linear_qkv.bias", {qkvFull}, ShardKind::ColumnParallel);
        P.projW = add(pre + "self_attention.linear_proj.weight", {h, int64_t(m_d.heads) * d}, ShardKind::RowParallel);
        if (m_d.bias) P.projB = add(pre + "self_attention.linear_proj.bias", {h}, ShardKind::Replicated);
        P.ln2w = add(pre + "pre_mlp_layernorm.weight", {h}, ShardKind::Replicated);
        if (ln) P.ln2b = add(pre + "pre_mlp_layernorm.bias", {h}, ShardKind::Replicated);
        const int stride = m_d.swiglu ? 2 : 1;
        if (size_t(gl) < moePattern.size() && moePattern[size_t(gl)]) {
            // MoE (gpt_moe.cpp; Megatron's names: mlp.router, mlp.experts.local_experts.<e>) on the
            // layers moe_layer_freq marks (global index), the others keep the dense MLP.
            m_moeFfn = m_cfg.moe_ffn_hidden_size > 0 ? m_cfg.moe_ffn_hidden_size : m_d.ffn;
            const int64_t moeFc1 = int64_t(m_d.swiglu ? 2 : 1) * m_moeFfn;
            P.routerW = add(pre + "mlp.router.weight", {m_cfg.num_moe_experts, h}, ShardKind::Replicated);
            // add_bias_linear: Megatron's Router has a bias [E] too (router.py; drawn like the
            // weight by init_method, marked sequence_parallel: with SP its grad is summed over TP).
            if (m_d.bias) P.routerB = add(pre + "mlp.router.bias", {m_cfg.num_moe_experts}, ShardKind::Replicated);
            // Expert parallel: this rank's E/ep experts, named (and initialised) by their global
            // index, so every layout holds the same weights as the single device. Expert tensor
            // parallel (etp > 1): fc1 column parallel (SwiGLU: [gate_r ; up_r], stride 2, as the
            // dense fc1), fc2 row parallel over "etp" (Megatron's expert linears use the expert TP
            // group); with etp 1 each expert is whole on the rank.
            const int local = m_cfg.num_moe_experts / m_ctx.epSize;
            const int etp = m_ctx.etpSize;
            m_moeFfnL = m_moeFfn / etp;
            for (int l = 0; l < local; ++l) {
                const int e = m_ctx.epRank * local + l;
                const std::string ex = pre + "mlp.experts.local_experts." + std::to_string(e) + ".";
                auto addExpert = [&](std::string name, std::vector<int64_t> full, ShardKind kind, int pstride) {
                    ParamInfo p;
                    p.fullShape = full;
                    p.shape = full;
                    if (etp > 1 && kind == ShardKind::ColumnParallel) p.shape[0] /= etp;
                    if (etp > 1 && kind == ShardKind::RowParallel) p.shape[1] /= etp;
                    p.shard = etp > 1 ? kind : ShardKind::Replicated;
                    p.partitionStride = pstride;
                    p.noWeightDecay = full.size() == 1;
                    p.expert = true;
                    p.name = std::move(name);
                    return m_params.add(std::move(p));
                };
                P.expFc1W.push_back(addExpert(ex + "linear_fc1.weight", {moeFc1, h}, ShardKind::ColumnParallel, stride));
                P.expFc2W.push_back(addExpert(ex + "linear_fc2.weight", {h, m_moeFfn}, ShardKind::RowParallel, 1));
                // add_bias_linear (Megatron asserts expert_tensor_parallel_size 1 with it, so each
                // expert's biases are whole on its rank): fc1's [moeFc1] (SwiGLU: [gate ; up]) and
                // fc2's [h], zero-initialised as TE's / Megatron's linears do. SequentialMLP's
                // names (TEGroupedMLP's GroupedLinear calls them linear_fc1.bias<l>; Megatron's
                // sharded state dict maps both to the same global expert).
                if (m_d.bias) {
                    P.expFc1B.push_back(addExpert(ex + "linear_fc1.bias", {moeFc1}, ShardKind::ColumnParallel, stride));
                    P.expFc2B.push_back(addExpert(ex + "linear_fc2.bias", {h}, ShardKind::Replicated, 1));
                }
            }
            // Shared experts (Megatron's SharedExpertMLP: an MLP with ffn_hidden_size =
            // moe_shared_expert_intermediate_size, no biases; its gate_weight [1, h] is replicated and
            // marked sequence_parallel): dense params, TP-sharded, grads reduced over dp-cp.
            if (const int fs = m_cfg.moe_shared_expert_intermediate_size; fs > 0) {
                m_sharedFfnL = fs / t;
                const std::string sh = pre + "mlp.shared_experts.";
                P.shFc1W = add(sh + "linear_fc1.weight", {int64_t(m_d.swiglu ? 2 : 1) * fs, h}, ShardKind::ColumnParallel,
                               stride);
                P.shFc2W = add(sh + "linear_fc2.weight", {h, fs}, ShardKind::RowParallel);
                if (m_cfg.moe_shared_expert_gate) P.shGateW = add(sh + "gate_weight", {1, h}, ShardKind::Replicated);
            }
            m_layers.push_back(P);
            continue;
        }
        P.fc1W = add(pre + "mlp.linear_fc1.weight", {fc1Full, h}, ShardKind::ColumnParallel, stride);
        if (m_d.bias) P.fc1B = add(pre + "mlp.linear_fc1.bias", {fc1Full}, ShardKind::ColumnParallel, stride);
        P.fc2W = add(pre + "mlp.linear_fc2.weight", {h, m_d.ffn}, ShardKind::RowParallel);
        if (m_d.bias) P.fc2B = add(pre + "mlp.linear_fc2.bias", {h}, ShardKind::Replicated);
        m_layers.push_back(P);
    }
    if (m_ctx.lastStage) {
        m_lnfW = add("decoder.final_layernorm.weight", {h}, ShardKind::Replicated);
        if (ln) m_lnfB = add("decoder.final_layernorm.bias", {h}, ShardKind::Replicated);
        if (!m_d.tied) {
            m_outW = add("output_layer.weight", {m_d.paddedVocab, h}, ShardKind::VocabParallel);
        } else if (m_embW >= 0) {
            m_outW = m_embW;  // same tensor, one main grad
        } else {
            // Tied but embedding on another pp stage: Megatron keeps a copy on the last stage
            // whose grad is all-reduced with the embedding's (embedding group).
            m_outW = add("output_layer.weight", {m_d.paddedVocab, h}, ShardKind::VocabParallel);
            ParamInfo& pi = const_cast<ParamInfo&>(m_params.info(m_outW));
            pi.sharedEmbedding = true;
        }
        if (m_embW >= 0 && m_d.tied) const_cast<ParamInfo&>(m_params.info(m_embW)).sharedEmbedding = true;
    }
    // With SP every TP-replicated param (norm weights/biases, the row-parallel output biases
    // added after the reduce-scatter) sees only this rank's s/t tokens. The position embedding
    // is added before the scatter to the SP region: every TP rank gets its full grad.
    // Expert weights are not: their grads are reduced over the expert-data-parallel group, which
    // holds the TP ranks when experts are not split over them (engine/parallel/ddp.h).
    if (m_sp)
        for (int i = 0; i < m_params.count(); ++i)
            if (m_params.info(i).shard == ShardKind::Replicated && i != m_posW && !m_params.info(i).expert)
                const_cast<ParamInfo&>(m_params.info(i)).sequenceParallel = true;
    return Status::ok();
}

Status GptModel::initWeights() {
    // The weights are drawn on the host (fillNormal: the same numbers on every backend), into a
    // host image of the main-param buffer, then uploaded in one op and the stream synchronized, so
    // later host work (a checkpoint load) sees them and a device backend never has its memory
    // touched by host code.
    const int tpSize = m_ctx.tpSize, tpRank = m_ctx.tpRank;
    auto image = std::make_shared<std::vector<float>>(size_t(std::max<int64_t>(m_params.numel(), 1)), 0.0f);
    const float stdOut = m_o.initStd / std::sqrt(2.0f * float(m_d.layers));
    for (int i = 0; i < m_params.count(); ++i) {
        const ParamInfo& p = m_params.info(i);
        float* dst = image->data() + p.offset;
        if (p.fullShape.size() == 1 && p.name.find("mlp.router.bias") != std::string::npos) {
            // Megatron's Router.reset_parameters draws its bias with init_method (not zero).
            fillNormal(dst, p.numel, m_o.initStd, hashCombine(m_o.seed, hashString(p.name)));
            continue;
        }
        if (p.fullShape.size() == 1) {
            const bool isNormWeight = p.name.find("layernorm.weight") != std::string::npos;
            std::fill(dst, dst + p.numel, isNormWeight ? 1.f : 0.f);
            continue;
        }
        const bool scaled = p.name.find("linear_proj.weight") != std::string::npos ||
                            p.name.find("linear_fc2.weight") != std::string::npos;
        // Tied copy on the last stage is initialized as the embedding (Megatron copies it).
        const std::string key = p.sharedEmbedding ? "embedding.word_embeddings.weight" : p.name;
        const int64_t R = p.fullShape[0], C = p.fullShape[1];
        std::vector<float> full(size_t(R * C));
        fillNormal(full.data(), R * C, scaled ? stdOut : m_o.initStd, hashCombine(m_o.seed, hashString(key)));
        // Expert weights are split over "etp" (expert_tensor_parallel_size), the rest over "tp".
        const int t = p.expert ? m_ctx.etpSize : tpSize, r = p.expert ? m_ctx.etpRank : tpRank;
        if (t == 1 || p.shard == ShardKind::Replicated) {
            std::memcpy(dst, full.data(), full.size() * sizeof(float));
        } else if (p.shard == ShardKind::RowParallel) {
            const int64_t cl = C / t;
            for (int64_t row = 0; row < R; ++row)
                std::memcpy(dst + row * cl, full.data() + row * C + r * cl, size_t(cl) * sizeof(float));
        } else {
            // Column / vocab parallel: row blocks; stride 2 -> [gate_r ; up_r].
            const int64_t half = R / p.partitionStride, rl = half / t;
            for (int s = 0; s < p.partitionStride; ++s)
                std::memcpy(dst + s * rl * C, full.data() + (s * half + r * rl) * C,
                            size_t(rl * C) * sizeof(float));
        }
    }
    // The main params this buffer keeps (all, or with a sharded main its ranges) and the model copy.
    image->resize(size_t(m_params.numel()));
    TS_RETURN_IF_ERROR(m_params.mainParamsFromHost(m_exec.stream(), *image));
    return m_exec.synchronize();
}

Status GptModel::useWeights(const std::vector<int>& params) {
    if (!m_params.bf16()) return Status::ok();
    std::vector<int> key;
    for (int i : params)
        if (i >= 0 && !fp8CopyCurrent(i)) key.push_back(i);
    std::sort(key.begin(), key.end());
    if (m_workingDepth > 0) {
        for (int i : key)
            if (!std::binary_search(m_workingParams.begin(), m_workingParams.end(), i))
                return Status::internal("weights of '" + m_params.info(i).name + "' used inside another part's");
        ++m_workingDepth;
        return Status::ok();
    }
    // The params' ranges of the buffer, merged across the distributed optimizer's padding.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int i : key) ranges.push_back({m_params.info(i).offset, m_params.info(i).offset + m_params.info(i).numel});
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::array<int64_t, 3>> spans;  // begin, end, offset in the working copy
    int64_t total = 0;
    constexpr int64_t kMergeGap = 256;
    for (const auto& [lo, hi] : ranges) {
        if (!spans.empty() && lo <= spans.back()[1] + kMergeGap) {
            total += std::max<int64_t>(0, hi - spans.back()[1]);
            spans.back()[1] = std::max(spans.back()[1], hi);
            continue;
        }
        spans.push_back({lo, hi, total});
        total += hi - lo;
    }
    // Not zeroed: bf16.weights writes every span (padding included).
    TS_ASSIGN_OR_RETURN(TensorPtr work, allocUninitialized(m_exec, std::max<int64_t>(total, 1), MemCategory::Workspace));
    float* w = fp(work);
    for (int i : key) {
        const int64_t off = m_params.info(i).offset;
        for (const auto& s : spans)
            if (off >= s[0] && off < s[1]) m_params.setWorking(i, w + s[2] + (off - s[0]));
    }
    const uint16_t* bits = m_params.modelBits();
    auto sp = std::make_shared<std::vector<std::array<int64_t, 3>>>(spans);
    m_exec.op("bf16.weights", Category::Memcpy, 0, uint64_t(total) * 6, [=] {
        for (const auto& s : *sp) k::bf16ToFloat(bits + s[0], w + s[2], s[1] - s[0]);
    });
    // A device's bf16 GEMMs read the bits instead of converting the working copy again (the same
    // values; TS_BF16_WEIGHT_TWINS=0 converts instead, to tell the two apart on a GPU).
    static const bool twinsOff = [] {
        const char* v = std::getenv("TS_BF16_WEIGHT_TWINS");
        return v && std::string(v) == "0";
    }();
    m_workingTwins = m_params.bf16Gemms() && k::streamOnDevice(m_exec.stream()) && !twinsOff;
    if (m_workingTwins)
        for (const auto& s : spans) k::bindBf16Twin(w + s[2], bits + s[0], s[1] - s[0]);
    m_working = std::move(work);
    m_workingSpans = std::move(spans);
    m_workingParams = std::move(key);
    m_workingDepth = 1;
    return Status::ok();
}

void GptModel::releaseWeights() {
    if (m_workingDepth == 0 || --m_workingDepth > 0) return;
    TensorPtr work = std::move(m_working);
    if (m_workingTwins)
        for (const auto& s : m_workingSpans) k::unbindBf16Twin(fp(work) + s[2]);
    m_workingSpans.clear();
    m_workingParams.clear();
    m_params.clearWorking();
    m_exec.stream().keepUntilPassed(std::move(work));  // until the part's ops ran
}

void GptModel::beginStep(int step, int numMicrobatches) {
    m_step = step;
    m_numMicrobatches = std::max(1, numMicrobatches);
    m_backwardsThisStep = 0;
    // A step that ended early (cancelled, failed, a failed graph capture) leaves microbatches in
    // flight: their saved activations are dropped, so the next step can run them again.
    m_mbs.clear();
    // A step that ended before its last backward leaves counters behind: they are its data.
    const Status stats = flushRouterStats();
    if (!stats.isOk())
        std::fprintf(stderr, "trainscope: the MoE router's counters were lost: %s\n", stats.toString().c_str());
    m_exec.setStep(step);
    if (m_dropKey) {
        // The step's dropout key, where every dropout kernel of the step reads it (dropSeed): a
        // captured graph's kernels then draw this step's masks too.
        const uint64_t key = dropoutStepKey(m_o.seed, step);
        const TensorPtr buf = m_dropKey;
        m_exec.op("dropout_seed.upload", Category::Memcpy, 0, sizeof key,
                  [buf, key] { k::copyBytes(buf->data(), &key, sizeof key); });
    }
    fp8StepUpdate();
    fp8ExpertStepUpdate();
}

kernels::hd::DropoutSeed GptModel::dropSeed(int mb, int layer, int site) const {
    return {m_dropKey ? m_dropKey->as<uint64_t>() : nullptr, dropoutSiteKey(mb, layer, site)};
}

int GptModel::localTokens() const {
    const int T = m_d.seq * m_d.microBatch;
    return m_sp ? T / m_ctx.tpSize : T;
}

std::vector<GptModel::DropPiece> GptModel::hiddenDropPieces() const {
    // Token rows t = i*b + bi ([s, b, h] flattened); SP rank r holds local rows [r*TL, (r+1)*TL).
    const int64_t b = m_d.microBatch, h = m_d.hidden, TL = localTokens();
    const int64_t lo = m_sp ? int64_t(m_ctx.tpRank) * TL : 0, hi = lo + TL;
    std::vector<DropPiece> out;
    for (const RopeSegment& sg : m_ropeSegs) {
        const int64_t s0 = int64_t(sg.start) * b, s1 = int64_t(sg.start + sg.len) * b;  // local token rows
        const int64_t a = std::max(lo, s0), e = std::min(hi, s1);
        if (a >= e) continue;
        out.push_back({(a - lo) * h, (int64_t(sg.pos) * b + (a - s0)) * h, (e - a) * h});
    }
    return out;
}

int GptModel::recomputeGroupStart(int li) const {
    if (m_o.recomputeGranularity != "full") return -1;
    const int n = std::max(1, m_o.recomputeNumLayers);
    if (m_o.recomputeMethod == "uniform") return (li / n) * n;
    if (m_o.recomputeMethod == "block") return li < n ? li : -1;
    return -1;
}

int GptModel::recomputeGroupEnd(int li) const {
    const int g0 = recomputeGroupStart(li);
    if (g0 < 0) return -1;
    if (m_o.recomputeMethod == "block") return li + 1;
    return std::min(localLayers(), g0 + std::max(1, m_o.recomputeNumLayers));
}

Result<KernelIds> GptModel::kernelIds(std::shared_ptr<const Microbatch> data, const std::vector<int32_t>& host) {
    return kernelInts(m_exec, host.data(), host.size(), std::move(data));
}

Status GptModel::checkMicrobatch(const Microbatch* data) const {
    const int T = m_d.seq * m_d.microBatch;
    if (!m_ctx.firstStage && !m_ctx.lastStage) return Status::ok();
    if (!data) return Status::invalid("microbatch data missing");
    if (m_ctx.firstStage && data->tokens.size() != size_t(T))
        return Status::invalid("microbatch has " + std::to_string(data->tokens.size()) +
                               " tokens, the model expects seq_length*micro_batch_size=" + std::to_string(T));
    if (m_ctx.lastStage && data->labels.size() != size_t(T))
        return Status::invalid("microbatch has " + std::to_string(data->labels.size()) + " labels, expected " +
                               std::to_string(T));
    if (!data->lossMask.empty() && data->lossMask.size() != size_t(T))
        return Status::invalid("loss mask size does not match the microbatch");
    if (m_ctx.firstStage) {
        if (int bad = k::countInvalidIds(data->tokens.data(), T, m_d.vocab))
            return Status::invalid(std::to_string(bad) + " token ids are outside [0, vocab_size=" +
                                   std::to_string(m_d.vocab) + "); check the tokenizer/vocab_size");
    }
    if (m_ctx.lastStage) {
        if (int bad = k::countInvalidIds(data->labels.data(), T, m_d.vocab))
            return Status::invalid(std::to_string(bad) + " labels are outside [0, vocab_size=" +
                                   std::to_string(m_d.vocab) + ")");
    }
    return Status::ok();
}

std::shared_ptr<std::vector<float>> GptModel::lossSeed(const Microbatch& data) const {
    const int T = m_d.seq * m_d.microBatch;
    // Context parallel: each rank holds part of the microbatch's tokens; the loss is divided by
    // the whole microbatch's token count and, as Megatron's loss_func, multiplied by cp (the
    // gradients are then averaged over the dp-cp group, so the cp ranks' shares add up).
    const double cpScale = double(m_ctx.cpSize);
    auto seed = std::make_shared<std::vector<float>>(size_t(T));
    double tokens = data.tokensTotal;
    if (tokens <= 0)
        for (int t = 0; t < T; ++t) tokens += data.lossMask.empty() ? 1.0 : data.lossMask[size_t(t)];
    const double denom = std::max(tokens, 1.0) * m_numMicrobatches / cpScale;
    for (int t = 0; t < T; ++t)
        (*seed)[size_t(t)] = float((data.lossMask.empty() ? 1.0 : data.lossMask[size_t(t)]) / denom);
    return seed;
}

Status GptModel::stageInputs(int mb, std::shared_ptr<const Microbatch> data) {
    const int T = m_d.seq * m_d.microBatch;
    TS_RETURN_IF_ERROR(checkMicrobatch(data.get()));
    StagedInputs& s = m_staged[mb];
    if (m_ctx.firstStage && !s.ids) { TS_ASSIGN_OR_RETURN(s.ids, m_exec.alloc(T, MemCategory::Workspace, sizeof(int32_t))); }
    if (m_ctx.lastStage && !s.labels) {
        TS_ASSIGN_OR_RETURN(s.labels, m_exec.alloc(T, MemCategory::Workspace, sizeof(int32_t)));
        TS_ASSIGN_OR_RETURN(s.seed, m_exec.alloc(T, MemCategory::Workspace));
        TS_ASSIGN_OR_RETURN(s.loss, m_exec.alloc(T, MemCategory::Workspace));
    }
    s.data = data;
    std::shared_ptr<std::vector<float>> seed;
    if (m_ctx.lastStage) seed = lossSeed(*data);
    m_exec.setMicrobatch(mb);
    m_exec.setLayer(-1);
    const TensorPtr ids = s.ids, labels = s.labels, seedBuf = s.seed;
    // copyBytes reads a host source at the call (staged, as cudaMemcpyAsync does pageable memory)
    m_exec.op("inputs.upload", Category::Memcpy, 0, uint64_t(T) * 12, [=] {
        const size_t n = size_t(T);
        if (ids) k::copyBytes(ids->data(), data->tokens.data(), n * sizeof(int32_t));
        if (labels) {
            k::copyBytes(labels->data(), data->labels.data(), n * sizeof(int32_t));
            k::copyBytes(seedBuf->data(), seed->data(), n * sizeof(float));
        }
    });
    if (m_ctx.lastStage) m_pendingLosses[mb] = {s.loss, T, data};
    return Status::ok();
}

const GptModel::StagedInputs* GptModel::staged(int mb, const std::shared_ptr<const Microbatch>& data) const {
    auto it = m_staged.find(mb);
    return it != m_staged.end() && data && it->second.data == data ? &it->second : nullptr;
}

Status GptModel::forward(int mb, std::shared_ptr<const Microbatch> data, TensorPtr input, TensorPtr output) {
    const int64_t ThL = stageTensorElems();
    if (m_mbs.count(mb)) return Status::internal("microbatch " + std::to_string(mb) + " is already in flight");
    const StagedInputs* in = staged(mb, data);
    if (!in) TS_RETURN_IF_ERROR(checkMicrobatch(data.get()));  // stageInputs checked it
    if (!m_ctx.firstStage && (!input || input->bytes() < size_t(ThL) * 4))
        return Status::invalid("non-first pipeline stage needs an input tensor of [s*b, h] ([s/t*b, h] with "
                               "sequence_parallel)");
    if (!m_ctx.lastStage && (!output || output->bytes() < size_t(ThL) * 4))
        return Status::invalid("non-last pipeline stage needs an output tensor of [s*b, h] ([s/t*b, h] with "
                               "sequence_parallel)");

    m_exec.setMicrobatch(mb);
    RangeScope range(m_exec.device(), range::kForward, {m_step, mb, m_ctx.vppChunk, -1});
    auto st = std::make_unique<MbState>();
    st->data = data;
    st->layers.resize(m_layers.size());
    if (in) {
        if (in->ids) st->ids = KernelIds{static_cast<const int32_t*>(in->ids->data()), in->ids};
        if (in->labels) st->labels = KernelIds{static_cast<const int32_t*>(in->labels->data()), in->labels};
    } else {
        if (m_ctx.firstStage) { TS_ASSIGN_OR_RETURN(st->ids, kernelIds(data, data->tokens)); }
        if (m_ctx.lastStage) { TS_ASSIGN_OR_RETURN(st->labels, kernelIds(data, data->labels)); }
    }
    if (m_ctx.firstStage) {
        m_exec.setLayer(-1);
        if (m_forwardPreHook) m_forwardPreHook(embeddingParamList());
        TS_RETURN_IF_ERROR(embeddingForward(*st, mb));
    } else {
        st->hidden = input;
    }
    for (int li = 0; li < localLayers(); ++li) {
        const bool keep = recomputeGroupStart(li) < 0;
        if (m_forwardPreHook) m_forwardPreHook(layerParamList(li));
        TS_RETURN_IF_ERROR(layerForward(*st, li, keep));
        TS_RETURN_IF_ERROR(saveBf16(st->layers[size_t(li)], li));
        m_exec.throttle();
    }
    if (m_ctx.lastStage) {
        if (m_forwardPreHook) {
            std::vector<int> ps{m_lnfW, m_outW};
            if (m_lnfB >= 0) ps.push_back(m_lnfB);
            m_forwardPreHook(ps);
        }
        TS_RETURN_IF_ERROR(finalForward(*st));
        m_exec.throttle();  // the output layer is a part like a layer: its working copies too
    } else {
        TensorPtr hid = st->hidden;
        m_exec.op("stage_output_copy", Category::Memcpy, 0, uint64_t(ThL) * 8,
                  [=] { k::copyBytes(output->data(), hid->data(), size_t(ThL) * sizeof(float)); });
    }
    st->hidden.reset();
    m_mbs[mb] = std::move(st);
    return Status::ok();
}

Status GptModel::backward(int mb, TensorPtr gradOutput, TensorPtr gradInput) {
    auto it = m_mbs.find(mb);
    if (it == m_mbs.end()) return Status::internal("backward of microbatch " + std::to_string(mb) + " without forward");
    const int64_t ThL = stageTensorElems();
    if (!m_ctx.lastStage && (!gradOutput || gradOutput->bytes() < size_t(ThL) * 4))
        return Status::invalid("non-last pipeline stage needs the output gradient [s*b, h] ([s/t*b, h] with "
                               "sequence_parallel)");
    if (!m_ctx.firstStage && (!gradInput || gradInput->bytes() < size_t(ThL) * 4))
        return Status::invalid("non-first pipeline stage needs a gradInput tensor of [s*b, h] ([s/t*b, h] with "
                               "sequence_parallel)");
    std::unique_ptr<MbState> st = std::move(it->second);
    m_mbs.erase(it);
    m_exec.setMicrobatch(mb);
    RangeScope range(m_exec.device(), range::kBackward, {m_step, mb, m_ctx.vppChunk, -1});
    m_lastBackward = ++m_backwardsThisStep == m_numMicrobatches;

    TensorPtr dh;
    if (m_ctx.lastStage) {
        TS_RETURN_IF_ERROR(finalBackward(*st, &dh));
        m_exec.throttle();
        {
            std::vector<int> ps{m_lnfW};
            if (m_lnfB >= 0) ps.push_back(m_lnfB);
            if (m_outW != m_embW) ps.push_back(m_outW);  // tied on one stage: embedding.bwd adds more
            TS_RETURN_IF_ERROR(gradsReady(ps));
        }
    } else {
        dh = gradOutput;
    }
    for (int li = localLayers() - 1; li >= 0; --li) {
        const int g0 = recomputeGroupStart(li);
        if (g0 >= 0 && li == recomputeGroupEnd(li) - 1) {
            // Full recompute: rerun the group's forward from its checkpointed input (same
            // dropout seeds, same kernels -> bit-identical activations), keeping everything.
            TS_RETURN_IF_ERROR(restoreBf16(st->layers[size_t(g0)]));
            st->hidden = st->layers[size_t(g0)].x;
            m_recomputing = true;
            for (int j = g0; j <= li; ++j) {
                const Status fs = layerForward(*st, j, true);
                if (!fs.isOk()) {
                    m_recomputing = false;
                    return fs;
                }
                m_exec.throttle();
            }
            m_recomputing = false;
            st->hidden.reset();
        }
        TensorPtr dx;
        TS_RETURN_IF_ERROR(restoreBf16(st->layers[size_t(li)]));
        TS_RETURN_IF_ERROR(layerBackward(*st, li, dh, &dx));
        TS_RETURN_IF_ERROR(gradsReady(layerParamList(li)));
        st->layers[size_t(li)] = LayerActs{};
        dh = dx;
        m_exec.throttle();
    }
    if (m_ctx.firstStage) {
        TS_RETURN_IF_ERROR(embeddingBackward(*st, dh));
        TS_RETURN_IF_ERROR(gradsReady(embeddingParamList()));
    } else {
        TensorPtr src = dh;
        m_exec.op("stage_grad_copy", Category::Memcpy, 0, uint64_t(ThL) * 8,
                  [=] { k::copyBytes(gradInput->data(), src->data(), size_t(ThL) * sizeof(float)); });
    }
    if (m_lastBackward) TS_RETURN_IF_ERROR(moeStepEnd());
    return Status::ok();
}

std::vector<int> GptModel::embeddingParamList() const {
    std::vector<int> out{m_embW};
    if (m_posW >= 0) out.push_back(m_posW);
    return out;
}

std::vector<int> GptModel::layerParamList(int li) const {
    const LayerParams& P = m_layers[size_t(li)];
    std::vector<int> out;
    for (int i : {P.ln1w, P.ln1b, P.qkvW, P.qkvB, P.projW, P.projB, P.ln2w, P.ln2b, P.fc1W, P.fc1B, P.fc2W, P.fc2B,
                  P.routerW, P.routerB})
        if (i >= 0) out.push_back(i);
    for (size_t e = 0; e < P.expFc1W.size(); ++e) {
        out.push_back(P.expFc1W[e]);
        out.push_back(P.expFc2W[e]);
        if (e < P.expFc1B.size()) {
            out.push_back(P.expFc1B[e]);
            out.push_back(P.expFc2B[e]);
        }
    }
    for (int i : {P.shFc1W, P.shFc2W, P.shGateW})
        if (i >= 0) out.push_back(i);
    return out;
}

Status GptModel::readBackLosses() {
    auto pending = std::move(m_pendingLosses);
    m_pendingLosses.clear();
    // Gathered into one buffer by stream copies, then one download: one wait, also on CUDA (whose
    // copies into pageable host memory each block).
    int64_t total = 0;
    for (const auto& [mb, p] : pending) total += p.T;
    TS_ASSIGN_OR_RETURN(TensorPtr all, m_exec.alloc(std::max<int64_t>(total, 1), MemCategory::Workspace));
    std::vector<float> flat(static_cast<size_t>(total));
    TS_RETURN_IF_ERROR(kern::runOp(m_exec.stream(), "loss_reduce", [&] {
        int64_t off = 0;
        for (const auto& [mb, p] : pending) {
            k::copyBytes(fp(all) + off, fp(p.loss), size_t(p.T) * sizeof(float));
            off += p.T;
        }
        k::download(flat.data(), fp(all), flat.size() * sizeof(float));
    }));
    int64_t off = 0;
    for (const auto& [mb, p] : pending) {
        const float* loss = flat.data() + off;
        off += p.T;
        const Microbatch& data = *p.data;
        double sum = 0, tokens = 0;
        for (int t = 0; t < p.T; ++t) {
            const double w = data.lossMask.empty() ? 1.0 : data.lossMask[size_t(t)];
            sum += w * double(loss[t]);
            tokens += w;
        }
        // With context parallel the rank's share: its sum over the whole microbatch's count.
        if (data.tokensTotal > 0) tokens = data.tokensTotal;
        m_losses[mb] = {sum, tokens};
    }
    return Status::ok();
}

double GptModel::microbatchLoss(int mb) {
    if (!m_pendingLosses.empty() && !readBackLosses().isOk()) return std::nan("");
    auto it = m_losses.find(mb);
    if (it == m_losses.end() || it->second.second <= 0) return std::nan("");
    return it->second.first / it->second.second;
}

const std::vector<float>& GptModel::capturedLogits(int mb) const {
    static const std::vector<float> empty;
    auto it = m_logits->find(mb);
    return it == m_logits->end() ? empty : it->second;
}

void GptModel::clearCaptured() {
    m_logits->clear();
    m_pendingLosses.clear();
    m_losses.clear();
}

}  // namespace ts::engine
