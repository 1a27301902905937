// Megatron's model-FLOPs formula (dense GPT, MoE routed and shared experts).
#include "engine/model/flops.h"

#include <algorithm>

#include <cstdio>

namespace ts::engine {

FlopsInputs FlopsInputs::fromConfig(const Config& c) {
    const DerivedSizes d = deriveSizes(c);
    FlopsInputs in;
    in.globalBatch = d.global_batch_size;
    in.seq = c.seq_length;
    in.hidden = c.hidden_size;
    in.layers = c.num_layers;
    in.heads = c.num_attention_heads;
    in.groups = d.num_query_groups;
    in.kvChannels = d.kv_channels;
    in.ffn = d.ffn_hidden_size;
    in.paddedVocab = d.padded_vocab_size;
    in.swiglu = c.swiglu;
    if (c.num_moe_experts > 0) {
        // The layers moe_layer_freq marks are MoE (i % f == 0 for an integer f, or the list).
        const std::vector<int> pattern = moeLayerPattern(c);
        in.moeLayers = int(std::count(pattern.begin(), pattern.end(), 1));
        in.moeFfn = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : d.ffn_hidden_size;
        in.topk = c.moe_router_topk;
        in.sharedFfn = c.moe_shared_expert_intermediate_size;
    }
    return in;
}

double megatronFlopsPerIteration(const FlopsInputs& in) {
    const double fb = 3, fma = 2;  // forward + wgrad + dgrad; multiply-add = 2 FLOPs
    const double ffnExp = in.swiglu ? 3 : 2;
    const double q = in.kvChannels * in.heads, kv = in.kvChannels * in.groups;
    const double h = in.hidden, L = in.layers;
    const double tokens = in.globalBatch * in.seq;
    const double attnLinear = fb * fma * (h * (q + 2 * kv) + q * h);
    const double attnCore = fb * fma * q / 2 * 2;  // "/2" causal, "*2" QK^T and (QK^T)V
    const double mlp = fb * fma * h * ffnExp *
                       (in.ffn * (L - in.moeLayers) + (in.moeFfn * in.topk + in.sharedFfn) * in.moeLayers);
    const double perToken = mlp + attnLinear * L + fb * fma * h * in.paddedVocab;
    const double seqSq = in.globalBatch * in.seq * in.seq;
    return tokens * perToken + seqSq * attnCore * L;
}

double paperFlopsPerIteration(const FlopsInputs& in) {
    const double q = in.kvChannels * in.heads;
    return megatronFlopsPerIteration(in) + in.globalBatch * in.seq * in.seq * 6 * q * in.layers;
}

std::string flopsFormulaText(const FlopsInputs& in) {
    char buf[1024];
    std::snprintf(buf, sizeof buf,
                  "Megatron num_floating_point_operations (causal): F = B*s*[6*h*ffn*%d*L + 6*(h*(q+2kv)+q*h)*L + "
                  "6*h*V] + B*s^2*6*q*L with B=%g s=%g h=%g ffn=%g L=%g q=%g kv=%g V=%g -> %.6g FLOPs/iteration "
                  "(paper Eq.7 without causal halving: %.6g)",
                  in.swiglu ? 3 : 2, in.globalBatch, in.seq, in.hidden, in.ffn, in.layers, in.kvChannels * in.heads,
                  in.kvChannels * in.groups, in.paddedVocab, megatronFlopsPerIteration(in), paperFlopsPerIteration(in));
    std::string text = buf;
    if (in.moeLayers > 0) {
        char moe[256];
        std::snprintf(moe, sizeof moe,
                      "; MoE: the MLP term of each MoE layer is 6*h*moe_ffn*%d*topk with moe_ffn=%g topk=%g (the %g "
                      "routed experts of a token; the router GEMM is not counted, as in Megatron)",
                      in.swiglu ? 3 : 2, in.moeFfn, in.topk, in.topk);
        text += moe;
        if (in.sharedFfn > 0) {
            std::snprintf(moe, sizeof moe,
                          "; shared experts: + 6*h*%g*%d per MoE layer (a dense MLP of "
                          "moe_shared_expert_intermediate_size; the gate is not counted, as in Megatron)",
                          in.sharedFfn, in.swiglu ? 3 : 2);
            text += moe;
        }
    }
    return text;
}

}  // namespace ts::engine
