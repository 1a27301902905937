// Trainer: loss falls on the shipped corpus, bit-exact resume from a checkpoint, clear
// errors (NaN loss, missing data, bad shapes), cancellation, run metadata.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "engine/train/data.h"
#include "engine/train/trainer.h"
#include "tests/test_baseline_config.h"

namespace ts::engine {
namespace {

namespace fs = std::filesystem;

Config tinyCorpusConfig() {
    Config c = ts::testing::testBaselineConfig();
    c.num_layers = 2;
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.seq_length = 64;
    c.micro_batch_size = 8;
    c.vocab_size = 256;
    c.lr = 3e-3;
    c.seed = 1234;
    c.train_iters = 30;
    c.data_path = "";  // shipped corpus
    return c;
}

std::string tempDir(const std::string& name) {
    const fs::path p = fs::temp_directory_path() / ("ts_engine_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(p);
    return p.string();
}

TEST(Trainer, LossFallsOnShippedCorpus) {
    auto t = Trainer::create(tinyCorpusConfig());
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    std::vector<double> losses;
    TrainerCallbacks cb;
    cb.onStep = [&](const StepProgress& p) {
        losses.push_back(p.loss);
        EXPECT_GT(p.stepTimeS, 0);
        EXPECT_GT(p.tokensPerS, 0);
        EXPECT_GT(p.modelTflops, 0);
        EXPECT_GT(p.peakMemoryBytes, 0);
        EXPECT_GT(p.peakMemoryByCategory[size_t(MemCategory::Activations)], 0);
    };
    ASSERT_TRUE((*t)->train(-1, cb).isOk());
    ASSERT_EQ(losses.size(), 30u);
    // Starts near ln(256) = 5.55 and must fall clearly (byte-level English: well under 4).
    EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
    const double tail = (losses[27] + losses[28] + losses[29]) / 3;
    EXPECT_LT(tail, losses.front() - 1.5) << "first " << losses.front() << " last " << tail;
}

TEST(Trainer, ResumeIsBitExact) {
    Config c = tinyCorpusConfig();
    c.hidden_dropout = 0.1;
    c.num_microbatches = 2;
    c.micro_batch_size = 4;
    c.lr_decay_style = "cosine";
    c.lr_warmup_iters = 2;
    c.train_iters = 6;
    std::vector<double> straight, resumed;
    std::vector<float> paramsStraight;
    const std::string dir = tempDir("resume");
    {
        auto t = Trainer::create(c);
        ASSERT_TRUE(t.isOk()) << t.status().toString();
        TrainerCallbacks cb;
        cb.onStep = [&](const StepProgress& p) { straight.push_back(p.loss); };
        ASSERT_TRUE((*t)->train(6, cb).isOk());
        ParamBuffer& p = (*t)->model().params();
        paramsStraight.assign(p.mainParams(), p.mainParams() + p.numel());
    }
    {
        auto t = Trainer::create(c);
        ASSERT_TRUE(t.isOk());
        ASSERT_TRUE((*t)->train(3).isOk());
        ASSERT_TRUE((*t)->save(dir).isOk());
    }
    {
        Config r = c;
        r.load = dir;
        auto t = Trainer::create(r);
        ASSERT_TRUE(t.isOk()) << t.status().toString();
        EXPECT_EQ((*t)->iteration(), 3);
        TrainerCallbacks cb;
        cb.onStep = [&](const StepProgress& p) { resumed.push_back(p.loss); };
        ASSERT_TRUE((*t)->train(3, cb).isOk());
        ParamBuffer& p = (*t)->model().params();
        ASSERT_EQ(int64_t(paramsStraight.size()), p.numel());
        EXPECT_EQ(0, std::memcmp(paramsStraight.data(), p.mainParams(), paramsStraight.size() * sizeof(float)));
    }
    ASSERT_EQ(resumed.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed[size_t(i)], straight[size_t(i + 3)]) << "step " << i + 4;
    fs::remove_all(dir);
}

// A trainer that loads a checkpoint after it has trained continues as one made from the
// checkpoint: the FP8 copies of the weights, kept for the step they were made in, are remade from
// the loaded weights (GptModel::weightsReplaced), here at the step index they were made at.
TEST(Trainer, LoadingAfterTrainingRemakesTheFp8WeightCopies) {
    for (const char* recipe : {"delayed", "mxfp8"}) {
        Config c = tinyCorpusConfig();
        c.bf16 = true;
        c.fp8 = std::string(recipe) == "delayed" ? "hybrid" : "e4m3";
        c.fp8_recipe = recipe;
        c.train_iters = 4;
        const std::string dir = tempDir(std::string("fp8_reload_") + recipe);
        {
            auto x = Trainer::create(c);
            ASSERT_TRUE(x.isOk()) << x.status().toString();
            ASSERT_TRUE((*x)->train(1).isOk());
            ASSERT_TRUE((*x)->save(dir).isOk());
        }
        Config other = c;
        other.lr = 10 * c.lr;  // weights after its first step differ from the checkpoint's
        std::vector<float> reloaded, fresh;
        double lossReloaded = 0, lossFresh = 0;
        {
            auto y = Trainer::create(other);
            ASSERT_TRUE(y.isOk());
            ASSERT_TRUE((*y)->train(2).isOk());  // FP8 copies made at step index 1
            ASSERT_TRUE((*y)->load(dir).isOk());
            ASSERT_EQ((*y)->iteration(), 1);
            TrainerCallbacks cb;
            cb.onStep = [&](const StepProgress& p) { lossReloaded = p.loss; };
            ASSERT_TRUE((*y)->train(1, cb).isOk());
            ParamBuffer& p = (*y)->model().params();
            reloaded.assign(p.mainParams(), p.mainParams() + p.numel());
        }
        {
            Config r = other;
            r.load = dir;
            auto z = Trainer::create(r);
            ASSERT_TRUE(z.isOk()) << z.status().toString();
            TrainerCallbacks cb;
            cb.onStep = [&](const StepProgress& p) { lossFresh = p.loss; };
            ASSERT_TRUE((*z)->train(1, cb).isOk());
            ParamBuffer& p = (*z)->model().params();
            fresh.assign(p.mainParams(), p.mainParams() + p.numel());
        }
        EXPECT_EQ(lossReloaded, lossFresh) << recipe;
        ASSERT_EQ(reloaded.size(), fresh.size());
        EXPECT_EQ(0, std::memcmp(reloaded.data(), fresh.data(), fresh.size() * sizeof(float))) << recipe;
        fs::remove_all(dir);
    }
}

TEST(Trainer, CheckpointOfAnotherModelIsRejected) {
    Config c = tinyCorpusConfig();
    const std::string dir = tempDir("othermodel");
    {
        auto t = Trainer::create(c);
        ASSERT_TRUE(t.isOk());
        ASSERT_TRUE((*t)->save(dir).isOk());
    }
    c.num_layers = 3;
    c.load = dir;
    auto t = Trainer::create(c);
    ASSERT_FALSE(t.isOk());
    EXPECT_EQ(t.status().code(), ErrorCode::InvalidArgument);
    c.load = dir + "/nonexistent";
    auto u = Trainer::create(c);
    ASSERT_FALSE(u.isOk());
    EXPECT_EQ(u.status().code(), ErrorCode::NotFound);
    fs::remove_all(dir);
}

TEST(Trainer, NanLossIsANumericalErrorNamingTheIteration) {
    auto t = Trainer::create(tinyCorpusConfig());
    ASSERT_TRUE(t.isOk());
    ASSERT_TRUE((*t)->train(1).isOk());
    ParamBuffer& p = (*t)->model().params();
    const int i = p.find("decoder.final_layernorm.weight");
    ASSERT_GE(i, 0);
    p.mainParam(i)[3] = std::nanf("");
    p.syncModelParams();
    const Status st = (*t)->train(1);
    EXPECT_EQ(st.code(), ErrorCode::NumericalError);
    EXPECT_NE(st.message().find("iteration 2"), std::string::npos) << st.message();
}

TEST(Trainer, MissingDataFileIsNotFound) {
    Config c = tinyCorpusConfig();
    c.data_path = "/nonexistent/corpus.txt";
    auto t = Trainer::create(c);
    ASSERT_FALSE(t.isOk());
    EXPECT_EQ(t.status().code(), ErrorCode::NotFound);
    EXPECT_NE(t.status().message().find("/nonexistent/corpus.txt"), std::string::npos);
    c.data_path = "/nonexistent/prefix";
    auto u = Trainer::create(c);
    ASSERT_FALSE(u.isOk());
    EXPECT_EQ(u.status().code(), ErrorCode::NotFound);
}

TEST(Trainer, ShapesThatDoNotFitAreRejected) {
    Config c = tinyCorpusConfig();
    c.hidden_size = 66;  // 4 heads do not divide 66
    auto t = Trainer::create(c);
    ASSERT_FALSE(t.isOk());
    EXPECT_EQ(t.status().code(), ErrorCode::InvalidArgument);
    c = tinyCorpusConfig();
    c.vocab_size = 100;  // byte tokens need 256
    auto u = Trainer::create(c);
    ASSERT_FALSE(u.isOk());
    EXPECT_EQ(u.status().code(), ErrorCode::InvalidArgument);
    c = tinyCorpusConfig();
    c.seq_length = 300000;  // longer than the corpus
    auto v = Trainer::create(c);
    ASSERT_FALSE(v.isOk());
    c = tinyCorpusConfig();
    c.tensor_model_parallel_size = 2;
    auto w = Trainer::create(c);
    ASSERT_FALSE(w.isOk());
    EXPECT_EQ(w.status().code(), ErrorCode::Unsupported);
}

TEST(Trainer, CancelStopsBetweenSteps) {
    Config c = tinyCorpusConfig();
    auto t = Trainer::create(c);
    ASSERT_TRUE(t.isOk());
    std::atomic<bool> cancel{false};
    TrainerCallbacks cb;
    cb.onStep = [&](const StepProgress& p) {
        if (p.step == 2) cancel = true;
    };
    const Status st = (*t)->train(-1, cb, &cancel);
    EXPECT_EQ(st.code(), ErrorCode::Cancelled);
    EXPECT_EQ((*t)->iteration(), 2);
}

TEST(Trainer, RunMetadataForTheProfiler) {
    Config c = tinyCorpusConfig();
    auto t = Trainer::create(c);
    ASSERT_TRUE(t.isOk());
    const auto meta = (*t)->runMetadata();
    for (const char* key : {"model_flops_per_step", "flops_formula", "pp", "vpp", "num_microbatches", "config",
                            "peak_tflops"})
        EXPECT_TRUE(meta.contains(key)) << key;
    EXPECT_GT(meta["model_flops_per_step"].get<double>(), 0);
}

TEST(Trainer, TrainsOnAMegatronIndexedDataset) {
    const std::string dir = tempDir("idx");
    fs::create_directories(dir);
    std::vector<std::vector<int32_t>> docs;
    for (int d = 0; d < 20; ++d) {
        std::vector<int32_t> doc;
        for (int i = 0; i < 100 + d; ++i) doc.push_back((d * 7 + i * 3) % 256);
        docs.push_back(doc);
    }
    ASSERT_TRUE(writeIndexedDataset(dir + "/tiny_text_document", docs, 8).isOk());
    Config c = tinyCorpusConfig();
    c.data_path = dir + "/tiny_text_document";
    auto t = Trainer::create(c);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    EXPECT_NE((*t)->data().description().find("indexed dataset"), std::string::npos);
    ASSERT_TRUE((*t)->train(2).isOk());
    fs::remove_all(dir);
}

TEST(Trainer, SyntheticDataTrains) {
    Config c = tinyCorpusConfig();
    c.data_path = "synthetic";
    c.vocab_size = 512;
    std::vector<double> losses;
    auto t = Trainer::create(c);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    TrainerCallbacks cb;
    cb.onStep = [&](const StepProgress& p) { losses.push_back(p.loss); };
    ASSERT_TRUE((*t)->train(20, cb).isOk());
    EXPECT_LT(losses.back(), losses.front() - 0.5);
}

}  // namespace
}  // namespace ts::engine
