// Code paths of the model that the golden test cannot reach (dropout on): fused == unfused,
// recompute == no recompute bit for bit, recompute actually lowers the activation peak,
// bf16 mixed precision trains, deterministic init, Megatron's grad-buffer layout.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/train/data.h"
#include "tests/engine/engine_test_util.h"
#include "tests/parallel/fake_recorder.h"
#include "tests/trainer_backend_run.h"
#include "tests/scoped_env.h"
#include "tests/trainer_variants.h"

namespace ts::engine {
namespace {

using testutil::Harness;
using testutil::runSteps;
using testutil::savedActivations;
using testutil::smallConfig;
using testutil::StepsResult;
using ts::testing::ScopedEnv;

TEST(GptPaths, FusedEqualsUnfusedWithDropout) {
    Config fused = smallConfig();
    fused.swiglu = false;
    Config unfused = fused;
    unfused.masked_softmax_fusion = unfused.bias_activation_fusion = unfused.bias_dropout_fusion = false;
    unfused.attention_backend = "unfused";
    unfused.apply_rope_fusion = unfused.cross_entropy_loss_fusion = false;
    unfused.gradient_accumulation_fusion = unfused.persist_layer_norm = false;
    const StepsResult a = runSteps(fused, 2), b = runSteps(unfused, 2);
    ASSERT_EQ(a.losses.size(), 2u);
    ASSERT_EQ(b.losses.size(), 2u);
    for (size_t i = 0; i < a.losses.size(); ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * a.losses[i]);
    EXPECT_LT(testutil::relMaxError(b.grads.data(), a.grads.data(), int64_t(a.grads.size())), 1e-4);
}

// Each fusion knob alone, so a wrong path cannot hide behind another.
TEST(GptPaths, EachFusionKnobAloneAgrees) {
    Config base = smallConfig();
    base.attention_backend = "unfused";  // where masked_softmax_fusion applies
    const StepsResult ref = runSteps(base, 1);
    ASSERT_EQ(ref.losses.size(), 1u);
    using Knob = bool Config::*;
    const std::vector<std::pair<const char*, Knob>> knobs = {
        {"masked_softmax_fusion", &Config::masked_softmax_fusion},
        {"bias_activation_fusion", &Config::bias_activation_fusion},
        {"bias_dropout_fusion", &Config::bias_dropout_fusion},
        {"apply_rope_fusion", &Config::apply_rope_fusion},
        {"cross_entropy_loss_fusion", &Config::cross_entropy_loss_fusion},
        {"gradient_accumulation_fusion", &Config::gradient_accumulation_fusion},
        {"persist_layer_norm", &Config::persist_layer_norm}};
    for (const auto& [name, knob] : knobs) {
        Config c = base;
        c.*knob = false;
        const StepsResult r = runSteps(c, 1);
        ASSERT_EQ(r.losses.size(), 1u) << name;
        EXPECT_NEAR(r.losses[0], ref.losses[0], 1e-5 * ref.losses[0]) << name;
        EXPECT_LT(testutil::relMaxError(r.grads.data(), ref.grads.data(), int64_t(ref.grads.size())), 1e-4) << name;
    }
}

TEST(GptPaths, RecomputeIsBitIdenticalAndSavesMemory) {
    // The attention that keeps its probabilities, which selective recompute drops (flash
    // attention keeps none: FlashAttentionEqualsTheFusedPathAndKeepsNoProbabilities).
    Config base = smallConfig();
    base.attention_backend = "unfused";
    const StepsResult ref = runSteps(base, 2);
    ASSERT_EQ(ref.losses.size(), 2u);
    struct R { const char* gran; const char* method; int n; };
    for (const R& rc : {R{"selective", "", 0}, R{"full", "uniform", 2}, R{"full", "uniform", 1}, R{"full", "block", 3}}) {
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
        EXPECT_LT(r.peakActivations, ref.peakActivations) << what << " peak " << r.peakActivations << " vs " << ref.peakActivations;
    }
}

// attention_backend flash (and auto, the default) keeps each softmax row's max and 1/sum instead
// of the [b, a, s, s] probabilities and rebuilds them in backward: the same bits as the fused
// path that keeps them (several causal blocks, dropout), the probabilities' bytes less saved for
// the backward (and at the activation peak), and nothing left for selective recompute to drop.
TEST(GptPaths, FlashAttentionEqualsTheFusedPathAndKeepsNoProbabilities) {
    Config kept = smallConfig();
    kept.seq_length = 96;
    kept.attention_dropout = 0.1;
    kept.attention_backend = "unfused";
    Config flash = kept;
    flash.attention_backend = "flash";
    Config flashSelective = flash;
    flashSelective.recompute_granularity = "selective";
    const StepsResult a = runSteps(kept, 2), f = runSteps(flash, 2), fs = runSteps(flashSelective, 2);
    ASSERT_EQ(a.losses.size(), 2u);
    for (const StepsResult* r : {&f, &fs}) {
        EXPECT_EQ(r->losses, a.losses);
        ASSERT_EQ(r->grads.size(), a.grads.size());
        EXPECT_EQ(0, std::memcmp(r->grads.data(), a.grads.data(), a.grads.size() * sizeof(float)));
        EXPECT_EQ(0, std::memcmp(r->params.data(), a.params.data(), a.params.size() * sizeof(float)));
    }
    // Each layer keeps its fp32 probabilities until the backward, or each row's max and 1/sum
    // (the attention dropout's mask is drawn again from its seed in the backward).
    const int64_t rows = int64_t(kept.num_layers) * kept.micro_batch_size * kept.num_attention_heads * kept.seq_length;
    const int64_t probsBytes = rows * kept.seq_length * 4;
    const int64_t statsBytes = rows * 2 * 4;
    const int64_t savedKept = savedActivations(kept), savedFlash = savedActivations(flash);
    EXPECT_EQ(savedKept - savedFlash, probsBytes - statsBytes) << "kept " << savedKept << " flash " << savedFlash;
    EXPECT_EQ(savedActivations(flashSelective), savedFlash) << "selective recompute has nothing to drop under flash";
    // The peak holds them too (less the transients it may hold besides: see savedActivations).
    EXPECT_LT(f.peakActivations, a.peakActivations - probsBytes / 2)
        << "flash " << f.peakActivations << " vs kept probabilities " << a.peakActivations;
    EXPECT_EQ(Config().attention_backend, "auto");
    Config byDefault = kept;
    byDefault.attention_backend = "auto";
    EXPECT_EQ(savedActivations(byDefault), savedFlash) << "auto is flash attention";
}

TEST(GptPaths, FullRecomputeSavesMoreThanSelective) {
    Config c = smallConfig();
    c.recompute_granularity = "selective";
    const StepsResult sel = runSteps(c, 1);
    c.recompute_granularity = "full";
    c.recompute_method = "uniform";
    c.recompute_num_layers = 1;
    const StepsResult full = runSteps(c, 1);
    EXPECT_LT(full.peakActivations, sel.peakActivations);
}

TEST(GptPaths, Bf16TrainsAndTracksFp32) {
    Config c = smallConfig();
    c.hidden_dropout = 0;
    // At smallConfig's lr 1e-3 the runs are smooth. At 3e-3 (this test's rate before 2026-11-29)
    // an Adam loss spike comes and goes within a step near step 12, and whether it hits the fp32 or
    // the bf16 run depends on the CPU's GEMM kernels (it hit bf16 on an AVX-512 Xeon): a test of
    // tracking must not sit on that edge.
    Config b = c;
    b.bf16 = true;
    const StepsResult f = runSteps(c, 12), r = runSteps(b, 12);
    ASSERT_EQ(r.losses.size(), 12u);
    ASSERT_EQ(f.losses.size(), 12u);
    // bf16 activations change the first loss only by rounding, the later ones stay close, and it
    // trains.
    EXPECT_NEAR(r.losses[0], f.losses[0], 0.02 * f.losses[0]);
    for (size_t s = 1; s < r.losses.size(); ++s) EXPECT_NEAR(r.losses[s], f.losses[s], 0.01 * f.losses[s]) << s;
    EXPECT_LT(r.losses.back(), r.losses.front() - 0.5);
    EXPECT_NE(r.losses[0], f.losses[0]);  // the bf16 path really rounds
}

// A bf16 run keeps each layer's saved activations as bf16 bits until its backward (2 bytes an
// element, as Megatron-LM keeps them): the same bits as keeping them in fp32 words
// (TS_BF16_SAVED_FP32=1) on every single-device path, in less memory.
TEST(GptPaths, Bf16SavedActivationsAreTheSameBitsInHalfTheBytes) {
    std::vector<ts::testing::TrainerVariant> cases = ts::testing::trainerVariants();
    // Paths the shared list does not take whose saved tensors are made differently.
    cases.push_back({"SwiGLU with biases (fc1 saved with its bias)", [](Config& c) { c.swiglu = true; }});
    cases.push_back({"MoE shared experts without the gate, overlapped, dropout", [](Config& c) {
                         c.num_moe_experts = 4;
                         c.moe_router_topk = 2;
                         c.add_bias_linear = false;
                         c.moe_shared_expert_intermediate_size = 32;
                         c.moe_shared_expert_overlap = true;
                         c.hidden_dropout = 0.1;
                     }});
    for (const auto& [name, edit] : cases) {
        Config c = ts::testing::tinyTrainerConfig();
        edit(c);
        c.bf16 = true;
        c.num_layers = 8;
        StepsResult words, packed;
        {
            ScopedEnv env("TS_BF16_SAVED_FP32", "1");
            words = runSteps(c, 2);
        }
        {
            ScopedEnv env("TS_BF16_SAVED_FP32", nullptr);
            packed = runSteps(c, 2);
        }
        ASSERT_EQ(words.losses.size(), 2u) << name;
        EXPECT_EQ(packed.losses, words.losses) << name;
        ASSERT_EQ(packed.grads.size(), words.grads.size()) << name;
        EXPECT_EQ(0, std::memcmp(packed.grads.data(), words.grads.data(), words.grads.size() * sizeof(float))) << name;
        EXPECT_EQ(0, std::memcmp(packed.params.data(), words.params.data(), words.params.size() * sizeof(float)))
            << name;
        // Every layer keeps at least its input, the attention's q, k, v and the residual after it
        // in bf16 (FP8 layers keep their linears' inputs in fp32 words): 4 [s*b, h] tensors, 2
        // bytes an element less in each layer (full recompute: the groups' inputs only).
        const int64_t Th = int64_t(c.seq_length) * c.micro_batch_size * c.hidden_size;
        const int64_t atLeast = c.recompute_granularity == "full" ? 2 * Th : 2 * 4 * Th * (c.num_layers - 1);
        int64_t savedWords = 0, savedPacked = 0;
        {
            ScopedEnv env("TS_BF16_SAVED_FP32", "1");
            savedWords = savedActivations(c);
        }
        {
            ScopedEnv env("TS_BF16_SAVED_FP32", nullptr);
            savedPacked = savedActivations(c);
        }
        EXPECT_LE(savedPacked, savedWords - atLeast) << name << ": " << savedPacked << " bytes kept against "
                                                     << savedWords << " in fp32 words";
    }
}

// A bf16 FP8 layer reads its linears' weights once a step, to quantize them on the first
// microbatch (TE casts a weight once per step too); from then on its GEMMs read the FP8 copies.
// So only the first forward of a step unpacks those weights into the fp32 working copy (op
// bf16.weights): every later forward, backward and recompute of the layer unpacks its norms and
// biases alone. Layers kept in bf16 (first_last_layers_bf16) unpack all their weights every
// time. Reading a weight that was left out stops the process (ParamBuffer::modelParam), so
// every variant training to the end is the check that nothing else reads them.
TEST(GptPaths, Fp8LayersUnpackTheirLinearWeightsOnlyToQuantizeThem) {
    std::vector<ts::testing::TrainerVariant> cases;
    for (const auto& v : ts::testing::trainerVariants())
        if (v.name.find("fp8") != std::string::npos) cases.push_back(v);
    ASSERT_GE(cases.size(), 6u);
    cases.push_back({"fp8 hybrid, full recompute, first and last layers in bf16", [](Config& c) {
                         c.bf16 = true;
                         c.fp8 = "hybrid";
                         c.first_last_layers_bf16 = true;
                         c.recompute_granularity = "full";
                         c.recompute_method = "uniform";
                         c.recompute_num_layers = 1;
                     }});
    cases.push_back({"fp8 tensorwise, MoE shared experts, SwiGLU", [](Config& c) {
                         c.bf16 = true;
                         c.fp8 = "e4m3";
                         c.fp8_recipe = "tensorwise";
                         c.num_moe_experts = 4;
                         c.moe_router_topk = 2;
                         c.swiglu = true;
                         c.add_bias_linear = false;
                         c.moe_shared_expert_intermediate_size = 32;
                     }});
    for (const auto& [name, edit] : cases) {
        Config c = ts::testing::tinyTrainerConfig();
        edit(c);
        c.num_layers = 4;
        c.num_microbatches = 3;
        Harness h;
        test::FakeRecorder rec;
        h.dev.setTrace(&rec, 0);
        ASSERT_TRUE(h.build(c).isOk()) << name;
        ParamBuffer& pb = h.model->params();
        for (int step = 0; step < 2; ++step) {
            rec.slices.clear();
            auto loss = h.forwardBackward(step, testutil::batches(c, step));
            ASSERT_TRUE(loss.isOk()) << name << ": " << loss.status().toString();
            ASSERT_TRUE(h.optimizerStep(step).isOk()) << name;
            // Per layer: all its params, and those an FP8 layer's GEMMs read from FP8 copies.
            for (int layer = 0; layer < c.num_layers; ++layer) {
                const std::string prefix = "decoder.layers." + std::to_string(layer) + ".";
                int64_t all = 0, linears = 0;
                for (int i = 0; i < pb.count(); ++i) {
                    const std::string& n = pb.info(i).name;
                    if (n.rfind(prefix, 0) != 0) continue;
                    all += pb.info(i).numel;
                    const bool linearWeight = n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0 &&
                                              (n.find("linear_") != std::string::npos);
                    if (linearWeight) linears += pb.info(i).numel;
                }
                ASSERT_GT(linears, 0) << name << ", layer " << layer;
                const bool fp8 = !c.first_last_layers_bf16 || (layer > 0 && layer < c.num_layers - 1);
                std::vector<const trace::Slice*> unpacks;
                for (const trace::Slice& sl : rec.slices)
                    if (sl.category != trace::Category::Launch && sl.layer == layer &&
                        rec.str(sl.name) == "bf16.weights")
                        unpacks.push_back(&sl);
                // a forward and a backward per microbatch, and the recomputed forward
                const size_t want = size_t(c.num_microbatches) * (c.recompute_granularity == "full" ? 3 : 2);
                ASSERT_EQ(unpacks.size(), want) << name << ", layer " << layer << ", step " << step;
                EXPECT_EQ(unpacks[0]->microbatch, 0) << name;
                EXPECT_GE(unpacks[0]->bytes, uint64_t(6 * all)) << name << ", layer " << layer;
                for (size_t u = 1; u < unpacks.size(); ++u) {
                    const std::string where = name + ", layer " + std::to_string(layer) + ", step " +
                                              std::to_string(step) + ", unpack " + std::to_string(u);
                    if (fp8) EXPECT_LE(unpacks[u]->bytes, uint64_t(6 * (all - linears))) << where;
                    else EXPECT_GE(unpacks[u]->bytes, uint64_t(6 * all)) << where;
                }
            }
        }
        h.dev.setTrace(nullptr, 0);
    }
}

// The embedding part only gathers rows from its tables, so a bf16 run looks them up in the
// model copy's bits (embeddingLookupBf16, positionEmbeddingForwardBf16) and unpacks no working
// copy for them: of the parts outside the layers only the output layer unpacks, once in its
// forward and once in its backward per microbatch. The lookup's values are the unpacked table's
// bit for bit (KernelsEmbedding.LookupsFromTheBf16BitsEqualTheUnpackedTable); the bf16 layouts
// against the single device (tests/parallel) check that each rank reads its own rows.
TEST(GptPaths, Bf16EmbeddingIsLookedUpInTheModelBits) {
    for (const bool tied : {true, false}) {
        Config c = ts::testing::tinyTrainerConfig();
        c.bf16 = true;
        c.position_embedding_type = "learned_absolute";
        c.untie_embeddings_and_output_weights = !tied;
        c.num_microbatches = 2;
        Harness h;
        test::FakeRecorder rec;
        h.dev.setTrace(&rec, 0);
        ASSERT_TRUE(h.build(c).isOk());
        auto loss = h.forwardBackward(0, testutil::batches(c, 0));
        ASSERT_TRUE(loss.isOk()) << loss.status().toString();
        h.dev.setTrace(nullptr, 0);
        int outside = 0, lookups = 0;
        for (const trace::Slice& sl : rec.slices) {
            if (sl.category == trace::Category::Launch) continue;
            outside += sl.layer < 0 && rec.str(sl.name) == "bf16.weights";
            lookups += rec.str(sl.name) == "embedding.fwd";
        }
        EXPECT_EQ(lookups, c.num_microbatches) << "tied " << tied;
        EXPECT_EQ(outside, 2 * c.num_microbatches) << "tied " << tied;
    }
}

TEST(GptPaths, InitIsDeterministicAndScaled) {
    Config c = smallConfig();
    Harness a, b;
    ASSERT_TRUE(a.build(c).isOk());
    ASSERT_TRUE(b.build(c).isOk());
    ParamBuffer& pa = a.model->params();
    EXPECT_EQ(0, std::memcmp(pa.mainParams(), b.model->params().mainParams(), size_t(pa.numel()) * 4));
    // std of linear_qkv ~ init_method_std, linear_proj ~ std/sqrt(2L) (Megatron scaled init).
    auto stdOf = [&](const std::string& name) {
        const int i = pa.find(name);
        EXPECT_GE(i, 0) << name;
        double s2 = 0;
        for (int64_t j = 0; j < pa.info(i).numel; ++j) s2 += double(pa.mainParam(i)[j]) * pa.mainParam(i)[j];
        return std::sqrt(s2 / double(pa.info(i).numel));
    };
    EXPECT_NEAR(stdOf("decoder.layers.0.self_attention.linear_qkv.weight"), 0.02, 0.002);
    EXPECT_NEAR(stdOf("decoder.layers.0.self_attention.linear_proj.weight"), 0.02 / std::sqrt(8.0), 0.0015);
    EXPECT_NEAR(stdOf("decoder.layers.3.mlp.linear_fc2.weight"), 0.02 / std::sqrt(8.0), 0.0015);
    c.seed = 43;
    Harness d;
    ASSERT_TRUE(d.build(c).isOk());
    EXPECT_NE(0, std::memcmp(pa.mainParams(), d.model->params().mainParams(), size_t(pa.numel()) * 4));
}

TEST(GptPaths, GradBufferIsReverseRegistrationOrder) {
    Harness h;
    ASSERT_TRUE(h.build(smallConfig()).isOk());
    const ParamBuffer& p = h.model->params();
    int64_t expect = 0;
    for (int i = p.count() - 1; i >= 0; --i) {
        EXPECT_EQ(p.info(i).offset, expect) << p.info(i).name;
        expect += p.info(i).numel;
    }
    EXPECT_EQ(expect, p.numel());
    EXPECT_EQ(p.info(0).name, "embedding.word_embeddings.weight");
    EXPECT_TRUE(p.info(0).sharedEmbedding);  // tied by default
    EXPECT_TRUE(p.info(p.find("decoder.layers.0.input_layernorm.weight")).noWeightDecay);
    EXPECT_EQ(p.info(p.find("decoder.layers.0.mlp.linear_fc2.weight")).shard, ShardKind::RowParallel);
}

TEST(GptPaths, BadInputIsAnErrorNotACrash) {
    Harness h;
    ASSERT_TRUE(h.build(smallConfig()).isOk());
    auto mb = std::make_shared<Microbatch>();
    mb->tokens.assign(10, 1);
    mb->labels.assign(10, 1);
    h.model->beginStep(0, 1);
    Status st = h.model->forward(0, mb);
    EXPECT_EQ(st.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(st.message().find("seq_length*micro_batch_size"), std::string::npos) << st.message();
    const int T = 64 * 4;
    mb->tokens.assign(T, 1);
    mb->labels.assign(T, 1);
    mb->tokens[5] = 256;  // vocab_size
    st = h.model->forward(0, mb);
    EXPECT_EQ(st.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(st.message().find("vocab_size"), std::string::npos) << st.message();
    EXPECT_EQ(h.model->backward(3).code(), ErrorCode::Internal);

    Config c = smallConfig();
    c.num_attention_heads = 5;
    Harness bad;
    st = bad.build(c);
    EXPECT_EQ(st.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(st.message().find("num_attention_heads"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace ts::engine
