// Streams, events, trace state and memory accounting shared by the CPU backend and the emulated
// device (see host_runtime.h).
#include "engine/backend/host_runtime.h"

#include <cstdio>
#include <exception>

#include "common/clock.h"
#include "engine/backend/backend.h"
#include "engine/backend/backend_trace.h"

namespace ts::engine::host {

std::string formatBytes(int64_t b) {
    char buf[64];
    const double v = double(b);
    if (b >= (int64_t(1) << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", v / double(1 << 30));
    else if (b >= (int64_t(1) << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", v / double(1 << 20));
    else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.2f KiB", v / 1024.0);
    else std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(b));
    return buf;
}

size_t sizeClass(size_t bytes) {
    const size_t b = bytes == 0 ? 1 : bytes;
    if (b <= 4096) return (b + 63) / 64 * 64;
    int msb = 63;
    while (!(b >> msb)) --msb;
    const size_t step = size_t(1) << (msb - 3);
    return (b + step - 1) / step * step;
}

// ----- events -------------------------------------------------------------------------------

bool HostEvent::query() {
    std::lock_guard<std::mutex> lock(state->mutex);
    return state->completed >= state->recorded;
}

void HostEvent::synchronize() {
    std::unique_lock<std::mutex> lock(state->mutex);
    const uint64_t target = state->recorded;
    state->cv.wait(lock, [&] { return state->completed >= target; });
}

// ----- trace state ----------------------------------------------------------------------------

void TracePublisher::set(trace::Recorder* rec, int rank, int deviceIndex) {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (!rec) {
        m_trace.store(nullptr, std::memory_order_release);
        return;
    }
    auto st = std::make_unique<TraceState>();
    st->target.recorder = rec;
    st->target.rank = rank;
    st->target.device = deviceIndex;
    st->target.generation = ts::engine::nextTraceGeneration();  // backend_trace.h: one counter for every backend
    m_trace.store(st.get(), std::memory_order_release);
    m_states.push_back(std::move(st));
}

// ----- memory accounting ----------------------------------------------------------------------

Status MemAccounting::reserveLocked(size_t bytes, MemCategory cat, int64_t* current) {
    if (limit > 0 && stats.currentTotal + int64_t(bytes) > limit) {
        std::string inUse;
        for (size_t c = 0; c < size_t(MemCategory::Count); ++c) {
            if (stats.current[c] == 0) continue;
            if (!inUse.empty()) inUse += ", ";
            inUse += std::string(trace::memCategoryName(MemCategory(c))) + " " + formatBytes(stats.current[c]);
        }
        return Status(ErrorCode::OutOfMemory,
                      "out of memory on " + deviceName + ": allocating " + formatBytes(int64_t(bytes)) + " (" +
                          std::to_string(bytes) + " bytes) of " + trace::memCategoryName(cat) +
                          " would exceed the memory limit of " + formatBytes(limit) + "; in use " +
                          formatBytes(stats.currentTotal) + (inUse.empty() ? "" : " (" + inUse + ")") +
                          ". Reduce micro_batch_size, enable recompute or use more model parallelism");
    }
    const size_t i = size_t(cat);
    stats.current[i] += int64_t(bytes);
    stats.currentTotal += int64_t(bytes);
    if (stats.current[i] > stats.peak[i]) stats.peak[i] = stats.current[i];
    if (stats.currentTotal > stats.peakTotal) stats.peakTotal = stats.currentTotal;
    *current = stats.current[i];
    return Status::ok();
}

int64_t MemAccounting::releaseLocked(size_t bytes, MemCategory cat) {
    stats.current[size_t(cat)] -= int64_t(bytes);
    stats.currentTotal -= int64_t(bytes);
    return stats.current[size_t(cat)];
}

MemoryStats MemAccounting::snapshot() {
    std::lock_guard<std::mutex> lock(mutex);
    MemoryStats st = stats;
    st.cached = int64_t(cachedBytes);
    return st;
}

void MemAccounting::resetPeak() {
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t c = 0; c < size_t(MemCategory::Count); ++c) stats.peak[c] = stats.current[c];
    stats.peakTotal = stats.currentTotal;
}

void MemAccounting::setLimit(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    limit = bytes < 0 ? 0 : bytes;
}

void MemAccounting::reportCounter(MemCategory cat, int64_t value) {
    const TraceState* ts = trace ? trace->load(std::memory_order_acquire) : nullptr;
    if (!ts) return;
    trace::Counter c;
    c.rank = ts->target.rank;
    c.name = ts->target.recorder->intern(std::string("memory.") + trace::memCategoryName(cat));
    c.tsNs = monotonicNs();
    c.value = double(value);
    ts->target.recorder->counter(c);
}

// ----- streams ------------------------------------------------------------------------------

WorkerStream::WorkerStream(const TracePublisher& trace, trace::TrackKind kind, std::string name, int streamIndex)
    : m_trace(trace), m_kind(kind), m_name(std::move(name)), m_streamIndex(streamIndex) {
    m_thread = std::thread([this] { run(); });
}

WorkerStream::~WorkerStream() { stopWorker(); }

void WorkerStream::stopWorker() {
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_stop = true;
    }
    m_workCv.notify_all();
    if (m_thread.joinable()) m_thread.join();
}

uint64_t WorkerStream::queuedCount() {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_submitted;
}

uint64_t WorkerStream::doneCount() {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_done;
}

uint32_t WorkerStream::trackFor(const TraceState* ts) {
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

void WorkerStream::enqueue(WorkItem&& item) {
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_queue.push_back(std::move(item));
        ++m_submitted;
    }
    m_workCv.notify_one();
}

void WorkerStream::prepare(WorkItem& item, const OpDesc& desc, std::function<Status()> fn, Launch& launch,
                           int64_t launchStart) {
    item.kind = WorkItem::Work;
    item.fn = std::move(fn);
    item.name = desc.name ? desc.name : "";
    const TraceState* ts = m_trace.state();
    if (!ts) return;  // tracing off: no clock reads, no recorder calls
    trace::Recorder* rec = ts->target.recorder;
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
    launch.recorder = rec;
    trace::Slice& l = launch.slice;
    l.track = hostTrack(ts->target);
    l.name = item.nameId;
    l.category = trace::Category::Launch;
    l.step = desc.step;
    l.microbatch = desc.microbatch;
    l.chunk = desc.chunk;
    l.layer = desc.layer;
    l.correlation = item.correlation;
    l.group = item.groupId;
    l.depth = hostRangeDepth(ts->target);
    l.startNs = launchStart;
}

void WorkerStream::finishLaunch(Launch& launch) {
    if (!launch.recorder) return;
    launch.slice.durNs = monotonicNs() - launch.slice.startNs;
    launch.recorder->slice(launch.slice);
}

void WorkerStream::submit(const OpDesc& desc, std::function<Status()> fn) {
    WorkItem item;
    Launch launch;
    prepare(item, desc, std::move(fn), launch, m_trace.state() ? monotonicNs() : 0);
    enqueue(std::move(item));
    finishLaunch(launch);
}

void WorkerStream::record(Event& e) {
    auto* he = dynamic_cast<HostEvent*>(&e);
    if (!he) {
        fail(Status::invalid("stream '" + m_name + "': record() of an event from another backend"));
        return;
    }
    WorkItem item;
    item.kind = WorkItem::Record;
    item.event = he->state;
    {
        std::lock_guard<std::mutex> lock(he->state->mutex);
        item.eventSeq = ++he->state->recorded;
    }
    enqueue(std::move(item));
}

void WorkerStream::keepUntilPassed(std::shared_ptr<const void> owner) {
    WorkItem item;
    item.kind = WorkItem::Release;
    item.keep = std::move(owner);
    enqueue(std::move(item));
}

void WorkerStream::wait(Event& e) {
    auto* he = dynamic_cast<HostEvent*>(&e);
    if (!he) {
        fail(Status::invalid("stream '" + m_name + "': wait() on an event from another backend"));
        return;
    }
    WorkItem item;
    item.kind = WorkItem::Wait;
    item.event = he->state;
    {
        std::lock_guard<std::mutex> lock(he->state->mutex);
        item.eventSeq = he->state->recorded;  // never recorded (0): nothing to wait for
    }
    if (item.eventSeq == 0) return;
    enqueue(std::move(item));
}

Status WorkerStream::synchronize() {
    std::unique_lock<std::mutex> lock(m_mutex);
    const uint64_t target = m_submitted;
    m_doneCv.wait(lock, [&] { return m_done >= target; });
    return m_error;
}

void WorkerStream::fail(Status s) {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_error.isOk()) {
        m_error = std::move(s);
        m_failed.store(true, std::memory_order_release);
    }
}

void WorkerStream::run() {
    m_workerId.store(std::this_thread::get_id(), std::memory_order_release);
    CurrentStreamScope scope(this);
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

void WorkerStream::execute(WorkItem& item) {
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
        case WorkItem::Release:
            item.keep.reset();  // here, in the stream's order, also after a failure
            return;
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
    // What the item's host kernels reported (reportKernelError: a deferred kernel of the
    // emulated device, a checked CPU GEMM) fails it too.
    Status kernel = takeKernelError();
    if (s.isOk()) s = std::move(kernel);
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

}  // namespace ts::engine::host
