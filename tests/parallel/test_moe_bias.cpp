// MoE with add_bias_linear (Megatron's default; engine/model/gpt_moe.cpp): the router's bias and
// each expert's fc1 / fc2 biases. Checked against a per-expert reference of the whole one-layer
// model written here (router logits + b, top-k softmax, fc1 + b1, activation, * prob, fc2,
// + b2 * prob, summed per token), finite differences of the biases' gradients, every bias
// changing the run, parallel layouts against the single device (the biases are expert params
// reduced over edp), checkpoints across layouts, and the settings Megatron refuses with them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine/backend/backend.h"
#include "engine/config/knobs.h"
#include "engine/model/gpt.h"
#include "tests/parallel/parallel_test_util.h"

namespace ts::test {
namespace {

engine::Config biasConfig(int layers = 2) {
    engine::Config c = tinyConfig(layers);
    c.add_bias_linear = true;
    c.bias_dropout_fusion = false;  // Megatron's TEGroupedMLP asserts it off with biases
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.ffn_hidden_size = 64;
    return c;
}

std::string expertBias(int layer, int e, const char* lin) {
    return "decoder.layers." + std::to_string(layer) + ".mlp.experts.local_experts." + std::to_string(e) + "." + lin +
           ".bias";
}

// Deterministic nonzero values of magnitude ~scale.
void fillPattern(float* p, int64_t n, float scale, int salt) {
    for (int64_t i = 0; i < n; ++i) p[i] = scale * std::sin(0.7f * float(i) + 1.3f * float(salt) + 0.5f);
}

// Every bias of the MoE layers set to a nonzero pattern (so each one matters).
void setBiases(HostParams& pb, float scale = 0.2f) {
    for (int i = 0; i < pb.count(); ++i) {
        const std::string& n = pb.info(i).name;
        if (n.find(".mlp.experts.") != std::string::npos && n.find(".bias") != std::string::npos)
            fillPattern(pb.mainParam(i), pb.info(i).numel, scale, i);
    }
}

// ---- a per-expert reference of the one-layer model ------------------------------------------

struct Ref {
    const engine::Config& c;
    HostParams& pb;
    const float* P(const std::string& n) {
        const int i = pb.find(n);
        EXPECT_GE(i, 0) << n;
        return i >= 0 ? pb.mainParam(i) : nullptr;
    }
    static void layerNorm(const float* x, const float* w, const float* b, double eps, double* y, int h) {
        double mean = 0, var = 0;
        for (int i = 0; i < h; ++i) mean += x[i];
        mean /= h;
        for (int i = 0; i < h; ++i) var += (x[i] - mean) * (x[i] - mean);
        const double rstd = 1.0 / std::sqrt(var / h + eps);
        for (int i = 0; i < h; ++i) y[i] = (x[i] - mean) * rstd * w[i] + b[i];
    }
    static double gelu(double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

    // logits [T, V] of the tokens through: embedding -> layer 0 (attention output zeroed by the
    // caller: linear_proj weight and bias 0) -> MoE -> final norm -> tied output layer.
    std::vector<double> logits(const std::vector<int32_t>& tok) {
        const int h = c.hidden_size, E = c.num_moe_experts, K = c.moe_router_topk, V = 64;
        const int F = c.moe_ffn_hidden_size > 0 ? c.moe_ffn_hidden_size : c.ffn_hidden_size;
        const int F1 = c.swiglu ? 2 * F : F;
        const std::string pre = "decoder.layers.0.mlp.";
        const float* emb = P("embedding.word_embeddings.weight");
        const float *Wr = P(pre + "router.weight"), *br = P(pre + "router.bias");
        const float *ln2w = P("decoder.layers.0.pre_mlp_layernorm.weight"), *ln2b = P("decoder.layers.0.pre_mlp_layernorm.bias");
        const float *lnfw = P("decoder.final_layernorm.weight"), *lnfb = P("decoder.final_layernorm.bias");
        std::vector<double> out(tok.size() * static_cast<size_t>(V));
        const size_t hs = static_cast<size_t>(h);
        std::vector<double> a(hs), y(hs), f(static_cast<size_t>(F1)), act(static_cast<size_t>(F)), xf(hs);
        std::vector<float> x(hs), x2(hs);
        for (size_t t = 0; t < tok.size(); ++t) {
            for (int i = 0; i < h; ++i) x[size_t(i)] = emb[size_t(tok[t]) * h + i];
            layerNorm(x.data(), ln2w, ln2b, c.norm_epsilon, a.data(), h);
            // router: logits = W_r a + b_r; top-k (ties: lower index); softmax over the chosen
            std::vector<double> lg(static_cast<size_t>(E));
            for (int e = 0; e < E; ++e) {
                double s = br[e];
                for (int i = 0; i < h; ++i) s += double(Wr[size_t(e) * h + i]) * a[size_t(i)];
                lg[size_t(e)] = s;
            }
            std::vector<int> chosen;
            std::vector<char> used(static_cast<size_t>(E), 0);
            for (int k = 0; k < K; ++k) {
                int best = -1;
                for (int e = 0; e < E; ++e)
                    if (!used[size_t(e)] && (best < 0 || lg[size_t(e)] > lg[size_t(best)])) best = e;
                used[size_t(best)] = 1;
                chosen.push_back(best);
            }
            double mx = lg[size_t(chosen[0])], z = 0;
            for (int e : chosen) z += std::exp(lg[size_t(e)] - mx);
            std::fill(y.begin(), y.end(), 0.0);
            for (int e : chosen) {
                const double p = std::exp(lg[size_t(e)] - mx) / z;
                const float *W1 = P(pre + "experts.local_experts." + std::to_string(e) + ".linear_fc1.weight"),
                            *b1 = P(expertBias(0, e, "linear_fc1")),
                            *W2 = P(pre + "experts.local_experts." + std::to_string(e) + ".linear_fc2.weight"),
                            *b2 = P(expertBias(0, e, "linear_fc2"));
                for (int j = 0; j < F1; ++j) {
                    double s = b1[j];
                    for (int i = 0; i < h; ++i) s += double(W1[size_t(j) * h + i]) * a[size_t(i)];
                    f[size_t(j)] = s;
                }
                for (int j = 0; j < F; ++j)
                    act[size_t(j)] = c.swiglu ? f[size_t(j)] / (1 + std::exp(-f[size_t(j)])) * f[size_t(F + j)]
                                              : gelu(f[size_t(j)]);
                for (int i = 0; i < h; ++i) {
                    double s = 0;
                    for (int j = 0; j < F; ++j) s += double(W2[size_t(i) * F + j]) * act[size_t(j)] * p;
                    y[size_t(i)] += s + double(b2[i]) * p;
                }
            }
            for (int i = 0; i < h; ++i) x2[size_t(i)] = float(double(x[size_t(i)]) + y[size_t(i)]);
            layerNorm(x2.data(), lnfw, lnfb, c.norm_epsilon, xf.data(), h);
            for (int v = 0; v < V; ++v) {
                double s = 0;
                for (int i = 0; i < h; ++i) s += double(emb[size_t(v) * h + i]) * xf[size_t(i)];
                out[t * size_t(V) + size_t(v)] = s;
            }
        }
        return out;
    }
};

// The engine's logits of one forward of the one-layer model (attention output zeroed, biases set
// unless `zeroBiases`) and the reference's.
void expectLayerMatchesReference(engine::Config c, bool zeroBiases, std::vector<float>* got = nullptr) {
    c.num_layers = 1;
    c.position_embedding_type = "rope";
    auto backend = engine::makeCpuBackend(1);
    engine::Device& dev = backend->device(0);
    auto stream = dev.createStream(trace::TrackKind::Compute, "compute");
    auto m = engine::GptModel::create(c, dev, *stream);
    ASSERT_TRUE(m.isOk()) << m.status().toString();
    engine::GptModel& model = **m;
    HostParams pb(model.params(), *stream);
    for (const char* n : {"decoder.layers.0.self_attention.linear_proj.weight", "decoder.layers.0.self_attention.linear_proj.bias"}) {
        const int i = pb.find(n);
        ASSERT_GE(i, 0) << n;
        std::fill(pb.mainParam(i), pb.mainParam(i) + pb.info(i).numel, 0.f);
    }
    if (!zeroBiases) setBiases(pb);
    // LayerNorm weights/biases away from 1/0 so they are not trivially right
    for (const char* n : {"decoder.layers.0.pre_mlp_layernorm.bias", "decoder.final_layernorm.bias"})
        fillPattern(pb.mainParam(pb.find(n)), c.hidden_size, 0.1f, 7);
    ASSERT_TRUE(pb.upload().isOk());
    auto mb = std::make_shared<engine::Microbatch>();
    const int T = c.seq_length * c.micro_batch_size;
    for (int t = 0; t < T; ++t) {
        mb->tokens.push_back((t * 7 + 3) % c.vocab_size);
        mb->labels.push_back((t * 5 + 1) % c.vocab_size);
    }
    model.setCaptureLogits(true);
    model.beginStep(0, 1);
    ASSERT_TRUE(model.forward(0, mb).isOk());
    ASSERT_TRUE(model.exec().synchronize().isOk());
    const std::vector<float>& L = model.capturedLogits(0);
    ASSERT_EQ(L.size(), size_t(T) * 64);
    Ref ref{c, pb};
    const std::vector<double> want = ref.logits(mb->tokens);
    double err = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        err = std::max(err, std::fabs(double(L[i]) - want[i]));
        scale = std::max(scale, std::fabs(want[i]));
    }
    EXPECT_LT(err / scale, 2e-5) << "grouped " << c.moe_grouped_gemm << " swiglu " << c.swiglu;
    if (got) *got = L;
}

TEST(MoeBias, OneLayerMatchesThePerExpertReference) {
    for (bool swiglu : {false, true})
        for (bool grouped : {false, true})
            for (bool fused : {false, true}) {
                engine::Config c = biasConfig(1);
                c.swiglu = swiglu;
                c.moe_grouped_gemm = grouped;
                c.bias_activation_fusion = fused;
                expectLayerMatchesReference(c, false);
            }
}

// A silently ignored bias fails: the biases set change the logits (and the reference with them).
TEST(MoeBias, BiasesChangeTheLogits) {
    engine::Config c = biasConfig(1);
    std::vector<float> with, without;
    expectLayerMatchesReference(c, false, &with);
    expectLayerMatchesReference(c, true, &without);
    ASSERT_EQ(with.size(), without.size());
    EXPECT_GT(relError(with, without), 1e-3);
}

// Each kind of bias on its own changes the loss of a training step.
TEST(MoeBias, EveryBiasChangesTheRun) {
    const engine::Config c = biasConfig();
    const OneStep base = oneStep(c);
    for (const std::string& n : {std::string("decoder.layers.1.mlp.router.bias"), expertBias(0, 1, "linear_fc1"),
                                 expertBias(1, 2, "linear_fc2")}) {
        const OneStep edited = oneStep(c, [&](HostParams& pb) {
            const int i = pb.find(n);
            ASSERT_GE(i, 0) << n;
            fillPattern(pb.mainParam(i), pb.info(i).numel, 0.5f, 3);
        });
        EXPECT_GT(std::fabs(edited.loss - base.loss), 1e-6) << n;
    }
    // The router's bias is drawn like its weight (Megatron's init_method), the experts' are zero.
    const auto& rb = base.params.at("decoder.layers.0.mlp.router.bias");
    EXPECT_GT(*std::max_element(rb.begin(), rb.end()), 0.f);
    for (float v : base.params.at(expertBias(0, 0, "linear_fc2"))) EXPECT_EQ(v, 0.f);
    // ... and every bias gets a gradient.
    for (const std::string& n : {std::string("decoder.layers.0.mlp.router.bias"), expertBias(0, 0, "linear_fc1"),
                                 expertBias(0, 0, "linear_fc2")}) {
        const auto& g = base.grads.at(n);
        double s = 0;
        for (float v : g) s += std::fabs(v);
        EXPECT_GT(s, 0) << n;
    }
}

// The biases' gradients (and the router weight's, which sees fc2's bias through the probs)
// against central finite differences, with nonzero biases.
TEST(MoeBias, GradientsMatchFiniteDifferences) {
    for (bool swiglu : {false, true}) {
        engine::Config c = biasConfig();
        c.swiglu = swiglu;
        c.init_method_std = 0.2;  // routing decided by clear margins: small steps do not flip it
        c.moe_aux_loss_coeff = 0.01;
        const double eps = 1e-2;
        const OneStep base = oneStep(c, [](HostParams& pb) { setBiases(pb, 0.5f); });
        int checked = 0;
        for (const std::string& name : {std::string("decoder.layers.0.mlp.router.bias"), std::string("decoder.layers.1.mlp.router.weight"),
                                        expertBias(1, 2, "linear_fc1"), expertBias(0, 1, "linear_fc2"),
                                        expertBias(1, 3, "linear_fc2")}) {
            const std::vector<float>& g = base.grads.at(name);
            std::vector<size_t> idx(g.size());
            for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
            std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(),
                              [&](size_t a, size_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
            for (int k = 0; k < 2; ++k) {
                const size_t j = idx[size_t(k)];
                double l[2];
                for (int sgn = 0; sgn < 2; ++sgn)
                    l[sgn] = oneStep(c, [&](HostParams& pb) {
                                 setBiases(pb, 0.5f);
                                 pb.mainParam(pb.find(name))[j] += float(sgn ? -eps : eps);
                             }).loss;
                const double numeric = (l[0] - l[1]) / (2 * eps);
                EXPECT_GT(std::fabs(numeric), 1e-6) << name << "[" << j << "]";
                EXPECT_NEAR(g[j], numeric, 0.05 * std::fabs(numeric) + 1e-5) << name << "[" << j << "] swiglu " << swiglu;
                ++checked;
            }
        }
        EXPECT_EQ(checked, 10);
    }
}

TEST(MoeBias, GroupedAndPerExpertOpsAgreeInFp32) {
    engine::Config a = biasConfig();
    a.moe_aux_loss_coeff = 0.01;
    engine::Config b = a;
    b.moe_grouped_gemm = true;
    const RunResult ra = runSingle(a, 3), rb = runSingle(b, 3);
    expectSame(rb, ra, 1e-6, "grouped vs per expert");
}

// ---- parallel layouts against the single device -----------------------------------------

struct BiasLayout {
    const char* name;
    int tp, ep, dp, pp;
    bool distOpt = false, grouped = false, swiglu = false, recompute = false;
    const char* dispatcher = "alltoall";
    double capacity = 0;
    bool pad = false;
};
void PrintTo(const BiasLayout& l, std::ostream* os) { *os << l.name; }

engine::Config biasLayoutConfig(const BiasLayout& L) {
    // Megatron: biases in MoE only with ETP 1
    engine::Config c = moeLayoutConfig(biasConfig(), ExpertLayout{L.tp, 1, L.ep, L.dp, L.pp, 1, L.distOpt, L.dispatcher,
                                                               L.swiglu, L.grouped, L.recompute, L.capacity, L.pad});
    c.moe_aux_loss_coeff = 0.01;
    return c;
}

class MoeBiasParallel : public ::testing::TestWithParam<BiasLayout> {};

TEST_P(MoeBiasParallel, EqualsTheSingleDeviceRun) {
    const engine::Config c = biasLayoutConfig(GetParam());
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, GetParam().name);
    // The zero-initialised expert biases trained (Adam moves each entry by ~lr a step), so the
    // comparison covered them and steps 2 and 3 ran with nonzero biases.
    const auto& b = ref.params.at(expertBias(1, 3, "linear_fc2"));
    EXPECT_GT(std::fabs(*std::max_element(b.begin(), b.end(), [](float x, float y) { return std::fabs(x) < std::fabs(y); })),
              1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeBiasParallel,
    ::testing::Values(BiasLayout{"ep2_dp2", 1, 2, 2, 1},
                      BiasLayout{"tp2_ep2_sp", 2, 2, 1, 1, false, false, true},
                      BiasLayout{"ep2_dp2_distopt_grouped", 1, 2, 2, 1, true, true},
                      BiasLayout{"pp2_ep2", 1, 2, 2, 2, false, true},
                      BiasLayout{"ep2_dp2_capacity_pad", 1, 2, 2, 1, false, false, false, false, "alltoall", 1.0, true},
                      BiasLayout{"ep2_dp2_allgather_swiglu", 1, 2, 2, 1, false, false, true, false, "allgather"},
                      BiasLayout{"ep2_pp2_full_recompute", 1, 2, 2, 2, true, true, true, true}),
    [](const auto& info) { return std::string(info.param.name); });

// bf16 (the biases' roundings) and FP8 experts (the biases stay unquantized) on ep2·dp2: the
// single device's run of the same precision; and each differs from fp32 (it really ran).
TEST(MoeBias, Bf16AndFp8ExpertsOnEp2EqualTheSingleDevice) {
    const engine::Config base = biasLayoutConfig(BiasLayout{"ep2_dp2", 1, 2, 2, 1});
    const RunResult fp32 = runSingle(singleDevice(base), 3);
    for (const char* fp8 : {"", "hybrid"}) {
        engine::Config c = base;
        c.bf16 = true;
        c.fp8 = fp8;
        c.fp8_recipe = "delayed";
        c.fp8_amax_history_len = 4;
        c.fp8_amax_compute_algo = "max";
        c.moe_grouped_gemm = *fp8 != 0;
        const std::string what = std::string("bf16") + (*fp8 ? " fp8" : "");
        const RunResult ref = runSingle(singleDevice(c), 3);
        auto par = runParallel(c, 3);
        ASSERT_TRUE(par.isOk()) << par.status().toString();
        expectSame(*par, ref, *fp8 ? fp8LayoutTol(1e-5) : 1e-5, what);
        EXPECT_NE(ref.losses[2], fp32.losses[2]) << what;
    }
}

// ---- checkpoints ------------------------------------------------------------------------

TEST(MoeBiasCheckpoint, Ep2Dp2CheckpointResumesOnOneDevice) {
    expectCheckpointResumesOnOneDevice(biasLayoutConfig(BiasLayout{"ep2_dp2", 1, 2, 2, 1}), "moe_bias_ep2_dp2");
}

TEST(MoeBiasCheckpoint, OneDeviceCheckpointResumesOnEp2Dp2) {
    const engine::Config c = biasLayoutConfig(BiasLayout{"ep2_dp2", 1, 2, 2, 1});
    expectOneDeviceCheckpointResumesOn(c, "moe_bias_one_to_ep2_dp2");
}

// num_parameters counts each bias once (the single device's count), and the biases are exactly
// the ones add_bias_linear adds: per layer linear_qkv [3h], linear_proj [h], the router's [E] and
// each expert's fc1 [F] and fc2 [h].
TEST(MoeBias, NumParametersIsTheSingleDevicesCount) {
    const engine::Config c = biasLayoutConfig(BiasLayout{"tp2_ep2_dp2", 2, 2, 2, 1});
    auto par = engine::ParallelTrainer::create(c);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    auto one = engine::Trainer::create(singleDevice(c));
    ASSERT_TRUE(one.isOk()) << one.status().toString();
    engine::Config nb = singleDevice(c);
    nb.add_bias_linear = false;
    auto noBias = engine::Trainer::create(nb);
    ASSERT_TRUE(noBias.isOk()) << noBias.status().toString();
    const int64_t single = (*one)->model().params().numel();
    const int h = 32, E = 4, F = 64;
    EXPECT_EQ(single - (*noBias)->model().params().numel(), 2 * (3 * h + h + E + E * (F + h)));
    EXPECT_EQ((*par)->runMetadata().at("num_parameters").get<int64_t>(), single);
}

// ---- what Megatron refuses with biases ----------------------------------------------------

TEST(MoeBias, SettingsMegatronRefusesAreNamed) {
    for (auto [knob, set] : std::vector<std::pair<std::string, std::function<void(engine::Config&)>>>{
             {"expert_tensor_parallel_size",
              [](engine::Config& c) {
                  c = withLayout(c, Layout{2, 1, 1, 1, 2});
                  c.sequence_parallel = true;
                  c.expert_tensor_parallel_size = 2;
              }},
             {"moe_shared_expert_intermediate_size", [](engine::Config& c) { c.moe_shared_expert_intermediate_size = 32; }},
             {"bias_dropout_fusion",
              [](engine::Config& c) {
                  c.moe_grouped_gemm = true;
                  c.bias_dropout_fusion = true;
              }}}) {
        engine::Config c = biasConfig();
        set(c);
        auto d = engine::modelDimsFromConfig(c);
        ASSERT_FALSE(d.isOk()) << knob;
        EXPECT_NE(d.status().message().find(knob), std::string::npos) << knob << ": " << d.status().message();
        EXPECT_NE(d.status().message().find("add_bias_linear"), std::string::npos) << d.status().message();
        bool flagged = false;
        for (const auto& i : engine::validateConfig(c)) flagged |= i.knob == "add_bias_linear" || i.knob == knob;
        EXPECT_TRUE(flagged) << knob;
    }
    // Without those, biases with experts run (the per-expert grouped GEMM without bias_dropout_fusion too).
    engine::Config ok = biasConfig();
    ok.moe_grouped_gemm = true;
    EXPECT_TRUE(engine::modelDimsFromConfig(ok).isOk());
}

}  // namespace
}  // namespace ts::test
