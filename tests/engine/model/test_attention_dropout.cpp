// attention_dropout > 0 in the model: accepted, changes the result, depends on the seed, fused
// == unfused, and selective/full recompute stay bit-identical (the mask is regenerated from
// (seed, step, microbatch, layer), never stored).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "engine/model/model.h"
#include "engine/train/data.h"
#include "tests/engine/engine_test_util.h"

namespace ts::engine {
namespace {

using testutil::runSteps;
using testutil::StepsResult;

// The path tests' small GPT with attention dropout, 3 layers and seq 80.
Config dropConfig() {
    Config c = testutil::smallConfig();
    c.num_layers = 3;
    c.seq_length = 80;  // > one causal block of the attention kernel
    c.micro_batch_size = 2;
    c.attention_dropout = 0.1;
    c.seed = 7;
    return c;
}

TEST(AttentionDropout, ModelAcceptsItAndOnlyRejectsOutOfRange) {
    Config c = dropConfig();
    EXPECT_TRUE(modelDimsFromConfig(c).isOk());
    EXPECT_FLOAT_EQ(modelOptionsFromConfig(c).attentionDropout, 0.1f);
    c.attention_dropout = 1.0;
    EXPECT_FALSE(modelDimsFromConfig(c).isOk());
}

TEST(AttentionDropout, ChangesTheStepAndDependsOnTheSeed) {
    const Config c = dropConfig();
    Config off = c;
    off.attention_dropout = 0;
    Config seed2 = c;
    seed2.seed = 8;  // also changes hidden dropout: compare against its own p=0 run
    Config seed2off = seed2;
    seed2off.attention_dropout = 0;
    const StepsResult a = runSteps(c, 1), b = runSteps(off, 1), d = runSteps(seed2, 1), e = runSteps(seed2off, 1);
    ASSERT_EQ(a.losses.size(), 1u);
    ASSERT_EQ(b.losses.size(), 1u);
    ASSERT_EQ(d.losses.size(), 1u);
    ASSERT_EQ(e.losses.size(), 1u);
    EXPECT_NE(a.losses[0], b.losses[0]);
    EXPECT_GT(testutil::relMaxError(a.grads.data(), b.grads.data(), int64_t(a.grads.size())), 1e-3);
    // same data and weights, another seed: the attention-dropout effect differs
    EXPECT_NE(a.losses[0] - b.losses[0], d.losses[0] - e.losses[0]);
}

TEST(AttentionDropout, FusedSoftmaxEqualsUnfused) {
    Config fused = dropConfig();
    Config unfused = fused;
    unfused.masked_softmax_fusion = false;
    unfused.attention_backend = "unfused";  // flash attention has no unfused softmax
    const StepsResult a = runSteps(fused, 2), b = runSteps(unfused, 2);
    ASSERT_EQ(a.losses.size(), 2u);
    ASSERT_EQ(b.losses.size(), 2u);
    for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * a.losses[i]);
    EXPECT_LT(testutil::relMaxError(b.grads.data(), a.grads.data(), int64_t(a.grads.size())), 1e-4);
}

// The masks are keyed by the step (its key in device memory, rewritten by beginStep): the same
// data and weights give another loss at another step, and the same loss at the same step again.
TEST(AttentionDropout, EachStepDrawsItsOwnMasksAndRepeatsThemExactly) {
    for (const char* which : {"attention", "hidden"}) {
        Config c = dropConfig();
        if (std::string(which) == "hidden") {
            c.attention_dropout = 0;
            c.hidden_dropout = 0.1;
        } else {
            c.hidden_dropout = 0;
        }
        testutil::Harness h;
        ASSERT_TRUE(h.build(c).isOk());
        const auto mbs = testutil::batches(c, 0);
        auto a = h.forwardBackward(0, mbs), b = h.forwardBackward(1, mbs), again = h.forwardBackward(0, mbs);
        ASSERT_TRUE(a.isOk() && b.isOk() && again.isOk()) << which;
        EXPECT_NE(*a, *b) << which << " dropout: step 1 drew step 0's masks";
        EXPECT_EQ(*a, *again) << which << " dropout: step 0 again drew other masks";
    }
}

TEST(AttentionDropout, RecomputeIsBitIdentical) {
    const Config base = dropConfig();
    const StepsResult ref = runSteps(base, 2);
    ASSERT_EQ(ref.losses.size(), 2u);
    struct R { const char* gran; const char* method; int n; };
    for (const R& rc : {R{"selective", "", 0}, R{"full", "uniform", 2}, R{"full", "block", 1}}) {
        Config c = base;
        c.recompute_granularity = rc.gran;
        c.recompute_method = rc.method;
        c.recompute_num_layers = rc.n;
        const StepsResult r = runSteps(c, 2);
        const std::string what = std::string(rc.gran) + "/" + rc.method + "/" + std::to_string(rc.n);
        ASSERT_EQ(r.losses.size(), 2u) << what;
        EXPECT_EQ(r.losses, ref.losses) << what;
        ASSERT_EQ(r.grads.size(), ref.grads.size());
        EXPECT_EQ(0, std::memcmp(r.grads.data(), ref.grads.data(), r.grads.size() * sizeof(float))) << what;
        EXPECT_EQ(0, std::memcmp(r.params.data(), ref.params.data(), r.params.size() * sizeof(float))) << what;
    }
}

}  // namespace
}  // namespace ts::engine
