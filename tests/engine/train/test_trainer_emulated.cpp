// The single-device trainer on the emulated device (engine/backend/emulated_backend.h: the GPU's
// execution model on the CPU: an op's host code runs at submit, its kernels later; buffer memory
// traps host access) against the same run on the CPU backend.
//
// What is ported so far (docs/cuda_port.md): weight init uploaded from a host image, token ids and
// labels uploaded, the loss seed uploaded, the per-token losses read back, grad zeroing and the
// bf16 model copy through the dispatch's memory ops. So the forward of the first step runs on the
// emulated device and its loss equals the CPU backend's bit for bit. The backward does not yet
// (the step-0 grad norm differs by about 1%, in every layout tried: docs/cuda_port.md, "Status"),
// so this test checks the first loss only; when the backward is found, it checks every step.
#include <gtest/gtest.h>

#include <vector>

#include "engine/train/trainer.h"
#include "tests/test_baseline_config.h"

namespace ts::engine {
namespace {

std::vector<double> losses(const Config& c, bool emulate) {
    TrainerOptions o;
    o.emulateDevice = emulate;
    auto t = Trainer::create(c, nullptr, nullptr, nullptr, o);
    EXPECT_TRUE(t.isOk()) << t.status().toString();
    std::vector<double> out;
    if (!t.isOk()) return out;
    TrainerCallbacks cb;
    cb.onStep = [&](const StepProgress& p) { out.push_back(p.loss); };
    const Status s = (*t)->train(-1, cb);
    EXPECT_TRUE(s.isOk()) << s.toString();
    return out;
}

TEST(EmulatedDeviceTrainer, FirstStepLossEqualsTheCpuBackendBitForBit) {
    for (bool bf16 : {false, true})
        for (int nmb : {1, 2}) {
            Config c = ts::testing::testBaselineConfig();
            c.num_layers = 2;
            c.hidden_size = 64;
            c.num_attention_heads = 4;
            c.seq_length = 32;
            c.micro_batch_size = 4;
            c.vocab_size = 256;
            c.seed = 7;
            c.train_iters = 1;
            c.data_path = "";
            c.bf16 = bf16;
            c.num_microbatches = nmb;
            const auto cpu = losses(c, false), emu = losses(c, true);
            ASSERT_EQ(cpu.size(), 1u);
            ASSERT_EQ(emu.size(), 1u) << "bf16 " << bf16 << " nmb " << nmb;
            EXPECT_EQ(emu[0], cpu[0]) << "bf16 " << bf16 << " nmb " << nmb;
        }
}

}  // namespace
}  // namespace ts::engine
