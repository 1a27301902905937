// Nsight Systems SQLite export (`nsys export --type sqlite`) -> StagedFile per process.
//
// Works across schema versions by asking each table which columns it has (PRAGMA
// table_info) and treating every table as optional: nsys creates a table only when it
// captured something of that kind (newer versions) or always (older ones). Mapping:
//   CUPTI_ACTIVITY_KIND_KERNEL / MEMCPY / MEMSET -> slices on (device, stream) GPU tracks
//   CUPTI_ACTIVITY_KIND_RUNTIME                  -> host slices with correlation ids; rows
//       repeated for one correlationId (2022.x writes eventClass 0 and 67 = "CUDA
//       backtrace" for the same call) are kept once
//   NVTX_EVENTS eventType 59 (push/pop), 60 (start/end) -> Range slices on the thread
// Names are ids into StringIds; pid = (globalTid >> 24) & 0xFFFFFF. Timestamps are ns
// since the session start, so TARGET_INFO_SESSION_START_TIME.utcEpochNs puts them on the
// Unix clock. Rank hints: a thread named "MPI Rank N" (nsys --trace=mpi), else RANK /
// OMPI_COMM_WORLD_RANK / PMI_RANK / SLURM_PROCID in the captured environment.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "profiler/import/staging.h"

namespace ts::profiler::import {

// One StagedFile per process with CUDA or NVTX activity (usually one). Bad rows are skipped
// and counted; an error only when the file is not an SQLite nsys export at all.
Result<std::vector<StagedFile>> parseNsysExport(const std::string& path);

// Exposed for tests: "cudaLaunchKernel_v7000" -> "cudaLaunchKernel".
std::string stripApiVersion(std::string_view name);

}  // namespace ts::profiler::import
