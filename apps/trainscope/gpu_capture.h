// GPU capture of a run on the CUDA backend: the CUPTI collector (profiler/cupti) writes the GPUs'
// kernels, memcpys and memsets, and the CUDA API calls, into the run's recorder, next to what the
// engine records itself (host ranges and launch slices), so `analyze` reads a GPU run as it reads
// a CPU run. Each GPU's work goes to its rank's tracks, and each engine stream's work to a track
// named as the CPU backend names it ("rank 3 compute", "rank 3 dp_comm"). NVTX capture stays off:
// the engine records its ranges itself (and marks them with NVTX for Nsight Systems).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/recorder.h"
#include "common/status.h"
#include "engine/backend/backend.h"

namespace ts::cli {

class GpuCapture {
public:
    // `ranks`: (global rank, device) of each rank this process runs. Null, with *why set, when
    // capture cannot start (a build without CUPTI, CUPTI refusing: another profiler attached,
    // no permission for the GPU counters, ...). The recorder must outlive the capture.
    static std::unique_ptr<GpuCapture> start(trace::Recorder& rec,
                                             const std::vector<std::pair<int, const engine::Device*>>& ranks,
                                             std::string* why);
    ~GpuCapture();
    // Writes what the GPUs finished so far (call once a step). stop(): the rest, and the
    // capture's metadata (cupti.clock, cupti.stats); after every GPU is idle.
    Status flush();
    Status stop();

    struct Impl;

private:
    GpuCapture() = default;
    std::unique_ptr<Impl> m;
};

}  // namespace ts::cli
