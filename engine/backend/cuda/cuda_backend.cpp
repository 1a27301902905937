// CUDA backend implementation (see cuda_backend.h): devices, non-blocking streams that run
// their launchers on the caller's thread, cudaEvent events, and the caching allocator.
#include "engine/backend/cuda/cuda_backend.h"
#include "kernels/common/fp8_codes.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/peak_flops.h"
#include "engine/backend/backend_trace.h"
#include "engine/backend/cuda_ops.h"
#include "engine/backend/graph.h"
#include "engine/backend/graph_pool.h"
#include "engine/backend/host_runtime.h"

namespace ts::engine {

namespace {

Status fromCuda(cudaError_t err, const std::string& what) {
    if (err == cudaSuccess) return Status::ok();
    std::string msg = what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    switch (err) {
        case cudaErrorMemoryAllocation: return {ErrorCode::OutOfMemory, msg};
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
        case cudaErrorNoKernelImageForDevice: return Status::unsupported(msg);
        case cudaErrorInvalidValue:
        case cudaErrorInvalidDevicePointer: return Status::invalid(msg);
        default: return Status::internal(msg);
    }
}

using host::formatBytes;

// Every live stream of every CUDA device of the process (cudaStreamLabels): serial -> label, and
// the Device it belongs to as an identity key (never dereferenced), so that setTrace can give
// its streams' labels the rank it now traces for.
std::mutex g_labelsMutex;
std::map<uint64_t, std::pair<CudaStreamLabel, const void*>> g_labels;
std::atomic<uint64_t> g_nextSerial{0};

uint64_t addStreamLabel(CudaStreamLabel label, const void* device) {
    label.serial = ++g_nextSerial;
    std::lock_guard<std::mutex> lock(g_labelsMutex);
    g_labels[label.serial] = {label, device};
    return label.serial;
}

void dropStreamLabel(uint64_t serial) {
    std::lock_guard<std::mutex> lock(g_labelsMutex);
    g_labels.erase(serial);
}

void setStreamLabelsRank(const void* device, int rank) {
    std::lock_guard<std::mutex> lock(g_labelsMutex);
    for (auto& [serial, entry] : g_labels)
        if (entry.second == device) entry.first.rank = rank;
}

// Makes `device` current for the scope and restores the caller's device afterwards, so a
// submit or a free never changes which device the calling thread works on.
class DeviceGuard {
public:
    explicit DeviceGuard(int device) : m_device(device) {
        if (cudaGetDevice(&m_prev) != cudaSuccess) m_prev = -1;
        if (m_prev != m_device) m_ok = cudaSetDevice(m_device) == cudaSuccess;
    }
    ~DeviceGuard() {
        if (m_prev >= 0 && m_prev != m_device) (void)cudaSetDevice(m_prev);
    }
    bool ok() const { return m_ok; }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    int m_device;
    int m_prev = -1;
    bool m_ok = true;
};

// ----- memory -------------------------------------------------------------------------------

// Size class of a request (see cuda_backend.h). cudaMalloc returns 256-byte aligned blocks;
// 512-byte steps keep every block at least that aligned and bound the number of small classes.
size_t sizeClass(size_t bytes) {
    const size_t b = bytes == 0 ? 1 : bytes;
    if (b <= (size_t(1) << 20)) return (b + 511) / 512 * 512;
    int msb = 63;
    while (!(b >> msb)) --msb;
    const size_t step = size_t(1) << (msb - 3);
    return (b + step - 1) / step * step;
}

// A freed block and the events (one per stream live at the free) it waits for before reuse.
struct CachedBlock {
    void* ptr = nullptr;
    std::vector<cudaEvent_t> pending;
};

// Shared by the device, its streams and its buffers: the accounting (live bytes per category,
// peaks, limit, counters; host_runtime.h, as the CPU backend's) and the block cache. Every member
// is guarded by `mutex`; CUDA calls on the device's blocks and events are made with the device
// current (DeviceGuard).
struct MemState : host::GraphMemAccounting {
    int ordinal = 0;
    bool deviceAlive = true;
    std::unordered_map<size_t, std::vector<CachedBlock>> freeBlocks;  // size class -> blocks
    std::vector<cudaStream_t> liveStreams;  // streams a freed block may still be in use on
    std::vector<cudaEvent_t> eventPool;     // recycled timing-free events
    cudaStream_t captureStream = nullptr;  // the stream being captured into a graph (graph.h)

    ~MemState() {
        DeviceGuard g(ordinal);
        releaseCache();
        for (cudaEvent_t e : eventPool) (void)cudaEventDestroy(e);
    }

    cudaEvent_t takeEvent() {
        if (!eventPool.empty()) {
            cudaEvent_t e = eventPool.back();
            eventPool.pop_back();
            return e;
        }
        cudaEvent_t e = nullptr;
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        return e;
    }

    // True when no stream can still use the block; completed events go back to the pool.
    bool ready(CachedBlock& b) {
        while (!b.pending.empty()) {
            const cudaError_t q = cudaEventQuery(b.pending.back());
            if (q == cudaErrorNotReady) return false;
            // Success, or an error: a failed context reports it elsewhere (synchronize); the
            // event will never complete, so waiting for it would only leak the block.
            if (q != cudaSuccess) (void)cudaGetLastError();
            eventPool.push_back(b.pending.back());
            b.pending.pop_back();
        }
        return true;
    }

    // A cached block of class `cls` that no stream still uses, or null.
    void* takeCached(size_t cls) {
        auto it = freeBlocks.find(cls);
        if (it == freeBlocks.end()) return nullptr;
        auto& blocks = it->second;
        for (size_t i = blocks.size(); i-- > 0;) {  // newest first: most likely still warm in L2
            if (!ready(blocks[i])) continue;
            void* p = blocks[i].ptr;
            blocks[i] = std::move(blocks.back());
            blocks.pop_back();
            cachedBytes -= cls;
            return p;
        }
        return nullptr;
    }

    // Stream-ordered free: the block waits for everything submitted so far on every live stream.
    void giveBack(void* p, size_t cls) {
        CachedBlock b;
        b.ptr = p;
        for (cudaStream_t s : liveStreams) {
            // A record on a capturing stream would become a node of its graph, not an event to
            // wait for; blocks a capture may use are the graph's (graph_pool.h), not freed here.
            if (s == captureStream) continue;
            cudaEvent_t e = takeEvent();
            if (!e || cudaEventRecord(e, s) != cudaSuccess) {
                // Cannot order the free after this stream: wait for it instead.
                (void)cudaGetLastError();
                if (e) eventPool.push_back(e);
                (void)cudaStreamSynchronize(s);
                (void)cudaGetLastError();
                continue;
            }
            b.pending.push_back(e);
        }
        freeBlocks[cls].push_back(std::move(b));
        cachedBytes += cls;
    }

    // Waits for the work still pending on each block (its events), then cudaFree. The wait is
    // explicit: cudaFree follows default-stream semantics, and our streams are non-blocking, so
    // its implicit synchronization is not something to free a block in use on.
    void releaseCache() {
        for (auto& [cls, blocks] : freeBlocks)
            for (CachedBlock& b : blocks) {
                for (cudaEvent_t e : b.pending) {
                    (void)cudaEventSynchronize(e);
                    eventPool.push_back(e);
                }
                (void)cudaFree(b.ptr);
            }
        (void)cudaGetLastError();
        freeBlocks.clear();
        cachedBytes = 0;
    }
};

class CudaBuffer final : public host::BlockBuffer<MemState> {
public:
    CudaBuffer(Device& dev, std::shared_ptr<MemState> mem, void* p, size_t bytes, MemCategory cat, uint64_t serial,
               bool fromPool)
        : BlockBuffer(dev, std::move(mem), p, bytes, cat), m_serial(serial), m_fromPool(fromPool) {}
    ~CudaBuffer() override;

private:
    uint64_t m_serial;
    bool m_fromPool;  // handed out during a graph capture
};

// ----- events -------------------------------------------------------------------------------

class CudaEvent final : public Event {
public:
    CudaEvent(int ordinal, bool timing) : m_ordinal(ordinal) {
        DeviceGuard g(ordinal);
        const cudaError_t err =
            cudaEventCreateWithFlags(&m_event, timing ? cudaEventDefault : cudaEventDisableTiming);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            m_event = nullptr;
            m_error = fromCuda(err, "cudaEventCreate");
        }
    }
    ~CudaEvent() override {
        if (m_event) {
            DeviceGuard g(m_ordinal);
            (void)cudaEventDestroy(m_event);
        }
    }
    bool query() override {
        if (!m_event) return true;
        const cudaError_t q = cudaEventQuery(m_event);
        if (q == cudaErrorNotReady) return false;
        if (q != cudaSuccess) (void)cudaGetLastError();  // will never complete: report done
        return true;
    }
    void synchronize() override {
        if (m_event && cudaEventSynchronize(m_event) != cudaSuccess) (void)cudaGetLastError();
    }

    cudaEvent_t event() const { return m_event; }
    Status error() {
        std::lock_guard<std::mutex> lock(m_mutex);
        return m_error;
    }
    void setError(Status s) {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_error = std::move(s);
    }

private:
    int m_ordinal;
    cudaEvent_t m_event = nullptr;
    std::mutex m_mutex;
    Status m_error;  // of the stream that recorded it last (or the creation failure)
};

// ----- streams ------------------------------------------------------------------------------

class CudaDevice;

class CudaStream final : public Stream, public CapturableStream {
public:
    CudaStream(CudaDevice& dev, std::shared_ptr<MemState> mem, trace::TrackKind kind, std::string name);
    ~CudaStream() override;

    // Stream graphs (graph.h): cudaStreamBeginCapture in relaxed mode (the caching allocator may
    // cudaMalloc and zero-fill on its own stream meanwhile), cudaStreamEndCapture,
    // cudaGraphInstantiate.
    Status beginCapture() override;
    Result<std::unique_ptr<StreamGraph>> endCapture() override;
    bool capturing() const override { return m_capturing.load(std::memory_order_acquire); }
    const std::shared_ptr<MemState>& mem() const { return m_mem; }

    void submit(const OpDesc& desc, std::function<Status()> fn) override;
    void record(Event& e) override;
    // The allocator reuses a freed block only after the work every stream had pending then.
    void keepUntilPassed(std::shared_ptr<const void>) override {}
    void wait(Event& e) override;
    Status synchronize() override;
    void* native() override { return m_stream; }
    trace::TrackKind kind() const override { return m_kind; }
    const std::string& name() const override { return m_name; }

private:
    void fail(Status s);
    // While capturing, an error fails the capture (endCapture returns it), not the stream.
    void failOrCaptureFail(Status s) {
        if (!capturing()) {
            fail(std::move(s));
            return;
        }
        std::lock_guard<std::mutex> lock(m_mutex);
        if (m_captureError.isOk()) m_captureError = std::move(s);
    }
    Status error() {
        std::lock_guard<std::mutex> lock(m_mutex);
        return m_error;
    }

    CudaDevice& m_device;
    std::shared_ptr<MemState> m_mem;
    int m_ordinal;
    trace::TrackKind m_kind;
    std::string m_name;
    cudaStream_t m_stream = nullptr;
    uint64_t m_serial = 0;  // its cudaStreamLabels() entry
    std::mutex m_mutex;
    Status m_error;  // sticky
    std::atomic<bool> m_failed{false};
    std::atomic<bool> m_capturing{false};
    Status m_captureError;  // guarded by m_mutex
    std::shared_ptr<host::GraphPool> m_capturePool;
};

// ----- device -------------------------------------------------------------------------------

class CudaDevice final : public Device {
public:
    // sharers > 0 (makeSharedCudaBackend): this rank's device is one of `sharers` on its GPU;
    // buffers are CUDA managed memory (host-reachable), and allocations past the rank's share
    // of the GPU's memory fail at once (managed memory would otherwise oversubscribe the GPU and
    // page instead of failing).
    CudaDevice(DeviceInfo info, cudaStream_t allocStream, int sharers)
        : m_info(std::move(info)), m_allocStream(allocStream), m_managed(sharers > 0) {
        m_mem = std::make_shared<MemState>();
        m_mem->ordinal = m_info.index;
        m_mem->deviceName = m_info.name;
        if (m_managed) {
            m_mem->deviceName += " (one of " + std::to_string(sharers) + " ranks sharing GPU " +
                                 std::to_string(m_info.index) + ", cuda_share_gpus)";
            m_mem->setLimit(m_info.memoryTotal);
        }
        m_mem->trace = m_trace.atomic();
        // The zero-fill memsets of allocate() run here: named, so a capture puts them on this
        // rank's tracks rather than on the GPU's (several ranks may share it).
        if (m_allocStream)
            m_allocLabel = addStreamLabel({0, m_allocStream, m_info.index, trace::TrackKind::Copy, "alloc", -1}, this);
    }
    ~CudaDevice() override {
        {
            std::lock_guard<std::mutex> lock(m_mem->mutex);
            m_mem->trace = nullptr;  // buffers that outlive the device must not report into it
            m_mem->deviceAlive = false;
        }
        if (m_allocLabel) dropStreamLabel(m_allocLabel);
        DeviceGuard g(m_info.index);
        if (m_allocStream) (void)cudaStreamDestroy(m_allocStream);
    }

    const DeviceInfo& info() const override { return m_info; }
    int ordinal() const { return m_info.index; }
    bool shared() const { return m_managed; }

    Result<std::unique_ptr<Buffer>> allocate(size_t bytes, MemCategory cat) override {
        return allocateImpl(bytes, cat, true);
    }
    Result<std::unique_ptr<Buffer>> allocateUninitialized(size_t bytes, MemCategory cat) override {
        return allocateImpl(bytes, cat, false);
    }

    Result<std::unique_ptr<Buffer>> allocateImpl(size_t bytes, MemCategory cat, bool zero) {
        if (cat == MemCategory::Count) return Status::invalid("allocate: MemCategory::Count is not a category");
        const size_t cls = sizeClass(bytes);
        DeviceGuard guard(m_info.index);
        if (!guard.ok()) return Status::internal("cannot make " + m_info.name + " the current CUDA device");
        int64_t current = 0;
        void* p = nullptr;
        uint64_t serial = 0;
        cudaStream_t capture = nullptr;  // the stream being captured into a graph, if any
        {
            std::lock_guard<std::mutex> lock(m_mem->mutex);
            // Only the capturing thread's allocations are the graph's (other threads' work is not
            // being captured).
            if (m_mem->capturingThreadLocked()) capture = m_mem->captureStream;
            bool pooled = false;
            uintptr_t pooledPtr = 0;
            TS_RETURN_IF_ERROR(m_mem->reserveNewLocked(bytes, cls, cat, &current, &serial, &pooled, &pooledPtr));
            p = pooled ? reinterpret_cast<void*>(pooledPtr) : m_mem->takeCached(cls);  // same lock as the accounting
            if (p && !pooled && capture) m_mem->graphs.adoptNew(cls);  // now part of the capture's pool
        }
        auto undo = [&](Status why) -> Status {
            std::lock_guard<std::mutex> lock(m_mem->mutex);
            m_mem->releaseLocked(bytes, cat);
            return why;
        };
        if (!p) {
            auto malloc = [&] { return m_managed ? cudaMallocManaged(&p, cls) : cudaMalloc(&p, cls); };
            cudaError_t err = malloc();
            // The caches hold the memory: give it back, retry. Not while capturing: cudaFree
            // synchronizes the device, which would invalidate the capture (the error then named
            // would be a later op's, not this out-of-memory).
            if (err == cudaErrorMemoryAllocation && !capture) {
                (void)cudaGetLastError();
                {
                    std::lock_guard<std::mutex> lock(m_mem->mutex);
                    m_mem->releaseCache();
                }
                // ... and the stream-ordered pool what its ops have freed (makeCudaDevices)
                if (cudaMemPool_t pool = nullptr; cudaDeviceGetDefaultMemPool(&pool, m_info.index) == cudaSuccess)
                    (void)cudaMemPoolTrimTo(pool, 0);
                (void)cudaGetLastError();
                err = malloc();
            }
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
                size_t freeB = 0, totalB = 0;
                if (cudaMemGetInfo(&freeB, &totalB) != cudaSuccess) (void)cudaGetLastError();
                if (err == cudaErrorMemoryAllocation)
                    return undo(Status(ErrorCode::OutOfMemory,
                                       "out of memory on " + m_mem->deviceName + ": " +
                                           (m_managed ? "cudaMallocManaged" : "cudaMalloc") + " of " +
                                           formatBytes(int64_t(cls)) + " for " + trace::memCategoryName(cat) +
                                           " failed with " + formatBytes(int64_t(freeB)) + " of " +
                                           formatBytes(int64_t(totalB)) + " free on the GPU (this rank's device holds " +
                                           formatBytes(memoryStats().currentTotal) +
                                           "). Reduce micro_batch_size, enable recompute or use more model "
                                           "parallelism"));
                return undo(fromCuda(err, std::string(m_managed ? "cudaMallocManaged" : "cudaMalloc") + " of " +
                                              formatBytes(int64_t(cls)) + " on " + m_info.name));
            }
            if (capture) {
                std::lock_guard<std::mutex> lock(m_mem->mutex);
                m_mem->graphs.adoptNew(cls);
            }
        }
        if (zero && capture) {
            // Captured: a memset node of the graph zeroes it whenever the graph runs, in stream order.
            const cudaError_t err = cudaMemsetAsync(p, 0, cls, capture);
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
                {
                    std::lock_guard<std::mutex> lock(m_mem->mutex);
                    m_mem->graphs.keep(host::PoolBlock{reinterpret_cast<uintptr_t>(p), serial, cls, 0, cat}, true);
                }
                return undo(fromCuda(err, "zero-filling a buffer allocated during a graph capture on " + m_info.name));
            }
        } else if (zero) {
            cudaError_t err = cudaMemsetAsync(p, 0, cls, m_allocStream);
            if (err == cudaSuccess) err = cudaStreamSynchronize(m_allocStream);
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
                {
                    std::lock_guard<std::mutex> lock(m_mem->mutex);
                    m_mem->giveBack(p, cls);
                }
                return undo(fromCuda(err, "zero-filling a new buffer on " + m_info.name));
            }
        }
        m_mem->reportCounter(cat, current);
        return std::unique_ptr<Buffer>(std::make_unique<CudaBuffer>(*this, m_mem, p, bytes, cat, serial, capture != nullptr));
    }

    std::unique_ptr<Stream> createStream(trace::TrackKind kind, const std::string& name) override {
        return std::make_unique<CudaStream>(*this, m_mem, kind, name);
    }

    std::unique_ptr<Event> createEvent() override {
        return std::make_unique<CudaEvent>(m_info.index, traceState() != nullptr);
    }

    MemoryStats memoryStats() const override { return m_mem->snapshot(); }
    void resetPeak() override { m_mem->resetPeak(); }
    void setMemoryLimit(int64_t bytes) override { m_mem->setLimit(bytes); }

    bool supports(const std::string& op) const override { return isCudaOp(op); }

    void setTrace(trace::Recorder* rec, int rank) override {
        m_trace.set(rec, rank, m_info.index);
        setStreamLabelsRank(this, rec ? rank : -1);
    }

    TraceTarget traceTarget() const override {
        TraceTarget t = m_trace.target();
        t.nvtx = true;
        return t;
    }

    const host::TraceState* traceState() const { return m_trace.state(); }

private:
    DeviceInfo m_info;
    cudaStream_t m_allocStream;  // zero-fill of new buffers
    uint64_t m_allocLabel = 0;   // its cudaStreamLabels() entry
    bool m_managed = false;
    std::shared_ptr<MemState> m_mem;
    host::TracePublisher m_trace;  // keeps every state it published: readers may hold old ones
};

CudaBuffer::~CudaBuffer() {
    kernels::fp8codes::map().forget(m_data, m_bytes);  // what was quantized into it
    DeviceGuard g(m_mem->ordinal);
    std::lock_guard<std::mutex> lock(m_mem->mutex);
    // A graph that may use the block keeps it, still counted (graph.h).
    if (m_mem->deviceAlive &&
        m_mem->graphs.keep(host::PoolBlock{reinterpret_cast<uintptr_t>(m_data), m_serial, sizeClass(m_bytes), m_bytes, m_cat},
                           m_fromPool))
        return;
    m_mem->reportCounter(m_cat, m_mem->releaseLocked(m_bytes, m_cat));
    if (m_mem->deviceAlive) {
        m_mem->giveBack(m_data, sizeClass(m_bytes));
    } else {
        // The device (and its stream list) is gone: wait for all work on it, then free.
        (void)cudaDeviceSynchronize();
        (void)cudaFree(m_data);
        (void)cudaGetLastError();
    }
}

// ----- stream implementation ------------------------------------------------------------------

CudaStream::CudaStream(CudaDevice& dev, std::shared_ptr<MemState> mem, trace::TrackKind kind, std::string name)
    : m_device(dev), m_mem(std::move(mem)), m_ordinal(dev.ordinal()), m_kind(kind), m_name(std::move(name)) {
    DeviceGuard g(m_ordinal);
    const cudaError_t err = cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        m_stream = nullptr;
        fail(fromCuda(err, "creating stream '" + m_name + "' on " + dev.info().name));
        return;
    }
    {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        m_mem->liveStreams.push_back(m_stream);
    }
    const TraceTarget t = dev.traceTarget();
    m_serial = addStreamLabel({0, m_stream, m_ordinal, m_kind, m_name, t.recorder ? t.rank : -1}, &dev);
}

CudaStream::~CudaStream() {
    if (!m_stream) return;
    dropStreamLabel(m_serial);
    DeviceGuard g(m_ordinal);
    (void)cudaStreamSynchronize(m_stream);
    {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        auto& live = m_mem->liveStreams;
        live.erase(std::remove(live.begin(), live.end(), m_stream), live.end());
    }
    (void)cudaStreamDestroy(m_stream);
    (void)cudaGetLastError();
}

void CudaStream::fail(Status s) {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_error.isOk()) {
        m_error = std::move(s);
        m_failed.store(true, std::memory_order_release);
    }
}

void CudaStream::submit(const OpDesc& desc, std::function<Status()> fn) {
    if (m_failed.load(std::memory_order_acquire)) return;  // skipped after a failure
    const char* opName = desc.name ? desc.name : "";
    const host::TraceState* ts = m_device.traceState();
    const int64_t start = ts ? monotonicNs() : 0;
    Status s;
    {
        DeviceGuard g(m_ordinal);
        CurrentStreamScope scope(this);
        (void)takeKernelError();     // an error left by code outside any op is not this op's
        (void)cudaGetLastError();    // same for a launch error of the thread's earlier calls
        if (!g.ok()) {
            // fn would launch on whatever device the thread has current: do not run it.
            s = Status::internal("cannot make CUDA device " + std::to_string(m_ordinal) + " current");
        } else {
            try {
                s = fn();
            } catch (const std::exception& ex) {
                s = Status::internal(std::string("exception: ") + ex.what());
            } catch (...) {
                s = Status::internal("unknown exception");
            }
        }
        Status kernel = takeKernelError();
        if (s.isOk() && !kernel.isOk()) s = std::move(kernel);
        const cudaError_t launch = cudaGetLastError();
        if (s.isOk() && launch != cudaSuccess) s = fromCuda(launch, "kernel launch");
    }
    if (ts) {
        trace::Recorder* rec = ts->target.recorder;
        trace::Slice launch;
        launch.track = hostTrack(ts->target);
        launch.name = rec->intern(opName);
        launch.category = trace::Category::Launch;
        launch.step = desc.step;
        launch.microbatch = desc.microbatch;
        launch.chunk = desc.chunk;
        launch.layer = desc.layer;
        launch.correlation = rec->nextCorrelation();
        launch.group = desc.group ? rec->intern(desc.group) : 0;
        launch.depth = hostRangeDepth(ts->target);
        launch.startNs = start;
        launch.durNs = monotonicNs() - start;
        rec->slice(launch);
    }
    if (!s.isOk()) failOrCaptureFail(s.withContext("op '" + std::string(opName) + "' on stream '" + m_name + "'"));
}

void CudaStream::record(Event& e) {
    if (capturing()) {
        failOrCaptureFail(Status::unsupported("stream '" + m_name +
                                              "': record() of an event while the stream is captured into a graph: the "
                                              "graph would order work across streams, which stream graphs do not do yet"));
        return;
    }
    auto* ce = dynamic_cast<CudaEvent*>(&e);
    if (!ce) {
        fail(Status::invalid("stream '" + m_name + "': record() of an event from another backend"));
        return;
    }
    ce->setError(error());
    if (!m_stream || !ce->event()) return;
    DeviceGuard g(m_ordinal);
    const cudaError_t err = cudaEventRecord(ce->event(), m_stream);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        Status s = fromCuda(err, "stream '" + m_name + "': cudaEventRecord");
        ce->setError(s);
        fail(s);
    }
}

void CudaStream::wait(Event& e) {
    if (capturing()) {
        failOrCaptureFail(Status::unsupported("stream '" + m_name +
                                              "': wait() on an event while the stream is captured into a graph: the "
                                              "graph would order work across streams, which stream graphs do not do yet"));
        return;
    }
    auto* ce = dynamic_cast<CudaEvent*>(&e);
    if (!ce) {
        fail(Status::invalid("stream '" + m_name + "': wait() on an event from another backend"));
        return;
    }
    const Status theirs = ce->error();
    if (!theirs.isOk() && !m_failed.load(std::memory_order_acquire))
        fail(theirs.withContext("stream '" + m_name + "' waited on an event from a failed stream"));
    if (!m_stream || !ce->event()) return;
    DeviceGuard g(m_ordinal);
    const cudaError_t err = cudaStreamWaitEvent(m_stream, ce->event(), 0);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        fail(fromCuda(err, "stream '" + m_name + "': cudaStreamWaitEvent"));
    }
}

Status CudaStream::synchronize() {
    if (capturing()) {  // cudaStreamSynchronize would invalidate the capture
        Status s = Status::unsupported("stream '" + m_name +
                                       "': the host waited for the stream while it was captured into a graph: a graph "
                                       "cannot contain a host wait; everything a captured op reads back must be read "
                                       "after the graph has run");
        failOrCaptureFail(s);
        return s;
    }
    if (m_stream) {
        DeviceGuard g(m_ordinal);
        const cudaError_t err = cudaStreamSynchronize(m_stream);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            fail(fromCuda(err, "stream '" + m_name + "' on " + m_device.info().name +
                                   ": a kernel failed while executing" +
                                   (m_device.shared() ? std::string(" (GPU ") + std::to_string(m_ordinal) +
                                                            " is shared by several ranks, cuda_share_gpus: the failed "
                                                            "kernel may be another rank's)"
                                                      : std::string())));
        }
    }
    return error();
}

// ----- stream graphs ------------------------------------------------------------------------

class CudaGraph final : public StreamGraph {
public:
    CudaGraph(std::shared_ptr<MemState> mem, cudaGraph_t graph, cudaGraphExec_t exec,
              std::shared_ptr<host::GraphPool> pool, int64_t nodes)
        : m_mem(std::move(mem)), m_graph(graph), m_exec(exec), m_pool(std::move(pool)), m_nodes(nodes) {}
    ~CudaGraph() override {
        DeviceGuard g(m_mem->ordinal);
        if (m_exec) (void)cudaGraphExecDestroy(m_exec);
        if (m_graph) (void)cudaGraphDestroy(m_graph);
        (void)cudaGetLastError();
        releasePool(m_mem, m_pool);
    }

    Status launch(Stream& s, int step) override {
        auto* cs = dynamic_cast<CudaStream*>(&s);
        if (!cs || cs->mem() != m_mem)
            return Status::invalid("a graph launches on a stream of the CUDA device it was captured on; stream '" +
                                   s.name() + "' is not one");
        if (cs->capturing())
            return Status::unsupported("stream '" + s.name() + "' is being captured: a graph launch inside a capture "
                                       "is not supported");
        OpDesc d;
        d.name = "cuda_graph.launch";
        d.category = trace::Category::Other;
        d.step = step;
        const cudaGraphExec_t exec = m_exec;
        s.submit(d, [exec, &s] {
            return fromCuda(cudaGraphLaunch(exec, static_cast<cudaStream_t>(s.native())), "cudaGraphLaunch");
        });
        return Status::ok();
    }
    int64_t nodes() const override { return m_nodes; }
    int64_t poolBytes() const override {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        return m_pool->blockBytes;
    }

    // The pool's free blocks go back to the cache, after the work every
    // stream has queued (this graph's launches).
    static void releasePool(const std::shared_ptr<MemState>& mem, const std::shared_ptr<host::GraphPool>& pool) {
        if (!pool) return;
        DeviceGuard g(mem->ordinal);
        std::lock_guard<std::mutex> lock(mem->mutex);
        for (const host::PoolBlock& b : mem->graphs.release(pool)) {
            mem->reportCounter(b.cat, mem->releaseLocked(b.bytes, b.cat));
            if (mem->deviceAlive) {
                mem->giveBack(reinterpret_cast<void*>(b.addr), b.cls);
            } else {
                (void)cudaDeviceSynchronize();
                (void)cudaFree(reinterpret_cast<void*>(b.addr));
                (void)cudaGetLastError();
            }
        }
    }

private:
    std::shared_ptr<MemState> m_mem;
    cudaGraph_t m_graph = nullptr;
    cudaGraphExec_t m_exec = nullptr;
    std::shared_ptr<host::GraphPool> m_pool;
    int64_t m_nodes = 0;
};

Status CudaStream::beginCapture() {
    if (!m_stream || m_failed.load(std::memory_order_acquire))
        return Status::invalid("stream '" + m_name + "' has failed: it cannot be captured");
    DeviceGuard g(m_ordinal);
    std::lock_guard<std::mutex> lock(m_mem->mutex);
    if (m_mem->captureStream)
        return Status::invalid("stream '" + m_name +
                               "': its device is already capturing another stream into a graph (one capture per "
                               "device at a time)");
    if (m_mem->graphs.anyLive())
        return Status::invalid("stream '" + m_name +
                               "': another graph of this device is alive; destroy it before capturing a new one (one "
                               "graph per device: their pools do not share blocks yet)");
    const cudaError_t err = cudaStreamBeginCapture(m_stream, cudaStreamCaptureModeRelaxed);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return fromCuda(err, "stream '" + m_name + "': cudaStreamBeginCapture");
    }
    m_mem->captureStream = m_stream;
    m_mem->captureThread = std::this_thread::get_id();
    m_capturePool = m_mem->graphs.begin();
    {
        std::lock_guard<std::mutex> l(m_mutex);
        m_captureError = Status::ok();
    }
    m_capturing.store(true, std::memory_order_release);
    return Status::ok();
}

Result<std::unique_ptr<StreamGraph>> CudaStream::endCapture() {
    if (!capturing()) return Status::invalid("stream '" + m_name + "' is not being captured");
    DeviceGuard g(m_ordinal);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(m_stream, &graph);
    if (ended != cudaSuccess) (void)cudaGetLastError();
    std::shared_ptr<host::GraphPool> pool;
    {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        m_mem->graphs.end(m_mem->nextSerial);
        m_mem->captureStream = nullptr;
        m_mem->captureThread = std::thread::id();
        pool = std::move(m_capturePool);
    }
    m_capturing.store(false, std::memory_order_release);
    Status error;
    {
        std::lock_guard<std::mutex> l(m_mutex);
        error = std::move(m_captureError);
        m_captureError = Status::ok();
    }
    if (error.isOk() && ended != cudaSuccess) error = fromCuda(ended, "stream '" + m_name + "': cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    size_t nodes = 0;
    if (error.isOk()) {
        cudaError_t err = cudaGraphGetNodes(graph, nullptr, &nodes);
        if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            error = fromCuda(err, "stream '" + m_name + "': cudaGraphInstantiate");
        }
    }
    if (!error.isOk()) {
        if (exec) (void)cudaGraphExecDestroy(exec);
        if (graph) (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError();
        CudaGraph::releasePool(m_mem, pool);
        return error;
    }
    return std::unique_ptr<StreamGraph>(std::make_unique<CudaGraph>(m_mem, graph, exec, std::move(pool), int64_t(nodes)));
}

// ----- backend ------------------------------------------------------------------------------

class CudaBackend final : public Backend {
public:
    BackendKind kind() const override { return BackendKind::Cuda; }
    int deviceCount() const override { return int(m_devices.size()); }
    Device& device(int index) override { return *m_devices.at(size_t(index)); }
    std::vector<std::unique_ptr<CudaDevice>> m_devices;
};

std::string versionText(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// Why there is no usable device, and what to do (the text of makeCudaBackend's Unsupported).
std::string noDeviceReason(cudaError_t err, int count) {
    const std::string prefix = "no CUDA device is usable: ";
    const std::string cpu = "; or use device_backend: cpu";
    const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string visible = vis ? vis : "";
    const bool visibleSet = vis != nullptr;
    if (visibleSet && visible.find_first_not_of(" \t") == std::string::npos)
        return prefix +
               "CUDA_VISIBLE_DEVICES is set but empty, which hides every GPU from this process; unset it or list "
               "the GPUs to use (e.g. CUDA_VISIBLE_DEVICES=0,1)" + cpu;
    if (err == cudaErrorInsufficientDriver) {
        int driver = 0, runtime = 0;
        (void)cudaDriverGetVersion(&driver);
        (void)cudaRuntimeGetVersion(&runtime);
        (void)cudaGetLastError();
        if (driver == 0)
            return prefix +
                   "no NVIDIA driver is installed (libcuda.so.1 was not found): this machine has no GPU, or the "
                   "container was started without the driver (e.g. docker --gpus all); install the NVIDIA driver "
                   "so that nvidia-smi lists the GPUs" + cpu;
        return prefix + "the NVIDIA driver supports CUDA " + versionText(driver) + " but this build uses the CUDA " +
               versionText(runtime) + " runtime; upgrade the driver or build with an older CUDA toolkit" + cpu;
    }
    if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) {
        if (visibleSet)
            return prefix + "the driver finds no GPU among CUDA_VISIBLE_DEVICES=" + visible +
                   "; check those indices or UUIDs against nvidia-smi -L, or unset it" + cpu;
        return prefix +
               "the NVIDIA driver is loaded but reports no CUDA device; check nvidia-smi (in a container: started "
               "with GPUs, e.g. docker --gpus all)" + cpu;
    }
    return prefix + "CUDA initialization failed with " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
           "); check nvidia-smi and dmesg" + cpu;
}

}  // namespace

std::vector<CudaStreamLabel> cudaStreamLabels() {
    std::lock_guard<std::mutex> lock(g_labelsMutex);
    std::vector<CudaStreamLabel> out;
    for (const auto& [serial, entry] : g_labels) out.push_back(entry.first);
    return out;
}

int cudaDeviceOrdinal(const Device& d) {
    const auto* cd = dynamic_cast<const CudaDevice*>(&d);
    return cd ? cd->ordinal() : -1;
}

Status cudaEventStatus(Event& e) {
    auto* ce = dynamic_cast<CudaEvent*>(&e);
    return ce ? ce->error() : Status::ok();
}

Result<GpuTopology> probeGpuTopology() {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) (void)cudaGetLastError();
    if (err != cudaSuccess || count <= 0) return Status::unsupported(noDeviceReason(err, count));
    GpuTopology t;
    t.links.assign(size_t(count), std::vector<GpuPeerLink>(size_t(count)));
    for (int i = 0; i < count; ++i) {
        char bus[32] = {};
        if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) != cudaSuccess) {
            (void)cudaGetLastError();
            bus[0] = '\0';
        }
        std::string id(bus);
        for (char& ch : id) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        t.pciBusIds.push_back(id.empty() ? std::string("?") : id);
        int numa = -1;
        if (!id.empty()) {
            std::ifstream f("/sys/bus/pci/devices/" + id + "/numa_node");
            if (!(f >> numa)) numa = -1;
        }
        t.numaNodes.push_back(numa);
        for (int j = 0; j < count; ++j) {
            if (i == j) continue;
            GpuPeerLink& l = t.links[size_t(i)][size_t(j)];
            int v = 0;
            if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrAccessSupported, i, j) == cudaSuccess) l.p2p = v != 0;
            if (l.p2p && cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, i, j) == cudaSuccess)
                l.nativeAtomics = v != 0;
            if (l.p2p && cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, i, j) == cudaSuccess)
                l.performanceRank = v;
            (void)cudaGetLastError();
        }
    }
    return t;
}

namespace {

// The devices of makeCudaBackend (shared = 0: one per GPU) and makeSharedCudaBackend (`shared`
// devices, device i on GPU i % count, managed memory).
Result<std::unique_ptr<Backend>> makeCudaDevices(int shared) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) (void)cudaGetLastError();
    if (err != cudaSuccess || count <= 0) return Status::unsupported(noDeviceReason(err, count));

    std::optional<PeakFlopsTable> peaks;
    if (const std::string path = defaultPeakFlopsTablePath(); !path.empty())
        if (auto t = loadPeakFlopsTable(path)) peaks = std::move(*t);

    auto backend = std::make_unique<CudaBackend>();
    const int devices = shared > 0 ? shared : count;
    for (int d = 0; d < devices; ++d) {
        const int i = d % count;
        // Devices on GPU i: its memory is divided among them.
        const int sharers = shared > 0 ? (devices - 1 - i) / count + 1 : 1;
        DeviceGuard g(i);
        if (!g.ok()) {
            (void)cudaGetLastError();
            return Status::unsupported("cannot use CUDA device " + std::to_string(i) +
                                       " (cudaSetDevice failed); check nvidia-smi, or set CUDA_VISIBLE_DEVICES to "
                                       "the devices to use");
        }
        cudaDeviceProp prop{};
        TS_RETURN_IF_ERROR(fromCuda(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties(" + std::to_string(i) + ")"));
        if (shared > 0 && !prop.concurrentManagedAccess)
            return Status::unsupported(
                std::string("ranks sharing GPU ") + std::to_string(i) + " (" + prop.name +
                ") reach each other's buffers through CUDA managed memory, and this GPU has no concurrent managed "
                "access (Windows/WSL, or a GPU older than Pascal); give each rank its own GPU (unset "
                "cuda_share_gpus) or use device_backend: cpu for the layout");
        DeviceInfo info;
        info.backend = BackendKind::Cuda;
        info.index = i;
        info.name = prop.name;
        info.smCount = prop.multiProcessorCount;
        info.computeCapabilityMajor = prop.major;
        info.computeCapabilityMinor = prop.minor;
        size_t freeB = 0, totalB = 0;
        // Creates the device's primary context (the first CUDA call that needs one).
        TS_RETURN_IF_ERROR(fromCuda(cudaMemGetInfo(&freeB, &totalB), "cudaMemGetInfo on " + info.name));
        // The ops' stream-ordered memory (GEMM operand copies, attention and FP8 workspaces:
        // cudaMallocAsync) comes from the device's default pool, whose default release threshold
        // (0) hands its memory back to the driver at every synchronization, to be mapped again by
        // the next op. Keep it instead; a cudaMalloc that runs short trims the pool (allocate).
        if (cudaMemPool_t pool = nullptr; cudaDeviceGetDefaultMemPool(&pool, i) == cudaSuccess) {
            uint64_t keep = UINT64_MAX;
            (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        }
        (void)cudaGetLastError();
        info.memoryTotal = int64_t(totalB) / sharers;
        info.memoryFree = int64_t(freeB) / sharers;
        if (peaks) {
            info.peakTflopsFp32 = peaks->lookup(info.name, "fp32").value_or(0.0);
            info.peakTflopsBf16 = peaks->lookup(info.name, "bf16").value_or(0.0);
        }
        cudaStream_t allocStream = nullptr;
        TS_RETURN_IF_ERROR(fromCuda(cudaStreamCreateWithFlags(&allocStream, cudaStreamNonBlocking),
                                    "creating the allocation stream on " + info.name));
        backend->m_devices.push_back(std::make_unique<CudaDevice>(std::move(info), allocStream, shared > 0 ? sharers : 0));
    }
    return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace

Result<std::unique_ptr<Backend>> makeCudaBackend() { return makeCudaDevices(0); }

Result<std::unique_ptr<Backend>> makeSharedCudaBackend(int devices) {
    if (devices < 1)
        return Status::invalid("makeSharedCudaBackend: " + std::to_string(devices) + " devices; give at least 1");
    return makeCudaDevices(devices);
}

}  // namespace ts::engine
