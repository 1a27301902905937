// Model FLOPs per training iteration, as Megatron's num_floating_point_operations
// (megatron/training/training.py, REFERENCE.md §8.2; dense GPT, GQA and SwiGLU aware, causal
// halving of the attention-score term as in Megatron since 2025-03), and Korthikanti et al.'s
// Eq. 7 (no causal halving) for comparison with papers. A FLOP is a multiply or an add.
// model TFLOP/s = F / (iteration_time * 1e12 * world_size).
#pragma once

#include <string>

#include "engine/config/config.h"

namespace ts::engine {

struct FlopsInputs {
    double globalBatch = 0;  // sequences per iteration (all DP ranks, all microbatches)
    double seq = 0, hidden = 0, layers = 0, heads = 0, groups = 0, kvChannels = 0, ffn = 0;
    double paddedVocab = 0;
    bool swiglu = false;
    // MoE (num_moe_experts > 0; moeLayers = the layers moe_layer_freq marks): the MLP term counts the
    // top-k routed experts of moe_ffn_hidden_size each, as Megatron does (its formula leaves
    // the router GEMM out, and so does this one).
    double moeLayers = 0, moeFfn = 0, topk = 0;
    // Shared experts (moe_shared_expert_intermediate_size): a dense MLP of that ffn size in every
    // MoE layer, Megatron's shared_expert_ffn_hidden_size term.
    double sharedFfn = 0;
    static FlopsInputs fromConfig(const Config& c);
};

// Megatron HEAD: F = B*s*[ 6*h*ffn*(3 if swiglu else 2)*L + 6*(h*(q+2kv) + q*h)*L + 6*h*V ]
//                    (MoE layers: ffn -> moe_ffn*topk + shared_ffn)
//                    + B*s^2 * 6*q * L,   q = kv_channels*heads, kv = kv_channels*groups.
double megatronFlopsPerIteration(const FlopsInputs& in);
// Korthikanti Eq. 7 (MHA, ffn = 4h form generalised the same way, attention not halved):
// the Megatron value plus B*s^2*6*q*L.
double paperFlopsPerIteration(const FlopsInputs& in);
// Human-readable formula with the numbers substituted, for the run metadata.
std::string flopsFormulaText(const FlopsInputs& in);

}  // namespace ts::engine
