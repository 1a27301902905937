// The single-device trainer on the emulated device (engine/backend/emulated_backend.h: the GPU's
// execution model on the CPU: an op's host code runs at submit, its kernels later; buffer memory
// traps host access) against the same run on the CPU backend, bit for bit: every step's loss and
// grad norm, and the final weights.
//
// What runs there is the dense and the MoE single-device path (docs/cuda_port.md, "Status"). A knob
// whose path still touches device memory from the host stops the process with the emulated
// device's message and a backtrace naming the op; the variants (tests/trainer_variants.h, shared
// with the CUDA trainer test) are the ones that run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/gpt.h"
#include "engine/train/trainer.h"
#include "tests/trainer_backend_run.h"
#include "tests/trainer_variants.h"

namespace ts::engine {
namespace {

using ts::testing::TrainRun;

TrainRun train(const Config& c, bool emulate) {
    TrainerOptions o;
    o.emulateDevice = emulate;
    return ts::testing::trainRun(c, o);
}

Config tinyConfig() { return ts::testing::tinyTrainerConfig(); }

void expectBitEqual(const Config& c, const std::string& what) {
    const TrainRun cpu = train(c, false), emu = train(c, true);
    ASSERT_EQ(cpu.losses.size(), size_t(c.train_iters)) << what;
    ASSERT_EQ(emu.losses.size(), cpu.losses.size()) << what;
    for (size_t s = 0; s < cpu.losses.size(); ++s) {
        EXPECT_EQ(emu.losses[s], cpu.losses[s]) << what << ": loss, step " << s + 1;
        EXPECT_EQ(emu.gradNorms[s], cpu.gradNorms[s]) << what << ": grad norm, step " << s + 1;
    }
    EXPECT_LT(cpu.losses.back(), cpu.losses.front()) << what << ": the run did not train";
    ASSERT_EQ(emu.params.size(), cpu.params.size()) << what;
    size_t diff = 0;
    for (size_t i = 0; i < cpu.params.size(); ++i) diff += emu.params[i] != cpu.params[i];
    EXPECT_EQ(diff, 0u) << what << ": final weights differ in " << diff << " of " << cpu.params.size();
}

TEST(EmulatedDeviceTrainer, EveryStepEqualsTheCpuBackendBitForBit) {
    for (const auto& [name, edit] : ts::testing::trainerVariants()) {
        Config c = tinyConfig();
        edit(c);
        expectBitEqual(c, name);
    }
}

}  // namespace
}  // namespace ts::engine
