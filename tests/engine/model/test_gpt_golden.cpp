// The engine vs an independent float64 PyTorch implementation of the same model
// (tests/golden/make_golden.py): losses of 3 AdamW steps with clipping, logits and every
// gradient of step 1. fp32 tolerances: loss 1e-5 relative, grads 1e-4 (relative to the
// tensor's max), for every variant and for the fused, unfused and recompute code paths.
// gelu_layernorm_untied_learned_pos: Megatron's default learned_absolute position embedding
// (its grad embedding.position_embeddings.weight is among the checked ones).
#include <gtest/gtest.h>

#include "tests/engine/engine_test_util.h"

namespace ts::engine {
namespace {

using testutil::Golden;
using testutil::Harness;

struct Case {
    const char* variant;
    const char* path;  // fused | unfused | selective | full_uniform | full_block
};

class GoldenTest : public ::testing::TestWithParam<Case> {};

void applyPath(Config& c, const std::string& path) {
    const bool unfused = path == "unfused";
    c.masked_softmax_fusion = c.bias_activation_fusion = c.bias_dropout_fusion = !unfused;
    if (unfused) c.attention_backend = "unfused";  // the default (flash) has no unfused softmax
    c.apply_rope_fusion = c.cross_entropy_loss_fusion = !unfused;
    c.gradient_accumulation_fusion = c.persist_layer_norm = !unfused;
    if (path == "selective") {
        c.recompute_granularity = "selective";
        c.attention_backend = "unfused";  // flash attention keeps nothing for it to drop
    }
    if (path == "full_uniform") {
        c.recompute_granularity = "full";
        c.recompute_method = "uniform";
        c.recompute_num_layers = 2;
    }
    if (path == "full_block") {
        c.recompute_granularity = "full";
        c.recompute_method = "block";
        c.recompute_num_layers = 1;
    }
}

TEST_P(GoldenTest, MatchesPyTorch) {
    const Case tc = GetParam();
    const Golden g = Golden::load(tc.variant);
    ASSERT_FALSE(g.blob.empty());
    Config c = g.config();
    applyPath(c, tc.path);
    Harness h;
    ASSERT_TRUE(h.build(c).isOk());
    testutil::goldenInit(*h.model);
    // Parameter table must be the script's (names and order drive the init formula).
    const auto& names = g.meta["params"];
    ASSERT_EQ(int(names.size()), h.model->params().count());
    for (int i = 0; i < h.model->params().count(); ++i)
        ASSERT_EQ(names[size_t(i)].get<std::string>(), h.model->params().info(i).name);

    const int steps = g.meta["config"]["steps"];
    const int m = g.meta["config"]["num_microbatches"];
    h.model->setCaptureLogits(true);
    for (int step = 0; step < steps; ++step) {
        std::vector<std::shared_ptr<Microbatch>> mbs;
        for (int mb = 0; mb < m; ++mb) mbs.push_back(g.microbatch(step, mb));
        auto loss = h.forwardBackward(step, mbs);
        ASSERT_TRUE(loss.isOk()) << loss.status().toString();
        const double ref = g.meta["losses"][size_t(step)];
        EXPECT_NEAR(*loss, ref, 1e-5 * std::fabs(ref)) << "step " << step + 1;
        if (step == 0) {
            const auto& logits = h.model->capturedLogits(0);
            ASSERT_EQ(int64_t(logits.size()), g.numel("logits"));
            EXPECT_LT(testutil::relMaxError(logits.data(), g.f32("logits"), g.numel("logits")), 1e-5);
            for (int i = 0; i < h.model->params().count(); ++i) {
                const auto& p = h.model->params().info(i);
                const std::string key = "grad/" + p.name;
                ASSERT_EQ(g.numel(key), p.numel) << p.name;
                EXPECT_LT(testutil::relMaxError(h.model->params().mainGrad(i), g.f32(key), p.numel), 1e-4)
                    << p.name;
            }
        }
        ASSERT_TRUE(h.optimizerStep(step).isOk());
        const double refNorm = g.meta["grad_norms"][size_t(step)];
        EXPECT_NEAR(h.opt->lastStep().gradNorm, refNorm, 1e-4 * refNorm) << "step " << step + 1;
    }
}

std::vector<Case> cases() {
    std::vector<Case> out;
    for (const char* v : {"gelu_layernorm_untied", "gelu_layernorm_tied", "swiglu_rmsnorm_gqa_untied",
                          "swiglu_rmsnorm_gqa_tied", "gelu_layernorm_untied_learned_pos"})
        for (const char* p : {"fused", "unfused", "selective", "full_uniform", "full_block"}) out.push_back({v, p});
    return out;
}

INSTANTIATE_TEST_SUITE_P(Variants, GoldenTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                             return std::string(i.param.variant) + "_" + i.param.path;
                         });

}  // namespace
}  // namespace ts::engine
