// GptModel's FP8 linears (engine/model/fp8.h): the quantization of the GEMM inputs of linear_qkv,
// linear_proj, linear_fc1 and linear_fc2, their weights' FP8 copies, and the delayed-scaling
// bookkeeping. The saved GEMM inputs are quantized in place where they are produced, so the
// backward's wgrad sees the same FP8 values as the forward (Transformer Engine saves the FP8
// input), and a sequence-parallel input is quantized shard by shard with one scale before its
// all-gather, which equals quantizing the gathered tensor. With tp_comm_overlap the same holds
// for the ring exchange (TE casts the local shard and gathers the FP8 bytes): the overlapped
// linears quantize the same tensors at the same points, and their dgrad pieces read the FP8
// weight copies (gpt_attention.cpp, gpt_mlp.cpp, gpt_ops.cpp).
//
// Scales: delayed scaling uses, during iteration n, the scale computed at the start of n from the
// amax history (one update per iteration, after the amaxes of iteration n-1 were reduced with MAX
// over the tp-dp-cp group: every rank that holds part of, or a replica of, a tensor agrees, so a
// parallel run uses the scales of the single-device run). Tensorwise takes each tensor's amax
// when it is quantized, reduced with MAX over TP (and CP for the activations and gradients).
// MoE experts (second half of the file): one scaling state per expert GEMM; delayed amaxes are
// reduced over the ranks holding each expert, tensorwise ones are the rank's own (see there). Block recipes keep no state; the experts'
// weights get block copies like the dense ones (fp8BlockWeight, by param index).
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"
#include "kernels/common/fp8_codes.h"


#include "common/clock.h"

namespace ts::engine {

namespace {
constexpr int kLinears = 4, kSlots = 3;
constexpr int kGradSlot = 2;  // GptModel::kFp8Grad: slots input, weight, grad
constexpr int kFirstMlpLinear = 2;  // GptModel::kFp8Fc1: linear_fc1 and linear_fc2 follow qkv and proj
const char* kLinearNames[kLinears] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};
const char* kSlotNames[kSlots] = {"input", "weight", "grad"};
// "layer<L>.<linear>.<slot>": the name of an FP8 tensor in counters and checkpoints. An MoE layer
// has no dense linear_fc1/fc2: its shared experts (if any) use those two linears' states, named
// "layer<L>.shared_experts.<linear>.<slot>"; without shared experts the name is "" (unused).
std::string fp8TensorName(int globalLayer, int lin, int slot, bool moeLayer = false, bool sharedExperts = false) {
    if (moeLayer && lin >= kFirstMlpLinear && !sharedExperts) return "";
    return "layer" + std::to_string(globalLayer) + "." + (moeLayer && lin >= kFirstMlpLinear ? "shared_experts." : "") +
           kLinearNames[lin] + "." + kSlotNames[slot];
}
// One checkpoint entry of an FP8 tensor's delayed-scaling state into `m`, checked (dense and expert tensors).
Status readFp8Entry(const nlohmann::json& e, const std::string& key, Fp8Meta& m) {
    auto bad = [&](const std::string& why) { return Status::invalid("fp8 state of " + key + ": " + why); };
    if (!e.is_object() || !e.contains("history") || !e.contains("scale") || !e["history"].is_array() ||
        !e["scale"].is_number())
        return bad("needs a history array and a scale");
    const nlohmann::json& h = e["history"];
    if (h.size() != m.history.size())
        return bad("amax history of " + std::to_string(h.size()) + " entries, the config has fp8_amax_history_len " +
                   std::to_string(m.history.size()) + "; resume with the same length");
    std::vector<float> hist;
    for (const auto& v : h) {
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
            return bad("amax values must be finite and >= 0");
        hist.push_back(v.get<float>());
    }
    const double sc = e["scale"].get<double>();
    if (!std::isfinite(sc) || sc <= 0) return bad("scale must be finite and > 0");
    m.history = std::move(hist);
    m.scale = float(sc);
    return Status::ok();
}
// A pack of amaxes (one float per meta, slot fastest: the dense linears' and the experts') and the
// host metas beside it, for the checkpoint: read back (empty when it cannot be), and an entry
// whose history[0] is the pack's (delayed: the observations since the last update; tensorwise:
// the last amax, the scale following from it); and written from the metas' history[0] on load.
std::vector<float> readPack(Stream& s, const TensorPtr& pack, size_t n) {
    if (!pack) return {};
    auto h = k::toHost(s, fp(pack), int64_t(n));
    return h ? std::move(*h) : std::vector<float>();
}
nlohmann::json stateEntry(const Fp8Meta& m, const std::vector<float>& observed, size_t at, const Fp8Recipe& r) {
    std::vector<float> history = m.history;
    float scale = m.scale;
    if (at < observed.size()) {
        history[0] = observed[at];
        if (!r.delayed) scale = currentScale(observed[at], k::fp8Max(at % kSlots == kGradSlot ? r.backward : r.forward));
    }
    return {{"history", history}, {"scale", scale}};
}
Status writePack(Stream& s, const TensorPtr& pack, const std::vector<Fp8Meta>& metas) {
    if (!pack) return Status::ok();
    std::vector<float> observed(metas.size());
    for (size_t i = 0; i < observed.size(); ++i) observed[i] = metas[i].history[0];
    return k::copyFromHost(s, pack->data(), observed.data(), observed.size() * sizeof(float));
}
// Delayed scaling: each meta's scale, where kernels read it (one float per meta, as the amax pack):
// uploaded after every update and on a load, in stream order.
std::vector<float> scalesOf(const std::vector<Fp8Meta>& metas) {
    std::vector<float> out(metas.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = metas[i].scale;
    return out;
}
Status writeScales(Stream& s, const TensorPtr& scales, const std::vector<Fp8Meta>& metas) {
    if (!scales) return Status::ok();
    const std::vector<float> h = scalesOf(metas);
    return k::copyFromHost(s, scales->data(), h.data(), h.size() * sizeof(float));
}
// Inside an op (the scale update): the same upload, its host source read at the call.
void uploadScales(const TensorPtr& scales, const std::vector<Fp8Meta>& metas) {
    if (!scales) return;
    const std::vector<float> h = scalesOf(metas);
    k::copyBytes(scales->data(), h.data(), h.size() * sizeof(float));
}
// The pair of a delayed-scaling state's buffers a quantization needs, or an internal error.
Status checkDelayedBuffers(const TensorPtr& amaxes, const TensorPtr& scales) {
    if (!amaxes || !scales) return Status::internal("FP8 delayed scaling without its amax or scale buffer");
    return Status::ok();
}

// The index of expert tensor (local layer li, local expert l, fc1/fc2 lin, slot) among L local
// experts: in the experts' metas and their pack.
size_t expertAt(size_t L, int li, int l, int lin, int slot) {
    return ((size_t(li) * L + size_t(l)) * 2 + size_t(lin)) * kSlots + size_t(slot);
}

// Tensorwise: the host metas follow the last amaxes of a pack (one float per meta, slot
// fastest), read back for the counters: each amax and the scale it gives.
void followLastAmaxes(std::vector<Fp8Meta>& metas, const float* pack, const Fp8Recipe& r) {
    std::vector<float> h(metas.size());
    k::download(h.data(), pack, h.size() * sizeof(float));
    const float fwdMax = k::fp8Max(r.forward), bwdMax = k::fp8Max(r.backward);
    for (size_t i = 0; i < h.size(); ++i) {
        metas[i].history[0] = h[i];
        metas[i].scale = currentScale(h[i], i % kSlots == kGradSlot ? bwdMax : fwdMax);
    }
}
}  // namespace

bool GptModel::fp8Layer(int li) const {
    return m_o.fp8.layerInFp8(m_ctx.layerBegin + li, m_d.layers);
}

void GptModel::fp8Init() {
    if (!m_o.fp8.enabled) return;
    m_fp8Meta = std::make_shared<std::vector<Fp8Meta>>(m_layers.size() * kLinears * kSlots);
    for (Fp8Meta& m : *m_fp8Meta) m.reset(m_o.fp8.historyLen);
    m_fp8W.assign(m_layers.size() * kLinears, {});
    if (!m_o.fp8.isBlock()) {
        auto pack = m_exec.alloc(int64_t(m_fp8Meta->size()), MemCategory::Workspace);  // zeroed
        if (pack) m_fp8AmaxDev = *pack;
    }
    if (m_o.fp8.delayed && !m_o.fp8.isBlock()) {
        auto scales = m_exec.alloc(int64_t(m_fp8Meta->size()), MemCategory::Workspace);
        if (scales && writeScales(m_exec.stream(), *scales, *m_fp8Meta).isOk()) m_fp8ScaleDev = *scales;
    }
}

nlohmann::json GptModel::fp8State() {
    if (!m_fp8Meta || m_o.fp8.isBlock()) return nullptr;  // block recipes keep no scaling state
    nlohmann::json out = nlohmann::json::object();
    // The amaxes are in the device pack: delayed, those observed since the last scale update;
    // tensorwise, the last one of each tensor (its scale follows from it).
    const std::vector<float> observed = readPack(m_exec.stream(), m_fp8AmaxDev, m_fp8Meta->size());
    for (size_t li = 0; li < m_layers.size(); ++li) {
        if (!fp8Layer(int(li))) continue;
        for (int lin = 0; lin < kLinears; ++lin)
            for (int slot = 0; slot < kSlots; ++slot) {
                // MoE layer: its experts' below; fc1/fc2 are its shared experts' (if any)
                const std::string key = fp8TensorName(m_ctx.layerBegin + int(li), lin, slot, m_layers[li].routerW >= 0,
                                                      m_layers[li].shFc1W >= 0);
                if (key.empty()) continue;
                const size_t at = (li * kLinears + size_t(lin)) * kSlots + size_t(slot);
                out[key] = stateEntry((*m_fp8Meta)[at], observed, at, m_o.fp8);
            }
    }
    fp8ExpertState(out);
    return out;
}

Status GptModel::setFp8State(const nlohmann::json& state) {
    if (!m_fp8Meta || state.is_null() || m_o.fp8.isBlock()) return Status::ok();
    if (!state.is_object()) return Status::invalid("fp8 state must be an object");
    for (size_t li = 0; li < m_layers.size(); ++li) {
        if (!fp8Layer(int(li))) continue;
        for (int lin = 0; lin < kLinears; ++lin)
            for (int slot = 0; slot < kSlots; ++slot) {
                const std::string key = fp8TensorName(m_ctx.layerBegin + int(li), lin, slot, m_layers[li].routerW >= 0,
                                                      m_layers[li].shFc1W >= 0);
                if (key.empty()) continue;
                auto it = state.find(key);
                if (it == state.end()) continue;
                TS_RETURN_IF_ERROR(
                    readFp8Entry(*it, key, (*m_fp8Meta)[(li * kLinears + size_t(lin)) * kSlots + size_t(slot)]));
            }
    }
    TS_RETURN_IF_ERROR(setFp8ExpertState(state));
    TS_RETURN_IF_ERROR(writeScales(m_exec.stream(), m_fp8ScaleDev, *m_fp8Meta));
    return writePack(m_exec.stream(), m_fp8AmaxDev, *m_fp8Meta);
}

Status GptModel::fp8Quantize(int li, Fp8Linear lin, Fp8Slot slot, TensorPtr t, int64_t n) {
    const Fp8Recipe& r = m_o.fp8;
    // Block recipes: the tensor stays in high precision; each GEMM quantizes its operands along
    // its own reduction dimension (fp8BlockOperand, linearBackward).
    if (r.isBlock()) return Status::ok();
    const k::Fp8Format fmt = slot == kFp8Grad ? r.backward : r.forward;
    // Output gradients of a data-parallel rank are dp x the single device's (its loss is averaged
    // over its own microbatches; the 1/dp comes with the grad reduction), and cp x with context
    // parallelism (Megatron's loss_func multiplies by cp; the grads are averaged over dp-cp):
    // their amax and scale are taken for the single device's magnitudes, so FP8 rounds the same
    // values the same way whatever the layout (exactly so when dp x cp is a power of two).
    const float g = slot == kFp8Grad ? float(m_ctx.dpSize) * float(m_ctx.cpSize) : 1.0f;
    if (r.delayed) {
        // The amax is observed where kernels see it (the step's pack, m_fp8AmaxDev); the scale is
        // the one the host made from the history of the steps before and wrote to m_fp8ScaleDev
        // (read there when the kernel runs: a captured graph reads each step's).
        TS_RETURN_IF_ERROR(checkDelayedBuffers(m_fp8AmaxDev, m_fp8ScaleDev));
        TensorPtr pack = m_fp8AmaxDev, scales = m_fp8ScaleDev;
        const size_t at = (size_t(li) * kLinears + size_t(lin)) * kSlots + size_t(slot);
        // The codes are bound now, in program order, so that a gather of t submitted next binds
        // its copy too (kernels/common/fp8_codes.h bindLike).
        kernels::fp8codes::map().bindScaleAt(fp(t), n, fp(scales) + at, g, int(fmt), scales);
        m_exec.op("fp8_quantize", Category::Elementwise, 3.0 * double(n), uint64_t(n) * 8, [=] {
            k::amaxAccumulate(fp(t), n, g, fp(pack) + at);
            k::fp8QuantizeDelayed(fp(t), fp(t), nullptr, n, fp(scales) + at, g, fmt);
        });
        return Status::ok();
    }
    TS_ASSIGN_OR_RETURN(TensorPtr amax, m_exec.alloc(1, MemCategory::Workspace));
    m_exec.op("fp8_amax", Category::Elementwise, double(n), uint64_t(n) * 4, [=] { k::amaxInto(fp(t), n, fp(amax)); });
    // The tensor's amax over every rank holding a part of it: TP shards, and the CP ranks'
    // sequence chunks (a microbatch's rows are split over "cp").
    if (m_ctx.tp && m_ctx.tpSize > 1)
        m_ctx.tp->allReduce(m_exec.stream(), amax->data(), amax->data(), 1, DType::F32, ReduceOp::Max);
    if (m_ctx.cp && m_ctx.cpSize > 1)
        m_ctx.cp->allReduce(m_exec.stream(), amax->data(), amax->data(), 1, DType::F32, ReduceOp::Max);
    // The scale is computed where the amax is (no read-back); the amax is kept in the pack for
    // the counters and the state.
    if (!m_fp8AmaxDev) return Status::internal("FP8 current scaling without its amax buffer");
    TensorPtr pack = m_fp8AmaxDev;
    const size_t at = (size_t(li) * kLinears + size_t(lin)) * kSlots + size_t(slot);
    m_exec.op("fp8_quantize", Category::Elementwise, 2.0 * double(n), uint64_t(n) * 8,
              [=] { k::fp8QuantizeCurrent(fp(t), fp(t), nullptr, n, fp(amax), g, fmt, fp(pack) + at); });
    // t holds codes at the scale its amax gives, bound with the amax kept alive for the GEMMs
    // that take them (kernels/common/fp8_codes.h), and for a gather of t submitted next.
    kernels::fp8codes::map().bindCurrent(fp(t), n, fp(amax), g, int(fmt), amax);
    return Status::ok();
}

void GptModel::weightsReplaced() {
    for (Fp8WeightCopy& w : m_fp8W) w.step = -1;
    for (Fp8WeightCopy& w : m_fp8ExpW) w.step = -1;
    for (auto& [idx, w] : m_fp8BlockW) w.step = -1;
    m_fp8CopyStep.clear();
}

void GptModel::fp8CopyMade(int wIdx) {
    if (m_fp8CopyStep.size() < size_t(m_params.count())) m_fp8CopyStep.resize(size_t(m_params.count()), -1);
    m_fp8CopyStep[size_t(wIdx)] = m_step;
}

bool GptModel::fp8CopyCurrent(int wIdx) const {
    return size_t(wIdx) < m_fp8CopyStep.size() && m_fp8CopyStep[size_t(wIdx)] == m_step;
}

Result<const float*> GptModel::fp8Weight(int li, Fp8Linear lin, int wIdx) {
    if (m_o.fp8.isBlock()) return fp8BlockWeight(wIdx, true);
    Fp8WeightCopy& w = m_fp8W[size_t(li) * kLinears + size_t(lin)];
    const int64_t n = m_params.info(wIdx).numel;
    if (!w.dequantized) {
        // The FP8 copy (1 byte per element, with the params) and the emulation's dequantized
        // values (workspace; a GPU GEMM reads the codes directly).
        TS_ASSIGN_OR_RETURN(w.codes, m_exec.alloc(n, MemCategory::Params, 1));
        TS_ASSIGN_OR_RETURN(w.dequantized, m_exec.alloc(n, MemCategory::Workspace));
    }
    if (w.step != m_step) {
        w.step = m_step;
        fp8CopyMade(wIdx);
        const Fp8Recipe& r = m_o.fp8;
        const float* W = m_params.modelParam(wIdx);
        TensorPtr dq = w.dequantized, codes = w.codes;
        const k::Fp8Format fmt = r.forward;
        if (r.delayed) {
            TS_RETURN_IF_ERROR(checkDelayedBuffers(m_fp8AmaxDev, m_fp8ScaleDev));
            TensorPtr pack = m_fp8AmaxDev, scales = m_fp8ScaleDev;
            const size_t at = (size_t(li) * kLinears + size_t(lin)) * kSlots + size_t(kFp8Weight);
            // the step's scale, where kernels read it (as fp8Quantize)
            kernels::fp8codes::map().bindScaleAt(fp(dq), n, fp(scales) + at, 1.0f, int(fmt), scales);
            m_exec.op("fp8_quantize_weight", Category::Elementwise, 3.0 * double(n), uint64_t(n) * 9, [=] {
                k::amaxAccumulate(W, n, 1.0f, fp(pack) + at);
                k::fp8QuantizeDelayed(W, fp(dq), codes->as<uint8_t>(), n, fp(scales) + at, 1.0f, fmt);
            });
        } else {
            TS_ASSIGN_OR_RETURN(TensorPtr amax, m_exec.alloc(1, MemCategory::Workspace));
            m_exec.op("fp8_amax", Category::Elementwise, double(n), uint64_t(n) * 4,
                      [=] { k::amaxInto(W, n, fp(amax)); });
            if (m_ctx.tp && m_ctx.tpSize > 1)
                m_ctx.tp->allReduce(m_exec.stream(), amax->data(), amax->data(), 1, DType::F32, ReduceOp::Max);
            if (!m_fp8AmaxDev) return Status::internal("FP8 current scaling without its amax buffer");
            TensorPtr pack = m_fp8AmaxDev;
            const size_t at = (size_t(li) * kLinears + size_t(lin)) * kSlots + size_t(kFp8Weight);
            m_exec.op("fp8_quantize_weight", Category::Elementwise, 2.0 * double(n), uint64_t(n) * 9, [=] {
                k::fp8QuantizeCurrent(W, fp(dq), codes->as<uint8_t>(), n, fp(amax), 1.0f, fmt, fp(pack) + at);
            });
            // as fp8Quantize; a rebinding of a live range, once per step (see fp8StepUpdate)
            kernels::fp8codes::map().bindCurrent(fp(dq), n, fp(amax), 1.0f, int(fmt), amax);
        }
    }
    return static_cast<const float*>(fp(w.dequantized));
}

void GptModel::fp8StepUpdate() {
    if (!m_fp8Meta || m_o.fp8.isBlock()) return;
    const Fp8Recipe r = m_o.fp8;
    auto metas = m_fp8Meta;
    const int64_t n = int64_t(metas->size());
    const TraceTarget tt = m_exec.device().traceTarget();
    const int layerBegin = m_ctx.layerBegin;
    // MoE layers have no dense fc1/fc2 (their experts' counters: below; their shared experts use them)
    std::vector<char> moeLayer(m_layers.size()), shared(m_layers.size());
    for (size_t li = 0; li < m_layers.size(); ++li) {
        moeLayer[li] = m_layers[li].routerW >= 0;
        shared[li] = m_layers[li].shFc1W >= 0;
    }
    auto counters = [=](int step) {
        // amax and scale of every FP8 tensor, as counters "fp8.<layer>.<linear>.<slot>.amax|scale".
        if (!tt.recorder) return;
        const int64_t ts = monotonicNs();
        for (int64_t i = 0; i < n; ++i) {
            const int li = int(i / (kLinears * kSlots)), lin = int(i / kSlots % kLinears), slot = int(i % kSlots);
            const std::string name = fp8TensorName(layerBegin + li, lin, slot, moeLayer[size_t(li)], shared[size_t(li)]);
            if (name.empty()) continue;
            const std::string base = "fp8." + name;
            const Fp8Meta& m = (*metas)[size_t(i)];
            const float amax = r.delayed ? *std::max_element(m.history.begin(), m.history.end()) : m.history[0];
            tt.recorder->counter({tt.rank, tt.recorder->intern(base + ".amax"), ts, double(amax)});
            tt.recorder->counter({tt.rank, tt.recorder->intern(base + ".scale"), ts, double(m.scale)});
        }
        (void)step;
    };
    const int step = m_step;
    if (!r.delayed) {
        // The next step's fp8Weight binds its weight copies anew, each to a new amax
        // (bindCurrent); the CPU backend's kernels look their operands up when they run, so its
        // host waits for this step's GEMMs first (as delayed scaling's update does below).
        if (!k::streamOnDevice(m_exec.stream())) (void)m_exec.stream().synchronize();
        // Tensorwise: the last amaxes come back for the counters only (one read-back per step,
        // and none without a trace); the host state follows them.
        if (!tt.recorder || !m_fp8AmaxDev) return;
        TensorPtr pack = m_fp8AmaxDev;
        m_exec.op("fp8_counters", Category::Other, 0, 0, [=] {
            followLastAmaxes(*metas, fp(pack), r);
            counters(step);
        });
        return;
    }
    // The step's observed amaxes are already packed where kernels see them (m_fp8AmaxDev): reduced
    // in place, read back once, then zeroed for the next step.
    TensorPtr b = m_fp8AmaxDev;
    if (!b) return;
    if (m_ctx.amax && m_ctx.amax->size() > 1)
        m_ctx.amax->allReduce(m_exec.stream(), b->data(), b->data(), size_t(n), DType::F32, ReduceOp::Max);
    const float fwdMax = k::fp8Max(r.forward), bwdMax = k::fp8Max(r.backward);
    TensorPtr scales = m_fp8ScaleDev;
    m_exec.op("fp8_scale_update", Category::Elementwise, double(n), uint64_t(n) * 8, [=] {
        std::vector<float> h(static_cast<size_t>(n));
        k::download(h.data(), fp(b), h.size() * sizeof(float));
        k::setBytes(fp(b), 0, h.size() * sizeof(float));
        for (int64_t i = 0; i < n; ++i) {
            Fp8Meta& m = (*metas)[size_t(i)];
            m.history[0] = h[size_t(i)];
            m.update(i % kSlots == kFp8Grad ? bwdMax : fwdMax, r.margin, r.algoMax);
        }
        uploadScales(scales, *metas);  // where this step's quantizations read them
        counters(step);
    });
    // On a device the read-back makes the host wait for the stream here; the CPU backend runs the
    // op later on its stream's thread, so the host waits for it too: the host metas (counters,
    // checkpoints) are the step's when its ops are submitted. The quantizations read the scales
    // the op wrote to m_fp8ScaleDev when they run, in stream order.
    if (!k::streamOnDevice(m_exec.stream())) (void)m_exec.stream().synchronize();
}


// ---- FP8 inside the MoE experts -----------------------------------------------------------
// As Transformer Engine's GroupedLinear (Megatron's TEGroupedMLP under fp8_autocast): every
// expert GEMM — fc1 and fc2, forward, dgrad and wgrad — takes FP8 inputs, with one scaling state
// per GEMM: the expert's input rows, its weight and its output gradient rows. The router stays in
// high precision. Amax reduction (delayed scaling) differs from TE's: TE reduces the amax buffer
// by position over the amax group, which under expert parallelism would mix different experts
// held at the same position on different ranks; here each expert tensor's amax is reduced over
// the ranks that hold that expert (its edp replicas, and its etp shards so that the whole
// tensor's amax is used): packed by global expert index, zero where a rank does not hold the
// expert, reduced with MAX over tp-dp-cp (every rank of the stage). So every layout uses the
// scales of the single-device run.
// Current scaling (tensorwise) follows TE exactly: GroupedLinear's quantizers reduce no amax
// (its current-scaling customization sets only epsilon and power-of-two options, and Megatron's
// TEGroupedLinear hands it tp_size 1 with the expert communication outside), so each expert
// GEMM's scale is fp8_max over the amax of what that GEMM has on this rank: its rows after the
// dispatch (the all-to-all over "ep" and the all-gather over "etp"), its weight's ETP shard, its
// fc2 input's and fc1 output gradient's F/etp columns (fp8QuantizeTensor on the expert's rows,
// fp8ExpertWeights on the local weight). Where those are one microbatch's rows and the whole
// weight (etp 1 and the etp-ep group = the tp-cp group of one microbatch, or no split at all) the
// scales are the single device's; elsewhere they depend on the layout (configWarnings,
// docs/engine.md "Inside MoE experts").
// Every amax stays on the device (m_fp8ExpAmaxDev, one float per expert tensor, as the dense
// linears' pack): delayed scaling accumulates the step's observations there and reads them back
// once per step for the scale update; tensorwise computes each scale on the device from the amax
// it has just taken, and the host reads the last amaxes back only for the counters (traced) and
// the checkpoint.

namespace {
const char* kExpLinearNames[2] = {"linear_fc1", "linear_fc2"};
std::string fp8ExpertTensorName(int globalLayer, int globalExpert, int lin, int slot) {
    return "layer" + std::to_string(globalLayer) + ".expert" + std::to_string(globalExpert) + "." +
           kExpLinearNames[lin] + "." + kSlotNames[slot];
}
}  // namespace

void GptModel::fp8ExpertInit() {
    if (!m_o.fp8.enabled || m_cfg.num_moe_experts <= 0) return;
    const int L = m_cfg.num_moe_experts / std::max(1, m_ctx.epSize);
    m_fp8LocalExperts = L;
    m_fp8ExpMeta = std::make_shared<std::vector<Fp8Meta>>(m_layers.size() * size_t(L) * 2 * kSlots);
    for (Fp8Meta& m : *m_fp8ExpMeta) m.reset(m_o.fp8.historyLen);
    m_fp8ExpW.assign(m_layers.size() * size_t(L) * 2, {});
    if (!m_o.fp8.isBlock()) {
        auto pack = m_exec.alloc(int64_t(m_fp8ExpMeta->size()), MemCategory::Workspace);  // zeroed
        auto raw = m_exec.alloc(int64_t(m_fp8ExpMeta->size()), MemCategory::Workspace);
        if (pack && raw) {
            m_fp8ExpAmaxDev = *pack;
            m_fp8ExpAmaxRaw = *raw;
        }
    }
    if (m_o.fp8.delayed && !m_o.fp8.isBlock()) {
        auto scales = m_exec.alloc(int64_t(m_fp8ExpMeta->size()), MemCategory::Workspace);
        if (scales && writeScales(m_exec.stream(), *scales, *m_fp8ExpMeta).isOk()) m_fp8ExpScaleDev = *scales;
    }
}

Fp8TensorSlots GptModel::fp8ExpertSlots(int li, int l, Fp8ExpertLinear lin, Fp8Slot slot) const {
    const size_t at = expertAt(size_t(m_fp8LocalExperts), li, l, lin, slot);
    Fp8TensorSlots q;
    if (m_fp8ExpAmaxDev) q.observed = fp(m_fp8ExpAmaxDev) + at;
    if (m_fp8ExpAmaxRaw) {
        q.amax = fp(m_fp8ExpAmaxRaw) + at;
        q.amaxOwner = m_fp8ExpAmaxRaw;
    }
    if (m_fp8ExpScaleDev) {
        q.scale = fp(m_fp8ExpScaleDev) + at;
        q.scaleOwner = m_fp8ExpScaleDev;
    }
    return q;
}

Fp8Meta* GptModel::fp8ExpertMeta(int li, int l, Fp8ExpertLinear lin, Fp8Slot slot) const {
    return &(*m_fp8ExpMeta)[expertAt(size_t(m_fp8LocalExperts), li, l, lin, slot)];
}

Result<std::vector<const float*>> GptModel::fp8ExpertWeights(int li, Fp8ExpertLinear lin, const std::vector<int>& wIdx) {
    const int L = m_fp8LocalExperts;
    std::vector<const float*> out(static_cast<size_t>(L));
    if (!m_o.fp8.isBlock() && !m_fp8ExpAmaxDev) return Status::internal("FP8 experts without their amax buffer");
    if (m_o.fp8.delayed && !m_o.fp8.isBlock()) TS_RETURN_IF_ERROR(checkDelayedBuffers(m_fp8ExpAmaxDev, m_fp8ExpScaleDev));
    struct Job {
        const float* W;
        TensorPtr dq, codes;
        int64_t n;
        Fp8TensorSlots q;
    };
    auto jobs = std::make_shared<std::vector<Job>>();
    int64_t total = 0;
    for (int l = 0; l < L; ++l) {
        Fp8WeightCopy& w = m_fp8ExpW[(size_t(li) * size_t(L) + size_t(l)) * 2 + size_t(lin)];
        const int64_t n = m_params.info(wIdx[size_t(l)]).numel;
        if (!w.dequantized) {
            TS_ASSIGN_OR_RETURN(w.codes, m_exec.alloc(n, MemCategory::Params, 1));
            TS_ASSIGN_OR_RETURN(w.dequantized, m_exec.alloc(n, MemCategory::Workspace));
        }
        if (w.step != m_step) {
            w.step = m_step;
            fp8CopyMade(wIdx[size_t(l)]);
            jobs->push_back({m_params.modelParam(wIdx[size_t(l)]), w.dequantized, w.codes, n,
                             fp8ExpertSlots(li, l, lin, kFp8Weight)});
            total += n;
        }
        out[size_t(l)] = static_cast<const float*>(fp(w.dequantized));
    }
    if (jobs->empty()) return out;
    // One op for the experts' weights of this linear (TE quantizes every GEMM's weight of a
    // GroupedLinear each step). Tensorwise: the amax of the weight on this rank — with ETP its
    // shard, as TE's weight quantizer sees it (no reduction over "etp").
    const Fp8Recipe r = m_o.fp8;
    m_exec.op("fp8_quantize_expert_weights", Category::Elementwise, 3.0 * double(total), uint64_t(total) * 9, [=] {
        for (const Job& j : *jobs)
            fp8QuantizeTensor(r, j.q, false, 1.0f, j.W, fp(j.dq), j.codes->as<uint8_t>(), j.n);
    });
    return out;
}

void GptModel::fp8ExpertState(nlohmann::json& out) {
    if (!m_fp8ExpMeta) return;
    const int L = m_fp8LocalExperts, e0 = m_ctx.epRank * L;
    // The amaxes are in the device pack (as the dense linears'): delayed, those observed since the
    // last scale update; tensorwise, each tensor's last, its scale following from it.
    const std::vector<float> observed = readPack(m_exec.stream(), m_fp8ExpAmaxDev, m_fp8ExpMeta->size());
    for (size_t li = 0; li < m_layers.size(); ++li) {
        if (m_layers[li].routerW < 0 || !fp8Layer(int(li))) continue;
        for (int l = 0; l < L; ++l)
            for (int lin = 0; lin < 2; ++lin)
                for (int slot = 0; slot < kSlots; ++slot) {
                    const size_t at = expertAt(size_t(L), int(li), l, lin, slot);
                    out[fp8ExpertTensorName(m_ctx.layerBegin + int(li), e0 + l, lin, slot)] =
                        stateEntry((*m_fp8ExpMeta)[at], observed, at, m_o.fp8);
                }
    }
}

Status GptModel::setFp8ExpertState(const nlohmann::json& state) {
    if (!m_fp8ExpMeta || state.is_null() || !state.is_object()) return Status::ok();
    const int L = m_fp8LocalExperts, e0 = m_ctx.epRank * L;
    for (size_t li = 0; li < m_layers.size(); ++li) {
        if (m_layers[li].routerW < 0 || !fp8Layer(int(li))) continue;
        for (int l = 0; l < L; ++l)
            for (int lin = 0; lin < 2; ++lin)
                for (int slot = 0; slot < kSlots; ++slot) {
                    const std::string key = fp8ExpertTensorName(m_ctx.layerBegin + int(li), e0 + l, lin, slot);
                    auto it = state.find(key);
                    if (it == state.end()) continue;
                    TS_RETURN_IF_ERROR(readFp8Entry(*it, key, *fp8ExpertMeta(int(li), l, Fp8ExpertLinear(lin), Fp8Slot(slot))));
                }
    }
    TS_RETURN_IF_ERROR(writeScales(m_exec.stream(), m_fp8ExpScaleDev, *m_fp8ExpMeta));
    return writePack(m_exec.stream(), m_fp8ExpAmaxDev, *m_fp8ExpMeta);
}

void GptModel::fp8ExpertStepUpdate() {
    if (!m_fp8ExpMeta || m_o.fp8.isBlock()) return;
    std::vector<int> moe;  // local MoE layers in FP8
    for (size_t li = 0; li < m_layers.size(); ++li)
        if (m_layers[li].routerW >= 0 && fp8Layer(int(li))) moe.push_back(int(li));
    if (moe.empty()) return;
    const Fp8Recipe r = m_o.fp8;
    const int L = m_fp8LocalExperts, E = m_cfg.num_moe_experts, e0 = m_ctx.epRank * L;
    const int layerBegin = m_ctx.layerBegin;
    auto metas = m_fp8ExpMeta;
    auto at = [L](int li, int l, int lin, int slot) { return expertAt(size_t(L), li, l, lin, slot); };
    const TraceTarget tt = m_exec.device().traceTarget();
    auto counters = [=] {
        // "fp8.layer<L>.expert<E>.<linear>.<slot>.amax|scale" of this rank's experts.
        if (!tt.recorder) return;
        const int64_t ts = monotonicNs();
        for (int li : moe)
            for (int l = 0; l < L; ++l)
                for (int lin = 0; lin < 2; ++lin)
                    for (int slot = 0; slot < kSlots; ++slot) {
                        const Fp8Meta& m = (*metas)[at(li, l, lin, slot)];
                        const std::string base = "fp8." + fp8ExpertTensorName(layerBegin + li, e0 + l, lin, slot);
                        const float amax =
                            r.delayed ? *std::max_element(m.history.begin(), m.history.end()) : m.history[0];
                        tt.recorder->counter({tt.rank, tt.recorder->intern(base + ".amax"), ts, double(amax)});
                        tt.recorder->counter({tt.rank, tt.recorder->intern(base + ".scale"), ts, double(m.scale)});
                    }
    };
    TensorPtr pack = m_fp8ExpAmaxDev;
    if (!pack) return;
    const int64_t local = int64_t(metas->size());
    if (!r.delayed) {
        // Tensorwise: the last amaxes come back for the counters only (one read-back per step,
        // none without a trace); the host state follows them.
        if (!tt.recorder) return;
        m_exec.op("fp8_expert_counters", Category::Other, 0, 0, [=] {
            followLastAmaxes(*metas, fp(pack), r);
            counters();
        });
        return;
    }
    // [moe layer][global expert][fc1, fc2][slot]: each MoE layer's local block of the pack
    // ([local expert][fc1, fc2][slot], contiguous) goes to its experts' place, zeros elsewhere.
    const int64_t n = int64_t(moe.size()) * E * 2 * kSlots;
    auto buf = m_exec.alloc(n, MemCategory::Workspace);  // zeroed
    if (!buf) return;
    TensorPtr b = *buf;
    auto packed = [=](size_t mi, int l, int lin, int slot) {
        return ((mi * size_t(E) + size_t(e0 + l)) * 2 + size_t(lin)) * kSlots + size_t(slot);
    };
    const size_t block = size_t(L) * 2 * kSlots;
    m_exec.op("fp8_expert_amax_pack", Category::Elementwise, 0, uint64_t(n) * 8, [=] {
        for (size_t mi = 0; mi < moe.size(); ++mi)
            k::copyBytes(fp(b) + packed(mi, 0, 0, 0), fp(pack) + at(moe[mi], 0, 0, 0), block * sizeof(float));
    });
    if (m_ctx.amax && m_ctx.amax->size() > 1)
        m_ctx.amax->allReduce(m_exec.stream(), b->data(), b->data(), size_t(n), DType::F32, ReduceOp::Max);
    const float fwdMax = k::fp8Max(r.forward), bwdMax = k::fp8Max(r.backward);
    TensorPtr scales = m_fp8ExpScaleDev;
    m_exec.op("fp8_expert_scale_update", Category::Elementwise, double(n), uint64_t(n) * 8, [=] {
        std::vector<float> h(static_cast<size_t>(n));
        k::download(h.data(), fp(b), h.size() * sizeof(float));
        k::setBytes(fp(pack), 0, size_t(local) * sizeof(float));  // the next step's observations start at 0
        for (size_t mi = 0; mi < moe.size(); ++mi)
            for (int l = 0; l < L; ++l)
                for (int lin = 0; lin < 2; ++lin)
                    for (int slot = 0; slot < kSlots; ++slot) {
                        Fp8Meta& m = (*metas)[at(moe[mi], l, lin, slot)];
                        m.history[0] = h[packed(mi, l, lin, slot)];
                        m.update(slot == kFp8Grad ? bwdMax : fwdMax, r.margin, r.algoMax);
                    }
        uploadScales(scales, *metas);  // where this step's quantizations read them
        counters();
    });
}

// ---- block recipes (mxfp8, blockwise) -------------------------------------------------------
// A weight W [out, in] has two FP8 copies per iteration, both from the high-precision weight:
// blocks along `in` for the forward GEMM, along `out` for the dgrad (blockwise: the same 128x128
// tiles). Counted as params: one byte per element plus the scale bytes, per copy (TE keeps the
// rowwise and the columnwise data).
Result<const float*> GptModel::fp8BlockWeight(int wIdx, bool rowwise) {
    Fp8BlockWeightCopy& w = m_fp8BlockW[wIdx];
    const ParamInfo& info = m_params.info(wIdx);
    const int64_t out = info.shape.empty() ? 1 : info.shape[0], in = info.numel / std::max<int64_t>(1, out);
    if (!w.row) {
        namespace kb = k;
        const kb::Fp8BlockKind kind = m_o.fp8.block == Fp8Recipe::Block::Mxfp8 ? kb::Fp8BlockKind::Mx1x32
                                                                              : kb::Fp8BlockKind::Block128x128;
        TS_ASSIGN_OR_RETURN(w.rowCodes, m_exec.alloc(kb::fp8BlockBytes(out, in, kind, true), MemCategory::Params, 1));
        TS_ASSIGN_OR_RETURN(w.colCodes, m_exec.alloc(kb::fp8BlockBytes(out, in, kind, false), MemCategory::Params, 1));
        TS_ASSIGN_OR_RETURN(w.row, m_exec.alloc(info.numel, MemCategory::Workspace));
        TS_ASSIGN_OR_RETURN(w.col, m_exec.alloc(info.numel, MemCategory::Workspace));
    }
    if (w.step != m_step) {
        w.step = m_step;
        fp8CopyMade(wIdx);
        const Fp8Recipe r = m_o.fp8;
        const float* W = m_params.modelParam(wIdx);
        TensorPtr row = w.row, col = w.col;
        m_exec.op("fp8_quantize_weight", Category::Elementwise, 6.0 * double(info.numel), uint64_t(info.numel) * 12, [=] {
            fp8BlockOperand(r, W, out, in, true, true, false, fp(row));
            fp8BlockOperand(r, W, out, in, false, true, false, fp(col));
        });
    }
    return static_cast<const float*>(fp(rowwise ? w.row : w.col));
}

}  // namespace ts::engine
