// MoE shared experts (moe_shared_expert_intermediate_size, moe_shared_expert_gate,
// moe_shared_expert_overlap; engine/model/gpt_layer.cpp, gpt_mlp.cpp) against references written
// here: with the routed experts' linear_fc2 zeroed the MoE layer is its shared expert, i.e. a
// dense model whose MLP holds the shared weights (and with a zero gate weight, sigmoid(0) = 1/2,
// the dense model with half its linear_fc2); finite differences for the shared weights and the
// gate; parallel layouts against the single device; overlap on and off give the same numbers
// and run the shared experts where Megatron does (on their own stream in parallel runs); FLOPs;
// a checkpoint of ep2·dp2.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine/model/flops.h"
#include "tests/parallel/fake_recorder.h"
#include "tests/parallel/parallel_test_util.h"

namespace ts::test {
namespace {

constexpr int kShared = 48;  // shared experts' ffn size (divisible by tp 2)

engine::Config sharedConfig(bool gate = false) {
    engine::Config c = tinyConfig(2);
    c.add_bias_linear = false;
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.ffn_hidden_size = 64;
    c.moe_shared_expert_intermediate_size = kShared;
    c.moe_shared_expert_gate = gate;
    return c;
}


std::string layerName(int layer, const std::string& rest) {
    return "decoder.layers." + std::to_string(layer) + ".mlp." + rest;
}

// Routed experts' linear_fc2 zeroed (they add nothing), the shared experts' linears set to the
// dense model's MLP (times fc2Scale on fc2), the gate weight (if any) zeroed.
void becomeTheDenseMlp(HostParams& pb, const OneStep& dense, float fc2Scale) {
    for (int layer = 0; layer < 2; ++layer) {
        for (int e = 0; e < 4; ++e) {
            const int i = pb.find(layerName(layer, "experts.local_experts." + std::to_string(e) + ".linear_fc2.weight"));
            ASSERT_GE(i, 0);
            std::fill(pb.mainParam(i), pb.mainParam(i) + pb.info(i).numel, 0.f);
        }
        for (const char* lin : {"linear_fc1", "linear_fc2"}) {
            const auto& w = dense.params.at(layerName(layer, std::string(lin) + ".weight"));
            const int i = pb.find(layerName(layer, std::string("shared_experts.") + lin + ".weight"));
            ASSERT_GE(i, 0) << lin;
            ASSERT_EQ(size_t(pb.info(i).numel), w.size()) << lin;
            const float s = std::string(lin) == "linear_fc2" ? fc2Scale : 1.f;
            for (size_t k = 0; k < w.size(); ++k) pb.mainParam(i)[k] = w[k] * s;
        }
        const int g = pb.find(layerName(layer, "shared_experts.gate_weight"));
        if (g >= 0) std::fill(pb.mainParam(g), pb.mainParam(g) + pb.info(g).numel, 0.f);
    }
}

TEST(MoeShared, ParamsFollowMegatronNames) {
    const OneStep one = oneStep(sharedConfig(true));
    for (int layer = 0; layer < 2; ++layer) {
        const auto& fc1 = one.params.at(layerName(layer, "shared_experts.linear_fc1.weight"));
        const auto& fc2 = one.params.at(layerName(layer, "shared_experts.linear_fc2.weight"));
        const auto& gate = one.params.at(layerName(layer, "shared_experts.gate_weight"));
        EXPECT_EQ(fc1.size(), size_t(kShared) * 32);  // [Fs, h] (GeLU)
        EXPECT_EQ(fc2.size(), size_t(32) * kShared);  // [h, Fs]
        EXPECT_EQ(gate.size(), 32u);                  // [1, h], initialised like a weight
        EXPECT_NE(gate[0], 0.f);
        // Every shared weight receives a gradient.
        for (const char* n : {"shared_experts.linear_fc1.weight", "shared_experts.linear_fc2.weight",
                              "shared_experts.gate_weight"}) {
            double norm = 0;
            for (float g : one.grads.at(layerName(layer, n))) norm += double(g) * g;
            EXPECT_GT(norm, 0) << layer << " " << n;
        }
    }
    EXPECT_EQ(oneStep(sharedConfig(false)).params.count(layerName(0, "shared_experts.gate_weight")), 0u);
}

TEST(MoeShared, WithSilentRoutedExpertsTheLayerIsTheDenseMlpOfTheSharedSize) {
    engine::Config dense = sharedConfig();
    dense.num_moe_experts = 0;
    dense.moe_shared_expert_intermediate_size = 0;
    dense.ffn_hidden_size = kShared;
    const OneStep ref = oneStep(dense);
    for (bool overlap : {false, true}) {
        engine::Config c = sharedConfig();
        c.moe_shared_expert_overlap = overlap;
        c.moe_token_dispatcher_type = "alltoall";
        const OneStep got = oneStep(c, [&](HostParams& pb) { becomeTheDenseMlp(pb, ref, 1.f); });
        EXPECT_NEAR(got.loss, ref.loss, 1e-6 * ref.loss) << overlap;
        for (int layer = 0; layer < 2; ++layer) {
            for (const char* lin : {"linear_fc1", "linear_fc2"})
                EXPECT_LT(relError(got.grads.at(layerName(layer, std::string("shared_experts.") + lin + ".weight")),
                                   ref.grads.at(layerName(layer, std::string(lin) + ".weight"))),
                          1e-5)
                    << layer << " " << lin;
            // No gradient reaches the routed experts' fc1 through a zero fc2.
            for (float g : got.grads.at(layerName(layer, "experts.local_experts.0.linear_fc1.weight"))) ASSERT_EQ(g, 0.f);
        }
        EXPECT_LT(relError(got.grads.at("decoder.layers.0.self_attention.linear_qkv.weight"),
                           ref.grads.at("decoder.layers.0.self_attention.linear_qkv.weight")),
                  1e-5);
    }
}

// Zero gate weight: every token's gate is sigmoid(0) = 1/2, the dense model with fc2 halved.
TEST(MoeShared, ZeroGateHalvesTheSharedOutput) {
    engine::Config dense = sharedConfig();
    dense.num_moe_experts = 0;
    dense.moe_shared_expert_intermediate_size = 0;
    dense.ffn_hidden_size = kShared;
    const OneStep full = oneStep(dense);
    const OneStep half = oneStep(dense, [&](HostParams& pb) {
        for (int layer = 0; layer < 2; ++layer) {
            const int i = pb.find(layerName(layer, "linear_fc2.weight"));
            for (int64_t k = 0; k < pb.info(i).numel; ++k) pb.mainParam(i)[k] *= 0.5f;
        }
    });
    const OneStep got =
        oneStep(sharedConfig(true), [&](HostParams& pb) { becomeTheDenseMlp(pb, full, 1.f); });
    EXPECT_NEAR(got.loss, half.loss, 1e-6 * half.loss);
    EXPECT_NE(got.loss, full.loss);
    for (int layer = 0; layer < 2; ++layer) {
        // fc1 sees the same gradient as the halved dense fc1; fc2's is half the halved dense fc2's
        // (out = g * act W2^T with g = 1/2 vs act (W2/2)^T).
        EXPECT_LT(relError(got.grads.at(layerName(layer, "shared_experts.linear_fc1.weight")),
                           half.grads.at(layerName(layer, "linear_fc1.weight"))),
                  1e-5);
        std::vector<float> halfFc2 = half.grads.at(layerName(layer, "linear_fc2.weight"));
        for (float& g : halfFc2) g *= 0.5f;
        EXPECT_LT(relError(got.grads.at(layerName(layer, "shared_experts.linear_fc2.weight")), halfFc2), 1e-5);
    }
}

TEST(MoeShared, SharedAndGateGradientsMatchFiniteDifferences) {
    engine::Config c = sharedConfig(true);
    c.init_method_std = 0.2;  // routing decided by clear margins: small steps do not flip it
    c.moe_aux_loss_coeff = 0.01;
    EXPECT_EQ(expectGradientsMatchFiniteDifferences(
                  c,
                  {layerName(1, "shared_experts.linear_fc1.weight"), layerName(0, "shared_experts.linear_fc2.weight"),
                   layerName(0, "shared_experts.gate_weight"), layerName(1, "shared_experts.gate_weight")},
                  2),
              8);
}

TEST(MoeShared, FlopsAddADenseMlpOfTheSharedSizePerMoeLayer) {
    for (int freq : {1, 2}) {
        for (bool swiglu : {false, true}) {
            engine::Config c = sharedConfig();
            c.num_layers = 4;
            c.moe_layer_freq = std::to_string(freq);
            c.swiglu = swiglu;
            engine::Config routedOnly = c;
            routedOnly.moe_shared_expert_intermediate_size = 0;
            const double got = engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(c)) -
                               engine::megatronFlopsPerIteration(engine::FlopsInputs::fromConfig(routedOnly));
            const engine::DerivedSizes ds = engine::deriveSizes(c);
            const double tokens = double(ds.global_batch_size) * c.seq_length;
            const int moeLayers = freq == 1 ? 4 : 2;
            // Megatron: 3 (fwd, wgrad, dgrad) * 2 (FMA) * h * shared_ffn * (3 swiglu | 2) per MoE layer.
            EXPECT_DOUBLE_EQ(got, tokens * 6.0 * 32 * kShared * (swiglu ? 3 : 2) * moeLayers) << freq << swiglu;
            EXPECT_NE(engine::flopsFormulaText(engine::FlopsInputs::fromConfig(c)).find("shared experts"),
                      std::string::npos);
        }
    }
}

TEST(MoeShared, TensorParallelMustDivideTheSharedSize) {
    engine::Config c = withLayout(sharedConfig(), Layout{2, 1, 1, 1, 2});
    c.sequence_parallel = true;
    c.expert_tensor_parallel_size = 1;
    c.moe_shared_expert_intermediate_size = 33;
    auto d = engine::modelDimsFromConfig(c);
    ASSERT_FALSE(d.isOk());
    EXPECT_NE(d.status().message().find("moe_shared_expert_intermediate_size=33"), std::string::npos)
        << d.status().message();
    c.moe_shared_expert_intermediate_size = 34;
    EXPECT_TRUE(engine::modelDimsFromConfig(c).isOk());
}

// Stream order of one training step on one device: where the shared experts' forward and
// backward run relative to the router and the routed experts (layer 0, first microbatch).
struct Order {
    int64_t sharedFwd = -1, routerFwd = -1, expertsFwd = -1;
    int64_t sharedBwd = -1, routerBwd = -1, expertsBwd = -1;
};

Order stepOrder(const engine::Config& c) {
    FakeRecorder rec;
    const Status st = traceSingle(c, rec);
    EXPECT_TRUE(st.isOk()) << st.toString();
    if (!st.isOk()) return {};
    Order o;
    auto first = [](int64_t& at, int64_t ts) {
        if (at < 0 || ts < at) at = ts;
    };
    for (const auto& s : rec.slices) {
        if (s.layer != 0 || s.microbatch != 0 || rec.trackDesc(s.track).kind != trace::TrackKind::Compute) continue;
        const std::string n = rec.str(s.name);
        if (n == "shared_experts.linear_fc1.fwd") first(o.sharedFwd, s.startNs);
        if (n == "router.fwd") first(o.routerFwd, s.startNs);
        if (n.rfind("experts.", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".fwd") == 0)
            first(o.expertsFwd, s.startNs);
        if (n == "shared_experts.linear_fc2.bwd") first(o.sharedBwd, s.startNs);
        if (n == "router.bwd") first(o.routerBwd, s.startNs);
        if (n.rfind("experts.", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".bwd") == 0)
            first(o.expertsBwd, s.startNs);
    }
    return o;
}

TEST(MoeShared, OverlapRunsTheSharedExpertsBetweenDispatchAndRoutedExperts) {
    engine::Config c = sharedConfig(true);
    c.moe_token_dispatcher_type = "alltoall";
    const Order off = stepOrder(c);
    ASSERT_GE(off.sharedFwd, 0);
    ASSERT_GE(off.routerFwd, 0);
    ASSERT_GE(off.expertsFwd, 0);
    ASSERT_GE(off.sharedBwd, 0);
    ASSERT_GE(off.routerBwd, 0);
    ASSERT_GE(off.expertsBwd, 0);
    // Megatron's default: the shared experts before the router; backward in reverse.
    EXPECT_LT(off.sharedFwd, off.routerFwd);
    EXPECT_GT(off.sharedBwd, off.routerBwd);
    c.moe_shared_expert_overlap = true;
    const Order on = stepOrder(c);
    EXPECT_GT(on.sharedFwd, on.routerFwd);
    EXPECT_LT(on.sharedFwd, on.expertsFwd);
    EXPECT_LT(on.sharedBwd, on.expertsBwd);
    EXPECT_LT(on.sharedBwd, on.routerBwd);
}

// Parallel runs give the shared experts their own stream (Megatron's SharedExpertMLP.stream, with
// a TP communicator of its own): their ops run there, concurrently with the dispatcher's
// all-to-all on the compute stream; the sums are taken in one order: the same numbers bit for bit.
TEST(MoeShared, OverlapRunsOnTheSharedStreamWithTheSameNumbers) {
    for (int tp : {1, 2}) {
        engine::Config c = withLayout(sharedConfig(true), Layout{tp, 1, 1, 2, 2});
        if (tp > 1) {
            c.sequence_parallel = true;
            c.expert_tensor_parallel_size = 1;
        }
        c.expert_model_parallel_size = 2;
        c.moe_token_dispatcher_type = "alltoall";
        c.moe_aux_loss_coeff = 0.01;
        const std::string what = "tp" + std::to_string(tp) + "_ep2";
        auto off = runParallel(c, 3);
        ASSERT_TRUE(off.isOk()) << what << ": " << off.status().toString();
        c.moe_shared_expert_overlap = true;
        FakeRecorder rec;
        auto on = runParallel(c, 3, &rec);
        ASSERT_TRUE(on.isOk()) << what << ": " << on.status().toString();
        expectSame(*on, *off, 0.0, what + " overlap on vs off");
        int onShared = 0, elsewhere = 0, sharedTpComm = 0;
        for (const auto& sl : rec.slices) {
            const std::string n = rec.str(sl.name);
            const trace::TrackDesc& t = rec.trackDesc(sl.track);
            if (t.kind == trace::TrackKind::HostThread) continue;
            const bool sharedTrack = t.name.find("shared_experts") != std::string::npos;
            if (n.rfind("shared_experts.", 0) == 0) ++(sharedTrack ? onShared : elsewhere);
            if (sharedTrack && rec.str(sl.group) == "tp") ++sharedTpComm;
        }
        EXPECT_GT(onShared, 0) << what;
        EXPECT_EQ(elsewhere, 0) << what;
        if (tp > 1) {
            EXPECT_GT(sharedTpComm, 0) << what << ": the SP all-gather / reduce-scatter on that stream";
        }
    }
}

struct SharedLayout {
    const char* name;
    int tp, pp, dp, ep;
    bool distOpt = false, gate = false, overlap = false, swiglu = false;
    bool recompute = false, tpCommOverlap = false;
};
void PrintTo(const SharedLayout& l, std::ostream* os) { *os << l.name; }
class MoeSharedParallel : public ::testing::TestWithParam<SharedLayout> {};

TEST_P(MoeSharedParallel, EqualsTheSingleDeviceRun) {
    const SharedLayout L = GetParam();
    engine::Config c = withLayout(sharedConfig(L.gate), Layout{L.tp, L.pp, 1, L.dp, 2});
    if (L.tp > 1) {
        c.sequence_parallel = true;
        c.expert_tensor_parallel_size = 1;
    }
    c.swiglu = L.swiglu;
    if (L.recompute) {
        c.recompute_granularity = "full";
        c.recompute_method = "uniform";
        c.recompute_num_layers = 1;
    }
    c.tp_comm_overlap = L.tpCommOverlap;
    c.expert_model_parallel_size = L.ep;
    c.moe_token_dispatcher_type = "alltoall";
    c.use_distributed_optimizer = L.distOpt;
    c.moe_shared_expert_overlap = L.overlap;
    c.moe_aux_loss_coeff = 0.01;
    c.moe_z_loss_coeff = 0.001;
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, L.name);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeSharedParallel,
    ::testing::Values(SharedLayout{"tp2_sp_gate", 2, 1, 1, 1, false, true},
                      SharedLayout{"tp2_sp_swiglu", 2, 1, 1, 1, false, false, false, true},
                      SharedLayout{"ep2", 1, 1, 2, 2},
                      SharedLayout{"tp2_ep2_dp2_distopt_gate", 2, 1, 2, 2, true, true},
                      SharedLayout{"pp2_gate", 1, 2, 1, 1, false, true},
                      SharedLayout{"ep2_overlap_gate", 1, 1, 2, 2, false, true, true},
                      SharedLayout{"tp2_ep2_overlap", 2, 1, 1, 2, false, false, true},
                      SharedLayout{"ep2_pp2_full_recompute_overlap_gate", 1, 2, 2, 2, true, true, true, false, true},
                      SharedLayout{"tp2_tp_comm_overlap_swiglu", 2, 1, 1, 1, false, false, false, true, false, true},
                      SharedLayout{"tp2_tp_comm_overlap_moe_overlap_gate", 2, 1, 1, 1, false, true, true, false, false,
                                   true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(MoeShared, Ep2Dp2CheckpointResumesOnOneDevice) {
    engine::Config c = withLayout(sharedConfig(true), Layout{1, 1, 1, 2, 2});
    c.expert_model_parallel_size = 2;
    c.moe_token_dispatcher_type = "alltoall";
    c.moe_aux_loss_coeff = 0.01;
    expectCheckpointResumesOnOneDevice(c, "moe_shared_ep2_dp2");
}

}  // namespace
}  // namespace ts::test
