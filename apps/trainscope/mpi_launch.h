// `mpirun -np N trainscope run CONFIG` / `srun -n N trainscope run CONFIG`: world/N global ranks
// per process (issues #6, #18): one each, or T rank threads each (the way one process per node
// drives all its GPUs; process p runs ranks [p*T, (p+1)*T)). Detects the launcher from its environment (Open MPI's
// OMPI_COMM_WORLD_*, MPICH/Hydra's PMI_*, Slurm's SLURM_PROCID / SLURM_STEP_NUM_TASKS /
// SLURM_LOCALID, PMIx's PMIX_*), initializes MPI, checks that MPI agrees with the launcher,
// and hands ParallelTrainer the options that make its process groups MPI communicators
// (engine/comm/mpi) and exchange the per-rank step results between processes.
//
// One run file for all processes: process 0 writes it; every other process records its
// rank's trace and log lines into a ForwardingRecorder (profiler/forwarding_recorder.h) whose
// contents go to process 0 after every step and once at the end (shipTrace, a collective over
// the processes), where they are replayed into the run file with the sender's clock offset.
// Clocks: processes on process 0's host share its monotonic clock (offset 0, error 0);
// processes on other hosts get an offset measured by ping-pong with process 0 (the round trip
// with the smallest delay wins; the error bound is half that round trip). Both are recorded in
// the run file (metadata "clock_alignment" and a log line).
//
// Failures: a process whose run fails sends a notice (rank, host, reason) to every other
// process, whose trainer aborts at once with that reason; a process terminated by a signal
// (the launcher stops the others when one is killed or crashes) aborts its trainer at once and
// names the processes of its host that are gone.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/config.h"
#include "engine/parallel/parallel_trainer.h"

namespace ts::profiler {
class CaptureRecorder;
class ForwardingRecorder;
}  // namespace ts::profiler

namespace ts::cli {

// Who started this process, read from the launcher's variables.
struct LauncherEnv {
    std::string launcher;   // "" (none) | "openmpi" | "mpich" | "slurm" | "pmix"
    int rank = 0, size = 1, localRank = 0;
    std::string variables;  // the variables read, e.g. "SLURM_PROCID=1 SLURM_STEP_NUM_TASKS=2"
};

// Precedence: Open MPI (mpirun sets OMPI_COMM_WORLD_* per process, even inside a Slurm job),
// MPICH/Hydra (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), Slurm's srun (SLURM_PROCID with
// SLURM_STEP_NUM_TASKS, which only srun sets: a batch script's SLURM_PROCID=0 alone is not a
// launch), PMIx (PMIX_RANK, PMIX_SIZE). InvalidArgument names a malformed variable.
Result<LauncherEnv> detectLauncher(const std::function<const char*(const char*)>& getenv);
Result<LauncherEnv> detectLauncher();  // from this process's environment

// Number of processes the launcher says it started (1 when not under a launcher).
int launcherProcessCount();

struct MpiLaunch {
    bool active = false;  // started by a launcher with more than one process
    int process = 0;      // this process's MPI world rank
    int processes = 1;
    int ranksPerProcess = 1;  // world / processes: process p runs global ranks [p*T, (p+1)*T)
    LauncherEnv env;
    std::vector<std::string> hosts;  // per process
    std::shared_ptr<void> runtime;   // keeps MPI initialized; declared first, freed last
    engine::ParallelTrainerOptions options;  // localRanks {process}, MPI group factory, host gather
    // Follower processes: the recorder given to the trainer (its trace goes to process 0).
    std::shared_ptr<profiler::ForwardingRecorder> forward;
    std::shared_ptr<void> link;      // trace shipping, clocks, failure notices (cmd_run_mpi.cpp)

    // Process 0: replays every other process's trace into `rec` from now on and records the
    // clock alignment (measured in mpiLaunchFor) there.
    void attachWriter(profiler::CaptureRecorder& rec);
    // Collective over the processes: the followers' new trace and log lines go to process 0.
    // `final` ships once more after the run ended (bounded wait: a dead process is skipped).
    Status shipTrace(bool final = false);
    // Failure notices: watch for other processes' failures while `trainer` runs (abort it with
    // the notice's reason), and watch `cancel` (a signal: abort at once). Call before train().
    void watch(engine::ParallelTrainer& trainer, const std::atomic<bool>* cancel);
    void unwatch();
    // This process's run failed with `why`: tell every other process (unless the failure came
    // from another process's notice). Returns the text to record (the notice's reason when one
    // arrived first: the first failure anywhere is the cause).
    std::string announceFailure(const std::string& why);
    // Processes of this host that no longer exist (killed or crashed), for messages; "" if none.
    std::string deadPeers() const;
};

// Inactive (default options) unless launched with more than one process. Under a launcher,
// the config's world size must be a multiple of the number of processes.
Result<MpiLaunch> mpiLaunchFor(const engine::Config& c);

// Test hook (documented in docs/parallel.md): TRAINSCOPE_INJECT_FAILURE=RANK:STEP makes global
// rank RANK fail at iteration STEP (0-based) with an op named "injected_failure", if that rank
// runs in this process. Ignored when unset or malformed.
void applyInjectedFailure(engine::ParallelTrainer& trainer);

// The peak TFLOP/s of one device of the run, for MFU (every process of a run takes it the same
// way). GPUs: resources/peak_flops.json's dense peak for the run's dtype (0 = unknown, no MFU);
// CPU: measured with `cpuThreads` GEMM threads (the parallel engine runs one per rank).
double devicePeakTflops(const engine::Config& c, const engine::Device& dev, int cpuThreads);

// Runs this process's rank of the parallel run; its trace (traceOn) and log lines go to the
// run file of process 0. Exit code.
int runMpiFollower(const engine::Config& c, MpiLaunch& launch, bool traceOn, const std::atomic<bool>* cancel);

}  // namespace ts::cli
