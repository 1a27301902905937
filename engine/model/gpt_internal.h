// Internal to the GPT model's files (engine/model/gpt*.cpp, one per part of the decoder): the
// saved activations of a layer, the per-microbatch state, and helpers several parts use.
// Shapes are local to the TP rank: nq = heads/t, ng = groups/t, F = ffn/t, Vl = V/t.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "engine/backend/backend_trace.h"
#include "engine/comm/communicator.h"
#include "engine/model/gpt.h"
#include "engine/backend/kernels.h"

namespace ts::engine {

namespace k = ts::engine::kern;
using trace::Category;

struct GptModel::LayerActs {
    TensorPtr x;                    // layer input (residual stream) [T, h]
    TensorPtr mean1, rstd1, a1;     // input_layernorm stats [T], output [T, h]
    TensorPtr q, k, v;              // after RoPE: [T, nq, d], [T, ng, d], [T, ng, d]
    TensorPtr probs;                // [b, nq, s, s]; null under selective recompute or flash
    TensorPtr attnStats;            // flash attention: each softmax row's max and 1/sum [b, nq, s, 2]
    TensorPtr lse;                  // cp_comm_type=p2p, and all_gather under flash attention:
                                    // log-sum-exp of the softmax rows [b, nq, s]
                                    // (a2a+p2p: of the head-split rows [b, nq/a, a*s])
    TensorPtr ctxHeads;             // a2a+p2p (a > 1): the ring's output before the all-to-all back
                                    // [a*s, b, nq/a, d], what its backward reads
    TensorPtr ctx;                  // core attention output [T, nq*d]
    TensorPtr attnOut;              // CP ring / all_gather flash under in-place FP8: the output the
                                    // attention backward reads (A.ctx is then linear_proj's FP8 input)
    // The attention's own output, as its backward reads it: attnOut where one was kept, else ctx.
    const TensorPtr& attentionOutput() const { return attnOut ? attnOut : ctx; }
    TensorPtr mask1;                // dropout mask after linear_proj [T*h] (p > 0)
    TensorPtr x2;                   // residual after attention [T, h]
    TensorPtr mean2, rstd2, a2;     // pre_mlp_layernorm
    TensorPtr fc1;                  // linear_fc1 output [T, F or 2F] (SwiGLU: bias included)
    TensorPtr act;                  // activation output [T, F]
    TensorPtr mask2;                // dropout mask after linear_fc2
    std::shared_ptr<MoeSaved> moe;  // MoE layer: routing and expert activations
    // MoE layer with shared experts: their linear_fc1 output [T, Fs or 2Fs] and activation
    // [T, Fs] (Fs = moe_shared_expert_intermediate_size / t); with the gate, their output before
    // it [TL, h] and the gate score sigmoid(x w_gate) [TL].
    TensorPtr shFc1, shAct, shOut, shGate;
    TensorPtr shX;  // FP8: the shared experts' own (quantized) copy of a2, which the router keeps in high precision
    // moe_shared_expert_overlap: set by the layer around moeForward/moeBackward, which call it
    // between the token dispatch and the routed experts (Megatron runs the shared experts there,
    // on their own stream, while the dispatcher's all-to-all is in flight).
    std::function<Status()> beforeExperts;
    // bf16 runs, from the end of the layer's forward to the start of its backward: the tensors
    // (fields of this struct or of *moe) that hold bf16 bits instead of floats
    // (GptModel::saveBf16), with their element counts. The layer's entry in MbState::layers,
    // which is not resized meanwhile, and *moe hold those fields in place.
    struct Packed {
        TensorPtr* tensor;
        int64_t n;
    };
    std::vector<Packed> packed;
    // On a device, from restoreBf16 to the end of the layer's backward: each restored tensor's
    // bits stay bound as its bf16 twin (kern::bindBf16Twin), so the backward's bf16 GEMMs read
    // them instead of converting the floats again. The binding holds the floats and the bits, so
    // it unbinds before either can be freed, in whatever order LayerActs lets its fields go.
    struct TwinBinding {
        std::vector<std::pair<TensorPtr, TensorPtr>> floatsAndBits;
        ~TwinBinding() {
            for (const auto& fb : floatsAndBits) kern::unbindBf16Twin(fb.first->as<float>());
        }
    };
    std::shared_ptr<TwinBinding> twins;
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
    // The token ids and labels the kernels read (GptModel::kernelIds).
    KernelIds ids, labels;
    bool backwardDone = false;
};

// Exec::alloc without the zero fill, for buffers the producing op overwrites entirely.
inline Result<TensorPtr> allocUninitialized(Exec& ex, int64_t elems,
                                            MemCategory cat = MemCategory::Activations) {
    auto r = ex.device().allocateUninitialized(size_t(std::max<int64_t>(elems, 1)) * sizeof(float), cat);
    if (!r) return r.status();
    return TensorPtr(std::move(r).value());
}

}  // namespace ts::engine
