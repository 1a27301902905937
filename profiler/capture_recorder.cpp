// CaptureRecorder: the engine's trace::Recorder. Producers (rank and stream threads) append to
// their own ThreadBuffer under a mutex only the writer ever contends for; one writer thread
// swaps the buffers out and writes them in one transaction per drain (see store.h).
//
// Invariants:
//  - every record appended before flush() returns is committed exactly once, or counted as
//    dropped (buffer cap reached, recorder closed, or a write error) in stats;
//  - the hot path never touches SQLite and never waits for the writer.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "common/clock.h"
#include "profiler/store.h"

namespace ts::profiler {

namespace {

struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct ThreadBuffer {
    std::mutex mu;  // producer vs. the writer's swap; uncontended otherwise
    std::vector<trace::Slice> slices;
    std::vector<trace::Counter> counters;
    // Writer-side spares, swapped in so producers keep their capacity (no realloc storms).
    std::vector<trace::Slice> spareSlices;
    std::vector<trace::Counter> spareCounters;
    // The strings this thread has interned and their ids (its own thread only, no lock): an op's
    // name is interned at every launch, and the shared table's mutex is contended by every rank
    // and stream thread.
    std::unordered_map<std::string, uint32_t, TextHash, std::equal_to<>> interned;
    std::thread::id owner;  // the thread that appends here (guarded by the recorder's regMu)
};

std::atomic<uint64_t> g_generation{1};

// Per-thread cache of "which buffer do I use for recorder generation g". Generations are
// never reused, so an entry left by a destroyed recorder can never match a live one.
struct TlsEntry {
    uint64_t generation = 0;
    ThreadBuffer* buffer = nullptr;
};
constexpr int kTlsEntries = 4;
thread_local TlsEntry t_cache[kTlsEntries];
thread_local unsigned t_next = 0;

}  // namespace

struct CaptureRecorder::Impl {
    uint64_t generation = g_generation.fetch_add(1);
    Options options;
    std::unique_ptr<TraceStore> store;
    std::string path;

    std::mutex regMu;
    std::vector<std::unique_ptr<ThreadBuffer>> buffers;

    std::mutex internMu;
    std::unordered_map<std::string, uint32_t, TextHash, std::equal_to<>> strings;
    uint32_t nextString = 1;
    std::vector<std::pair<uint32_t, std::string>> pendingStrings;
    uint32_t nextTrack = 1;
    std::vector<std::pair<uint32_t, trace::TrackDesc>> pendingTracks;

    std::mutex opsMu;
    std::vector<std::function<Status(TraceStore&)>> ops;

    std::atomic<uint64_t> correlation{1};
    std::atomic<bool> closed{false};
    std::atomic<uint64_t> droppedSlices{0}, droppedCounters{0};
    std::atomic<uint64_t> writtenSlices{0}, writtenCounters{0}, batches{0};
    uint64_t droppedReported = 0;  // writer thread only
    uint64_t reportedSlices = 0, reportedCounters = 0;  // writer thread only
    std::vector<trace::Slice> allSlices;                 // writer thread only (reused)

    std::thread writer;
    std::mutex wakeMu;
    std::condition_variable wakeCv, doneCv;
    uint64_t flushRequested = 0, flushDone = 0;
    bool stop = false, writerExited = false;
    Status writerError;  // guarded by wakeMu

    // This thread's buffer: from the thread-local cache, else the one registered for this thread
    // before (its cache entry was evicted by other recorders: the buffer and its interned strings
    // are kept rather than registered again), else a new one. A thread id reused after its thread
    // ended takes over that thread's buffer, which nothing else appends to any more.
    ThreadBuffer* localBuffer() {
        for (auto& e : t_cache)
            if (e.generation == generation) return e.buffer;
        const std::thread::id me = std::this_thread::get_id();
        ThreadBuffer* raw = nullptr;
        {
            std::lock_guard<std::mutex> g(regMu);
            for (auto& b : buffers)
                if (b->owner == me) raw = b.get();
            if (!raw) {
                buffers.push_back(std::make_unique<ThreadBuffer>());
                raw = buffers.back().get();
                raw->owner = me;
            }
        }
        t_cache[t_next++ % kTlsEntries] = {generation, raw};
        return raw;
    }

    void wakeIfLarge(size_t size) {
        // Wake the writer early when one buffer grows large, instead of waiting the interval.
        if ((size & 0xFFFF) == 0) wakeCv.notify_one();
    }

    Status writeBatch();
    void run();
};

Status CaptureRecorder::Impl::writeBatch() {
    std::vector<std::pair<uint32_t, std::string>> strs;
    std::vector<std::pair<uint32_t, trace::TrackDesc>> trks;
    {
        std::lock_guard<std::mutex> g(internMu);
        strs.swap(pendingStrings);
        trks.swap(pendingTracks);
    }
    std::vector<std::function<Status(TraceStore&)>> todo;
    {
        std::lock_guard<std::mutex> g(opsMu);
        todo.swap(ops);
    }
    std::vector<ThreadBuffer*> bufs;
    {
        std::lock_guard<std::mutex> g(regMu);
        for (auto& b : buffers) bufs.push_back(b.get());
    }
    for (ThreadBuffer* b : bufs) {
        std::lock_guard<std::mutex> g(b->mu);
        b->spareSlices.swap(b->slices);
        b->spareCounters.swap(b->counters);
    }
    uint64_t dropped = droppedSlices.load() + droppedCounters.load();
    bool any = !strs.empty() || !trks.empty() || !todo.empty() || dropped != droppedReported;
    for (ThreadBuffer* b : bufs) any = any || !b->spareSlices.empty() || !b->spareCounters.empty();
    if (!any) return Status::ok();

    uint64_t nSlices = 0, nCounters = 0;
    Status st = store->beginBatch();
    for (auto& [id, text] : strs)
        if (st) st = store->putString(id, text);
    for (auto& [id, desc] : trks)
        if (st) st = store->putTrack(id, desc);
    for (auto& op : todo)
        if (st) st = op(*store);
    // One putSlices per batch: it orders the rows by (track, ts) and packs each track's run into
    // chunks, so a batch costs one SQLite row per chunk, not per slice.
    allSlices.clear();
    for (ThreadBuffer* b : bufs) {
        allSlices.insert(allSlices.end(), b->spareSlices.begin(), b->spareSlices.end());
        for (const auto& c : b->spareCounters) {
            if (!st) break;
            st = store->putCounter(c);
        }
        nCounters += b->spareCounters.size();
    }
    nSlices = allSlices.size();
    if (st) st = store->putSlices(allSlices.data(), allSlices.size());
    if (st && dropped != droppedReported) {
        // Stats hold totals; add only what is new since the last batch.
        uint64_t ds = droppedSlices.load(), dc = droppedCounters.load();
        st = store->addStat("capture.dropped_slices", int64_t(ds - reportedSlices));
        if (st) st = store->addStat("capture.dropped_counters", int64_t(dc - reportedCounters));
        if (st) {
            reportedSlices = ds;
            reportedCounters = dc;
            droppedReported = ds + dc;
        }
    }
    if (st) st = store->commitBatch();
    if (!st) {
        (void)store->rollbackBatch();
        // The rows of this batch are lost: count them so the loss is visible.
        droppedSlices += nSlices;
        droppedCounters += nCounters;
    } else {
        writtenSlices += nSlices;
        writtenCounters += nCounters;
        batches += 1;
    }
    for (ThreadBuffer* b : bufs) {
        b->spareSlices.clear();
        b->spareCounters.clear();
    }
    return st;
}

void CaptureRecorder::Impl::run() {
    for (;;) {
        uint64_t target;
        bool stopping;
        {
            std::unique_lock<std::mutex> l(wakeMu);
            wakeCv.wait_for(l, std::chrono::milliseconds(options.flushIntervalMs),
                            [&] { return stop || flushRequested > flushDone; });
            target = flushRequested;
            stopping = stop;
        }
        Status st = writeBatch();
        {
            std::lock_guard<std::mutex> l(wakeMu);
            if (!st && writerError.isOk()) writerError = st;
            flushDone = target;
            if (stopping) writerExited = true;
        }
        doneCv.notify_all();
        if (stopping) break;
    }
}

Result<std::unique_ptr<CaptureRecorder>> CaptureRecorder::create(const std::string& runFilePath) {
    return create(runFilePath, Options{});
}

Result<std::unique_ptr<CaptureRecorder>> CaptureRecorder::create(const std::string& runFilePath,
                                                                 const Options& options) {
    // A run file prepared beforehand (e.g. by the session with its run info) is appended to.
    auto created = TraceStore::create(runFilePath);
    std::unique_ptr<TraceStore> store;
    if (created) {
        store = std::move(created).value();
    } else if (created.status().code() == ErrorCode::InvalidArgument) {
        TS_ASSIGN_OR_RETURN(store, TraceStore::open(runFilePath, false));
    } else {
        return created.status();
    }
    std::unique_ptr<CaptureRecorder> rec(new CaptureRecorder());
    rec->m = std::make_unique<Impl>();
    Impl& m = *rec->m;
    m.options = options;
    m.path = runFilePath;
    m.store = std::move(store);
    // Continue id spaces of an existing file.
    TS_ASSIGN_OR_RETURN(auto strs, m.store->strings());
    for (size_t i = 1; i < strs.size(); ++i)
        if (!strs[i].empty()) m.strings.emplace(strs[i], uint32_t(i));
    m.nextString = uint32_t(strs.size());
    TS_ASSIGN_OR_RETURN(auto trks, m.store->tracks());
    for (auto& t : trks) m.nextTrack = std::max(m.nextTrack, t.id + 1);
    m.writer = std::thread([&m] { m.run(); });
    return rec;
}

CaptureRecorder::~CaptureRecorder() {
    if (m) (void)close();
}

uint32_t CaptureRecorder::track(const trace::TrackDesc& desc) {
    std::lock_guard<std::mutex> g(m->internMu);
    uint32_t id = m->nextTrack++;
    m->pendingTracks.emplace_back(id, desc);
    return id;
}

uint32_t CaptureRecorder::intern(std::string_view text) {
    if (text.empty()) return 0;
    ThreadBuffer* local = m->localBuffer();
    if (auto hit = local->interned.find(text); hit != local->interned.end()) return hit->second;
    uint32_t id = 0;
    {
        std::lock_guard<std::mutex> g(m->internMu);
        if (auto it = m->strings.find(text); it != m->strings.end()) {
            id = it->second;
        } else {
            id = m->nextString++;
            m->strings.emplace(std::string(text), id);
            m->pendingStrings.emplace_back(id, std::string(text));
        }
    }
    local->interned.emplace(std::string(text), id);
    return id;
}

void CaptureRecorder::slice(const trace::Slice& s) {
    if (m->closed.load(std::memory_order_relaxed)) {
        m->droppedSlices.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    ThreadBuffer* b = m->localBuffer();
    size_t size;
    {
        std::lock_guard<std::mutex> g(b->mu);
        size = b->slices.size() + b->counters.size();
        if (size >= m->options.maxBufferedRows) {
            m->droppedSlices.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        b->slices.push_back(s);
    }
    m->wakeIfLarge(size + 1);
}

void CaptureRecorder::counter(const trace::Counter& c) {
    if (m->closed.load(std::memory_order_relaxed)) {
        m->droppedCounters.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    ThreadBuffer* b = m->localBuffer();
    size_t size;
    {
        std::lock_guard<std::mutex> g(b->mu);
        size = b->slices.size() + b->counters.size();
        if (size >= m->options.maxBufferedRows) {
            m->droppedCounters.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        b->counters.push_back(c);
    }
    m->wakeIfLarge(size + 1);
}

void CaptureRecorder::metadata(std::string_view key, std::string_view value) {
    std::lock_guard<std::mutex> g(m->opsMu);
    m->ops.emplace_back([k = std::string(key), v = std::string(value)](TraceStore& s) { return s.setMetadata(k, v); });
}

uint64_t CaptureRecorder::nextCorrelation() { return m->correlation.fetch_add(1, std::memory_order_relaxed); }

void CaptureRecorder::setRunInfo(const RunInfo& info) {
    std::lock_guard<std::mutex> g(m->opsMu);
    m->ops.emplace_back([info](TraceStore& s) { return s.setRunInfo(info); });
}

void CaptureRecorder::setRunStatus(const std::string& status, const std::string& reason) {
    std::lock_guard<std::mutex> g(m->opsMu);
    m->ops.emplace_back([status, reason](TraceStore& s) { return s.setRunStatus(status, reason); });
}

void CaptureRecorder::appendStepMetrics(const StepMetrics& sm) {
    std::lock_guard<std::mutex> g(m->opsMu);
    m->ops.emplace_back([sm](TraceStore& s) { return s.appendStepMetrics(sm); });
}

void CaptureRecorder::appendLog(const std::string& level, const std::string& text) {
    appendLog(monotonicNs(), level, text);
}

void CaptureRecorder::appendLog(int64_t ts, const std::string& level, const std::string& text) {
    std::lock_guard<std::mutex> g(m->opsMu);
    m->ops.emplace_back([ts, level, text](TraceStore& s) { return s.appendLog(ts, level, text); });
}

Status CaptureRecorder::flush() {
    std::unique_lock<std::mutex> l(m->wakeMu);
    if (m->writerExited) return Status::invalid("capture of '" + m->path + "' is closed");
    uint64_t ticket = ++m->flushRequested;
    m->wakeCv.notify_one();
    m->doneCv.wait(l, [&] { return m->flushDone >= ticket || m->writerExited; });
    Status st = m->writerError;
    m->writerError = Status::ok();
    return st.isOk() ? st : st.withContext("writing trace to '" + m->path + "'");
}

Status CaptureRecorder::close() {
    if (!m->writer.joinable()) return Status::ok();
    m->closed.store(true);
    {
        std::lock_guard<std::mutex> l(m->wakeMu);
        m->stop = true;
        ++m->flushRequested;
    }
    m->wakeCv.notify_one();
    m->writer.join();
    Status st;
    {
        std::lock_guard<std::mutex> l(m->wakeMu);
        st = m->writerError;
        m->writerError = Status::ok();
    }
    if (st) st = m->store->checkpoint();
    m->store.reset();
    return st.isOk() ? st : st.withContext("closing trace '" + m->path + "'");
}

CaptureRecorder::Stats CaptureRecorder::stats() const {
    Stats s;
    s.slices = m->writtenSlices.load();
    s.counters = m->writtenCounters.load();
    s.dropped = m->droppedSlices.load() + m->droppedCounters.load();
    s.batches = m->batches.load();
    return s;
}

const std::string& CaptureRecorder::path() const { return m->path; }

}  // namespace ts::profiler
