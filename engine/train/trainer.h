// Trainer: single-device training loop (data -> microbatches -> forward/backward -> AdamW)
// with progress callbacks, a cancel flag checked between microbatches and inside every op,
// checkpoints, and run metadata for the profiler. Parallel layouts (world > 1) are driven by
// the parallel engine on top of the same GptModel (issue #4).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/recorder.h"
#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/backend/graph.h"
#include "engine/config/config.h"
#include "engine/model/gpt.h"
#include "engine/train/data.h"
#include "engine/train/optimizer.h"

namespace ts::engine {

struct StepProgress {
    int step = 0;                // 1-based iteration number
    double loss = 0;             // mean per-token loss over the global batch
    double stepTimeS = 0;
    double tokensPerS = 0;
    double modelTflops = 0;      // F / (step_time * 1e12 * world)
    double gradNorm = 0;
    double lr = 0;
    int64_t peakMemoryBytes = 0;  // all categories, this step
    int64_t peakMemoryByCategory[size_t(MemCategory::Count)] = {};
};

struct TrainerCallbacks {
    std::function<void(const StepProgress&)> onStep;
    std::function<void(const std::string&)> onLog;
};

// Run metadata every trainer writes for the profiler: model_flops_per_step, flops_formula, pp,
// vpp, num_microbatches, config, peak_tflops, data. Trainers add their own keys.
nlohmann::json baseRunMetadata(const Config& c, double modelFlopsPerStep, double peakTflops,
                               const DataSource* data);

// The checkpoint rule of train() (Trainer and ParallelTrainer): after an iteration
// (endOfTrain false) save to c.save when iteration % save_interval == 0; at the end of train()
// (endOfTrain true) save unless that iteration was just saved. No-op when c.save is empty.
// Ok for device_backend: cpu. For cuda: why this machine cannot run it (no driver, no GPU:
// makeCudaBackend's message); ok for one rank (world size 1, checked against the CPU backend on
// a GPU); for several ranks, that layouts over several GPUs have not yet been checked
// (docs/cuda_port.md) — unless `unverifiedOk` (TrainerOptions /
// ParallelTrainerOptions::allowUnverifiedCuda). Both trainers call it first, so `cuda` never
// silently runs on the CPU.
// cudaDevices (if set): the visible GPUs, where the CUDA backend was made.
Status checkDeviceBackend(const Config& c, bool unverifiedOk = false, int* cudaDevices = nullptr);
// What keeps this machine from running `c` as one process (a node's `validate`, so the workbench
// says it before a run fails): checkDeviceBackend's reason (with TS_CUDA_UNVERIFIED as this
// process's environment says), and a CUDA layout with more ranks than visible GPUs unless they
// share them (cuda_share_gpus). Empty: nothing known against it (the CPU backend runs any layout).
std::vector<std::string> nodeRunIssues(const Config& c);

// What keeps the engine from running c's cuda_graph_impl (empty for none): the values it does not
// execute yet (local, transformer_engine), and for full_iteration what a graph cannot replay
// (the MoE dispatcher's host-sized GEMMs; dropout and delayed FP8 scaling are replayed: their
// kernels read the step's key and scales from device memory, written before each step) or the parallel engine does not capture yet (world size > 1). Each names the knob and
// what to set instead. Trainer::create refuses a config with any; nodeRunIssues lists them.
std::vector<std::string> cudaGraphIssues(const Config& c);

Status saveCheckpointIfDue(const Config& c, int iteration, bool endOfTrain,
                           const std::function<Status(const std::string&)>& save, const TrainerCallbacks& cb);

struct TrainerOptions {
    // The trainer's own backend (when create() gets no device) is the emulated device
    // (emulated_backend.h) instead of the CPU: tests the device-only code path without a GPU.
    bool emulateDevice = emulatedDeviceRequested();
    // Passed to checkDeviceBackend: the single-device trainer runs on GPU 0 without it (that path
    // is checked against the CPU backend on a GPU); it only matters to layouts over several GPUs.
    bool allowUnverifiedCuda = unverifiedCudaRequested();
};

class Trainer {
public:
    // Uses `dev`/`compute` when given, else creates its own 1-device CPU backend. `rec` (may
    // be null) receives the run metadata; the caller attaches it to the device for the trace.
    static Result<std::unique_ptr<Trainer>> create(const Config& c, Device* dev = nullptr,
                                                   Stream* compute = nullptr,
                                                   trace::Recorder* rec = nullptr,
                                                   const TrainerOptions& opts = {});
    ~Trainer();

    // Runs `steps` iterations (<0: until train_iters). Stops early with Cancelled when *cancel
    // becomes true, NumericalError on a NaN/inf loss or gradient (naming the iteration).
    Status train(int steps, const TrainerCallbacks& cb = {}, const std::atomic<bool>* cancel = nullptr);
    // One iteration.
    Status step(StepProgress* out);

    Status save(const std::string& dir);
    Status load(const std::string& dir);

    int iteration() const { return m_iteration; }
    int64_t samplesConsumed() const { return m_samples; }
    GptModel& model() { return *m_model; }
    AdamWOptimizer& optimizer() { return *m_opt; }
    DataSource& data() { return *m_data; }
    Device& device() { return *m_dev; }
    const Config& config() const { return m_cfg; }
    double modelFlopsPerStep() const { return m_flops; }
    // model_flops_per_step, flops_formula, pp, vpp, num_microbatches, config, peak_tflops.
    nlohmann::json runMetadata() const;
    void setPeakTflops(double t) { m_peakTflops = t; }
    // cuda_graph_impl: full_iteration: the graph of the forward and backward of all microbatches,
    // captured after cuda_graph_warmup_steps eager steps (Megatron's, default 3; counted from the
    // trainer's creation or a checkpoint load: the first step makes the backend's library handles,
    // RoPE tables and FP8 weight copies outside the graph) and launched every step from then on;
    // null before (and with cuda_graph_impl: none).
    const StreamGraph* graph() const { return m_graph.get(); }

private:
    Status captureStep(const std::vector<std::shared_ptr<const Microbatch>>& mbs);
    Trainer() = default;
    Config m_cfg;
    std::unique_ptr<Backend> m_ownBackend;
    std::unique_ptr<Stream> m_ownStream;
    Device* m_dev = nullptr;
    Stream* m_stream = nullptr;
    trace::Recorder* m_rec = nullptr;
    std::unique_ptr<GptModel> m_model;
    std::unique_ptr<AdamWOptimizer> m_opt;
    std::unique_ptr<DataSource> m_data;
    LrSchedule m_lr;
    int m_iteration = 0;
    int64_t m_samples = 0;
    int m_numMicrobatches = 1;
    int m_globalBatch = 1;
    double m_flops = 0;
    double m_peakTflops = 0;
    const std::atomic<bool>* m_cancel = nullptr;
    std::unique_ptr<StreamGraph> m_graph;
    int m_eagerSteps = 0;  // steps run eagerly since create / load (the graph's warm-up)
};

}  // namespace ts::engine
