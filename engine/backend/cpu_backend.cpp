// CPU backend implementation (see cpu_backend.h): virtual devices, worker-thread streams,
// events, and the tracked allocator.
#include "engine/backend/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "engine/backend/backend_trace.h"

namespace ts::engine {

namespace {

std::string formatBytes(int64_t b) {
    char buf[64];
    const double v = double(b);
    if (b >= (int64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", v / double(1 << 30));
    else if (b >= (int64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", v / double(1 << 20));
    else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.2f KiB", v / 1024.0);
    else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
    return buf;
}

// ----- events -------------------------------------------------------------------------------

// Invariant: completed <= recorded. record() bumps `recorded` at submit time; the recording
// stream's worker raises `completed` to that value when it reaches the record point.
struct EventState {
    std::mutex mutex;
    std::condition_variable cv;
    uint64_t recorded = 0;
    uint64_t completed = 0;
    Status error;  // of the stream that completed the latest record
};

class CpuEvent final : public Event {
public:
    std::shared_ptr<EventState> state = std::make_shared<EventState>();

    bool query() override {
        std::lock_guard<std::mutex> lock(state->mutex);
        return state->completed >= state->recorded;
    }
    void synchronize() override {
        std::unique_lock<std::mutex> lock(state->mutex);
        const uint64_t target = state->recorded;
        state->cv.wait(lock, [&] { return state->completed >= target; });
    }
};

// ----- trace state ----------------------------------------------------------------------------

// Immutable once published; a device keeps every one it ever published so readers holding an
// old pointer stay valid.
struct TraceState {
    TraceTarget target;
};

// ----- memory -------------------------------------------------------------------------------

// Size class of a request: blocks are cached and reused per class. Up to 4 KiB classes are
// 64-byte steps; above, 8 classes per power of two (at most 12.5% slack), so the per-step
// allocations of a training loop (the same shapes every microbatch) hit exact classes.
size_t sizeClass(size_t bytes) {
    const size_t b = bytes == 0 ? 1 : bytes;
    if (b <= 4096) return (b + 63) / 64 * 64;
    int msb = 63;
    while (!(b >> msb)) --msb;
    const size_t step = size_t(1) << (msb - 3);
    return (b + step - 1) / step * step;
}

// Host blocks. Blocks of 2 MiB and more are mapped on their own, 2 MiB aligned, with
// MADV_HUGEPAGE: the GEMM operands of a training step (weights, activations, grads) span tens
// of MiB, and backing them with 2 MiB pages instead of 4 KiB ones removes most of the TLB
// misses of the GEMMs' packing passes (measured 2-4% faster large sgemm on this VM, where
// transparent huge pages are "madvise" only). Smaller blocks come from malloc. The size class
// alone says which kind a block is, so freeing needs no bookkeeping.
constexpr size_t kHugePage = size_t(2) << 20;

bool isMappedClass(size_t cls) { return cls >= kHugePage; }
size_t mappedLength(size_t cls) { return (cls + kHugePage - 1) / kHugePage * kHugePage; }

void* hostAlloc(size_t cls) {
    if (!isMappedClass(cls)) return std::aligned_alloc(64, cls);
    const size_t len = mappedLength(cls);
    // over-map by one huge page, then unmap the misaligned head and the tail
    void* raw = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const auto base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (base + kHugePage - 1) & ~(uintptr_t(kHugePage) - 1);
    if (aligned > base) munmap(raw, aligned - base);
    const uintptr_t end = base + len + kHugePage;
    if (end > aligned + len) munmap(reinterpret_cast<void*>(aligned + len), end - (aligned + len));
    void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);  // advice only: without THP the block still works
#endif
    return p;
}

void hostFree(void* p, size_t cls) {
    if (!p) return;
    if (isMappedClass(cls))
        munmap(p, mappedLength(cls));
    else
        std::free(p);
}

// Shared by the device and its buffers (buffers free into it).
// Caching allocator: a freed block goes to a free list of its size class (up to kCacheCap
// bytes per device) and the next request of that class takes it, so the steady state of a
// training loop does no malloc/free and no page faults. Accounting (stats) is exact live
// bytes as requested; cached free blocks are counted only in `cachedBytes`.
struct MemState {
    static constexpr size_t kCacheCap = size_t(4) << 30;

    std::mutex mutex;
    MemoryStats stats;
    int64_t limit = 0;
    std::string deviceName;
    std::atomic<const TraceState*>* trace = nullptr;  // owned by the device
    std::unordered_map<size_t, std::vector<void*>> freeBlocks;  // size class -> blocks
    size_t cachedBytes = 0;

    ~MemState() { releaseCache(); }

    // Caller holds `mutex`. A cached block of class `cls`, or null.
    void* takeCached(size_t cls) {
        auto it = freeBlocks.find(cls);
        if (it == freeBlocks.end() || it->second.empty()) return nullptr;
        void* p = it->second.back();
        it->second.pop_back();
        cachedBytes -= cls;
        return p;
    }
    // Caller holds `mutex`. Keeps the block for reuse, or frees it past the cap.
    void giveBack(void* p, size_t cls) {
        if (cachedBytes + cls > kCacheCap) {
            hostFree(p, cls);
            return;
        }
        freeBlocks[cls].push_back(p);
        cachedBytes += cls;
    }
    // Caller holds `mutex` (or is the destructor).
    void releaseCache() {
        for (auto& [cls, blocks] : freeBlocks)
            for (void* p : blocks) hostFree(p, cls);
        freeBlocks.clear();
        cachedBytes = 0;
    }

    void reportCounter(MemCategory cat, int64_t value) {
        const TraceState* ts = trace ? trace->load(std::memory_order_acquire) : nullptr;
        if (!ts) return;
        trace::Counter c;
        c.rank = ts->target.rank;
        c.name = ts->target.recorder->intern(std::string("memory.") + trace::memCategoryName(cat));
        c.tsNs = monotonicNs();
        c.value = double(value);
        ts->target.recorder->counter(c);
    }
};

class CpuDevice;

class CpuBuffer final : public Buffer {
public:
    CpuBuffer(CpuDevice& dev, std::shared_ptr<MemState> mem, void* p, size_t bytes, MemCategory cat)
        : m_device(dev), m_mem(std::move(mem)), m_data(p), m_bytes(bytes), m_cat(cat) {}
    ~CpuBuffer() override;
    void* data() override { return m_data; }
    const void* data() const override { return m_data; }
    size_t bytes() const override { return m_bytes; }
    MemCategory category() const override { return m_cat; }
    Device& device() override;

private:
    CpuDevice& m_device;
    std::shared_ptr<MemState> m_mem;
    void* m_data;
    size_t m_bytes;
    MemCategory m_cat;
};

// ----- streams ------------------------------------------------------------------------------

struct WorkItem {
    enum Kind : uint8_t { Work, Record, Wait } kind = Work;
    std::function<Status()> fn;
    std::string name;  // for error messages
    std::shared_ptr<EventState> event;
    uint64_t eventSeq = 0;
    // Trace (valid when traced): ids resolved at submit on the submitting thread.
    bool traced = false;
    const TraceState* trace = nullptr;
    uint32_t track = 0, nameId = 0, groupId = 0;
    trace::Category category = trace::Category::Other;
    double flops = 0;
    uint64_t bytes = 0;
    int32_t step = -1, microbatch = -1, chunk = -1, layer = -1;
    uint64_t correlation = 0;
};

class CpuStream final : public Stream {
public:
    CpuStream(CpuDevice& dev, trace::TrackKind kind, std::string name, int streamIndex);
    ~CpuStream() override;

    void submit(const OpDesc& desc, std::function<Status()> fn) override;
    void record(Event& e) override;
    void wait(Event& e) override;
    Status synchronize() override;
    void* native() override { return nullptr; }
    trace::TrackKind kind() const override { return m_kind; }
    const std::string& name() const override { return m_name; }

private:
    void enqueue(WorkItem&& item);
    void run();
    void execute(WorkItem& item);
    void fail(Status s);
    uint32_t trackFor(const TraceState* ts);

    CpuDevice& m_device;
    trace::TrackKind m_kind;
    std::string m_name;
    int m_streamIndex;

    std::mutex m_mutex;
    std::condition_variable m_workCv;
    std::condition_variable m_doneCv;
    std::deque<WorkItem> m_queue;
    uint64_t m_submitted = 0;
    uint64_t m_done = 0;
    bool m_stop = false;
    Status m_error;                   // guarded by m_mutex; sticky
    std::atomic<bool> m_failed{false};  // mirror of !m_error.isOk() for the worker's fast path

    std::mutex m_trackMutex;
    std::atomic<uint64_t> m_trackGeneration{0};
    uint32_t m_track = 0;

    std::thread m_thread;  // last: started after every member above exists
};

// ----- device -------------------------------------------------------------------------------

class CpuDevice final : public Device {
public:
    CpuDevice(int index, int64_t memoryTotal) {
        m_info.backend = BackendKind::Cpu;
        m_info.index = index;
        m_info.name = "cpu:" + std::to_string(index) + " (virtual)";
        m_info.memoryTotal = memoryTotal;
        m_info.memoryFree = memoryTotal;
        m_mem = std::make_shared<MemState>();
        m_mem->deviceName = m_info.name;
        m_mem->trace = &m_trace;
    }
    ~CpuDevice() override {
        // Buffers that outlive the device must not report into a dead atomic.
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        m_mem->trace = nullptr;
    }

    const DeviceInfo& info() const override { return m_info; }

    Result<std::unique_ptr<Buffer>> allocate(size_t bytes, MemCategory cat) override {
        return allocateImpl(bytes, cat, true);
    }

    Result<std::unique_ptr<Buffer>> allocateUninitialized(size_t bytes, MemCategory cat) override {
        return allocateImpl(bytes, cat, false);
    }

    Result<std::unique_ptr<Buffer>> allocateImpl(size_t bytes, MemCategory cat, bool zero) {
        if (cat == MemCategory::Count) return Status::invalid("allocate: MemCategory::Count is not a category");
        // 64-byte alignment (at least) for vector kernels; a size class is a multiple of 64
        // as aligned_alloc needs.
        const size_t cls = sizeClass(bytes);
        int64_t current = 0;
        void* p = nullptr;
        {
            std::lock_guard<std::mutex> lock(m_mem->mutex);
            MemoryStats& st = m_mem->stats;
            if (m_mem->limit > 0 && st.currentTotal + int64_t(bytes) > m_mem->limit) {
                std::string inUse;
                for (size_t c = 0; c < size_t(MemCategory::Count); ++c) {
                    if (st.current[c] == 0) continue;
                    if (!inUse.empty()) inUse += ", ";
                    inUse += std::string(trace::memCategoryName(MemCategory(c))) + " " +
                             formatBytes(st.current[c]);
                }
                return Status(ErrorCode::OutOfMemory,
                              "out of memory on " + m_info.name + ": allocating " +
                                  formatBytes(int64_t(bytes)) + " (" + std::to_string(bytes) +
                                  " bytes) of " + trace::memCategoryName(cat) +
                                  " would exceed the memory limit of " + formatBytes(m_mem->limit) +
                                  "; in use " + formatBytes(st.currentTotal) +
                                  (inUse.empty() ? "" : " (" + inUse + ")") +
                                  ". Reduce micro_batch_size, enable recompute or use more "
                                  "model parallelism");
            }
            const size_t i = size_t(cat);
            st.current[i] += int64_t(bytes);
            st.currentTotal += int64_t(bytes);
            if (st.current[i] > st.peak[i]) st.peak[i] = st.current[i];
            if (st.currentTotal > st.peakTotal) st.peakTotal = st.currentTotal;
            current = st.current[i];
            p = m_mem->takeCached(cls);  // same lock as the accounting
        }
        if (!p) p = hostAlloc(cls);
        if (!p) {  // host memory is short: drop the cache and try once more
            {
                std::lock_guard<std::mutex> lock(m_mem->mutex);
                m_mem->releaseCache();
            }
            p = hostAlloc(cls);
        }
        if (!p) {
            std::lock_guard<std::mutex> lock(m_mem->mutex);
            m_mem->stats.current[size_t(cat)] -= int64_t(bytes);
            m_mem->stats.currentTotal -= int64_t(bytes);
            return Status(ErrorCode::OutOfMemory, "out of host memory on " + m_info.name +
                                                      ": allocating " + formatBytes(int64_t(bytes)) +
                                                      " of " + trace::memCategoryName(cat) + " failed");
        }
        if (zero) std::memset(p, 0, cls);
        m_mem->reportCounter(cat, current);
        return std::unique_ptr<Buffer>(std::make_unique<CpuBuffer>(*this, m_mem, p, bytes, cat));
    }

    std::unique_ptr<Stream> createStream(trace::TrackKind kind, const std::string& name) override {
        int index = 0;
        {
            std::lock_guard<std::mutex> lock(m_streamMutex);
            index = m_streamsPerKind[size_t(kind)]++;
        }
        return std::make_unique<CpuStream>(*this, kind, name, index);
    }

    std::unique_ptr<Event> createEvent() override { return std::make_unique<CpuEvent>(); }

    MemoryStats memoryStats() const override {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        MemoryStats st = m_mem->stats;
        st.cached = int64_t(m_mem->cachedBytes);
        return st;
    }

    void resetPeak() override {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        MemoryStats& st = m_mem->stats;
        for (size_t c = 0; c < size_t(MemCategory::Count); ++c) st.peak[c] = st.current[c];
        st.peakTotal = st.currentTotal;
    }

    void setMemoryLimit(int64_t bytes) override {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        m_mem->limit = bytes < 0 ? 0 : bytes;
    }

    bool supports(const std::string&) const override { return true; }  // the reference backend

    void setTrace(trace::Recorder* rec, int rank) override {
        std::lock_guard<std::mutex> lock(m_traceMutex);
        if (!rec) {
            m_trace.store(nullptr, std::memory_order_release);
            return;
        }
        auto st = std::make_unique<TraceState>();
        st->target.recorder = rec;
        st->target.rank = rank;
        st->target.device = m_info.index;
        st->target.generation = nextTraceGeneration();
        m_trace.store(st.get(), std::memory_order_release);
        m_traceStates.push_back(std::move(st));
    }

    TraceTarget traceTarget() const override {
        const TraceState* ts = m_trace.load(std::memory_order_acquire);
        return ts ? ts->target : TraceTarget{};
    }

    const TraceState* traceState() const { return m_trace.load(std::memory_order_acquire); }

private:
    DeviceInfo m_info;
    std::shared_ptr<MemState> m_mem;
    std::mutex m_streamMutex;
    int m_streamsPerKind[8] = {};
    std::mutex m_traceMutex;
    std::atomic<const TraceState*> m_trace{nullptr};
    std::vector<std::unique_ptr<TraceState>> m_traceStates;
};

CpuBuffer::~CpuBuffer() {
    int64_t current = 0;
    {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        m_mem->stats.current[size_t(m_cat)] -= int64_t(m_bytes);
        m_mem->stats.currentTotal -= int64_t(m_bytes);
        current = m_mem->stats.current[size_t(m_cat)];
        m_mem->reportCounter(m_cat, current);
        m_mem->giveBack(m_data, sizeClass(m_bytes));
    }
}

Device& CpuBuffer::device() { return m_device; }

// ----- stream implementation ------------------------------------------------------------------

CpuStream::CpuStream(CpuDevice& dev, trace::TrackKind kind, std::string name, int streamIndex)
    : m_device(dev), m_kind(kind), m_name(std::move(name)), m_streamIndex(streamIndex) {
    m_thread = std::thread([this] { run(); });
}

CpuStream::~CpuStream() {
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_stop = true;
    }
    m_workCv.notify_all();
    if (m_thread.joinable()) m_thread.join();
}

uint32_t CpuStream::trackFor(const TraceState* ts) {
    if (m_trackGeneration.load(std::memory_order_acquire) == ts->target.generation) return m_track;
    std::lock_guard<std::mutex> lock(m_trackMutex);
    if (m_trackGeneration.load(std::memory_order_relaxed) != ts->target.generation) {
        trace::TrackDesc desc;
        desc.rank = ts->target.rank;
        desc.device = ts->target.device;
        desc.kind = m_kind;
        desc.streamIndex = m_streamIndex;
        desc.name = "rank " + std::to_string(ts->target.rank) + " " + m_name;
        m_track = ts->target.recorder->track(desc);
        m_trackGeneration.store(ts->target.generation, std::memory_order_release);
    }
    return m_track;
}

void CpuStream::enqueue(WorkItem&& item) {
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_queue.push_back(std::move(item));
        ++m_submitted;
    }
    m_workCv.notify_one();
}

void CpuStream::submit(const OpDesc& desc, std::function<Status()> fn) {
    WorkItem item;
    item.kind = WorkItem::Work;
    item.fn = std::move(fn);
    item.name = desc.name ? desc.name : "";
    const TraceState* ts = m_device.traceState();
    if (!ts) {  // tracing off: no clock reads, no recorder calls
        enqueue(std::move(item));
        return;
    }
    trace::Recorder* rec = ts->target.recorder;
    const int64_t launchStart = monotonicNs();
    item.traced = true;
    item.trace = ts;
    item.track = trackFor(ts);
    item.nameId = rec->intern(item.name);
    item.groupId = desc.group ? rec->intern(desc.group) : 0;
    item.category = desc.category;
    item.flops = desc.flops;
    item.bytes = desc.bytes;
    item.step = desc.step;
    item.microbatch = desc.microbatch;
    item.chunk = desc.chunk;
    item.layer = desc.layer;
    item.correlation = rec->nextCorrelation();
    trace::Slice launch;
    launch.track = hostTrack(ts->target);
    launch.name = item.nameId;
    launch.category = trace::Category::Launch;
    launch.step = desc.step;
    launch.microbatch = desc.microbatch;
    launch.chunk = desc.chunk;
    launch.layer = desc.layer;
    launch.correlation = item.correlation;
    launch.group = item.groupId;
    launch.depth = hostRangeDepth(ts->target);
    enqueue(std::move(item));
    launch.startNs = launchStart;
    launch.durNs = monotonicNs() - launchStart;
    rec->slice(launch);
}

void CpuStream::record(Event& e) {
    auto* ce = dynamic_cast<CpuEvent*>(&e);
    if (!ce) {
        fail(Status::invalid("stream '" + m_name + "': record() of an event from another backend"));
        return;
    }
    WorkItem item;
    item.kind = WorkItem::Record;
    item.event = ce->state;
    {
        std::lock_guard<std::mutex> lock(ce->state->mutex);
        item.eventSeq = ++ce->state->recorded;
    }
    enqueue(std::move(item));
}

void CpuStream::wait(Event& e) {
    auto* ce = dynamic_cast<CpuEvent*>(&e);
    if (!ce) {
        fail(Status::invalid("stream '" + m_name + "': wait() on an event from another backend"));
        return;
    }
    WorkItem item;
    item.kind = WorkItem::Wait;
    item.event = ce->state;
    {
        std::lock_guard<std::mutex> lock(ce->state->mutex);
        item.eventSeq = ce->state->recorded;  // never recorded (0): nothing to wait for
    }
    if (item.eventSeq == 0) return;
    enqueue(std::move(item));
}

Status CpuStream::synchronize() {
    std::unique_lock<std::mutex> lock(m_mutex);
    const uint64_t target = m_submitted;
    m_doneCv.wait(lock, [&] { return m_done >= target; });
    return m_error;
}

void CpuStream::fail(Status s) {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_error.isOk()) {
        m_error = std::move(s);
        m_failed.store(true, std::memory_order_release);
    }
}

void CpuStream::run() {
    for (;;) {
        WorkItem item;
        {
            std::unique_lock<std::mutex> lock(m_mutex);
            m_workCv.wait(lock, [&] { return m_stop || !m_queue.empty(); });
            if (m_queue.empty()) return;  // stopping and drained
            item = std::move(m_queue.front());
            m_queue.pop_front();
        }
        execute(item);
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            ++m_done;
        }
        m_doneCv.notify_all();
    }
}

void CpuStream::execute(WorkItem& item) {
    switch (item.kind) {
        case WorkItem::Record: {
            Status mine;
            {
                std::lock_guard<std::mutex> lock(m_mutex);
                mine = m_error;
            }
            {
                std::lock_guard<std::mutex> lock(item.event->mutex);
                if (item.eventSeq > item.event->completed) item.event->completed = item.eventSeq;
                item.event->error = mine;
            }
            item.event->cv.notify_all();
            return;
        }
        case WorkItem::Wait: {
            Status theirs;
            {
                std::unique_lock<std::mutex> lock(item.event->mutex);
                item.event->cv.wait(lock, [&] { return item.event->completed >= item.eventSeq; });
                theirs = item.event->error;
            }
            if (!theirs.isOk() && !m_failed.load(std::memory_order_acquire))
                fail(theirs.withContext("stream '" + m_name + "' waited on an event from a failed stream"));
            return;
        }
        case WorkItem::Work: break;
    }
    if (m_failed.load(std::memory_order_acquire)) return;  // skipped after a failure
    int64_t start = 0;
    if (item.traced) start = monotonicNs();
    Status s;
    try {
        s = item.fn();
    } catch (const std::exception& ex) {
        s = Status::internal(std::string("exception: ") + ex.what());
    } catch (...) {
        s = Status::internal("unknown exception");
    }
    if (item.traced) {
        trace::Slice sl;
        sl.track = item.track;
        sl.name = item.nameId;
        sl.category = item.category;
        sl.startNs = start;
        sl.durNs = monotonicNs() - start;
        sl.step = item.step;
        sl.microbatch = item.microbatch;
        sl.chunk = item.chunk;
        sl.layer = item.layer;
        sl.correlation = item.correlation;
        sl.bytes = item.bytes;
        sl.flops = item.flops;
        sl.group = item.groupId;
        item.trace->target.recorder->slice(sl);
    }
    if (!s.isOk()) fail(s.withContext("op '" + item.name + "' on stream '" + m_name + "'"));
    item.fn = nullptr;  // release captures on this thread, before the next item
}

// ----- backend ------------------------------------------------------------------------------

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int n) {
        const long pages = sysconf(_SC_PHYS_PAGES);
        const long pageSize = sysconf(_SC_PAGE_SIZE);
        const int64_t ram = (pages > 0 && pageSize > 0) ? int64_t(pages) * pageSize : 0;
        const int count = n < 1 ? 1 : n;
        for (int i = 0; i < count; ++i)
            m_devices.push_back(std::make_unique<CpuDevice>(i, ram / count));
    }
    BackendKind kind() const override { return BackendKind::Cpu; }
    int deviceCount() const override { return int(m_devices.size()); }
    Device& device(int index) override { return *m_devices.at(size_t(index)); }

private:
    std::vector<std::unique_ptr<CpuDevice>> m_devices;
};

}  // namespace

Status eventStatus(Event& e) {
    auto* ce = dynamic_cast<CpuEvent*>(&e);
    if (!ce) return Status::ok();
    std::lock_guard<std::mutex> lock(ce->state->mutex);
    return ce->state->error;
}

std::unique_ptr<Backend> makeCpuBackend(int virtualDevices) {
    return std::make_unique<CpuBackend>(virtualDevices);
}

}  // namespace ts::engine
