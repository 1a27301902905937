// CUPTI Activity API glue (see cupti_collector.h): buffer callbacks, record copy-out into
// gpu::*Record, clock samples. All row building lives in profiler/gpu_activity.cpp.
#include "profiler/cupti/cupti_collector.h"

#include <cupti.h>
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <set>
#include <unordered_map>
#include <vector>

#include "common/clock.h"

namespace ts::profiler::cupti {

namespace {

Status cuptiError(const char* what, CUptiResult r) {
    const char* text = nullptr;
    cuptiGetResultString(r, &text);
    return Status::internal(std::string(what) + " failed: " + (text ? text : "unknown CUPTI error") +
                            " (is a CUDA driver present, and is no other profiler such as nsys/ncu attached?)");
}

#define TS_CUPTI_TRY(call)                                  \
    do {                                                    \
        const CUptiResult r_ = (call);                      \
        if (r_ != CUPTI_SUCCESS) return cuptiError(#call, r_); \
    } while (0)

constexpr size_t kAlign = 8;  // CUPTI requires 8-byte aligned activity buffers

std::atomic<CuptiCollector::Impl*> g_active{nullptr};
std::mutex g_startMutex;  // serialises start()/stop() across collectors

int64_t cuptiNow() {
    uint64_t t = 0;
    cuptiGetTimestamp(&t);
    return static_cast<int64_t>(t);
}

gpu::ClockSample sampleNow() { return gpu::sampleClocks([] { return ts::monotonicNs(); }, cuptiNow); }

// Path of the loaded libcupti (for NVTX injection), "" when unknown.
std::string cuptiLibraryPath() {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&cuptiGetTimestamp), &info) != 0 && info.dli_fname) return info.dli_fname;
    return {};
}

}  // namespace

struct CuptiCollector::Impl {
    explicit Impl(trace::Recorder& r, const gpu::ActivityConverter::Options& o) : rec(r), converter(r, o) {}

    trace::Recorder& rec;

    std::mutex mu;  // guards converter (CUPTI's worker thread adds, the owner flushes)
    gpu::ActivityConverter converter;
    gpu::ClockSample firstSample;
    Options options;
    std::set<uint64_t> named;  // StreamLabel serials already named (guarded by mu)
    std::vector<CUpti_ActivityKind> enabled;
    std::unordered_map<uint32_t, std::string> runtimeNames, driverNames;  // cbid -> name (CUPTI thread only)
    bool stopped = false;

    const std::string& apiName(bool driver, uint32_t cbid) {
        auto& cache = driver ? driverNames : runtimeNames;
        auto it = cache.find(cbid);
        if (it != cache.end()) return it->second;
        const char* name = nullptr;
        cuptiGetCallbackName(driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name);
        return cache.emplace(cbid, name ? name : (driver ? "cu_unknown" : "cuda_unknown")).first->second;
    }

    // One CUPTI record -> one plain record (caller holds mu).
    void convert(const CUpti_Activity* rec) {
        switch (rec->kind) {
            case CUPTI_ACTIVITY_KIND_KERNEL:
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
                gpu::KernelRecord r;
                r.startNs = k->start;
                r.endNs = k->end;
                r.deviceId = k->deviceId;
                r.contextId = k->contextId;
                r.streamId = k->streamId;
                r.correlationId = k->correlationId;
                r.name = k->name ? k->name : "<unnamed kernel>";
                r.grid = {k->gridX, k->gridY, k->gridZ};
                r.block = {k->blockX, k->blockY, k->blockZ};
                r.sharedMemBytes = k->staticSharedMemory + k->dynamicSharedMemory;
                converter.add(r);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
                gpu::MemcpyRecord r;
                r.startNs = c->start;
                r.endNs = c->end;
                r.deviceId = c->deviceId;
                r.contextId = c->contextId;
                r.streamId = c->streamId;
                r.correlationId = c->correlationId;
                r.bytes = c->bytes;
                r.kind = c->copyKind <= CUPTI_ACTIVITY_MEMCPY_KIND_PTOP ? static_cast<gpu::MemcpyKind>(c->copyKind)
                                                                         : gpu::MemcpyKind::Unknown;
                converter.add(r);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMSET: {
                const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
                gpu::MemsetRecord r;
                r.startNs = m->start;
                r.endNs = m->end;
                r.deviceId = m->deviceId;
                r.contextId = m->contextId;
                r.streamId = m->streamId;
                r.correlationId = m->correlationId;
                r.bytes = m->bytes;
                r.value = m->value;
                converter.add(r);
                break;
            }
            case CUPTI_ACTIVITY_KIND_RUNTIME:
            case CUPTI_ACTIVITY_KIND_DRIVER: {
                const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
                gpu::ApiRecord r;
                r.driver = rec->kind == CUPTI_ACTIVITY_KIND_DRIVER;
                r.startNs = a->start;
                r.endNs = a->end;
                r.processId = a->processId;
                r.threadId = a->threadId;
                r.correlationId = a->correlationId;
                r.name = apiName(r.driver, a->cbid);
                converter.add(r);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MARKER: {
                const auto* mk = reinterpret_cast<const CUpti_ActivityMarker2*>(rec);
                gpu::MarkerRecord r;
                r.tsNs = mk->timestamp;
                r.id = mk->id;
                if (mk->flags & CUPTI_ACTIVITY_FLAG_MARKER_START) r.phase = gpu::MarkerPhase::Start;
                else if (mk->flags & CUPTI_ACTIVITY_FLAG_MARKER_END) r.phase = gpu::MarkerPhase::End;
                else if (mk->flags & CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) r.phase = gpu::MarkerPhase::Instant;
                else break;  // sync markers (acquire/release) are not ranges
                if (mk->objectKind == CUPTI_ACTIVITY_OBJECT_THREAD || mk->objectKind == CUPTI_ACTIVITY_OBJECT_PROCESS) {
                    r.processId = mk->objectId.pt.processId;
                    r.threadId = mk->objectId.pt.threadId;
                }
                if (mk->name) r.name = mk->name;
                if (mk->domain) r.domain = mk->domain;
                converter.add(r);
                break;
            }
            default: break;
        }
    }
};

namespace {

void CUPTIAPI bufferRequested(uint8_t** buffer, size_t* size, size_t* maxNumRecords) {
    CuptiCollector::Impl* impl = g_active.load(std::memory_order_acquire);
    const size_t bytes = impl ? impl->options.bufferBytes : (size_t(1) << 20);
    *buffer = static_cast<uint8_t*>(::operator new(bytes, std::align_val_t(kAlign), std::nothrow));
    *size = *buffer ? bytes : 0;  // a null buffer makes CUPTI drop records (counted below)
    *maxNumRecords = 0;           // as many as fit
}

void CUPTIAPI bufferCompleted(CUcontext ctx, uint32_t streamId, uint8_t* buffer, size_t /*size*/, size_t validSize) {
    CuptiCollector::Impl* impl = g_active.load(std::memory_order_acquire);
    if (impl && buffer) {
        std::lock_guard<std::mutex> lock(impl->mu);
        CUpti_Activity* record = nullptr;
        while (cuptiActivityGetNextRecord(buffer, validSize, &record) == CUPTI_SUCCESS) impl->convert(record);
        size_t dropped = 0;
        if (cuptiActivityGetNumDroppedRecords(ctx, streamId, &dropped) == CUPTI_SUCCESS && dropped > 0)
            impl->converter.addDropped(dropped);
    }
    if (buffer) ::operator delete(buffer, std::align_val_t(kAlign));
}

}  // namespace

uint32_t CuptiCollector::currentOsThreadId() { return static_cast<uint32_t>(::syscall(SYS_gettid)); }

Result<std::unique_ptr<CuptiCollector>> CuptiCollector::start(trace::Recorder& rec, const Options& options) {
    std::lock_guard<std::mutex> startLock(g_startMutex);
    if (g_active.load()) return Status::unsupported("a CUPTI collector is already running in this process; stop it first");
    std::unique_ptr<CuptiCollector> c(new CuptiCollector());
    gpu::ActivityConverter::Options co;
    co.rank = options.rank;
    co.hostDevice = options.hostDevice;
    co.keepAllDriverApi = options.keepAllDriverApi;
    co.rankOfDevice = options.rankOfDevice;
    c->m = std::make_unique<Impl>(rec, co);
    c->m->options = options;

    if (options.nvtx && !std::getenv("NVTX_INJECTION64_PATH")) {
        const std::string lib = cuptiLibraryPath();
        if (!lib.empty()) ::setenv("NVTX_INJECTION64_PATH", lib.c_str(), 0);
    }
    // Thread ids in API/marker records = gettid(), so callers can bind their host tracks.
    TS_CUPTI_TRY(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM));
    g_active.store(c->m.get(), std::memory_order_release);
    const CUptiResult reg = cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted);
    if (reg != CUPTI_SUCCESS) {
        g_active.store(nullptr);
        return cuptiError("cuptiActivityRegisterCallbacks", reg);
    }
    std::vector<CUpti_ActivityKind> kinds = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                             CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};
    if (options.driverApi) kinds.push_back(CUPTI_ACTIVITY_KIND_DRIVER);
    for (CUpti_ActivityKind k : kinds) {
        const CUptiResult r = cuptiActivityEnable(k);
        if (r != CUPTI_SUCCESS) {
            for (CUpti_ActivityKind e : c->m->enabled) cuptiActivityDisable(e);
            g_active.store(nullptr);
            return cuptiError("cuptiActivityEnable", r);
        }
        c->m->enabled.push_back(k);
    }
    // NVTX markers are optional: without injection CUPTI may refuse them; kernels still work.
    if (options.nvtx && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MARKER) == CUPTI_SUCCESS) {
        c->m->enabled.push_back(CUPTI_ACTIVITY_KIND_MARKER);
        c->m_nvtx = true;
    }
    c->m->firstSample = sampleNow();
    {
        std::lock_guard<std::mutex> lock(c->m->mu);
        c->m->converter.setClock(gpu::ClockAlignment::fromSample(c->m->firstSample));
    }
    return c;
}

CuptiCollector::~CuptiCollector() { (void)stop(); }

Status CuptiCollector::flush() {
    if (!m || m->stopped) return Status::ok();
    TS_CUPTI_TRY(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    const gpu::ClockSample now = sampleNow();
    std::vector<StreamLabel> labels;
    if (m->options.streams) labels = m->options.streams();
    std::lock_guard<std::mutex> lock(m->mu);
    for (const StreamLabel& l : labels) {
        if (!m->named.insert(l.serial).second) continue;
        uint32_t id = 0;
        // Context NULL: CUPTI finds the stream's own.
        if (cuptiGetStreamIdEx(nullptr, static_cast<CUstream>(l.stream), 0, &id) == CUPTI_SUCCESS)
            m->converter.nameStream(static_cast<uint32_t>(l.device), id, l.kind, l.name, l.rank);
    }
    m->converter.setClock(gpu::ClockAlignment::fromSamples(m->firstSample, now));
    m->converter.flush();
    return Status::ok();
}

Status CuptiCollector::stop() {
    if (!m || m->stopped) return Status::ok();
    std::lock_guard<std::mutex> startLock(g_startMutex);
    Status s = flush();
    for (CUpti_ActivityKind k : m->enabled) cuptiActivityDisable(k);
    m->enabled.clear();
    // Records completed while disabling still reach this collector; then detach it.
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    g_active.store(nullptr, std::memory_order_release);
    {
        std::lock_guard<std::mutex> lock(m->mu);
        m->converter.finish();
        uint32_t version = 0;
        if (cuptiGetVersion(&version) == CUPTI_SUCCESS) m->rec.metadata("cupti.version", std::to_string(version));
        m->rec.metadata("cupti.nvtx", m_nvtx ? "captured" : "not captured");
    }
    m->stopped = true;
    return s;
}

void CuptiCollector::bindHostThread(uint32_t osThreadId, uint32_t track) {
    std::lock_guard<std::mutex> lock(m->mu);
    m->converter.bindHostThread(osThreadId, track);
}

gpu::ActivityConverter::Stats CuptiCollector::stats() const {
    std::lock_guard<std::mutex> lock(m->mu);
    return m->converter.stats();
}

gpu::ClockAlignment CuptiCollector::clock() const {
    std::lock_guard<std::mutex> lock(m->mu);
    return m->converter.clock();
}

}  // namespace ts::profiler::cupti
