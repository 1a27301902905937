// GPU capture of a run on the CUDA backend (gpu_capture.h).
#include "apps/trainscope/gpu_capture.h"

#if defined(TS_HAVE_CUPTI) && defined(TS_HAVE_CUDA)
#include "engine/backend/cuda/cuda_backend.h"
#include "profiler/cupti/cupti_collector.h"
#define TS_GPU_CAPTURE 1
#else
#define TS_GPU_CAPTURE 0
#endif

namespace ts::cli {

struct GpuCapture::Impl {
#if TS_GPU_CAPTURE
    std::unique_ptr<profiler::cupti::CuptiCollector> collector;
#endif
};

GpuCapture::~GpuCapture() { (void)stop(); }

#if TS_GPU_CAPTURE

std::unique_ptr<GpuCapture> GpuCapture::start(trace::Recorder& rec,
                                              const std::vector<std::pair<int, const engine::Device*>>& ranks,
                                              std::string* why) {
    using profiler::cupti::CuptiCollector;
    CuptiCollector::Options o;
    o.nvtx = false;  // the engine records its ranges itself
    for (const auto& [rank, dev] : ranks) {
        const int ordinal = dev ? engine::cudaDeviceOrdinal(*dev) : -1;
        if (ordinal < 0) continue;
        if (o.rankOfDevice.size() <= size_t(ordinal)) o.rankOfDevice.resize(size_t(ordinal) + 1, ranks.front().first);
        o.rankOfDevice[size_t(ordinal)] = rank;
    }
    if (o.rankOfDevice.empty()) {
        if (why) *why = "no rank of this process runs on a CUDA device";
        return nullptr;
    }
    o.rank = ranks.front().first;
    o.hostDevice = engine::cudaDeviceOrdinal(*ranks.front().second);
    o.streams = [] {
        std::vector<CuptiCollector::StreamLabel> out;
        for (const engine::CudaStreamLabel& l : engine::cudaStreamLabels())
            out.push_back({l.serial, l.stream, l.device, l.kind, l.name, l.rank});
        return out;
    };
    auto c = CuptiCollector::start(rec, o);
    if (!c) {
        if (why) *why = "CUPTI did not start: " + c.status().message();
        return nullptr;
    }
    std::unique_ptr<GpuCapture> g(new GpuCapture());
    g->m = std::make_unique<Impl>();
    g->m->collector = std::move(c).value();
    return g;
}

Status GpuCapture::flush() { return m && m->collector ? m->collector->flush() : Status::ok(); }

Status GpuCapture::stop() {
    if (!m || !m->collector) return Status::ok();
    Status s = m->collector->stop();
    m->collector.reset();
    return s;
}

#else

std::unique_ptr<GpuCapture> GpuCapture::start(trace::Recorder&, const std::vector<std::pair<int, const engine::Device*>>&,
                                              std::string* why) {
    if (why) *why = "this build has no CUPTI (configure with the CUDA toolkit's CUPTI to capture GPU kernels)";
    return nullptr;
}

Status GpuCapture::flush() { return Status::ok(); }
Status GpuCapture::stop() { return Status::ok(); }

#endif

}  // namespace ts::cli
