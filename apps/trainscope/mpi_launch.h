// `mpirun -np N trainscope run CONFIG`: one global rank per process (issue #6). Detects the
// launcher from its environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_SIZE), initializes MPI and
// hands ParallelTrainer the options that make its process groups MPI communicators
// (engine/comm/mpi) and exchange the per-rank step results between processes.
// Process 0 writes the run file and prints progress; the others train silently
// (runMpiFollower). Without MPI in the build, a multi-process launch is an error.
#pragma once

#include <atomic>
#include <memory>

#include "common/status.h"
#include "engine/config/config.h"
#include "engine/parallel/parallel_trainer.h"

namespace ts::cli {

struct MpiLaunch {
    bool active = false;  // started by a launcher with more than one process
    int process = 0;      // = global rank of this process
    int processes = 1;
    std::shared_ptr<void> runtime;           // keeps MPI initialized; declared first, freed last
    engine::ParallelTrainerOptions options;  // localRanks {process}, MPI group factory, host gather
};

// Number of processes the launcher says it started (1 when not under a launcher).
int launcherProcessCount();

// Inactive (default options) unless launched with more than one process. Under a launcher,
// the config's world size must equal the number of processes (one rank per process).
Result<MpiLaunch> mpiLaunchFor(const engine::Config& c);

// Runs this process's rank of the parallel run without writing anything; exit code.
int runMpiFollower(const engine::Config& c, MpiLaunch& launch, const std::atomic<bool>* cancel);

}  // namespace ts::cli
