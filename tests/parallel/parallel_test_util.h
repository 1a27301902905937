// Shared helpers of the parallel-layout tests: the tiny model, layout -> config mappings, the single-device reference config of a parallel config, runs of both
// trainers that collect losses / grad norms / final weights, and their comparison.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/backend/kernels.h"
#include "kernels/cpu/ops.h"
#include "engine/parallel/parallel_trainer.h"
#include "engine/train/trainer.h"
#include "tests/test_baseline_config.h"

namespace ts::test {

// The tiny GPT of the parallel tests: hidden 32, 4 heads, seq 16, vocab 64, micro-batch 2,
// `numLayers` layers (4 by default; withLayout raises it to pp*vpp when that is larger).
inline engine::Config tinyConfig(int numLayers = 4) {
    engine::Config c = ts::testing::testBaselineConfig();
    c.num_layers = numLayers;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.seq_length = 16;
    c.vocab_size = 64;
    c.make_vocab_size_divisible_by = 64;
    c.micro_batch_size = 2;
    c.data_path = "synthetic";
    c.lr = 1e-3;
    c.lr_warmup_iters = 0;
    c.clip_grad = 1.0;
    c.train_iters = 3;
    c.seed = 1234;
    // The parallel engine runs one GEMM thread per rank; the reference does the same so that
    // both use the same OpenBLAS summation order inside a GEMM.
    c.cpu_threads = 1;
    // Adam divides by sqrt(v) + eps: with the default 1e-8, a gradient that is zero in exact
    // arithmetic but rounding noise in fp32 (the attention key bias: softmax ignores a shift
    // of all keys) gets an update of noise/|noise| * lr, so two correct runs whose fp32 sums
    // differ in order differ by up to lr there. eps = 1e-6 keeps such updates ~noise/eps*lr
    // while every real gradient here (|g| >> 1e-6) still gets the sign-like Adam update.
    c.adam_eps = 1e-6;
    return c;
}

// The sequence-parallel tests' model: the tiny GPT with 2 layers.
inline engine::Config tinySpConfig() { return tinyConfig(2); }

struct Layout {
    int tp = 1, pp = 1, vpp = 1, dp = 1, m = 2;  // m: microbatches per DP rank
};

// `c` with the layout applied (global batch = micro-batch * dp * m).
inline engine::Config withLayout(engine::Config c, const Layout& L) {
    c.tensor_model_parallel_size = L.tp;
    c.pipeline_model_parallel_size = L.pp;
    c.virtual_pipeline_model_parallel_size = L.vpp;
    c.data_parallel_size = L.dp;
    c.num_microbatches = L.m;
    c.global_batch_size = c.micro_batch_size * L.dp * L.m;
    if (L.pp * L.vpp > c.num_layers) c.num_layers = L.pp * L.vpp;
    return c;
}

struct SpLayout {
    int tp = 2, pp = 1, vpp = 1, dp = 1, m = 2;
};

// `c` with the layout applied and sequence_parallel on.
inline engine::Config spConfig(engine::Config c, const SpLayout& L) {
    c = withLayout(std::move(c), Layout{L.tp, L.pp, L.vpp, L.dp, L.m});
    c.sequence_parallel = true;
    return c;
}

// An MoE layout of the parallel tests (2 microbatches per DP rank): tp (sequence parallel when > 1),
// expert tp (0: Megatron's default, the tp size), ep, dp, pp, cp (p2p ring), the dispatcher, the
// distributed optimizer, swiglu, grouped GEMM, full recompute of one layer per group, the capacity
// factor (0: dropless) and padding to it.
struct ExpertLayout {
    int tp = 1, etp = 1, ep = 1, dp = 1, pp = 1, cp = 1;
    bool distOpt = false;
    const char* dispatcher = "alltoall";
    bool swiglu = false, grouped = false, recompute = false;
    double capacity = 0;
    bool pad = false;
};

// MoE model `c` on layout L (the model's own knobs, e.g. the router's, stay as `c` has them).
inline engine::Config moeLayoutConfig(engine::Config c, const ExpertLayout& L) {
    c = withLayout(std::move(c), Layout{L.tp, L.pp, 1, L.dp, 2});
    c.sequence_parallel = L.tp > 1;
    c.expert_tensor_parallel_size = L.etp;
    c.expert_model_parallel_size = L.ep;
    c.moe_token_dispatcher_type = L.dispatcher;
    c.use_distributed_optimizer = L.distOpt;
    c.swiglu = L.swiglu;
    c.moe_grouped_gemm = L.grouped;
    if (L.recompute) {
        c.recompute_granularity = "full";
        c.recompute_method = "uniform";
        c.recompute_num_layers = 1;
    }
    c.moe_expert_capacity_factor = L.capacity;
    c.moe_pad_expert_input_to_capacity = L.pad;
    if (L.cp > 1) {
        c.context_parallel_size = L.cp;
        c.cp_comm_type = "p2p";
        c.adam_eps = 1e-5;  // see ContextParallelLayouts
    }
    return c;
}

// One device, same model (vocab padded as Megatron pads it for tp) and same global batch.
inline engine::Config singleDevice(const engine::Config& par) {
    const engine::DerivedSizes ds = engine::deriveSizes(par);
    engine::Config c = par;
    c.tensor_model_parallel_size = c.pipeline_model_parallel_size = c.virtual_pipeline_model_parallel_size = 1;
    c.context_parallel_size = 1;
    // Megatron's rule: a2a+p2p needs hierarchical sizes whose product is the CP size.
    c.hierarchical_context_parallel_sizes.clear();
    if (c.cp_comm_type == "a2a+p2p") c.cp_comm_type = "p2p";
    c.data_parallel_size = 1;
    c.world_size = 0;
    c.sequence_parallel = false;
    c.tp_comm_overlap = false;
    c.make_vocab_size_divisible_by = par.make_vocab_size_divisible_by * ds.tp;
    c.num_microbatches = ds.dp * ds.num_microbatches;
    c.global_batch_size = c.micro_batch_size * c.num_microbatches;
    c.overlap_grad_reduce = c.overlap_param_gather = c.use_distributed_optimizer = false;
    c.average_in_collective = false;
    c.bucket_size = 0;
    return c;
}

using Params = std::map<std::string, std::vector<float>>;

struct RunResult {
    std::vector<double> losses, gradNorms;
    Params params;  // fp32 main weights by name (full, unsharded tensors)
};

// `steps` steps of the single-device Trainer, after loading checkpoint `load` (if set), then
// saving to `save` (if set).
inline Result<RunResult> trainSingle(engine::Config c, int steps, const std::string& load = "",
                                     const std::string& save = "") {
    c.load = load;
    TS_ASSIGN_OR_RETURN(auto t, engine::Trainer::create(c));
    RunResult out;
    for (int s = 0; s < steps; ++s) {
        engine::StepProgress p;
        TS_RETURN_IF_ERROR(t->step(&p));
        out.losses.push_back(p.loss);
        out.gradNorms.push_back(p.gradNorm);
    }
    if (!save.empty()) TS_RETURN_IF_ERROR(t->save(save));
    // Through a copy: on a device backend (TS_EMULATE_DEVICE=1) the buffer is device memory.
    engine::ParamBuffer& pb = t->model().params();
    TS_ASSIGN_OR_RETURN(const auto host, pb.mainParamsToHost(t->model().exec().stream()));
    for (int i = 0; i < pb.count(); ++i)
        out.params[pb.info(i).name].assign(host.begin() + pb.info(i).offset,
                                           host.begin() + pb.info(i).offset + pb.info(i).numel);
    return out;
}

// The same with the ParallelTrainer (params gathered to full tensors); `rec` traces every rank,
// `keep` receives the trainer after the run.
inline Result<RunResult> trainParallel(engine::Config c, int steps, const std::string& load = "",
                                       const std::string& save = "", trace::Recorder* rec = nullptr,
                                       std::unique_ptr<engine::ParallelTrainer>* keep = nullptr,
                                       const engine::ParallelTrainerOptions& opts = {}) {
    c.load = load;
    TS_ASSIGN_OR_RETURN(auto t, engine::ParallelTrainer::create(c, rec, opts));
    RunResult out;
    for (int s = 0; s < steps; ++s) {
        engine::StepProgress p;
        TS_RETURN_IF_ERROR(t->step(&p));
        out.losses.push_back(p.loss);
        out.gradNorms.push_back(p.gradNorm);
    }
    if (!save.empty()) TS_RETURN_IF_ERROR(t->save(save));
    TS_ASSIGN_OR_RETURN(out.params, t->gatherParams(0));
    if (keep) *keep = std::move(t);
    return out;
}

// The single-device reference of a comparison: a failure is a test failure.
inline RunResult runSingle(const engine::Config& c, int steps) {
    auto r = trainSingle(c, steps);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    return r.isOk() ? std::move(r).value() : RunResult{};
}

inline Result<RunResult> runParallel(const engine::Config& c, int steps, trace::Recorder* rec = nullptr) {
    return trainParallel(c, steps, "", "", rec);
}

// ||a - ref|| / ||ref||
inline double relError(const std::vector<float>& a, const std::vector<float>& ref) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = double(a[i]) - double(ref[i]);
        err += d * d;
        norm += double(ref[i]) * double(ref[i]);
    }
    return std::sqrt(err / std::max(norm, 1e-60));
}

// Whether this machine's CPU GEMM gives a row the same bits however the GEMM is split by rows.
// OpenBLAS's AVX2 kernels do not (docs/kernels.md, "Threading"): a 96 x 64 x 200 sgemm in pieces
// of 1-8, 16 or 32 rows differs from the whole in the last bit of many elements. Layouts split
// GEMMs by rows (TP's overlap chunks, EP's experts, CP's sequence halves), so on such a machine a
// last-bit difference now and then moves an FP8 rounding step (fp8LayoutTol).
inline bool gemmSplitsRowsAlike() {
    static const bool alike = [] {
        const int M = 96, N = 64, K = 200;
        std::vector<float> A(size_t(M) * K), B(size_t(K) * N), whole(size_t(M) * N), pieces(whole.size());
        uint32_t state = 12345;
        auto next = [&state] {
            state = state * 1664525u + 1013904223u;
            return float(state >> 8) / float(1 << 24) * 2.0f - 1.0f;
        };
        for (float& x : A) x = next();
        for (float& x : B) x = next();
        kernels::cpu::gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, whole.data(), N);
        for (int rows : {1, 2, 3, 4, 5, 7, 8, 16, 32}) {
            for (int r = 0; r < M; r += rows)
                kernels::cpu::gemm(false, false, std::min(rows, M - r), N, K, 1.0f, A.data() + size_t(r) * K, K,
                                   B.data(), N, 0.0f, pieces.data() + size_t(r) * N, N);
            if (std::memcmp(whole.data(), pieces.data(), sizeof(float) * whole.size()) != 0) return false;
        }
        return true;
    }();
    return alike;
}

// An FP8 layout's tolerance against the run it should equal: `tol` where the CPU GEMM splits rows
// alike (on x86-64 the program asks OpenBLAS for such a kernel: blas_kernel_pin.cpp); else FP8's noise,
// 5e-2 relative: last-bit differences move a bf16 rounding step of an activation gradient now and
// then, and that an FP8 step and Adam a whole update (measured on OpenBLAS's Zen kernel: weights
// up to 1.8e-2 apart after 3 steps, 2026-11-28). That still tells a wrong scale or a lost chunk.
inline double fp8LayoutTol(double tol) {
    if (gemmSplitsRowsAlike()) return tol;
    std::fprintf(stderr, "note: this CPU GEMM rounds a row differently when its GEMM is split by rows: FP8 layouts "
                         "compared within FP8's noise (5e-2)\n");
    return std::max(tol, 5e-2);
}

// An empty checkpoint directory under the test temp dir.
inline std::string checkpointDir(const std::string& name) {
    // Per process: ctest runs the same test twice at once (plain and on the emulated device).
    const std::string dir = ::testing::TempDir() + "/ts_ckpt_" + std::to_string(::getpid()) + "_" + name;
    std::filesystem::remove_all(dir);
    return dir;
}

// The resumed step against step 3 of the uninterrupted single-device run, and every weight.
inline void expectResumedStep(const RunResult& resumed, const RunResult& straight, const std::string& what) {
    ASSERT_EQ(resumed.losses.size(), 1u) << what;
    EXPECT_NEAR(resumed.losses[0], straight.losses[2], 1e-5 * straight.losses[2]) << what;
    EXPECT_NE(resumed.losses[0], straight.losses[0]) << what << ": the resume started from scratch";
    for (const auto& [name, w] : straight.params) {
        auto it = resumed.params.find(name);
        ASSERT_NE(it, resumed.params.end()) << what << ": no '" << name << "'";
        EXPECT_LE(relError(it->second, w), 1e-5) << what << ": " << name;
    }
}

// Two steps of the parallel layout `c` and a save, then one step on one device from the save:
// the single device's step 3 and weights.
inline void expectCheckpointResumesOnOneDevice(const engine::Config& c, const std::string& what) {
    const std::string dir = checkpointDir(what);
    auto saved = trainParallel(c, 2, "", dir);
    ASSERT_TRUE(saved.isOk()) << what << ": " << saved.status().toString();
    const engine::Config one = singleDevice(c);
    const RunResult straight = runSingle(one, 3);
    auto resumed = trainSingle(one, 1, dir);
    ASSERT_TRUE(resumed.isOk()) << what << ": " << resumed.status().toString();
    expectResumedStep(*resumed, straight, what);
    std::filesystem::remove_all(dir);
}

// The reverse: a single-device checkpoint after 2 steps resumed on layout `c` (the step against
// step 3 of the uninterrupted single-device run, and every weight).
inline void expectOneDeviceCheckpointResumesOn(const engine::Config& c, const std::string& what) {
    const engine::Config one = singleDevice(c);
    const std::string dir = checkpointDir(what);
    auto saved = trainSingle(one, 2, "", dir);
    ASSERT_TRUE(saved.isOk()) << what << ": " << saved.status().toString();
    const RunResult straight = runSingle(one, 3);
    auto resumed = trainParallel(c, 1, dir);
    ASSERT_TRUE(resumed.isOk()) << what << ": " << resumed.status().toString();
    expectResumedStep(*resumed, straight, what);
    std::filesystem::remove_all(dir);
}

// A model's main params and grads as host copies, for tests to read and edit by name: on a
// device backend (TS_EMULATE_DEVICE=1) the buffers are device memory that host code may not
// touch. upload() writes the params back (and refreshes the bf16 model copy) on `stream`.
// With sharded main params (bf16, distributed optimizer) the elements this rank does not keep
// read as the model copy's values.
class HostParams {
public:
    HostParams(engine::ParamBuffer& pb, engine::Stream& stream) : m_pb(pb), m_stream(stream) {
        auto p = pb.mainParamsToHost(stream);
        auto g = engine::kern::toHost(stream, pb.mainGrads(), pb.numel());
        EXPECT_TRUE(p.isOk() && g.isOk()) << "reading the params back";
        if (p.isOk()) m_params = std::move(p).value();
        if (g.isOk()) m_grads = std::move(g).value();
        m_params.resize(size_t(pb.numel()));
        m_grads.resize(size_t(pb.numel()));
    }
    int count() const { return m_pb.count(); }
    const engine::ParamInfo& info(int i) const { return m_pb.info(i); }
    int find(const std::string& name) const { return m_pb.find(name); }
    float* mainParam(int i) { return m_params.data() + info(i).offset; }
    const float* mainGrad(int i) const { return m_grads.data() + info(i).offset; }
    Status upload() { return m_pb.mainParamsFromHost(m_stream, m_params); }

private:
    engine::ParamBuffer& m_pb;
    engine::Stream& m_stream;
    std::vector<float> m_params, m_grads;
};

// `steps` steps of the single-device Trainer on a CPU device traced into `rec` (slices, counters,
// run metadata). `edit`, when set, changes the params before the first step; `last` gets the last
// step's progress.
inline Status traceSingle(const engine::Config& c, trace::Recorder& rec, int steps = 1,
                          const std::function<void(HostParams&)>& edit = {}, engine::StepProgress* last = nullptr) {
    auto backend = engine::makeCpuBackend(1);
    engine::Device& dev = backend->device(0);
    dev.setTrace(&rec, 0);
    const Status st = [&]() -> Status {
        auto stream = dev.createStream(trace::TrackKind::Compute, "compute");
        TS_ASSIGN_OR_RETURN(auto t, engine::Trainer::create(c, &dev, stream.get(), &rec));
        if (edit) {
            HostParams hp(t->model().params(), t->model().exec().stream());
            edit(hp);
            TS_RETURN_IF_ERROR(hp.upload());
        }
        for (int s = 0; s < steps; ++s) {
            engine::StepProgress p;
            TS_RETURN_IF_ERROR(t->step(&p));
            if (last) *last = p;
        }
        return Status::ok();
    }();
    dev.setTrace(nullptr, 0);
    return st;
}

// One serial step with lr 0 (the grads stay readable, the weights unchanged): its loss, and every
// param's grad and value by name; `edit` may change the freshly initialized weights first.
struct OneStep {
    double loss = 0;
    std::map<std::string, std::vector<float>> grads, params;
    nlohmann::json fp8;  // the model's FP8 state after the step (history[0] holds its amaxes); null without FP8
};

inline OneStep oneStep(engine::Config c, const std::function<void(HostParams&)>& edit = {}) {
    c.lr = 0;
    c.min_lr = 0;
    c.clip_grad = 0;
    c.weight_decay = 0;
    OneStep out;
    auto t = engine::Trainer::create(c);
    EXPECT_TRUE(t.isOk()) << t.status().toString();
    if (!t.isOk()) return out;
    engine::ParamBuffer& params = (*t)->model().params();
    engine::Stream& stream = (*t)->model().exec().stream();
    if (edit) {
        HostParams hp(params, stream);
        edit(hp);
        const Status up = hp.upload();
        EXPECT_TRUE(up.isOk()) << up.toString();
    }
    engine::StepProgress p;
    const Status st = (*t)->step(&p);
    EXPECT_TRUE(st.isOk()) << st.toString();
    out.loss = p.loss;
    out.fp8 = (*t)->model().fp8State();
    HostParams pb(params, stream);
    for (int i = 0; i < pb.count(); ++i) {
        out.grads[pb.info(i).name].assign(pb.mainGrad(i), pb.mainGrad(i) + pb.info(i).numel);
        out.params[pb.info(i).name].assign(pb.mainParam(i), pb.mainParam(i) + pb.info(i).numel);
    }
    return out;
}

// The gradient of `c`'s one-step loss with respect to the entries of each named param with the
// largest gradients (`perParam` of them) against central finite differences (step eps): within
// `rel` of the numeric value plus 1e-5. Returns how many entries were checked.
inline int expectGradientsMatchFiniteDifferences(const engine::Config& c, const std::vector<std::string>& names,
                                                 int perParam, double rel = 0.05, double eps = 1e-2) {
    const OneStep base = oneStep(c);
    int checked = 0;
    for (const std::string& name : names) {
        auto git = base.grads.find(name);
        if (git == base.grads.end()) {
            ADD_FAILURE() << "no param " << name;
            continue;
        }
        const std::vector<float>& g = git->second;
        std::vector<size_t> idx(g.size());
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
        const size_t n = std::min(idx.size(), size_t(perParam));
        std::partial_sort(idx.begin(), idx.begin() + long(n), idx.end(),
                          [&](size_t a, size_t b) { return std::fabs(g[a]) > std::fabs(g[b]); });
        for (size_t k = 0; k < n; ++k) {
            const size_t j = idx[k];
            double l[2];
            for (int sgn = 0; sgn < 2; ++sgn)
                l[sgn] = oneStep(c, [&](HostParams& pb) { pb.mainParam(pb.find(name))[j] += float(sgn ? -eps : eps); })
                             .loss;
            const double numeric = (l[0] - l[1]) / (2 * eps);
            EXPECT_GT(std::fabs(numeric), 1e-6) << name << "[" << j << "]: a gradient to check";
            EXPECT_NEAR(g[j], numeric, rel * std::fabs(numeric) + 1e-5) << name << "[" << j << "]";
            ++checked;
        }
    }
    return checked;
}

// Losses and grad norms per step within `tol` relative, final weights within weightTol (tol when
// negative); the reference trained.
inline void expectSame(const RunResult& par, const RunResult& ref, double tol, const std::string& what,
                       double weightTol = -1) {
    if (weightTol < 0) weightTol = tol;
    ASSERT_EQ(par.losses.size(), ref.losses.size()) << what;
    for (size_t s = 0; s < ref.losses.size(); ++s) {
        EXPECT_NEAR(par.losses[s], ref.losses[s], tol * std::fabs(ref.losses[s])) << what << " loss, step " << s + 1;
        EXPECT_NEAR(par.gradNorms[s], ref.gradNorms[s], tol * ref.gradNorms[s]) << what << " grad norm, step " << s + 1;
    }
    EXPECT_LT(ref.losses.back(), ref.losses.front()) << what << ": the reference did not train";
    for (const auto& [name, w] : ref.params) {
        auto it = par.params.find(name);
        ASSERT_NE(it, par.params.end()) << what << ": no '" << name << "' in the parallel run";
        ASSERT_EQ(it->second.size(), w.size()) << what << " " << name;
        EXPECT_LE(relError(it->second, w), weightTol) << what << ": weights of " << name;
    }
}

}  // namespace ts::test
