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
#include <map>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/emulated_backend.h"
#include "engine/backend/kernels.h"
#include "tests/parallel/fake_recorder.h"
#include "engine/model/gpt.h"
#include "engine/model/param_buffer.h"
#include "kernels/cpu/ops.h"
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

// The bf16 model copy is the params' bf16 bits (2 bytes an element, what a device's bf16 GEMMs
// read): they are the main params rounded after every kind of write: the whole copy (init,
// optimizer step, checkpoint load) and ranges of it (the distributed optimizer's pieces). On the
// CPU backend and the emulated device alike.
std::vector<uint16_t> bitsOf(Stream& st, const ParamBuffer& pb) {
    std::vector<uint16_t> bits(size_t(pb.numel()));
    EXPECT_TRUE(kern::copyToHost(st, bits.data(), pb.modelBits(), bits.size() * sizeof(uint16_t)).isOk());
    return bits;
}
std::vector<uint16_t> roundedMainOf(Stream& st, ParamBuffer& pb) {
    auto main = pb.mainParamsToHost(st);
    EXPECT_TRUE(main.isOk()) << main.status().toString();
    std::vector<uint16_t> bits(size_t(pb.numel()));
    if (main.isOk()) kernels::cpu::floatToBf16(main->data(), bits.data(), pb.numel());
    return bits;
}

Config bf16Config() {
    Config c = tinyConfig();
    c.bf16 = true;
    return c;
}
Result<std::unique_ptr<Trainer>> bf16Trainer(bool emulate) {
    TrainerOptions o;
    o.emulateDevice = emulate;
    return Trainer::create(bf16Config(), nullptr, nullptr, nullptr, o);
}

TEST(EmulatedDeviceTrainer, Bf16ModelCopyIsTheMainParamsBitsAfterEveryWrite) {
    for (bool emulate : {true, false}) {
        const std::string where = emulate ? "emulated device" : "CPU backend";
        const Config c = bf16Config();
        auto t = bf16Trainer(emulate);
        ASSERT_TRUE(t.isOk()) << t.status().toString();
        ParamBuffer& pb = (*t)->model().params();
        Stream& st = (*t)->model().exec().stream();
        ASSERT_NE(pb.modelBits(), nullptr);
        // fp32 main params and the 2-byte model copy: nothing else of the params stays.
        EXPECT_EQ((*t)->model().exec().device().memoryStats().current[size_t(MemCategory::Params)], 6 * pb.numel())
            << where;
        EXPECT_EQ(bitsOf(st, pb), roundedMainOf(st, pb)) << where << ", after init";
        int steps = 0;
        TrainerCallbacks cb;
        cb.onStep = [&](const StepProgress&) {
            ++steps;
            EXPECT_EQ(bitsOf(st, pb), roundedMainOf(st, pb)) << where << ", after step " << steps;
        };
        ASSERT_TRUE((*t)->train(-1, cb).isOk());
        EXPECT_EQ(steps, c.train_iters);
        // A range of the main params changed and synced (the distributed optimizer's pieces):
        // the copy follows there and only there.
        const int64_t n = pb.numel(), lo = n / 3, hi = n / 2;
        const std::vector<uint16_t> before = bitsOf(st, pb);
        ASSERT_TRUE(kern::runOp(st, "edit", [&] {
                        kern::scale(pb.mainParams(), 3.0f, n);
                        pb.syncModelParams(lo, hi);
                    }).isOk());
        const std::vector<uint16_t> after = bitsOf(st, pb), want = roundedMainOf(st, pb);
        size_t changed = 0, outside = 0, wrong = 0;
        for (int64_t i = 0; i < n; ++i) {
            changed += after[size_t(i)] != before[size_t(i)];
            outside += (i < lo || i >= hi) && after[size_t(i)] != before[size_t(i)];
            wrong += i >= lo && i < hi && after[size_t(i)] != want[size_t(i)];
        }
        EXPECT_GT(changed, 0u) << where;
        EXPECT_EQ(outside, 0u) << where;
        EXPECT_EQ(wrong, 0u) << where;
    }
}

// The fp32 working copy of the weights exists only while a part of the model runs: a step
// unpacks each part's weights (the largest part's copy is Workspace memory for a while) and
// leaves no copy behind, and reading a bf16 weight outside a part stops the process naming it.
TEST(EmulatedDeviceTrainer, Bf16WorkingWeightsLiveOnlyWhileTheirPartRuns) {
    for (bool emulate : {true, false}) {
        const std::string where = emulate ? "emulated device" : "CPU backend";
        auto t = bf16Trainer(emulate);
        ASSERT_TRUE(t.isOk()) << t.status().toString();
        GptModel& m = (*t)->model();
        const Device& dev = m.exec().device();
        const size_t ws = size_t(MemCategory::Workspace);
        const int64_t before = dev.memoryStats().current[ws];
        int64_t largestPart = 0, layer = 0;
        for (int i = 0; i < m.params().count(); ++i)
            if (m.params().info(i).name.rfind("decoder.layers.0.", 0) == 0) layer += m.params().info(i).numel;
        largestPart = std::max(layer, m.params().info(m.params().find("embedding.word_embeddings.weight")).numel);
        StepProgress p;
        ASSERT_TRUE((*t)->step(&p).isOk()) << where;
        ASSERT_TRUE(m.exec().synchronize().isOk());
        EXPECT_GE(dev.memoryStats().peak[ws] - before, 4 * largestPart) << where;
        EXPECT_EQ(dev.memoryStats().current[ws], before) << where << ": a working copy outlived its part";
        EXPECT_DEATH((void)m.params().modelParam(0), "read outside the part of the model that unpacked it") << where;
    }
}

// On a GPU the host queues a step's kernels ahead of the device; an op whose host code reads
// device memory back (a download, a value-returning kernel) stops that until the stream drains.
// Within a microbatch only the MoE router's top-k may (Megatron's dispatcher too waits for its
// data-dependent sizes there); the rest wait once per step at most, where Megatron does as well:
// the grad norm (and the finite check), FP8 delayed scaling's amax history, the expert bias, and
// traced, the MoE router's counters (their aux-loss counts stay on the device until then) and
// tensorwise FP8's last amaxes.
TEST(EmulatedDeviceTrainer, OnlyTheRouterWaitsForTheDeviceWithinAMicrobatch) {
    for (const auto& [name, edit] : ts::testing::trainerVariants()) {
        Config c = tinyConfig();
        edit(c);
        c.train_iters = 2;
        c.num_microbatches = 3;
        TrainerOptions o;
        o.emulateDevice = true;
        auto t = Trainer::create(c, nullptr, nullptr, nullptr, o);
        ASSERT_TRUE(t.isOk()) << name << ": " << t.status().toString();
        ts::test::FakeRecorder rec;
        Device& dev = (*t)->model().exec().device();
        dev.setTrace(&rec, 0);
        const Status st = (*t)->train(-1, {});
        ASSERT_TRUE((*t)->model().exec().synchronize().isOk()) << name;
        dev.setTrace(nullptr, 0);
        ASSERT_TRUE(st.isOk()) << name << ": " << st.toString();
        const bool moe = c.num_moe_experts > 0;
        // The aux terms' counters: once per layer and microbatch, read at the steps' ends.
        int64_t auxLoss = 0;
        for (const auto& k : rec.counters)
            if (rec.str(k.name).ends_with(".aux_loss")) ++auxLoss;
        EXPECT_EQ(auxLoss, moe ? int64_t(c.train_iters) * c.num_microbatches * c.num_layers : 0) << name;
        const int64_t steps = c.train_iters, routings = steps * c.num_microbatches * c.num_layers *
                                                        (c.recompute_granularity == "full" ? 2 : 1);
        const std::map<std::string, int64_t> perStep = {{"optimizer.grad_norm", steps},
                                                        {"fp8_scale_update", steps},
                                                        {"fp8_expert_scale_update", steps},
                                                        {"moe.expert_bias_update", steps},
                                                        {"moe.qb_beta_update", steps},
                                                        {"loss_reduce", steps},
                                                        {"moe.router_stats_read", moe ? steps : 0},
                                                        {"fp8_counters", steps},  // tensorwise, traced
                                                        {"fp8_expert_counters", steps}};
        const auto waits = emulatedHostWaits((*t)->model().exec().device());
        EXPECT_EQ(waits.count("optimizer.grad_norm"), 1u) << name << ": the grad norm is read on the host";
        // Padded to the capacity, every expert's rows are known without the routing: no wait.
        const bool padded = c.moe_expert_capacity_factor > 0 && c.moe_pad_expert_input_to_capacity;
        const auto routerWaits = waits.find("router.topk_permute");
        EXPECT_EQ(routerWaits == waits.end() ? 0 : routerWaits->second, moe && !padded ? routings : 0)
            << name << ": the router waits once per layer's forward, unless padded to the capacity";
        for (const auto& [op, n] : waits) {
            if (op == "router.topk_permute") continue;
            auto it = perStep.find(op);
            if (it == perStep.end()) {
                ADD_FAILURE() << name << ": op " << op << " waited for the device " << n << " times";
                continue;
            }
            EXPECT_EQ(n, it->second) << name << ": op " << op << " should wait once per step";
        }
    }
}

}  // namespace
}  // namespace ts::engine
