// cuda_graph_impl: full_iteration on the single-device trainer (engine/backend/graph.h): the
// forward and backward of all microbatches captured once (after cuda_graph_warmup_steps eager
// steps) and launched every step after. On the emulated device, whose graphs record its deferred
// kernels as CUDA's do, a graph run must equal the eager run bit for bit (every step's loss and
// grad norm, the final weights) for every knob path the engine can capture; that also shows
// each step reads its own data through the staged inputs (a graph that replayed the captured
// step's tokens would give the losses of that step). The paths a graph cannot replay are refused
// at create with the reason (cudaGraphIssues).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "engine/backend/emulated_backend.h"
#include "engine/backend/kernels.h"
#include "engine/model/param_buffer.h"
#include "engine/train/trainer.h"
#include "tests/parallel/fake_recorder.h"
#include "tests/trainer_backend_run.h"
#include "tests/trainer_variants.h"

namespace ts::engine {
namespace {

struct GraphRun {
    std::vector<double> losses, gradNorms;
    std::vector<int64_t> peaks;
    std::vector<float> params;
    int64_t nodes = 0, poolBytes = 0;
    bool graphBeforeWarmupEnd = false;
};

GraphRun run(const Config& c) {
    GraphRun r;
    TrainerOptions o;
    o.emulateDevice = true;
    auto t = Trainer::create(c, nullptr, nullptr, nullptr, o);
    EXPECT_TRUE(t.isOk()) << t.status().toString();
    if (!t.isOk()) return r;
    for (int s = 0; s < c.train_iters; ++s) {
        StepProgress p;
        const Status st = (*t)->step(&p);
        EXPECT_TRUE(st.isOk()) << "step " << s + 1 << ": " << st.toString();
        if (!st.isOk()) return r;
        if (s < c.cuda_graph_warmup_steps && (*t)->graph()) r.graphBeforeWarmupEnd = true;
        r.losses.push_back(p.loss);
        r.gradNorms.push_back(p.gradNorm);
        r.peaks.push_back(p.peakMemoryBytes);
    }
    if (const StreamGraph* g = (*t)->graph()) {
        r.nodes = g->nodes();
        r.poolBytes = g->poolBytes();
    }
    ParamBuffer& pb = (*t)->model().params();
    auto host = kern::toHost((*t)->model().exec().stream(), pb.mainParams(), pb.numel());
    EXPECT_TRUE(host.isOk()) << host.status().toString();
    if (host.isOk()) r.params = std::move(host).value();
    return r;
}

// Every trainer variant, and each MoE one again padded to the capacity (the static expert shapes
// a graph needs): under a graph where cudaGraphIssues allows it, refused with the reason where not.
std::vector<ts::testing::TrainerVariant> graphVariants() {
    const std::vector<ts::testing::TrainerVariant> base = ts::testing::trainerVariants();
    std::vector<ts::testing::TrainerVariant> out = base;
    for (const ts::testing::TrainerVariant& v : base) {
        Config c = ts::testing::tinyTrainerConfig();
        v.edit(c);
        if (c.num_moe_experts == 0 || c.moe_pad_expert_input_to_capacity) continue;
        out.push_back({v.name + ", padded to capacity 1.5", [edit = v.edit](Config& cfg) {
                           edit(cfg);
                           cfg.moe_expert_capacity_factor = 1.5;
                           cfg.moe_pad_expert_input_to_capacity = true;
                       }});
    }
    return out;
}

TEST(EmulatedDeviceGraphTrainer, EveryCapturablePathEqualsTheEagerRunBitForBit) {
    int ran = 0, refused = 0, moeRan = 0;
    for (const auto& [name, edit] : graphVariants()) {
        Config c = ts::testing::tinyTrainerConfig();
        edit(c);
        c.train_iters = 4;  // one eager step, the capture, two more launches
        Config g = c;
        g.cuda_graph_impl = "full_iteration";
        g.cuda_graph_warmup_steps = 1;
        if (!cudaGraphIssues(g).empty()) {
            ++refused;
            TrainerOptions o;
            o.emulateDevice = true;
            auto t = Trainer::create(g, nullptr, nullptr, nullptr, o);
            ASSERT_FALSE(t.isOk()) << name << ": a path with graph issues was accepted";
            EXPECT_EQ(t.status().code(), ErrorCode::Unsupported) << name;
            EXPECT_NE(t.status().message().find("cuda_graph_impl: full_iteration"), std::string::npos)
                << name << ": " << t.status().toString();
            continue;
        }
        ++ran;
        moeRan += c.num_moe_experts > 0;
        const GraphRun eager = run(c), graph = run(g);
        ASSERT_EQ(eager.losses.size(), size_t(c.train_iters)) << name;
        ASSERT_EQ(graph.losses.size(), eager.losses.size()) << name;
        EXPECT_FALSE(graph.graphBeforeWarmupEnd) << name << ": captured during the warm-up";
        EXPECT_GT(graph.nodes, 0) << name << ": no graph was captured";
        EXPECT_GT(graph.poolBytes, 0) << name;
        for (size_t s = 0; s < eager.losses.size(); ++s) {
            EXPECT_EQ(graph.losses[s], eager.losses[s]) << name << ": loss, step " << s + 1;
            EXPECT_EQ(graph.gradNorms[s], eager.gradNorms[s]) << name << ": grad norm, step " << s + 1;
        }
        // The steps read different data: a graph replaying the captured step's would repeat its loss.
        EXPECT_NE(eager.losses[2], eager.losses[3]) << name;
        ASSERT_EQ(graph.params.size(), eager.params.size()) << name;
        size_t diff = 0;
        for (size_t i = 0; i < eager.params.size(); ++i) diff += graph.params[i] != eager.params[i];
        EXPECT_EQ(diff, 0u) << name << ": final weights differ in " << diff << " of " << eager.params.size();
        // The graph holds the step's activations for good: a launched step's memory is at least
        // the eager step's peak.
        EXPECT_GE(graph.peaks.back(), eager.peaks.back()) << name;
    }
    EXPECT_GE(ran, 19) << "fewer knob paths run under graphs than expected (dropout, delayed FP8, padded MoE)";
    EXPECT_GE(moeRan, 6) << "padded MoE variants under graphs";
    EXPECT_GE(refused, 7) << "dropless MoE, the expert bias and quantile balancing should be refused";
}

// A resumed run warms up again before it captures (handles, tables and FP8 copies are made
// outside the graph), and trains as the uninterrupted eager run does.
TEST(EmulatedDeviceGraphTrainer, AResumedRunWarmsUpBeforeItCapturesAndMatchesTheEagerRun) {
    Config c = ts::testing::tinyTrainerConfig();
    c.train_iters = 6;
    const GraphRun eager = run(c);
    ASSERT_EQ(eager.losses.size(), 6u);
    Config g = c;
    g.cuda_graph_impl = "full_iteration";
    g.cuda_graph_warmup_steps = 1;
    TrainerOptions o;
    o.emulateDevice = true;
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("ts_graph_resume_" + std::to_string(::getpid()))).string();
    std::vector<double> losses;
    {
        auto t = Trainer::create(g, nullptr, nullptr, nullptr, o);
        ASSERT_TRUE(t.isOk()) << t.status().toString();
        for (int s = 0; s < 3; ++s) {
            StepProgress p;
            ASSERT_TRUE((*t)->step(&p).isOk());
            losses.push_back(p.loss);
        }
        ASSERT_NE((*t)->graph(), nullptr);
        ASSERT_TRUE((*t)->save(dir).isOk());
    }
    auto t = Trainer::create(g, nullptr, nullptr, nullptr, o);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    ASSERT_TRUE((*t)->load(dir).isOk());
    for (int s = 3; s < 6; ++s) {
        StepProgress p;
        ASSERT_TRUE((*t)->step(&p).isOk()) << "step " << s + 1;
        losses.push_back(p.loss);
        if (s == 3) {
            EXPECT_EQ((*t)->graph(), nullptr) << "captured without a warm-up step after the load";
        }
    }
    EXPECT_NE((*t)->graph(), nullptr);
    for (size_t s = 0; s < 6; ++s) EXPECT_EQ(losses[s], eager.losses[s]) << "step " << s + 1;
    std::filesystem::remove_all(dir);
}

// What the trace shows of a launched step: the same kernels (slices on the compute stream's
// track) with the same FLOPs as an eager step, labelled with the launching step, so `analyze`
// measures MFU and the kernel mix of graph steps as of eager ones.
TEST(EmulatedDeviceGraphTrainer, ALaunchedStepTracesTheEagerStepsKernelsUnderItsOwnStep) {
    Config c = ts::testing::tinyTrainerConfig();
    c.train_iters = 5;
    c.num_microbatches = 2;
    c.cuda_graph_impl = "full_iteration";
    ASSERT_EQ(c.cuda_graph_warmup_steps, 3);  // Megatron's default: steps 1-3 eager, 4 captured
    TrainerOptions o;
    o.emulateDevice = true;
    auto t = Trainer::create(c, nullptr, nullptr, nullptr, o);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    ts::test::FakeRecorder rec;
    Device& dev = (*t)->model().exec().device();
    dev.setTrace(&rec, 0);
    for (int s = 0; s < c.train_iters; ++s) {
        ASSERT_TRUE((*t)->step(nullptr).isOk()) << "step " << s + 1;
        EXPECT_EQ((*t)->graph() != nullptr, s >= 3) << "step " << s + 1;
    }
    ASSERT_TRUE((*t)->model().exec().synchronize().isOk());
    dev.setTrace(nullptr, 0);
    const int n = c.train_iters;
    std::vector<int> gemms(size_t(n), 0);
    std::vector<double> flops(size_t(n), 0);
    for (const auto& sl : rec.slices) {
        if (sl.track == 0 || sl.track > rec.tracks.size()) continue;
        if (rec.tracks[sl.track - 1].kind != trace::TrackKind::Compute) continue;
        if (sl.category != trace::Category::Gemm || sl.step < 0 || sl.step >= n) continue;
        ++gemms[size_t(sl.step)];
        flops[size_t(sl.step)] += sl.flops;
    }
    ASSERT_GT(gemms[0], 0) << "no GEMM on the compute track";
    for (int s = 1; s < n; ++s) {
        EXPECT_EQ(gemms[size_t(s)], gemms[0]) << "step " << s + 1;
        EXPECT_EQ(flops[size_t(s)], flops[0]) << "step " << s + 1;
    }
}

// A launched step keeps the host ahead of the device as an eager one does: the host waits only
// where every step waits once (the grad norm, the loss read-back), not in the staging of the
// inputs nor in the launch.
TEST(EmulatedDeviceGraphTrainer, ALaunchedStepWaitsForTheDeviceOnlyWhereEveryStepDoes) {
    Config c = ts::testing::tinyTrainerConfig();
    c.train_iters = 5;
    c.num_microbatches = 2;
    c.cuda_graph_impl = "full_iteration";
    c.cuda_graph_warmup_steps = 1;
    TrainerOptions o;
    o.emulateDevice = true;
    auto t = Trainer::create(c, nullptr, nullptr, nullptr, o);
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    ASSERT_TRUE((*t)->train(-1, {}).isOk());
    ASSERT_NE((*t)->graph(), nullptr);
    const auto waits = emulatedHostWaits((*t)->model().exec().device());
    const std::map<std::string, int64_t> expected = {{"optimizer.grad_norm", c.train_iters},
                                                     {"loss_reduce", c.train_iters}};
    for (const auto& [op, n] : waits) {
        auto it = expected.find(op);
        if (it == expected.end()) {
            ADD_FAILURE() << "op " << op << " waited for the device " << n << " times";
            continue;
        }
        EXPECT_EQ(n, it->second) << op;
    }
    EXPECT_EQ(waits.count("optimizer.grad_norm"), 1u);
}

// A launched step runs no host code, yet reports the MoE router's counters as an eager step does:
// the captured step's counter entries are queued again for each launch (GptModel::graphLaunched)
// and read from the buffers the launch rewrote. Padded to the capacity, the tokens per expert
// (copies routed before dropping) never come to the host within the step: each layer's and
// microbatch's still add up to T x topk, and the dropped ones are those over the capacity.
TEST(EmulatedDeviceGraphTrainer, ALaunchedMoeStepReportsTheRouterCountersOfAnEagerStep) {
    Config c = ts::testing::tinyTrainerConfig();
    c.num_moe_experts = 4;
    c.moe_router_topk = 2;
    c.moe_aux_loss_coeff = 1e-2;
    c.moe_expert_capacity_factor = 1.0;
    c.moe_pad_expert_input_to_capacity = true;
    c.num_microbatches = 2;
    c.train_iters = 5;
    const int T = c.seq_length * c.micro_batch_size, cap = T * c.moe_router_topk / c.num_moe_experts;
    auto counters = [](const Config& cfg) {
        std::vector<std::pair<std::string, double>> out;
        TrainerOptions o;
        o.emulateDevice = true;
        auto t = Trainer::create(cfg, nullptr, nullptr, nullptr, o);
        EXPECT_TRUE(t.isOk()) << t.status().toString();
        if (!t.isOk()) return out;
        ts::test::FakeRecorder rec;
        Device& dev = (*t)->model().exec().device();
        dev.setTrace(&rec, 0);
        const Status st = (*t)->train(-1, {});
        EXPECT_TRUE(st.isOk()) << st.toString();
        EXPECT_TRUE((*t)->model().exec().synchronize().isOk());
        dev.setTrace(nullptr, 0);
        for (const auto& k : rec.counters)
            if (rec.str(k.name).starts_with("moe.")) out.push_back({rec.str(k.name), k.value});
        return out;
    };
    Config g = c;
    g.cuda_graph_impl = "full_iteration";
    g.cuda_graph_warmup_steps = 1;
    const auto eager = counters(c), graph = counters(g);
    EXPECT_EQ(graph, eager) << "a launched step's router counters differ from the eager step's";
    int groups = 0;
    for (size_t i = 0; i < eager.size(); ++i) {
        if (!eager[i].first.ends_with(".tokens.expert0")) continue;
        ASSERT_LE(i + size_t(c.num_moe_experts), eager.size() - 1);
        double sum = 0, over = 0;
        for (int e = 0; e < c.num_moe_experts; ++e) {
            const double v = eager[i + size_t(e)].second;
            sum += v;
            over += std::max(0.0, v - cap);
        }
        EXPECT_EQ(sum, double(T * c.moe_router_topk)) << eager[i].first;
        ASSERT_TRUE(eager[i + size_t(c.num_moe_experts)].first.ends_with(".dropped_tokens"));
        EXPECT_EQ(eager[i + size_t(c.num_moe_experts)].second, over) << eager[i].first;
        ++groups;
    }
    // every step but maybe the last (flushed when the next one begins): layers x microbatches each
    EXPECT_GE(groups, (c.train_iters - 1) * c.num_microbatches * c.num_layers);
}

TEST(EmulatedDeviceGraphTrainer, ValuesAndLayoutsTheEngineDoesNotCaptureAreRefusedWithTheReason) {
    Config c = ts::testing::tinyTrainerConfig();
    c.cuda_graph_impl = "local";
    auto issues = cudaGraphIssues(c);
    ASSERT_EQ(issues.size(), 1u);
    EXPECT_NE(issues[0].find("full_iteration"), std::string::npos) << issues[0];

    c.cuda_graph_impl = "full_iteration";
    EXPECT_TRUE(cudaGraphIssues(c).empty());
    c.cuda_graph_warmup_steps = 0;
    issues = cudaGraphIssues(c);
    ASSERT_EQ(issues.size(), 1u);
    EXPECT_NE(issues[0].find("cuda_graph_warmup_steps: 1 or more"), std::string::npos) << issues[0];
    c.cuda_graph_warmup_steps = 3;
    // replayed (each step's dropout key and delayed scales in device memory): no issue
    c.hidden_dropout = 0.1;
    c.attention_dropout = 0.1;
    c.fp8 = "hybrid";
    c.fp8_recipe = "delayed";
    EXPECT_TRUE(cudaGraphIssues(c).empty());
    c.tensor_model_parallel_size = 2;
    c.num_moe_experts = 4;
    issues = cudaGraphIssues(c);
    ASSERT_EQ(issues.size(), 2u);
    EXPECT_NE(issues[0].find("single-device"), std::string::npos) << issues[0];
    EXPECT_NE(issues[1].find("MoE"), std::string::npos) << issues[1];

    // A node's validate lists what the machine lacks, then what the engine does not run.
    Config node = ts::testing::tinyTrainerConfig();
    node.device_backend = "cuda";
    node.cuda_graph_impl = "local";
    const auto nodeIssues = nodeRunIssues(node);
    ASSERT_FALSE(nodeIssues.empty());
    EXPECT_NE(nodeIssues.back().find("cuda_graph_impl: local"), std::string::npos) << nodeIssues.back();
    if (!makeCudaBackend()) {
        EXPECT_EQ(nodeIssues.size(), 2u) << "the missing GPU and the graph value";
    }

    // The CPU backend has no graphs: the trainer says what to use.
    Config cpu = ts::testing::tinyTrainerConfig();
    cpu.cuda_graph_impl = "full_iteration";
    TrainerOptions o;
    o.emulateDevice = false;
    auto t = Trainer::create(cpu, nullptr, nullptr, nullptr, o);
    ASSERT_FALSE(t.isOk());
    EXPECT_NE(t.status().message().find("TS_EMULATE_DEVICE=1"), std::string::npos) << t.status().toString();

}

}  // namespace
}  // namespace ts::engine
