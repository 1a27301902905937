// GPT decoder with explicit per-layer forward/backward on the compute stream.
// Shapes below are local to the TP rank: nq = heads/t, ng = groups/t, F = ffn/t, Vl = V/t.
#include "engine/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/backend/backend_trace.h"
#include "engine/comm/communicator.h"
#include "kernels/cpu/ops.h"

namespace ts::engine {

namespace k = ts::kernels::cpu;
using trace::Category;

struct GptModel::LayerActs {
    TensorPtr x;                    // layer input (residual stream) [T, h]
    TensorPtr mean1, rstd1, a1;     // input_layernorm stats [T], output [T, h]
    TensorPtr q, k, v;              // after RoPE: [T, nq, d], [T, ng, d], [T, ng, d]
    TensorPtr probs;                // [b, nq, s, s]; null under selective recompute
    TensorPtr ctx;                  // core attention output [T, nq*d]
    TensorPtr mask1;                // dropout mask after linear_proj [T*h] (p > 0)
    TensorPtr x2;                   // residual after attention [T, h]
    TensorPtr mean2, rstd2, a2;     // pre_mlp_layernorm
    TensorPtr fc1;                  // linear_fc1 output [T, F or 2F] (SwiGLU: bias included)
    TensorPtr act;                  // activation output [T, F]
    TensorPtr mask2;                // dropout mask after linear_fc2
};

struct GptModel::MbState {
    std::shared_ptr<const Microbatch> data;
    std::vector<LayerActs> layers;
    TensorPtr hidden;               // current residual stream [T, h]
    TensorPtr embMask;              // embedding dropout mask
    TensorPtr xL, meanf, rstdf, xf; // final norm input/stats/output
    TensorPtr logits;               // [T, Vl]; fused CE: holds dlogits after forward
    TensorPtr ceProbs;              // unfused CE: softmax [T, V]
    TensorPtr rowMax, sumExp;       // vocab-parallel CE stats [T]
    TensorPtr dloss;                // [T] gradient seed per token
    bool backwardDone = false;
};

GptModel::GptModel(const Config& cfg, const ModelDims& d, const ModelOptions& o, Device& dev,
                   Stream& compute, const ParallelContext& ctx)
    : m_cfg(cfg), m_d(d), m_o(o), m_ctx(ctx), m_exec(dev, compute),
      m_sp(ctx.sequenceParallel && ctx.tpSize > 1),
      m_logits(std::make_shared<std::map<int, std::vector<float>>>()),
      m_losses(std::make_shared<std::map<int, std::pair<double, double>>>()) {}

GptModel::~GptModel() {
    (void)m_exec.synchronize();
    m_held.clear();
}

Result<std::unique_ptr<GptModel>> GptModel::create(const Config& cfg, Device& dev, Stream& compute,
                                                   const ParallelContext& ctxIn) {
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
    const ModelOptions o = modelOptionsFromConfig(cfg);
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
    TS_RETURN_IF_ERROR(m->registerParams());
    TS_RETURN_IF_ERROR(m->m_params.finalize(dev, o.bf16));
    m->initWeights();
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

    auto add = [&](std::string name, std::vector<int64_t> full, ShardKind kind, int stride = 1) {
        ParamInfo p;
        p.fullShape = full;
        p.shape = full;
        if (kind == ShardKind::ColumnParallel || kind == ShardKind::VocabParallel) p.shape[0] /= t;
        if (kind == ShardKind::RowParallel) p.shape[1] /= t;
        p.shard = t > 1 ? kind : ShardKind::Replicated;
        if (t == 1 && kind != ShardKind::Replicated) p.shard = kind;  // keep the role for docs/DP
        p.noWeightDecay = full.size() == 1;
        p.partitionStride = stride;
        p.name = std::move(name);
        return m_params.add(std::move(p));
    };
    const bool ln = !m_d.rmsNorm;
    if (m_ctx.firstStage)
        m_embW = add("embedding.word_embeddings.weight", {m_d.paddedVocab, h}, ShardKind::VocabParallel);
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
    // added after the reduce-scatter) sees only this rank's s/t tokens.
    if (m_sp)
        for (int i = 0; i < m_params.count(); ++i)
            if (m_params.info(i).shard == ShardKind::Replicated)
                const_cast<ParamInfo&>(m_params.info(i)).sequenceParallel = true;
    return Status::ok();
}

void GptModel::initWeights() {
    const int t = m_ctx.tpSize, r = m_ctx.tpRank;
    const float stdOut = m_o.initStd / std::sqrt(2.0f * float(m_d.layers));
    for (int i = 0; i < m_params.count(); ++i) {
        const ParamInfo& p = m_params.info(i);
        float* dst = m_params.mainParam(i);
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
        if (t == 1) {
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
    m_params.syncModelParams();
}

void GptModel::beginStep(int step, int numMicrobatches) {
    m_step = step;
    m_numMicrobatches = std::max(1, numMicrobatches);
    m_backwardsThisStep = 0;
    while (!m_held.empty() && m_held.front().done->query()) m_held.pop_front();
    m_exec.setStep(step);
}

int GptModel::localTokens() const {
    const int T = m_d.seq * m_d.microBatch;
    return m_sp ? T / m_ctx.tpSize : T;
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

void GptModel::tpAllReduce(const TensorPtr& t, int64_t n) {
    if (m_ctx.tp && m_ctx.tpSize > 1)
        m_ctx.tp->allReduce(m_exec.stream(), t->data(), t->data(), size_t(n), DType::F32, ReduceOp::Sum);
}

Result<TensorPtr> GptModel::seqGather(const TensorPtr& local, int64_t n) {
    TS_ASSIGN_OR_RETURN(TensorPtr full, m_exec.alloc(n * m_ctx.tpSize));
    m_ctx.tp->allGather(m_exec.stream(), local->data(), full->data(), size_t(n), DType::F32);
    holdUntilDone(local, full);
    return full;
}

Result<TensorPtr> GptModel::seqReduceScatter(const TensorPtr& full, int64_t n) {
    TS_ASSIGN_OR_RETURN(TensorPtr local, m_exec.alloc(n));
    m_ctx.tp->reduceScatter(m_exec.stream(), full->data(), local->data(), size_t(n), DType::F32, ReduceOp::Sum);
    holdUntilDone(full, local);
    return local;
}

void GptModel::holdUntilDone(TensorPtr a, TensorPtr b) {
    while (!m_held.empty() && m_held.front().done->query()) m_held.pop_front();
    Held h{m_exec.device().createEvent(), std::move(a), std::move(b)};
    m_exec.stream().record(*h.done);
    m_held.push_back(std::move(h));
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
                                               int out) {
    // dY [TL, out] is ring-gathered while the dgrad GEMM of the shards already here runs;
    // the wgrad (a sum over all T rows) runs once on the gathered dY.
    const float* W = m_params.modelParam(wIdx);
    const bool bf = m_o.bf16;
    auto dgrad = [=](const float* dy, float* dxr, int rows) {
        k::linearBackward(dy, nullptr, W, dxr, nullptr, nullptr, rows, in, out);
        if (bf) k::roundToBf16(dxr, int64_t(rows) * in);
    };
    TS_ASSIGN_OR_RETURN(TensorPtr dyFull,
                        m_tpo->agGemm(dgradName, dyLocal, localTokens(), out, dx, in, 2.0 * in * out, dgrad));
    return linearBackward(wgradName, wIdx, -1, dyFull, x, nullptr, T, in, out);
}

Result<TensorPtr> GptModel::columnParallelBackwardOverlapped(const char* dgradName, const char* wgradName, int wIdx,
                                                             int bIdx, TensorPtr dy, TensorPtr xLocal, int T, int in,
                                                             int out) {
    // dy: [T, out] (TP region), xLocal: the saved s-shard [TL, in]. Returns dX's shard [TL, in].
    const int TL = localTokens();
    const int64_t n = int64_t(TL) * in;
    const TpOverlapOptions& o = m_tpo->options();
    const float* W = m_params.modelParam(wIdx);
    const bool bf = m_o.bf16;
    auto dgrad = [=](const float* dyr, float* dxr, int rows) {
        k::linearBackward(dyr, nullptr, W, dxr, nullptr, nullptr, rows, in, out);
        if (bf) k::roundToBf16(dxr, int64_t(rows) * in);
    };
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
    TS_RETURN_IF_ERROR(linearBackward(wgradName, wIdx, bIdx, dy, x, nullptr, T, in, out));
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
        for (const auto& [g, len] : grads) dst = std::copy(g, g + len, dst);
    });
    m_ctx.tp->allReduce(m_exec.stream(), pack->data(), pack->data(), size_t(n), DType::F32, ReduceOp::Sum);
    m_exec.op("sp_grads.unpack", Category::Memcpy, 0, uint64_t(n) * 8, [=] {
        const float* src = fp(pack);
        for (const auto& [g, len] : grads) {
            std::copy(src, src + len, g);
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
    m_exec.op(name, Category::Norm, 8.0 * T * C, uint64_t(T) * C * 8, [=] {
        if (rms) k::rmsNormForward(fp(x), W, fp(y), fp(rstd), T, C, eps);
        else if (fused) k::layerNormForwardFused(fp(x), W, B, fp(y), fp(mean), fp(rstd), T, C, eps);
        else k::layerNormForward(fp(x), W, B, fp(y), fp(mean), fp(rstd), T, C, eps);
        if (bf) k::roundToBf16(fp(y), int64_t(T) * C);
    });
}

void GptModel::normBackward(const char* name, int wIdx, int bIdx, TensorPtr dy, TensorPtr x,
                            TensorPtr mean, TensorPtr rstd, TensorPtr dx, int T) {
    const float* W = m_params.modelParam(wIdx);
    float* dW = m_params.mainGrad(wIdx);
    float* dB = bIdx >= 0 ? m_params.mainGrad(bIdx) : nullptr;
    const int C = m_d.hidden;
    const bool rms = m_d.rmsNorm, fused = m_o.fusedLayerNorm;
    m_exec.op(name, Category::Norm, 12.0 * T * C, uint64_t(T) * C * 12, [=] {
        if (rms) k::rmsNormBackward(fp(dy), fp(x), W, fp(rstd), fp(dx), dW, T, C);
        else if (fused) k::layerNormBackwardFused(fp(dy), fp(x), W, fp(mean), fp(rstd), fp(dx), dW, dB, T, C);
        else k::layerNormBackward(fp(dy), fp(x), W, fp(mean), fp(rstd), fp(dx), dW, dB, T, C);
    });
}

Status GptModel::linearBackward(const char* name, int wIdx, int bIdx, TensorPtr dy, TensorPtr x,
                                TensorPtr dx, int T, int in, int out) {
    const float* W = m_params.modelParam(wIdx);
    float* G = m_params.mainGrad(wIdx);
    float* GB = bIdx >= 0 ? m_params.mainGrad(bIdx) : nullptr;
    const double flops = (dx ? 4.0 : 2.0) * double(T) * in * out;
    const uint64_t bytes = uint64_t(4) * (uint64_t(T) * (in + out) + uint64_t(in) * out);
    const bool bf = m_o.bf16;
    if (m_o.gradAccumFusion) {
        // wgrad GEMM accumulates straight into the fp32 main grad.
        m_exec.op(name, Category::Gemm, flops, bytes, [=] {
            k::linearBackward(fp(dy), fp(x), W, fp(dx), G, GB, T, in, out);
            if (bf && dx) k::roundToBf16(fp(dx), int64_t(T) * in);
        });
        return Status::ok();
    }
    // Unfused: wgrad into a temporary (in the model's precision), then added to the main grad.
    const int64_t n = int64_t(out) * in;
    TS_ASSIGN_OR_RETURN(TensorPtr tmp, m_exec.alloc(n, MemCategory::Workspace));
    m_exec.op(name, Category::Gemm, flops, bytes, [=] {
        std::fill(fp(tmp), fp(tmp) + n, 0.f);
        k::linearBackward(fp(dy), fp(x), W, fp(dx), fp(tmp), GB, T, in, out);
        if (bf && dx) k::roundToBf16(fp(dx), int64_t(T) * in);
    });
    m_exec.op("wgrad_accumulate", Category::Elementwise, double(n), uint64_t(n) * 12, [=] {
        if (bf) k::roundToBf16(fp(tmp), n);
        k::addInPlace(G, fp(tmp), n);
    });
    return Status::ok();
}

namespace {
// Exec::alloc without the zero fill, for buffers the producing op overwrites entirely.
Result<TensorPtr> allocUninitialized(Exec& ex, int64_t elems,
                                     MemCategory cat = MemCategory::Activations) {
    auto r = ex.device().allocateUninitialized(size_t(std::max<int64_t>(elems, 1)) * sizeof(float), cat);
    if (!r) return r.status();
    return TensorPtr(std::move(r).value());
}

// Core-attention dims of global layer gl (nq, ng: this rank's heads). Attention-dropout masks
// are keyed by (seed, step, microbatch, layer) and numbered over all heads, so TP ranks draw
// the single-device mask of their heads and recompute/backward regenerate the forward's mask.
k::AttnDims attnDims(const ModelDims& md, const ModelOptions& o, const ParallelContext& ctx, int nq,
                     int ng, int step, int mb, int gl) {
    k::AttnDims ad{md.seq, md.microBatch, nq, ng, md.headDim, 1.0f / std::sqrt(float(md.headDim))};
    ad.dropout = o.attentionDropout;
    ad.dropoutSeed = dropoutSeed(o.seed, step, mb, gl, 3);
    ad.headOffset = ctx.tpRank * nq;
    ad.nqTotal = md.heads;
    return ad;
}
}  // namespace

// ---------------------------------------------------------------------------------------
Status GptModel::layerForward(MbState& st, int li, bool keep) {
    LayerActs& A = st.layers[size_t(li)];
    const LayerParams& P = m_layers[size_t(li)];
    const int gl = m_ctx.layerBegin + li;
    m_exec.setLayer(gl);
    RangeScope range(m_exec.device(), range::kLayer, {m_step, m_exec.microbatch(), m_ctx.vppChunk, gl});
    const int s = m_d.seq, b = m_d.microBatch, T = s * b, h = m_d.hidden, d = m_d.headDim;
    const int nq = m_nqL, ng = m_ngL, F = m_ffnL, F1 = m_d.swiglu ? 2 * F : F;
    const int qkvOut = (nq + 2 * ng) * d;
    // SP regions hold TL = T/t rows (this rank's s-shard); the TP region between the
    // all-gather and the reduce-scatter holds all T rows. Without SP, TL = T.
    const int TL = localTokens();
    const int64_t Th = int64_t(T) * h, ThL = int64_t(TL) * h;
    // Dropout mask elements are numbered as in the unsharded [T, h] tensor, so the SP masks
    // are exactly the single-device mask's rows of this shard.
    const uint64_t dropOffset = m_sp ? uint64_t(m_ctx.tpRank) * uint64_t(ThL) : 0;
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
    // SP: only the local a1 [TL, h] is saved; the gathered [T, h] lives until the GEMM ran.
    // tp_comm_overlap_ag: the all-gather is pipelined with the GEMM shard by shard instead.
    const bool agOverlap = m_tpo && m_tpo->options().overlapAg;
    const bool rsOverlap = m_tpo && m_tpo->options().overlapRs;
    TensorPtr a1Full = A.a1;
    if (m_sp && !agOverlap) { TS_ASSIGN_OR_RETURN(a1Full, seqGather(A.a1, ThL)); }

    // linear_qkv (column parallel; bias sharded with the rows)
    TS_ASSIGN_OR_RETURN(TensorPtr qkv, alloc(int64_t(T) * qkvOut));
    {
        const float* W = m_params.modelParam(P.qkvW);
        const float* B = P.qkvB >= 0 ? m_params.modelParam(P.qkvB) : nullptr;
        auto gemm = [=](const float* x, float* y, int rows) {
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
        if (rope && fusedRope) {
            // apply_rope_fusion: the layout copy and the rotation in one pass over qkv
            m_exec.op("qkv_split_rope.fwd", Category::Elementwise, 6.0 * T * (nq + ng) * d,
                      uint64_t(T) * qkvOut * 8, [=] {
                          k::splitQkvRopeForward(fp(qkv), fp(q), fp(kk), fp(v), s, b, nq, ng, d, theta, 0);
                          if (bf) {
                              k::roundToBf16(fp(q), int64_t(T) * nq * d);
                              k::roundToBf16(fp(kk), int64_t(T) * ng * d);
                          }
                      });
        } else {
            m_exec.op("qkv_split", Category::Elementwise, 0, uint64_t(T) * qkvOut * 8,
                      [=] { splitQkv(fp(qkv), fp(q), fp(kk), fp(v), T, nq, ng, d); });
        }
        if (rope && !fusedRope) {
            m_exec.op("rope.fwd", Category::Elementwise, 6.0 * T * (nq + ng) * d,
                      uint64_t(T) * (nq + ng) * d * 8, [=] {
                          k::ropeForward(fp(q), s, b, nq, d, theta, 0);
                          k::ropeForward(fp(kk), s, b, ng, d, theta, 0);
                          if (bf) {
                              k::roundToBf16(fp(q), int64_t(T) * nq * d);
                              k::roundToBf16(fp(kk), int64_t(T) * ng * d);
                          }
                      });
        }
    }
    // core attention
    const k::AttnDims ad = attnDims(m_d, m_o, m_ctx, nq, ng, m_step, m_exec.microbatch(), gl);
    TS_ASSIGN_OR_RETURN(TensorPtr probs, alloc(int64_t(k::attentionProbsSize(ad))));
    TS_ASSIGN_OR_RETURN(A.ctx, alloc(int64_t(T) * nq * d));
    {
        TensorPtr q = A.q, kk = A.k, v = A.v, ctx = A.ctx;
        const bool fs = m_o.fusedSoftmax;
        m_exec.op("core_attention.fwd", Category::Attention, 4.0 * b * nq * double(s) * s * d,
                  uint64_t(4) * (uint64_t(T) * (2 * nq + 2 * ng) * d + k::attentionProbsSize(ad)), [=] {
                      k::attentionForward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(ctx), fs);
                      if (bf) k::roundToBf16(fp(ctx), int64_t(T) * nq * d);
                  });
    }
    const bool selective = m_o.recomputeGranularity == "selective";
    if (!selective) A.probs = probs;
    probs.reset();

    // linear_proj (row parallel, bias after the reduction) + bias-dropout-add
    TensorPtr proj;
    {
        const float* W = m_params.modelParam(P.projW);
        TensorPtr ctx = A.ctx;
        const int in = nq * d;
        auto gemm = [=](const float* x, float* y, int rows) { k::linearForward(x, W, nullptr, y, rows, in, h); };
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
    TS_ASSIGN_OR_RETURN(A.x2, alloc(ThL));
    if (p > 0) { TS_ASSIGN_OR_RETURN(A.mask1, m_exec.alloc(ThL, MemCategory::Activations, 1)); }
    {
        const float* B = P.projB >= 0 ? m_params.modelParam(P.projB) : nullptr;
        TensorPtr x = A.x, x2 = A.x2, mask = A.mask1;
        const uint64_t seed = dropoutSeed(m_o.seed, m_step, m_exec.microbatch(), gl, 1);
        const bool fused = m_o.fusedBiasDropout;
        m_exec.op("bias_dropout_add.attn", Category::Elementwise, 3.0 * ThL, uint64_t(ThL) * 16, [=] {
            uint8_t* mk = mask ? mask->as<uint8_t>() : nullptr;
            if (fused) k::biasDropoutAddFused(fp(proj), B, fp(x), fp(x2), mk, TL, h, p, seed, dropOffset);
            else k::biasDropoutAddUnfused(fp(proj), B, fp(x), fp(x2), mk, TL, h, p, seed, dropOffset);
            if (bf) k::roundToBf16(fp(x2), ThL);
        });
    }
    proj.reset();

    // MLP
    TS_ASSIGN_OR_RETURN(A.a2, alloc(ThL));
    if (!rms) { TS_ASSIGN_OR_RETURN(A.mean2, alloc(TL)); }
    TS_ASSIGN_OR_RETURN(A.rstd2, alloc(TL));
    normForward("pre_mlp_layernorm.fwd", P.ln2w, P.ln2b, A.x2, A.a2, A.mean2, A.rstd2, TL);
    TensorPtr a2Full = A.a2;
    if (m_sp && !agOverlap) { TS_ASSIGN_OR_RETURN(a2Full, seqGather(A.a2, ThL)); }
    TS_ASSIGN_OR_RETURN(A.fc1, alloc(int64_t(T) * F1));
    TS_ASSIGN_OR_RETURN(A.act, alloc(int64_t(T) * F));
    {
        const float* W = m_params.modelParam(P.fc1W);
        const float* B = P.fc1B >= 0 ? m_params.modelParam(P.fc1B) : nullptr;
        TensorPtr a2 = a2Full, fc1 = A.fc1, act = A.act;
        const bool swiglu = m_d.swiglu, fusedAct = m_o.fusedBiasAct;
        auto gemm = [=](const float* x, float* y, int rows) {
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
        TensorPtr act = A.act;
        auto gemm = [=](const float* x, float* y, int rows) { k::linearForward(x, W, nullptr, y, rows, F, h); };
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
    TS_ASSIGN_OR_RETURN(TensorPtr out, alloc(ThL));
    if (p > 0) { TS_ASSIGN_OR_RETURN(A.mask2, m_exec.alloc(ThL, MemCategory::Activations, 1)); }
    {
        const float* B = P.fc2B >= 0 ? m_params.modelParam(P.fc2B) : nullptr;
        TensorPtr x2 = A.x2, mask = A.mask2;
        const uint64_t seed = dropoutSeed(m_o.seed, m_step, m_exec.microbatch(), gl, 2);
        const bool fused = m_o.fusedBiasDropout;
        m_exec.op("bias_dropout_add.mlp", Category::Elementwise, 3.0 * ThL, uint64_t(ThL) * 16, [=] {
            uint8_t* mk = mask ? mask->as<uint8_t>() : nullptr;
            if (fused) k::biasDropoutAddFused(fp(fc2), B, fp(x2), fp(out), mk, TL, h, p, seed, dropOffset);
            else k::biasDropoutAddUnfused(fp(fc2), B, fp(x2), fp(out), mk, TL, h, p, seed, dropOffset);
            if (bf) k::roundToBf16(fp(out), ThL);
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
    const int s = m_d.seq, b = m_d.microBatch, T = s * b, h = m_d.hidden, d = m_d.headDim;
    const int nq = m_nqL, ng = m_ngL, F = m_ffnL, F1 = m_d.swiglu ? 2 * F : F;
    const int qkvOut = (nq + 2 * ng) * d;
    const int TL = localTokens();  // rows in SP regions (= T without SP)
    const int64_t Th = int64_t(T) * h, ThL = int64_t(TL) * h;
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
        });
    }
    // SP: the backward of the forward reduce-scatter is an all-gather of dY along s.
    const bool agOverlap = m_tpo && m_tpo->options().overlapAg;
    TS_ASSIGN_OR_RETURN(TensorPtr dact, alloc(int64_t(T) * F));
    if (agOverlap) {
        TS_RETURN_IF_ERROR(rowParallelBackwardOverlapped("linear_fc2.dgrad", "linear_fc2.wgrad", P.fc2W, dfc2, A.act,
                                                         dact, T, F, h));
    } else {
        if (m_sp) { TS_ASSIGN_OR_RETURN(dfc2, seqGather(dfc2, ThL)); }
        TS_RETURN_IF_ERROR(linearBackward("linear_fc2.bwd", P.fc2W, -1, dfc2, A.act, dact, T, F, h));
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
        TensorPtr a2Full = A.a2;
        if (m_sp) { TS_ASSIGN_OR_RETURN(a2Full, seqGather(A.a2, ThL)); }
        TS_ASSIGN_OR_RETURN(da2, alloc(Th));
        TS_RETURN_IF_ERROR(linearBackward("linear_fc1.bwd", P.fc1W, -1, dfc1, a2Full, da2, T, h, F1));
        a2Full.reset();
        if (m_sp) { TS_ASSIGN_OR_RETURN(da2, seqReduceScatter(da2, ThL)); }
        else tpAllReduce(da2, Th);
    }
    dfc1.reset();
    TS_ASSIGN_OR_RETURN(TensorPtr dx2, alloc(ThL));
    normBackward("pre_mlp_layernorm.bwd", P.ln2w, P.ln2b, da2, A.x2, A.mean2, A.rstd2, dx2, TL);
    da2.reset();
    m_exec.op("residual_grad_add", Category::Elementwise, double(ThL), uint64_t(ThL) * 12,
              [=] { k::addInPlace(fp(dx2), fp(dout), ThL); });

    // attention block
    TS_ASSIGN_OR_RETURN(TensorPtr dproj, alloc(ThL));
    {
        float* GB = P.projB >= 0 ? m_params.mainGrad(P.projB) : nullptr;
        TensorPtr mask = A.mask1;
        m_exec.op("bias_dropout_add.attn.bwd", Category::Elementwise, 2.0 * ThL, uint64_t(ThL) * 8, [=] {
            k::biasDropoutAddBackward(fp(dx2), mask ? mask->as<uint8_t>() : nullptr, fp(dproj), GB, TL, h, p);
        });
    }
    TS_ASSIGN_OR_RETURN(TensorPtr dctx, alloc(int64_t(T) * nq * d));
    if (agOverlap) {
        TS_RETURN_IF_ERROR(rowParallelBackwardOverlapped("linear_proj.dgrad", "linear_proj.wgrad", P.projW, dproj,
                                                         A.ctx, dctx, T, nq * d, h));
    } else {
        if (m_sp) { TS_ASSIGN_OR_RETURN(dproj, seqGather(dproj, ThL)); }
        TS_RETURN_IF_ERROR(linearBackward("linear_proj.bwd", P.projW, -1, dproj, A.ctx, dctx, T, nq * d, h));
    }
    dproj.reset();

    // same dims (and so the same dropout mask) as the forward
    const k::AttnDims ad = attnDims(m_d, m_o, m_ctx, nq, ng, m_step, m_exec.microbatch(), gl);
    TensorPtr probs = A.probs;
    TensorPtr q = A.q, kk = A.k, v = A.v;
    if (!probs) {
        // Selective recompute: redo QK^T/softmax (the "5as/h" activations were not kept).
        TS_ASSIGN_OR_RETURN(probs, alloc(int64_t(k::attentionProbsSize(ad))));
        TS_ASSIGN_OR_RETURN(TensorPtr ctxTmp, alloc(int64_t(T) * nq * d));
        const bool fs = m_o.fusedSoftmax;
        m_exec.op("core_attention.recompute", Category::Attention, 4.0 * b * nq * double(s) * s * d,
                  uint64_t(4) * k::attentionProbsSize(ad),
                  [=] { k::attentionForward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(ctxTmp), fs); });
    }
    TS_ASSIGN_OR_RETURN(TensorPtr dq, alloc(int64_t(T) * nq * d));
    TS_ASSIGN_OR_RETURN(TensorPtr dk, alloc(int64_t(T) * ng * d));
    TS_ASSIGN_OR_RETURN(TensorPtr dv, alloc(int64_t(T) * ng * d));
    TS_ASSIGN_OR_RETURN(TensorPtr scratch, allocUninitialized(m_exec, int64_t(k::attentionScratchSize(ad)),
                                                              MemCategory::Workspace));
    const bool fusedSoftmax = m_o.fusedSoftmax;
    m_exec.op("core_attention.bwd", Category::Attention, 8.0 * b * nq * double(s) * s * d,
              uint64_t(8) * k::attentionProbsSize(ad), [=] {
                  k::attentionBackward(ad, fp(q), fp(kk), fp(v), fp(probs), fp(dctx), fp(dq), fp(dk), fp(dv),
                                       fp(scratch), fusedSoftmax);
              });
    probs.reset();
    scratch.reset();
    dctx.reset();
    const bool ropeMerge = m_d.rope && m_o.fusedRope;  // rope backward fused into the merge copy
    if (m_d.rope && !ropeMerge) {
        const float theta = m_d.ropeTheta;
        m_exec.op("rope.bwd", Category::Elementwise, 6.0 * T * (nq + ng) * d, uint64_t(T) * (nq + ng) * d * 8, [=] {
            k::ropeBackward(fp(dq), s, b, nq, d, theta, 0);
            k::ropeBackward(fp(dk), s, b, ng, d, theta, 0);
        });
    }
    TS_ASSIGN_OR_RETURN(TensorPtr dqkv, alloc(int64_t(T) * qkvOut));
    if (ropeMerge) {
        const float theta = m_d.ropeTheta;
        m_exec.op("qkv_merge_rope.bwd", Category::Elementwise, 6.0 * T * (nq + ng) * d, uint64_t(T) * qkvOut * 8, [=] {
            k::ropeBackwardMergeQkv(fp(dq), fp(dk), fp(dv), fp(dqkv), s, b, nq, ng, d, theta, 0);
            if (bf) k::roundToBf16(fp(dqkv), int64_t(T) * qkvOut);
        });
    } else {
        m_exec.op("qkv_merge", Category::Elementwise, 0, uint64_t(T) * qkvOut * 8, [=] {
            mergeQkv(fp(dq), fp(dk), fp(dv), fp(dqkv), T, nq, ng, d);
            if (bf) k::roundToBf16(fp(dqkv), int64_t(T) * qkvOut);
        });
    }
    dq.reset(); dk.reset(); dv.reset();
    TensorPtr da1;
    if (m_tpo) {
        TS_ASSIGN_OR_RETURN(da1, columnParallelBackwardOverlapped("linear_qkv.dgrad", "linear_qkv.wgrad", P.qkvW,
                                                                  P.qkvB, dqkv, A.a1, T, h, qkvOut));
    } else {
        TensorPtr a1Full = A.a1;
        if (m_sp) { TS_ASSIGN_OR_RETURN(a1Full, seqGather(A.a1, ThL)); }
        TS_ASSIGN_OR_RETURN(da1, alloc(Th));
        TS_RETURN_IF_ERROR(linearBackward("linear_qkv.bwd", P.qkvW, P.qkvB, dqkv, a1Full, da1, T, h, qkvOut));
        a1Full.reset();
        if (m_sp) { TS_ASSIGN_OR_RETURN(da1, seqReduceScatter(da1, ThL)); }
        else tpAllReduce(da1, Th);
    }
    dqkv.reset();
    TS_ASSIGN_OR_RETURN(TensorPtr dx, alloc(ThL));
    normBackward("input_layernorm.bwd", P.ln1w, P.ln1b, da1, A.x, A.mean1, A.rstd1, dx, TL);
    m_exec.op("residual_grad_add", Category::Elementwise, double(ThL), uint64_t(ThL) * 12, [=] {
        k::addInPlace(fp(dx), fp(dx2), ThL);
        if (bf) k::roundToBf16(fp(dx), ThL);
    });
    *dxOut = dx;
    return Status::ok();
}

Status GptModel::finalForward(MbState& st) {
    m_exec.setLayer(-1);
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
    TS_ASSIGN_OR_RETURN(TensorPtr loss, m_exec.alloc(T));
    auto data = st.data;
    TensorPtr dloss = st.dloss;
    const int m = m_numMicrobatches;
    m_exec.op("loss_scale", Category::Loss, double(T), uint64_t(T) * 8, [=] {
        double tokens = 0;
        for (int t = 0; t < T; ++t) tokens += data->lossMask.empty() ? 1.0 : data->lossMask[size_t(t)];
        const double denom = std::max(tokens, 1.0) * m;
        for (int t = 0; t < T; ++t)
            fp(dloss)[t] = float((data->lossMask.empty() ? 1.0 : data->lossMask[size_t(t)]) / denom);
    });
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
            k::crossEntropyStats(fp(logits), data->labels.data(), fp(rowMax), fp(target), fp(sumExp), T, Vl, vStart);
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
            k::crossEntropyFused(fp(logits), data->labels.data(), fp(dloss), fp(loss), T, V);
        });
    } else {
        TS_ASSIGN_OR_RETURN(st.ceProbs, m_exec.alloc(TV));
        TensorPtr probs = st.ceProbs;
        const int V = Vl;
        m_exec.op("cross_entropy.fwd", Category::Loss, 4.0 * TV, uint64_t(TV) * 8, [=] {
            k::crossEntropyForwardUnfused(fp(logits), data->labels.data(), fp(probs), fp(loss), T, V);
        });
        st.logits.reset();  // the naive path keeps probs, not logits
    }
    auto losses = m_losses;
    const int mb = m_exec.microbatch();
    m_exec.op("loss_reduce", Category::Loss, double(T), uint64_t(T) * 8, [=] {
        double sum = 0, tokens = 0;
        for (int t = 0; t < T; ++t) {
            const double w = data->lossMask.empty() ? 1.0 : data->lossMask[size_t(t)];
            sum += w * double(fp(loss)[t]);
            tokens += w;
        }
        (*losses)[mb] = {sum, tokens};
    });
    return Status::ok();
}

Status GptModel::finalBackward(MbState& st, TensorPtr* dhidden) {
    m_exec.setLayer(-1);
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden, Vl = m_vocabL;
    const int TL = localTokens();
    const int64_t Th = int64_t(T) * h, ThL = int64_t(TL) * h, TV = int64_t(T) * Vl;
    auto data = st.data;
    TensorPtr dloss = st.dloss;
    TensorPtr dlogits;
    if (m_ctx.tpSize > 1) {
        dlogits = st.logits;
        TensorPtr rowMax = st.rowMax, sumExp = st.sumExp;
        const int vStart = m_vocabStart;
        m_exec.op("cross_entropy.bwd", Category::Loss, 4.0 * TV, uint64_t(TV) * 8, [=] {
            k::crossEntropyBackward(fp(dlogits), data->labels.data(), fp(rowMax), fp(sumExp), fp(dloss), fp(dlogits), T, Vl,
                                    vStart);
        });
    } else if (m_o.fusedCrossEntropy) {
        dlogits = st.logits;  // already the gradient
    } else {
        TS_ASSIGN_OR_RETURN(dlogits, m_exec.alloc(TV));
        TensorPtr probs = st.ceProbs;
        m_exec.op("cross_entropy.bwd", Category::Loss, 2.0 * TV, uint64_t(TV) * 8, [=] {
            k::crossEntropyBackwardUnfused(fp(probs), data->labels.data(), fp(dloss), fp(dlogits), T, Vl);
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

Status GptModel::forward(int mb, std::shared_ptr<const Microbatch> data, TensorPtr input, TensorPtr output) {
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int64_t Th = int64_t(T) * h, ThL = stageTensorElems();
    if (m_mbs.count(mb)) return Status::internal("microbatch " + std::to_string(mb) + " is already in flight");
    if (m_ctx.firstStage || m_ctx.lastStage) {
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
    }
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
    const bool bf = m_o.bf16;
    if (m_ctx.firstStage) {
        m_exec.setLayer(-1);
        if (m_forwardPreHook) m_forwardPreHook({m_embW});
        TS_ASSIGN_OR_RETURN(TensorPtr emb, m_exec.alloc(Th));
        const float* E = m_params.modelParam(m_embW);
        const int vStart = m_vocabStart, vEnd = m_vocabStart + m_vocabL, V = m_d.paddedVocab;
        m_exec.op("embedding.fwd", Category::Embedding, 0, uint64_t(Th) * 8, [=] {
            k::embeddingForward(data->tokens.data(), E, fp(emb), T, h, vStart, vEnd, V);
        });
        // Partial vocab-parallel lookups: summed over TP (all-reduce), or with SP summed and
        // split along s in one reduce-scatter (Megatron's reduce_scatter_embeddings).
        if (m_sp) { TS_ASSIGN_OR_RETURN(emb, seqReduceScatter(emb, ThL)); }
        else tpAllReduce(emb, Th);
        const float p = m_o.hiddenDropout;
        const uint64_t dropOffset = m_sp ? uint64_t(m_ctx.tpRank) * uint64_t(ThL) : 0;
        if (p > 0) {
            TS_ASSIGN_OR_RETURN(TensorPtr dropped, m_exec.alloc(ThL));
            TS_ASSIGN_OR_RETURN(st->embMask, m_exec.alloc(ThL, MemCategory::Activations, 1));
            TensorPtr mask = st->embMask;
            const uint64_t seed = dropoutSeed(m_o.seed, m_step, mb, -1, 0);
            m_exec.op("embedding_dropout", Category::Elementwise, double(ThL), uint64_t(ThL) * 9, [=] {
                k::dropoutForward(fp(emb), fp(dropped), mask->as<uint8_t>(), ThL, p, seed, dropOffset);
                if (bf) k::roundToBf16(fp(dropped), ThL);
            });
            emb = dropped;
        } else if (bf) {
            roundBf16(emb, ThL);
        }
        st->hidden = emb;
    } else {
        st->hidden = input;
    }
    for (int li = 0; li < localLayers(); ++li) {
        const bool keep = recomputeGroupStart(li) < 0;
        if (m_forwardPreHook) m_forwardPreHook(layerParamList(li));
        TS_RETURN_IF_ERROR(layerForward(*st, li, keep));
        m_exec.throttle();
    }
    if (m_ctx.lastStage) {
        if (m_forwardPreHook) {
            std::vector<int> ps{m_lnfW, m_outW};
            if (m_lnfB >= 0) ps.push_back(m_lnfB);
            m_forwardPreHook(ps);
        }
        TS_RETURN_IF_ERROR(finalForward(*st));
    } else {
        TensorPtr hid = st->hidden;
        m_exec.op("stage_output_copy", Category::Memcpy, 0, uint64_t(ThL) * 8,
                  [=] { std::memcpy(output->data(), hid->data(), size_t(ThL) * sizeof(float)); });
    }
    st->hidden.reset();
    m_mbs[mb] = std::move(st);
    return Status::ok();
}

Status GptModel::backward(int mb, TensorPtr gradOutput, TensorPtr gradInput) {
    auto it = m_mbs.find(mb);
    if (it == m_mbs.end()) return Status::internal("backward of microbatch " + std::to_string(mb) + " without forward");
    const int T = m_d.seq * m_d.microBatch, h = m_d.hidden;
    const int64_t Th = int64_t(T) * h, ThL = stageTensorElems();
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
            st->hidden = st->layers[size_t(g0)].x;
            for (int j = g0; j <= li; ++j) {
                TS_RETURN_IF_ERROR(layerForward(*st, j, true));
                m_exec.throttle();
            }
            st->hidden.reset();
        }
        TensorPtr dx;
        TS_RETURN_IF_ERROR(layerBackward(*st, li, dh, &dx));
        TS_RETURN_IF_ERROR(gradsReady(layerParamList(li)));
        st->layers[size_t(li)] = LayerActs{};
        dh = dx;
        m_exec.throttle();
    }
    if (m_ctx.firstStage) {
        m_exec.setLayer(-1);
        const float p = m_o.hiddenDropout;
        TensorPtr demb = dh;
        if (p > 0) {
            TS_ASSIGN_OR_RETURN(demb, m_exec.alloc(ThL));
            TensorPtr mask = st->embMask, src = dh;
            m_exec.op("embedding_dropout.bwd", Category::Elementwise, double(ThL), uint64_t(ThL) * 9,
                      [=] { k::dropoutBackward(fp(src), mask->as<uint8_t>(), fp(demb), ThL, p); });
        }
        // SP: backward of the embedding's reduce-scatter = all-gather of the grad along s.
        if (m_sp) { TS_ASSIGN_OR_RETURN(demb, seqGather(demb, ThL)); }
        float* G = m_params.mainGrad(m_embW);
        auto data = st->data;
        const int vStart = m_vocabStart, vEnd = m_vocabStart + m_vocabL;
        m_exec.op("embedding.bwd", Category::Embedding, double(Th), uint64_t(Th) * 8,
                  [=] { k::embeddingBackward(data->tokens.data(), fp(demb), G, T, h, vStart, vEnd); });
        TS_RETURN_IF_ERROR(gradsReady({m_embW}));
    } else {
        TensorPtr src = dh;
        m_exec.op("stage_grad_copy", Category::Memcpy, 0, uint64_t(ThL) * 8,
                  [=] { std::memcpy(gradInput->data(), src->data(), size_t(ThL) * sizeof(float)); });
    }
    return Status::ok();
}

std::vector<int> GptModel::layerParamList(int li) const {
    const LayerParams& P = m_layers[size_t(li)];
    std::vector<int> out;
    for (int i : {P.ln1w, P.ln1b, P.qkvW, P.qkvB, P.projW, P.projB, P.ln2w, P.ln2b, P.fc1W, P.fc1B, P.fc2W, P.fc2B})
        if (i >= 0) out.push_back(i);
    return out;
}

double GptModel::microbatchLoss(int mb) const {
    auto it = m_losses->find(mb);
    if (it == m_losses->end() || it->second.second <= 0) return std::nan("");
    return it->second.first / it->second.second;
}

const std::vector<float>& GptModel::capturedLogits(int mb) const {
    static const std::vector<float> empty;
    auto it = m_logits->find(mb);
    return it == m_logits->end() ? empty : it->second;
}

void GptModel::clearCaptured() {
    m_logits->clear();
    m_losses->clear();
}

}  // namespace ts::engine
