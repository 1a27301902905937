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
// when it is quantized, reduced with MAX over TP.
#include "engine/model/gpt.h"

#include "engine/model/gpt_internal.h"

#include "common/clock.h"

namespace ts::engine {

namespace {
constexpr int kLinears = 4, kSlots = 3;
const char* kLinearNames[kLinears] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};
const char* kSlotNames[kSlots] = {"input", "weight", "grad"};
// "layer<L>.<linear>.<slot>": the name of an FP8 tensor in counters and checkpoints.
std::string fp8TensorName(int globalLayer, int lin, int slot) {
    return "layer" + std::to_string(globalLayer) + "." + kLinearNames[lin] + "." + kSlotNames[slot];
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
}

nlohmann::json GptModel::fp8State() const {
    if (!m_fp8Meta) return nullptr;
    nlohmann::json out = nlohmann::json::object();
    for (size_t li = 0; li < m_layers.size(); ++li) {
        if (!fp8Layer(int(li))) continue;
        for (int lin = 0; lin < kLinears; ++lin)
            for (int slot = 0; slot < kSlots; ++slot) {
                const Fp8Meta& m = (*m_fp8Meta)[(li * kLinears + size_t(lin)) * kSlots + size_t(slot)];
                out[fp8TensorName(m_ctx.layerBegin + int(li), lin, slot)] = {{"history", m.history}, {"scale", m.scale}};
            }
    }
    return out;
}

Status GptModel::setFp8State(const nlohmann::json& state) {
    if (!m_fp8Meta || state.is_null()) return Status::ok();
    if (!state.is_object()) return Status::invalid("fp8 state must be an object");
    for (size_t li = 0; li < m_layers.size(); ++li) {
        if (!fp8Layer(int(li))) continue;
        for (int lin = 0; lin < kLinears; ++lin)
            for (int slot = 0; slot < kSlots; ++slot) {
                const std::string key = fp8TensorName(m_ctx.layerBegin + int(li), lin, slot);
                auto it = state.find(key);
                if (it == state.end()) continue;
                auto bad = [&](const std::string& why) {
                    return Status::invalid("fp8 state of " + key + ": " + why);
                };
                if (!it->is_object() || !it->contains("history") || !it->contains("scale") ||
                    !(*it)["history"].is_array() || !(*it)["scale"].is_number())
                    return bad("needs a history array and a scale");
                Fp8Meta& m = (*m_fp8Meta)[(li * kLinears + size_t(lin)) * kSlots + size_t(slot)];
                const nlohmann::json& h = (*it)["history"];
                if (h.size() != m.history.size())
                    return bad("amax history of " + std::to_string(h.size()) + " entries, the config has fp8_amax_history_len " +
                               std::to_string(m.history.size()) + "; resume with the same length");
                std::vector<float> hist;
                for (const auto& v : h) {
                    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
                        return bad("amax values must be finite and >= 0");
                    hist.push_back(v.get<float>());
                }
                const double sc = (*it)["scale"].get<double>();
                if (!std::isfinite(sc) || sc <= 0) return bad("scale must be finite and > 0");
                m.history = std::move(hist);
                m.scale = float(sc);
            }
    }
    return Status::ok();
}

Status GptModel::fp8Quantize(int li, Fp8Linear lin, Fp8Slot slot, TensorPtr t, int64_t n) {
    const Fp8Recipe& r = m_o.fp8;
    Fp8Meta* meta = &(*m_fp8Meta)[(size_t(li) * kLinears + size_t(lin)) * kSlots + size_t(slot)];
    const k::Fp8Format fmt = slot == kFp8Grad ? r.backward : r.forward;
    // Output gradients of a data-parallel rank are dp x the single device's (its loss is averaged
    // over its own microbatches; the 1/dp comes with the grad reduction), and cp x with context
    // parallelism (Megatron's loss_func multiplies by cp; the grads are averaged over dp-cp):
    // their amax and scale are taken for the single device's magnitudes, so FP8 rounds the same
    // values the same way whatever the layout (exactly so when dp x cp is a power of two).
    const float g = slot == kFp8Grad ? float(m_ctx.dpSize) * float(m_ctx.cpSize) : 1.0f;
    if (r.delayed) {
        m_exec.op("fp8_quantize", Category::Elementwise, 3.0 * double(n), uint64_t(n) * 8, [=] {
            meta->observe(k::amaxOf(fp(t), n) / g);
            k::fp8QuantizeDequantize(fp(t), fp(t), nullptr, n, meta->scale / g, fmt);
        });
        return Status::ok();
    }
    TS_ASSIGN_OR_RETURN(TensorPtr amax, m_exec.alloc(1, MemCategory::Workspace));
    m_exec.op("fp8_amax", Category::Elementwise, double(n), uint64_t(n) * 4,
              [=] { fp(amax)[0] = k::amaxOf(fp(t), n); });
    // The tensor's amax over every rank holding a part of it: TP shards, and the CP ranks'
    // sequence chunks (a microbatch's rows are split over "cp").
    if (m_ctx.tp && m_ctx.tpSize > 1)
        m_ctx.tp->allReduce(m_exec.stream(), amax->data(), amax->data(), 1, DType::F32, ReduceOp::Max);
    if (m_ctx.cp && m_ctx.cpSize > 1)
        m_ctx.cp->allReduce(m_exec.stream(), amax->data(), amax->data(), 1, DType::F32, ReduceOp::Max);
    const float mx = k::fp8Max(fmt);
    m_exec.op("fp8_quantize", Category::Elementwise, 2.0 * double(n), uint64_t(n) * 8, [=] {
        const float a = fp(amax)[0] / g;
        meta->scale = currentScale(a, mx);
        meta->history[0] = a;
        k::fp8QuantizeDequantize(fp(t), fp(t), nullptr, n, meta->scale / g, fmt);
    });
    return Status::ok();
}

Result<const float*> GptModel::fp8Weight(int li, Fp8Linear lin, int wIdx) {
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
        const Fp8Recipe& r = m_o.fp8;
        Fp8Meta* meta = &(*m_fp8Meta)[(size_t(li) * kLinears + size_t(lin)) * kSlots + size_t(kFp8Weight)];
        const float* W = m_params.modelParam(wIdx);
        TensorPtr dq = w.dequantized, codes = w.codes;
        const k::Fp8Format fmt = r.forward;
        if (r.delayed) {
            m_exec.op("fp8_quantize_weight", Category::Elementwise, 3.0 * double(n), uint64_t(n) * 9, [=] {
                meta->observe(k::amaxOf(W, n));
                k::fp8QuantizeDequantize(W, fp(dq), codes->as<uint8_t>(), n, meta->scale, fmt);
            });
        } else {
            TS_ASSIGN_OR_RETURN(TensorPtr amax, m_exec.alloc(1, MemCategory::Workspace));
            m_exec.op("fp8_amax", Category::Elementwise, double(n), uint64_t(n) * 4,
                      [=] { fp(amax)[0] = k::amaxOf(W, n); });
            if (m_ctx.tp && m_ctx.tpSize > 1)
                m_ctx.tp->allReduce(m_exec.stream(), amax->data(), amax->data(), 1, DType::F32, ReduceOp::Max);
            const float mx = k::fp8Max(fmt);
            m_exec.op("fp8_quantize_weight", Category::Elementwise, 2.0 * double(n), uint64_t(n) * 9, [=] {
                const float a = fp(amax)[0];
                meta->scale = currentScale(a, mx);
                meta->history[0] = a;
                k::fp8QuantizeDequantize(W, fp(dq), codes->as<uint8_t>(), n, meta->scale, fmt);
            });
        }
    }
    return static_cast<const float*>(fp(w.dequantized));
}

void GptModel::fp8StepUpdate() {
    if (!m_fp8Meta) return;
    const Fp8Recipe r = m_o.fp8;
    auto metas = m_fp8Meta;
    const int64_t n = int64_t(metas->size());
    const TraceTarget tt = m_exec.device().traceTarget();
    const int layerBegin = m_ctx.layerBegin;
    auto counters = [=](int step) {
        // amax and scale of every FP8 tensor, as counters "fp8.<layer>.<linear>.<slot>.amax|scale".
        if (!tt.recorder) return;
        const int64_t ts = monotonicNs();
        for (int64_t i = 0; i < n; ++i) {
            const int li = int(i / (kLinears * kSlots)), lin = int(i / kSlots % kLinears), slot = int(i % kSlots);
            const std::string base = "fp8." + fp8TensorName(layerBegin + li, lin, slot);
            const Fp8Meta& m = (*metas)[size_t(i)];
            const float amax = r.delayed ? *std::max_element(m.history.begin(), m.history.end()) : m.history[0];
            tt.recorder->counter({tt.rank, tt.recorder->intern(base + ".amax"), ts, double(amax)});
            tt.recorder->counter({tt.rank, tt.recorder->intern(base + ".scale"), ts, double(m.scale)});
        }
        (void)step;
    };
    const int step = m_step;
    if (!r.delayed) {
        m_exec.op("fp8_counters", Category::Other, 0, 0, [=] { counters(step); });
        return;
    }
    auto buf = m_exec.alloc(n, MemCategory::Workspace);
    if (!buf) return;
    TensorPtr b = *buf;
    m_exec.op("fp8_amax_pack", Category::Elementwise, 0, uint64_t(n) * 8, [=] {
        for (int64_t i = 0; i < n; ++i) fp(b)[i] = (*metas)[size_t(i)].history[0];
    });
    if (m_ctx.amax && m_ctx.amax->size() > 1)
        m_ctx.amax->allReduce(m_exec.stream(), b->data(), b->data(), size_t(n), DType::F32, ReduceOp::Max);
    const float fwdMax = k::fp8Max(r.forward), bwdMax = k::fp8Max(r.backward);
    m_exec.op("fp8_scale_update", Category::Elementwise, double(n), uint64_t(n) * 8, [=] {
        for (int64_t i = 0; i < n; ++i) {
            Fp8Meta& m = (*metas)[size_t(i)];
            m.history[0] = fp(b)[i];
            m.update(i % kSlots == kFp8Grad ? bwdMax : fwdMax, r.margin, r.algoMax);
        }
        counters(step);
    });
}

}  // namespace ts::engine
