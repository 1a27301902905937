// Internal to engine/backend: the pieces the CPU backend (cpu_backend.cpp) and the emulated
// device (emulated_backend.cpp) share, so both have the same streams, events, trace and memory
// accounting: worker-thread streams that run a queue of host closures in order, host events,
// the per-device trace state, and the per-category memory accounting with its limit. The CUDA
// backend (cuda/cuda_backend.cpp) uses the trace state and the memory accounting too.
// Semantics are those of cpu_backend.h (sticky stream failure, events carrying the recording
// stream's error, streams drained on destruction).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"
#include "kernels/common/fp8_codes.h"

namespace ts::engine::host {

std::string formatBytes(int64_t b);

// Size class of a request: blocks are cached and reused per class. Up to 4 KiB classes are
// 64-byte steps; above, 8 classes per power of two (at most 12.5% slack), so the per-step
// allocations of a training loop (the same shapes every microbatch) hit exact classes.
size_t sizeClass(size_t bytes);

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

class HostEvent final : public Event {
public:
    std::shared_ptr<EventState> state = std::make_shared<EventState>();

    bool query() override;
    void synchronize() override;
};

// ----- trace state ----------------------------------------------------------------------------

// Immutable once published; a device keeps every one it ever published so readers holding an
// old pointer stay valid.
struct TraceState {
    TraceTarget target;
};

// A device's current trace state (setTrace/traceTarget), published atomically.
class TracePublisher {
public:
    void set(trace::Recorder* rec, int rank, int deviceIndex);
    const TraceState* state() const { return m_trace.load(std::memory_order_acquire); }
    TraceTarget target() const {
        const TraceState* ts = state();
        return ts ? ts->target : TraceTarget{};
    }
    std::atomic<const TraceState*>* atomic() { return &m_trace; }

private:
    std::mutex m_mutex;
    std::atomic<const TraceState*> m_trace{nullptr};
    std::vector<std::unique_ptr<TraceState>> m_states;
};

// ----- memory accounting ----------------------------------------------------------------------

// Exact live bytes per category (as requested), peaks, and the limit. Shared by a device and
// its buffers; the allocator that owns blocks adds its cache on top (cachedBytes). The CPU,
// emulated and CUDA devices all account through it.
struct MemAccounting {
    std::mutex mutex;
    MemoryStats stats;
    int64_t limit = 0;
    size_t cachedBytes = 0;  // free blocks the allocator keeps for reuse: not live; MemoryStats::cached
    std::string deviceName;
    std::atomic<const TraceState*>* trace = nullptr;  // owned by the device; null once it is gone

    // Caller holds `mutex`. Counts `bytes` of `cat` as live, or OutOfMemory past the limit.
    // On success *current is the category's new live total.
    Status reserveLocked(size_t bytes, MemCategory cat, int64_t* current);
    // Caller holds `mutex`. Returns the category's new live total.
    int64_t releaseLocked(size_t bytes, MemCategory cat);
    // Device::memoryStats, resetPeak and setMemoryLimit (each takes `mutex`).
    MemoryStats snapshot();
    void resetPeak();
    void setLimit(int64_t bytes);  // <= 0: none
    void reportCounter(MemCategory cat, int64_t value);
};

// A buffer that is one block of its device's allocator, whose state `Mem` (a MemAccounting) it
// shares; the backend's destructor releases the bytes and gives the block back (CPU, CUDA).
template <typename Mem>
class BlockBuffer : public Buffer {
public:
    BlockBuffer(Device& dev, std::shared_ptr<Mem> mem, void* p, size_t bytes, MemCategory cat)
        : m_device(dev), m_mem(std::move(mem)), m_data(p), m_bytes(bytes), m_cat(cat) {
        kernels::fp8codes::map().forget(p, bytes);  // nothing bound before it was a Buffer
    }
    void* data() override { return m_data; }
    const void* data() const override { return m_data; }
    size_t bytes() const override { return m_bytes; }
    MemCategory category() const override { return m_cat; }
    Device& device() override { return m_device; }

protected:
    Device& m_device;
    std::shared_ptr<Mem> m_mem;
    void* m_data;
    size_t m_bytes;
    MemCategory m_cat;
};

// ----- streams ------------------------------------------------------------------------------

struct WorkItem {
    enum Kind : uint8_t { Work, Record, Wait, Release } kind = Work;
    std::function<Status()> fn;
    std::shared_ptr<const void> keep;  // Release: dropped when the worker gets to the item
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

// The host launch slice of a submit (Category::Launch on the submitting thread's host track),
// recorded by finishLaunch once the item is queued.
struct Launch {
    trace::Recorder* recorder = nullptr;  // null: not traced
    trace::Slice slice;
};

// A stream whose worker thread executes its queue in order (the CPU backend's stream). The
// worker runs inside CurrentStreamScope(this). submit() queues fn as one traced work item;
// subclasses may build items themselves with prepare()/enqueue()/finishLaunch().
class WorkerStream : public Stream {
public:
    WorkerStream(const TracePublisher& trace, trace::TrackKind kind, std::string name, int streamIndex);
    ~WorkerStream() override;  // drains the queue

    void submit(const OpDesc& desc, std::function<Status()> fn) override;
    void record(Event& e) override;
    void keepUntilPassed(std::shared_ptr<const void> owner) override;
    void wait(Event& e) override;
    Status synchronize() override;
    void* native() override { return nullptr; }
    trace::TrackKind kind() const override { return m_kind; }
    const std::string& name() const override { return m_name; }

    // Items queued so far / executed so far (executed <= queued; both only grow).
    uint64_t queuedCount();
    uint64_t doneCount();
    // True on this stream's worker thread.
    bool onWorker() const { return std::this_thread::get_id() == m_workerId.load(std::memory_order_acquire); }

protected:
    // Fills item's name, fn and trace fields for `desc`, and `launch` (launch.slice.startNs =
    // launchStart) when the device is traced.
    void prepare(WorkItem& item, const OpDesc& desc, std::function<Status()> fn, Launch& launch,
                 int64_t launchStart);
    void enqueue(WorkItem&& item);
    static void finishLaunch(Launch& launch);
    // The stream failed (sticky); work submitted now is skipped.
    bool failed() const { return m_failed.load(std::memory_order_acquire); }
    // Stops and joins the worker after it drained the queue; subclasses whose items call into
    // the subclass call it from their destructor. Idempotent.
    void stopWorker();

private:
    void run();
    void execute(WorkItem& item);
    void fail(Status s);
    uint32_t trackFor(const TraceState* ts);

    const TracePublisher& m_trace;
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
    Status m_error;                     // guarded by m_mutex; sticky
    std::atomic<bool> m_failed{false};  // mirror of !m_error.isOk() for the worker's fast path

    std::mutex m_trackMutex;
    std::atomic<uint64_t> m_trackGeneration{0};
    uint32_t m_track = 0;

    std::atomic<std::thread::id> m_workerId{};
    std::thread m_thread;  // last: started after every member above exists
};

}  // namespace ts::engine::host
