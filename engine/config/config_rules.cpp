// Cross-knob rules of a config (Megatron's validate_args and our engine's limits). Each rule
// names the knobs, the values, the rule and the fix.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/config/knobs.h"

namespace ts::engine {

namespace {

struct Checker {
    std::vector<ConfigIssue> issues;
    void add(const std::string& knob, const std::string& msg) { issues.push_back({"", 0, knob, msg}); }
};

std::string kv(const char* name, long long v) { return std::string(name) + "=" + std::to_string(v); }

}  // namespace

std::vector<ConfigIssue> validateConfig(const Config& c) {
    Checker ck;
    const DerivedSizes d = deriveSizes(c);

    // Ranges.
    auto positive = [&](const char* name, long long v) {
        if (v <= 0) ck.add(name, kv(name, v) + " must be > 0");
    };
    auto nonNegative = [&](const char* name, long long v) {
        if (v < 0) ck.add(name, kv(name, v) + " must be >= 0 (0 means derived/default)");
    };
    positive("num_layers", c.num_layers);
    positive("hidden_size", c.hidden_size);
    positive("num_attention_heads", c.num_attention_heads);
    positive("seq_length", c.seq_length);
    positive("vocab_size", c.vocab_size);
    positive("micro_batch_size", c.micro_batch_size);
    positive("make_vocab_size_divisible_by", c.make_vocab_size_divisible_by);
    positive("tensor_model_parallel_size", c.tensor_model_parallel_size);
    positive("pipeline_model_parallel_size", c.pipeline_model_parallel_size);
    positive("virtual_pipeline_model_parallel_size", c.virtual_pipeline_model_parallel_size);
    positive("context_parallel_size", c.context_parallel_size);
    positive("expert_model_parallel_size", c.expert_model_parallel_size);
    nonNegative("world_size", c.world_size);
    nonNegative("data_parallel_size", c.data_parallel_size);
    nonNegative("global_batch_size", c.global_batch_size);
    nonNegative("num_microbatches", c.num_microbatches);
    nonNegative("ffn_hidden_size", c.ffn_hidden_size);
    nonNegative("num_query_groups", c.num_query_groups);
    nonNegative("kv_channels", c.kv_channels);
    nonNegative("train_iters", c.train_iters);
    nonNegative("bucket_size", c.bucket_size);
    nonNegative("recompute_num_layers", c.recompute_num_layers);
    nonNegative("num_moe_experts", c.num_moe_experts);
    nonNegative("cpu_threads", c.cpu_threads);
    nonNegative("save_interval", c.save_interval);
    nonNegative("lr_warmup_iters", c.lr_warmup_iters);
    nonNegative("num_layers_per_virtual_pipeline_stage", c.num_layers_per_virtual_pipeline_stage);
    nonNegative("decoder_first_pipeline_num_layers", c.decoder_first_pipeline_num_layers);
    nonNegative("decoder_last_pipeline_num_layers", c.decoder_last_pipeline_num_layers);
    nonNegative("cpu_offloading_num_layers", c.cpu_offloading_num_layers);
    nonNegative("moe_shared_expert_intermediate_size", c.moe_shared_expert_intermediate_size);
    if (c.lr < 0) ck.add("lr", "lr=" + std::to_string(c.lr) + " must be >= 0");
    if (c.clip_grad < 0) ck.add("clip_grad", "clip_grad must be >= 0 (0 disables clipping)");
    if (c.weight_decay < 0) ck.add("weight_decay", "weight_decay must be >= 0");
    if (c.norm_epsilon <= 0) ck.add("norm_epsilon", "norm_epsilon must be > 0");
    if (c.init_method_std <= 0) ck.add("init_method_std", "init_method_std must be > 0");
    if (c.adam_beta1 < 0 || c.adam_beta1 >= 1) ck.add("adam_beta1", "adam_beta1 must be in [0, 1)");
    if (c.adam_beta2 < 0 || c.adam_beta2 >= 1) ck.add("adam_beta2", "adam_beta2 must be in [0, 1)");
    if (c.adam_eps <= 0) ck.add("adam_eps", "adam_eps must be > 0");
    if (c.hidden_dropout < 0 || c.hidden_dropout >= 1) ck.add("hidden_dropout", "hidden_dropout must be in [0, 1)");
    if (c.attention_dropout < 0 || c.attention_dropout >= 1)
        ck.add("attention_dropout", "attention_dropout must be in [0, 1)");
    if (!ck.issues.empty()) return ck.issues;  // the rules below divide by these

    const int tp = d.tp, pp = d.pp, vpp = d.vpp, cp = d.cp;
    const int heads = c.num_attention_heads;
    const int groups = d.num_query_groups;

    // Model shape.
    if (c.kv_channels == 0 && c.hidden_size % heads != 0)
        ck.add("hidden_size", kv("hidden_size", c.hidden_size) + " is not divisible by " +
                                  kv("num_attention_heads", heads) + "; change one of them or set kv_channels");
    if (heads % groups != 0)
        ck.add("num_query_groups", kv("num_query_groups", groups) + " does not divide " +
                                       kv("num_attention_heads", heads) + "; choose a divisor of the head count");
    if (c.rotary_base <= 0 || c.rotary_base != double(int64_t(c.rotary_base)) || c.rotary_base > 2147483647.0)
        ck.add("rotary_base", "rotary_base must be a positive integer (Megatron-LM's --rotary-base is an int)");
    if (c.ffn_hidden_size == 0 && d.ffn_hidden_size <= 0)
        ck.add("ffn_hidden_size", "swiglu with hidden_size=" + std::to_string(c.hidden_size) +
                                      " derives ffn_hidden_size = int(4*h*2/3/64)*64 = 0; set ffn_hidden_size");
    if (c.position_embedding_type == "rope" && d.kv_channels % 2 != 0)
        ck.add("kv_channels", "rope needs an even head dimension, got " + std::to_string(d.kv_channels));

    // Tensor parallel.
    if (heads % tp != 0)
        ck.add("tensor_model_parallel_size", kv("tensor_model_parallel_size", tp) + " does not divide " +
                                                 kv("num_attention_heads", heads) + "; use a divisor of the head count");
    else if (groups % tp != 0)
        ck.add("tensor_model_parallel_size", kv("tensor_model_parallel_size", tp) + " does not divide " +
                                                 kv("num_query_groups", groups) +
                                                 "; each TP rank needs whole key/value groups");
    if (d.ffn_hidden_size % tp != 0)
        ck.add("ffn_hidden_size", kv("ffn_hidden_size", d.ffn_hidden_size) + " is not divisible by " +
                                      kv("tensor_model_parallel_size", tp));
    if (c.sequence_parallel && tp == 1)
        ck.add("sequence_parallel", "sequence_parallel needs tensor_model_parallel_size > 1 (it shards the TP "
                                    "region's activations); remove it or raise tensor_model_parallel_size");
    if (c.sequence_parallel && c.seq_length % tp != 0)
        ck.add("seq_length", kv("seq_length", c.seq_length) + " is not divisible by " +
                                 kv("tensor_model_parallel_size", tp) + ", which sequence_parallel requires");
    if (c.tp_comm_overlap && !c.sequence_parallel)
        ck.add("tp_comm_overlap", "tp_comm_overlap requires sequence_parallel (the overlapped collectives are "
                                  "all-gather/reduce-scatter); set sequence_parallel: true");

    // World and data parallel.
    const int mp = tp * cp * pp;
    if (c.world_size > 0 && c.world_size % mp != 0)
        ck.add("world_size", kv("world_size", c.world_size) + " is not a multiple of tp*cp*pp = " +
                                 std::to_string(tp) + "*" + std::to_string(cp) + "*" + std::to_string(pp) + " = " +
                                 std::to_string(mp));
    if (c.world_size > 0 && c.data_parallel_size > 0 && c.world_size != mp * c.data_parallel_size)
        ck.add("data_parallel_size", kv("world_size", c.world_size) + " != tp*cp*pp*data_parallel_size = " +
                                         std::to_string(mp * c.data_parallel_size) + "; set only one of them");

    // Context parallel.
    if (cp > 1 && c.seq_length % (2 * cp) != 0)
        ck.add("context_parallel_size", kv("seq_length", c.seq_length) + " must be divisible by 2*context_parallel_size = " +
                                            std::to_string(2 * cp) + " (load-balanced chunks)");
    // Hierarchical CP (Megatron's validate_args): the sub-group sizes multiply to the CP size, and
    // a2a+p2p needs them.
    const std::vector<int>& hcp = c.hierarchical_context_parallel_sizes;
    if (!hcp.empty()) {
        long long prod = 1;
        std::string list;
        for (int x : hcp) {
            prod *= x;
            list += (list.empty() ? "" : ", ") + std::to_string(x);
        }
        if (prod != cp)
            ck.add("hierarchical_context_parallel_sizes",
                   "hierarchical_context_parallel_sizes=[" + list + "] multiplies to " + std::to_string(prod) +
                       ", not context_parallel_size=" + std::to_string(cp));
    }
    if (c.cp_comm_type == "a2a+p2p" && hcp.empty())
        ck.add("hierarchical_context_parallel_sizes",
               "cp_comm_type=a2a+p2p needs hierarchical_context_parallel_sizes: [a2a size, p2p size] (product = "
               "context_parallel_size=" + std::to_string(cp) + ", e.g. [2, " + std::to_string(std::max(1, cp / 2)) +
                   "])");

    // Batch.
    if (c.global_batch_size > 0 && c.global_batch_size % (c.micro_batch_size * d.dp) != 0)
        ck.add("global_batch_size", kv("global_batch_size", c.global_batch_size) +
                                        " is not divisible by micro_batch_size*data_parallel_size = " +
                                        std::to_string(c.micro_batch_size * d.dp));
    if (c.global_batch_size > 0 && c.num_microbatches > 0 &&
        c.global_batch_size != c.micro_batch_size * d.dp * c.num_microbatches)
        ck.add("num_microbatches", kv("num_microbatches", c.num_microbatches) + " disagrees with global_batch_size/"
                                       "(micro_batch_size*data_parallel_size) = " +
                                       std::to_string(c.global_batch_size / (c.micro_batch_size * d.dp)) +
                                       "; set only one of them");

    // Pipeline.
    if (c.num_layers % pp != 0)
        ck.add("pipeline_model_parallel_size", kv("num_layers", c.num_layers) + " is not divisible by " +
                                                   kv("pipeline_model_parallel_size", pp));
    else if (c.num_layers % (pp * vpp) != 0)
        ck.add("virtual_pipeline_model_parallel_size",
               kv("num_layers", c.num_layers) + " is not divisible by pipeline_model_parallel_size*"
                                                "virtual_pipeline_model_parallel_size = " + std::to_string(pp * vpp));
    if (vpp > 1) {
        if (pp == 1)
            ck.add("virtual_pipeline_model_parallel_size",
                   "interleaving (virtual_pipeline_model_parallel_size > 1) needs pipeline_model_parallel_size > 1");
        else if (pp == 2 && !c.overlap_p2p_comm)
            ck.add("virtual_pipeline_model_parallel_size",
                   "interleaving with pipeline_model_parallel_size=2 requires overlap_p2p_comm (Megatron: "
                   "\"pipeline-model-parallel size should be greater than 2 with interleaved schedule\")");
        if (d.num_microbatches % pp != 0)
            ck.add("num_microbatches", "the interleaved schedule requires num_microbatches (" +
                                           std::to_string(d.num_microbatches) + ") % pipeline_model_parallel_size (" +
                                           std::to_string(pp) + ") == 0; adjust global_batch_size or num_microbatches");
    }
    if (c.num_layers_per_virtual_pipeline_stage > 0) {
        if (vpp > 1)
            ck.add("num_layers_per_virtual_pipeline_stage",
                   "set either num_layers_per_virtual_pipeline_stage or virtual_pipeline_model_parallel_size, not both");
        else if (c.num_layers % (pp * c.num_layers_per_virtual_pipeline_stage) != 0)
            ck.add("num_layers_per_virtual_pipeline_stage",
                   kv("num_layers", c.num_layers) + " is not divisible by pipeline_model_parallel_size*"
                   "num_layers_per_virtual_pipeline_stage = " + std::to_string(pp * c.num_layers_per_virtual_pipeline_stage));
    }
    if (c.decoder_first_pipeline_num_layers > 0 || c.decoder_last_pipeline_num_layers > 0) {
        const int set = (c.decoder_first_pipeline_num_layers > 0) + (c.decoder_last_pipeline_num_layers > 0);
        const int rest = c.num_layers - c.decoder_first_pipeline_num_layers - c.decoder_last_pipeline_num_layers;
        if (pp <= set)
            ck.add("decoder_first_pipeline_num_layers",
                   "decoder_first/last_pipeline_num_layers need more pipeline stages than the stages they fix (" +
                   kv("pipeline_model_parallel_size", pp) + ")");
        else if (rest <= 0 || rest % (pp - set) != 0)
            ck.add("decoder_first_pipeline_num_layers",
                   "the " + std::to_string(rest) + " layers left after decoder_first/last_pipeline_num_layers do not "
                   "split evenly over the other " + std::to_string(pp - set) + " pipeline stages");
    }

    // Data-parallel communication.
    if (c.overlap_param_gather && !c.use_distributed_optimizer)
        ck.add("overlap_param_gather", "overlap_param_gather requires use_distributed_optimizer: true");
    if (c.overlap_param_gather && !c.overlap_grad_reduce)
        ck.add("overlap_param_gather", "overlap_param_gather requires overlap_grad_reduce: true");

    if (c.overlap_param_gather_with_optimizer_step && !c.overlap_param_gather)
        ck.add("overlap_param_gather_with_optimizer_step",
               "overlap_param_gather_with_optimizer_step requires overlap_param_gather: true");
    if (c.overlap_param_gather_with_optimizer_step && vpp <= 1)
        ck.add("overlap_param_gather_with_optimizer_step",
               "overlap_param_gather_with_optimizer_step needs the interleaved schedule "
               "(virtual_pipeline_model_parallel_size > 1), as Megatron-LM asserts");
    if (c.num_distributed_optimizer_instances < 1)
        ck.add("num_distributed_optimizer_instances", "num_distributed_optimizer_instances must be >= 1");
    else if (c.num_distributed_optimizer_instances > 1) {
        if (!c.use_distributed_optimizer)
            ck.add("num_distributed_optimizer_instances",
                   "num_distributed_optimizer_instances > 1 requires use_distributed_optimizer: true");
        if (d.dp % c.num_distributed_optimizer_instances != 0)
            ck.add("num_distributed_optimizer_instances",
                   kv("num_distributed_optimizer_instances", c.num_distributed_optimizer_instances) +
                   " does not divide the data-parallel size " + std::to_string(d.dp));
    }
    if (!c.use_precision_aware_optimizer) {
        for (const auto& [name, value] : {std::pair<const char*, const std::string*>{"main_grads_dtype", &c.main_grads_dtype},
                                          {"exp_avg_dtype", &c.exp_avg_dtype},
                                          {"exp_avg_sq_dtype", &c.exp_avg_sq_dtype}})
            if (*value != "fp32")
                ck.add(name, std::string(name) + "=" + *value + " needs use_precision_aware_optimizer: true");
    }

    // Precision.
    if (!c.fp8.empty() && !c.bf16)
        ck.add("fp8", "fp8 runs FP8 GEMMs inside a bf16 model; set bf16: true");
    if (c.fp8_amax_history_len < 1) ck.add("fp8_amax_history_len", "fp8_amax_history_len must be >= 1");

    // Recompute.
    if (c.recompute_granularity == "full") {
        if (c.recompute_method.empty())
            ck.add("recompute_method", "recompute_granularity=full needs recompute_method: uniform or block");
        if (c.recompute_num_layers <= 0)
            ck.add("recompute_num_layers", "recompute_granularity=full needs recompute_num_layers > 0");
        else if (c.recompute_method == "block" && c.num_layers % (pp * vpp) == 0 &&
                 c.recompute_num_layers > c.num_layers / (pp * vpp))
            ck.add("recompute_num_layers", kv("recompute_num_layers", c.recompute_num_layers) +
                                               " exceeds the layers per pipeline stage chunk (" +
                                               std::to_string(c.num_layers / (pp * vpp)) + ")");
    } else if (!c.recompute_method.empty()) {
        ck.add("recompute_method", "recompute_method applies only with recompute_granularity: full");
    }
    if (c.recompute_activations && c.recompute_granularity == "full")
        ck.add("recompute_activations", "recompute_activations means selective recompute; it conflicts with "
                                        "recompute_granularity: full");
    if (c.cpu_offloading != (c.cpu_offloading_num_layers > 0))
        ck.add("cpu_offloading", "cpu_offloading and cpu_offloading_num_layers > 0 go together (Megatron-LM turns "
                                 "offloading on exactly when cpu_offloading_num_layers > 0)");

    // MoE.
    if (d.ep > 1 && c.num_moe_experts == 0)
        ck.add("expert_model_parallel_size", "expert_model_parallel_size > 1 needs num_moe_experts > 0");
    if (c.num_moe_experts > 0) {
        if (c.num_moe_experts % d.ep != 0)
            ck.add("num_moe_experts", kv("num_moe_experts", c.num_moe_experts) + " is not divisible by " +
                                          kv("expert_model_parallel_size", d.ep));
        if (c.moe_router_topk < 1 || c.moe_router_topk > c.num_moe_experts)
            ck.add("moe_router_topk", kv("moe_router_topk", c.moe_router_topk) + " must be in [1, num_moe_experts]");
    } else if (c.moe_grouped_gemm) {
        ck.add("moe_grouped_gemm", "moe_grouped_gemm needs num_moe_experts > 0");
    }

    if (c.moe_expert_capacity_factor < 0)
        ck.add("moe_expert_capacity_factor", "moe_expert_capacity_factor must be >= 0 (0 = dropless)");
    if (c.moe_z_loss_coeff < 0) ck.add("moe_z_loss_coeff", "moe_z_loss_coeff must be >= 0 (0 = no z-loss)");
    if (c.moe_pad_expert_input_to_capacity && c.moe_expert_capacity_factor <= 0)
        ck.add("moe_pad_expert_input_to_capacity",
               "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor (an expert capacity to pad to)");
    if (std::string err; moeLayerPattern(c.moe_layer_freq, c.num_layers, &err).empty())
        ck.add("moe_layer_freq", "moe_layer_freq=" + c.moe_layer_freq + ": " + err);
    else if (const std::vector<int> moePattern = moeLayerPattern(c);
             c.num_moe_experts > 0 && std::count(moePattern.begin(), moePattern.end(), 1) == 0)
        ck.add("moe_layer_freq", "moe_layer_freq=" + c.moe_layer_freq +
                                     " makes no layer MoE; put a 1 in the list or set num_moe_experts: 0");
    if (c.moe_shared_expert_overlap && c.moe_shared_expert_intermediate_size <= 0)
        ck.add("moe_shared_expert_overlap", "moe_shared_expert_overlap needs moe_shared_expert_intermediate_size > 0");
    // Megatron-Core TransformerConfig.__post_init__ checks.
    if (c.num_moe_experts > 0 && c.moe_shared_expert_overlap && c.moe_token_dispatcher_type == "allgather")
        ck.add("moe_shared_expert_overlap", "moe_shared_expert_overlap works only with moe_token_dispatcher_type "
                                            "alltoall or flex");
    if (c.num_moe_experts > 0 && c.moe_token_dispatcher_type == "flex") {
        // MoEFlexTokenDispatcher: one communication group over expert TP x EP (its DeepEP backend,
        // Megatron's default, asserts TPxEP > 1 and refuses padding to capacity).
        if (d.etp * d.ep <= 1)
            ck.add("moe_token_dispatcher_type", "moe_token_dispatcher_type=flex needs expert_model_parallel_size x "
                                                "expert_tensor_parallel_size > 1 (Megatron's DeepEP dispatcher "
                                                "asserts it); use alltoall or allgather on one expert rank");
        if (c.moe_pad_expert_input_to_capacity)
            ck.add("moe_pad_expert_input_to_capacity", "the flex dispatcher (DeepEP backend) does not support "
                                                       "moe_pad_expert_input_to_capacity; use alltoall or allgather");
    }
    if (c.num_moe_experts > 0 && c.add_bias_linear) {
        // Expert biases: Megatron's TransformerConfig, SharedExpertMLP and TEGroupedMLP asserts.
        if (d.etp > 1)
            ck.add("add_bias_linear", "add_bias_linear with MoE needs expert_tensor_parallel_size 1 (Megatron: bias in "
                                      "MoE is only supported when ETP==1)");
        if (c.moe_shared_expert_intermediate_size > 0)
            ck.add("add_bias_linear", "add_bias_linear is not supported with shared experts "
                                      "(moe_shared_expert_intermediate_size > 0)");
        if (c.moe_grouped_gemm && c.bias_dropout_fusion)
            ck.add("bias_dropout_fusion", "add_bias_linear with moe_grouped_gemm needs bias_dropout_fusion: false "
                                          "(Megatron's TEGroupedMLP asserts it)");
    }
    if (c.num_moe_experts > 0) {
        // Router checks of Megatron-Core's TransformerConfig.__post_init__ and TopKRouter.
        const auto& lb = c.moe_router_load_balancing_type;
        const std::string lbText = moeLoadBalancingText(c);
        // Megatron's list form (TransformerConfig.__post_init__, TopKRouter): a coefficient per type.
        if (lb.isList() != c.moe_aux_loss_coeff.isList() ||
            lb.items.size() != c.moe_aux_loss_coeff.items.size())
            ck.add("moe_aux_loss_coeff", lb.isList() ? "moe_aux_loss_coeff must be a list of the same length as "
                                                       "moe_router_load_balancing_type=" + lbText
                                                     : "a list of moe_aux_loss_coeff needs a list of "
                                                       "moe_router_load_balancing_type of the same length");
        if (lb.isList()) {
            for (size_t i = 0; i < lb.items.size(); ++i) {
                const std::string& t = lb.items[i];
                if (t == "sinkhorn" || t == "quantile_balancing")
                    ck.add("moe_router_load_balancing_type",
                           t + " cannot be in the list form of moe_router_load_balancing_type (Megatron's list holds "
                               "aux-loss types: aux_loss, seq_aux_loss, global_aux_loss, none); give it alone");
                for (size_t j = 0; j < i; ++j)
                    if (lb.items[j] == t && t != "none")
                        ck.add("moe_router_load_balancing_type", t + " appears twice in moe_router_load_balancing_type=" +
                                                                     lbText + " (Megatron reads the first one's coefficient)");
            }
        }
        for (double x : c.moe_aux_loss_coeff.items)
            if (!(x >= 0)) ck.add("moe_aux_loss_coeff", "moe_aux_loss_coeff must be >= 0");
        if (c.moe_router_topk == 1 && c.moe_router_score_function == "softmax" && !c.moe_router_pre_softmax &&
            lb != "sinkhorn")
            ck.add("moe_router_pre_softmax", "moe_router_topk 1 with the softmax score function needs "
                                             "moe_router_pre_softmax (a softmax over one chosen expert has no "
                                             "gradient)");
        if (c.moe_router_enable_expert_bias && c.moe_router_score_function == "softmax")
            ck.add("moe_router_enable_expert_bias", "moe_router_enable_expert_bias works only with "
                                                    "moe_router_score_function sigmoid or sqrtsoftplus");
        if ((lb == "sinkhorn" || lb == "quantile_balancing") && c.moe_aux_loss_coeff != 0)
            ck.add("moe_aux_loss_coeff", "moe_router_load_balancing_type=" + lbText + " needs moe_aux_loss_coeff 0");
        if (lb == "quantile_balancing") {
            // Megatron's TopKRouter.quantile_balancing and qb_dual_update assert these.
            if (c.moe_router_num_groups > 0 || c.moe_router_group_topk > 0)
                ck.add("moe_router_num_groups", "quantile_balancing does not support group-limited routing; set "
                                                "moe_router_num_groups and moe_router_group_topk to 0");
            if (c.moe_router_topk >= c.num_moe_experts)
                ck.add("moe_router_topk", "quantile_balancing needs moe_router_topk < num_moe_experts (it reads each "
                                          "token's (topk+1)-th score)");
            const int64_t routed = int64_t(c.micro_batch_size) * c.seq_length * c.moe_router_topk;
            if (routed % c.num_moe_experts != 0)
                ck.add("micro_batch_size", "quantile_balancing needs micro_batch_size*seq_length*moe_router_topk (" +
                                               std::to_string(routed) + " routed slots of a microbatch) divisible by " +
                                               kv("num_moe_experts", c.num_moe_experts));
        }
        if (c.moe_router_quantile_balancing_ema < 0 || c.moe_router_quantile_balancing_ema > 1)
            ck.add("moe_router_quantile_balancing_ema", "moe_router_quantile_balancing_ema must be in [0, 1]");
        if (c.moe_router_group_topk > 0 && c.moe_router_num_groups <= 0)
            ck.add("moe_router_num_groups", "group-limited routing (moe_router_group_topk) needs moe_router_num_groups");
        if (c.moe_router_num_groups > 0 && c.moe_router_group_topk <= 0)
            ck.add("moe_router_group_topk", "moe_router_num_groups needs moe_router_group_topk (groups per token)");
        if (c.moe_router_num_groups > 0 && c.num_moe_experts % c.moe_router_num_groups != 0)
            ck.add("moe_router_num_groups", kv("num_moe_experts", c.num_moe_experts) + " is not divisible by " +
                                                kv("moe_router_num_groups", c.moe_router_num_groups));
        if (c.moe_router_group_topk > 0 && c.moe_router_num_groups > 0) {
            if (c.moe_router_group_topk > c.moe_router_num_groups)
                ck.add("moe_router_group_topk", kv("moe_router_group_topk", c.moe_router_group_topk) +
                                                    " must be <= " + kv("moe_router_num_groups", c.moe_router_num_groups));
            else if (c.num_moe_experts % c.moe_router_num_groups == 0 &&
                     c.moe_router_topk > c.moe_router_group_topk * (c.num_moe_experts / c.moe_router_num_groups))
                ck.add("moe_router_topk", kv("moe_router_topk", c.moe_router_topk) +
                                              " exceeds the experts in moe_router_group_topk groups");
        }
        if (c.moe_router_topk_scaling_factor < 0)
            ck.add("moe_router_topk_scaling_factor", "moe_router_topk_scaling_factor must be >= 0 (0 = unset)");
        if (c.moe_router_num_groups < 0 || c.moe_router_group_topk < 0)
            ck.add("moe_router_num_groups", "moe_router_num_groups and moe_router_group_topk must be >= 0 (0 = off)");
    }
    if (c.num_moe_experts > 0 && c.moe_expert_capacity_factor > 0 && (c.moe_router_load_balancing_type.contains("sinkhorn") || c.moe_router_load_balancing_type.contains("quantile_balancing")))
        ck.add("moe_expert_capacity_factor", "moe_expert_capacity_factor works only with aux_loss, seq_aux_loss, "
                                             "global_aux_loss or none load balancing");
    if (c.cpu_offloading) {
        if (c.cpu_offloading_num_layers >= c.num_layers)
            ck.add("cpu_offloading_num_layers", kv("cpu_offloading_num_layers", c.cpu_offloading_num_layers) +
                                                    " must be less than " + kv("num_layers", c.num_layers));
        if (pp > 1) ck.add("cpu_offloading", "cpu_offloading does not work with pipeline parallelism (Megatron-Core)");
        if (!c.recompute_granularity.empty() || c.recompute_activations)
            ck.add("cpu_offloading", "cpu_offloading does not work with activation recompute (Megatron-Core)");
    }

    // Backend.
    if (c.cuda_graph_impl != "none" && c.device_backend != "cuda")
        ck.add("cuda_graph_impl", "cuda_graph_impl=" + c.cuda_graph_impl + " requires device_backend: cuda");
    if (c.cuda_graph_warmup_steps < 0)
        ck.add("cuda_graph_warmup_steps", kv("cuda_graph_warmup_steps", c.cuda_graph_warmup_steps) + " must be >= 0");
    if (c.cuda_share_gpus && c.device_backend != "cuda")
        ck.add("cuda_share_gpus", "cuda_share_gpus: true requires device_backend: cuda (CPU ranks each have their own "
                                  "virtual device already); set device_backend: cuda or drop cuda_share_gpus");
    return ck.issues;
}

std::vector<std::string> configWarnings(const Config& c) {
    std::vector<std::string> out;
    if (!validateConfig(c).empty()) return out;
    if (!c.masked_softmax_fusion && attentionIsFlash(c.attention_backend))
        out.push_back("masked_softmax_fusion=false changes nothing with attention_backend=" + c.attention_backend +
                      ": flash attention always fuses its softmax (as in Megatron, where the flag only reaches the "
                      "unfused attention); set attention_backend: unfused to run the separate scale, mask and softmax "
                      "passes");
    if (c.fp8.empty()) return out;
    const DerivedSizes d = deriveSizes(c);
    const bool moe = c.num_moe_experts > 0;
    // Where an expert's rows on a rank come from (engine/model/gpt_moe.cpp): the local tokens of
    // every rank of its etp-ep group. That group is the tp-cp group of one microbatch exactly when
    // etp x ep = tp x cp (both are the first ranks of the rank order: dense tp-cp-dp-pp, expert
    // etp-ep-edp-pp); tp counts because MoE with TP needs sequence parallelism (each TP rank routes
    // its s/tp tokens).
    const bool oneMicrobatch = d.etp * d.ep == d.tp * d.cp;
    const std::string layout = "tensor_model_parallel_size=" + std::to_string(d.tp) +
                               ", context_parallel_size=" + std::to_string(d.cp) +
                               ", expert_model_parallel_size=" + std::to_string(d.ep) +
                               ", expert_tensor_parallel_size=" + std::to_string(d.etp);
    if (c.fp8_recipe == "tensorwise" && moe && !(d.etp == 1 && oneMicrobatch)) {
        // TE's GroupedLinear reduces no amax: each expert GEMM's scale is that of the rows and the
        // weight shard it has on the rank.
        std::string why = d.etp > 1 ? "each expert's weight, fc2 input and fc1 output gradient are "
                                      "expert_tensor_parallel_size shards, each quantized with its own amax"
                                    : "";
        if (!oneMicrobatch) {
            if (!why.empty()) why += "; ";
            why += d.etp * d.ep < d.tp * d.cp
                       ? "an expert GEMM on a rank sees only this rank's share of a microbatch's tokens"
                       : "an expert GEMM on a rank sees the tokens of several microbatches (its expert-parallel "
                         "group spans data-parallel replicas)";
        }
        out.push_back("fp8_recipe=tensorwise with MoE experts (" + layout + "): " + why +
                      ", so the experts' FP8 scales depend on the layout (Transformer Engine's semantics; the "
                      "single device takes one microbatch's rows and the whole weight): an A/B comparison with "
                      "another layout differs by FP8 rounding in the experts, not only by summation order. "
                      "fp8_recipe=delayed gives every layout the same scales");
    }
    if (c.fp8_recipe == "mxfp8" || c.fp8_recipe == "blockwise") {
        const int blk = c.fp8_recipe == "mxfp8" ? 32 : 128;
        const int64_t chunkRows = d.cp > 1 ? int64_t(c.seq_length / (2 * d.cp)) * c.micro_batch_size : 0;
        if (d.cp > 1 && chunkRows % blk != 0)
            out.push_back("fp8_recipe=" + c.fp8_recipe + " with context_parallel_size=" + std::to_string(d.cp) +
                          ": the weight-gradient GEMMs quantize along the tokens in blocks of " + std::to_string(blk) +
                          " rows of each rank's own [s/cp, b] tokens (Transformer Engine's semantics); a sequence "
                          "chunk has seq_length / (2 x context_parallel_size) x micro_batch_size = " +
                          std::to_string(chunkRows) + " rows, not whole blocks, so these blocks are not the single "
                          "device's and an A/B comparison with another layout differs slightly (power-of-two block "
                          "scales: only values far below their block's amax move)");
        // The experts' wgrad blocks run along the expert's rows on the rank, from its first row;
        // the single device's along one microbatch's rows of the expert in token order. They are
        // those exactly when the etp-ep group is the TP group of one microbatch without CP (TP
        // shards are contiguous in the sequence); otherwise only where each source's rows are
        // whole blocks (routing-dependent).
        if (moe && !(d.cp == 1 && d.etp * d.ep == d.tp))
            out.push_back("fp8_recipe=" + c.fp8_recipe + " with MoE experts (" + layout +
                          "): an expert's weight-gradient GEMM quantizes its rows on the rank along the tokens in "
                          "blocks of " + std::to_string(blk) + " from the expert's first row (Transformer Engine's "
                          "GroupedLinear); here those rows are " +
                          (d.cp > 1 ? std::string("this rank's context-parallel chunks' tokens")
                                    : d.etp * d.ep < d.tp ? std::string("this rank's share of a microbatch's tokens")
                                                          : std::string("several microbatches' tokens")) +
                          ", so the blocks differ from the single device's unless every source's rows are whole "
                          "blocks (slightly: power-of-two block scales move only values far below their block's "
                          "amax)");
    }
    return out;
}

}  // namespace ts::engine
