// ParallelTrainer: the multi-rank training loop for world = tp*cp*pp*dp > 1 in one process
// (issue #4). A CPU backend with `world` virtual devices; per rank one host thread (kept for
// the whole run, so the trace has one host track per rank), a compute stream, a DP comm
// stream and a p2p stream; the CommWorld groups of the Megatron layout (tp, pp, dp, embd and
// the grad-norm group); v GptModel chunks per rank (layer placement of REFERENCE.md §1.3);
// a GradSync per chunk (engine/parallel/ddp.h), a ShardedAdamW (engine/parallel/dist_optimizer.h) and a
// PipelineExecutor running the rank's Megatron op list (engine/parallel/pipeline_executor.h).
//
// Data (the exact single-device reference): with micro_batch_size b, dp ranks and m
// microbatches per rank, DP rank d's local microbatch j holds samples
//   [S + (j*dp + d)*b, S + (j*dp + d + 1)*b),   S = samples consumed before the iteration,
// i.e. Megatron's sampler (each step of b*dp samples is split rank by rank) and exactly the
// microbatch j*dp + d of a single-device run with the same micro_batch_size and dp*m
// microbatches; the model is told that id, so dropout seeds agree too. The per-token loss
// scale 1/(tokens*m) times the 1/dp grad scaling equals the single device's 1/(tokens*m*dp).
// The reported loss is Megatron's logged loss: the mean over all dp*m microbatches of their
// per-token mean loss, taken from the last pipeline stage (tp rank 0) of every DP replica.
//
// Iteration order on every rank (Megatron's train_step + finalize_model_grads):
//   zero grads -> op list (forward/backward/p2p; bucket reductions launched from backward with
//   overlap_grad_reduce) -> remaining bucket reductions -> tied-embedding grad all-reduce over
//   "embd" (first and last pp stage) -> compute waits for the DP stream -> grad norm over the
//   whole model, clipping, AdamW on what this rank owns -> (distributed optimizer) param
//   all-gather, waited per bucket by the next forward with overlap_param_gather.
//
// Errors: the first rank that fails records its Status ("rank R (tp t, pp p, dp d): ...",
// which names the failing op and stream) and aborts the CommWorld, so every other rank's
// pending and future communication fails at once; step() returns that first Status. A
// cancelled run aborts the world the same way. After a failure the trainer cannot continue.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/recorder.h"
#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/comm/inproc_communicator.h"
#include "engine/config/config.h"
#include "engine/parallel/ddp.h"
#include "engine/parallel/layout.h"
#include "engine/train/trainer.h"

namespace ts::engine {

// Several processes (`mpirun -np N trainscope run`): each process runs some of the global
// ranks; a process group's communicator comes from the factory (e.g. MPI) instead of the
// in-process CommWorld, and the per-rank host values the step reports (losses, peak memory)
// reach every process through `gatherHost`. Defaults: all ranks in this process.
using GroupFactory = std::function<Result<std::unique_ptr<Communicator>>(
    const std::string& name, const std::vector<int>& members, int globalRank)>;
// in: one record per local rank, in localRanks order, each of `recordSize` doubles;
// out: one record per global rank (rank order), world * recordSize doubles.
using HostGather = std::function<Status(const std::vector<double>& in, int recordSize, std::vector<double>& out)>;

struct ParallelTrainerOptions {
    std::chrono::milliseconds commTimeout{60'000};  // deadlock guard of every collective/p2p op
    std::vector<int> localRanks;  // global ranks run by this process; empty = all of them
    GroupFactory makeGroup;       // null = in-process CommWorld::join
    HostGather gatherHost;        // null = every rank is local (no exchange needed)
    // Called once, with the run's error, from the thread of the first local rank that fails (not
    // for abort() from outside): several processes use it to tell the others at once.
    std::function<void(const Status&)> onFailure;
    // Several processes: checkpoints exchange the parameter table (gatherText: every process's
    // text, process order) and merge the partial checkpoint images (mergeHost: in place, over
    // the processes; every word is nonzero in at most one process, so a bitwise OR, or the
    // integer sum, gives the holder's bits). Null = every rank is local.
    std::function<Status(const std::string& mine, std::vector<std::string>& all)> gatherText;
    std::function<Status(uint32_t* words, size_t n)> mergeHost;
    // Every local rank's device is an emulated device (emulated_backend.h) instead of a CPU
    // virtual device: tests the device-only code path without a GPU.
    bool emulateDevice = emulatedDeviceRequested();
    // device_backend: cuda with world size > 1: run on the GPUs although layouts over several GPUs
    // have not yet been checked against the CPU backend on a machine with several
    // (TS_CUDA_UNVERIFIED=1); one rank on one GPU needs no opt-in. The run metadata says so
    // (cuda_unverified).
    bool allowUnverifiedCuda = unverifiedCudaRequested();
    // device_backend: cuda: the GPU (CUDA ordinal) of each local rank, localRanks order; empty =
    // the i-th local rank on GPU i. One GPU per rank.
    std::vector<int> cudaDevices;
    // Every group's communicator host-synchronized (hostSynchronized, communicator.h) on any
    // backend (TS_HOST_SYNC_COLLECTIVES=1); implied by the knob cuda_share_gpus. Metadata:
    // host_sync_collectives.
    bool hostSyncCollectives = hostSyncCollectivesRequested();
};

class ParallelTrainer {
public:
    // `rec` (may be null) gets the run metadata and every rank's trace (device r traces as
    // global rank r).
    static Result<std::unique_ptr<ParallelTrainer>> create(const Config& c, trace::Recorder* rec = nullptr,
                                                           const ParallelTrainerOptions& opts = {});
    ~ParallelTrainer();

    // Same contract as Trainer::train / Trainer::step (train saves to `save` every
    // save_interval iterations and at the end, as Trainer::train).
    Status train(int steps, const TrainerCallbacks& cb = {}, const std::atomic<bool>* cancel = nullptr);
    Status step(StepProgress* out);

    // Checkpoints in the single-device format (engine/train/checkpoint.h): every param un-sharded
    // over TP (GptModel's split), its fp32 main weight and Adam exp_avg/exp_avg_sq gathered
    // over DP when use_distributed_optimizer shards them, plus iteration, samples consumed
    // (data position) and seed (dropout RNG) and the saved-from layout. Load scatters a
    // checkpoint of ANY layout (or of the single-device Trainer) of the same model; `load`
    // in the config runs it from create(). With several processes (mpirun) every process calls
    // them: the partial images are summed over the processes and the one holding global rank 0
    // writes; on load every process reads the directory (shared or copied to each node).
    Status save(const std::string& dir);
    Status load(const std::string& dir);

    int iteration() const { return m_iteration; }
    int64_t samplesConsumed() const { return m_samples; }
    int worldSize() const { return m_layout.worldSize(); }
    const ParallelLayout& layout() const { return m_layout; }
    const Config& config() const { return m_cfg; }
    double modelFlopsPerStep() const { return m_flops; }
    void setPeakTflops(double t) { m_peakTflops = t; }
    Backend& backend() { return *m_backend; }
    // What the user should know about this run's placement before it starts (GPUs: tensor-
    // parallel groups not inside one NVLink domain); the caller shows them (run log, stderr).
    const std::vector<std::string>& warnings() const { return m_warnings; }
    // (global rank, its device) for each rank this process runs, in rank order.
    std::vector<std::pair<int, const Device*>> localDevices() const;
    nlohmann::json runMetadata() const;

    // Waits until every stream of every rank is idle; the first error, if any.
    Status synchronize();
    // Full (TP-unsharded) main params by name, read from DP replica `dpRank` after
    // synchronize(); with bf16 and the distributed optimizer each element from the rank that
    // keeps its fp32 main param (the replicas share them: dpRank must be 0). The last
    // stage's copy of a tied embedding is listed as "output_layer.weight[tied copy]".
    Result<std::map<std::string, std::vector<float>>> gatherParams(int dpRank = 0);

    // Introspection for tests and the benchmark.
    const GradSync& gradSync(int rank, int chunk) const;
    GptModel& rankModel(int rank, int chunk);
    int numChunks() const;
    int64_t optimizerOwnedNumel(int rank) const;
    // Buckets whose reduction started from a grad-ready hook during the last step (all ranks).
    int bucketsLaunchedEarly() const;
    MemoryStats memoryStats(int rank) const;

    // Stops the run from outside (another process failed, a signal): `why` becomes the run's
    // error unless one was recorded first, and every communicator of this process's ranks is
    // aborted so pending and future communication fails at once. Thread-safe.
    void abort(const Status& why);

    // Test hook: at iteration `step` (0-based) rank `rank` enqueues a failing op named `opName`
    // on its compute stream before its first forward.
    void injectFailure(int rank, int step, std::string opName);

    struct RankState;

private:
    ParallelTrainer() = default;
    // `local` indexes m_ranks (this process's ranks); equals the global rank in one process.
    Status rankStep(int local, int it, const std::atomic<bool>* cancel);
    void failRank(int local, const Status& st);
    void abortAfterFailure(int local, const Status& st);
    RankState* localRankState(int globalRank) const;  // null when another process runs it  // failRank's aborts (m_errorMutex held)

    Config m_cfg;
    ParallelLayout m_layout;
    trace::Recorder* m_rec = nullptr;
    std::unique_ptr<Backend> m_backend;
    std::unique_ptr<CommGroups> m_world;
    std::vector<std::string> m_warnings;  // CommWorld, or NcclWorld for the GPUs of this process
    std::unique_ptr<DataSource> m_data;
    std::vector<std::unique_ptr<RankState>> m_ranks;
    std::vector<std::vector<std::shared_ptr<Microbatch>>> m_stepData;  // [dp rank][local mb]
    LrSchedule m_lr;
    int m_iteration = 0;
    int64_t m_samples = 0;
    int m_numMicrobatches = 1;
    int m_globalBatch = 1;
    double m_flops = 0;
    double m_peakTflops = 0;
    std::mutex m_errorMutex;
    Status m_firstError;
    const std::atomic<bool>* m_cancel = nullptr;
    int m_injectRank = -1, m_injectStep = -1;
    std::string m_injectOp;
    ParallelTrainerOptions m_opts;  // localRanks completed (never empty after create)
};

}  // namespace ts::engine
