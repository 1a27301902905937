// GptModel's MoE block (Megatron's MoELayer with its TopKRouter and experts; REFERENCE.md §5),
// in place of the MLP on the layers moe_layer_freq marks (every layer by default):
//   router: logits = x W_r^T (fp32); each token's top-k choice and probs (kernels/cpu/moe_route.h;
//     the kernels moeRouteTopK / moeRoutePlan on the stream, after moeSinkhorn or
//     moeQbDualUpdate for those modes; moe_routing.h's moeRoute is their host reference):
//     Megatron's default top-k on the logits and a softmax over the k chosen, or softmax before
//     the top-k (moe_router_pre_softmax), sigmoid / sqrtsoftplus scores renormalised over the k
//     (moe_router_score_function), times moe_router_topk_scaling_factor, group-limited
//     (moe_router_num_groups / moe_router_group_topk), the aux-loss-free expert bias on the
//     choice (moe_router_enable_expert_bias), or the sinkhorn router. The Switch load-balancing
//     aux loss aux = E*coeff/(k*T^2) * sum_i (sum_x s_xi) c_i with the aux scores s (full softmax;
//     sigmoid / sqrtsoftplus renormalised over E) and c_i the tokens per expert of the plain
//     top-k of s (compute_routing_scores_for_aux_loss): per microbatch (aux_loss), per sequence
//     (seq_aux_loss), or with c_i summed over tp-dp-cp and averaged over the step's microbatches
//     so far, T = the tokens of the tp-dp-cp group (global_aux_loss, _apply_global_aux_loss), or
//     several of these at once with a coefficient each (Megatron's list form; summed); the
//     z-loss coeff/T * sum_x logsumexp(logits_x)^2. Neither is added to the LM loss: as
//     MoEAuxLossAutoScaler does, their gradients join the backward scaled like the main loss
//     (1/num_microbatches), and their values are counters of the trace. The expert bias moves by
//     rate * sign(mean - count) after each step's last backward, from the routed rows summed over
//     tp-dp-cp (moeStepEnd, finalize_model_grads' _update_router_expert_bias). Quantile balancing
//     (moeQbForward / moeQbStepEnd): the choice is the top-k of logits - qb_beta, the microbatch's
//     column quantile (logits gathered over tp-cp) is summed over the step, and after the last
//     backward qb_beta takes the mean over the microbatches and dp-cp ranks (ema-blended, centred).
//   dispatch: token copies sorted expert-major, token-ascending (Megatron's permute; the plan of
//     router.topk_permute, kernels/cpu/moe_route.h's moeRoutePlan, at the capacity if any);
//   experts: fc1 -> GeLU/SwiGLU -> multiply by the token's prob -> fc2, per expert
//     (moe_grouped_gemm: one op over all experts; else one op per expert — same math);
//     with add_bias_linear (Megatron's default) fc1 + b1 before the activation and
//     fc2 + b2 * prob after it, both inside the experts (experts.py: TEGroupedMLP adds b1 in
//     its GroupedLinear GEMM and b2 in _apply_bias; SequentialMLP's MLP adds b1 in the
//     activation and b2 * per_token_scale to its output), so the dispatcher never sees a bias
//     (moe_layer.py asserts mlp_bias is None); the router's logits get its bias
//     (router.py Router.gating, router_gating_linear in moe_utils.py);
//   combine: scatter-add of the k expert outputs back to each token, in permuted order.
// Expert parallelism (expert_model_parallel_size ep > 1, Megatron's alltoall token dispatcher,
// REFERENCE.md §5.3): the rank holds experts [r*E/ep, (r+1)*E/ep) of its "ep" group.
// After routing, every rank's experts' row offsets are all-gathered over "etp-ep" (the allgather
// dispatcher below: the routing map) and the host
// waits for them (Megatron's D2H sync before the all-to-all: the splits are data-dependent); the
// permuted token copies and their probs go to the experts' ranks by all-to-all over "ep", are
// regrouped from (source rank, local expert) to (local expert, source rank), computed, and travel
// back the same way; the backward sends dY the same way and returns dX and dprob.
// Expert tensor parallelism (expert_tensor_parallel_size etp > 1): each expert's fc1 is split by
// rows (column parallel; SwiGLU: each rank has the matching rows of both halves) and fc2 by
// columns (row parallel) over "etp". After the all-to-all the rows every "etp" rank received are
// all-gathered over "etp" (blocks padded to the largest), so each rank of the group computes
// every row of its experts with its F/etp columns; fc2's partial outputs (and in the backward the
// partial dX and dprob) are summed by a reduce-scatter over "etp" that returns each rank its own
// rows, before the all-to-all back. With the allgather dispatcher the tokens are gathered and the
// outputs reduce-scattered over "etp-ep" instead. Where tokens are dispatched, the rows each
// local expert computed are a counter (moe.layer<L>.expert_rows.expert<E>).
// Expert weights' grads are reduced over the expert-data-parallel group (engine/parallel/ddp.h).
// Shared experts (gpt_layer.cpp, gpt_mlp.cpp) are added to this block's output by the layer;
// with moe_shared_expert_overlap they run inside it, after the dispatch (A.beforeExperts).
// FP8 (fp8 set): every expert GEMM takes FP8 inputs with the expert's own scaling state
// (gpt_fp8.cpp; tensorwise: the scale of the expert's rows on this rank, as TE's GroupedLinear);
// the router stays in high precision. Block recipes (mxfp8, blockwise): each
// expert GEMM quantizes its operands per block along its reduction dimension, the expert's rows
// on this rank as one tensor (TE's GroupedLinear m_splits): forward and dgrad blocks run along
// a row, so they are the single device's whatever the layout; the wgrad's run along the tokens
// from the expert's first row. With expert parallelism over data-parallel ranks an expert's
// rows are those of several microbatches one after the other (source rank by source rank, as
// Megatron's permute 2 orders them), where the single device quantizes each microbatch's rows
// on their own: the wgrad's token blocks then straddle the microbatches unless each source's
// rows are whole blocks (see docs/engine.md). Megatron pads each expert's rows to 16 / 32 with
// zero rows (Fp8Padding, SequentialMLP's _pad_tensor_for_quantization): zero rows change no
// block's amax and add nothing to a GEMM, so the engine does not materialise them.
// Context parallel: the layer runs on the CP-local rows; the aux loss counts the routing of the
// whole microbatch (counts all-reduced over "cp"). Tensor parallel (sequence parallel): each TP
// rank routes its s/t rows; the counts are all-reduced over "tp" for the aux loss.
// Biases follow megatron/core/transformer/moe/{experts.py, router.py, moe_layer.py,
// moe_utils.py}, megatron/core/transformer/mlp.py and extensions/transformer_engine.py
// (TEGroupedLinear); what Megatron asserts against them (ETP > 1, shared experts, grouped GEMM
// with bias_dropout_fusion) is refused by modelDimsFromConfig.
#include "engine/model/gpt.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "engine/backend/graph.h"
#include "engine/model/gpt_internal.h"
#include "engine/model/moe_routing.h"
#include "kernels/common/row_groups.h"

#include "common/clock.h"

namespace ts::engine {

namespace {
// A per-expert router vector of a layer as trace counters "moe.layer<L>.<name>.expert<E>".
void expertCounters(const TraceTarget& tt, int64_t ts, int layer, const char* name, const std::vector<float>& v) {
    if (!tt.recorder) return;
    const std::string base = "moe.layer" + std::to_string(layer) + "." + name + ".expert";
    for (size_t e = 0; e < v.size(); ++e)
        tt.recorder->counter({tt.rank, tt.recorder->intern(base + std::to_string(e)), ts, double(v[e])});
}

MoeScore moeScoreFunction(const Config& c) {
    if (c.moe_router_score_function == "sigmoid") return MoeScore::Sigmoid;
    if (c.moe_router_score_function == "sqrtsoftplus") return MoeScore::SqrtSoftplus;
    return MoeScore::Softmax;
}

// The router's aux-loss terms: the coefficient of each type (Megatron's get_aux_loss_coeff; 0 = the
// term is off). One type, or several with the list form (their losses summed, each logged alone).
struct AuxTerms {
    double aux = 0, seq = 0, global = 0;
    explicit AuxTerms(const Config& c)
        : aux(moeAuxLossCoeff(c, "aux_loss")), seq(moeAuxLossCoeff(c, "seq_aux_loss")),
          global(moeAuxLossCoeff(c, "global_aux_loss")) {}
    bool any() const { return aux != 0 || seq != 0 || global != 0; }
};

// Switch's aux loss coeff * E/(k*Tg^2) * sum_e (sum_x p_xe) c_e of `groups` token groups (Tg tokens
// each; seq_aux_loss: one group per sequence), averaged over the groups. probSum, counts: [groups][E].
double switchAuxLoss(const double* probSum, const double* counts, int groups, int E, int K, double tokensPerGroup,
                     double coeff) {
    double sum = 0;
    for (int i = 0; i < groups * E; ++i) sum += probSum[i] * counts[i];
    return sum * double(E) * coeff / (double(K) * tokensPerGroup * tokensPerGroup) / groups;
}

// FP8 per tensor inside the experts: each expert's rows of base (width w) quantized in place at
// its own scale (q[l]); an expert without rows observes amax 0 (the delayed scale stays, as TE's
// update keeps it).
void quantizeExperts(const Fp8Recipe& fr, const std::vector<Fp8TensorSlots>& q, bool grad, float gradDiv,
                     float* base, int w, const int* off, int l0, int l1) {
    for (int l = l0; l < l1; ++l) {
        const int n = off[l + 1] - off[l];
        float* p = n > 0 ? base + size_t(off[l]) * w : nullptr;
        fp8QuantizeTensor(fr, q[size_t(l)], grad, gradDiv, p, p, nullptr, int64_t(n) * w);
    }
}

// Tensorwise FP8: expert l's two tensors a and b keep their amax in keep[2l] and keep[2l + 1],
// bound with their codes (fp8QuantizeTensor) while the slots go to the next microbatch.
void keepAmaxesIn(const TensorPtr& keep, int l, Fp8TensorSlots& a, Fp8TensorSlots& b) {
    a.keep = fp(keep) + 2 * l;
    b.keep = a.keep + 1;
    a.keepOwner = b.keepOwner = keep;
}

}  // namespace

// What the backward needs from one MoE forward (host-side routing lives here; the ops fill it).
struct GptModel::MoeSaved {
    int T = 0, E = 0, k = 0;
    int rows = 0;                // permuted rows (T*k when dropless; set when routing ran)
    int rowsAlloc = 0;           // their upper bound, known when the forward is enqueued
    std::vector<int> routed;     // [E] token copies routed to each expert before any dropping
    // The aux loss's groups: the microbatch (aux_loss) or each of its sequences (seq_aux_loss).
    // Context parallel: it counts the routing of the whole group (Megatron sums the counts over
    // the TP x CP group): auxCounts = the kernel moeRouterAuxCounts' summed over "tp" (SP) and "cp".
    int groups = 1;
    // Where the backward's kernel reads them (moeRouterAuxBackward), set by the pass that applies the
    // aux losses: [groups][E] the counts summed over tp-cp (aux_loss, seq_aux_loss); [E]
    // global_aux_loss's counts summed over tp-dp-cp and over the step's first gaSteps microbatches.
    TensorPtr auxCounts, auxGlobal;
    int gaSteps = 0;
    TensorPtr qbChosen;          // [T*k] int32 quantile_balancing: the chosen experts (router.qb_dual_update)
    MoeRouteOptions ro;            // how the router chose (the probs' backward)
    int dropped = 0;
    std::vector<int> offset;     // [E+1] first permuted row of each expert (takeOffsets)
    // Padded to the capacity on one device: the offsets are the host's own (every expert has
    // min(cap, T) rows), the routing is never read back, and `routed` / `dropped` stay on the
    // device (the plan's routed words, which the counters read at the step's end).
    bool routedOnDevice = false;
    // The expert bias's counts of this step that this routing adds to: RouterState::localTokens of
    // layer biasLayer (null: no expert bias, or a full recompute's rerun, which counts nothing).
    std::shared_ptr<std::vector<RouterState>> biasRouter;
    int biasLayer = -1;
    // The host learns the experts' row offsets: read back by router.topk_permute, or with EP / ETP
    // and the kernels' routing from the dispatcher's gathered ones (moeDispatchPlan,
    // moeAllGatherDispatch; dropless, the rows are T*k without them). At a capacity `routed`
    // (each expert's copies before dropping) is set already and gives the dropped copies; without
    // dropping, every copy routed is kept.
    void takeOffsets(const int32_t* o) {
        offset.assign(o, o + E + 1);
        rows = o[E];
        dropped = 0;
        if (!routedOnDevice && routed.empty()) {
            routed.resize(size_t(E));
            for (int e = 0; e < E; ++e) routed[size_t(e)] = o[e + 1] - o[e];
        } else if (!routedOnDevice && ro.cap >= 0) {
            for (int e = 0; e < E; ++e) dropped += std::max(0, routed[size_t(e)] - ro.cap);
        }
        if (biasRouter) {
            std::vector<double>& tokens = (*biasRouter)[size_t(biasLayer)].localTokens;
            for (int e = 0; e < E; ++e) tokens[size_t(e)] += o[e + 1] - o[e];
        }
    }
    // The routing plan where kernels read it, int32, filled by router.topk_permute (the kernels
    // moeRouteTopK and moeRoutePlan):
    // [rowsAlloc] the token of each permuted row, [T+1] + [rowsAlloc] the combine's inverse index
    // (a token's rows in order), [rowsAlloc] token*E + expert of each row (allgather's map and
    // dprob), [T*k] each slot's row (-1: dropped), [T*k] each slot's expert (token-major, best
    // first), [E+1] each expert's first row, [E] each expert's copies before dropping (written
    // with a capacity).
    TensorPtr plan;
    // The plan's arrays from its first word.
    struct PlanParts {
        int32_t *tok, *start, *inv, *tokExp, *rowOf, *topi, *offset, *routed;
    };
    PlanParts planDev() const {
        PlanParts p;
        p.tok = static_cast<int32_t*>(plan->data());
        p.start = p.tok + rowsAlloc;
        p.inv = p.start + T + 1;
        p.tokExp = p.inv + rowsAlloc;
        p.rowOf = p.tokExp + rowsAlloc;
        p.topi = p.rowOf + int64_t(T) * k;
        p.offset = p.topi + int64_t(T) * k;
        p.routed = p.offset + E + 1;
        return p;
    }
    int64_t planWords() const { return 3 * int64_t(rowsAlloc) + T + 1 + 2 * int64_t(T) * k + 2 * int64_t(E) + 1; }
    int32_t* planTok() const { return planDev().tok; }
    int32_t* planStart() const { return planDev().start; }
    int32_t* planInv() const { return planDev().inv; }
    int32_t* planTokExp() const { return planDev().tokExp; }
    int32_t* planRowOf() const { return planDev().rowOf; }
    int32_t* planTopi() const { return planDev().topi; }
    int32_t* planOffset() const { return planDev().offset; }
    int32_t* planRouted() const { return planDev().routed; }
    TensorPtr logits;            // [T, E]
    TensorPtr xp;                // permuted input [T*k, h]
    TensorPtr probT;             // [T*k] the routing prob of each permuted row (= prob)
    // Expert side: the R rows this rank's L experts process, grouped by local expert (with EP,
    // by source rank inside an expert). Without EP they are the permuted rows themselves.
    int R = 0;
    std::vector<int> eoff;       // [L+1] first row of each local expert
    TensorPtr xin, eprob;        // [R, h], [R]
    TensorPtr fc1, act;          // fc1 output [R, F1], activation [R, F]
    TensorPtr fc2in;             // FP8: fc2's quantized input act * prob [R, F] (the wgrad reads it)
    // alltoall dispatcher with EP or ETP: rows sent to / received from each EP rank; with ETP
    // the rows each "etp" rank received (Megatron's output_splits_tp), padded to etpPad rows each
    // for the all-gather / reduce-scatter over "etp"; and for every expert-side row its place in
    // the arrival order (padded with ETP) and in the expert-grouped order.
    std::vector<int> sendRows, recvRows, etpRows;
    int ownRows = 0, etpPad = 0;
    std::vector<int> arrivePos, expPos;
    // Their gather indexes: the expert-grouped rows from the arrival order (moeToExperts) and back
    // (moeFromExperts; -1: an ETP padding row, zero).
    KernelIds toExperts, fromExperts;
    // allgather dispatcher (EP or ETP): the global token (rank-major over the "etp-ep" group) and
    // the expert of every expert-side row.
    bool allgather = false;
    std::vector<int> agToken, agExpert;
    // Their gather indexes: agToken; its inverse over the T*n tokens (start, rows); and for each
    // (token, expert) of the group the row computing it (-1: none).
    KernelIds agTok, agStart, agRows, agDp;
    int gl = 0;  // global layer (counter names)
};

// One MoE forward's counters (trace only) until flushRouterStats reads its counts back: what the
// host knew when it ran, and the device counts of MoeSaved (not MoeSaved itself: it holds the
// layer's activations).
struct GptModel::RouterStats {
    int gl = 0, T = 0, E = 0, K = 0, G = 1, share = 1, dpSize = 1, gaSteps = 0;
    bool cap = false;
    TensorPtr counts, global;  // MoeSaved::auxCounts, auxGlobal (null: not counted)
    // moeRouterAuxCounts' [G*E] sums of the aux scores per group, then the sum of lse^2.
    TensorPtr stats;
    int64_t ts = 0;
    std::vector<int> routed;
    int dropped = 0;
    // Padded to the capacity on one device (MoeSaved::routedOnDevice): `routed` is not known on the
    // host; the router copies it into stats' last E floats (int32 bits), and the flush reads it
    // there and counts the dropped copies over `capacity`.
    bool routedInStats = false;
    int capacity = -1;
};

// What of the routed experts' saved state holds bf16 values (GptModel::saveBf16): the permuted
// and the expert-side input rows (copies of the layer's normed input; FP8 experts quantize the
// expert-side rows in place, and without EP they are the permuted rows themselves), and each
// row's fc1 output and activation. Not the router's logits and probs (fp32, as Megatron's router).
void GptModel::moeBf16SavedTensors(MoeSaved& s, std::vector<SavedTensor>& out) {
    out.push_back({&s.xp, true});
    out.push_back({&s.xin, true});
    out.push_back({&s.fc1, false});
    out.push_back({&s.act, false});
}


Result<TensorPtr> GptModel::moeForward(LayerActs& A, const LayerParams& P, int gl) {
    const int T = localTokens(), h = m_d.hidden;  // SP: this rank's s/t rows
    const int E = m_cfg.num_moe_experts, K = m_cfg.moe_router_topk;
    // Expert tensor parallel: this rank's F/etp columns of each expert's hidden layer.
    const int F = m_moeFfnL, F1 = m_d.swiglu ? 2 * F : F;
    const bool bf = m_o.bf16, swiglu = m_d.swiglu, grouped = m_cfg.moe_grouped_gemm;
    auto s = std::make_shared<MoeSaved>();
    s->gl = gl;
    s->T = T;
    s->E = E;
    s->k = K;
    A.moe = s;
    const int ep = m_ctx.epSize, L = E / ep, etp = m_ctx.etpSize;
    // Token dropping (moe_expert_capacity_factor; Megatron's get_capacity and
    // apply_router_token_dropping): an expert keeps at most `cap` of its token copies, by
    // routing prob (ties: earlier token) or by position; with padding every expert gets exactly
    // `cap` rows, filled with the earliest tokens not routed to it, at prob 0.
    const double capFactor = m_cfg.moe_expert_capacity_factor;
    const int cap = capFactor > 0 ? int(std::ceil(double(T) * K / E * capFactor)) : -1;
    const bool pad = cap >= 0 && m_cfg.moe_pad_expert_input_to_capacity;
    const bool byProb = m_cfg.moe_token_drop_policy != "position";
    const int rowsAlloc = pad ? E * cap : T * K;  // upper bound of the permuted rows
    s->rows = rowsAlloc;
    s->rowsAlloc = rowsAlloc;
    TS_ASSIGN_OR_RETURN(s->logits, allocUninitialized(m_exec, int64_t(T) * E));
    TS_ASSIGN_OR_RETURN(s->xp, allocUninitialized(m_exec, int64_t(rowsAlloc) * h));
    TS_ASSIGN_OR_RETURN(s->probT, allocUninitialized(m_exec, int64_t(rowsAlloc)));
    TS_ASSIGN_OR_RETURN(TensorPtr out, m_exec.alloc(int64_t(T) * h));
    TensorPtr x = A.a2;
    const float* Wr = m_params.modelParam(P.routerW);
    const float* Br = P.routerB >= 0 ? m_params.modelParam(P.routerB) : nullptr;  // add_bias_linear
    const auto& lb = m_cfg.moe_router_load_balancing_type;
    const AuxTerms terms(m_cfg);
    const bool globalAux = terms.global != 0;
    // seq_aux_loss: one aux loss per sequence of the microbatch (tokens t with t % b == bi,
    // sequence-first), averaged over the b sequences (aux_loss sums its groups' statistics).
    const int mbB = m_d.microBatch, G = terms.seq != 0 ? mbB : 1;
    const int li = int(&P - m_layers.data());
    s->groups = G;
    const TraceTarget tt = m_exec.device().traceTarget();
    m_exec.op("router.fwd", Category::Gemm, 2.0 * T * h * E, uint64_t(4) * (uint64_t(T) * (h + E) + uint64_t(E) * h),
              [=] {
                  // The engine computes the router in fp32 whatever moe_router_dtype says
                  // (docs/knobs.md; Megatron's moe_router_dtype=fp32, where router_gating_linear
                  // casts its operands up; its default "" runs it in bf16): fp32 GEMMs here too,
                  // as the backward's logit gradients are fp32 values, which a bf16 GEMM would round.
                  k::Bf16GemmScope fp32Router(false);
                  k::linearForward(fp(x), Wr, Br, fp(s->logits), T, h, E);
              });
    MoeRouteOptions ro;
    ro.T = T;
    ro.E = E;
    ro.K = K;
    ro.cap = cap;
    ro.pad = pad;
    ro.byProb = byProb;
    ro.bf16Probs = bf;
    ro.score = moeScoreFunction(m_cfg);
    ro.preSoftmax = m_cfg.moe_router_pre_softmax;
    ro.scale = m_cfg.moe_router_topk_scaling_factor;
    ro.numGroups = m_cfg.moe_router_num_groups;
    ro.groupTopk = m_cfg.moe_router_group_topk;
    ro.sinkhorn = lb == "sinkhorn";
    s->ro = ro;
    // Quantile balancing's choice (router.qb_dual_update, before the routing): s->qbChosen.
    if (lb == "quantile_balancing") TS_RETURN_IF_ERROR(moeQbForward(*s, li));
    // The expert bias is read when the op runs (the step-end update is an op of the same stream);
    // the routed rows are counted once per microbatch (not again by a full recompute).
    const bool bias = m_cfg.moe_router_enable_expert_bias;
    if (bias && !m_recomputing) {
        s->biasRouter = m_router;
        s->biasLayer = li;
    }
    auto router = m_router;
    TS_ASSIGN_OR_RETURN(s->plan, allocUninitialized(m_exec, s->planWords(), MemCategory::Workspace));
    // With EP or ETP the dispatcher gathers every rank's offsets and waits for them anyway: the
    // host learns its own there, so the routing waits for nothing (one wait per layer and
    // microbatch, the dispatcher's, as Megatron's). Dropless, the rows are T*k until then; at a
    // capacity the alltoall dispatcher gathers each expert's copies before dropping with the
    // offsets, and the permutation gathers all rowsAlloc rows, those past the kept ones zero (their
    // tokens -1). The allgather dispatcher's routing map needs the rows at once: there the router
    // reads them back at a capacity, and the dispatcher waits a second time.
    const bool offsetsFromDispatch = (ep > 1 || etp > 1) && (cap < 0 || m_cfg.moe_token_dispatcher_type != "allgather");
    // Padded to the capacity on one device, every expert has min(cap, T) rows (its kept copies and
    // the earliest other tokens): the host knows the offsets without waiting for the routing, so
    // the layer's ops hold no host wait (and a CUDA graph can capture them).
    if (pad && ep == 1 && etp == 1) {
        std::vector<int32_t> o(size_t(E) + 1);
        for (int e = 0; e <= E; ++e) o[size_t(e)] = e * std::min(cap, T);
        s->routedOnDevice = true;
        s->takeOffsets(o.data());
    }
    const kernels::cpu::MoeCapacity capacity = ro.capacity();
    const kernels::cpu::MoeTopKSpec spec = ro.topk();
    TensorPtr biasDev, norm;
    TS_ASSIGN_OR_RETURN(TensorPtr probsWs, allocUninitialized(m_exec, int64_t(T) * K, MemCategory::Workspace));
    if (bias) { TS_ASSIGN_OR_RETURN(biasDev, allocUninitialized(m_exec, E, MemCategory::Workspace)); }
    // sinkhorn: the doubly normalised logits the choice is the top-k of
    if (ro.sinkhorn) { TS_ASSIGN_OR_RETURN(norm, allocUninitialized(m_exec, int64_t(T) * E, MemCategory::Workspace)); }
    // The ops read the tensors the layer saves through their own pointers: the host replaces those
    // in MoeSaved when it packs them for the backward (GptModel::saveBf16), maybe before they run.
    TensorPtr xp = s->xp;
    const TensorPtr chosen = s->qbChosen;
    m_exec.op("router.topk_permute", Category::Elementwise, double(T) * E * 4, uint64_t(T) * (E + K * h) * 4, [=] {
        // On the stream, every mode: the choice, its probs and the plan (at the capacity if any);
        // the host reads back only the experts' row offsets (as Megatron's dispatcher reads its
        // tokens per expert), at a capacity with each expert's copies before dropping.
        if (biasDev)
            k::copyBytes(biasDev->data(), (*router)[size_t(li)].expertBias.data(), size_t(E) * sizeof(float));
        if (offsetsFromDispatch && cap >= 0)  // rows past the kept ones: token -1, a zero row
            k::setBytes(s->planTok(), 0xFF, size_t(s->rowsAlloc) * sizeof(int32_t));
        if (norm) k::moeSinkhorn(fp(s->logits), T, E, fp(norm), kMoeSinkhornTol);
        k::moeRouteTopK(fp(s->logits), biasDev ? fp(biasDev) : nullptr, norm ? fp(norm) : nullptr,
                        chosen ? chosen->as<int32_t>() : nullptr, s->planTopi(), fp(probsWs), T,
                        E, spec);
        k::moeRoutePlan(s->planTopi(), fp(probsWs), T, K, E, capacity, s->planOffset(),
                        cap >= 0 ? s->planRouted() : nullptr, s->planTok(), s->planStart(), s->planInv(),
                        s->planTokExp(), s->planRowOf(), fp(s->probT));
        // With offsetsFromDispatch the dispatcher's gather brings them (s->rows stays rowsAlloc for
        // the gather below); padded on one rank the host has them already.
        const bool readOffsets = !offsetsFromDispatch && !s->routedOnDevice;
        if (readOffsets && cap >= 0) {
            std::vector<int32_t> both(2 * size_t(E) + 1);  // offsets [E+1], then routed [E]
            k::download(both.data(), s->planOffset(), both.size() * sizeof(int32_t));
            s->routed.assign(both.begin() + E + 1, both.end());
            s->takeOffsets(both.data());
        } else if (readOffsets) {
            std::vector<int32_t> offset(size_t(E) + 1);
            k::download(offset.data(), s->planOffset(), offset.size() * sizeof(int32_t));
            s->takeOffsets(offset.data());
        }
        k::gatherRows(fp(x), s->planTok(), fp(xp), s->rows, h);
        if (ep == 1 && etp == 1) s->eoff = s->offset;
    });
    s->qbChosen.reset();  // the op holds it until it has run
    // The aux losses' counts, where the backward's kernel (moeRouterAuxBackward) reads them: over
    // the TP (sequence parallel: each rank routes its s/t rows) and CP groups; global_aux_loss:
    // summed over "tp-dp-cp" instead (get_tokens_per_expert_and_token_count's reduce_group) and over
    // the step's microbatches so far. The host never reads them back within the step. Only the
    // pass that applies the aux losses counts: not the first forward of a fully recomputed layer
    // (Megatron's no-grad forward), its rerun. Traced, the same kernel sums the statistics of the
    // router's counters (read back at the step's end with the counts, flushRouterStats).
    const int cp = m_ctx.cpSize, tpShare = m_sp ? m_ctx.tpSize : 1;
    const int dpSize = m_ctx.dpSize, share = cp * tpShare, globalShare = share * dpSize;
    const bool auxPass = recomputeGroupStart(li) < 0 || m_recomputing;
    if (auxPass && globalAux && globalShare > 1 && (!m_ctx.tpDpCp || m_ctx.tpDpCp->size() != globalShare))
        return Status::internal("global_aux_loss needs the tp-dp-cp group");
    if (auxPass && (terms.aux != 0 || terms.seq != 0)) {
        TS_ASSIGN_OR_RETURN(s->auxCounts, allocUninitialized(m_exec, int64_t(G) * E, MemCategory::CommBuffers));
    }
    if (auxPass && globalAux) {
        TS_ASSIGN_OR_RETURN(s->auxGlobal, allocUninitialized(m_exec, E, MemCategory::CommBuffers));
    }
    TensorPtr stats;
    if (tt.recorder && auxPass) {
        // (+ E: the routed copies' int32 bits where only the device has them)
        TS_ASSIGN_OR_RETURN(stats, allocUninitialized(m_exec, int64_t(G) * E + 1 + (s->routedOnDevice ? E : 0),
                                                      MemCategory::Workspace));
        if (s->routedOnDevice) {
            const TensorPtr into = stats;
            m_exec.op("router.routed_counts", Category::Memcpy, 0, uint64_t(E) * 8, [=] {
                k::copyBytes(fp(into) + int64_t(G) * E + 1, s->planRouted(), size_t(E) * sizeof(int32_t));
            });
        }
    }
    if (s->auxCounts || s->auxGlobal || stats) {
        const TensorPtr counts = s->auxCounts, global = s->auxGlobal, logits = s->logits;
        const MoeScore score = ro.score;
        m_exec.op("router.aux_counts", Category::Elementwise, double(T) * E * 4, uint64_t(T) * E * 4, [=] {
            k::moeRouterAuxCounts(fp(logits), T, E, K, G, mbB, score, counts ? fp(counts) : nullptr,
                                  global ? fp(global) : nullptr, stats ? fp(stats) : nullptr);
        });
    }
    if (const TensorPtr counts = s->auxCounts) {
        if (tpShare > 1)
            m_ctx.tp->allReduce(m_exec.stream(), counts->data(), counts->data(), size_t(G) * E, DType::F32,
                                ReduceOp::Sum);
        if (cp > 1)
            m_ctx.cp->allReduce(m_exec.stream(), counts->data(), counts->data(), size_t(G) * E, DType::F32,
                                ReduceOp::Sum);
    }
    if (const TensorPtr global = s->auxGlobal) {
        if (globalShare > 1)
            m_ctx.tpDpCp->allReduce(m_exec.stream(), global->data(), global->data(), size_t(E), DType::F32,
                                    ReduceOp::Sum);
        // The step's sum so far: this microbatch's counts plus the previous sum (a buffer of the
        // previous microbatch's MoeSaved, kept alive by RouterState until the step's end).
        RouterState& rs = (*m_router)[size_t(li)];
        if (rs.globalSum) {
            const TensorPtr prev = rs.globalSum;
            m_exec.op("moe.global_counts_sum", Category::Elementwise, E, uint64_t(E) * 12,
                      [=] { k::addInPlace(fp(global), fp(prev), E); });
        }
        rs.globalSum = global;
        s->gaSteps = ++rs.gaSteps;
    }
    // Where the permuted rows are computed: here (ep 1, etp 1) or on the experts' EP ranks, by
    // every rank of the expert's "etp" group (each with its F/etp columns).
    s->allgather = (ep > 1 || etp > 1) && m_cfg.moe_token_dispatcher_type == "allgather";
    if (s->allgather) {
        TS_RETURN_IF_ERROR(moeAllGatherDispatch(*s, x));
        s->xp.reset();  // the experts' rows come from the gathered tokens; nothing reads the permuted ones
    } else if (ep > 1 || etp > 1) {
        TS_RETURN_IF_ERROR(moeDispatchPlan(*s));
        TS_ASSIGN_OR_RETURN(s->xin, moeToExperts(*s, s->xp, h));
        TS_ASSIGN_OR_RETURN(s->eprob, moeToExperts(*s, s->probT, 1));
        s->xp.reset();  // sent: the experts and their backward read xin
    } else {
        s->R = rowsAlloc;  // allocation bound; the experts read their rows from eoff
        s->xin = s->xp;
        s->eprob = s->probT;
    }
    // The router's counters (trace only): what the host knows once the dispatch is planned (its
    // tokens per expert), and the counts and statistics read back once at the step's end
    // (flushRouterStats).
    if (tt.recorder && auxPass) {
        auto st = std::make_shared<RouterStats>();
        st->gl = gl;
        st->T = T;
        st->E = E;
        st->K = K;
        st->G = G;
        st->share = share;
        st->dpSize = dpSize;
        st->gaSteps = s->gaSteps;
        st->cap = cap >= 0;
        st->counts = s->auxCounts;
        st->global = s->auxGlobal;
        st->stats = stats;
        st->routedInStats = s->routedOnDevice;
        st->capacity = cap;
        m_exec.op("moe.router_stats", Category::Other, 0, 0, [=] {
            st->ts = monotonicNs();
            st->routed = s->routed;
            st->dropped = s->dropped;
        });
        m_pendingRouterStats.push_back(std::move(st));
    }
    // moe_shared_expert_overlap: the shared experts run here (gpt_layer.cpp).
    if (A.beforeExperts) TS_RETURN_IF_ERROR(A.beforeExperts());
    const int R = s->R;
    TS_ASSIGN_OR_RETURN(s->fc1, allocUninitialized(m_exec, int64_t(R) * F1));
    TS_ASSIGN_OR_RETURN(s->act, allocUninitialized(m_exec, int64_t(R) * F));
    TS_ASSIGN_OR_RETURN(TensorPtr eout, allocUninitialized(m_exec, int64_t(R) * h));
    // FP8 (gpt_fp8.cpp, TE's GroupedLinear): each expert GEMM's inputs in FP8 with the expert's
    // own scaling state — fc1's input rows (quantized in place: the wgrad reads the same values),
    // fc2's input act * prob (kept for the wgrad), and the weights' FP8 copies.
    // Block recipes (mxfp8, blockwise): nothing is quantized in place; each expert GEMM quantizes
    // its operands per block from the high-precision rows (the expert's rows on their own, as
    // TE's GroupedLinear splits them) into the workspace xq, and fc2in keeps the high-precision
    // act * prob for the wgrad (fp8BlockExpertsForward / Backward, fp8.h).
    const bool fp8 = m_fp8ExpMeta && fp8Layer(li);
    const Fp8Recipe fr = m_o.fp8;
    const bool blk = fp8 && fr.isBlock();
    std::vector<Fp8TensorSlots> q1(static_cast<size_t>(L)), q2(static_cast<size_t>(L));
    TensorPtr xq, scaledWs, biasWs;
    if (blk) { TS_ASSIGN_OR_RETURN(xq, allocUninitialized(m_exec, int64_t(R) * std::max(h, F), MemCategory::Workspace)); }
    // fc2's input act * prob (FP8: kept in fc2in for the wgrad) and fc2's bias times the prob
    if (!fp8) { TS_ASSIGN_OR_RETURN(scaledWs, allocUninitialized(m_exec, int64_t(R) * F, MemCategory::Workspace)); }
    if (!P.expFc2B.empty()) {
        TS_ASSIGN_OR_RETURN(biasWs, allocUninitialized(m_exec, int64_t(R) * h, MemCategory::Workspace));
    }
    if (fp8 && !blk && !m_fp8ExpAmaxDev) return Status::internal("FP8 experts without their amax buffer");
    if (fp8 && !blk && m_o.fp8.delayed && !m_fp8ExpScaleDev)
        return Status::internal("FP8 experts' delayed scaling without its scale buffer");
    if (fp8) {
        TS_ASSIGN_OR_RETURN(s->fc2in, allocUninitialized(m_exec, int64_t(R) * F));
        // Tensorwise: each expert's input and fc2 input amax, kept with their codes until the
        // backward's wgrads have read them (the slots are the next microbatch's by then).
        TensorPtr keep;
        if (!blk && !fr.delayed) { TS_ASSIGN_OR_RETURN(keep, m_exec.alloc(2 * int64_t(L), MemCategory::Workspace)); }
        for (int l = 0; l < L && !blk; ++l) {
            q1[size_t(l)] = fp8ExpertSlots(li, l, kFp8ExpFc1, kFp8Input);
            q2[size_t(l)] = fp8ExpertSlots(li, l, kFp8ExpFc2, kFp8Input);
            if (keep) keepAmaxesIn(keep, l, q1[size_t(l)], q2[size_t(l)]);
        }
    }
    // experts: fc1 (+ b1) -> activation -> * prob -> fc2 (+ b2 * prob), rows [eoff[l], eoff[l+1])
    std::vector<const float*> W1(static_cast<size_t>(L)), W2(static_cast<size_t>(L));
    std::vector<const float*> B1(static_cast<size_t>(L), nullptr), B2(static_cast<size_t>(L), nullptr);
    for (int l = 0; l < L; ++l) {
        if (!fp8) {  // FP8: the weights' copies below
            W1[size_t(l)] = m_params.modelParam(P.expFc1W[size_t(l)]);
            W2[size_t(l)] = m_params.modelParam(P.expFc2W[size_t(l)]);
        }
        if (!P.expFc1B.empty()) {
            B1[size_t(l)] = m_params.modelParam(P.expFc1B[size_t(l)]);
            B2[size_t(l)] = m_params.modelParam(P.expFc2B[size_t(l)]);
        }
    }
    if (blk) {
        // each expert's weight copy along `in` (TE quantizes every GEMM's weight of a GroupedLinear)
        for (int l = 0; l < L; ++l) {
            TS_ASSIGN_OR_RETURN(W1[size_t(l)], fp8BlockWeight(P.expFc1W[size_t(l)], true));
            TS_ASSIGN_OR_RETURN(W2[size_t(l)], fp8BlockWeight(P.expFc2W[size_t(l)], true));
        }
    } else if (fp8) {
        TS_ASSIGN_OR_RETURN(W1, fp8ExpertWeights(li, kFp8ExpFc1, P.expFc1W));
        TS_ASSIGN_OR_RETURN(W2, fp8ExpertWeights(li, kFp8ExpFc2, P.expFc2W));
    }
    const TensorPtr xinT = s->xin, fc1T = s->fc1, actT = s->act;  // see router.topk_permute
    const bool fp32 = fp8 && !fp8GemmsBf16();  // FP8 operands the bf16 GEMMs would round
    const bool b1Sep = !grouped && B1[0];      // SequentialMLP: fc1's bias added after the GEMM
    // Local experts [l0, l1): their rows [eoff[l0], eoff[l1]) lie together, so everything that is
    // the same for every row (the rounding, the activation, the prob) runs once over all of them,
    // the GEMMs as one grouped call, and only what is an expert's own per expert: its FP8
    // quantization (its scaling state) and its biases. TEGroupedMLP runs all local experts at once
    // (moe_grouped_gemm); SequentialMLP one expert at a time.
    auto experts = [=](int l0, int l1) {
        k::Fp32GemmScope gemms(fp32);
        const int* off = s->eoff.data();
        const int r0 = off[l0], rows = off[l1] - r0, G = l1 - l0;
        auto each = [&](auto&& f) { kernels::forEachGroupWithRows(off, l0, l1, f); };
        auto quantize = [&](const std::vector<Fp8TensorSlots>& q, float* base, int w) {
            quantizeExperts(fr, q, false, 1.f, base, w, off, l0, l1);
        };
        if (fp8 && !blk) quantize(q1, fp(xinT), h);
        if (rows == 0) {
            if (fp8 && !blk) quantize(q2, nullptr, F);
            return;
        }
        float* f1 = fp(fc1T) + size_t(r0) * F1;
        float* ac = fp(actT) + size_t(r0) * F;
        const float* prob = fp(s->eprob) + r0;
        // fc1's bias (never quantized): TEGroupedMLP's GroupedLinear adds it in the GEMM
        // (skip_bias_add=False: one bf16 rounding of x W^T + b); SequentialMLP's experts get it
        // back from fc1 (skip_bias_add=True) and add it to fc1's bf16 output in the activation
        // (x + b, or weighted_bias_swiglu's), rounded again. The saved fc1 includes the bias.
        const float* const* b1Gemm = grouped ? B1.data() : nullptr;  // fc1's bias inside the GEMM (grouped)
        if (blk) fp8BlockExpertsForward(fr, fp(xinT), W1.data(), b1Gemm, fp(fc1T), off, l0, l1, h, F1, fp(xq));
        else k::linearForwardGrouped(fp(xinT), W1.data() + l0, b1Gemm ? b1Gemm + l0 : nullptr, fp(fc1T), off + l0, G, h,
                                     F1);
        if (bf) k::roundToBf16(f1, int64_t(rows) * F1);
        if (b1Sep) {
            each([&](int l, int e0, int n) { k::addBias(fp(fc1T) + size_t(e0) * F1, B1[size_t(l)], n, F1); });
            if (bf) k::roundToBf16(f1, int64_t(rows) * F1);
        }
        if (swiglu) k::swigluForward(f1, ac, rows, F, bf);
        else k::biasGeluForward(f1, nullptr, ac, rows, F, bf);
        float* scaledBase = fp8 ? fp(s->fc2in) : fp(scaledWs);
        float* scaled = scaledBase + size_t(r0) * F;
        k::scaleRows(ac, F, prob, scaled, rows, F);
        if (bf) k::roundToBf16(scaled, int64_t(rows) * F);
        if (fp8 && !blk) quantize(q2, scaledBase, F);
        float* o = fp(eout) + size_t(r0) * h;
        if (blk) fp8BlockExpertsForward(fr, fp(s->fc2in), W2.data(), nullptr, fp(eout), off, l0, l1, F, h, fp(xq));
        else k::linearForwardGrouped(scaledBase, W2.data() + l0, nullptr, fp(eout), off + l0, G, F, h);
        if (B2[0]) {
            // fc2's bias (skip_bias_add=True) weighted by the row's prob, added by the experts
            // (TEGroupedMLP._apply_bias / MLP with per_token_scale: output + bias * prob, in bf16:
            // fc2's output, the product and the sum each rounded). Padding rows (prob 0) get none.
            if (bf) k::roundToBf16(o, int64_t(rows) * h);
            float* bp = fp(biasWs) + size_t(r0) * h;
            each([&](int l, int e0, int n) {
                k::scaleRows(B2[size_t(l)], 0, fp(s->eprob) + e0, fp(biasWs) + size_t(e0) * h, n, h);
            });
            if (bf) k::roundToBf16(bp, int64_t(rows) * h);
            k::addInPlace(o, bp, int64_t(rows) * h);
            if (bf) k::roundToBf16(o, int64_t(rows) * h);
        }
    };
    // Without EP the routing is known only when the ops run: the average FLOPs of the experts.
    const double expertFlops = 2.0 * R * (double(h) * F1 + double(F) * h);
    // Where tokens were dispatched (EP or ETP): the rows each local expert computes here, a counter
    // (with ETP every rank of an "etp" group computes the same rows, all-gathered over it).
    const bool dispatched = ep > 1 || etp > 1;
    const int epRank = m_ctx.epRank;
    auto countRows = [=] {
        if (!dispatched || !tt.recorder) return;
        const int64_t ts = monotonicNs();
        const std::string base = "moe.layer" + std::to_string(gl) + ".expert_rows.expert";
        for (int l = 0; l < L; ++l)
            tt.recorder->counter({tt.rank, tt.recorder->intern(base + std::to_string(epRank * L + l)), ts,
                                  double(s->eoff[size_t(l) + 1] - s->eoff[size_t(l)])});
    };
    if (grouped) {
        m_exec.op("experts.grouped_mlp.fwd", Category::Gemm, expertFlops, uint64_t(R) * (h + F1 + F) * 4, [=] {
            countRows();
            experts(0, L);
        });
    } else {
        for (int l = 0; l < L; ++l)
            m_exec.op("experts.local_expert.fwd", Category::Gemm, expertFlops / L, uint64_t(R) * (h + F1 + F) * 4 / L,
                      [=] {
                          if (l == 0) countRows();
                          experts(l, l + 1);
                      });
    }
    if (s->allgather) {
        // Each rank's partial output of every token of the "etp-ep" group (with ETP, partial sums
        // over the F/etp columns too), summed by reduce-scatter.
        const int n = ep * etp;
        TS_ASSIGN_OR_RETURN(TensorPtr part, m_exec.alloc(int64_t(T) * n * h, MemCategory::CommBuffers));
        m_exec.op("moe.unpermute", Category::Elementwise, double(R) * h, uint64_t(R) * h * 8,
                  [=] { k::gatherSumRows(fp(eout), s->agStart.ptr, s->agRows.ptr, fp(part), T * n, h); });
        expertGroup()->reduceScatter(m_exec.stream(), part->data(), out->data(), size_t(T) * h, DType::F32,
                                     ReduceOp::Sum);
        keepUntilPassed(m_exec.stream(), {part, out});
        if (bf) roundBf16(out, int64_t(T) * h);
        return out;
    }
    TensorPtr outp = eout;
    if (dispatched) {
        TS_ASSIGN_OR_RETURN(outp, moeFromExperts(*s, eout, h));
    }
    // the combine: each token's rows summed in permuted order (the inverse index, no atomics)
    m_exec.op("moe.unpermute", Category::Elementwise, double(T) * K * h, uint64_t(T) * K * h * 8, [=] {
        k::gatherSumRows(fp(outp), s->planStart(), s->planInv(), fp(out), T, h);
        if (bf) k::roundToBf16(fp(out), int64_t(T) * h);
    });
    return out;
}

Result<TensorPtr> GptModel::moeBackward(LayerActs& A, const LayerParams& P, TensorPtr dout) {
    const int T = localTokens(), h = m_d.hidden;  // SP: this rank's s/t rows
    const int E = m_cfg.num_moe_experts, K = m_cfg.moe_router_topk;
    const int F = m_moeFfnL, F1 = m_d.swiglu ? 2 * F : F;
    const bool bf = m_o.bf16, swiglu = m_d.swiglu, grouped = m_cfg.moe_grouped_gemm;
    std::shared_ptr<MoeSaved> s = A.moe;
    if (!s) return Status::internal("MoE backward without saved activations");
    TensorPtr x = A.a2;
    const int ep = m_ctx.epSize, L = E / ep, R = s->R, etp = m_ctx.etpSize, n = ep * etp;
    const bool dispatched = ep > 1 || etp > 1;
    const int rowsAlloc = s->rowsAlloc;
    TS_ASSIGN_OR_RETURN(TensorPtr dx, m_exec.alloc(int64_t(T) * h));
    // dY of every permuted row (the token's gradient: the combine summed the k copies).
    TS_ASSIGN_OR_RETURN(TensorPtr dyp, allocUninitialized(m_exec, int64_t(rowsAlloc) * h));
    m_exec.op("moe.permute_grad", Category::Elementwise, 0, uint64_t(rowsAlloc) * h * 8,
              [=] { k::gatherRows(fp(dout), s->planTok(), fp(dyp), s->rows, h); });
    TensorPtr dyin = dyp;
    if (s->allgather) {
        // dY of every token of the "etp-ep" group, then the rows of this rank's experts.
        TS_ASSIGN_OR_RETURN(TensorPtr dg, allocUninitialized(m_exec, int64_t(T) * n * h, MemCategory::CommBuffers));
        expertGroup()->allGather(m_exec.stream(), dout->data(), dg->data(), size_t(T) * h, DType::F32);
        keepUntilPassed(m_exec.stream(), {dout, dg});
        TS_ASSIGN_OR_RETURN(dyin, allocUninitialized(m_exec, int64_t(R) * h));
        m_exec.op("moe.permute_grad", Category::Elementwise, 0, uint64_t(R) * h * 8,
                  [=] { k::gatherRows(fp(dg), s->agTok.ptr, fp(dyin), s->R, h); });
    } else if (dispatched) {
        TS_ASSIGN_OR_RETURN(dyin, moeToExperts(*s, dyp, h));
    }
    if (A.beforeExperts) TS_RETURN_IF_ERROR(A.beforeExperts());  // moe_shared_expert_overlap
    TS_ASSIGN_OR_RETURN(TensorPtr dxin, allocUninitialized(m_exec, int64_t(R) * h));
    TS_ASSIGN_OR_RETURN(TensorPtr deprob, allocUninitialized(m_exec, int64_t(R)));
    std::vector<const float*> W1(static_cast<size_t>(L)), W2(static_cast<size_t>(L));
    std::vector<float*> G1(static_cast<size_t>(L)), G2(static_cast<size_t>(L));
    // add_bias_linear: fc2's bias (its prob-weighted term's gradients) and the biases' grads
    std::vector<const float*> B2(static_cast<size_t>(L), nullptr);
    std::vector<float*> GB1(static_cast<size_t>(L), nullptr), GB2(static_cast<size_t>(L), nullptr);
    // FP8: the output gradients of fc2 and fc1 in FP8 (each expert's grad state; their amax and
    // scale for the single device's magnitudes, as GptModel::fp8Quantize), the dgrads with the
    // weights' FP8 copies, the wgrads with the FP8 inputs saved by the forward.
    const int li = int(&P - m_layers.data());
    const bool fp8 = m_fp8ExpMeta && fp8Layer(li) && s->fc2in;
    for (int l = 0; l < L; ++l) {
        if (!fp8) {  // FP8: the weights' copies below
            W1[size_t(l)] = m_params.modelParam(P.expFc1W[size_t(l)]);
            W2[size_t(l)] = m_params.modelParam(P.expFc2W[size_t(l)]);
        }
        G1[size_t(l)] = m_params.mainGrad(P.expFc1W[size_t(l)]);
        G2[size_t(l)] = m_params.mainGrad(P.expFc2W[size_t(l)]);
        if (!P.expFc1B.empty()) {
            B2[size_t(l)] = m_params.modelParam(P.expFc2B[size_t(l)]);
            GB1[size_t(l)] = m_params.mainGrad(P.expFc1B[size_t(l)]);
            GB2[size_t(l)] = m_params.mainGrad(P.expFc2B[size_t(l)]);
        }
    }
    const Fp8Recipe fr = m_o.fp8;
    const float gradDiv = float(m_ctx.dpSize) * float(m_ctx.cpSize);
    std::vector<Fp8TensorSlots> g1(static_cast<size_t>(L)), g2(static_cast<size_t>(L));
    // Block recipes: the dgrads read each expert's weight copy along `out`, the wgrads quantize
    // the saved high-precision inputs along the tokens; the GEMMs' operands (dY, the experts'
    // da / dact / dfc1 rows) and their quantized copies live in workspaces (bgrad, bwork).
    const bool blk = fp8 && fr.isBlock();
    // [R, F] da, [R, F] dact, [R, F1] dfc1 of every expert at its rows; without FP8 fc2's input
    // act * prob again (scaledWs); FP8 per tensor with fc2's bias: dY before it is quantized in
    // place (fc2's bias term reads it).
    TensorPtr bgrad, bwork, scaledWs, dyBias;
    TS_ASSIGN_OR_RETURN(bgrad, allocUninitialized(m_exec, int64_t(R) * (2 * F + F1), MemCategory::Workspace));
    if (!fp8) { TS_ASSIGN_OR_RETURN(scaledWs, allocUninitialized(m_exec, int64_t(R) * F, MemCategory::Workspace)); }
    if (fp8 && !blk && !P.expFc2B.empty()) {
        TS_ASSIGN_OR_RETURN(dyBias, allocUninitialized(m_exec, int64_t(R) * h, MemCategory::Workspace));
    }
    if (blk) {
        for (int l = 0; l < L; ++l) {
            TS_ASSIGN_OR_RETURN(W1[size_t(l)], fp8BlockWeight(P.expFc1W[size_t(l)], false));
            TS_ASSIGN_OR_RETURN(W2[size_t(l)], fp8BlockWeight(P.expFc2W[size_t(l)], false));
        }
        TS_ASSIGN_OR_RETURN(bwork, allocUninitialized(m_exec, std::max(fp8BlockBackwardWorkElems(R, F, h),
                                                                       fp8BlockBackwardWorkElems(R, h, F1)),
                                                      MemCategory::Workspace));
    } else if (fp8) {
        TS_ASSIGN_OR_RETURN(W1, fp8ExpertWeights(li, kFp8ExpFc1, P.expFc1W));
        TS_ASSIGN_OR_RETURN(W2, fp8ExpertWeights(li, kFp8ExpFc2, P.expFc2W));
        TensorPtr keep;  // tensorwise: the output gradients' amaxes, as the forward's
        if (!fr.delayed) { TS_ASSIGN_OR_RETURN(keep, m_exec.alloc(2 * int64_t(L), MemCategory::Workspace)); }
        for (int l = 0; l < L; ++l) {
            g1[size_t(l)] = fp8ExpertSlots(li, l, kFp8ExpFc1, kFp8Grad);
            g2[size_t(l)] = fp8ExpertSlots(li, l, kFp8ExpFc2, kFp8Grad);
            if (keep) keepAmaxesIn(keep, l, g1[size_t(l)], g2[size_t(l)]);
        }
    }
    const TensorPtr xinT = s->xin, fc1T = s->fc1, actT = s->act;  // as the forward's experts
    const bool fp32 = fp8 && !fp8GemmsBf16();  // FP8 operands the bf16 GEMMs would round
    // Local experts [l0, l1), as the forward's: what every row does once over all their rows, the
    // GEMMs grouped, an expert's own (FP8 scaling state, biases) per expert.
    auto experts = [=](int l0, int l1) {
        k::Fp32GemmScope gemms(fp32);
        const int* off = s->eoff.data();
        const int r0 = off[l0], rows = off[l1] - r0, G = l1 - l0;
        auto each = [&](auto&& f) { kernels::forEachGroupWithRows(off, l0, l1, f); };
        auto quantize = [&](const std::vector<Fp8TensorSlots>& q, float* base, int w) {
            quantizeExperts(fr, q, true, gradDiv, base, w, off, l0, l1);  // the output gradients
        };
        if (rows == 0) {
            if (fp8 && !blk) {
                quantize(g2, nullptr, h);
                quantize(g1, nullptr, F1);
            }
            return;
        }
        const float* ac = fp(actT) + size_t(r0) * F;
        const float* prob = fp(s->eprob) + r0;
        float* dyBase = fp(dyin);  // this backward's own buffer: quantized in place
        float* daBase = fp(bgrad);
        float* dactBase = fp(bgrad) + size_t(R) * F;
        float* dfc1Base = fp(bgrad) + size_t(2 * R) * F;
        float* dy = dyBase + size_t(r0) * h;
        // fc2's bias term b2 * prob: d b2 += sum_r dY_r prob_r, d prob_r += dY_r . b2 (from the
        // unquantized dY, before FP8 quantizes it for the GEMMs).
        const float* dyB = dyBase;
        if (B2[0]) {
            each([&](int l, int e0, int n) {
                k::weightedColumnSum(dyBase + size_t(e0) * h, fp(s->eprob) + e0, GB2[size_t(l)], n, h);
            });
            if (dyBias) {
                k::copyBytes(fp(dyBias) + size_t(r0) * h, dy, size_t(rows) * h * sizeof(float));
                dyB = fp(dyBias);
            }
        }
        const float* scaledBase = nullptr;
        if (blk) {
            fp8BlockExpertsBackward(fr, dyBase, fp(s->fc2in), W2.data(), daBase, G2.data(), off, l0, l1, F, h,
                                    fp(bwork));
        } else if (fp8) {
            scaledBase = fp(s->fc2in);
            quantize(g2, dyBase, h);
        } else {
            float* sc = fp(scaledWs) + size_t(r0) * F;
            k::scaleRows(ac, F, prob, sc, rows, F);
            if (bf) k::roundToBf16(sc, int64_t(rows) * F);
            scaledBase = fp(scaledWs);
        }
        if (!blk)
            k::linearBackwardGrouped(dyBase, scaledBase, W2.data() + l0, daBase, G2.data() + l0, nullptr, off + l0, G,
                                     F, h);
        if (B2[0]) {
            each([&](int l, int e0, int n) {
                k::moeProbGrad(daBase + size_t(e0) * F, fp(actT) + size_t(e0) * F, fp(s->eprob) + e0,
                               dyB + size_t(e0) * h, B2[size_t(l)], dactBase + size_t(e0) * F, fp(deprob) + e0, n,
                               F, h);
            });
        } else {
            k::moeProbGrad(daBase + size_t(r0) * F, ac, prob, nullptr, nullptr, dactBase + size_t(r0) * F,
                           fp(deprob) + r0, rows, F, h);
        }
        const float* f1 = fp(fc1T) + size_t(r0) * F1;
        float* dact = dactBase + size_t(r0) * F;
        float* dfc1 = dfc1Base + size_t(r0) * F1;
        if (swiglu) k::swigluBackward(dact, f1, dfc1, rows, F);
        else k::biasGeluBackward(dact, f1, nullptr, dfc1, nullptr, rows, F);
        if (bf) k::roundToBf16(dfc1, int64_t(rows) * F1);
        // fc1's bias grad: the sum of fc1's output grads (before FP8 quantizes them)
        if (GB1[0])
            each([&](int l, int e0, int n) { k::biasGradAccumulate(dfc1Base + size_t(e0) * F1, GB1[size_t(l)], n, F1); });
        if (blk) {
            fp8BlockExpertsBackward(fr, dfc1Base, fp(xinT), W1.data(), fp(dxin), G1.data(), off, l0, l1, h, F1,
                                    fp(bwork));
            return;
        }
        if (fp8) quantize(g1, dfc1Base, F1);
        k::linearBackwardGrouped(dfc1Base, fp(xinT), W1.data() + l0, fp(dxin), G1.data() + l0, nullptr, off + l0, G, h,
                                 F1);
    };
    const double expertFlops = 4.0 * R * (double(h) * F1 + double(F) * h);
    if (grouped) {
        m_exec.op("experts.grouped_mlp.bwd", Category::Gemm, expertFlops, uint64_t(R) * (h + F1 + F) * 8,
                  [=] { experts(0, L); });
    } else {
        for (int l = L; l-- > 0;)
            m_exec.op("experts.local_expert.bwd", Category::Gemm, expertFlops / L, uint64_t(R) * (h + F1 + F) * 8 / L,
                      [=] { experts(l, l + 1); });
    }
    TensorPtr dxp = dxin, dprob = deprob;  // per permuted row
    TensorPtr dxTok;                       // allgather: the experts' input grads per local token
    if (s->allgather) {
        // Partial dX and dprob of every token of the "etp-ep" group (with ETP also partial over
        // the F/etp columns), summed by reduce-scatter; the probs' gradients go back to the
        // permuted rows they came from.
        const int64_t G = int64_t(T) * n;
        TS_ASSIGN_OR_RETURN(TensorPtr dxPart, m_exec.alloc(G * h, MemCategory::CommBuffers));
        TS_ASSIGN_OR_RETURN(TensorPtr dpPart, m_exec.alloc(G * E, MemCategory::CommBuffers));
        m_exec.op("moe.unpermute_grad", Category::Elementwise, double(R) * h, uint64_t(R) * h * 8, [=] {
            k::gatherSumRows(fp(dxin), s->agStart.ptr, s->agRows.ptr, fp(dxPart), int(G), h);
            k::gatherRows(fp(deprob), s->agDp.ptr, fp(dpPart), int(G * E), 1);
        });
        TS_ASSIGN_OR_RETURN(dxTok, m_exec.alloc(int64_t(T) * h));
        TS_ASSIGN_OR_RETURN(TensorPtr dpTok, m_exec.alloc(int64_t(T) * E));
        expertGroup()->reduceScatter(m_exec.stream(), dxPart->data(), dxTok->data(), size_t(T) * h, DType::F32,
                                     ReduceOp::Sum);
        keepUntilPassed(m_exec.stream(), {dxPart, dxTok});
        expertGroup()->reduceScatter(m_exec.stream(), dpPart->data(), dpTok->data(), size_t(T) * E, DType::F32,
                                     ReduceOp::Sum);
        keepUntilPassed(m_exec.stream(), {dpPart, dpTok});
        TS_ASSIGN_OR_RETURN(dprob, allocUninitialized(m_exec, int64_t(s->rowsAlloc)));
        m_exec.op("moe.prob_grad_rows", Category::Elementwise, 0, uint64_t(s->rowsAlloc) * 8,
                  [=] { k::gatherRows(fp(dpTok), s->planTokExp(), fp(dprob), s->rows, 1); });
    } else if (dispatched) {
        // With ETP the experts' dX and dprob are partial sums over the F/etp columns: summed by
        // the reduce-scatter over "etp" (the backward of the forward's all-gather).
        TS_ASSIGN_OR_RETURN(dxp, moeFromExperts(*s, dxin, h));
        TS_ASSIGN_OR_RETURN(dprob, moeFromExperts(*s, deprob, 1));
    }
    // Router: the gradient of the renormalised top-k probs, the aux loss and the z-loss on the
    // logits, then into W_r and x. The aux/z gradients are scaled like the main loss (1/m).
    const float* Wr = m_params.modelParam(P.routerW);
    float* Gr = m_params.mainGrad(P.routerW);
    float* GrB = P.routerB >= 0 ? m_params.mainGrad(P.routerB) : nullptr;  // add_bias_linear
    const AuxTerms terms(m_cfg);
    const double zCoeff = m_cfg.moe_z_loss_coeff;
    // Scaled like the main loss: 1/m, and x cp with context parallel (Megatron's
    // main_loss_backward_scale; the grads are then averaged over dp-cp). T: the microbatch's tokens
    // (global_aux_loss: those of the tp-dp-cp group).
    // With SP the router weight's grad is summed over TP (its rows' shares add up).
    const int cp = m_ctx.cpSize;
    const double lossScale = double(cp) / double(m_numMicrobatches);
    const double Tg = double(T) * cp * (m_sp ? m_ctx.tpSize : 1), TgGlobal = Tg * m_ctx.dpSize;
    const int mbB = m_d.microBatch;  // tokens are sequence-first: token t is in sequence t % b
    TS_ASSIGN_OR_RETURN(TensorPtr dlDev, allocUninitialized(m_exec, int64_t(T) * E, MemCategory::Workspace));
    // The probs' backward as coefficients per token (the kernel moeRouterProbsCoefficients, from
    // the logits and the choice in the plan), applied to the probs' grads where they are: [T*K] a,
    // b, c, and the softmax over all E when the probs are one.
    const bool fullProbs = moeProbsAreFullSoftmax(s->ro);
    const int64_t TK = int64_t(T) * K;
    TS_ASSIGN_OR_RETURN(TensorPtr coef, allocUninitialized(m_exec, 3 * TK + (fullProbs ? int64_t(T) * E : 0),
                                                           MemCategory::Workspace));
    m_exec.op("router.bwd", Category::Gemm, 4.0 * T * h * E, uint64_t(T) * (2 * h + E) * 4, [=] {
        // On the stream, nothing read back: the aux and z losses' gradient (into dl), then the
        // probs' part from their grads.
        const int G = s->groups;  // the aux loss's token groups (moeRouterAuxBackward's)
        // d aux / d scores = coeff*E/(k*Tg^2)/groups * c_e of each term (Switch loss), summed over
        // the terms, and the z-loss's coeff/Tg * 2 lse softmax: the kernel, from the counts where
        // the forward's collectives left them.
        const auto weight = [&](double coeff, double tokens, int groups) {
            return lossScale * double(E) * coeff / (double(K) * tokens * tokens) / groups;
        };
        const double wGlobal = s->gaSteps > 0 ? weight(terms.global, TgGlobal, 1) / s->gaSteps : 0.0;
        if (!terms.any() && zCoeff == 0) k::setBytes(dlDev->data(), 0, size_t(T) * E * sizeof(float));
        else k::moeRouterAuxBackward(fp(s->logits), s->auxCounts ? fp(s->auxCounts) : nullptr,
                                     s->auxGlobal ? fp(s->auxGlobal) : nullptr, fp(dlDev), T, E, G, mbB,
                                     s->ro.score, weight(terms.aux, Tg, 1), weight(terms.seq, Tg / G, G), wGlobal,
                                     lossScale * zCoeff / Tg * 2.0);
        float* a = fp(coef);
        float* b = a + TK;
        float* c = b + TK;
        float* full = fullProbs ? c + TK : nullptr;
        k::moeRouterProbsCoefficients(fp(s->logits), s->planTopi(), T, E, s->ro.topk(), s->ro.sinkhorn, a, b, c, full);
        k::moeRouterProbsBackward(fp(dprob), s->planRowOf(), s->planTopi(), a, b, c, full, fp(dlDev), T, K, E);
        // dx += dl W_r ; dW_r += dl^T x ; db_r += sum_t dl (fp32 GEMMs: router.fwd)
        {
            k::Bf16GemmScope fp32Router(false);
            k::linearBackward(fp(dlDev), fp(x), Wr, fp(dx), Gr, GrB, T, h, E);
        }
        // experts' input grads, combined per token in permuted order (allgather: already per token)
        if (dxTok) k::addInPlace(fp(dx), fp(dxTok), int64_t(T) * h);
        else k::gatherSumRows(fp(dxp), s->planStart(), s->planInv(), fp(dx), T, h);
        if (bf) k::roundToBf16(fp(dx), int64_t(T) * h);
    });
    return dx;
}

// ---- quantile balancing (router.py TopKRouter.quantile_balancing, moe_utils.py qb_dual_update) ----

// The choice: each token's top-k of logits - qb_beta (qb_beta of the previous steps: it changes only
// at the step end). The quantile: over the microbatch's tokens, so the logits are gathered over
// tp-cp (all_gather_into_tensor over tp_cp_group: rank-major, tp fastest = our tp then cp
// gathers); no full-recompute rerun adds it again (Megatron's no-grad first forward adds nothing).
// Both are kernels on the stream (moeQbDualUpdate): the choice into s.qbChosen for the routing, the
// quantile added to the layer's row of m_qbSumDev (Megatron's qb_beta_accum); the host counts the
// microbatches (qb_beta_count) as it enqueues them. Nothing is read back.
Status GptModel::moeQbForward(MoeSaved& s, int li) {
    const int T = s.T, E = s.E, K = s.k;
    const int tpShare = m_sp ? m_ctx.tpSize : 1, cp = m_ctx.cpSize, n = tpShare * cp;
    const bool update = !m_recomputing;
    RouterState& rs = (*m_router)[size_t(li)];
    if (!m_qbSumDev || rs.qbSlot < 0) return Status::internal("quantile balancing without its quantile sums");
    TensorPtr all = s.logits;
    if (update && n > 1) {
        TensorPtr tpAll = s.logits;
        if (tpShare > 1) {
            TS_ASSIGN_OR_RETURN(tpAll, allocUninitialized(m_exec, int64_t(tpShare) * T * E, MemCategory::CommBuffers));
            m_ctx.tp->allGather(m_exec.stream(), s.logits->data(), tpAll->data(), size_t(T) * E, DType::F32);
        }
        all = tpAll;
        if (cp > 1) {
            TS_ASSIGN_OR_RETURN(all, allocUninitialized(m_exec, int64_t(n) * T * E, MemCategory::CommBuffers));
            m_ctx.cp->allGather(m_exec.stream(), tpAll->data(), all->data(), size_t(tpShare) * T * E, DType::F32);
        }
        keepUntilPassed(m_exec.stream(), {tpAll, all});
    }
    TS_ASSIGN_OR_RETURN(s.qbChosen, allocUninitialized(m_exec, int64_t(T) * K, MemCategory::Workspace));
    TS_ASSIGN_OR_RETURN(TensorPtr beta, allocUninitialized(m_exec, E, MemCategory::Workspace));
    TensorPtr quantile;
    if (update) {
        TS_ASSIGN_OR_RETURN(quantile, allocUninitialized(m_exec, E, MemCategory::Workspace));
        ++rs.qbCount;
    }
    auto router = m_router;
    const TensorPtr logits = s.logits, chosen = s.qbChosen, sums = m_qbSumDev;
    const int64_t at = int64_t(rs.qbSlot) * E;
    m_exec.op("router.qb_dual_update", Category::Elementwise, double(n + 1) * T * E * 4, uint64_t(n + 1) * T * E * 4,
              [=] {
                  // qb_beta as the host holds it when the op runs (the step-end update is an op of
                  // the same stream)
                  k::copyBytes(beta->data(), (*router)[size_t(li)].qbBeta.data(), size_t(E) * sizeof(float));
                  // this rank's rows (the same choice as their rows of the gathered logits), with the
                  // quantiles when no gather came before; else those from the gathered logits
                  const bool own = all == logits;
                  k::moeQbDualUpdate(fp(logits), T, E, K, fp(beta), chosen->as<int32_t>(),
                                     quantile && own ? fp(quantile) : nullptr);
                  if (!quantile) return;
                  if (!own) k::moeQbDualUpdate(fp(all), n * T, E, K, fp(beta), nullptr, fp(quantile));
                  k::addInPlace(fp(sums) + at, fp(quantile), E);
              });
    return Status::ok();
}

// _update_router_qb_beta: each layer's mean quantile over the step's microbatches, averaged over
// the dp-cp ranks, blended into qb_beta and centred; then the sums reset. Megatron averages over
// dp_cp; we sum over tp-dp-cp and divide by its size: the TP ranks of a group hold the same
// quantiles (computed from the same gathered logits), so the mean is the same. Every rank of the
// group runs as many microbatches through the layer, so each rank's sum over its microbatches is
// summed first (one all-reduce of every layer's sums) and divided by the count and the ranks
// after the one read-back of the step.
Status GptModel::moeQbStepEnd() {
    // The quantile-balanced layers in layer order, which is their slots' order (GptModel::create).
    std::vector<int> moe, counts;
    for (int li = 0; li < localLayers(); ++li) {
        RouterState& rs = (*m_router)[size_t(li)];
        if (rs.qbSlot < 0) continue;
        moe.push_back(li);
        counts.push_back(rs.qbCount);
        rs.qbCount = 0;
    }
    if (moe.empty()) return Status::ok();
    if (!m_qbSumDev) return Status::internal("quantile balancing without its quantile sums");
    const int E = m_cfg.num_moe_experts, slots = int(moe.size());
    const TensorPtr sums = m_qbSumDev;
    int ranks = 1;
    if (m_ctx.tpDpCp && m_ctx.tpDpCp->size() > 1) {
        ranks = m_ctx.tpDpCp->size();
        m_ctx.tpDpCp->allReduce(m_exec.stream(), sums->data(), sums->data(), size_t(slots) * E, DType::F32,
                                ReduceOp::Sum);
    }
    auto router = m_router;
    const double ema = m_cfg.moe_router_quantile_balancing_ema;
    const TraceTarget tt = m_exec.device().traceTarget();
    const int layerBegin = m_ctx.layerBegin;
    m_exec.op("moe.qb_beta_update", Category::Elementwise, double(slots) * E * 4, uint64_t(slots) * E * 8, [=] {
        const int64_t ts = monotonicNs();
        std::vector<float> h(size_t(slots) * E), m(static_cast<size_t>(E));
        k::download(h.data(), fp(sums), h.size() * sizeof(float));
        k::setBytes(sums->data(), 0, h.size() * sizeof(float));
        for (size_t i = 0; i < moe.size(); ++i) {
            RouterState& rs = (*router)[size_t(moe[i])];
            const float count = float(std::max(counts[i], 1));
            for (int e = 0; e < E; ++e) m[size_t(e)] = h[i * size_t(E) + size_t(e)] / count / float(ranks);
            moeQbBetaUpdate(rs.qbBeta.data(), m.data(), E, ema);
            expertCounters(tt, ts, layerBegin + moe[i], "qb_beta", rs.qbBeta);
        }
    });
    return Status::ok();
}

nlohmann::json GptModel::qbBetaState() const {
    if (m_cfg.num_moe_experts <= 0 || !(m_cfg.moe_router_load_balancing_type == "quantile_balancing")) return nullptr;
    return routerVectors(&RouterState::qbBeta);
}

Status GptModel::setQbBetaState(const nlohmann::json& state) {
    if (m_cfg.num_moe_experts <= 0 || !(m_cfg.moe_router_load_balancing_type == "quantile_balancing") ||
        state.is_null())
        return Status::ok();
    return setRouterVectors(state, &RouterState::qbBeta, "qb_beta");
}

nlohmann::json GptModel::routerVectors(std::vector<float> RouterState::*member) const {
    nlohmann::json out = nlohmann::json::object();
    for (size_t li = 0; li < m_layers.size(); ++li)
        if (m_layers[li].routerW >= 0) out[std::to_string(m_ctx.layerBegin + int(li))] = (*m_router)[li].*member;
    return out;
}

Status GptModel::setRouterVectors(const nlohmann::json& state, std::vector<float> RouterState::*member,
                                  const std::string& what) {
    if (!state.is_object()) return Status::invalid(what + " must be an object");
    const size_t E = size_t(m_cfg.num_moe_experts);
    for (size_t li = 0; li < m_layers.size(); ++li) {
        if (m_layers[li].routerW < 0) continue;
        const std::string key = std::to_string(m_ctx.layerBegin + int(li));
        auto it = state.find(key);
        if (it == state.end()) continue;
        if (!it->is_array() || it->size() != E)
            return Status::invalid(what + " of layer " + key + " must be a list of num_moe_experts=" + std::to_string(E) +
                                   " numbers");
        std::vector<float> b(E);
        for (size_t e = 0; e < E; ++e) {
            if (!(*it)[e].is_number() || !std::isfinite((*it)[e].get<double>()))
                return Status::invalid(what + " of layer " + key + " has a non-finite entry");
            b[e] = (*it)[e].get<float>();
        }
        (*m_router)[li].*member = std::move(b);
    }
    return Status::ok();
}

// ---- the router's counters ------------------------------------------------------------------

void GptModel::graphCaptured() {
    m_graphRouterStats = std::move(m_pendingRouterStats);
    m_pendingRouterStats.clear();
}

Status GptModel::graphLaunched() {
    const int64_t ts = monotonicNs();
    for (const auto& st : m_graphRouterStats) {
        auto again = std::make_shared<RouterStats>(*st);  // the same buffers, which the launch rewrote
        again->ts = ts;
        m_pendingRouterStats.push_back(std::move(again));
    }
    return flushRouterStats();  // read on the stream after the launch, as an eager step's end does
}

void GptModel::graphReleased() { m_graphRouterStats.clear(); }

// The counts of every microbatch since the last flush gathered into one buffer on the stream and
// read back once (the op's only wait), then each microbatch's counters: aux_loss / z_loss of this
// rank's share of the microbatch x tp x cp (so that their mean over those ranks is the
// microbatch's losses), each aux term alone under Megatron's metric name, the tokens per expert
// and the dropped copies.
Status GptModel::flushRouterStats() {
    if (m_pendingRouterStats.empty()) return Status::ok();
    auto pending = std::make_shared<std::vector<std::shared_ptr<RouterStats>>>(std::move(m_pendingRouterStats));
    m_pendingRouterStats.clear();
    int64_t total = 0;
    // Each forward's counts, global counts and statistics, where it has them.
    const auto sizes = [](const RouterStats& st) {
        return std::array<int64_t, 3>{st.counts ? int64_t(st.G) * st.E : 0, st.global ? int64_t(st.E) : 0,
                                      st.stats ? int64_t(st.G) * st.E + 1 + (st.routedInStats ? st.E : 0) : 0};
    };
    for (const auto& st : *pending)
        for (int64_t n : sizes(*st)) total += n;
    const TraceTarget tt = m_exec.device().traceTarget();
    if (!tt.recorder) return Status::ok();  // the trace went away: nobody to tell, nothing to read
    TensorPtr all;
    if (total > 0) {
        TS_ASSIGN_OR_RETURN(all, m_exec.alloc(total, MemCategory::Workspace));
    }
    const AuxTerms terms(m_cfg);
    const double zCoeff = m_cfg.moe_z_loss_coeff;
    m_exec.op("moe.router_stats_read", Category::Other, 0, uint64_t(total) * 4, [=] {
        std::vector<float> host(static_cast<size_t>(total));
        if (total > 0) {
            int64_t off = 0;
            for (const auto& st : *pending) {
                const auto n = sizes(*st);
                const TensorPtr parts[3] = {st->counts, st->global, st->stats};
                for (int i = 0; i < 3; ++i)
                    if (parts[i]) {
                        k::copyBytes(fp(all) + off, fp(parts[i]), size_t(n[size_t(i)]) * sizeof(float));
                        off += n[size_t(i)];
                    }
            }
            k::download(host.data(), fp(all), host.size() * sizeof(float));
        }
        int64_t off = 0;
        for (const auto& stp : *pending) {
            const RouterStats& st = *stp;
            const int E = st.E, G = st.G;
            const float* counts = st.counts ? host.data() + off : nullptr;
            if (counts) off += int64_t(G) * E;
            const float* global = st.global ? host.data() + off : nullptr;
            if (global) off += E;
            const float* stats = st.stats ? host.data() + off : nullptr;
            if (stats) off += int64_t(G) * E + 1;
            std::vector<int> routed = st.routed;
            int dropped = st.dropped;
            if (stats && st.routedInStats) {  // the plan's routed words, after the statistics
                routed.resize(size_t(E));
                std::memcpy(routed.data(), stats + size_t(G) * E + 1, size_t(E) * sizeof(int32_t));
                off += E;
                dropped = 0;
                for (int e = 0; e < E; ++e) dropped += std::max(0, routed[size_t(e)] - st.capacity);
            }
            // A forward whose stats op never ran (its stream failed) has nothing to say.
            if (!stats || routed.size() != size_t(E)) continue;
            const std::vector<double> probSum(stats, stats + size_t(G) * E);
            const double zSum = stats[size_t(G) * E];
            // per expert over the groups: aux_loss's statistics (and global_aux_loss's probs)
            std::vector<double> probs1(static_cast<size_t>(E), 0.0), counts1(static_cast<size_t>(E), 0.0);
            std::vector<double> countsAll(static_cast<size_t>(G) * E, 0.0), countsGlobal(static_cast<size_t>(E), 0.0);
            for (int g = 0; g < G; ++g)
                for (int e = 0; e < E; ++e) {
                    const size_t i = size_t(g) * E + size_t(e);
                    probs1[size_t(e)] += probSum[i];
                    if (counts) counts1[size_t(e)] += (countsAll[i] = counts[i]);
                }
            if (global)
                for (int e = 0; e < E; ++e) countsGlobal[size_t(e)] = double(global[e]) / std::max(1, st.gaSteps);
            // tokens of the microbatch (global_aux_loss: of the tp-dp-cp group's microbatches)
            const double Tg = double(st.T) * st.share;
            const std::string base = "moe.layer" + std::to_string(st.gl) + ".";
            // Each term of this rank's share, and alone without its coefficient under Megatron's
            // metric name (attach_and_log_load_balancing_loss logs aux_loss / coeff); aux_loss: their sum.
            double aux = 0;
            auto term = [&](const char* name, double value, double coeff) {
                aux += value;
                tt.recorder->counter({tt.rank, tt.recorder->intern(base + name), st.ts, value / coeff});
            };
            if (terms.aux != 0)
                term("load_balancing_loss",
                     switchAuxLoss(probs1.data(), counts1.data(), 1, E, st.K, Tg, terms.aux) * st.share, terms.aux);
            if (terms.seq != 0)
                term("seq_load_balancing_loss",
                     switchAuxLoss(probSum.data(), countsAll.data(), G, E, st.K, Tg / G, terms.seq) * st.share,
                     terms.seq);
            if (terms.global != 0)
                term("global_load_balancing_loss",
                     switchAuxLoss(probs1.data(), countsGlobal.data(), 1, E, st.K, Tg * st.dpSize, terms.global) *
                         st.share * st.dpSize,
                     terms.global);
            tt.recorder->counter({tt.rank, tt.recorder->intern(base + "aux_loss"), st.ts, aux});
            tt.recorder->counter(
                {tt.rank, tt.recorder->intern(base + "z_loss"), st.ts, zCoeff * zSum / Tg * st.share});
            for (int e = 0; e < E; ++e)
                tt.recorder->counter({tt.rank, tt.recorder->intern(base + "tokens.expert" + std::to_string(e)), st.ts,
                                      double(routed[size_t(e)])});
            if (st.cap)
                tt.recorder->counter({tt.rank, tt.recorder->intern(base + "dropped_tokens"), st.ts, double(dropped)});
        }
    });
    return Status::ok();
}

// ---- router state: the expert bias and the global aux loss's counts -----------------------

Status GptModel::moeStepEnd() {
    const bool bias = m_cfg.num_moe_experts > 0 && m_cfg.moe_router_enable_expert_bias;
    const bool globalAux = m_cfg.num_moe_experts > 0 && moeAuxLossCoeff(m_cfg, "global_aux_loss") != 0;
    if (m_cfg.num_moe_experts > 0 && m_cfg.moe_router_load_balancing_type == "quantile_balancing")
        TS_RETURN_IF_ERROR(moeQbStepEnd());
    // (not while the step is captured into a graph: read after each launch, graphLaunched)
    if (!isCapturing(m_exec.stream())) TS_RETURN_IF_ERROR(flushRouterStats());
    auto router = m_router;
    if (globalAux)
        for (RouterState& rs : *router) {  // the next step's sums start afresh (enqueue-time state)
            rs.globalSum.reset();
            rs.gaSteps = 0;
        }
    if (!bias) return Status::ok();
    std::vector<int> moe;
    for (int li = 0; li < localLayers(); ++li)
        if (m_layers[size_t(li)].routerW >= 0) moe.push_back(li);
    if (moe.empty()) return Status::ok();  // hybrid models: a chunk without MoE layers
    const int E = m_cfg.num_moe_experts, n = int(moe.size());
    TS_ASSIGN_OR_RETURN(TensorPtr counts, allocUninitialized(m_exec, int64_t(n) * E, MemCategory::CommBuffers));
    m_exec.op("moe.expert_bias_counts", Category::Elementwise, 0, uint64_t(n) * E * 4, [=] {
        std::vector<float> c(size_t(n) * E);
        for (int i = 0; i < n; ++i)
            for (int e = 0; e < E; ++e) c[size_t(i) * E + e] = float((*router)[size_t(moe[size_t(i)])].localTokens[size_t(e)]);
        k::copyBytes(counts->data(), c.data(), c.size() * sizeof(float));
    });
    // Counts summed over tp-dp-cp (get_updated_expert_bias' all-reduce): every rank of the group
    // holding these layers computes the same bias.
    if (m_ctx.tpDpCp && m_ctx.tpDpCp->size() > 1)
        m_ctx.tpDpCp->allReduce(m_exec.stream(), counts->data(), counts->data(), size_t(n) * E, DType::F32,
                                ReduceOp::Sum);
    keepUntilPassed(m_exec.stream(), {counts});
    const float rate = float(m_cfg.moe_router_bias_update_rate);
    const TraceTarget tt = m_exec.device().traceTarget();
    const int layerBegin = m_ctx.layerBegin;
    m_exec.op("moe.expert_bias_update", Category::Elementwise, double(n) * E, uint64_t(n) * E * 8, [=] {
        const int64_t ts = monotonicNs();
        std::vector<float> all(size_t(n) * E);
        k::download(all.data(), fp(counts), all.size() * sizeof(float));
        for (int i = 0; i < n; ++i) {
            RouterState& rs = (*router)[size_t(moe[size_t(i)])];
            const float* c = all.data() + size_t(i) * E;
            float total = 0;
            for (int e = 0; e < E; ++e) total += c[e];
            const float mean = total / float(E);
            for (int e = 0; e < E; ++e) {
                const float off = mean - c[e];
                const float sign = off > 0 ? 1.f : off < 0 ? -1.f : 0.f;
                rs.expertBias[size_t(e)] += sign * rate;
                rs.localTokens[size_t(e)] = 0;
            }
            expertCounters(tt, ts, layerBegin + moe[size_t(i)], "expert_bias", rs.expertBias);
        }
    });
    return Status::ok();
}

nlohmann::json GptModel::routerState() const {
    if (m_cfg.num_moe_experts <= 0 || !m_cfg.moe_router_enable_expert_bias) return nullptr;
    return routerVectors(&RouterState::expertBias);
}

Status GptModel::setRouterState(const nlohmann::json& state) {
    if (m_cfg.num_moe_experts <= 0 || !m_cfg.moe_router_enable_expert_bias || state.is_null()) return Status::ok();
    return setRouterVectors(state, &RouterState::expertBias, "the expert bias");
}

// ---- expert parallel / expert tensor parallel dispatch (alltoall) ------------------------

Communicator* GptModel::expertGroup() const { return m_ctx.etpSize > 1 ? m_ctx.etpEp : m_ctx.ep; }

// Megatron's MoEAlltoAllTokenDispatcher.preprocess: the tokens per expert of every rank of the
// "etp-ep" group, [etp][ep][E] (group rank etp + ETP*ep), give the all-to-all splits over "ep",
// the rows each "etp" rank received (output_splits_tp) and the rows per local expert.
Status GptModel::moeDispatchPlan(MoeSaved& s) {
    const int E = s.E, ep = m_ctx.epSize, L = E / ep, me = m_ctx.epRank;
    const int etp = m_ctx.etpSize, myT = m_ctx.etpRank, n = etp * ep;
    // Every rank's experts' row offsets (the plan's [E+1], where the routing left them), at a
    // capacity with each expert's copies before dropping after them (the plan's next [E]),
    // gathered: the host learns its own with the others', in the one wait.
    const int words = s.ro.cap >= 0 ? 2 * E + 1 : E + 1;
    TS_ASSIGN_OR_RETURN(TensorPtr all, allocUninitialized(m_exec, int64_t(words) * n, MemCategory::CommBuffers));
    expertGroup()->allGather(m_exec.stream(), s.planOffset(), all->data(), size_t(words), DType::I32);
    keepUntilPassed(m_exec.stream(), {s.plan, all});
    // The splits of the all-to-all are data-dependent: wait for them (Megatron's D2H sync).
    std::vector<int32_t> allHost(size_t(words) * size_t(n));
    TS_RETURN_IF_ERROR(k::copyToHost(m_exec.stream(), allHost.data(), all->data(), allHost.size() * sizeof(int32_t),
                                     "moe.dispatch_counts"));
    const int32_t* o = allHost.data();
    // This rank's block: group rank etp + ETP*ep, as the counts below read the group's blocks.
    const int own = myT + etp * me;
    if (expertGroup()->rank() != own)
        return Status::internal("moeDispatchPlan: the etp-ep group's ranks are not ordered etp + ETP*ep");
    if (s.offset.empty()) {  // the router left the offsets to this gather (offsetsFromDispatch)
        const int32_t* mine = o + size_t(own) * size_t(words);
        if (s.ro.cap >= 0) s.routed.assign(mine + E + 1, mine + 2 * E + 1);
        s.takeOffsets(mine);
    }
    // copies that rank (etp t, ep i) routed to expert e
    auto cnt = [&](int t, int i, int e) {
        const int32_t* oi = o + size_t(t + etp * i) * size_t(words);
        return int(oi[e + 1] - oi[e]);
    };
    s.sendRows.assign(size_t(ep), 0);
    s.recvRows.assign(size_t(ep), 0);
    s.etpRows.assign(size_t(etp), 0);
    for (int j = 0; j < ep; ++j)
        for (int l = 0; l < L; ++l) {
            s.sendRows[size_t(j)] += cnt(myT, me, j * L + l);
            s.recvRows[size_t(j)] += cnt(myT, j, me * L + l);
            for (int t = 0; t < etp; ++t) s.etpRows[size_t(t)] += cnt(t, j, me * L + l);
        }
    s.ownRows = s.etpRows[size_t(myT)];
    s.etpPad = etp > 1 ? *std::max_element(s.etpRows.begin(), s.etpRows.end()) : s.ownRows;
    // Arrival order: etp rank t's block (at t*etpPad), in it ep rank i's rows for local expert
    // 0, 1, ... (its permuted rows are expert-major). Expert-grouped order (Megatron's
    // sort_chunks_by_idxs): expert l's rows from (etp 0, ep 0), (etp 0, ep 1), ..., (etp 1, ep 0), ...
    s.eoff.assign(size_t(L) + 1, 0);
    for (int l = 0; l < L; ++l) {
        int rows = 0;
        for (int t = 0; t < etp; ++t)
            for (int i = 0; i < ep; ++i) rows += cnt(t, i, me * L + l);
        s.eoff[size_t(l) + 1] = s.eoff[size_t(l)] + rows;
    }
    s.R = s.eoff[size_t(L)];
    s.arrivePos.assign(size_t(s.R), 0);
    s.expPos.assign(size_t(s.R), 0);
    std::vector<int> fill(s.eoff.begin(), s.eoff.end() - 1);
    int r = 0;
    for (int t = 0; t < etp; ++t) {
        int pos = t * s.etpPad;
        for (int i = 0; i < ep; ++i)
            for (int l = 0; l < L; ++l)
                for (int k = 0; k < cnt(t, i, me * L + l); ++k) {
                    s.arrivePos[size_t(r)] = pos++;
                    s.expPos[size_t(r++)] = fill[size_t(l)]++;
                }
    }
    // the gathers both ways: grouped[expPos[r]] = arrived[arrivePos[r]]
    auto toIdx = std::make_shared<std::vector<int32_t>>(size_t(s.R), 0);
    auto fromIdx = std::make_shared<std::vector<int32_t>>(size_t(etp) * size_t(s.etpPad), -1);
    for (int i = 0; i < s.R; ++i) {
        (*toIdx)[size_t(s.expPos[size_t(i)])] = s.arrivePos[size_t(i)];
        (*fromIdx)[size_t(s.arrivePos[size_t(i)])] = s.expPos[size_t(i)];
    }
    TS_ASSIGN_OR_RETURN(s.toExperts, kernelInts(m_exec, toIdx->data(), toIdx->size(), toIdx, MemCategory::Workspace));
    TS_ASSIGN_OR_RETURN(s.fromExperts,
                        kernelInts(m_exec, fromIdx->data(), fromIdx->size(), fromIdx, MemCategory::Workspace));
    return Status::ok();
}

// rows [T*k, width] in permuted order -> the all-to-all over "ep" (this rank's rows of its
// local experts, from every EP rank) -> with ETP the all-gather over "etp" of those of every etp
// rank (padded to etpPad rows each) -> [R, width] grouped by local expert.
Result<TensorPtr> GptModel::moeToExperts(const MoeSaved& s, const TensorPtr& rows, int width) {
    const int ep = m_ctx.epSize, etp = m_ctx.etpSize, R = s.R;
    TensorPtr arrived = rows;  // ep 1: this rank's permuted rows are its own experts' rows
    if (ep > 1) {
        std::vector<size_t> sendCounts(static_cast<size_t>(ep)), recvCounts(static_cast<size_t>(ep));
        for (int j = 0; j < ep; ++j) {
            sendCounts[size_t(j)] = size_t(s.sendRows[size_t(j)]) * size_t(width);
            recvCounts[size_t(j)] = size_t(s.recvRows[size_t(j)]) * size_t(width);
        }
        TS_ASSIGN_OR_RETURN(arrived, m_exec.alloc(int64_t(s.etpPad) * width, MemCategory::CommBuffers));
        m_ctx.ep->allToAllv(m_exec.stream(), rows->data(), sendCounts, arrived->data(), recvCounts, DType::F32);
        keepUntilPassed(m_exec.stream(), {rows, arrived});
    }
    if (etp > 1) {
        // Megatron gathers the variable splits output_splits_tp; here every block is padded to
        // the largest, so the collective is a plain all-gather of etpPad rows per rank.
        TensorPtr send = arrived;
        if (ep == 1) {
            TS_ASSIGN_OR_RETURN(send, m_exec.alloc(int64_t(s.etpPad) * width, MemCategory::CommBuffers));
            const int own = s.ownRows;
            TensorPtr src = rows, dst = send;
            m_exec.op("moe.pad_etp_rows", Category::Memcpy, 0, uint64_t(own) * width * 8,
                      [=] { k::copyBytes(fp(dst), fp(src), size_t(own) * size_t(width) * sizeof(float)); });
        }
        TS_ASSIGN_OR_RETURN(TensorPtr gathered,
                            allocUninitialized(m_exec, int64_t(etp) * s.etpPad * width, MemCategory::CommBuffers));
        m_ctx.etp->allGather(m_exec.stream(), send->data(), gathered->data(), size_t(s.etpPad) * size_t(width),
                             DType::F32);
        keepUntilPassed(m_exec.stream(), {send, gathered});
        arrived = gathered;
    }
    TS_ASSIGN_OR_RETURN(TensorPtr grouped, allocUninitialized(m_exec, int64_t(R) * width));
    const KernelIds idx = s.toExperts;
    m_exec.op("moe.sort_by_local_expert", Category::Memcpy, 0, uint64_t(R) * width * 8,
              [=] { k::gatherRows(fp(arrived), idx.ptr, fp(grouped), R, width); });
    return grouped;
}

// The reverse of moeToExperts, summing: [R, width] grouped by local expert -> arrival order ->
// with ETP the reduce-scatter over "etp" (the partial sums of the F/etp columns of every etp
// rank, each rank keeping its own rows) -> the all-to-all back over "ep" -> [T*k, width] in
// permuted order.
Result<TensorPtr> GptModel::moeFromExperts(const MoeSaved& s, const TensorPtr& grouped, int width) {
    const int ep = m_ctx.epSize, etp = m_ctx.etpSize, R = s.R;
    const int64_t rowsBack = s.rowsAlloc;
    const int64_t arrivalRows = int64_t(etp) * s.etpPad;
    // Every row is written; ETP's padding rows (they are summed) as zeros.
    TS_ASSIGN_OR_RETURN(TensorPtr arrivalOrder,
                        allocUninitialized(m_exec, arrivalRows * width, MemCategory::CommBuffers));
    const KernelIds idx = s.fromExperts;
    m_exec.op("moe.restore_source_order", Category::Memcpy, 0, uint64_t(R) * width * 8,
              [=] { k::gatherRows(fp(grouped), idx.ptr, fp(arrivalOrder), int(arrivalRows), width); });
    TensorPtr own = arrivalOrder;  // [ownRows (etpPad with ETP), width]
    if (etp > 1) {
        TS_ASSIGN_OR_RETURN(own, allocUninitialized(m_exec, int64_t(s.etpPad) * width, MemCategory::CommBuffers));
        m_ctx.etp->reduceScatter(m_exec.stream(), arrivalOrder->data(), own->data(), size_t(s.etpPad) * size_t(width),
                                 DType::F32, ReduceOp::Sum);
        keepUntilPassed(m_exec.stream(), {arrivalOrder, own});
    }
    TS_ASSIGN_OR_RETURN(TensorPtr back, allocUninitialized(m_exec, rowsBack * width));
    if (ep > 1) {
        std::vector<size_t> sendCounts(static_cast<size_t>(ep)), recvCounts(static_cast<size_t>(ep));
        for (int j = 0; j < ep; ++j) {
            sendCounts[size_t(j)] = size_t(s.recvRows[size_t(j)]) * size_t(width);
            recvCounts[size_t(j)] = size_t(s.sendRows[size_t(j)]) * size_t(width);
        }
        m_ctx.ep->allToAllv(m_exec.stream(), own->data(), sendCounts, back->data(), recvCounts, DType::F32);
        keepUntilPassed(m_exec.stream(), {own, back});
    } else {
        const int rows = s.ownRows;
        m_exec.op("moe.unpad_etp_rows", Category::Memcpy, 0, uint64_t(rows) * width * 8,
                  [=] { k::copyBytes(fp(back), fp(own), size_t(rows) * size_t(width) * sizeof(float)); });
    }
    return back;
}

// Megatron's MoEAllGatherTokenDispatcher: every rank of the "etp-ep" group (its tp_ep_group;
// "ep" with ETP 1) gets every token of the group and the routing of it, and computes its own
// experts' rows (with ETP, its F/etp columns of them); the outputs are summed back by
// reduce-scatter over the same group. The host waits for the routing to build the rows.
Status GptModel::moeAllGatherDispatch(MoeSaved& s, const TensorPtr& x) {
    const int T = s.T, E = s.E, ep = m_ctx.epSize, L = E / ep, me = m_ctx.epRank, h = m_d.hidden;
    const int n = ep * m_ctx.etpSize;
    Communicator* group = expertGroup();
    // This rank's kept copies as Megatron's routing_map and probs, dense [T, E] each (the map
    // separately: a padding row has prob 0 but is routed), gathered over the group with the tokens.
    const int64_t TE = int64_t(T) * E;
    TS_ASSIGN_OR_RETURN(TensorPtr route, m_exec.alloc(2 * TE, MemCategory::CommBuffers));
    MoeSaved* sp = &s;
    m_exec.op("moe.routing_map", Category::Elementwise, 0, uint64_t(TE) * 8,
              [=] { k::moeRoutingMap(sp->planTokExp(), fp(sp->probT), sp->rows, TE, fp(route)); });
    TS_ASSIGN_OR_RETURN(TensorPtr routeAll, allocUninitialized(m_exec, 2 * TE * n, MemCategory::CommBuffers));
    group->allGather(m_exec.stream(), route->data(), routeAll->data(), size_t(2 * TE), DType::F32);
    keepUntilPassed(m_exec.stream(), {route, routeAll});
    TS_ASSIGN_OR_RETURN(TensorPtr xg, allocUninitialized(m_exec, int64_t(T) * n * h, MemCategory::CommBuffers));
    group->allGather(m_exec.stream(), x->data(), xg->data(), size_t(T) * h, DType::F32);
    keepUntilPassed(m_exec.stream(), {x, xg});
    // The rows depend on the routing: wait for it (as Megatron's dispatcher syncs for its sizes).
    TS_ASSIGN_OR_RETURN(const std::vector<float> allHost,
                        k::toHost(m_exec.stream(), fp(routeAll), 2 * TE * n, "moe.allgather_routing"));
    const float* all = allHost.data();  // [etp-ep rank][map, probs][T][E]
    if (s.offset.empty()) {  // the router left the offsets to this gather: this rank's from its own map
        const float* map = all + size_t(group->rank()) * size_t(2 * TE);
        std::vector<int32_t> o(size_t(E) + 1, 0);
        for (int e = 0; e < E; ++e) {
            int rows = 0;
            for (int t = 0; t < T; ++t) rows += map[size_t(t) * E + size_t(e)] != 0.f;
            o[size_t(e) + 1] = o[size_t(e)] + rows;
        }
        s.takeOffsets(o.data());
    }
    s.eoff.assign(size_t(L) + 1, 0);
    s.agToken.clear();
    s.agExpert.clear();
    std::vector<float> probs;
    for (int l = 0; l < L; ++l) {
        const int e = me * L + l;
        for (int g = 0; g < T * n; ++g) {
            const size_t at = size_t(g / T) * size_t(2 * TE) + size_t(g % T) * E + size_t(e);
            if (all[at] == 0.f) continue;
            s.agToken.push_back(g);
            s.agExpert.push_back(e);
            probs.push_back(all[at + size_t(TE)]);
        }
        s.eoff[size_t(l) + 1] = int(s.agToken.size());
    }
    s.R = int(s.agToken.size());
    const int R = s.R;
    // The gather indexes: the rows' tokens; per token of the group its rows (the combine);
    // per (token, expert) of the group its row or -1 (the probs' grads).
    const int64_t Tn = int64_t(T) * n;
    auto tok = std::make_shared<std::vector<int32_t>>(s.agToken.begin(), s.agToken.end());
    auto start = std::make_shared<std::vector<int32_t>>(size_t(Tn) + 1, 0);
    auto rowsOf = std::make_shared<std::vector<int32_t>>(size_t(R), 0);
    auto dp = std::make_shared<std::vector<int32_t>>(size_t(Tn) * E, -1);
    for (int r = 0; r < R; ++r) {
        ++(*start)[size_t(s.agToken[size_t(r)]) + 1];
        (*dp)[size_t(s.agToken[size_t(r)]) * E + size_t(s.agExpert[size_t(r)])] = r;
    }
    for (int64_t g = 0; g < Tn; ++g) (*start)[size_t(g) + 1] += (*start)[size_t(g)];
    std::vector<int32_t> cursor(start->begin(), start->end() - 1);
    for (int r = 0; r < R; ++r) (*rowsOf)[size_t(cursor[size_t(s.agToken[size_t(r)])]++)] = r;
    TS_ASSIGN_OR_RETURN(s.agTok, kernelInts(m_exec, tok->data(), tok->size(), tok, MemCategory::Workspace));
    TS_ASSIGN_OR_RETURN(s.agStart, kernelInts(m_exec, start->data(), start->size(), start, MemCategory::Workspace));
    TS_ASSIGN_OR_RETURN(s.agRows, kernelInts(m_exec, rowsOf->data(), rowsOf->size(), rowsOf, MemCategory::Workspace));
    TS_ASSIGN_OR_RETURN(s.agDp, kernelInts(m_exec, dp->data(), dp->size(), dp, MemCategory::Workspace));
    TS_ASSIGN_OR_RETURN(s.xin, allocUninitialized(m_exec, int64_t(R) * h));
    TS_ASSIGN_OR_RETURN(s.eprob, allocUninitialized(m_exec, int64_t(R)));
    auto p = std::make_shared<std::vector<float>>(std::move(probs));
    TensorPtr xin = s.xin, eprob = s.eprob;
    const KernelIds agTok = s.agTok;
    m_exec.op("moe.permute", Category::Memcpy, 0, uint64_t(R) * h * 8, [=] {
        k::gatherRows(fp(xg), agTok.ptr, fp(xin), R, h);
        k::copyBytes(fp(eprob), p->data(), size_t(R) * sizeof(float));
    });
    return Status::ok();
}

}  // namespace ts::engine
