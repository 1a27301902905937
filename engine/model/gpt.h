// GptModel: a Megatron-style GPT decoder chunk with explicit forward/backward per layer
// (no autograd, as in llm.c). One instance holds the layers [layerBegin, layerEnd) of one
// rank (pp stage / virtual chunk); the first stage holds the embedding, the last the final
// norm, output layer and loss. Forward and backward are per microbatch and keep the saved
// activations per microbatch, so several microbatches can be in flight (1F1B).
//
// Every kernel is enqueued on the rank's compute stream (Exec); forward()/backward() return
// as soon as the work is enqueued. Losses are readable after Exec::synchronize().
//
// Layouts: activations are sequence-first [s, b, h] flattened to [T, h], T = s*b.
// Sequence parallel (ctx.sequenceParallel, tp > 1; REFERENCE.md §2.3-2.5): in the SP regions
// (norms, dropout, residual adds, stage inputs/outputs) each TP rank holds only its s-shard
// [s/t, b, h] = rows [r*T/t, (r+1)*T/t) of [T, h]; an all-gather along s runs before each
// column-parallel GEMM (QKV, fc1, output layer), a reduce-scatter after each row-parallel one
// (proj, fc2) and after the embedding lookup. Backward re-gathers the saved local GEMM input
// for the wgrad and reduce-scatters the dgrad. Norm weights/biases and the row-parallel
// biases (ParamInfo.sequenceParallel) only see s/t tokens: their grads are summed over TP
// in the last backward of the step, before the grad-ready hook hands them to DP.
// tp_comm_overlap (setTpCommOverlap, engine/model/tp_overlap.h): the SP collectives of the four
// TP linears move to the rank's TP comm stream, split into chunks pipelined with the chunk
// GEMMs (TE userbuffers semantics); the same math, the GEMMs split by rows.
// Loss (REFERENCE.md §1.1): microbatch loss = sum(mask * token_loss) / num_tokens /
// num_microbatches, i.e. the gradient seed of each token is mask / (num_tokens * m).
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model/layers.h"
#include "engine/model/model.h"
#include "engine/model/param_buffer.h"
#include "engine/model/cp_ring.h"
#include "engine/model/tp_overlap.h"

namespace ts::engine {

// One microbatch of data, sequence-first: index t = s_idx * b + b_idx.
struct Microbatch {
    std::vector<int32_t> tokens;  // [s*b]
    std::vector<int32_t> labels;  // [s*b] (next tokens)
    std::vector<float> lossMask;  // [s*b] or empty (= all ones)
    // Context parallel: the loss-mask sum of the whole microbatch (all CP ranks), which the loss
    // is divided by; 0 = this microbatch's own sum.
    double tokensTotal = 0;
};

struct MlpOpNames;  // gpt_mlp.cpp: the op names of one kind of MLP

class GptModel {
public:
    struct LayerParams {
        int ln1w = -1, ln1b = -1, qkvW = -1, qkvB = -1, projW = -1, projB = -1;
        int ln2w = -1, ln2b = -1, fc1W = -1, fc1B = -1, fc2W = -1, fc2B = -1;
        // MoE layer (gpt_moe.cpp): the router and the experts' linears instead of fc1/fc2;
        // with add_bias_linear the router's bias [E] and each expert's fc1 / fc2 biases.
        int routerW = -1, routerB = -1;
        std::vector<int> expFc1W, expFc2W, expFc1B, expFc2B;
        // Shared experts of an MoE layer (moe_shared_expert_intermediate_size > 0; Megatron's
        // mlp.shared_experts): fc1 column parallel, fc2 row parallel, the optional gate [1, h].
        int shFc1W = -1, shFc2W = -1, shGateW = -1;
    };

    // Builds the model (params registered and allocated, zero) for `ctx`.
    // `place` (optional) decides where the registered params go before their memory is allocated
    // (the data-parallel engine's layout, ParamPlacement).
    using PlaceParams = std::function<Result<ParamPlacement>(const std::vector<ParamInfo>&)>;
    static Result<std::unique_ptr<GptModel>> create(const Config& cfg, Device& dev, Stream& compute,
                                                     const ParallelContext& ctx = {}, const PlaceParams& place = {});
    ~GptModel();

    const ModelDims& dims() const { return m_d; }
    const ModelOptions& options() const { return m_o; }
    ModelOptions& options() { return m_o; }
    const ParallelContext& context() const { return m_ctx; }
    ParamBuffer& params() { return m_params; }
    Exec& exec() { return m_exec; }
    int localLayers() const { return int(m_layers.size()); }
    bool sequenceParallel() const { return m_sp; }
    // Rows of the residual stream this rank holds: T = s*b, or T/t with sequence parallel.
    int localTokens() const;
    // Elements of a pipeline stage's input/output activation (and its gradient): [s(/t), b, h].
    int64_t stageTensorElems() const { return int64_t(localTokens()) * m_d.hidden; }

    // Deterministic init from options().seed: normal(0, init_method_std) for weights,
    // std/sqrt(2*num_layers) for linear_proj and linear_fc2 (Megatron's scaled init), zero
    // biases (the MoE router's bias is drawn like a weight, as Megatron's Router), unit norm weights. Each full tensor is generated from (seed, name) and sharded,
    // so tp>1 ranks hold exactly the slices of the tp=1 tensors. Runs on the host (sync first).
    Status initWeights();
    // The ids kernels read (gpt_internal.h KernelIds): `host` itself, kept alive by `data`, on the
    // CPU backend; where kernels see device memory, a buffer filled by an upload op on the compute
    // stream.
    Result<KernelIds> kernelIds(std::shared_ptr<const Microbatch> data, const std::vector<int32_t>& host);

    // Sets step / number of microbatches for the coming forward/backward calls (dropout seeds,
    // loss scale, trace annotations).
    void beginStep(int step, int numMicrobatches);

    // Static inputs (CUDA graphs, cuda_graph_impl: full_iteration): checks microbatch mb's data and
    // enqueues the upload of its token ids, labels and loss seed into buffers that keep their
    // addresses from step to step; forward(mb, data) with the same data then reads those instead
    // of uploading inside the forward, and the loss goes to a buffer of the same kind. A graph
    // captured over the forward and backward so reads each step's data when launched after the
    // step's stageInputs. Marks mb's loss as pending (microbatchLoss), since a launched graph runs
    // no host code.
    Status stageInputs(int mb, std::shared_ptr<const Microbatch> data);
    // CUDA graphs: what of the captured step's host-side work each launch must redo, since a
    // launch runs no host code: the MoE router's counter entries (their buffers are the graph's;
    // a captured step's end does not read them), which graphCaptured keeps after the capture and
    // graphLaunched, called after each launch, queues again and reads on the stream behind it, as
    // an eager step's end does; graphReleased forgets them.
    void graphCaptured();
    Status graphLaunched();
    void graphReleased();

    // Enqueues the forward of microbatch `mb`. First stage reads data->tokens, other stages
    // `input` [T, h]; the last stage computes the loss (and, with the fused cross entropy, its
    // logits gradient already), other stages copy their output into `output` [T, h].
    Status forward(int mb, std::shared_ptr<const Microbatch> data, TensorPtr input = nullptr,
                   TensorPtr output = nullptr);
    // Enqueues the backward of microbatch `mb` (forward must have been enqueued). Last stage
    // starts from the loss, others from `gradOutput` [T, h]; non-first stages write `gradInput`.
    // Parameter grads accumulate into the main-grad buffer. Releases the microbatch's saved
    // activations once executed.
    Status backward(int mb, TensorPtr gradOutput = nullptr, TensorPtr gradInput = nullptr);

    // After synchronize(): the microbatch's mean per-token loss (not divided by m). NaN if it was
    // not computed. The per-token losses stay where the loss op wrote them (on a device, in its
    // memory: no wait in the microbatch) until the first call after the step, which reads back
    // those of every microbatch in one op ("loss_reduce") on the compute stream.
    double microbatchLoss(int mb);
    // Debug/test hook: copy the logits [T, V/t] of every forward into capturedLogits(mb).
    void setCaptureLogits(bool on) { m_captureLogits = on; }
    const std::vector<float>& capturedLogits(int mb) const;
    void clearCaptured();

    // Data-parallel engine hooks (host side, called on the thread that enqueues; empty = off).
    // gradReady(params): every op that accumulates into these params' main grads for the
    //   current backward() has just been enqueued on the compute stream (per layer, then the
    //   final norm/output layer, then the embedding; a param is reported once per backward).
    // forwardPre(params): forward() is about to enqueue the first op reading these params.
    using ParamHook = std::function<void(const std::vector<int>& params)>;
    void setGradReadyHook(ParamHook hook) { m_gradReadyHook = std::move(hook); }
    void setForwardPreHook(ParamHook hook) { m_forwardPreHook = std::move(hook); }

    // tp_comm_overlap: run the SP collectives of QKV/proj/fc1/fc2 on `commStream` with `comm`
    // (a "tp" communicator used on that stream only), overlapped with the chunk GEMMs as the
    // tp_comm_* sub-knobs of the config select. No-op unless sequence parallel is active and
    // cfg.tp_comm_overlap is set. Call before the first forward.
    void setTpCommOverlap(Stream& commStream, Communicator& comm);
    bool tpCommOverlap() const { return m_tpo != nullptr; }
    // FP8 scaling state of this chunk's FP8 tensors for checkpoints: {"layer<L>.<linear>.<slot>":
    // {"history": [...], "scale": s}} with global layer numbers, and for the experts of MoE
    // layers "layer<L>.expert<E>.<linear>.<slot>" with global expert numbers (null without FP8). Call after
    // the streams are idle. setFp8State takes the entries of this chunk's tensors from such an
    // object (others are ignored; a tensor without an entry keeps its fresh state) and checks
    // them: history length as configured (fp8_amax_history_len), finite non-negative values.
    // Delayed scaling: history[0] (the amaxes of a step whose scale update has not run yet) lives
    // in the device pack; fp8State reads it back (a stream op), setFp8State writes it there.
    nlohmann::json fp8State();
    Status setFp8State(const nlohmann::json& state);
    // The params were replaced outside a step (a checkpoint load): the FP8 copies of the weights
    // are remade at their next use even within the step they were made in (they are otherwise
    // kept for the step, fp8CopyCurrent).
    void weightsReplaced();
    // The aux-loss-free expert bias of this chunk's MoE layers (moe_router_enable_expert_bias;
    // Megatron's persistent router buffer "expert_bias") for checkpoints: {"<global layer>": [E
    // floats]}; null without it. Every rank holding a layer holds the same bias (it is updated from
    // counts summed over tp-dp-cp). Call after the streams are idle. setRouterState takes this
    // chunk's layers from such an object (a layer without an entry keeps its bias) and checks them.
    nlohmann::json routerState() const;
    Status setRouterState(const nlohmann::json& state);
    // The same for quantile balancing's per-expert bias (moe_router_load_balancing_type=
    // quantile_balancing; Megatron's persistent router buffer "qb_beta"): {"<global layer>": [E
    // floats]}; null without it. Every rank holding a layer holds the same qb_beta.
    nlohmann::json qbBetaState() const;
    Status setQbBetaState(const nlohmann::json& state);
    // cp_comm_type=p2p: ring attention over `comm` (a "cp" communicator used on that stream
    // only) with the key/value blocks passed on `commStream` (engine/model/cp_ring.h). Needed
    // before the first forward when context parallel runs with p2p; no-op otherwise.
    // a2a+p2p (p2p size > 1): `comm` is an "hcp-p2p" communicator.
    void setCpRing(Stream& commStream, Communicator& comm);
    // moe_shared_expert_overlap: run the shared experts' forward and backward on `stream` (their
    // TP collectives over `tp`, a "tp" communicator used on that stream only; null with tp 1),
    // concurrently with the dispatcher's all-to-all and the routed experts on the compute stream,
    // as Megatron's SharedExpertMLP.stream. No-op unless the model has shared experts and the knob
    // is set; without it they run in that place of the compute stream. Call before the first forward.
    void setSharedExpertStream(Stream& stream, Communicator* tp);

private:
    struct LayerActs;
    struct MbState;
    struct MoeSaved;

    GptModel(const Config& cfg, const ModelDims& d, const ModelOptions& o, Device& dev,
             Stream& compute, const ParallelContext& ctx);
    Status registerParams();
    int recomputeGroupStart(int li) const;  // first local layer of li's full-recompute group, or -1
    int recomputeGroupEnd(int li) const;
    // The parts of the decoder, one file each beside gpt.cpp (the driver): gpt_embedding.cpp,
    // gpt_layer.cpp (norms, residuals, dropouts) with its blocks gpt_attention.cpp and
    // gpt_mlp.cpp, gpt_output.cpp (final norm, output layer, loss); gpt_ops.cpp holds the ops
    // they share. A new kind of block (MoE, context-parallel attention) is a new file beside them.
    // bf16: the part of the model being run (a layer, the output; the embedding gathers from the
    // bits) reads its weights as fp32 words from a working copy unpacked from the model copy's bf16 bits (op
    // bf16.weights, Workspace memory; on a device the bf16 GEMMs read the bits, bound as the
    // copy's twin). The WeightsInUse guard ends it: the stream keeps the copy until the ops
    // enqueued meanwhile ran (Stream::keepUntilPassed). A part run inside another (nothing yet) reads the outer copy.
    // No-op in fp32.
    Status useWeights(const std::vector<int>& params);
    void releaseWeights();
    struct WeightsInUse {
        GptModel& m;
        ~WeightsInUse() { m.releaseWeights(); }
    };
    Status embeddingForward(MbState& st, int mb);  // first stage: the lookup -> st.hidden
    Status embeddingBackward(MbState& st, TensorPtr dh);
    Status layerForward(MbState& st, int li, bool keep);
    Status layerBackward(MbState& st, int li, TensorPtr dout, TensorPtr* dx);
    // bf16 runs (ModelOptions::bf16SavedPacked): layer li's saved activations wait for the
    // backward as bf16 bits; restoreBf16 makes them floats again before the layer's backward or
    // the recompute that starts from it (gpt_layer.cpp).
    Status saveBf16(LayerActs& A, int li);
    Status restoreBf16(LayerActs& A);
    // A tensor saveBf16 may pack: a field of a layer's LayerActs or of its MoeSaved.
    struct SavedTensor {
        TensorPtr* tensor;
        bool fp8Input;  // an FP8 layer's linear (per-tensor recipes) quantizes it in place: scaled FP8 values
    };
    std::vector<SavedTensor> bf16SavedTensors(LayerActs& A) const;
    static void moeBf16SavedTensors(MoeSaved& s, std::vector<SavedTensor>& out);  // gpt_moe.cpp
    // Attention block of global layer gl: A.a1 -> the linear_proj output [TL, h] before its
    // bias; backward: its grad dproj -> the grad of A.a1 [TL, h] (TL = localTokens()).
    Result<TensorPtr> attentionForward(LayerActs& A, const LayerParams& P, int gl);
    Result<TensorPtr> attentionBackward(LayerActs& A, const LayerParams& P, int gl, TensorPtr dproj);
    // Core attention over whole sequences (the layer's, or Ulysses' head-shards): q, k, v ->
    // out, keeping A.attnStats (flash attention) or A.probs (unless selective recompute drops
    // them); backward: dout -> dq, dk, dv (overwritten), recomputing dropped probs first.
    Status coreAttentionForward(LayerActs& A, const kernels::cpu::AttnDims& ad, TensorPtr q, TensorPtr kk, TensorPtr v,
                                TensorPtr out);
    Status coreAttentionBackward(LayerActs& A, const kernels::cpu::AttnDims& ad, TensorPtr q, TensorPtr kk, TensorPtr v,
                                 TensorPtr dout, TensorPtr dq, TensorPtr dk, TensorPtr dv);
    // MLP block: A.a2 -> the linear_fc2 output [TL, h] before its bias; backward likewise.
    Result<TensorPtr> mlpForward(LayerActs& A, const LayerParams& P);
    Result<TensorPtr> mlpBackward(LayerActs& A, const LayerParams& P, TensorPtr dfc2);
    // The MLP of either kind (gpt_mlp.cpp): the dense MLP or an MoE layer's shared experts, the same
    // TP-sharded code with its own weights, local ffn size and op names.
    struct MlpWeights {
        int fc1W = -1, fc1B = -1, fc2W = -1;
        int ffnL = 0;       // ffn size on this TP rank
        bool fp8 = false;   // the dense MLP of an FP8 layer
        const MlpOpNames* names = nullptr;
    };
    // x: the SP-local input [TL, h] -> fc2 output [TL, h] (reduce-scattered / all-reduced over
    // TP); saves the fc1 output and the activation in *fc1, *act for the backward.
    Result<TensorPtr> mlpBlockForward(int li, const MlpWeights& W, const TensorPtr& x, TensorPtr* fc1, TensorPtr* act);
    Result<TensorPtr> mlpBlockBackward(int li, const MlpWeights& W, const TensorPtr& x, const TensorPtr& fc1,
                                       const TensorPtr& act, TensorPtr dfc2);
    // Shared experts of an MoE layer (gpt_mlp.cpp): A.a2 -> their (gated) output [TL, h], which
    // the layer adds to the routed experts' output; backward: dout [TL, h] -> their grad of A.a2.
    Result<TensorPtr> sharedExpertForward(LayerActs& A, const LayerParams& P);
    Result<TensorPtr> sharedExpertBackward(LayerActs& A, const LayerParams& P, TensorPtr dout);
    // MoE layer (gpt_layer.cpp): the routed experts plus the shared experts, if any.
    Result<TensorPtr> moeLayerForward(LayerActs& A, const LayerParams& P, int gl);
    Result<TensorPtr> moeLayerBackward(LayerActs& A, const LayerParams& P, TensorPtr dout);
    // MoE block (gpt_moe.cpp) in place of the MLP: A.a2 -> the combined expert output [T, h].
    Result<TensorPtr> moeForward(LayerActs& A, const LayerParams& P, int gl);
    Result<TensorPtr> moeBackward(LayerActs& A, const LayerParams& P, TensorPtr dout);
    // Expert parallel / expert tensor parallel (gpt_moe.cpp): the all-to-all and ETP all-gather
    // splits of a routed microbatch (host waits for the routing), rows [T*k, width] in permuted
    // order -> the local experts' rows [R, width] grouped by expert (all-to-all over "ep", then
    // all-gather over "etp"), and back (reduce-scatter over "etp", then all-to-all: a sum).
    Status moeDispatchPlan(MoeSaved& s);
    // ... and with the allgather dispatcher: tokens and routing all-gathered over "etp-ep".
    Status moeAllGatherDispatch(MoeSaved& s, const TensorPtr& x);
    Communicator* expertGroup() const;  // "etp-ep" (= "ep" with ETP 1)
    Result<TensorPtr> moeToExperts(const MoeSaved& s, const TensorPtr& rows, int width);
    Result<TensorPtr> moeFromExperts(const MoeSaved& s, const TensorPtr& grouped, int width);
    Status finalForward(MbState& st);  // last stage: final norm, output layer, loss
    Status finalBackward(MbState& st, TensorPtr* dhidden);
    // Norm helpers (LayerNorm or RMSNorm by dims).
    void normForward(const char* name, int wIdx, int bIdx, TensorPtr x, TensorPtr y, TensorPtr mean,
                     TensorPtr rstd, int T);
    void normBackward(const char* name, int wIdx, int bIdx, TensorPtr dy, TensorPtr x,
                      TensorPtr mean, TensorPtr rstd, TensorPtr dx, int T);
    // dy: [T, out], x: [T, in]; dx may be null. Weight grad into main grad (fused) or via a
    // temporary (gradient_accumulation_fusion=false); bIdx >= 0 accumulates the bias grad too.
    // W: the weight the dgrad uses (null = the model param; FP8: its quantized copy).
    Status linearBackward(const char* name, int wIdx, int bIdx, TensorPtr dy, TensorPtr x,
                          TensorPtr dx, int T, int in, int out, const float* W = nullptr);
    // FP8 linears (gpt_fp8.cpp; engine/model/fp8.h). Linears: 0 qkv, 1 proj, 2 fc1, 3 fc2;
    // slots: 0 input, 1 weight, 2 output gradient.
    enum Fp8Linear { kFp8Qkv = 0, kFp8Proj, kFp8Fc1, kFp8Fc2 };
    enum Fp8Slot { kFp8Input = 0, kFp8Weight, kFp8Grad };
    bool fp8Layer(int li) const;  // local layer li runs its linears in FP8
    // The FP8 linears' GEMMs run in bf16 with the rest of a bf16 model: block recipes with
    // power-of-two scales (a dequantized operand, a code times 2^k, is a bf16 value), delayed
    // scaling (codes at the step's scale, which the host writes to the device; fp8Quantize,
    // fp8Weight and the experts' fp8QuantizeTensor bind them with its address for the GEMMs to
    // take as codes: kernels/common/fp8_codes.h) and tensorwise scaling (codes at a scale made on
    // the device from the tensor's amax, bound with the amax). The others (block recipes without
    // power-of-two scales) run them in fp32 (kern::Fp32GemmScope), every other GEMM in bf16.
    bool fp8GemmsBf16() const { return m_o.fp8.isBlock() ? m_o.fp8.blockPow2 : true; }
    void fp8Init();
    // Quantizes (and dequantizes) `t` [n] in place with the slot's scale: delayed scaling uses
    // the scale of earlier steps and records this tensor's amax; tensorwise takes the scale from
    // this tensor's amax (the max over TP, where the tensor is split).
    Status fp8Quantize(int li, Fp8Linear lin, Fp8Slot slot, TensorPtr t, int64_t n);
    // The FP8 copy of weight wIdx for this step (quantized by the first forward of the step).
    Result<const float*> fp8Weight(int li, Fp8Linear lin, int wIdx);
    // Weight wIdx has its FP8 copies for this step (fp8Weight, fp8ExpertWeights, fp8BlockWeight
    // note it when they quantize). Its GEMMs read those copies, and quantizing was the only read of
    // its own words, so a bf16 run's useWeights leaves it out of the working copy for the rest of
    // the step (TE likewise casts a weight once per step, on the first microbatch).
    void fp8CopyMade(int wIdx);
    bool fp8CopyCurrent(int wIdx) const;
    void fp8StepUpdate();  // delayed scaling: amax reduction over tp-dp-cp and the scale update
    // FP8 inside the experts of MoE layers (gpt_fp8.cpp, after TE's GroupedLinear): one scaling
    // state per expert GEMM input — [local layer][local expert][fc1, fc2][input, weight, grad].
    enum Fp8ExpertLinear { kFp8ExpFc1 = 0, kFp8ExpFc2 };
    Fp8Meta* fp8ExpertMeta(int li, int l, Fp8ExpertLinear lin, Fp8Slot slot) const;
    // The activations and gradients are quantized inside the expert ops (fp8QuantizeTensor,
    // fp8.h): an expert's rows are known only when the ops run. Their amaxes stay on the device,
    // in m_fp8ExpAmaxDev at the meta's index.
    Fp8TensorSlots fp8ExpertSlots(int li, int l, Fp8ExpertLinear lin, Fp8Slot slot) const;
    // The FP8 copies of the L local experts' weights of `lin` for this step (quantized by the
    // first forward of the step), in local expert order.
    Result<std::vector<const float*>> fp8ExpertWeights(int li, Fp8ExpertLinear lin, const std::vector<int>& wIdx);
    // Delayed scaling of the experts: amaxes packed by global expert index (zero where a rank does
    // not hold the expert) and reduced with MAX over tp-dp-cp, i.e. over the ranks holding each
    // expert (its edp replicas and etp shards); then the scale update and the counters.
    void fp8ExpertStepUpdate();
    void fp8ExpertInit();
    // Block recipes (mxfp8, blockwise): the weight's FP8 copy quantized along `in` (rowwise, the
    // forward GEMM) or along `out` (the dgrad), made once per iteration; dense and expert weights.
    Result<const float*> fp8BlockWeight(int wIdx, bool rowwise);
    // Checkpoint entries "layer<L>.expert<E>.<linear_fc1|linear_fc2>.<slot>" (E: global expert);
    // the amaxes come from the device pack (a stream op).
    void fp8ExpertState(nlohmann::json& out);
    Status setFp8ExpertState(const nlohmann::json& state);
    void tpAllReduce(const TensorPtr& t, int64_t n);
    // tp_comm_overlap backward of a row-parallel linear (proj, fc2): dgrad pipelined with the
    // ring all-gather of dyLocal [TL, out] into dx [T, in], then the wgrad on x [T, in].
    // Wq: the weight the dgrad reads when it is not the model weight (FP8: its FP8 copy); with
    // FP8 the caller has quantized dyLocal (one scale for the whole tensor, the same values the
    // non-overlapped path gathers).
    Status rowParallelBackwardOverlapped(const char* dgradName, const char* wgradName, int wIdx, TensorPtr dyLocal,
                                         TensorPtr x, TensorPtr dx, int T, int in, int out,
                                         const float* Wq = nullptr);
    // The dgrad GEMM of a chunk of rows of both (dy [rows, out] -> dx [rows, in]), as
    // linearBackward's dgrad: FP8 block recipes quantize the chunk's dy along `out` first.
    Result<std::function<void(const float*, float*, int)>> overlappedDgrad(int wIdx, int T, int in, int out,
                                                                            const float* Wq);
    // ... of a column-parallel one (QKV, fc1): dy [T, out], saved input shard xLocal [TL, in];
    // bulk (or pipelined, tp_comm_overlap_rs_dgrad) overlap; returns the dX shard [TL, in].
    Result<TensorPtr> columnParallelBackwardOverlapped(const char* dgradName, const char* wgradName, int wIdx,
                                                       int bIdx, TensorPtr dy, TensorPtr xLocal, int T, int in,
                                                       int out, const float* Wq = nullptr);
    // Sequence-parallel collectives along s on the compute stream (group "tp"):
    // gather: local [n] -> full [t*n]; reduce-scatter: full [t*n] (partial sums) -> local [n].
    Result<TensorPtr> seqGather(const TensorPtr& local, int64_t n);
    Result<TensorPtr> seqReduceScatter(const TensorPtr& full, int64_t n);
    // Context parallel (gpt_cp_attention.cpp; cpSize > 1): this rank's rows are the sequence
    // chunks of engine/parallel/context_parallel.h. RoPE runs per contiguous segment of rows
    // with the segment's first global position.
    struct RopeSegment {
        int start = 0, len = 0, pos = 0;  // local first row (in s), rows, global position of the first
    };
    std::vector<RopeSegment> m_ropeSegs;
    // Hidden dropout (embedding, both bias-dropout-adds) numbers its mask elements as in the
    // single device's [s*b, h] tensor, so every TP/SP/CP layout drops exactly what tp=cp=1 drops:
    // this rank's [TL, h] activation (its SP shard of its CP chunks) is up to three runs of
    // consecutive rows, each a contiguous range of that numbering.
    struct DropPiece {
        int64_t local = 0, global = 0, n = 0;  // first element here, first element there, elements
    };
    std::vector<DropPiece> hiddenDropPieces() const;
    std::vector<int> m_cpPos;   // global position of every local sequence row (cp > 1)
    KernelIds m_cpPosK;         // m_cpPos as kernels read it (cpPositions)
    Result<KernelIds> cpPositions();
    KernelIds m_seqPosK;        // 0 .. global seq - 1, the all-gathered keys' positions (seqPositions)
    Result<KernelIds> seqPositions();
    int m_seqGlobal = 0;        // s of the whole sequence
    // Core attention of the local queries against the whole sequence (K/V all-gathered over
    // "cp" and put in global order; their grads reduce-scattered back).
    Result<TensorPtr> cpGatherKv(const TensorPtr& local, int heads);
    Result<TensorPtr> cpScatterKvGrad(const TensorPtr& global, int heads);
    // cp_comm_type=a2a (Ulysses): all-to-all over `comm` ("cp", size c) from this rank's rows of
    // every head [sl, b, heads, d] to the whole sequence (global order) of heads/c heads
    // [S, b, heads/c, d], and back (into `out` [sl, b, heads, d]). a2a+p2p: the same over
    // "hcp-a2a" (size a) -> the a ranks' rows [a*sl, b, heads/a, d] in TE's chunk order.
    Result<TensorPtr> cpToHeads(const TensorPtr& local, int heads, Communicator& comm);
    Status cpToSequence(const TensorPtr& full, int heads, const TensorPtr& out, Communicator& comm);
    // What cp_comm_type runs here: the ring (p2p; a2a+p2p with a p2p level > 1, after an
    // all-to-all over hcp-a2a when a2a > 1) or Ulysses (a2a; a2a+p2p as [c, 1]) over `comm`,
    // where this rank is `rank`; neither = all_gather.
    struct CpMode {
        bool ring = false, ulysses = false;
        int a2a = 1;                    // ring: size of the all-to-all group before it
        Communicator* comm = nullptr;   // the all-to-all group (Ulysses, or the ring's a2a > 1)
        int rank = 0;                   // this rank in it
    };
    CpMode cpMode() const;
    // `drop`: the layer's core-attention dims of the cp=1 numbering (attention dropout, its seed,
    // this TP rank's first head); every variant draws the mask from global positions with it.
    Status cpCoreAttentionForward(LayerActs& A, int nq, int ng, const kernels::cpu::AttnDims& drop);
    Status cpCoreAttentionBackward(LayerActs& A, int nq, int ng, const kernels::cpu::AttnDims& drop, TensorPtr dctx,
                                   TensorPtr dq, TensorPtr dk, TensorPtr dv);
    // Sums the grads of the SP params among `params` over TP (one packed all-reduce), in the
    // last backward of the step only (finalize_model_grads' _allreduce_non_tensor_model_parallel_grads).
    Status syncSequenceParallelGrads(const std::vector<int>& params);
    // Calls the grad-ready hook after summing the SP grads of `params` over TP.
    Status gradsReady(const std::vector<int>& params);
    void roundBf16(const TensorPtr& t, int64_t n);

    Config m_cfg;
    ModelDims m_d;
    ModelOptions m_o;
    ParallelContext m_ctx;
    Exec m_exec;
    ParamBuffer m_params;
    int m_embW = -1, m_posW = -1, m_lnfW = -1, m_lnfB = -1, m_outW = -1;
    std::vector<LayerParams> m_layers;
    // local shapes
    int m_nqL = 0, m_ngL = 0, m_ffnL = 0, m_vocabL = 0, m_vocabStart = 0;
    int m_moeFfn = 0;  // expert MLP hidden size (moe_ffn_hidden_size or ffn), 0 = dense model
    int m_moeFfnL = 0; // ... this rank's share of it: moe_ffn / expert_tensor_parallel_size
    int m_sharedFfnL = 0;  // shared experts' ffn size on this TP rank (moe_shared_expert_intermediate_size / t)
    int m_step = 0, m_numMicrobatches = 1;
    bool m_sp = false;               // sequence parallel active (tp > 1)
    int m_backwardsThisStep = 0;     // backward() calls since beginStep()
    bool m_lastBackward = false;     // the backward being enqueued is the step's last
    bool m_recomputing = false;      // full recompute is rerunning a forward inside backward()
    // useWeights' working copy, its spans of the buffer (begin, end, offset in the copy), the
    // params it holds (sorted), how many parts use it now, and whether its spans are bound as
    // twins (unbound on release as they were bound).
    TensorPtr m_working;
    std::vector<std::array<int64_t, 3>> m_workingSpans;
    std::vector<int> m_workingParams;
    int m_workingDepth = 0;
    bool m_workingTwins = false;
    // Router state of the MoE layers (gpt_moe.cpp), by local layer; read and written by the ops.
    struct RouterState {
        std::vector<float> expertBias;     // [E] moe_router_enable_expert_bias (fp32, as Megatron keeps it)
        std::vector<double> localTokens;   // [E] this rank's routed rows this step (the bias update's counts)
        // global_aux_loss: [E] the counts summed over tp-dp-cp and over this step's first gaSteps
        // microbatches, on the device (the last microbatch's MoeSaved::auxGlobal); enqueue-time state.
        TensorPtr globalSum;
        int gaSteps = 0;
        // quantile_balancing: qb_beta [E] (fp32); the layer's row of m_qbSumDev (this step's sum
        // of the per-microbatch column quantiles, Megatron's qb_beta_accum; -1: not a quantile-
        // balanced layer) and the microbatches enqueued into it this step (qb_beta_count).
        std::vector<float> qbBeta;
        int qbSlot = -1;
        int qbCount = 0;
    };
    std::shared_ptr<std::vector<RouterState>> m_router;
    // One per-expert vector of every MoE layer's RouterState (the expert bias, qb_beta) as
    // checkpoint state {"<global layer>": [E floats]}, and back (checked; `what` names it in errors).
    nlohmann::json routerVectors(std::vector<float> RouterState::*member) const;
    Status setRouterVectors(const nlohmann::json& state, std::vector<float> RouterState::*member,
                            const std::string& what);
    // After the step's last backward: the expert-bias update from the counts summed over tp-dp-cp
    // (finalize_model_grads' _update_router_expert_bias), the qb_beta update (moeQbStepEnd,
    // _update_router_qb_beta) and the reset of the step's counts (reset_model_temporary_tensors).
    Status moeStepEnd();
    // The router's counters of the forwards since the last flush (trace only; moeForward records
    // them): their device counts read back once, at the step's end (moeStepEnd) or at the next
    // beginStep for a step that ended early.
    struct RouterStats;
    std::vector<std::shared_ptr<RouterStats>> m_pendingRouterStats;
    std::vector<std::shared_ptr<RouterStats>> m_graphRouterStats;  // graphCaptured
    Status flushRouterStats();
    Status moeQbStepEnd();
    // quantile_balancing in the forward: the router's logits gathered over tp-cp and this
    // microbatch's column quantile added to the step's sum (not again by a full recompute).
    Status moeQbForward(MoeSaved& s, int li);
    std::unique_ptr<TpOverlap> m_tpo;
    Stream* m_sharedStream = nullptr;     // moe_shared_expert_overlap: the shared experts' stream
    Communicator* m_sharedTp = nullptr;   // ... and its "tp" communicator
    // Enqueues fn's ops on the shared experts' stream, after `ready` (recorded on compute), with
    // the TP collectives on its communicator; returns the event that marks their end.
    Result<std::shared_ptr<Event>> onSharedStream(const std::shared_ptr<Event>& ready,
                                                  const std::function<Status()>& fn);
    std::unique_ptr<CpRing> m_cpRing;  // cp_comm_type=p2p  // tp_comm_overlap active (SP + knob + comm stream given)
    std::shared_ptr<std::vector<Fp8Meta>> m_fp8Meta;  // [local layer][linear][slot]
    // Where kernels see it, per m_fp8Meta entry: delayed scaling's amax observed this step
    // (amaxAccumulate; reduced and read back once at the step's end, then zeroed), or tensorwise
    // scaling's last amax (fp8QuantizeCurrent: the scale never comes back to the host). No
    // read-back per tensor either way.
    TensorPtr m_fp8AmaxDev;
    // Delayed scaling: each m_fp8Meta entry's scale where kernels read it (fp8QuantizeDelayed, the
    // GEMMs' bindings), written after each update (fp8StepUpdate) and on a load, so a captured
    // graph's kernels read each step's scales.
    TensorPtr m_fp8ScaleDev;
    struct Fp8WeightCopy {
        TensorPtr dequantized, codes;  // float values the GEMM uses; the FP8 codes (1 byte each)
        int step = -1;
    };
    std::vector<Fp8WeightCopy> m_fp8W;  // [local layer][linear]
    std::shared_ptr<std::vector<Fp8Meta>> m_fp8ExpMeta;  // [local layer][local expert][fc1, fc2][slot]
    std::vector<Fp8WeightCopy> m_fp8ExpW;                 // [local layer][local expert][fc1, fc2]
    int m_fp8LocalExperts = 0;                            // L = num_moe_experts / ep (0 = dense)
    // The experts' amaxes where kernels see them (not with block recipes), indexed as m_fp8ExpMeta:
    // delayed, the step's observations (reduced and read back once per step by
    // fp8ExpertStepUpdate, then zeroed); tensorwise, each tensor's last. m_fp8ExpAmaxRaw: the
    // tensorwise raw amax of each, scratch.
    TensorPtr m_fp8ExpAmaxDev, m_fp8ExpAmaxRaw;
    TensorPtr m_fp8ExpScaleDev;  // delayed: the experts' scales, as m_fp8ScaleDev
    // quantile_balancing: [MoE layers, E] each layer's sum of this step's column quantiles, on the
    // device (RouterState::qbSlot; moeQbForward adds, moeQbStepEnd reads it once and zeroes it).
    TensorPtr m_qbSumDev;
    // The step's dropout key (layers.h dropoutStepKey; one uint64, written by beginStep) when
    // hidden or attention dropout is on: every dropout kernel reads it (dropSeed).
    TensorPtr m_dropKey;
    // The seed a dropout kernel of site (mb, layer, site) gets (layers.h dropoutStepKey, dropoutSiteKey).
    kernels::hd::DropoutSeed dropSeed(int mb, int layer, int site) const;
    struct Fp8BlockWeightCopy {
        TensorPtr row, col, rowCodes, colCodes;  // dequantized values (workspace) and FP8 bytes with scales (params)
        int step = -1;
    };
    std::map<int, Fp8BlockWeightCopy> m_fp8BlockW;  // block recipes: by weight param index
    std::vector<int> m_fp8CopyStep;                  // by param index: the step of its FP8 copies (-1 none)
    std::map<int, std::unique_ptr<MbState>> m_mbs;
    bool m_captureLogits = false;
    std::shared_ptr<std::map<int, std::vector<float>>> m_logits;
    // The microbatches' per-token losses not read back yet, and the sums of those that were.
    struct PendingLoss {
        TensorPtr loss;                          // [T]
        int T = 0;
        std::shared_ptr<const Microbatch> data;  // its loss mask and token count
    };
    std::map<int, PendingLoss> m_pendingLosses;
    // stageInputs: per microbatch, buffers whose addresses stay (ids and labels [T] int32, the
    // loss seed and the per-token loss [T] float) and the data they hold.
    struct StagedInputs {
        TensorPtr ids, labels, seed, loss;
        std::shared_ptr<const Microbatch> data;
    };
    std::map<int, StagedInputs> m_staged;
    const StagedInputs* staged(int mb, const std::shared_ptr<const Microbatch>& data) const;
    Status checkMicrobatch(const Microbatch* data) const;
    // The per-token gradient seed of data: mask / (tokens * num_microbatches / cp).
    std::shared_ptr<std::vector<float>> lossSeed(const Microbatch& data) const;
    std::map<int, std::pair<double, double>> m_losses;  // mb -> (sum, tokens)
    Status readBackLosses();
    ParamHook m_gradReadyHook, m_forwardPreHook;
    std::vector<int> layerParamList(int li) const;
    std::vector<int> embeddingParamList() const;  // word (+ position) embedding
};

}  // namespace ts::engine
