// Checkpoints of parallel runs (engine/parallel/parallel_trainer.h save/load, engine/train/checkpoint.h):
//   - same layout: 6 steps == 3 steps + save + load into a fresh trainer + 3 steps, BITWISE
//     (losses and every final weight), with dropout and a warmup+cosine lr schedule so the
//     RNG, data position, scheduler and Adam state must all resume;
//   - cross layout: a tp2pp2 checkpoint continued by the single-device Trainer, and a
//     single-device checkpoint continued by dp2 + distributed optimizer, against 6 steps of the
//     single-device run (fp32, 1e-5 relative);
//   - the TP split of save/gather against GptModel::initWeights' own split (a tp2 model's
//     gathered initial weights are the single-device initial weights);
//   - a checkpoint of another model shape gets a clear error and leaves training possible.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/parallel/parallel_trainer.h"
#include "engine/train/checkpoint.h"
#include "engine/train/trainer.h"
#include "parallel_test_util.h"

using namespace ts;
using namespace ts::engine;

namespace {

namespace fs = std::filesystem;

using ts::test::Layout;
using ts::test::Params;
using ts::test::relError;
using ts::test::singleDevice;
using ts::test::tinyConfig;
using ts::test::trainParallel;
using ts::test::trainSingle;
using ts::test::withLayout;

// What must resume: dropout RNG, lr schedule position (warmup then cosine), Adam steps.
Config resumeConfig() {
    Config c = tinyConfig();
    c.hidden_dropout = 0.1;
    c.lr_warmup_iters = 2;
    c.lr_decay_style = "cosine";
    c.min_lr = 1e-4;
    c.train_iters = 6;  // the schedule's horizon: the same in the 6-step and the 3+3-step runs
    return c;
}

std::string tempDir(const std::string& name) {
    // Per process: ctest runs these tests twice at once (plain and on the emulated device).
    const fs::path p = fs::temp_directory_path() / ("ts_ckpt_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(p);
    return p.string();
}

// Every param of `ref` (the tied copy included when both have it) within tol; tol = 0: bitwise.
void expectSameParams(const Params& got, const Params& ref, double tol, const std::string& what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    for (const auto& [name, r] : ref) {
        auto it = got.find(name);
        ASSERT_NE(it, got.end()) << what << ": no '" << name << "'";
        ASSERT_EQ(it->second.size(), r.size()) << what << " " << name;
        if (tol == 0) EXPECT_TRUE(it->second == r) << what << ": " << name << " differs";
        else EXPECT_LE(relError(it->second, r), tol) << what << ": " << name;
    }
}

struct SameLayoutCase {
    const char* name;
    Layout layout;
    void (*knobs)(Config&);
};

void PrintTo(const SameLayoutCase& c, std::ostream* os) { *os << c.name; }

class SameLayoutResume : public ::testing::TestWithParam<SameLayoutCase> {};

TEST_P(SameLayoutResume, SixStepsEqualThreePlusSaveLoadPlusThreeBitwise) {
    const SameLayoutCase& k = GetParam();
    Config c = withLayout(resumeConfig(), k.layout);
    k.knobs(c);
    const std::string dir = tempDir(k.name);
    auto full = trainParallel(c, 6);
    ASSERT_TRUE(full.isOk()) << full.status().toString();
    auto first = trainParallel(c, 3, "", dir);
    ASSERT_TRUE(first.isOk()) << first.status().toString();
    ASSERT_TRUE(fs::exists(fs::path(dir) / "checkpoint.json"));
    auto second = trainParallel(c, 3, dir);
    ASSERT_TRUE(second.isOk()) << second.status().toString();
    for (int s = 0; s < 3; ++s) {
        EXPECT_EQ(first.value().losses[size_t(s)], full.value().losses[size_t(s)]) << "step " << s + 1;
        EXPECT_EQ(second.value().losses[size_t(s)], full.value().losses[size_t(s + 3)]) << "step " << s + 4;
    }
    // The later steps must differ from the earlier ones (a resume that restarted from scratch
    // with the same data would otherwise pass on a constant-loss model).
    EXPECT_NE(second.value().losses[0], first.value().losses[0]);
    expectSameParams(second.value().params, full.value().params, 0.0, k.name);
    fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SameLayoutResume,
    ::testing::Values(SameLayoutCase{"dp2_distopt", {1, 1, 1, 2, 2},
                                     [](Config& c) {
                                         c.use_distributed_optimizer = true;
                                         c.overlap_grad_reduce = true;
                                         c.overlap_param_gather = true;
                                         c.bucket_size = 4000;  // several buckets, so DP shards cut params
                                     }},
                      SameLayoutCase{"tp2_sp", {2, 1, 1, 1, 2}, [](Config& c) { c.sequence_parallel = true; }},
                      // bf16: each rank keeps the fp32 main params of its shard only.
                      SameLayoutCase{"bf16_tp2_dp2_distopt", {2, 1, 1, 2, 2},
                                     [](Config& c) {
                                         c.bf16 = true;
                                         c.use_distributed_optimizer = true;
                                         c.overlap_param_gather = true;
                                         c.overlap_grad_reduce = true;
                                         c.bucket_size = 4000;
                                     }},
                      // ... and the experts' per expert-data-parallel shard (ep2 over dp4: edp 2).
                      SameLayoutCase{"bf16_ep2_dp4_distopt", {1, 1, 1, 4, 1},
                                     [](Config& c) {
                                         c.bf16 = true;
                                         c.use_distributed_optimizer = true;
                                         c.num_moe_experts = 4;
                                         c.moe_router_topk = 2;
                                         c.expert_model_parallel_size = 2;
                                     }},
                      // Megatron's default learned_absolute: the position table is saved/loaded too.
                      SameLayoutCase{"tp2_sp_dp2_distopt_learned_pos", {2, 1, 1, 2, 2},
                                     [](Config& c) {
                                         c.position_embedding_type = "learned_absolute";
                                         c.sequence_parallel = true;
                                         c.use_distributed_optimizer = true;
                                     }},
                      SameLayoutCase{"pp2_vpp2", {1, 2, 2, 1, 4}, [](Config& c) {
                                         c.overlap_p2p_comm = true;
                                         c.batch_p2p_comm = false;
                                     }}),
    [](const ::testing::TestParamInfo<SameLayoutCase>& i) { return std::string(i.param.name); });

// tp2pp2 (world 4) trains 3 steps and saves; the single-device Trainer loads it and trains 3
// more; reference: 6 single-device steps.
// A parallel trainer that loads a checkpoint after training continues as one made from it: the
// ranks' FP8 weight copies of the step index it resumes at are remade from the loaded weights.
TEST(ParallelCheckpoint, LoadingAfterTrainingRemakesTheFp8WeightCopies) {
    Config c = withLayout(tinyConfig(2), {2, 1, 1, 1, 2});
    c.sequence_parallel = true;
    c.hidden_size = 64;  // TP shards of whole mxfp8 blocks
    c.bf16 = true;
    c.fp8 = "e4m3";
    c.fp8_recipe = "mxfp8";
    c.train_iters = 4;
    const std::string dir = tempDir("fp8_reload");
    ASSERT_TRUE(trainParallel(c, 1, "", dir).isOk());
    Config other = c;
    other.lr = 10 * c.lr;  // weights after its first step differ from the checkpoint's
    std::unique_ptr<engine::ParallelTrainer> y;
    ASSERT_TRUE(trainParallel(other, 2, "", "", nullptr, &y).isOk());  // copies made at step index 1
    ASSERT_TRUE(y->load(dir).isOk());
    engine::StepProgress p;
    ASSERT_TRUE(y->step(&p).isOk());
    auto reloaded = y->gatherParams(0);
    ASSERT_TRUE(reloaded.isOk());
    auto fresh = trainParallel(other, 1, dir);
    ASSERT_TRUE(fresh.isOk()) << fresh.status().toString();
    EXPECT_EQ(p.loss, fresh->losses[0]);
    expectSameParams(*reloaded, fresh->params, 0, "tp2 mxfp8 reloaded");
    fs::remove_all(dir);
}

TEST(ParallelCheckpoint, Tp2Pp2CheckpointContinuesOnOneDevice) {
    Config par = withLayout(resumeConfig(), {2, 2, 1, 1, 2});
    par.sequence_parallel = true;
    const Config one = singleDevice(par);
    const std::string dir = tempDir("tp2pp2_to_single");
    auto ref = trainSingle(one, 6);
    ASSERT_TRUE(ref.isOk()) << ref.status().toString();
    auto first = trainParallel(par, 3, "", dir);
    ASSERT_TRUE(first.isOk()) << first.status().toString();
    auto second = trainSingle(one, 3, dir);
    ASSERT_TRUE(second.isOk()) << second.status().toString();
    for (int s = 0; s < 3; ++s) {
        EXPECT_NEAR(first.value().losses[size_t(s)], ref.value().losses[size_t(s)], 1e-5 * ref.value().losses[size_t(s)]);
        EXPECT_NEAR(second.value().losses[size_t(s)], ref.value().losses[size_t(s + 3)],
                    1e-5 * ref.value().losses[size_t(s + 3)])
            << "step " << s + 4;
    }
    EXPECT_LT(ref.value().losses.back(), ref.value().losses.front()) << "the reference did not train";
    expectSameParams(second.value().params, ref.value().params, 1e-5, "tp2pp2 -> single");
    fs::remove_all(dir);
}

// The other way, through the sharded optimizer state: a single-device checkpoint continued
// by dp2 with the distributed optimizer (Adam state scattered over DP) and by pp2 vpp2 tp2.
TEST(ParallelCheckpoint, SingleDeviceCheckpointContinuesOnOtherLayouts) {
    const Config base = resumeConfig();
    for (const std::string pos : {"rope", "learned_absolute"})
    for (const Layout& L : {Layout{1, 1, 1, 2, 2}, Layout{2, 2, 2, 1, 4}}) {
        Config par = withLayout(base, L);
        par.position_embedding_type = pos;
        par.use_distributed_optimizer = L.dp > 1;
        par.overlap_p2p_comm = L.vpp > 1;  // interleaving with pp=2 needs it (Megatron's rule)
        par.batch_p2p_comm = L.vpp == 1;
        const Config one = singleDevice(par);
        const std::string what = "single -> tp" + std::to_string(L.tp) + " pp" + std::to_string(L.pp) + " vpp" +
                                 std::to_string(L.vpp) + " dp" + std::to_string(L.dp) + " " + pos;
        const std::string dir = tempDir("single_to_" + std::to_string(L.tp * 100 + L.pp * 10 + L.dp) + "_" + pos);
        auto ref = trainSingle(one, 6);
        ASSERT_TRUE(ref.isOk()) << ref.status().toString();
        auto first = trainSingle(one, 3, "", dir);
        ASSERT_TRUE(first.isOk()) << first.status().toString();
        auto second = trainParallel(par, 3, dir);
        ASSERT_TRUE(second.isOk()) << what << ": " << second.status().toString();
        for (int s = 0; s < 3; ++s)
            EXPECT_NEAR(second.value().losses[size_t(s)], ref.value().losses[size_t(s + 3)],
                        1e-5 * ref.value().losses[size_t(s + 3)])
                << what << " step " << s + 4;
        Params got = second.value().params;
        // The last stage's tied copy must have been loaded from the embedding and kept equal.
        if (auto copy = got.find("output_layer.weight[tied copy]"); copy != got.end()) {
            EXPECT_LE(relError(copy->second, ref.value().params.at("embedding.word_embeddings.weight")), 1e-5) << what;
            got.erase(copy);
        }
        expectSameParams(got, ref.value().params, 1e-5, what);
        fs::remove_all(dir);
    }
}

// The TP split used by save/load/gather (forEachTpShardRun) against GptModel::initWeights,
// which shards the full tensors by its own code: gathered tp2 initial weights must be the
// single-device initial weights, for column (SwiGLU stride 2, biases), row and vocab splits.
TEST(ParallelCheckpoint, TpSplitMatchesModelInitialization) {
    Config par = withLayout(tinyConfig(), {2, 1, 1, 1, 2});
    par.swiglu = true;
    par.untie_embeddings_and_output_weights = true;
    auto t = ParallelTrainer::create(par);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    auto gathered = t.value()->gatherParams(0);
    ASSERT_TRUE(gathered.isOk()) << gathered.status().toString();
    auto ref = trainSingle(singleDevice(par), 0);
    ASSERT_TRUE(ref.isOk()) << ref.status().toString();
    expectSameParams(gathered.value(), ref.value().params, 0.0, "tp2 init");
}

TEST(ParallelCheckpoint, ShardRunsCoverEveryElementOnce) {
    // An independent description of the split: row parallel takes columns [r*C/t, (r+1)*C/t)
    // of every row; column parallel with stride 2 takes rows r*R/2t.. of each half.
    ParamInfo row;
    row.fullShape = {3, 4};
    row.shard = ShardKind::RowParallel;
    ParamInfo col;
    col.fullShape = {8, 2};
    col.shard = ShardKind::ColumnParallel;
    col.partitionStride = 2;
    std::vector<float> full(16);
    for (size_t i = 0; i < full.size(); ++i) full[i] = float(i);
    std::vector<float> shard(6);
    copyFullToShard(row, 2, 1, full.data(), shard.data());
    EXPECT_EQ(shard, (std::vector<float>{2, 3, 6, 7, 10, 11}));
    std::vector<float> cs(8);
    copyFullToShard(col, 2, 1, full.data(), cs.data());
    // rows 2,3 (gate half of rank 1) then rows 6,7 (up half of rank 1), 2 columns each.
    EXPECT_EQ(cs, (std::vector<float>{4, 5, 6, 7, 12, 13, 14, 15}));
    // Round trip over all ranks restores the tensor.
    for (const ParamInfo* p : {&row, &col}) {
        const int64_t n = p->fullShape[0] * p->fullShape[1];
        std::vector<float> back(size_t(n), -1.f), sh(size_t(n / 2));
        for (int r = 0; r < 2; ++r) {
            copyFullToShard(*p, 2, r, full.data(), sh.data());
            copyShardToFull(*p, 2, r, sh.data(), back.data());
        }
        EXPECT_EQ(back, std::vector<float>(full.begin(), full.begin() + n));
    }
}

TEST(ParallelCheckpoint, OtherModelShapeIsAClearError) {
    Config c = withLayout(tinyConfig(), {1, 2, 1, 1, 2});
    c.train_iters = 1;
    const std::string dir = tempDir("shape");
    auto first = trainParallel(c, 1, "", dir);
    ASSERT_TRUE(first.isOk()) << first.status().toString();

    Config wider = c;
    wider.hidden_size = 64;
    wider.load = dir;
    auto t = ParallelTrainer::create(wider);
    ASSERT_FALSE(t.isOk());
    EXPECT_EQ(t.status().code(), ErrorCode::InvalidArgument);
    EXPECT_NE(t.status().message().find("different model"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("[64, 64]"), std::string::npos) << t.status().message();

    Config deeper = c;
    deeper.num_layers = 6;
    deeper.load = dir;
    auto d = ParallelTrainer::create(deeper);
    ASSERT_FALSE(d.isOk());
    EXPECT_NE(d.status().message().find("num_layers"), std::string::npos) << d.status().message();

    // tp2 pads the vocab to 128: loading it needs make_vocab_size_divisible_by adjusted.
    Config tp2 = withLayout(tinyConfig(), {2, 1, 1, 1, 2});
    tp2.load = dir;
    auto v = ParallelTrainer::create(tp2);
    ASSERT_FALSE(v.isOk());
    EXPECT_NE(v.status().message().find("make_vocab_size_divisible_by"), std::string::npos) << v.status().message();

    auto missing = ParallelTrainer::create([&] {
        Config m = c;
        m.load = dir + "_does_not_exist";
        return m;
    }());
    ASSERT_FALSE(missing.isOk());
    EXPECT_EQ(missing.status().code(), ErrorCode::NotFound);
    fs::remove_all(dir);
}

// train() saves at save_interval and at the end (the rule Trainer::train follows).
TEST(ParallelCheckpoint, TrainSavesAtIntervalAndEnd) {
    Config c = withLayout(tinyConfig(), {1, 1, 1, 2, 2});
    c.train_iters = 3;
    c.save = tempDir("train_save");
    c.save_interval = 2;
    auto t = ParallelTrainer::create(c);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    std::vector<std::string> logs;
    TrainerCallbacks cb;
    cb.onLog = [&](const std::string& s) { logs.push_back(s); };
    Status st = t.value()->train(-1, cb);
    ASSERT_TRUE(st.isOk()) << st.toString();
    ASSERT_EQ(logs.size(), 2u);
    EXPECT_NE(logs[0].find("iteration 2"), std::string::npos) << logs[0];
    EXPECT_NE(logs[1].find("iteration 3"), std::string::npos) << logs[1];
    Config resume = c;
    resume.save.clear();
    resume.load = c.save;
    auto r = ParallelTrainer::create(resume);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(r.value()->iteration(), 3);
    EXPECT_EQ(r.value()->samplesConsumed(), 3 * c.global_batch_size);
    fs::remove_all(c.save);
}

}  // namespace
