// CPU backend implementation (see cpu_backend.h): virtual devices, worker-thread streams,
// events, and the tracked allocator. Streams, events, trace state and the accounting are
// host_runtime.h's, shared with the emulated device.
#include "engine/backend/cpu_backend.h"
#include "kernels/common/fp8_codes.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/backend/host_runtime.h"

namespace ts::engine {

namespace {

using host::HostEvent;
using host::MemAccounting;
using host::TracePublisher;
using host::formatBytes;
using host::sizeClass;

// ----- memory -------------------------------------------------------------------------------

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
struct MemState : MemAccounting {
    static constexpr size_t kCacheCap = size_t(4) << 30;

    std::unordered_map<size_t, std::vector<void*>> freeBlocks;  // size class -> blocks

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
        for (auto& [c, blocks] : freeBlocks)
            for (void* p : blocks) hostFree(p, c);
        freeBlocks.clear();
        cachedBytes = 0;
    }
};

class CpuBuffer final : public host::BlockBuffer<MemState> {
public:
    using BlockBuffer::BlockBuffer;
    ~CpuBuffer() override;
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
        m_mem->trace = m_trace.atomic();
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
            TS_RETURN_IF_ERROR(m_mem->reserveLocked(bytes, cat, &current));
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
            m_mem->releaseLocked(bytes, cat);
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
        return std::make_unique<host::WorkerStream>(m_trace, kind, name, index);
    }

    std::unique_ptr<Event> createEvent() override { return std::make_unique<HostEvent>(); }

    MemoryStats memoryStats() const override { return m_mem->snapshot(); }
    void resetPeak() override { m_mem->resetPeak(); }
    void setMemoryLimit(int64_t bytes) override { m_mem->setLimit(bytes); }

    bool supports(const std::string&) const override { return true; }  // the reference backend

    void setTrace(trace::Recorder* rec, int rank) override { m_trace.set(rec, rank, m_info.index); }

    TraceTarget traceTarget() const override { return m_trace.target(); }

private:
    DeviceInfo m_info;
    std::shared_ptr<MemState> m_mem;
    std::mutex m_streamMutex;
    int m_streamsPerKind[8] = {};
    TracePublisher m_trace;
};

CpuBuffer::~CpuBuffer() {
    kernels::fp8codes::map().forget(m_data, m_bytes);  // what was quantized into it
    int64_t current = 0;
    {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        current = m_mem->releaseLocked(m_bytes, m_cat);
        m_mem->reportCounter(m_cat, current);
        m_mem->giveBack(m_data, sizeClass(m_bytes));
    }
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
    auto* he = dynamic_cast<HostEvent*>(&e);
    if (!he) return Status::ok();
    std::lock_guard<std::mutex> lock(he->state->mutex);
    return he->state->error;
}

std::unique_ptr<Backend> makeCpuBackend(int virtualDevices) {
    return std::make_unique<CpuBackend>(virtualDevices);
}

}  // namespace ts::engine
