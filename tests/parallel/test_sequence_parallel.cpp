// Sequence parallelism (REFERENCE.md §2.3-2.5) in the GPT model: tp2/tp4 with
// sequence_parallel, alone and with pp / vpp / dp (distributed optimizer, overlapped buckets),
// LayerNorm+GeLU and RMSNorm+SwiGLU+GQA, tied and untied, dropout and recompute, must train
// exactly like the single-device Trainer (3 steps, losses and final weights to 1e-5 relative).
// The trace must show the SP collectives (all-gather / reduce-scatter on "tp") in the counts
// Megatron's per-layer table gives, and no per-layer all-reduce of activations.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/comm/inproc_communicator.h"
#include "engine/model/gpt.h"
#include "engine/parallel/parallel_trainer.h"
#include "engine/train/trainer.h"
#include "fake_recorder.h"
#include "parallel_test_util.h"

using namespace ts;
using namespace ts::engine;

namespace {

using ts::test::expectSame;
using ts::test::runParallel;
using ts::test::runSingle;
using ts::test::singleDevice;
using ts::test::SpLayout;
using ts::test::spConfig;
using ts::test::RunResult;
using ts::test::tinySpConfig;

struct SpCase {
    const char* name;
    SpLayout layout;
    std::function<void(Config&)> knobs;
};

void swigluRmsGqa(Config& c) {
    c.swiglu = true;
    c.normalization = "RMSNorm";
    c.num_query_groups = 2;
    c.add_bias_linear = false;
}

void learnedPos(Config& c) { c.position_embedding_type = "learned_absolute"; }

std::vector<SpCase> spCases() {
    auto none = [](Config&) {};
    auto untied = [](Config& c) { c.untie_embeddings_and_output_weights = true; };
    return {
        {"tp2", {2, 1, 1, 1, 2}, none},
        {"tp4", {4, 1, 1, 1, 2}, none},
        {"tp2_untied", {2, 1, 1, 1, 2}, untied},
        {"tp4_untied", {4, 1, 1, 1, 1}, untied},
        {"tp2_swiglu_rms_gqa", {2, 1, 1, 1, 2}, swigluRmsGqa},
        {"tp2_swiglu_rms_gqa_untied", {2, 1, 1, 1, 2}, [](Config& c) {
             swigluRmsGqa(c);
             c.untie_embeddings_and_output_weights = true;
         }},
        // Dropout masks of the s-shards must be the single device's rows of the same mask.
        {"tp2_dropout", {2, 1, 1, 1, 2}, [](Config& c) { c.hidden_dropout = 0.1; }},
        {"tp2_recompute_full", {2, 1, 1, 1, 2},
         [](Config& c) {
             c.recompute_granularity = "full";
             c.recompute_method = "uniform";
             c.recompute_num_layers = 1;
             c.hidden_dropout = 0.1;
         }},
        {"tp2_recompute_selective", {2, 1, 1, 1, 2}, [](Config& c) { c.recompute_granularity = "selective"; }},
        // Pipeline p2p tensors are [s/t, b, h].
        {"tp2_pp2", {2, 2, 1, 1, 2}, none},
        {"tp2_pp2_untied_swiglu", {2, 2, 1, 1, 3}, [](Config& c) {
             swigluRmsGqa(c);
             c.untie_embeddings_and_output_weights = true;
         }},
        {"tp2_pp2_vpp2", {2, 2, 2, 1, 2}, [](Config& c) { c.overlap_p2p_comm = true; c.batch_p2p_comm = false; }},
        {"tp2_dp2", {2, 1, 1, 2, 2}, none},
        // DP buckets launched from backward while the SP norm grads are TP-summed on compute.
        {"tp2_dp2_distopt_overlap", {2, 1, 1, 2, 2},
         [](Config& c) {
             c.use_distributed_optimizer = c.overlap_grad_reduce = true;
             c.bucket_size = 1500;
         }},
        {"tp4_dp2_swiglu_rms_gqa", {4, 1, 1, 2, 1}, [](Config& c) {
             swigluRmsGqa(c);
             c.num_attention_heads = 8;  // 8 heads in 4 groups: each tp4 rank holds 2 q heads, 1 kv group
             c.num_query_groups = 4;
         }},
        {"tp2_pp2_dp2", {2, 2, 1, 2, 2}, [](Config& c) { c.overlap_grad_reduce = true; c.bucket_size = 2000; }},
        // Megatron's default learned_absolute position embedding: the lookup is all-reduced, the
        // replicated table added, then the sum is split along s (backward: all-gather, full grad).
        {"tp2_learned_pos", {2, 1, 1, 1, 2}, learnedPos},
        {"tp4_learned_pos_untied", {4, 1, 1, 1, 1}, [](Config& c) {
             learnedPos(c);
             c.untie_embeddings_and_output_weights = true;
         }},
        {"tp2_learned_pos_dropout", {2, 1, 1, 1, 2}, [](Config& c) {
             learnedPos(c);
             c.hidden_dropout = 0.1;
         }},
        {"tp2_pp2_vpp2_learned_pos", {2, 2, 2, 1, 2}, [](Config& c) {
             learnedPos(c);
             c.overlap_p2p_comm = true;
             c.batch_p2p_comm = false;
         }},
        {"tp2_dp2_distopt_overlap_learned_pos", {2, 1, 1, 2, 2}, [](Config& c) {
             learnedPos(c);
             c.use_distributed_optimizer = c.overlap_grad_reduce = true;
             c.bucket_size = 1500;
         }},
    };
}

class SequenceParallelMatchesSingleDevice : public ::testing::TestWithParam<SpCase> {};

TEST_P(SequenceParallelMatchesSingleDevice, LossesAndWeights) {
    const SpCase& k = GetParam();
    Config par = spConfig(tinySpConfig(), k.layout);
    k.knobs(par);
    const RunResult ref = runSingle(singleDevice(par), 3);
    auto got = runParallel(par, 3);
    ASSERT_TRUE(got.isOk()) << got.status().toString();
    expectSame(got.value(), ref, 1e-5, k.name);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SequenceParallelMatchesSingleDevice, ::testing::ValuesIn(spCases()),
                         [](const ::testing::TestParamInfo<SpCase>& i) { return std::string(i.param.name); });

// Collectives of group "tp" executed on global rank 0's streams during one step, by name.
std::map<std::string, int> tpCollectives(const Config& c) {
    test::FakeRecorder rec;
    {
        auto t = ParallelTrainer::create(c, &rec);
        EXPECT_TRUE(t.isOk()) << t.status().toString();
        if (!t.isOk()) return {};
        EXPECT_TRUE(t.value()->train(1).isOk());
    }
    std::map<std::string, int> n;
    for (const auto& s : rec.slices) {
        if (s.category != trace::Category::Collective || rec.str(s.group) != "tp") continue;
        const trace::TrackDesc& td = rec.trackDesc(s.track);
        if (td.rank != 0 || td.kind == trace::TrackKind::HostThread) continue;
        ++n[rec.str(s.name)];
    }
    return n;
}

// Expected counts from Megatron's per-layer table (REFERENCE.md §2.4-2.6), per microbatch:
//   without SP: embedding 1 AR; per layer 2 AR fwd + 2 AR bwd; output-layer input dgrad 1 AR;
//               cross entropy 3 AR.
//   with SP:    embedding RS fwd / AG bwd; per layer fwd 2 AG + 2 RS, bwd 2 AG + 2 RS + 2 AG
//               (re-gathered inputs); output layer AG fwd, AG (re-gather) + RS bwd; CE 3 AR;
//               once per step one AR of the SP grads per layer and one for the final norm.
TEST(SequenceParallel, TraceHasGathersAndScattersInsteadOfAllReduces) {
    const int L = 2, m = 2;
    Config noSp = spConfig(tinySpConfig(), {2, 1, 1, 1, m});
    noSp.sequence_parallel = false;
    std::map<std::string, int> a = tpCollectives(noSp);
    EXPECT_EQ(a["all_reduce"], m * (1 + 4 * L + 1 + 3));
    EXPECT_EQ(a["all_gather"], 0);
    EXPECT_EQ(a["reduce_scatter"], 0);

    Config sp = spConfig(tinySpConfig(), {2, 1, 1, 1, m});
    std::map<std::string, int> b = tpCollectives(sp);
    EXPECT_EQ(b["all_gather"], m * (1 + 6 * L + 1 + 1));
    EXPECT_EQ(b["reduce_scatter"], m * (1 + 4 * L + 1));
    EXPECT_EQ(b["all_reduce"], m * 3 + (L + 1));

    // learned_absolute + SP (Megatron: reduce_scatter_embeddings off): the embedding all-reduces
    // its lookup and splits after the position add (no reduce-scatter); backward all-gathers.
    Config lp = sp;
    lp.position_embedding_type = "learned_absolute";
    std::map<std::string, int> e = tpCollectives(lp);
    EXPECT_EQ(e["all_gather"], m * (1 + 6 * L + 1 + 1));
    EXPECT_EQ(e["reduce_scatter"], m * (4 * L + 1));
    EXPECT_EQ(e["all_reduce"], m * (1 + 3) + (L + 1));
}

// Model-level shapes: SP params are flagged, stage tensors are [s/t, b, h].
TEST(SequenceParallel, ParamsFlaggedAndStageTensorSharded) {
    Config c = spConfig(tinySpConfig(), {2, 1, 1, 1, 1});
    auto backend = makeCpuBackend(1);
    Device& dev = backend->device(0);
    auto stream = dev.createStream(trace::TrackKind::Compute, "compute");
    // A TP communicator is required for tp > 1; the model only registers shapes here.
    CommWorld world(2);
    auto comm = world.join("tp", {0, 1}, 1);
    ASSERT_TRUE(comm.isOk()) << comm.status().toString();
    ParallelContext ctx;
    ctx.tpSize = 2;
    ctx.tpRank = 1;
    ctx.sequenceParallel = true;
    ctx.tp = comm.value().get();
    auto model = GptModel::create(c, dev, *stream, ctx);
    ASSERT_TRUE(model.isOk()) << model.status().toString();
    GptModel& g = *model.value();
    EXPECT_TRUE(g.sequenceParallel());
    EXPECT_EQ(g.stageTensorElems(), int64_t(16 / 2) * 2 * 32);
    int flagged = 0;
    for (const ParamInfo& p : g.params().params()) {
        const bool expectSp = p.name.find("layernorm") != std::string::npos ||
                              p.name.find("linear_proj.bias") != std::string::npos ||
                              p.name.find("linear_fc2.bias") != std::string::npos;
        EXPECT_EQ(p.sequenceParallel, expectSp) << p.name;
        flagged += p.sequenceParallel;
    }
    // Per layer 2 norms x (weight, bias) + proj bias + fc2 bias; final norm weight + bias.
    EXPECT_EQ(flagged, 2 * 6 + 2);

    // learned_absolute: the position table is replicated but not an SP param (added before
    // the scatter to the SP region, so every TP rank sees the full grad).
    c.position_embedding_type = "learned_absolute";
    auto lp = GptModel::create(c, dev, *stream, ctx);
    ASSERT_TRUE(lp.isOk()) << lp.status().toString();
    const int pos = lp.value()->params().find("embedding.position_embeddings.weight");
    ASSERT_GE(pos, 0);
    const ParamInfo& pi = lp.value()->params().info(pos);
    EXPECT_EQ(pi.shard, ShardKind::Replicated);
    EXPECT_FALSE(pi.sequenceParallel);
    EXPECT_EQ(pi.shape, (std::vector<int64_t>{16, 32}));
}

TEST(SequenceParallel, SeqLengthNotDivisibleByTpIsRejected) {
    Config c = spConfig(tinySpConfig(), {4, 1, 1, 1, 1});
    c.seq_length = 18;
    auto t = ParallelTrainer::create(c);
    ASSERT_FALSE(t.isOk());
    EXPECT_NE(t.status().message().find("sequence_parallel"), std::string::npos) << t.status().toString();
}

}  // namespace
