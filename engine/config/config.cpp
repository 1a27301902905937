// Derived sizes of a validated config (Megatron's rules for world, dp, microbatches, vocab).
#include "engine/config/config.h"

#include <algorithm>

namespace ts::engine {

DerivedSizes deriveSizes(const Config& c) {
    DerivedSizes d;
    d.tp = std::max(1, c.tensor_model_parallel_size);
    d.pp = std::max(1, c.pipeline_model_parallel_size);
    d.vpp = std::max(1, c.virtual_pipeline_model_parallel_size);
    d.cp = std::max(1, c.context_parallel_size);
    d.ep = std::max(1, c.expert_model_parallel_size);
    d.etp = c.expert_tensor_parallel_size > 0 ? c.expert_tensor_parallel_size : d.tp;
    const int mp = d.tp * d.cp * d.pp;
    if (c.data_parallel_size > 0) {
        d.dp = c.data_parallel_size;
        d.world = c.world_size > 0 ? c.world_size : mp * d.dp;
    } else if (c.world_size > 0) {
        d.world = c.world_size;
        d.dp = std::max(1, c.world_size / mp);
    } else {
        d.dp = 1;
        d.world = mp;
    }
    if (c.num_microbatches > 0) {
        d.num_microbatches = c.num_microbatches;
        d.global_batch_size = c.global_batch_size > 0
                                  ? c.global_batch_size
                                  : c.micro_batch_size * d.dp * d.num_microbatches;
    } else if (c.global_batch_size > 0) {
        d.global_batch_size = c.global_batch_size;
        d.num_microbatches = std::max(1, c.global_batch_size / std::max(1, c.micro_batch_size * d.dp));
    } else {
        d.num_microbatches = 1;
        d.global_batch_size = c.micro_batch_size * d.dp;
    }
    const int mult = std::max(1, c.make_vocab_size_divisible_by) * d.tp;
    d.padded_vocab_size = ((c.vocab_size + mult - 1) / mult) * mult;
    d.num_query_groups = c.num_query_groups > 0 ? c.num_query_groups : c.num_attention_heads;
    d.kv_channels = c.kv_channels > 0 ? c.kv_channels
                                      : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
    if (c.ffn_hidden_size > 0) {
        d.ffn_hidden_size = c.ffn_hidden_size;
    } else if (c.swiglu) {
        // Megatron-LM validate_args: the gated MLP has two input projections, so its width is
        // cut to 2/3 of 4h (same parameter count) and rounded down to a multiple of 64.
        d.ffn_hidden_size = int((4.0 * c.hidden_size * 2.0 / 3.0) / 64.0) * 64;
    } else {
        d.ffn_hidden_size = 4 * c.hidden_size;
    }
    return d;
}

}  // namespace ts::engine
