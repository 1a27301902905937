// Model dims/options from a Config, with the shape checks this engine needs.
#include "engine/model/model.h"

#include "engine/model/fp8.h"

#include <cstdlib>
#include <string>

namespace ts::engine {

Result<ModelDims> modelDimsFromConfig(const Config& c) {
    const DerivedSizes ds = deriveSizes(c);
    ModelDims d;
    d.layers = c.num_layers;
    d.hidden = c.hidden_size;
    d.heads = c.num_attention_heads;
    d.groups = ds.num_query_groups;
    d.headDim = ds.kv_channels;
    d.ffn = ds.ffn_hidden_size;
    d.vocab = c.vocab_size;
    d.paddedVocab = ds.padded_vocab_size;
    d.seq = c.seq_length;
    d.microBatch = c.micro_batch_size;
    d.swiglu = c.swiglu;
    d.rmsNorm = c.normalization == "RMSNorm";
    d.rope = c.position_embedding_type == "rope";
    d.learnedPos = c.position_embedding_type == "learned_absolute";
    d.maxPos = c.seq_length;  // the registry has no max_position_embeddings; Megatron defaults it to seq_length
    d.tied = !c.untie_embeddings_and_output_weights;
    d.bias = c.add_bias_linear;
    d.normEps = float(c.norm_epsilon);
    d.ropeTheta = float(c.rotary_base);

    auto bad = [](const std::string& m) { return Status::invalid(m); };
    if (d.layers <= 0) return bad("num_layers must be > 0 (got " + std::to_string(d.layers) + ")");
    if (d.hidden <= 0) return bad("hidden_size must be > 0");
    if (d.heads <= 0) return bad("num_attention_heads must be > 0");
    if (d.groups <= 0 || d.heads % d.groups != 0)
        return bad("num_query_groups=" + std::to_string(d.groups) + " must divide num_attention_heads=" +
                   std::to_string(d.heads));
    if (d.headDim <= 0) return bad("kv_channels must be > 0 (hidden_size / num_attention_heads = 0)");
    if (c.kv_channels == 0 && d.hidden % d.heads != 0)
        return bad("num_attention_heads=" + std::to_string(d.heads) + " does not divide hidden_size=" +
                   std::to_string(d.hidden) + "; set kv_channels or change the head count");
    if (d.rope && d.headDim % 2 != 0)
        return bad("rotary embedding needs an even head dim (kv_channels=" + std::to_string(d.headDim) + ")");
    if (d.ffn <= 0) return bad("ffn_hidden_size must be > 0");
    if (d.vocab <= 0) return bad("vocab_size must be > 0");
    if (d.seq <= 0) return bad("seq_length must be > 0");
    if (d.microBatch <= 0) return bad("micro_batch_size must be > 0");
    if (c.normalization != "LayerNorm" && c.normalization != "RMSNorm")
        return bad("normalization must be LayerNorm or RMSNorm (got '" + c.normalization + "')");
    if (c.position_embedding_type != "rope" && c.position_embedding_type != "none" &&
        c.position_embedding_type != "learned_absolute")
        return bad("position_embedding_type must be learned_absolute, rope or none (got '" +
                   c.position_embedding_type + "')");
    if (ds.cp > 1) {
        // What context parallelism runs today (engine/model/gpt_cp_attention.cpp).
        auto notYet = [](const std::string& what) {
            return Status::unsupported("context parallel: " + what + " is not executed by the engine yet");
        };
        if (c.cp_comm_type != "all_gather" && c.cp_comm_type != "p2p" && c.cp_comm_type != "a2a" &&
            c.cp_comm_type != "a2a+p2p")
            return notYet("cp_comm_type=" + c.cp_comm_type + "; use p2p, all_gather, a2a or a2a+p2p");
        // Megatron builds one CP sub-group per level of hierarchical_context_parallel_sizes, but
        // only a2a+p2p uses them, and Transformer Engine's attention takes exactly two
        // (context_parallel.py asserts len(cp_group) == 2: the a2a group, then the p2p ring).
        const std::vector<int>& hcp = c.hierarchical_context_parallel_sizes;
        if (c.cp_comm_type == "a2a+p2p") {
            if (hcp.size() != 2)
                return bad("cp_comm_type=a2a+p2p takes two levels of hierarchical_context_parallel_sizes, [a2a size, "
                           "p2p size] (Transformer Engine's a2a+p2p attention takes exactly two CP groups), not " +
                           std::to_string(hcp.size()) + "; multiply the extra levels into one of the two");
            if (int64_t(hcp[0]) * hcp[1] != ds.cp)
                return bad("cp_comm_type=a2a+p2p needs hierarchical_context_parallel_sizes: [a2a size, p2p size] "
                           "with product context_parallel_size=" + std::to_string(ds.cp));
            const int a2a = hcp[0];
            if (d.heads % (ds.tp * a2a) != 0 || d.groups % (ds.tp * a2a) != 0)
                return bad("cp_comm_type=a2a+p2p scatters the heads over the hcp-a2a group: num_attention_heads=" +
                           std::to_string(d.heads) + " and num_query_groups=" + std::to_string(d.groups) +
                           " must be divisible by tensor_model_parallel_size x hierarchical_context_parallel_sizes[0] "
                           "= " + std::to_string(ds.tp * a2a) + "; use a smaller a2a size or p2p");
        }
        if (c.cp_comm_type == "a2a" && (d.heads % (ds.tp * ds.cp) != 0 || d.groups % (ds.tp * ds.cp) != 0))
            return bad("cp_comm_type=a2a scatters the heads over the CP ranks: num_attention_heads=" +
                       std::to_string(d.heads) + " and num_query_groups=" + std::to_string(d.groups) +
                       " must be divisible by tensor_model_parallel_size x context_parallel_size = " +
                       std::to_string(ds.tp * ds.cp) + "; use p2p or all_gather otherwise");
        if (c.seq_length % (2 * ds.cp) != 0)
            return bad("seq_length=" + std::to_string(c.seq_length) + " must be divisible by 2 x context_parallel_size");
    }
    if (c.num_moe_experts > 0) {
        // What this engine's MoE block runs (engine/model/gpt_moe.cpp); the rest is refused by name.
        auto notYet = [](const std::string& what) {
            return Status::unsupported("MoE: " + what + " is not executed by the engine yet");
        };
        if (ds.tp > 1 && !c.sequence_parallel)
            return bad("MoE with tensor_model_parallel_size > 1 needs sequence_parallel: true (as Megatron-LM)");
        const int moeFfn = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : d.ffn;
        if (ds.etp > 1 && moeFfn % ds.etp != 0)
            return bad("expert_tensor_parallel_size=" + std::to_string(ds.etp) + " must divide the experts' hidden size (" +
                       (c.moe_ffn_hidden_size > 0 ? "moe_ffn_hidden_size" : "ffn_hidden_size") + "=" +
                       std::to_string(moeFfn) + ")");
        // Expert biases (add_bias_linear): what Megatron itself asserts against them.
        if (c.add_bias_linear) {
            if (ds.etp > 1)
                return bad("add_bias_linear with MoE needs expert_tensor_parallel_size 1 (Megatron's TransformerConfig: "
                           "bias in MoE is only supported when ETP==1); set expert_tensor_parallel_size: 1 or "
                           "add_bias_linear: false");
            if (c.moe_shared_expert_intermediate_size > 0)
                return bad("add_bias_linear with shared experts (moe_shared_expert_intermediate_size > 0): Megatron's "
                           "SharedExpertMLP asserts add_bias_linear=False; set add_bias_linear: false");
            if (c.moe_grouped_gemm && c.bias_dropout_fusion)
                return bad("add_bias_linear with moe_grouped_gemm needs bias_dropout_fusion: false (Megatron's "
                           "TEGroupedMLP asserts it)");
        }
        // Shared experts (gpt_layer.cpp / gpt_mlp.cpp): a dense MLP TP-sharded like the dense one.
        if (c.moe_shared_expert_intermediate_size % ds.tp != 0)
            return bad("tensor_model_parallel_size=" + std::to_string(ds.tp) + " must divide "
                       "moe_shared_expert_intermediate_size=" + std::to_string(c.moe_shared_expert_intermediate_size));
        // moe_router_load_balancing_type: one type, or Megatron's list of aux-loss types with a list of
        // coefficients (TopKRouter.get_aux_loss_coeff; TransformerConfig asserts the lengths match).
        const auto& lb = c.moe_router_load_balancing_type;
        const std::string lbText = moeLoadBalancingText(c);
        for (const std::string& t : lb.items)
            if (t != "aux_loss" && t != "seq_aux_loss" && t != "global_aux_loss" && t != "sinkhorn" &&
                t != "quantile_balancing" && t != "none")
                return bad("moe_router_load_balancing_type=" + t + " is not one of aux_loss, seq_aux_loss, "
                           "global_aux_loss, sinkhorn, quantile_balancing, none");
        if (lb.isList() != c.moe_aux_loss_coeff.isList() || lb.items.size() != c.moe_aux_loss_coeff.items.size())
            return bad("moe_aux_loss_coeff must be a list of the same length as moe_router_load_balancing_type=" +
                       lbText + " (one coefficient per type; a single type takes a single coefficient)");
        if (lb.isList())
            for (size_t i = 0; i < lb.items.size(); ++i) {
                const std::string& t = lb.items[i];
                // Megatron's router runs sinkhorn / quantile_balancing only as the single type.
                if (t == "sinkhorn" || t == "quantile_balancing")
                    return bad(t + " in the list moe_router_load_balancing_type=" + lbText + ": a list holds "
                               "aux-loss types only (aux_loss, seq_aux_loss, global_aux_loss, none); give " + t +
                               " alone with moe_aux_loss_coeff 0");
                for (size_t j = 0; j < i; ++j)
                    if (lb.items[j] == t && t != "none")
                        return bad(t + " appears twice in moe_router_load_balancing_type=" + lbText);
            }
        // global_aux_loss: the counts of the step's microbatches accumulate in forward order; a full
        // recompute reruns the forwards in backward order (Megatron counts only the recompute's).
        if (lb.contains("global_aux_loss") && c.recompute_granularity == "full")
            return notYet("moe_router_load_balancing_type=global_aux_loss with recompute_granularity=full; use "
                          "selective or no recompute, or aux_loss");
        if (lb == "quantile_balancing") {
            // What TopKRouter.__init__ / quantile_balancing and qb_dual_update assert.
            if (c.moe_aux_loss_coeff != 0)
                return bad("moe_router_load_balancing_type=quantile_balancing needs moe_aux_loss_coeff 0 (Megatron: "
                           "quantile balancing handles load balance via the bias update; aux losses must be disabled)");
            if (c.moe_router_num_groups > 0 || c.moe_router_group_topk > 0)
                return bad("moe_router_load_balancing_type=quantile_balancing does not support group-limited "
                           "routing; set moe_router_num_groups and moe_router_group_topk to 0");
            if (c.moe_router_topk >= c.num_moe_experts)
                return bad("moe_router_load_balancing_type=quantile_balancing needs moe_router_topk < "
                           "num_moe_experts (it reads each token's (topk+1)-th score)");
            // The tokens the quantile sees: the microbatch's (logits gathered over tp-cp).
            const int64_t routed = int64_t(c.micro_batch_size) * c.seq_length * c.moe_router_topk;
            if (routed % c.num_moe_experts != 0)
                return bad("moe_router_load_balancing_type=quantile_balancing needs the routed slots of a microbatch, "
                           "micro_batch_size*seq_length*moe_router_topk=" + std::to_string(routed) +
                           ", divisible by num_moe_experts=" + std::to_string(c.num_moe_experts) +
                           "; change micro_batch_size, seq_length or moe_router_topk");
            if (c.moe_expert_capacity_factor > 0)
                return bad("moe_router_load_balancing_type=quantile_balancing with moe_expert_capacity_factor: Megatron "
                           "drops tokens only with aux_loss, seq_aux_loss, global_aux_loss or none; unset the capacity");
        }
        if (c.moe_router_dtype == "fp64")
            return notYet("moe_router_dtype=fp64 (the router runs in fp32); use fp32 or leave it unset");
        // What Megatron's TransformerConfig and TopKRouter assert (config_rules.cpp says the same).
        if (lb == "sinkhorn" && c.moe_aux_loss_coeff != 0)
            return bad("moe_router_load_balancing_type=sinkhorn needs moe_aux_loss_coeff 0 (Megatron: sinkhorn routing "
                       "does not support aux loss)");
        if (c.moe_router_enable_expert_bias && c.moe_router_score_function == "softmax")
            return bad("moe_router_enable_expert_bias needs moe_router_score_function sigmoid or sqrtsoftplus");
        if (c.moe_router_group_topk > 0 || c.moe_router_num_groups > 0) {
            const int G = c.moe_router_num_groups, gk = c.moe_router_group_topk;
            if (G <= 0 || gk <= 0)
                return bad("group-limited routing needs both moe_router_num_groups and moe_router_group_topk");
            if (c.num_moe_experts % G != 0)
                return bad("moe_router_num_groups=" + std::to_string(G) + " must divide num_moe_experts=" +
                           std::to_string(c.num_moe_experts));
            if (gk > G) return bad("moe_router_group_topk must be <= moe_router_num_groups");
            if (c.moe_router_topk > gk * (c.num_moe_experts / G))
                return bad("moe_router_topk=" + std::to_string(c.moe_router_topk) + " exceeds the experts of " +
                           std::to_string(gk) + " groups (moe_router_group_topk x num_moe_experts / moe_router_num_groups)");
        }
        // FP8 experts with current scaling (fp8_recipe=tensorwise) run on every layout with
        // Transformer Engine's semantics: an expert GEMM's scale comes from the rows (and the weight
        // shard) it has on the rank — TE's GroupedLinear reduces no amax — so where those are not
        // one microbatch's rows and the whole weight the scales depend on the layout
        // (configWarnings in config_rules.cpp says when; docs/engine.md says where).
        if (c.moe_router_topk < 1 || c.moe_router_topk > c.num_moe_experts)
            return bad("moe_router_topk must be in [1, num_moe_experts]");
        // The router's kernels keep a token's k best (and a token's group scores) in registers
        // (kernels/cuda/moe_route.cu); real routers take 1 to 22 experts and 8 groups at most.
        if (c.moe_router_topk > 64)
            return bad("moe_router_topk=" + std::to_string(c.moe_router_topk) +
                       " exceeds 64, the most experts per token the router's kernels support");
        if (c.moe_router_num_groups > 64)
            return bad("moe_router_num_groups=" + std::to_string(c.moe_router_num_groups) +
                       " exceeds 64, the most groups the router's kernels support");
    }
    if (c.attention_dropout < 0.0 || c.attention_dropout >= 1.0)
        return bad("attention_dropout must be in [0, 1)");
    if (c.hidden_dropout < 0.0 || c.hidden_dropout >= 1.0)
        return bad("hidden_dropout must be in [0, 1)");
    const int tp = ds.tp;
    if (d.heads % tp != 0 || d.groups % tp != 0)
        return bad("tensor_model_parallel_size=" + std::to_string(tp) +
                   " must divide num_attention_heads and num_query_groups");
    if (d.ffn % tp != 0) return bad("tensor_model_parallel_size must divide ffn_hidden_size");
    if (int64_t(d.seq) * d.microBatch > (int64_t(1) << 30))
        return bad("seq_length * micro_batch_size is too large");
    if (!c.fp8.empty()) {
        TS_RETURN_IF_ERROR(Fp8Recipe::fromConfig(c).status());
        if (c.fp8_recipe == "mxfp8" || c.fp8_recipe == "blockwise") {
            // Block recipes quantize along each GEMM's reduction dimension: a tensor-parallel shard
            // must hold whole blocks (else its blocks are not the single device's). Context parallel
            // runs with TE's semantics: the wgrad's blocks along the tokens are the CP-local
            // tensor's (equal to the single device's where a chunk's rows are whole blocks;
            // configWarnings in config_rules.cpp says when they are not). MoE experts
            // (gpt_moe.cpp): the same rule for an expert-tensor-parallel shard of fc1's rows / fc2's
            // columns (moe_ffn_hidden_size / etp), and for the shared experts' TP shards.
            const int blk = c.fp8_recipe == "mxfp8" ? 32 : 128;
            auto whole = [&](const char* what, int64_t n, int parts, const char* knob) -> Status {
                if ((n / parts) % blk == 0) return Status::ok();
                return bad("fp8_recipe=" + c.fp8_recipe + " quantizes blocks of " + std::to_string(blk) +
                           " along each GEMM's reduction dimension: " + what + " / " + knob + " = " +
                           std::to_string(n / parts) + " must be a multiple of " + std::to_string(blk) + " (or use " +
                           knob + " 1 or fp8_recipe=delayed)");
            };
            if (c.num_moe_experts > 0 && ds.etp > 1) {
                const int moeFfn = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : d.ffn;
                TS_RETURN_IF_ERROR(whole(c.moe_ffn_hidden_size > 0 ? "moe_ffn_hidden_size" : "ffn_hidden_size (the experts')",
                                         moeFfn, ds.etp, "expert_tensor_parallel_size"));
            }
            if (c.num_moe_experts > 0 && tp > 1 && c.moe_shared_expert_intermediate_size > 0)
                TS_RETURN_IF_ERROR(whole("moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size, tp,
                                         "tensor_model_parallel_size"));
            if (tp > 1) {
                const int64_t qkvOut = int64_t(d.heads + 2 * d.groups) * d.headDim;
                for (auto [what, n] : {std::pair<const char*, int64_t>{"num_attention_heads x kv_channels", int64_t(d.heads) * d.headDim},
                                       {"(num_attention_heads + 2 x num_query_groups) x kv_channels", qkvOut},
                                       {"ffn_hidden_size", d.ffn}})
                    if ((n / tp) % blk != 0)
                        return bad("fp8_recipe=" + c.fp8_recipe + " quantizes blocks of " + std::to_string(blk) +
                                   " along each GEMM's reduction dimension: " + what + " / tensor_model_parallel_size = " +
                                   std::to_string(n / tp) + " must be a multiple of " + std::to_string(blk) +
                                   " (or use tensor_model_parallel_size 1 or fp8_recipe=delayed)");
            }
        }
    }
    return d;
}

ModelOptions modelOptionsFromConfig(const Config& c) {
    ModelOptions o;
    o.fusedSoftmax = c.masked_softmax_fusion;
    o.flashAttention = attentionIsFlash(c.attention_backend);
    o.fusedBiasAct = c.bias_activation_fusion;
    o.fusedBiasDropout = c.bias_dropout_fusion;
    o.fusedRope = c.apply_rope_fusion;
    o.fusedCrossEntropy = c.cross_entropy_loss_fusion;
    o.gradAccumFusion = c.gradient_accumulation_fusion;
    o.fusedLayerNorm = c.persist_layer_norm;
    o.bf16 = c.bf16;
    o.hiddenDropout = float(c.hidden_dropout);
    o.attentionDropout = float(c.attention_dropout);
    o.initStd = float(c.init_method_std);
    o.seed = uint64_t(int64_t(c.seed));
    o.recomputeGranularity = c.recompute_granularity;
    o.recomputeMethod = c.recompute_method;
    o.recomputeNumLayers = c.recompute_num_layers;
    if (auto r = Fp8Recipe::fromConfig(c); r.isOk()) o.fp8 = *r;  // modelDimsFromConfig reports the error
    o.bf16SavedPacked = c.bf16 && !bf16SavedInFp32Words();
    return o;
}

bool bf16SavedInFp32Words() {
    const char* v = std::getenv("TS_BF16_SAVED_FP32");
    return v && *v && std::string(v) != "0";
}

std::vector<int> cpLocalPositions(int seq, int cp, int rank) {
    const int chunk = seq / (2 * cp);
    std::vector<int> pos;
    for (int c : {rank, 2 * cp - 1 - rank})
        for (int i = 0; i < chunk; ++i) pos.push_back(c * chunk + i);
    return pos;
}

}  // namespace ts::engine
