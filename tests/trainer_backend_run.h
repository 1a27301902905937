// What the backend-equality trainer tests compare (tests/engine/train/test_trainer_emulated.cpp:
// the emulated device against the CPU, bit for bit; tests/gpu/test_cuda_trainer.cpp: CUDA
// against the CPU, within a tolerance): a few steps of a tiny GPT on the single-device trainer
// with the given options, every step's loss and grad norm, and the final weights read back
// through a stream copy (device memory on the emulated and CUDA backends).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/backend/kernels.h"
#include "engine/model/gpt.h"
#include "engine/train/trainer.h"
#include "tests/test_baseline_config.h"

namespace ts::testing {

struct TrainRun {
    std::vector<double> losses, gradNorms;
    std::vector<float> params;
    std::string device;  // the device's name
};

inline TrainRun trainRun(const engine::Config& c, const engine::TrainerOptions& o) {
    TrainRun r;
    auto t = engine::Trainer::create(c, nullptr, nullptr, nullptr, o);
    EXPECT_TRUE(t.isOk()) << t.status().toString();
    if (!t.isOk()) return r;
    r.device = (*t)->model().exec().device().info().name;
    engine::TrainerCallbacks cb;
    cb.onStep = [&](const engine::StepProgress& p) {
        r.losses.push_back(p.loss);
        r.gradNorms.push_back(p.gradNorm);
    };
    const Status s = (*t)->train(-1, cb);
    EXPECT_TRUE(s.isOk()) << s.toString();
    engine::ParamBuffer& pb = (*t)->model().params();
    auto host = engine::kern::toHost((*t)->model().exec().stream(), pb.mainParams(), pb.numel());
    EXPECT_TRUE(host.isOk()) << host.status().toString();
    if (host.isOk()) r.params = std::move(host).value();
    return r;
}

// 2 layers, hidden 64, 4 heads, seq 32, micro-batch 4, vocab 256, 3 steps of the shipped corpus.
inline engine::Config tinyTrainerConfig() {
    engine::Config c = testBaselineConfig();
    c.num_layers = 2;
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.seq_length = 32;
    c.micro_batch_size = 4;
    c.vocab_size = 256;
    c.seed = 7;
    c.train_iters = 3;
    c.data_path = "";
    return c;
}

}  // namespace ts::testing
