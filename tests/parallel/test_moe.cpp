// MoE (engine/model/gpt_moe.cpp; REFERENCE.md §5) against references written here: a dense
// model whose MLP every expert copies (the renormalised top-k probs sum to 1, so the MoE layer
// is that MLP), finite differences for the router and expert gradients, the aux loss of
// uniform routing (exactly the coefficient), data/pipeline/expert parallel runs against the
// single device, and checkpoints of expert-parallel runs resumed on other layouts; the router's
// modes (score functions, pre-softmax, scaling, group-limited, sinkhorn, global_aux_loss, the
// aux-loss-free expert bias) against finite differences, the single device and checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "engine/config/knobs.h"
#include "engine/model/flops.h"
#include "tests/parallel/fake_recorder.h"
#include "tests/parallel/parallel_test_util.h"

namespace ts::test {
namespace {

engine::Config moeConfig(int experts = 4, int topk = 2) {
    engine::Config c = tinyConfig(2);
    c.add_bias_linear = false;
    c.num_moe_experts = experts;
    c.moe_router_topk = topk;
    c.ffn_hidden_size = 64;
    return c;
}


std::string expertName(int layer, int e, const char* lin) {
    return "decoder.layers." + std::to_string(layer) + ".mlp.experts.local_experts." + std::to_string(e) + "." + lin +
           ".weight";
}

TEST(Moe, ExpertsThatCopyTheDenseMlpGiveTheDenseModel) {
    engine::Config dense = moeConfig();
    dense.num_moe_experts = 0;
    const OneStep ref = oneStep(dense);
    for (int k : {1, 2, 4}) {
        engine::Config c = moeConfig(4, k);
        const OneStep got = oneStep(c, [&](HostParams& pb) {
            for (int layer = 0; layer < 2; ++layer) {
                const std::string pre = "decoder.layers." + std::to_string(layer) + ".mlp.";
                for (int e = 0; e < 4; ++e)
                    for (const char* lin : {"linear_fc1", "linear_fc2"}) {
                        const auto& w = ref.params.at(pre + lin + ".weight");
                        const int i = pb.find(expertName(layer, e, lin));
                        ASSERT_GE(i, 0);
                        std::copy(w.begin(), w.end(), pb.mainParam(i));
                    }
            }
        });
        EXPECT_NEAR(got.loss, ref.loss, 1e-6 * ref.loss) << "topk " << k;
        // The dense MLP's weight gradient is the sum of the experts' (each sees its tokens).
        for (int layer = 0; layer < 2; ++layer)
            for (const char* lin : {"linear_fc1", "linear_fc2"}) {
                const auto& want = ref.grads.at("decoder.layers." + std::to_string(layer) + ".mlp." + lin + ".weight");
                std::vector<float> sum(want.size(), 0.f);
                for (int e = 0; e < 4; ++e) {
                    const auto& g = got.grads.at(expertName(layer, e, lin));
                    for (size_t i = 0; i < sum.size(); ++i) sum[i] += g[i];
                }
                EXPECT_LT(relError(sum, want), 1e-5) << "topk " << k << " layer " << layer << " " << lin;
            }
        // The attention weights see the same gradients as in the dense model.
        EXPECT_LT(relError(got.grads.at("decoder.layers.0.self_attention.linear_qkv.weight"),
                           ref.grads.at("decoder.layers.0.self_attention.linear_qkv.weight")),
                  1e-5);
    }
}

TEST(Moe, RouterAndExpertGradientsMatchFiniteDifferences) {
    engine::Config c = moeConfig(4, 2);
    c.init_method_std = 0.2;  // routing decided by clear margins: small steps do not flip it
    // the two entries with the largest gradients of each
    EXPECT_EQ(expectGradientsMatchFiniteDifferences(c,
                                                    {"decoder.layers.1.mlp.router.weight",
                                                     "decoder.layers.0.mlp.router.weight", expertName(1, 2, "linear_fc1"),
                                                     expertName(0, 1, "linear_fc2")},
                                                    2),
              8);
}

// Router weights of every MoE layer set to 0: equal logits, so uniform routing (ties to the
// lower expert index).
void zeroRouters(HostParams& pb) {
    for (int i = 0; i < pb.count(); ++i)
        if (pb.info(i).name.find(".mlp.router.weight") != std::string::npos)
            std::fill(pb.mainParam(i), pb.mainParam(i) + pb.info(i).numel, 0.f);
}

// One training step of `c` with uniform routing, its trace counters recorded into `rec`.
void uniformRoutingStep(const engine::Config& c, FakeRecorder& rec) {
    const Status st = traceSingle(c, rec, 1, zeroRouters);
    ASSERT_TRUE(st.isOk()) << st.toString();
}

TEST(Moe, UniformRoutingGivesExactlyTheAuxCoefficientAndCountsEveryToken) {
    engine::Config c = moeConfig(4, 2);
    c.moe_aux_loss_coeff = 0.01;
    c.moe_z_loss_coeff = 0.001;
    FakeRecorder rec;
    uniformRoutingStep(c, rec);
    const int T = c.seq_length * c.micro_batch_size;
    const int m = engine::deriveSizes(c).num_microbatches;
    int aux = 0, z = 0, lb = 0;
    std::map<std::string, double> tokens;
    for (const auto& k : rec.counters) {
        const std::string n = rec.str(k.name);
        if (n.rfind("moe.layer0.", 0) != 0) continue;
        if (n == "moe.layer0.aux_loss") {
            // Full softmax uniform (1/E), whatever the counts: aux = E*coeff/(k*T^2) * (T/E) * T*k.
            EXPECT_NEAR(k.value, 0.01, 1e-9);
            ++aux;
        } else if (n == "moe.layer0.z_loss") {
            // logsumexp of E equal zeros is log E: z = coeff * (log 4)^2.
            EXPECT_NEAR(k.value, 0.001 * std::log(4.0) * std::log(4.0), 1e-9);
            ++z;
        } else if (n == "moe.layer0.load_balancing_loss") {
            // Megatron's metric: the term without its coefficient (aux_loss alone: the whole aux).
            EXPECT_NEAR(k.value, 1.0, 1e-7);
            ++lb;
        } else if (n.find(".tokens.") != std::string::npos) {
            tokens[n] += k.value;
        }
    }
    EXPECT_EQ(lb, m);
    EXPECT_EQ(aux, m);  // one per microbatch
    EXPECT_EQ(z, m);
    double total = 0;
    for (const auto& [n, v] : tokens) total += v;
    EXPECT_EQ(total, double(m) * T * 2);  // every token to k = 2 experts
    // Ties go to the lower expert index: experts 0 and 1 took every token.
    EXPECT_EQ(tokens["moe.layer0.tokens.expert0"], double(m) * T);
    EXPECT_EQ(tokens["moe.layer0.tokens.expert2"], 0.0);
}

TEST(Moe, GroupedAndPerExpertOpsAreTheSameMath) {
    engine::Config a = moeConfig(4, 2);
    a.moe_aux_loss_coeff = 0.01;
    engine::Config b = a;
    b.moe_grouped_gemm = true;
    const RunResult ra = runSingle(a, 3), rb = runSingle(b, 3);
    expectSame(rb, ra, 0.0, "grouped vs per expert");
}

TEST(Moe, FlopsCountTheTopKExperts) {
    engine::Config c = moeConfig(8, 2);
    c.moe_ffn_hidden_size = 32;
    engine::Config dense = c;
    dense.num_moe_experts = 0;
    dense.ffn_hidden_size = 64;  // = moe_ffn * topk: the same MLP FLOPs per token
    EXPECT_DOUBLE_EQ(engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(c)),
                     engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(dense)));
    EXPECT_NE(engine::flopsFormulaText(engine::FlopsInputs::fromConfig(c)).find("topk"), std::string::npos);
}

TEST(Moe, UnsupportedSettingsAreNamed) {
    for (auto [knob, set] : std::vector<std::pair<std::string, std::function<void(engine::Config&)>>>{
             {"moe_router_dtype", [](engine::Config& c) { c.moe_router_dtype = "fp64"; }},
             {"sequence_parallel", [](engine::Config& c) { c.tensor_model_parallel_size = 2; }},
             {"moe_router_topk", [](engine::Config& c) { c.num_moe_experts = 128; c.moe_router_topk = 65; }},
             {"moe_router_num_groups",
              [](engine::Config& c) {
                  c.num_moe_experts = 256;
                  c.moe_router_num_groups = 128;
                  c.moe_router_group_topk = 2;
              }}}) {
        engine::Config c = moeConfig();
        set(c);
        auto d = engine::modelDimsFromConfig(c);
        ASSERT_FALSE(d.isOk()) << knob;
        EXPECT_NE(d.status().message().find(knob), std::string::npos) << knob << ": " << d.status().message();
    }
}

// Token dropping (moe_expert_capacity_factor). Uniform routing (router weights 0: every logit
// equal, ties to the lower expert) sends all T tokens of a microbatch to experts 0 and 1 with
// prob 1/2 each; capacity ceil(T*k/E * factor) keeps the first `cap` of them per expert (equal
// probs: the "probs" policy keeps token order, like "position").
TEST(Moe, CapacityDropsTheCopiesBeyondItAndPaddingChangesNothing) {
    const auto uniform = [](HostParams& pb) { zeroRouters(pb); };
    auto config = [](double factor, bool pad, const char* policy) {
        engine::Config c = moeConfig(4, 2);
        c.moe_expert_capacity_factor = factor;
        c.moe_pad_expert_input_to_capacity = pad;
        c.moe_token_drop_policy = policy;
        return c;
    };
    auto run = [&](double factor, bool pad, const char* policy) { return oneStep(config(factor, pad, policy), uniform); };
    const OneStep dropless = run(0, false, "probs");
    // A capacity at least T*k: nothing dropped, the same numbers bit for bit.
    const OneStep roomy = run(2.0, false, "probs");
    EXPECT_EQ(roomy.loss, dropless.loss);
    EXPECT_EQ(roomy.grads, dropless.grads);
    // cap = T/2 (factor 1): half of experts 0's and 1's copies are dropped.
    const OneStep half = run(1.0, false, "probs");
    EXPECT_NE(half.loss, dropless.loss);
    // The dropped copies are a counter of the trace.
    FakeRecorder rec;
    uniformRoutingStep(config(1.0, false, "probs"), rec);
    const int T = 16 * 2;
    int samples = 0;
    for (const auto& k : rec.counters)
        if (rec.str(k.name) == "moe.layer0.dropped_tokens") {
            EXPECT_EQ(k.value, double(T)) << "2 experts x (T - T/2) copies";
            ++samples;
        }
    EXPECT_EQ(samples, engine::deriveSizes(moeConfig(4, 2)).num_microbatches);
    // Experts 2 and 3 got nothing: no gradient.
    for (int e : {2, 3})
        for (const char* lin : {"linear_fc1", "linear_fc2"})
            for (float g : half.grads.at(expertName(0, e, lin))) ASSERT_EQ(g, 0.f) << e << lin;
    // Same probs everywhere: "position" keeps the same copies.
    const OneStep pos = run(1.0, false, "position");
    EXPECT_EQ(pos.loss, half.loss);
    EXPECT_EQ(pos.grads, half.grads);
    // Padding to capacity gives experts 2 and 3 cap rows at prob 0: computed, but no
    // contribution to the output, the loss or any gradient.
    const OneStep padded = run(1.0, true, "probs");
    EXPECT_EQ(padded.loss, half.loss);
    for (const auto& [name, g] : half.grads) EXPECT_LT(relError(padded.grads.at(name), g), 1e-6) << name;
    // Padded, the host takes every expert's rows as min(cap, T) without reading the routing back,
    // and the dropped copies come from the device: the same counters. A capacity past T (factor 4:
    // cap = 2T) pads every expert to all T tokens and drops nothing.
    FakeRecorder padRec;
    uniformRoutingStep(config(1.0, true, "probs"), padRec);
    int padSamples = 0;
    for (const auto& k : padRec.counters)
        if (padRec.str(k.name) == "moe.layer0.dropped_tokens") {
            EXPECT_EQ(k.value, double(T)) << "padded: 2 experts x (T - T/2) copies";
            ++padSamples;
        }
    EXPECT_EQ(padSamples, samples);
    const OneStep paddedRoomy = run(4.0, true, "probs");
    EXPECT_EQ(paddedRoomy.loss, dropless.loss);
    for (const auto& [name, g] : dropless.grads)
        EXPECT_LT(relError(paddedRoomy.grads.at(name), g), 1e-6) << name << " (padded past T)";
}

// Where the experts are on other ranks, each rank learns its copies before dropping with the
// dispatcher's gathered offsets (the alltoall dispatcher; the allgather one reads them back
// first): the counters of the trace, summed over the ranks, are the single device's, which routes
// the same microbatches at the same capacity.
TEST(Moe, DispatchedCapacityCountsTheSingleDevicesDroppedAndRoutedCopies) {
    engine::Config base = moeConfig(4, 2);
    base.moe_expert_capacity_factor = 0.5;  // copies dropped in every microbatch
    for (const char* dispatcher : {"alltoall", "allgather"}) {
        SCOPED_TRACE(dispatcher);
        ExpertLayout L{1, 1, 2, 2};
        L.dispatcher = dispatcher;
        L.capacity = base.moe_expert_capacity_factor;
        const engine::Config c = moeLayoutConfig(base, L);
        auto sums = [](const FakeRecorder& rec) {
            std::map<std::string, double> out;
            for (const auto& k : rec.counters) {
                const std::string n = rec.str(k.name);
                if (n.find(".dropped_tokens") != std::string::npos || n.find(".tokens.expert") != std::string::npos)
                    out[n] += k.value;
            }
            return out;
        };
        FakeRecorder one;
        const Status st = traceSingle(singleDevice(c), one);
        ASSERT_TRUE(st.isOk()) << st.toString();
        FakeRecorder par;
        auto r = trainParallel(c, 1, "", "", &par);
        ASSERT_TRUE(r.isOk()) << r.status().toString();
        const auto want = sums(one), got = sums(par);
        ASSERT_EQ(want.size(), 2u * (1 + 4));  // per layer: dropped, and routed per expert
        EXPECT_GT(want.at("moe.layer0.dropped_tokens"), 0);
        EXPECT_EQ(got, want);
    }
}

TEST(Moe, GradientsWithDroppedTokensMatchFiniteDifferences) {
    engine::Config c = moeConfig(4, 2);
    c.init_method_std = 0.2;
    c.moe_expert_capacity_factor = 0.75;  // cap = 12 of T*k/E = 16 on average: copies are dropped
    EXPECT_EQ(expectGradientsMatchFiniteDifferences(
                  c, {"decoder.layers.1.mlp.router.weight", expertName(1, 2, "linear_fc1"), expertName(0, 1, "linear_fc2")}, 1),
              3);
}

// moe_layer_freq 2: layers 0 and 2 are MoE, 1 and 3 keep the dense MLP (Megatron's pattern
// i % freq == 0), in the params, the FLOPs and a pipeline layout.
TEST(Moe, LayerFreqAlternatesMoeAndDenseLayers) {
    engine::Config c = moeConfig(4, 2);
    c.num_layers = 4;
    c.moe_layer_freq = "2";
    const OneStep one = oneStep(c);
    for (int layer = 0; layer < 4; ++layer) {
        const std::string pre = "decoder.layers." + std::to_string(layer) + ".mlp.";
        const bool moe = layer % 2 == 0;
        EXPECT_EQ(one.params.count(pre + "router.weight"), moe ? 1u : 0u) << layer;
        EXPECT_EQ(one.params.count(pre + "linear_fc1.weight"), moe ? 0u : 1u) << layer;
    }
    engine::Config every = c;
    every.moe_layer_freq = "1";
    engine::Config dense = c;
    dense.num_moe_experts = 0;
    const double fMoe = engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(every));
    const double fDense = engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(dense));
    // Half the layers MoE: the MLP difference is half of the all-MoE model's.
    EXPECT_DOUBLE_EQ(engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(c)) - fDense,
                     (fMoe - fDense) / 2);
    engine::Config pp = withLayout(c, Layout{1, 2, 1, 2, 2});
    pp.expert_model_parallel_size = 2;
    pp.moe_token_dispatcher_type = "alltoall";
    pp.moe_aux_loss_coeff = 0.01;
    const RunResult ref = runSingle(singleDevice(pp), 3);
    auto par = runParallel(pp, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, "freq2 pp2 ep2");
}

// The list form of moe_layer_freq: the same layers as the integer give the same step bit for bit;
// another list puts the MoE blocks where it says, in the params, the FLOPs and a pipeline layout
// (each stage reads the global layer index).
TEST(Moe, LayerFreqListPutsMoeOnTheListedLayers) {
    engine::Config c = moeConfig(4, 2);
    c.num_layers = 4;
    c.moe_aux_loss_coeff = 0.01;
    c.moe_layer_freq = "2";
    const OneStep asInt = oneStep(c);
    c.moe_layer_freq = "([1]+[0])*2";
    const OneStep asList = oneStep(c);
    EXPECT_EQ(asList.loss, asInt.loss);
    EXPECT_EQ(asList.grads, asInt.grads);
    c.moe_layer_freq = "[0,1,1,0]";
    const OneStep one = oneStep(c);
    for (int layer = 0; layer < 4; ++layer) {
        const std::string pre = "decoder.layers." + std::to_string(layer) + ".mlp.";
        const bool moe = layer == 1 || layer == 2;
        EXPECT_EQ(one.params.count(pre + "router.weight"), moe ? 1u : 0u) << layer;
        EXPECT_EQ(one.params.count(pre + "linear_fc1.weight"), moe ? 0u : 1u) << layer;
    }
    engine::Config freq2 = c;
    freq2.moe_layer_freq = "2";
    EXPECT_DOUBLE_EQ(engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(c)),
                     engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(freq2)));
    // pp2: stage 0 holds a dense and an MoE layer, stage 1 an MoE and a dense one.
    engine::Config pp = withLayout(c, Layout{1, 2, 1, 2, 2});
    pp.expert_model_parallel_size = 2;
    pp.moe_token_dispatcher_type = "alltoall";
    const RunResult ref = runSingle(singleDevice(pp), 3);
    auto par = runParallel(pp, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, "[0,1,1,0] pp2 ep2");
}

// Dropping is decided per microbatch on each rank's own tokens before the all-to-all, as
// Megatron's router does, so expert-parallel layouts equal the single device with it too.
TEST(Moe, ExpertParallelWithCapacityAndPaddingEqualsTheSingleDevice) {
    for (const char* dispatcher : {"alltoall", "allgather"})
    for (bool pad : {false, true}) {
        engine::Config c = withLayout(moeConfig(4, 2), Layout{1, 1, 1, 2, 2});
        c.expert_model_parallel_size = 2;
        c.moe_token_dispatcher_type = dispatcher;
        c.moe_expert_capacity_factor = 1.0;
        c.moe_pad_expert_input_to_capacity = pad;
        c.moe_aux_loss_coeff = 0.01;
        const RunResult ref = runSingle(singleDevice(c), 3);
        auto par = runParallel(c, 3);
        ASSERT_TRUE(par.isOk()) << par.status().toString();
        expectSame(*par, ref, 1e-5, std::string(dispatcher) + (pad ? " ep2 capacity padded" : " ep2 capacity"));
    }
}

// Context parallel with experts: the MoE layer runs on each CP rank's chunks, the aux loss counts
// the whole microbatch's routing (counts summed over "cp") and its gradient is scaled like the
// main loss (x cp, then averaged over dp-cp): equal to the single device, with expert
// parallelism over the CP ranks too.
TEST(Moe, ContextParallelWithExpertsEqualsTheSingleDevice) {
    struct Case {
        const char* name;
        int pp, dp, cp, ep;
        const char* comm;
    };
    for (const Case& k : {Case{"cp2_p2p", 1, 1, 2, 1, "p2p"}, Case{"cp2_dp2_ep2_a2a", 1, 2, 2, 2, "a2a"},
                          Case{"cp2_pp2_all_gather", 2, 1, 2, 1, "all_gather"}}) {
        engine::Config c = withLayout(moeConfig(4, 2), Layout{1, k.pp, 1, k.dp, 2});
        c.context_parallel_size = k.cp;
        c.cp_comm_type = k.comm;
        c.expert_model_parallel_size = k.ep;
        c.moe_token_dispatcher_type = "alltoall";
        c.moe_aux_loss_coeff = 0.01;
        c.moe_z_loss_coeff = 0.001;
        c.adam_eps = 1e-5;  // see ContextParallelLayouts
        const RunResult ref = runSingle(singleDevice(c), 3);
        auto par = runParallel(c, 3);
        ASSERT_TRUE(par.isOk()) << k.name << ": " << par.status().toString();
        expectSame(*par, ref, 1e-5, k.name);
    }
}

// seq_aux_loss: the Switch loss per sequence of the microbatch, averaged over them. With one
// sequence per microbatch it is aux_loss; its gradient matches finite differences with two; and
// with context parallel (counts of each sequence summed over "cp") it equals the single device.
TEST(Moe, SequenceAuxLossPerSequence) {
    engine::Config one = moeConfig(4, 2);
    one.micro_batch_size = 1;
    one.global_batch_size = 0;
    one.moe_aux_loss_coeff = 0.1;
    engine::Config seq = one;
    seq.moe_router_load_balancing_type = "seq_aux_loss";
    const OneStep a = oneStep(one), b = oneStep(seq);
    EXPECT_EQ(a.grads, b.grads);
    engine::Config c = moeConfig(4, 2);
    c.init_method_std = 0.2;
    c.moe_aux_loss_coeff = 0.1;
    c.moe_router_load_balancing_type = "seq_aux_loss";
    engine::Config plain = c;
    plain.moe_router_load_balancing_type = "aux_loss";
    const OneStep base = oneStep(c);
    const std::string router = "decoder.layers.0.mlp.router.weight";
    EXPECT_NE(base.grads.at(router), oneStep(plain).grads.at(router)) << "per sequence is not per microbatch";
    // Uniform routing (router weights 0): every sequence's loss is exactly the coefficient, as
    // Megatron's sanity oracle for the Switch loss says, and so is their mean.
    FakeRecorder rec;
    uniformRoutingStep(c, rec);
    int samples = 0;
    for (const auto& k : rec.counters)
        if (rec.str(k.name) == "moe.layer0.aux_loss") {
            EXPECT_NEAR(k.value, 0.1, 1e-9);
            ++samples;
        }
    EXPECT_GT(samples, 0);
    engine::Config cp = withLayout(c, Layout{1, 1, 1, 1, 2});
    cp.context_parallel_size = 2;
    cp.adam_eps = 1e-5;
    const RunResult ref = runSingle(singleDevice(cp), 3);
    auto par = runParallel(cp, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, "seq_aux_loss cp2");
}

// The loss the aux and z terms' gradients belong to: the LM loss plus, per microbatch, every
// layer's aux and z losses (their counters), averaged over the microbatches as the injected
// gradients are (MoEAuxLossAutoScaler's 1/num_microbatches).
double lossWithAuxTerms(const engine::Config& cfg, const std::function<void(HostParams&)>& edit) {
    engine::Config c = cfg;
    c.lr = 0;
    c.min_lr = 0;
    c.clip_grad = 0;
    c.weight_decay = 0;
    FakeRecorder rec;
    engine::StepProgress p;
    const Status st = traceSingle(c, rec, 1, edit, &p);
    EXPECT_TRUE(st.isOk()) << st.toString();
    if (!st.isOk()) return 0;
    double terms = 0;
    int n = 0;
    for (const auto& k : rec.counters) {
        const std::string name = rec.str(k.name);
        if (name.size() > 9 && (name.ends_with(".aux_loss") || name.ends_with(".z_loss"))) {
            terms += k.value;
            ++n;
        }
    }
    EXPECT_EQ(n, 2 * 2 * engine::deriveSizes(c).num_microbatches);  // aux and z, 2 layers
    return p.loss + terms / engine::deriveSizes(c).num_microbatches;
}

// The router weight's gradient with the aux and z terms against finite differences of the loss
// plus those terms, at the `probes` entries where the terms change the gradient most (each must
// change it by more than minEffect, so the terms are seen to reach the router).
struct AuxFdCheck {
    int probes;
    double minEffect, eps, rel, abs;
};
void expectAuxGradientsMatchFiniteDifferences(const engine::Config& c, const std::string& what, const AuxFdCheck& k) {
    const OneStep base = oneStep(c);
    engine::Config lmOnly = c;
    lmOnly.moe_aux_loss_coeff = 0;
    lmOnly.moe_z_loss_coeff = 0;
    const std::string name = "decoder.layers.0.mlp.router.weight";
    const auto& g = base.grads.at(name);
    const OneStep lm = oneStep(lmOnly);
    const auto& gLm = lm.grads.at(name);
    std::vector<size_t> idx(g.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + k.probes, idx.end(), [&](size_t a, size_t b) {
        return std::fabs(g[a] - gLm[a]) > std::fabs(g[b] - gLm[b]);
    });
    for (int n = 0; n < k.probes; ++n) {
        const size_t j = idx[size_t(n)];
        ASSERT_GT(std::fabs(g[j] - gLm[j]), k.minEffect) << what << ": the aux terms do not reach the router";
        double l[2];
        for (int sgn = 0; sgn < 2; ++sgn)
            l[sgn] = lossWithAuxTerms(c, [&](HostParams& pb) {
                pb.mainParam(pb.find(name))[j] += float(sgn ? -k.eps : k.eps);
            });
        const double numeric = (l[0] - l[1]) / (2 * k.eps);
        EXPECT_NEAR(g[j], numeric, k.rel * std::fabs(numeric) + k.abs) << what << " " << name << "[" << j << "]";
    }
}

// The gradients of aux_loss, seq_aux_loss (two sequences per microbatch) and the z-loss match
// finite differences of the loss they are the gradient of (routing decided by clear margins).
TEST(Moe, AuxSequenceAuxAndZLossGradientsMatchFiniteDifferences) {
    for (const char* lb : {"aux_loss", "seq_aux_loss"}) {
        engine::Config c = moeConfig(4, 2);
        c.init_method_std = 0.2;
        c.micro_batch_size = 2;
        c.global_batch_size = 4;  // two microbatches: the terms are averaged over them
        c.moe_aux_loss_coeff = 0.5;  // large: the aux term dominates the router's gradient
        c.moe_z_loss_coeff = 0.05;
        c.moe_router_load_balancing_type = lb;
        expectAuxGradientsMatchFiniteDifferences(c, lb, {3, 1e-4, 1e-2, 0.01, 1e-5});
    }
}

// Tensor parallel with experts (sequence parallel, as Megatron requires; experts not split over
// TP, expert_tensor_parallel_size 1): each TP rank routes its s/t rows, the aux loss counts all
// of them (counts summed over TP), the router's grads are summed over TP like every SP param,
// and the experts' grads are reduced over the expert-data-parallel group, which holds the TP
// ranks unless the experts are spread over them (ep over tp x dp).
TEST(Moe, TensorParallelWithExpertsEqualsTheSingleDevice) {
    struct Case {
        const char* name;
        int tp, pp, dp, ep;
        bool distOpt;
        const char* dispatcher;
    };
    for (const Case& k : {Case{"tp2", 2, 1, 1, 1, false, "alltoall"}, Case{"tp2_ep2", 2, 1, 1, 2, false, "alltoall"},
                          Case{"tp2_ep2_pp2", 2, 2, 1, 2, false, "allgather"},
                          Case{"tp2_dp2_ep2_distopt", 2, 1, 2, 2, true, "alltoall"},
                          Case{"tp2_dp2_ep4", 2, 1, 2, 4, false, "alltoall"}}) {
        engine::Config c = withLayout(moeConfig(4, 2), Layout{k.tp, k.pp, 1, k.dp, 2});
        c.sequence_parallel = true;
        c.expert_tensor_parallel_size = 1;
        c.expert_model_parallel_size = k.ep;
        c.moe_token_dispatcher_type = k.dispatcher;
        c.use_distributed_optimizer = k.distOpt;
        c.moe_aux_loss_coeff = 0.01;
        c.moe_z_loss_coeff = 0.001;
        const RunResult ref = runSingle(singleDevice(c), 3);
        auto par = runParallel(c, 3);
        ASSERT_TRUE(par.isOk()) << k.name << ": " << par.status().toString();
        expectSame(*par, ref, 1e-5, k.name);
    }
    // Megatron refuses MoE with TP but without SP; ETP must divide the experts' hidden size.
    engine::Config noSp = withLayout(moeConfig(4, 2), Layout{2, 1, 1, 1, 2});
    noSp.sequence_parallel = false;
    noSp.expert_tensor_parallel_size = 1;
    auto d = engine::modelDimsFromConfig(noSp);
    ASSERT_FALSE(d.isOk());
    EXPECT_NE(d.status().message().find("sequence_parallel"), std::string::npos) << d.status().message();
    engine::Config etp = withLayout(moeConfig(4, 2), Layout{2, 1, 1, 1, 2});
    etp.sequence_parallel = true;
    EXPECT_TRUE(engine::modelDimsFromConfig(etp).isOk());  // expert_tensor_parallel_size 0 = tp = 2
    etp.moe_ffn_hidden_size = 33;
    auto e = engine::modelDimsFromConfig(etp);
    ASSERT_FALSE(e.isOk());
    EXPECT_NE(e.status().message().find("expert_tensor_parallel_size=2 must divide"), std::string::npos)
        << e.status().message();
    EXPECT_NE(e.status().message().find("moe_ffn_hidden_size"), std::string::npos) << e.status().message();
}

// Experts replicated over TP (ep 1) save like any param, and so do experts spread over the TP
// ranks (ep over tp x dp, ETP 1).
TEST(Moe, TensorParallelCheckpointResumesOnOneDevice) {
    engine::Config c = withLayout(moeConfig(4, 2), Layout{2, 1, 1, 2, 2});
    c.sequence_parallel = true;
    c.expert_tensor_parallel_size = 1;
    c.use_distributed_optimizer = true;
    c.moe_aux_loss_coeff = 0.01;
    expectCheckpointResumesOnOneDevice(c, "moe_tp2_dp2");
    // ... and the other way: a single-device checkpoint resumed on tp2·dp2.
    expectOneDeviceCheckpointResumesOn(c, "moe_one_to_tp2_dp2");
    c.expert_model_parallel_size = 2;
    c.moe_token_dispatcher_type = "alltoall";
    expectCheckpointResumesOnOneDevice(c, "moe_tp2_etp1_ep2_dp2");
}

struct MoeLayout {
    const char* name;
    int pp, dp;
    bool distOpt, grouped;
    int vpp = 1;
    bool recompute = false;
    int ep = 1;
    const char* dispatcher = "alltoall";
};
class MoeParallel : public ::testing::TestWithParam<MoeLayout> {};

TEST_P(MoeParallel, EqualsTheSingleDeviceRun) {
    const MoeLayout L = GetParam();
    engine::Config c = withLayout(moeConfig(4, 2), Layout{1, L.pp, L.vpp, L.dp, 2});
    if (L.vpp > 1) c.overlap_p2p_comm = true;
    if (L.recompute) {
        c.recompute_granularity = "full";
        c.recompute_method = "uniform";
        c.recompute_num_layers = 1;
    }
    c.moe_aux_loss_coeff = 0.01;
    c.moe_z_loss_coeff = 0.001;
    c.use_distributed_optimizer = L.distOpt;
    c.moe_grouped_gemm = L.grouped;
    c.expert_model_parallel_size = L.ep;
    c.moe_token_dispatcher_type = L.dispatcher;
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, L.name);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeParallel,
                         ::testing::Values(MoeLayout{"dp2_distopt", 1, 2, true, false},
                                           MoeLayout{"pp2_grouped", 2, 1, false, true},
                                           MoeLayout{"pp2_dp2", 2, 2, false, false},
                                           MoeLayout{"pp2_vpp2_full_recompute", 2, 1, false, true, 2, true},
                                           MoeLayout{"ep2", 1, 2, false, false, 1, false, 2},
                                           MoeLayout{"ep2_dp4_distopt", 1, 4, true, true, 1, false, 2},
                                           MoeLayout{"ep4_distopt_grouped", 1, 4, true, true, 1, false, 4},
                                           MoeLayout{"ep2_dp4_pp2", 2, 4, false, false, 1, false, 2},
                                           MoeLayout{"ep2_pp2_vpp2_full_recompute", 2, 2, true, true, 2, true, 2},
                                           MoeLayout{"ep2_allgather", 1, 2, false, false, 1, false, 2, "allgather"},
                                           MoeLayout{"ep4_allgather_distopt", 1, 4, true, true, 1, false, 4, "allgather"},
                                           MoeLayout{"ep2_dp4_pp2_allgather", 2, 4, false, false, 1, false, 2, "allgather"},
                                           // flex (DeepEP in Megatron): the alltoall dispatcher's token movement
                                           MoeLayout{"ep2_dp4_flex_distopt", 1, 4, true, true, 1, false, 2, "flex"}),
                         [](const auto& info) { return std::string(info.param.name); });

// The flex dispatcher is refused where Megatron refuses it: one expert rank (its DeepEP backend
// asserts TPxEP > 1) and padding to capacity.
TEST(Moe, FlexDispatcherNeedsSeveralExpertRanksAndNoPadding) {
    engine::Config c = moeConfig(4, 2);
    c.moe_token_dispatcher_type = "flex";
    auto has = [](const engine::Config& cfg, const std::string& knob, const std::string& text) {
        for (const auto& i : engine::validateConfig(cfg))
            if (i.knob == knob && i.message.find(text) != std::string::npos) return true;
        return false;
    };
    EXPECT_TRUE(has(c, "moe_token_dispatcher_type", "expert_model_parallel_size x expert_tensor_parallel_size > 1"));
    engine::Config ep2 = withLayout(c, Layout{1, 1, 1, 2, 2});
    ep2.expert_model_parallel_size = 2;
    EXPECT_FALSE(has(ep2, "moe_token_dispatcher_type", "flex"));
    ep2.moe_expert_capacity_factor = 1.0;
    ep2.moe_pad_expert_input_to_capacity = true;
    EXPECT_TRUE(has(ep2, "moe_pad_expert_input_to_capacity", "flex dispatcher"));
}

// Checkpoints of expert-parallel runs: each rank holds E/ep experts, the checkpoint is the
// single-device one (every expert, in the single device's order, with its Adam state).
engine::Config epConfig(int pp, int dp, bool distOpt) {
    engine::Config c = withLayout(moeConfig(4, 2), Layout{1, pp, 1, dp, 2});
    c.moe_aux_loss_coeff = 0.01;
    c.use_distributed_optimizer = distOpt;
    c.expert_model_parallel_size = 2;
    c.moe_token_dispatcher_type = "alltoall";
    return c;
}

struct EpCkptCase {
    const char* name;
    int pp, dp;
    bool distOpt;
};
void PrintTo(const EpCkptCase& c, std::ostream* os) { *os << c.name; }
class MoeCheckpoint : public ::testing::TestWithParam<EpCkptCase> {};

// Two steps and a save on the expert-parallel layout, one step on one device from the save.
TEST_P(MoeCheckpoint, ExpertParallelCheckpointResumesOnOneDevice) {
    const EpCkptCase& k = GetParam();
    expectCheckpointResumesOnOneDevice(epConfig(k.pp, k.dp, k.distOpt), std::string("moe_") + k.name);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeCheckpoint,
                         ::testing::Values(EpCkptCase{"ep2_dp2", 1, 2, false},
                                           // experts' Adam state sharded over edp 2, dense over dp 4
                                           EpCkptCase{"ep2_dp4_distopt", 1, 4, true},
                                           EpCkptCase{"ep2_pp2_dp2", 2, 2, false}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(MoeCheckpoint, OneDeviceCheckpointResumesOnEp2Dp2) {
    const engine::Config c = epConfig(1, 2, false);
    expectOneDeviceCheckpointResumesOn(c, "moe_one_to_ep2_dp2");
}

// Pipeline stages and ep ranks both split the table: ep2·pp2·dp2 (distributed optimizer)
// saves, ep2·dp2 resumes.
TEST(MoeCheckpoint, Ep2Pp2Dp2CheckpointResumesOnEp2Dp2) {
    const engine::Config from = epConfig(2, 2, true), to = epConfig(1, 2, false);
    const std::string dir = checkpointDir("moe_ep2_pp2_dp2_to_ep2_dp2");
    auto saved = trainParallel(from, 2, "", dir);
    ASSERT_TRUE(saved.isOk()) << saved.status().toString();
    const RunResult straight = runSingle(singleDevice(to), 3);
    auto resumed = trainParallel(to, 1, dir);
    ASSERT_TRUE(resumed.isOk()) << resumed.status().toString();
    expectResumedStep(*resumed, straight, "ep2_pp2_dp2 -> ep2_dp2");
    std::filesystem::remove_all(dir);
}

// ---- expert tensor parallel (expert_tensor_parallel_size > 1) -----------------------------

// Each expert's fc1 split by rows and fc2 by columns over "etp"; the rows every etp rank
// received all-gathered over "etp" before the experts and the partial outputs reduce-scattered
// after them (REFERENCE.md §5.3). tp, etp, ep, dp, pp as named; etp 0 = tp.
struct EtpLayout {
    const char* name;
    int tp, etp, ep, dp, pp;
    bool distOpt = false;
    const char* dispatcher = "alltoall";
    bool swiglu = false, grouped = false, recompute = false;
    double capacity = 0;  // moe_expert_capacity_factor (0 = dropless)
    bool pad = false;
    int cp = 1;
};
void PrintTo(const EtpLayout& l, std::ostream* os) { *os << l.name; }

engine::Config etpConfig(const EtpLayout& L) {
    engine::Config c = moeLayoutConfig(moeConfig(4, 2), ExpertLayout{L.tp, L.etp, L.ep, L.dp, L.pp, L.cp, L.distOpt,
                                                                  L.dispatcher, L.swiglu, L.grouped, L.recompute,
                                                                  L.capacity, L.pad});
    c.moe_aux_loss_coeff = 0.01;
    c.moe_z_loss_coeff = 0.001;
    return c;
}

class MoeEtp : public ::testing::TestWithParam<EtpLayout> {};

TEST_P(MoeEtp, EqualsTheSingleDeviceRun) {
    const engine::Config c = etpConfig(GetParam());
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, GetParam().name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeEtp,
    ::testing::Values(EtpLayout{"tp2_etp2", 2, 2, 1, 1, 1},
                      EtpLayout{"tp2_etp2_swiglu_grouped", 2, 2, 1, 1, 1, false, "alltoall", true, true},
                      EtpLayout{"tp2_etp2_ep2", 2, 2, 2, 2, 1},
                      EtpLayout{"tp2_etp2_ep2_dp4_distopt_swiglu", 2, 2, 2, 4, 1, true, "alltoall", true},
                      EtpLayout{"tp2_etp2_ep2_pp2_recompute", 2, 2, 2, 2, 2, false, "alltoall", false, true, true},
                      // etp 0: Megatron's default, the tp size
                      EtpLayout{"tp2_etp_default_allgather", 2, 0, 1, 1, 1, false, "allgather"},
                      EtpLayout{"tp2_etp2_ep2_allgather_grouped", 2, 2, 2, 2, 1, false, "allgather", false, true},
                      // ETP over data-parallel ranks (tp 1): each rank routes a whole microbatch,
                      // so capacity (decided on each rank's tokens) is the single device's too.
                      EtpLayout{"tp1_etp2_dp2", 1, 2, 1, 2, 1},
                      EtpLayout{"tp1_etp2_dp2_capacity", 1, 2, 1, 2, 1, false, "alltoall", false, false, false, 1.0},
                      EtpLayout{"tp1_etp2_dp2_capacity_padded", 1, 2, 1, 2, 1, false, "alltoall", true, false, false,
                                1.0, true},
                      EtpLayout{"tp1_etp2_ep2_dp4_capacity_padded_allgather", 1, 2, 2, 4, 1, false, "allgather",
                                false, true, false, 1.0, true},
                      // ETP over context-parallel ranks (the expert layout folds cp into edp)
                      EtpLayout{"cp2_etp2_ep2_dp2", 1, 2, 2, 2, 1, false, "alltoall", false, false, false, 0, false,
                                2}),
    [](const auto& info) { return std::string(info.param.name); });

// The rows each etp rank computes are the all-gathered ones: with tp2·etp2 (ep 1) both ranks of
// the "etp" group compute, for every expert, the rows of the whole microbatch, i.e. the single
// device's tokens per expert (each rank routed only its s/2 rows); and the all-gather and
// reduce-scatter run on the "etp" group of the trace.
TEST(MoeEtpDispatch, EveryEtpRankComputesTheRowsOfTheWholeEtpGroup) {
    const engine::Config c = etpConfig(EtpLayout{"tp2_etp2", 2, 2, 1, 1, 1});
    const engine::Config one = singleDevice(c);
    std::map<std::string, double> want;  // tokens.expert<e> of the single device, summed
    {
        FakeRecorder rec;
        const Status st = traceSingle(one, rec);
        ASSERT_TRUE(st.isOk()) << st.toString();
        for (const auto& k : rec.counters) {
            const std::string n = rec.str(k.name);
            if (n.find(".tokens.expert") != std::string::npos) want[n] += k.value;
            EXPECT_EQ(n.find("expert_rows"), std::string::npos) << "one device dispatches nothing: " << n;
        }
    }
    FakeRecorder rec;
    auto par = trainParallel(c, 1, "", "", &rec);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    std::map<std::pair<int, std::string>, double> rows, routed;  // (rank, "layer.expert") -> sum
    for (const auto& k : rec.counters) {
        std::string n = rec.str(k.name);
        const size_t at = n.find(".expert_rows.");
        if (at != std::string::npos) rows[{int(k.rank), n.erase(at, 12)}] += k.value;
        else if (n.find(".tokens.expert") != std::string::npos) routed[{int(k.rank), n.erase(n.find(".tokens."), 7)}] += k.value;
    }
    ASSERT_EQ(want.size(), 8u);  // 2 layers x 4 experts
    double total = 0;
    for (const auto& [name, v] : want) {
        std::string key = name;
        key.erase(key.find(".tokens."), 7);
        total += v;
        for (int r : {0, 1}) {
            const auto it = rows.find(std::make_pair(r, key));
            ASSERT_NE(it, rows.end()) << "rank " << r << " " << key;
            EXPECT_EQ(it->second, v) << "rank " << r << " " << key;
        }
        // ... while each rank routed only its own share of them.
        EXPECT_EQ(routed[std::make_pair(0, key)] + routed[std::make_pair(1, key)], v) << key;
    }
    EXPECT_EQ(total, 2.0 * 2 * 2 * 16 * 2);  // layers x microbatches x topk x (s*b)
    int gathers = 0, scatters = 0;
    for (const auto& sl : rec.slices) {
        if (rec.str(sl.group) != "etp") continue;
        const std::string n = rec.str(sl.name);
        gathers += n.find("all_gather") != std::string::npos;
        scatters += n.find("reduce_scatter") != std::string::npos;
    }
    EXPECT_GT(gathers, 0) << "no all-gather on the etp group";
    EXPECT_GT(scatters, 0) << "no reduce-scatter on the etp group";
}

// The run's num_parameters is the single device's whatever the split: tp and etp shards, ep
// coordinates and edp / dp replicas each counted once.
TEST(MoeEtpDispatch, NumParametersIsTheSingleDevicesCount) {
    for (const EtpLayout& L : {EtpLayout{"tp2_etp2_ep2_dp2", 2, 2, 2, 2, 1}, EtpLayout{"tp2_etp1_ep2_dp2", 2, 1, 2, 2, 1},
                               EtpLayout{"tp1_etp2_ep2_dp4_pp2", 1, 2, 2, 4, 2}, EtpLayout{"ep2_dp2", 1, 1, 2, 2, 1}}) {
        const engine::Config c = etpConfig(L);
        auto one = engine::Trainer::create(singleDevice(c));
        ASSERT_TRUE(one.isOk()) << one.status().toString();
        auto par = engine::ParallelTrainer::create(c);
        ASSERT_TRUE(par.isOk()) << L.name << ": " << par.status().toString();
        EXPECT_EQ((*par)->runMetadata().at("num_parameters").get<int64_t>(), (*one)->model().params().numel()) << L.name;
    }
}

// Checkpoints of runs with experts split over "etp" are the single-device ones.
TEST(MoeEtpCheckpoint, Tp2Etp2Ep2CheckpointResumesOnOneDevice) {
    expectCheckpointResumesOnOneDevice(etpConfig(EtpLayout{"", 2, 2, 2, 2, 1, true}),
                                       "moe_tp2_etp2_ep2_distopt");
}

TEST(MoeEtpCheckpoint, OneDeviceCheckpointResumesOnTp2Etp2Ep2) {
    const engine::Config c = etpConfig(EtpLayout{"", 2, 2, 2, 2, 1, false, "alltoall", true});
    expectOneDeviceCheckpointResumesOn(c, "moe_one_to_tp2_etp2_ep2");
}

// Between two expert layouts: tp2·etp2·dp2 (distributed optimizer: experts split over etp 2,
// their Adam state sharded over edp 2) saves, tp1·etp1·ep2·dp2 resumes.
TEST(MoeEtpCheckpoint, Tp2Etp2Dp2CheckpointResumesOnEp2Dp2) {
    const engine::Config from = etpConfig(EtpLayout{"", 2, 2, 1, 2, 1, true});
    engine::Config to = etpConfig(EtpLayout{"", 1, 1, 2, 2, 1});
    to.make_vocab_size_divisible_by = from.make_vocab_size_divisible_by * 2;  // pad as tp2 does
    const std::string dir = checkpointDir("moe_tp2_etp2_dp2_to_ep2_dp2");
    auto saved = trainParallel(from, 2, "", dir);
    ASSERT_TRUE(saved.isOk()) << saved.status().toString();
    const RunResult straight = runSingle(singleDevice(to), 3);
    auto resumed = trainParallel(to, 1, dir);
    ASSERT_TRUE(resumed.isOk()) << resumed.status().toString();
    expectResumedStep(*resumed, straight, "tp2_etp2_dp2 -> ep2_dp2");
    std::filesystem::remove_all(dir);
}


// ---- router modes ----------------------------------------------------------------------------

struct RouterMode {
    const char* name;
    std::function<void(engine::Config&)> set;
    bool sp = true;  // also compared on tp2·ep2 with sequence parallel
};

std::vector<RouterMode> routerModes() {
    return {
        {"sigmoid_scaled", [](engine::Config& c) {
             c.moe_router_score_function = "sigmoid";
             c.moe_router_topk_scaling_factor = 2.5;
         }},
        {"sqrtsoftplus", [](engine::Config& c) { c.moe_router_score_function = "sqrtsoftplus"; }},
        {"pre_softmax", [](engine::Config& c) { c.moe_router_pre_softmax = true; }},
        {"group_limited", [](engine::Config& c) {
             c.moe_router_num_groups = 2;
             c.moe_router_group_topk = 1;
         }},
        {"expert_bias", [](engine::Config& c) {
             c.moe_router_score_function = "sigmoid";
             c.moe_router_enable_expert_bias = true;
             c.moe_router_bias_update_rate = 0.05;  // large: the choice moves within three steps
         }},
        // sinkhorn normalises over the rank's own tokens (Megatron's too): with sequence parallel a
        // TP rank's s/t rows are normalised alone, so only layouts that keep whole microbatches match.
        {"sinkhorn", [](engine::Config& c) {
             c.moe_router_load_balancing_type = "sinkhorn";
             c.moe_aux_loss_coeff = 0;
         }, false},
        {"global_aux_loss", [](engine::Config& c) { c.moe_router_load_balancing_type = "global_aux_loss"; }},
    };
}

engine::Config routerConfig(const RouterMode& m) {
    engine::Config c = moeConfig(4, 2);
    c.moe_aux_loss_coeff = 0.01;
    c.moe_z_loss_coeff = 0.001;
    m.set(c);
    return c;
}

// Every mode changes the run (a knob the engine ignored would leave it as the default's).
TEST(MoeRouter, EveryModeChangesTheRun) {
    engine::Config def = moeConfig(4, 2);
    def.moe_aux_loss_coeff = 0.01;
    def.moe_z_loss_coeff = 0.001;
    def.init_method_std = 0.2;
    def.global_batch_size = 2 * def.micro_batch_size;  // two microbatches (global_aux_loss averages over them)
    const RunResult ref = runSingle(def, 3);
    for (const RouterMode& m : routerModes()) {
        engine::Config c = routerConfig(m);
        c.init_method_std = 0.2;
        c.global_batch_size = def.global_batch_size;
        const RunResult got = runSingle(c, 3);
        ASSERT_EQ(got.losses.size(), 3u) << m.name;
        const std::string router = "decoder.layers.0.mlp.router.weight";
        EXPECT_GT(relError(got.params.at(router), ref.params.at(router)), 1e-7) << m.name;
        EXPECT_NE(got.losses.back(), ref.losses.back()) << m.name;
    }
}

// The router's gradient through the probs of each mode against finite differences of the loss.
TEST(MoeRouter, RouterGradientsMatchFiniteDifferences) {
    for (const RouterMode& m : routerModes()) {
        if (std::string(m.name) == "global_aux_loss") continue;  // its aux term: the next test
        SCOPED_TRACE(m.name);
        engine::Config c = routerConfig(m);
        c.moe_aux_loss_coeff = 0;
        c.moe_z_loss_coeff = 0;
        c.moe_router_bias_update_rate = 0;
        c.init_method_std = 0.5;  // wide logit margins
        // Few tokens (one sequence per microbatch) and a small step: no token's choice flips.
        c.micro_batch_size = 1;
        c.global_batch_size = 2;
        EXPECT_EQ(expectGradientsMatchFiniteDifferences(
                      c, {"decoder.layers.1.mlp.router.weight", "decoder.layers.0.mlp.router.weight"}, 2, 0.05, 1e-3),
                  4)
            << m.name;
    }
}

// The aux loss's gradient with sigmoid scores (renormalised over all experts) and with
// global_aux_loss (counts accumulated over the step's two microbatches) against finite
// differences of the loss plus the logged aux and z terms.
TEST(MoeRouter, AuxLossGradientsOfTheNewScoresMatchFiniteDifferences) {
    struct Case {
        const char* name, *score, *lb;
    };
    for (const Case& k : {Case{"sigmoid aux_loss", "sigmoid", "aux_loss"}, Case{"softmax global", "softmax", "global_aux_loss"},
                          Case{"sqrtsoftplus global", "sqrtsoftplus", "global_aux_loss"}}) {
        SCOPED_TRACE(k.name);
        engine::Config c = moeConfig(4, 2);
        c.init_method_std = 0.5;  // wide logit margins
        c.micro_batch_size = 1;
        c.global_batch_size = 2;  // two microbatches of one sequence: few tokens, no choice flips
        c.moe_aux_loss_coeff = 0.5;
        c.moe_z_loss_coeff = 0.05;
        c.moe_router_score_function = k.score;
        c.moe_router_load_balancing_type = k.lb;
        expectAuxGradientsMatchFiniteDifferences(c, k.name, {2, 1e-5, 1e-3, 0.02, 1e-4});
    }
}

// ep2·dp2 and tp2·ep2 (sequence parallel) equal the single device in every mode; with
// global_aux_loss tp2·ep2 (dp 1) too: the counts summed over tp-dp-cp are the microbatch's.
TEST(MoeRouter, ParallelLayoutsEqualTheSingleDevice) {
    for (const RouterMode& m : routerModes()) {
        engine::Config ep = withLayout(routerConfig(m), Layout{1, 1, 1, 2, 2});
        ep.expert_model_parallel_size = 2;
        ep.moe_token_dispatcher_type = "alltoall";
        if (std::string(m.name) != "global_aux_loss") {  // dp2: see GlobalAuxLossOverDataParallelRanks
            const RunResult ref = runSingle(singleDevice(ep), 3);
            auto par = runParallel(ep, 3);
            ASSERT_TRUE(par.isOk()) << m.name << ": " << par.status().toString();
            expectSame(*par, ref, 1e-5, std::string(m.name) + " ep2_dp2");
        }
        if (!m.sp) continue;
        engine::Config tp = withLayout(routerConfig(m), Layout{2, 1, 1, 1, 2});
        tp.sequence_parallel = true;
        tp.expert_tensor_parallel_size = 1;
        tp.expert_model_parallel_size = 2;
        tp.moe_token_dispatcher_type = "alltoall";
        const RunResult ref = runSingle(singleDevice(tp), 3);
        auto par = runParallel(tp, 3);
        ASSERT_TRUE(par.isOk()) << m.name << ": " << par.status().toString();
        expectSame(*par, ref, 1e-5, std::string(m.name) + " tp2_ep2_sp");
    }
}

// global_aux_loss over data-parallel ranks (Megatron's _apply_global_aux_loss): each rank's loss
// uses the counts summed over tp-dp-cp with T = the tokens of all dp ranks' microbatches, and
// like every router gradient it is then averaged over dp. So dp2 with 2 microbatches of b
// sequences each is the single device whose 2 microbatches hold both ranks' sequences (the data
// order: rank d's microbatch j is samples (j*dp + d)*b ..) with half the coefficient.
TEST(MoeRouter, GlobalAuxLossOverDataParallelRanks) {
    for (int ep : {1, 2}) {
        engine::Config c = withLayout(moeConfig(4, 2), Layout{1, 1, 1, 2, 2});
        c.moe_router_load_balancing_type = "global_aux_loss";
        c.moe_aux_loss_coeff = 0.1;
        c.expert_model_parallel_size = ep;
        c.moe_token_dispatcher_type = "alltoall";
        engine::Config one = singleDevice(c);
        one.micro_batch_size = 2 * c.micro_batch_size;
        one.num_microbatches = 2;
        one.global_batch_size = one.micro_batch_size * 2;
        one.moe_aux_loss_coeff = 0.05;  // half of c's
        const RunResult ref = runSingle(one, 3);
        auto par = runParallel(c, 3);
        ASSERT_TRUE(par.isOk()) << par.status().toString();
        expectSame(*par, ref, 1e-5, "global_aux_loss dp2 ep" + std::to_string(ep));
        // ... and the counts are the global ones: with per-microbatch counts it would differ.
        engine::Config local = one;
        local.moe_router_load_balancing_type = "aux_loss";
        const RunResult other = runSingle(local, 3);
        EXPECT_GT(relError(other.params.at("decoder.layers.0.mlp.router.weight"),
                           ref.params.at("decoder.layers.0.mlp.router.weight")),
                  1e-6);
    }
}

// The expert bias after three steps (trace counters of the last step) is the same on ep2·dp2
// as on the single device, has moved, and a checkpoint of it resumes on another layout.
TEST(MoeRouter, ExpertBiasIsUpdatedAsOnTheSingleDeviceAndResumes) {
    const RouterMode bias = routerModes()[4];
    ASSERT_EQ(std::string(bias.name), "expert_bias");
    engine::Config c = withLayout(routerConfig(bias), Layout{1, 1, 1, 2, 2});
    c.expert_model_parallel_size = 2;
    c.moe_token_dispatcher_type = "alltoall";
    auto lastBias = [](const FakeRecorder& rec) {
        std::map<std::string, double> out;
        for (const auto& k : rec.counters)
            if (rec.str(k.name).find(".expert_bias.") != std::string::npos) out[rec.str(k.name)] = k.value;
        return out;
    };
    FakeRecorder oneRec;
    const Status traced = traceSingle(singleDevice(c), oneRec, 3);
    ASSERT_TRUE(traced.isOk()) << traced.toString();
    const auto want = lastBias(oneRec);
    ASSERT_EQ(want.size(), 8u);  // 2 layers x 4 experts
    // Each dispatcher tells the host the rank's routed rows its own way (the gathered offsets, the
    // gathered routing map): both count them for the bias.
    for (const char* dispatcher : {"alltoall", "allgather"}) {
        engine::Config d = c;
        d.moe_token_dispatcher_type = dispatcher;
        FakeRecorder parRec;
        auto par = trainParallel(d, 3, "", "", &parRec);
        ASSERT_TRUE(par.isOk()) << dispatcher << ": " << par.status().toString();
        const auto got = lastBias(parRec);
        double moved = 0;
        for (const auto& [name, v] : want) {
            ASSERT_TRUE(got.count(name)) << dispatcher << " " << name;
            EXPECT_NEAR(got.at(name), v, 1e-6) << dispatcher << " " << name;
            moved += std::fabs(v);
        }
        EXPECT_GT(moved, 0.1) << "the bias did not move";
    }
    // Saved on ep2·dp2 after two steps, resumed on one device and on tp2·ep2: the third step is
    // the single device's (the bias steers the choice, so a lost bias would change it).
    const std::string dir = checkpointDir("moe_expert_bias_ep2_dp2");
    auto saved = trainParallel(c, 2, "", dir);
    ASSERT_TRUE(saved.isOk()) << saved.status().toString();
    const RunResult straight = runSingle(singleDevice(c), 3);
    auto resumed = trainSingle(singleDevice(c), 1, dir);
    ASSERT_TRUE(resumed.isOk()) << resumed.status().toString();
    expectResumedStep(*resumed, straight, "expert bias ep2_dp2 -> one device");
    engine::Config tp = withLayout(routerConfig(bias), Layout{2, 1, 1, 1, 4});
    tp.sequence_parallel = true;
    tp.expert_tensor_parallel_size = 1;
    tp.expert_model_parallel_size = 2;
    tp.moe_token_dispatcher_type = "alltoall";
    tp.make_vocab_size_divisible_by = 32;  // x tp 2: the checkpoint's padded vocab 64
    auto resumedTp = trainParallel(tp, 1, dir);
    ASSERT_TRUE(resumedTp.isOk()) << resumedTp.status().toString();
    expectResumedStep(*resumedTp, straight, "expert bias ep2_dp2 -> tp2_ep2");
    // Without the bias in the checkpoint the resumed step differs (saved after one step: the
    // bias is then +-rate everywhere; after two it may have come back to 0).
    engine::Config one = singleDevice(c);
    std::filesystem::remove_all(dir);
    auto savedOne = trainSingle(one, 1, "", dir);
    ASSERT_TRUE(savedOne.isOk());
    auto withBias = trainSingle(one, 1, dir);
    ASSERT_TRUE(withBias.isOk()) << withBias.status().toString();
    EXPECT_NEAR(withBias->losses[0], straight.losses[1], 1e-5 * straight.losses[1]);
    {
        nlohmann::json meta;
        {
            std::ifstream in(dir + "/checkpoint.json");
            in >> meta;
        }
        ASSERT_TRUE(meta.contains("moe_router_expert_bias"));
        for (const auto& [layer, b] : meta["moe_router_expert_bias"].items())
            for (const auto& v : b) EXPECT_NEAR(std::fabs(v.get<double>()), 0.05, 1e-6) << layer;
        meta.erase("moe_router_expert_bias");
        std::ofstream(dir + "/checkpoint.json") << meta.dump();
    }
    auto lost = trainSingle(one, 1, dir);
    ASSERT_TRUE(lost.isOk()) << lost.status().toString();
    EXPECT_NE(lost->losses[0], withBias->losses[0]) << "the bias made no difference to the resumed step";
    std::filesystem::remove_all(dir);
}

// What Megatron asserts is refused with the knob's name.
TEST(MoeRouter, InvalidRouterSettingsAreNamed) {
    auto has = [](const engine::Config& cfg, const std::string& knob) {
        for (const auto& i : engine::validateConfig(cfg))
            if (i.knob == knob) return true;
        return false;
    };
    engine::Config c = moeConfig(4, 2);
    EXPECT_FALSE(has(c, "moe_router_enable_expert_bias"));
    c.moe_router_enable_expert_bias = true;
    EXPECT_TRUE(has(c, "moe_router_enable_expert_bias"));  // softmax
    c = moeConfig(4, 1);
    EXPECT_TRUE(has(c, "moe_router_pre_softmax"));
    c.moe_router_pre_softmax = true;
    EXPECT_FALSE(has(c, "moe_router_pre_softmax"));
    c = moeConfig(4, 2);
    c.moe_router_group_topk = 1;
    EXPECT_TRUE(has(c, "moe_router_num_groups"));
    c.moe_router_num_groups = 3;
    EXPECT_TRUE(has(c, "moe_router_num_groups"));  // does not divide 4
    c.moe_router_num_groups = 4;
    c.moe_router_group_topk = 1;
    EXPECT_TRUE(has(c, "moe_router_topk"));  // 2 experts from one group of 1
    c = moeConfig(4, 2);
    c.moe_router_load_balancing_type = "sinkhorn";
    c.moe_aux_loss_coeff = 0.01;
    EXPECT_TRUE(has(c, "moe_aux_loss_coeff"));
    auto d = engine::modelDimsFromConfig(c);
    ASSERT_FALSE(d.isOk());
    EXPECT_NE(d.status().message().find("moe_aux_loss_coeff"), std::string::npos);
    c = moeConfig(4, 2);
    c.moe_router_load_balancing_type = "global_aux_loss";
    c.recompute_granularity = "full";
    c.recompute_method = "uniform";
    c.recompute_num_layers = 1;
    d = engine::modelDimsFromConfig(c);
    ASSERT_FALSE(d.isOk());
    EXPECT_NE(d.status().message().find("global_aux_loss"), std::string::npos);
}

}  // namespace
}  // namespace ts::test
