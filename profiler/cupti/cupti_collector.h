// CUPTI Activity API session for the CUDA backend: enables kernel, memcpy, memset, runtime and
// driver API and NVTX marker records, copies each CUPTI record into the plain structs of
// profiler/gpu_activity.h and writes the rows through a trace::Recorder (the run's
// CaptureRecorder or a TraceWriter), with GPU timestamps aligned to common/clock.h.
// Built only with CUPTI (TS_HAVE_CUPTI); this header itself needs no CUDA headers.
//
// One collector per process at a time: CUPTI's buffer callbacks are process-global.
//
// NVTX: CUPTI sees NVTX ranges only when the NVTX library injects it, which NVTX decides at
// the process's FIRST NVTX call (it reads NVTX_INJECTION64_PATH then). start() sets that
// variable to this process's libcupti when it is unset, so a collector started before the
// first NVTX call captures ranges; nvtxCaptured() says whether it could.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/recorder.h"
#include "common/status.h"
#include "profiler/gpu_activity.h"

namespace ts::profiler::cupti {

class CuptiCollector {
public:
    // A CUDA stream to name (ActivityConverter::nameStream): `serial` unique per stream.
    struct StreamLabel {
        uint64_t serial = 0;
        void* stream = nullptr;  // cudaStream_t
        int32_t device = 0;
        trace::TrackKind kind = trace::TrackKind::Compute;
        std::string name;
        int32_t rank = -1;  // the rank it works for; -1: Options::rankOfDevice decides
    };
    struct Options {
        int32_t rank = 0;
        int32_t hostDevice = 0;         // TrackDesc.device of the host thread tracks
        bool driverApi = true;          // NCCL launches through the driver API (cuLaunchKernelEx)
        bool keepAllDriverApi = false;  // see ActivityConverter::Options
        bool nvtx = true;
        size_t bufferBytes = 8u << 20;  // one CUPTI activity buffer
        std::vector<int32_t> rankOfDevice;  // ActivityConverter::Options::rankOfDevice
        // Called at each flush(): streams to name before their records are written (a stream
        // named after its first flush keeps the track it got).
        std::function<std::vector<StreamLabel>()> streams;
    };

    // Starts the session (measures the first clock sample). The recorder must outlive the collector.
    static Result<std::unique_ptr<CuptiCollector>> start(trace::Recorder& rec, const Options& options);
    static Result<std::unique_ptr<CuptiCollector>> start(trace::Recorder& rec) { return start(rec, Options{}); }
    ~CuptiCollector();  // stop(); errors are dropped
    CuptiCollector(const CuptiCollector&) = delete;
    CuptiCollector& operator=(const CuptiCollector&) = delete;

    // Makes CUPTI hand over every finished record, takes a new clock sample (the alignment is
    // the line through the first and the newest sample) and writes the rows. Call it now and
    // then (e.g. every step) to bound memory; rows reach the recorder only here and in stop().
    Status flush();
    // flush(), disables the activity kinds, writes metadata "cupti.clock" / "cupti.stats" /
    // "cupti.version". Idempotent.
    Status stop();

    // Calls and ranges of this OS thread (gettid) go to an existing host track.
    void bindHostThread(uint32_t osThreadId, uint32_t track);
    static uint32_t currentOsThreadId();

    bool nvtxCaptured() const { return m_nvtx; }
    gpu::ActivityConverter::Stats stats() const;
    gpu::ClockAlignment clock() const;

    struct Impl;

private:
    CuptiCollector() = default;
    std::unique_ptr<Impl> m;
    bool m_nvtx = false;
};

}  // namespace ts::profiler::cupti
