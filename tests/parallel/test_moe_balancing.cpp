// MoE load balancing beyond the single aux loss (engine/model/gpt_moe.cpp, moe_routing.h):
// quantile balancing (moe_router_load_balancing_type=quantile_balancing; Megatron's
// TopKRouter.quantile_balancing, moe_utils.py qb_dual_update, finalize_model_grads'
// _update_router_qb_beta) against a brute-force reference of qb_dual_update written here, on
// uniform scores, balancing a skewed router, its parallel layouts against the single device
// (losses, weights and qb_beta) and its checkpoints; and Megatron's list form of the
// load-balancing types ([aux_loss, seq_aux_loss] with a coefficient each) against the sum of the
// single-type runs, and the refusals of both.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <fstream>
#include <random>

#include "engine/backend/backend.h"
#include "engine/config/knobs.h"
#include "engine/model/moe_routing.h"
#include "tests/parallel/fake_recorder.h"
#include "tests/parallel/parallel_test_util.h"

namespace ts::test {
namespace {

// ---- qb_dual_update against a brute-force reference ---------------------------------------

// By counting, not sorting: expert j is among a token's k best of v = scores - beta iff fewer than
// k experts beat it (greater, or equal at a lower index, as torch.topk keeps the lower index); the
// (r+1)-th largest x of a list has at most r entries above it and at least r+1 at or above it.
struct QbReference {
    std::vector<std::vector<int>> chosen;  // per token, the chosen experts ordered best first
    std::vector<float> quantile;
};
float kthLargest(const std::vector<float>& xs, int r) {
    for (float x : xs) {
        int above = 0, atOrAbove = 0;
        for (float y : xs) {
            above += y > x;
            atOrAbove += y >= x;
        }
        if (above <= r && atOrAbove >= r + 1) return x;
    }
    ADD_FAILURE() << "no " << r << "-th largest";
    return 0;
}
QbReference qbReference(const std::vector<float>& S, int m, int n, int k, const std::vector<float>& beta) {
    QbReference ref;
    std::vector<float> alpha(static_cast<size_t>(m));
    for (int t = 0; t < m; ++t) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) v[size_t(j)] = S[size_t(t) * n + size_t(j)] - beta[size_t(j)];
        std::vector<std::pair<int, int>> rankOf;  // (experts that beat j, j)
        for (int j = 0; j < n; ++j) {
            int beaten = 0;
            for (int i = 0; i < n; ++i) beaten += v[size_t(i)] > v[size_t(j)] || (v[size_t(i)] == v[size_t(j)] && i < j);
            rankOf.push_back({beaten, j});
        }
        std::sort(rankOf.begin(), rankOf.end());
        std::vector<int> c;
        for (int r = 0; r < k; ++r) c.push_back(rankOf[size_t(r)].second);
        ref.chosen.push_back(c);
        alpha[size_t(t)] = kthLargest(v, k);
    }
    const int target = m * k / n;
    for (int j = 0; j < n; ++j) {
        std::vector<float> col(static_cast<size_t>(m));
        for (int t = 0; t < m; ++t) col[size_t(t)] = S[size_t(t) * n + size_t(j)] - alpha[size_t(t)];
        ref.quantile.push_back(kthLargest(col, target));
    }
    return ref;
}

void expectQbMatchesReference(const std::vector<float>& S, int m, int n, int k, const std::vector<float>& beta,
                              const std::string& what) {
    std::vector<int> idx(size_t(m) * k, -1);
    std::vector<float> q(static_cast<size_t>(n), -1e30f);
    engine::moeQbDualUpdate(S.data(), m, n, k, beta.data(), idx.data(), q.data());
    const QbReference ref = qbReference(S, m, n, k, beta);
    for (int t = 0; t < m; ++t)
        for (int j = 0; j < k; ++j)
            EXPECT_EQ(idx[size_t(t) * k + size_t(j)], ref.chosen[size_t(t)][size_t(j)]) << what << " token " << t;
    for (int j = 0; j < n; ++j) EXPECT_EQ(q[size_t(j)], ref.quantile[size_t(j)]) << what << " expert " << j;
}

TEST(MoeQuantileBalancing, DualUpdateMatchesABruteForceReference) {
    std::mt19937 rng(7);
    for (auto [m, n, k] : {std::tuple{8, 4, 1}, std::tuple{6, 4, 2}, std::tuple{12, 6, 3}, std::tuple{10, 5, 4}}) {
        const std::string what = "m" + std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k);
        // small integers: many ties inside tokens, inside experts' columns and against beta
        std::uniform_int_distribution<int> small(-2, 2);
        std::vector<float> S(size_t(m) * n), beta(static_cast<size_t>(n));
        for (float& x : S) x = float(small(rng));
        for (float& b : beta) b = float(small(rng)) * 0.5f;
        expectQbMatchesReference(S, m, n, k, beta, what + " ties");
        std::normal_distribution<float> g(0.f, 1.f);
        for (float& x : S) x = g(rng);
        for (float& b : beta) b = 0.3f * g(rng);
        expectQbMatchesReference(S, m, n, k, beta, what + " random");
    }
}

// The selections' total order (kernels/common/moe_balance.h): a NaN ranks above +inf (as in
// torch.topk), whatever its sign (the CPU's inf - inf is a negative NaN, the GPU's positive); -0
// and +0 are equal, so the lower expert wins; a quantile that is a NaN comes back as one.
TEST(MoeQuantileBalancing, NaNsRankFirstAndSignedZerosTie) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const int m = 4, n = 4, k = 1;
    const std::vector<float> S = {1.f, -nan, inf, 0.f,    // the NaN (negative sign bit), then +inf
                                  -0.f, 0.f, -1.f, -2.f,  // -0 and +0 tie: expert 0
                                  inf, -inf, inf, 3.f,    // two +inf: the lower
                                  -inf, -inf, -inf, -inf};
    const std::vector<float> beta(static_cast<size_t>(n), 0.f);
    std::vector<int> idx(size_t(m) * k, -1);
    std::vector<float> q(static_cast<size_t>(n), 0.f);
    engine::moeQbDualUpdate(S.data(), m, n, k, beta.data(), idx.data(), q.data());
    EXPECT_EQ(idx, (std::vector<int>{1, 0, 0, 0}));
    // alphas (each token's 2nd best): +inf, +0, +inf, -inf. Each column's 2nd largest of S - alpha
    // (c = m*k/n = 1): columns 0-2 hold at least two NaNs (inf - inf, NaN - inf, -inf - -inf),
    // which rank first; column 3 is {-inf, -2, -inf, NaN}: -2.
    for (int j = 0; j < 3; ++j) EXPECT_TRUE(std::isnan(q[size_t(j)])) << "expert " << j << ": " << q[size_t(j)];
    EXPECT_EQ(q[3], -2.f);
}

// Uniform logits: every token picks experts 0..k-1 (ties to the lower index), every column
// quantile is 0, and the update keeps qb_beta at 0 (centred).
TEST(MoeQuantileBalancing, UniformLogitsChooseTheFirstExpertsAndKeepBetaZero) {
    const int m = 8, n = 4, k = 2;
    const std::vector<float> S(size_t(m) * n, 0.75f), beta(static_cast<size_t>(n), 0.f);
    std::vector<int> idx(size_t(m) * k);
    std::vector<float> q(static_cast<size_t>(n), 1.f);
    engine::moeQbDualUpdate(S.data(), m, n, k, beta.data(), idx.data(), q.data());
    for (int t = 0; t < m; ++t) {
        EXPECT_EQ(idx[size_t(t) * k], 0);
        EXPECT_EQ(idx[size_t(t) * k + 1], 1);
    }
    for (float x : q) EXPECT_EQ(x, 0.f);
    std::vector<float> b = beta;
    engine::moeQbBetaUpdate(b.data(), q.data(), n, 0.0);
    for (float x : b) EXPECT_EQ(x, 0.f);
}

// A skewed router (expert j's logits shifted by 1.5*(n/2 - j)): with qb_beta 0 the first experts
// take most tokens; over a few steps of the update (fresh tokens each step) qb_beta learns the
// shifts (centred: 2.25, 0.75, -0.75, -2.25) and every expert's load comes near m*k/n. Each update
// is the ema blend of the old beta and the quantiles, centred.
TEST(MoeQuantileBalancing, BetaMovesASkewedRouterTowardBalance) {
    const int m = 256, n = 4, k = 2, target = m * k / n;
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.f, 1.f);
    std::vector<float> beta(static_cast<size_t>(n), 0.f);
    auto imbalance = [&](const std::vector<float>& S) {  // sum over experts of |load - m*k/n|
        std::vector<int> idx(size_t(m) * k), load(static_cast<size_t>(n), 0);
        engine::moeQbDualUpdate(S.data(), m, n, k, beta.data(), idx.data(), nullptr);
        for (int i : idx) load[size_t(i)]++;
        int off = 0;
        for (int l : load) off += std::abs(l - target);
        return off;
    };
    auto batch = [&] {
        std::vector<float> S(size_t(m) * n);
        for (int t = 0; t < m; ++t)
            for (int j = 0; j < n; ++j) S[size_t(t) * n + size_t(j)] = g(rng) + 1.5f * float(n / 2 - j);
        return S;
    };
    const int before = imbalance(batch());
    EXPECT_GT(before, m * k / 2) << "the router must start skewed";
    double late = 0;
    for (int step = 0; step < 12; ++step) {
        const std::vector<float> S = batch();
        std::vector<float> q(static_cast<size_t>(n));
        engine::moeQbDualUpdate(S.data(), m, n, k, beta.data(), nullptr, q.data());
        const std::vector<float> old = beta;
        engine::moeQbBetaUpdate(beta.data(), q.data(), n, 0.25);
        float sum = 0, meanQ = 0;
        for (int j = 0; j < n; ++j) {
            sum += beta[size_t(j)];
            meanQ += q[size_t(j)] / n;
        }
        EXPECT_NEAR(sum, 0.f, 1e-5f);
        for (int j = 0; j < n; ++j)
            EXPECT_NEAR(beta[size_t(j)], 0.25f * old[size_t(j)] + 0.75f * q[size_t(j)] - 0.75f * meanQ, 1e-5f);
        if (step >= 8) late += imbalance(batch()) / 4.0;
    }
    for (int j = 0; j < n; ++j) EXPECT_NEAR(beta[size_t(j)], 1.5f * (1.5f - float(j)), 0.35f) << "expert " << j;
    EXPECT_LT(late, before / 8.0) << "qb_beta did not balance the load (before " << before << ")";
}

// ---- the model with quantile balancing -----------------------------------------------------

engine::Config qbConfig() {
    engine::Config c = tinyConfig(2);
    c.add_bias_linear = false;
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.ffn_hidden_size = 64;
    c.moe_router_load_balancing_type = "quantile_balancing";
    c.moe_aux_loss_coeff = 0;
    c.moe_z_loss_coeff = 0.001;
    c.moe_router_quantile_balancing_ema = 0.5;
    c.init_method_std = 0.2;  // logits wide enough that qb_beta changes the choice
    c.lr = 3e-3;              // ... and the loss still falls within three steps
    return c;
}

// qb_beta of a checkpoint (moe_router_qb_beta: {"<layer>": [E]}), flattened layer by layer.
std::vector<float> savedQbBeta(const std::string& dir) {
    std::ifstream in(dir + "/checkpoint.json");
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    std::vector<float> out;
    if (!j.is_object() || !j.contains("moe_router_qb_beta")) {
        ADD_FAILURE() << dir << ": no moe_router_qb_beta";
        return out;
    }
    for (const auto& [layer, beta] : j["moe_router_qb_beta"].items())
        for (const auto& x : beta) out.push_back(x.get<float>());
    return out;
}

TEST(MoeQuantileBalancing, ChangesTheRunAndMovesBeta) {
    engine::Config c = qbConfig();
    engine::Config plain = c;
    plain.moe_router_load_balancing_type = "none";
    const std::string dir = checkpointDir("qb_moves");
    auto qb = trainSingle(c, 3, "", dir);
    ASSERT_TRUE(qb.isOk()) << qb.status().toString();
    const RunResult ref = runSingle(plain, 3);
    EXPECT_NE(qb->losses[2], ref.losses[2]);
    const std::vector<float> beta = savedQbBeta(dir);
    ASSERT_EQ(beta.size(), 8u);  // 2 layers x 4 experts
    double moved = 0, sum0 = 0;
    for (size_t e = 0; e < beta.size(); ++e) {
        moved += std::fabs(beta[e]);
        if (e < 4) sum0 += beta[e];
    }
    EXPECT_GT(moved, 1e-3) << "qb_beta did not move";
    EXPECT_NEAR(sum0, 0.0, 1e-5) << "qb_beta is centred";
    std::filesystem::remove_all(dir);
}

struct QbLayout {
    const char* name;
    ExpertLayout layout;
};
void PrintTo(const QbLayout& l, std::ostream* os) { *os << l.name; }

class MoeQuantileBalancingParallel : public ::testing::TestWithParam<QbLayout> {};

// Losses, final weights and qb_beta of each layout against the single device: the quantile sees
// the microbatch's tokens (gathered over tp-cp), the step's mean over dp ranks is the single
// device's mean over the same microbatches.
TEST_P(MoeQuantileBalancingParallel, EqualsTheSingleDeviceRun) {
    const engine::Config c = moeLayoutConfig(qbConfig(), GetParam().layout);
    const std::string oneDir = checkpointDir(std::string("qb_one_") + GetParam().name);
    const std::string parDir = checkpointDir(std::string("qb_par_") + GetParam().name);
    auto ref = trainSingle(singleDevice(c), 3, "", oneDir);
    ASSERT_TRUE(ref.isOk()) << ref.status().toString();
    auto par = trainParallel(c, 3, "", parDir);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, *ref, 1e-5, GetParam().name);
    const std::vector<float> want = savedQbBeta(oneDir), got = savedQbBeta(parDir);
    ASSERT_EQ(got.size(), want.size());
    double moved = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-5) << GetParam().name << " qb_beta[" << i << "]";
        moved += std::fabs(want[i]);
    }
    EXPECT_GT(moved, 1e-3);
    std::filesystem::remove_all(oneDir);
    std::filesystem::remove_all(parDir);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeQuantileBalancingParallel,
    ::testing::Values(QbLayout{"tp2_sp", ExpertLayout{.tp = 2, .etp = 1}}, QbLayout{"cp2", ExpertLayout{.cp = 2}},
                      QbLayout{"ep2_dp2", ExpertLayout{.ep = 2, .dp = 2}}, QbLayout{"pp2", ExpertLayout{.pp = 2}},
                      QbLayout{"ep2_dp2_recompute", ExpertLayout{.ep = 2, .dp = 2, .recompute = true}}),
    [](const auto& info) { return std::string(info.param.name); });

// qb_beta travels in checkpoints: single device -> tp2 (SP) and ep2·dp2 -> single device resume
// at the uninterrupted run's third step; a checkpoint without it resumes differently.
TEST(MoeQuantileBalancing, CheckpointsKeepBeta) {
    expectOneDeviceCheckpointResumesOn(moeLayoutConfig(qbConfig(), ExpertLayout{.tp = 2, .etp = 1}), "qb_one_to_tp2");
    expectCheckpointResumesOnOneDevice(moeLayoutConfig(qbConfig(), ExpertLayout{.ep = 2, .dp = 2}), "qb_ep2_dp2_to_one");
    // The same checkpoint with qb_beta removed: the resumed step is not the straight run's.
    const engine::Config one = singleDevice(moeLayoutConfig(qbConfig(), ExpertLayout{.ep = 2, .dp = 2}));
    const std::string dir = checkpointDir("qb_dropped");
    ASSERT_TRUE(trainSingle(one, 2, "", dir).isOk());
    {
        std::ifstream in(dir + "/checkpoint.json");
        nlohmann::json j = nlohmann::json::parse(in);
        ASSERT_TRUE(j.contains("moe_router_qb_beta"));
        j.erase("moe_router_qb_beta");
        std::ofstream(dir + "/checkpoint.json") << j.dump();
    }
    const RunResult straight = runSingle(one, 3);
    auto resumed = trainSingle(one, 1, dir);
    ASSERT_TRUE(resumed.isOk()) << resumed.status().toString();
    EXPECT_GT(std::fabs(resumed->losses[0] - straight.losses[2]), 1e-6 * straight.losses[2]);
    std::filesystem::remove_all(dir);
}

// What Megatron asserts becomes a refusal that names the knob.
TEST(MoeQuantileBalancing, RefusalsNameTheKnob) {
    struct Case {
        const char* knob;
        std::function<void(engine::Config&)> set;
    };
    for (const Case& k : std::vector<Case>{
             {"moe_aux_loss_coeff", [](engine::Config& c) { c.moe_aux_loss_coeff = 0.01; }},
             {"moe_router_num_groups", [](engine::Config& c) {
                  c.moe_router_num_groups = 2;
                  c.moe_router_group_topk = 1;
              }},
             {"micro_batch_size", [](engine::Config& c) {
                  c.num_moe_experts = 6;  // 2*16*2 = 64 routed slots, not divisible by 6
                  c.moe_router_topk = 2;
              }},
             {"moe_router_topk", [](engine::Config& c) { c.moe_router_topk = 4; }},
             {"moe_expert_capacity_factor", [](engine::Config& c) { c.moe_expert_capacity_factor = 1.0; }}}) {
        engine::Config c = qbConfig();
        k.set(c);
        auto d = engine::modelDimsFromConfig(c);
        ASSERT_FALSE(d.isOk()) << k.knob;
        EXPECT_NE(d.status().message().find(k.knob), std::string::npos) << k.knob << ": " << d.status().message();
        bool named = false;
        for (const auto& issue : engine::validateConfig(c)) named |= issue.knob == k.knob;
        EXPECT_TRUE(named) << k.knob << ": validate names it";
    }
    EXPECT_TRUE(engine::modelDimsFromConfig(qbConfig()).isOk());
}

// ---- Megatron's list form of the load-balancing types ---------------------------------------

engine::Config listConfig(std::vector<std::string> types, std::vector<double> coeffs) {
    engine::Config c = tinyConfig(2);
    c.add_bias_linear = false;
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.ffn_hidden_size = 64;
    c.init_method_std = 0.2;
    c.moe_router_load_balancing_type = engine::OneOrList<std::string>(std::move(types));
    c.moe_aux_loss_coeff = engine::OneOrList<double>(std::move(coeffs));
    return c;
}

// The first step's router counters of a single-device run ("moe.layer<L>.<name>" -> value).
std::map<std::string, double> firstStepCounters(const engine::Config& c) {
    FakeRecorder rec;
    const Status st = traceSingle(c, rec);
    EXPECT_TRUE(st.isOk()) << st.toString();
    std::map<std::string, double> out;
    for (const auto& k : rec.counters) {
        const std::string name = rec.str(k.name);
        if (name.rfind("moe.layer", 0) == 0 && name.find("loss") != std::string::npos) out[name] += k.value;
    }
    return out;
}

// [aux_loss, seq_aux_loss] with (a, b): each term is logged alone as Megatron names it and equals
// the single-type run's, the logged total is their weighted sum, and the gradient of every param
// is the sum of the two single-type runs' aux gradients (each minus the run without aux loss).
TEST(MoeLoadBalancingList, AuxAndSeqAuxLossEqualTheSumOfTheSingleTypes) {
    const double a = 0.3, b = 0.2;  // large: the aux terms move the router's gradient visibly
    const engine::Config list = listConfig({"aux_loss", "seq_aux_loss"}, {a, b});
    const engine::Config aux = listConfig({"aux_loss"}, {a}), seq = listConfig({"seq_aux_loss"}, {b});
    const engine::Config none = listConfig({"none"}, {0.0});
    ASSERT_TRUE(list.moe_router_load_balancing_type.isList());
    ASSERT_FALSE(aux.moe_router_load_balancing_type.isList());

    const auto cl = firstStepCounters(list), ca = firstStepCounters(aux), cs = firstStepCounters(seq);
    // The counters' statistics are fp32 sums (the kernel moeRouterAuxCounts), per sequence in the
    // runs with seq_aux_loss and per microbatch without: equal to fp32's precision.
    const double tol = 1e-6;
    for (int layer : {0, 1}) {
        const std::string base = "moe.layer" + std::to_string(layer) + ".";
        ASSERT_TRUE(cl.count(base + "load_balancing_loss") && cl.count(base + "seq_load_balancing_loss")) << base;
        EXPECT_NEAR(cl.at(base + "load_balancing_loss"), ca.at(base + "load_balancing_loss"), tol);
        EXPECT_NEAR(cl.at(base + "seq_load_balancing_loss"), cs.at(base + "seq_load_balancing_loss"), tol);
        EXPECT_FALSE(ca.count(base + "seq_load_balancing_loss")) << "aux_loss alone logs no seq term";
        EXPECT_NEAR(cl.at(base + "aux_loss"), a * ca.at(base + "load_balancing_loss") +
                                                  b * cs.at(base + "seq_load_balancing_loss"), tol);
        EXPECT_NEAR(cl.at(base + "aux_loss"), ca.at(base + "aux_loss") + cs.at(base + "aux_loss"), tol);
        // the two terms are different numbers (per sequence vs per microbatch)
        EXPECT_NE(ca.at(base + "load_balancing_loss"), cs.at(base + "seq_load_balancing_loss"));
    }

    const OneStep gl = oneStep(list), ga = oneStep(aux), gs = oneStep(seq), g0 = oneStep(none);
    const std::string router = "decoder.layers.0.mlp.router.weight";
    double auxPart = 0, seqPart = 0;
    for (const auto& [name, g] : gl.grads) {
        for (size_t i = 0; i < g.size(); ++i) {
            const double want = double(ga.grads.at(name)[i]) + double(gs.grads.at(name)[i]) - double(g0.grads.at(name)[i]);
            EXPECT_NEAR(g[i], want, 1e-6 + 1e-4 * std::fabs(want)) << name << "[" << i << "]";
        }
    }
    for (size_t i = 0; i < gl.grads.at(router).size(); ++i) {
        auxPart += std::fabs(ga.grads.at(router)[i] - g0.grads.at(router)[i]);
        seqPart += std::fabs(gs.grads.at(router)[i] - g0.grads.at(router)[i]);
    }
    EXPECT_GT(auxPart, 1e-5);
    EXPECT_GT(seqPart, 1e-5);
}

// The list with global_aux_loss on dp2·ep2 equals the single device (each term reduced over its
// own group: aux_loss over tp-cp, global_aux_loss over tp-dp-cp).
TEST(MoeLoadBalancingList, WithGlobalAuxLossOnTp2Ep2EqualsTheSingleDevice) {
    const engine::Config c = moeLayoutConfig(listConfig({"aux_loss", "global_aux_loss"}, {0.1, 0.05}),
                                             ExpertLayout{.tp = 2, .etp = 1, .ep = 2});
    const RunResult ref = runSingle(singleDevice(c), 3);
    auto par = runParallel(c, 3);
    ASSERT_TRUE(par.isOk()) << par.status().toString();
    expectSame(*par, ref, 1e-5, "aux_loss + global_aux_loss tp2 ep2");
}

// What Megatron refuses of the list form, by name.
TEST(MoeLoadBalancingList, RefusalsNameTheKnob) {
    struct Case {
        const char* knob;
        engine::Config c;
    };
    for (const Case& k : std::vector<Case>{
             {"moe_aux_loss_coeff", listConfig({"aux_loss", "seq_aux_loss"}, {0.01})},
             {"moe_aux_loss_coeff", listConfig({"aux_loss"}, {0.01, 0.02})},
             {"sinkhorn", listConfig({"aux_loss", "sinkhorn"}, {0.01, 0.0})},
             {"quantile_balancing", listConfig({"quantile_balancing", "aux_loss"}, {0.0, 0.01})},
             {"appears twice", listConfig({"aux_loss", "aux_loss"}, {0.01, 0.02})}}) {
        auto d = engine::modelDimsFromConfig(k.c);
        ASSERT_FALSE(d.isOk()) << k.knob;
        EXPECT_NE(d.status().message().find(k.knob), std::string::npos) << k.knob << ": " << d.status().message();
        EXPECT_FALSE(engine::validateConfig(k.c).empty()) << k.knob;
    }
    EXPECT_TRUE(engine::modelDimsFromConfig(listConfig({"aux_loss", "seq_aux_loss", "none"}, {0.01, 0.001, 0.0})).isOk());
    EXPECT_TRUE(engine::validateConfig(listConfig({"aux_loss", "seq_aux_loss"}, {0.01, 0.001})).empty());
}

}  // namespace
}  // namespace ts::test
