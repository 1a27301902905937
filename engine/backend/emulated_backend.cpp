// Emulated device backend (see emulated_backend.h): arenas with a PROT_NONE device view and a
// read-write host view of one memfd, run-at-submit streams that queue their kernels on the
// CPU backend's worker-thread streams, stream-ordered block reuse.
#include "engine/backend/emulated_backend.h"
#include "kernels/common/fp8_codes.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "engine/backend/cpu_backend.h"
#include "engine/backend/graph.h"
#include "engine/backend/graph_pool.h"
#include "engine/backend/host_runtime.h"

namespace ts::engine {

namespace {

using host::HostEvent;
using host::MemAccounting;
using host::TracePublisher;
using host::formatBytes;

// ----- arena registry (read lock-free by hostAlias and the SIGSEGV handler) -------------------

// A slot is live while devEnd != 0. Writers (under g_slotMutex) publish devBegin and hostBegin
// before devEnd; readers load devEnd first.
struct ArenaSlot {
    std::atomic<uintptr_t> devBegin{0}, devEnd{0}, hostBegin{0};
    std::atomic<int> device{-1};
};
constexpr int kMaxArenas = 256;
ArenaSlot g_slots[kMaxArenas];
std::atomic<int> g_slotHigh{0};  // slots [0, high) may be live
std::mutex g_slotMutex;

int registerArena(uintptr_t dev, uintptr_t host, size_t len, int device) {
    std::lock_guard<std::mutex> lock(g_slotMutex);
    const int high = g_slotHigh.load(std::memory_order_relaxed);
    int i = 0;
    while (i < high && g_slots[i].devEnd.load(std::memory_order_relaxed) != 0) ++i;
    if (i == kMaxArenas) return -1;
    ArenaSlot& s = g_slots[i];
    s.devBegin.store(dev, std::memory_order_relaxed);
    s.hostBegin.store(host, std::memory_order_relaxed);
    s.device.store(device, std::memory_order_relaxed);
    s.devEnd.store(dev + len, std::memory_order_release);
    if (i == high) g_slotHigh.store(high + 1, std::memory_order_release);
    return i;
}

void unregisterArena(int slot) {
    std::lock_guard<std::mutex> lock(g_slotMutex);
    g_slots[slot].devEnd.store(0, std::memory_order_release);
}

// The live slot whose device view holds u, or null. Async-signal-safe.
const ArenaSlot* slotOfDevice(uintptr_t u) {
    const int high = g_slotHigh.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        const uintptr_t end = g_slots[i].devEnd.load(std::memory_order_acquire);
        if (end && u < end && u >= g_slots[i].devBegin.load(std::memory_order_relaxed)) return &g_slots[i];
    }
    return nullptr;
}

const ArenaSlot* slotOfHost(uintptr_t u) {
    const int high = g_slotHigh.load(std::memory_order_acquire);
    for (int i = 0; i < high; ++i) {
        const uintptr_t end = g_slots[i].devEnd.load(std::memory_order_acquire);
        if (!end) continue;
        const uintptr_t lo = g_slots[i].hostBegin.load(std::memory_order_relaxed);
        const uintptr_t len = end - g_slots[i].devBegin.load(std::memory_order_relaxed);
        if (u >= lo && u < lo + len) return &g_slots[i];
    }
    return nullptr;
}

// ----- SIGSEGV: say what happened when host code touches a device view --------------------------

struct sigaction g_prevSegv;

void writeStr(const char* s) {
    const size_t n = std::strlen(s);
    ssize_t r = ::write(STDERR_FILENO, s, n);
    (void)r;
}

void writeHex(uintptr_t v) {
    char buf[2 + 16 + 1];
    buf[0] = '0';
    buf[1] = 'x';
    for (int i = 0; i < 16; ++i) buf[2 + i] = "0123456789abcdef"[(v >> (60 - 4 * i)) & 0xf];
    buf[18] = 0;
    writeStr(buf);
}

void writeDec(uint64_t v) {
    char buf[24];
    int i = 23;
    buf[i] = 0;
    do {
        buf[--i] = char('0' + v % 10);
        v /= 10;
    } while (v && i > 0);
    writeStr(buf + i);
}

void resetToDefault() {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, nullptr);
}

void segvHandler(int sig, siginfo_t* info, void* uctx) {
    const auto addr = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
    if (const ArenaSlot* s = slotOfDevice(addr)) {
        writeStr("\ntrainscope: host code touched emulated device memory at ");
        writeHex(addr);
        writeStr(" (emulated device ");
        writeDec(uint64_t(s->device.load(std::memory_order_relaxed)));
        writeStr(", offset ");
        writeDec(addr - s->devBegin.load(std::memory_order_relaxed));
        writeStr("). Buffer memory is device memory: reach it through a kernel of the dispatch "
                 "(engine/backend/kernels.h) or a stream copy, not host code (docs/engine.md, "
                 "\"Emulated device\"). Backtrace (addr2line -f -C -i -e <binary> <+offsets> names "
                 "the lines):\n");
        void* frames[64];
        const int n = backtrace(frames, 64);
        backtrace_symbols_fd(frames, n, STDERR_FILENO);
        resetToDefault();  // returning re-runs the access, which now kills with SIGSEGV
        return;
    }
    if ((g_prevSegv.sa_flags & SA_SIGINFO) && g_prevSegv.sa_sigaction) {
        g_prevSegv.sa_sigaction(sig, info, uctx);
        return;
    }
    if (g_prevSegv.sa_handler != SIG_DFL && g_prevSegv.sa_handler != SIG_IGN) {
        g_prevSegv.sa_handler(sig);
        return;
    }
    resetToDefault();
}

void installSegvHandler() {
    static std::once_flag once;
    std::call_once(once, [] {
        void* warm[2];
        (void)backtrace(warm, 2);  // loads the unwinder now, not inside the handler
        struct sigaction sa;
        std::memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = segvHandler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &g_prevSegv);
    });
}

// ----- arena -------------------------------------------------------------------------------------

constexpr size_t kGrowStep = size_t(64) << 20;  // memfd grows in these steps
constexpr size_t kPage = 4096;

size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// One memfd, mapped PROT_NONE (device view) and read-write (host view); blocks are carved by a
// bump pointer and recycled by the device's free lists, never returned to the arena.
class Arena {
public:
    static Result<std::unique_ptr<Arena>> create(int device) {
        installSegvHandler();
        auto a = std::unique_ptr<Arena>(new Arena());
        a->m_device = device;
        const std::string name = "trainscope-emulated-device-" + std::to_string(device);
        a->m_fd = memfd_create(name.c_str(), MFD_CLOEXEC);
        if (a->m_fd < 0)
            return Status::unsupported("emulated device " + std::to_string(device) +
                                       ": memfd_create failed: " + std::strerror(errno));
        // Ask for the full reservation; halve on refusal (address-space limits, ulimit -v).
        for (size_t len = kEmulatedArenaReserve; len >= (size_t(1) << 30); len /= 2) {
            void* dev = mmap(nullptr, len, PROT_NONE, MAP_SHARED | MAP_NORESERVE, a->m_fd, 0);
            if (dev == MAP_FAILED) continue;
            void* hv = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->m_fd, 0);
            if (hv == MAP_FAILED) {
                munmap(dev, len);
                continue;
            }
            a->m_dev = static_cast<char*>(dev);
            a->m_host = static_cast<char*>(hv);
            a->m_reserve = len;
            break;
        }
        if (!a->m_dev)
            return Status(ErrorCode::OutOfMemory, "emulated device " + std::to_string(device) +
                                                      ": could not reserve 1 GiB of address space for its memory");
        a->m_slot = registerArena(reinterpret_cast<uintptr_t>(a->m_dev), reinterpret_cast<uintptr_t>(a->m_host),
                                  a->m_reserve, device);
        if (a->m_slot < 0)
            return Status::unsupported("more than " + std::to_string(kMaxArenas) +
                                       " emulated devices alive in this process");
        return a;
    }

    ~Arena() {
        if (m_slot >= 0) unregisterArena(m_slot);
        if (m_dev) munmap(m_dev, m_reserve);
        if (m_host) munmap(m_host, m_reserve);
        if (m_fd >= 0) close(m_fd);
    }

    char* dev() const { return m_dev; }
    char* host() const { return m_host; }

    // Offset of a new block of `cls` bytes (fresh pages: zero), or an error.
    Result<size_t> carve(size_t cls) {
        const size_t align = cls >= 65536 ? kPage : 256;
        const size_t off = roundUp(m_top, align);
        if (off + cls > m_reserve)
            return Status(ErrorCode::OutOfMemory,
                          "emulated device " + std::to_string(m_device) + ": its " + formatBytes(int64_t(m_reserve)) +
                              " of address space are used up (" + formatBytes(int64_t(off)) +
                              " carved; freed blocks are reused only for the same size class)");
        if (off + cls > m_fileSize) {
            const size_t size = std::min(m_reserve, roundUp(off + cls, kGrowStep));
            if (ftruncate(m_fd, off_t(size)) != 0)
                return Status(ErrorCode::OutOfMemory, "emulated device " + std::to_string(m_device) +
                                                          ": growing its memory to " + formatBytes(int64_t(size)) +
                                                          " failed: " + std::strerror(errno));
            m_fileSize = size;
        }
        m_top = off + cls;
        return off;
    }

    // Gives the whole pages of [off, off+len) back to the system; they read as zero after.
    void release(size_t off, size_t len) {
        const size_t lo = roundUp(off, kPage), hi = (off + len) / kPage * kPage;
        if (hi > lo) (void)fallocate(m_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(lo), off_t(hi - lo));
    }

private:
    Arena() = default;
    int m_device = 0;
    int m_fd = -1;
    int m_slot = -1;
    char* m_dev = nullptr;
    char* m_host = nullptr;
    size_t m_reserve = 0;
    size_t m_fileSize = 0;
    size_t m_top = 0;
};

// 256-byte aligned size classes (cudaMalloc's alignment), else the CPU backend's classes.
size_t emuClass(size_t bytes) { return roundUp(host::sizeClass(bytes), 256); }

class EmuStream;

// ----- memory (shared by a device, its buffers and its streams) --------------------------------

struct FreeBlock {
    size_t off = 0;
    bool zero = false;  // reads as zero (fresh or punched): no memset needed
    bool held = true;   // holds pages (counted in `cached`)
};

// A freed block waits here until every stream of the device executed what was queued before
// the free: fences are (stream id, queued-item count to reach).
struct PendingBlock {
    size_t off = 0;
    size_t cls = 0;
    std::vector<std::pair<uint64_t, uint64_t>> fences;
};

struct EmuMem : host::GraphMemAccounting {
    static constexpr size_t kCacheCap = size_t(4) << 30;

    std::unique_ptr<Arena> arena;  // null when it could not be made (arenaError says why)
    Status arenaError;
    std::unordered_map<size_t, std::vector<FreeBlock>> ready;  // class -> reusable blocks
    std::deque<PendingBlock> pending;

    // Live streams of the device (for the fences); guarded by streamMutex, which is taken
    // after `mutex` when both are held.
    std::mutex streamMutex;
    std::map<uint64_t, EmuStream*> streams;
    uint64_t nextStreamId = 1;

    // The ops whose host code waited for one of the device's streams (a download, a
    // value-returning kernel), with how often: emulatedHostWaits().
    std::mutex waitsMutex;
    std::map<std::string, int64_t> hostWaits;

    EmuStream* captureStream = nullptr;  // the stream being captured into a graph (graph.h)

    std::vector<std::pair<uint64_t, uint64_t>> fencesNow();
    bool fencesPassed(const std::vector<std::pair<uint64_t, uint64_t>>& fences);

    // Caller holds `mutex`. Moves the pending blocks whose fences passed to the ready lists.
    void collectLocked() {
        for (auto it = pending.begin(); it != pending.end();) {
            if (!fencesPassed(it->fences)) {
                ++it;
                continue;
            }
            FreeBlock b{it->off, false, true};
            if (cachedBytes > kCacheCap) {  // over the cap: keep the address range, not the pages
                arena->release(b.off, it->cls);
                cachedBytes -= it->cls;
                b.held = false;
                b.zero = it->cls >= 65536;  // punched whole pages; small blocks keep a partial page
            }
            ready[it->cls].push_back(b);
            it = pending.erase(it);
        }
    }
};

class EmuDevice;

class EmuBuffer final : public Buffer {
public:
    EmuBuffer(EmuDevice& dev, std::shared_ptr<EmuMem> mem, size_t off, size_t bytes, MemCategory cat,
              uint64_t serial, bool fromPool)
        : m_device(dev), m_mem(std::move(mem)), m_off(off), m_bytes(bytes), m_cat(cat), m_serial(serial),
          m_fromPool(fromPool) {
        kernels::fp8codes::map().forget(data(), m_bytes);  // nothing bound before it was a Buffer
    }
    ~EmuBuffer() override;
    void* data() override { return m_mem->arena->dev() + m_off; }
    const void* data() const override { return m_mem->arena->dev() + m_off; }
    size_t bytes() const override { return m_bytes; }
    MemCategory category() const override { return m_cat; }
    Device& device() override;

private:
    EmuDevice& m_device;
    std::shared_ptr<EmuMem> m_mem;
    size_t m_off;
    size_t m_bytes;
    MemCategory m_cat;
    uint64_t m_serial;
    bool m_fromPool;  // handed out during a graph capture
};

// ----- streams ------------------------------------------------------------------------------

bool isCommunication(trace::Category c) { return c == trace::Category::Collective || c == trace::Category::P2P; }

// An op recorded by a capture (graph.h): its kernels (or a communication op's whole fn) and
// what the trace needs; launched again by EmuGraph.
struct RecordedOp {
    std::string name, group;
    OpDesc desc;  // name/group point into the strings above
    std::shared_ptr<const std::function<Status()>> fn;
};

class EmuStream final : public host::WorkerStream, public CapturableStream {
public:
    EmuStream(std::shared_ptr<EmuMem> mem, const TracePublisher& trace, trace::TrackKind kind, std::string name,
              int index)
        : WorkerStream(trace, kind, std::move(name), index), m_mem(std::move(mem)), m_tracePub(trace) {
        std::lock_guard<std::mutex> lock(m_mem->streamMutex);
        m_id = m_mem->nextStreamId++;
        m_mem->streams[m_id] = this;
    }
    ~EmuStream() override {
        stopWorker();  // drained: nothing queued here can use a freed block any more
        std::lock_guard<std::mutex> lock(m_mem->streamMutex);
        m_mem->streams.erase(m_id);
    }

    void submit(const OpDesc& desc, std::function<Status()> fn) override;
    Status synchronize() override;
    // As CUDA: dropped at once, a freed block waits for the work queued on every stream (fences).
    void keepUntilPassed(std::shared_ptr<const void>) override {}
    KernelLaunch kernelLaunch() const override {
        return t_submit && t_submit->stream == this ? KernelLaunch::Defer : KernelLaunch::NowHostView;
    }
    void deferKernel(std::function<void()> kernel) override {
        if (t_submit && t_submit->stream == this) {
            t_submit->kernels.push_back(std::move(kernel));
            return;
        }
        kernel();  // not inside one of this stream's submits (the dispatch never does this)
    }

    // The queued-item count that covers everything submitted so far, including the op being
    // submitted right now (whose item is queued when its fn returns).
    uint64_t fenceTarget() { return queuedCount() + (m_activeSubmits.load(std::memory_order_acquire) > 0 ? 1 : 0); }

    void record(Event& e) override {
        if (captureRefuses("record()")) return;
        WorkerStream::record(e);
    }
    void wait(Event& e) override {
        if (captureRefuses("wait()")) return;
        WorkerStream::wait(e);
    }

    // Stream graphs (graph.h).
    Status beginCapture() override;
    Result<std::unique_ptr<StreamGraph>> endCapture() override;
    bool capturing() const override { return m_capturing.load(std::memory_order_acquire); }
    // Zeroes `cls` bytes at host view `hv` in stream order of the capture: with the kernels of the
    // op being submitted on this thread when there is one, else as an item of its own.
    void recordZeroFill(void* hv, size_t cls);
    // Queues a recorded op (EmuGraph::launch), its trace labelled with `step`.
    void enqueueRecorded(const RecordedOp& op, int step);
    const std::shared_ptr<EmuMem>& mem() const { return m_mem; }

private:
    struct Capture {
        std::vector<RecordedOp> ops;
        Status error;  // the first: the capture fails with it
        std::shared_ptr<host::GraphPool> pool;
    };
    // While capturing: notes `what` as the capture's error (an event on a captured stream) and
    // returns true.
    bool captureRefuses(const char* what) {
        if (!capturing()) return false;
        captureFail(Status::unsupported(std::string("stream '") + name() + "': " + what +
                                        " of an event while the stream is captured into a graph: the graph would "
                                        "order work across streams, which stream graphs do not do yet"));
        return true;
    }
    void captureFail(Status s) {
        std::lock_guard<std::mutex> lock(m_captureMutex);
        if (m_capture && m_capture->error.isOk()) m_capture->error = std::move(s);
    }
    void captureRecord(const OpDesc& desc, std::function<Status()> fn) {
        RecordedOp op;
        op.name = desc.name ? desc.name : "";
        op.group = desc.group ? desc.group : "";
        op.desc = desc;
        op.fn = std::make_shared<const std::function<Status()>>(std::move(fn));
        std::lock_guard<std::mutex> lock(m_captureMutex);
        if (m_capture) m_capture->ops.push_back(std::move(op));
    }

    using WorkItem = host::WorkItem;

    // The op being submitted on this thread (innermost, for submits nested in a fn).
    struct SubmitCtx {
        EmuStream* stream = nullptr;
        const OpDesc* desc = nullptr;
        std::vector<std::function<void()>> kernels;
        int64_t segmentStart = 0;  // launch slice start of the next queued item
        SubmitCtx* prev = nullptr;
    };
    static thread_local SubmitCtx* t_submit;

    // Queues ctx's kernels so far as one traced item that then returns `status`.
    void flush(SubmitCtx& ctx, Status status) {
        if (capturing()) {
            if (!status.isOk())
                captureFail(status.withContext(std::string("op '") + (ctx.desc->name ? ctx.desc->name : "") +
                                               "' while capturing stream '" + name() + "'"));
            auto kernels = std::move(ctx.kernels);
            ctx.kernels.clear();
            captureRecord(*ctx.desc, [kernels = std::move(kernels)]() -> Status {
                for (const auto& k : kernels) k();
                return Status::ok();
            });
            return;
        }
        WorkItem item;
        host::Launch launch;
        auto kernels = std::move(ctx.kernels);
        ctx.kernels.clear();
        prepare(
            item, *ctx.desc,
            [kernels = std::move(kernels), status = std::move(status)]() -> Status {
                for (const auto& k : kernels) k();
                return status;
            },
            launch, ctx.segmentStart);
        enqueue(std::move(item));
        finishLaunch(launch);
        if (launch.recorder) ctx.segmentStart = monotonicNs();
    }

    std::shared_ptr<EmuMem> m_mem;
    const TracePublisher& m_tracePub;
    uint64_t m_id = 0;
    std::atomic<int> m_activeSubmits{0};
    std::atomic<bool> m_capturing{false};
    std::mutex m_captureMutex;
    std::unique_ptr<Capture> m_capture;  // guarded by m_captureMutex
};

thread_local EmuStream::SubmitCtx* EmuStream::t_submit = nullptr;

void EmuStream::submit(const OpDesc& desc, std::function<Status()> fn) {
    if (isCommunication(desc.category)) {  // queued whole, like an NCCL collective
        if (capturing()) {  // recorded whole, as NCCL's kernels are captured
            if (t_submit && t_submit->stream == this && !t_submit->kernels.empty()) flush(*t_submit, Status::ok());
            captureRecord(desc, std::move(fn));
            return;
        }
        WorkerStream::submit(desc, std::move(fn));
        return;
    }
    // Submitted from inside one of this stream's fns: the outer op's kernels so far go first.
    if (t_submit && t_submit->stream == this && !t_submit->kernels.empty()) flush(*t_submit, Status::ok());
    m_activeSubmits.fetch_add(1, std::memory_order_acq_rel);
    SubmitCtx ctx;
    ctx.stream = this;
    ctx.desc = &desc;
    ctx.segmentStart = m_tracePub.state() ? monotonicNs() : 0;
    ctx.prev = t_submit;
    Status st;
    if (!failed()) {  // a known failure skips later work, as on CUDA
        t_submit = &ctx;
        {
            CurrentStreamScope scope(this);
            try {
                st = fn();
            } catch (const std::exception& ex) {
                st = Status::internal(std::string("exception: ") + ex.what());
            } catch (...) {
                st = Status::internal("unknown exception");
            }
        }
        t_submit = ctx.prev;
        Status kernelError = takeKernelError();
        if (st.isOk()) st = std::move(kernelError);
    }
    flush(ctx, std::move(st));  // fails the stream in stream order when st is not ok
    m_activeSubmits.fetch_sub(1, std::memory_order_acq_rel);
}

Status EmuStream::synchronize() {
    if (capturing()) {
        const std::string op = t_submit && t_submit->desc->name ? t_submit->desc->name : "";
        Status s = Status::unsupported(
            "stream '" + name() + "': the host waited for the stream while it was captured into a graph" +
            (op.empty() ? std::string(" (outside any op)") : " (in op '" + op + "')") +
            ": a graph cannot contain a host wait; everything a captured op reads back must be read after "
            "the graph has run");
        captureFail(s);
        return s;
    }
    if (t_submit) {  // inside an op: its host code waits for the device (a sync on CUDA)
        std::lock_guard<std::mutex> lock(m_mem->waitsMutex);
        ++m_mem->hostWaits[t_submit->desc->name];
    }
    // Called from inside this stream's fn (a value-returning kernel): its kernels so far go first.
    if (t_submit && t_submit->stream == this && !t_submit->kernels.empty()) flush(*t_submit, Status::ok());
    return WorkerStream::synchronize();
}

// ----- stream graphs -------------------------------------------------------------------------

class EmuGraph final : public StreamGraph {
public:
    EmuGraph(std::shared_ptr<EmuMem> mem, std::vector<RecordedOp> ops, std::shared_ptr<host::GraphPool> pool)
        : m_mem(std::move(mem)), m_ops(std::move(ops)), m_pool(std::move(pool)) {}
    ~EmuGraph() override { releaseGraphPool(m_mem, m_pool); }

    Status launch(Stream& s, int step) override {
        auto* es = dynamic_cast<EmuStream*>(&s);
        if (!es || es->mem() != m_mem)
            return Status::invalid("a graph launches on a stream of the emulated device it was captured on; stream '" +
                                   s.name() + "' is not one");
        if (es->capturing())
            return Status::unsupported("stream '" + s.name() + "' is being captured: a graph launch inside a capture "
                                       "is not supported");
        for (const RecordedOp& op : m_ops) es->enqueueRecorded(op, step);
        return Status::ok();
    }
    int64_t nodes() const override { return int64_t(m_ops.size()); }
    int64_t poolBytes() const override {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        return m_pool->blockBytes;
    }

    // The pool's free blocks go back to the device's cache, once every
    // stream has run what was queued so far (this graph's launches).
    static void releaseGraphPool(const std::shared_ptr<EmuMem>& mem, const std::shared_ptr<host::GraphPool>& pool) {
        if (!pool) return;
        auto fences = mem->fencesNow();
        std::lock_guard<std::mutex> lock(mem->mutex);
        for (const host::PoolBlock& b : mem->graphs.release(pool)) {
            mem->reportCounter(b.cat, mem->releaseLocked(b.bytes, b.cat));
            mem->pending.push_back(PendingBlock{size_t(b.addr), b.cls, fences});
            mem->cachedBytes += b.cls;
        }
        mem->collectLocked();
    }

private:
    std::shared_ptr<EmuMem> m_mem;
    std::vector<RecordedOp> m_ops;
    std::shared_ptr<host::GraphPool> m_pool;
};

Status EmuStream::beginCapture() {
    if (failed()) return Status::invalid("stream '" + name() + "' has failed: it cannot be captured");
    {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        if (m_mem->captureStream)
            return Status::invalid("stream '" + name() + "': its device is already capturing stream '" +
                                   m_mem->captureStream->name() + "' into a graph (one capture per device at a time)");
        if (m_mem->graphs.anyLive())
            return Status::invalid("stream '" + name() +
                                   "': another graph of this device is alive; destroy it before capturing a new one "
                                   "(one graph per device: their pools do not share blocks yet)");
        m_mem->captureStream = this;
        m_mem->captureThread = std::this_thread::get_id();
        auto cap = std::make_unique<Capture>();
        cap->pool = m_mem->graphs.begin();
        std::lock_guard<std::mutex> c(m_captureMutex);
        m_capture = std::move(cap);
    }
    m_capturing.store(true, std::memory_order_release);
    return Status::ok();
}

Result<std::unique_ptr<StreamGraph>> EmuStream::endCapture() {
    if (!capturing()) return Status::invalid("stream '" + name() + "' is not being captured");
    std::unique_ptr<Capture> cap;
    {
        std::lock_guard<std::mutex> lock(m_mem->mutex);
        m_mem->graphs.end(m_mem->nextSerial);
        m_mem->captureStream = nullptr;
        m_mem->captureThread = std::thread::id();
        std::lock_guard<std::mutex> c(m_captureMutex);
        cap = std::move(m_capture);
        m_capturing.store(false, std::memory_order_release);
    }
    if (!cap->error.isOk()) {
        EmuGraph::releaseGraphPool(m_mem, cap->pool);
        return cap->error;
    }
    return std::unique_ptr<StreamGraph>(std::make_unique<EmuGraph>(m_mem, std::move(cap->ops), std::move(cap->pool)));
}

void EmuStream::recordZeroFill(void* hv, size_t cls) {
    auto zero = [hv, cls] { std::memset(hv, 0, cls); };
    if (t_submit && t_submit->stream == this) {
        t_submit->kernels.push_back(zero);
        return;
    }
    OpDesc d;
    d.name = "graph.alloc_zero";
    d.category = trace::Category::Memset;
    d.bytes = cls;
    captureRecord(d, [zero] {
        zero();
        return Status::ok();
    });
}

void EmuStream::enqueueRecorded(const RecordedOp& op, int step) {
    OpDesc d = op.desc;
    d.name = op.name.c_str();
    d.group = op.group.empty() ? nullptr : op.group.c_str();
    d.step = step;
    WorkItem item;
    host::Launch launch;
    auto fn = op.fn;
    prepare(item, d, [fn] { return (*fn)(); }, launch, m_tracePub.state() ? monotonicNs() : 0);
    enqueue(std::move(item));
    finishLaunch(launch);
}

std::vector<std::pair<uint64_t, uint64_t>> EmuMem::fencesNow() {
    std::vector<std::pair<uint64_t, uint64_t>> f;
    std::lock_guard<std::mutex> lock(streamMutex);
    f.reserve(streams.size());
    for (auto& [id, s] : streams) f.emplace_back(id, s->fenceTarget());
    return f;
}

bool EmuMem::fencesPassed(const std::vector<std::pair<uint64_t, uint64_t>>& fences) {
    if (fences.empty()) return true;
    std::lock_guard<std::mutex> lock(streamMutex);
    for (auto& [id, target] : fences) {
        auto it = streams.find(id);
        if (it == streams.end()) continue;  // destroyed: it drained its queue first
        if (it->second->doneCount() < target) return false;
    }
    return true;
}

// ----- device -------------------------------------------------------------------------------

class EmuDevice final : public Device {
public:
    EmuDevice(int index, int64_t memoryTotal) {
        m_info.backend = BackendKind::EmulatedDevice;
        m_info.index = index;
        m_info.name = "emulated:" + std::to_string(index);
        m_info.memoryTotal = memoryTotal;
        m_info.memoryFree = memoryTotal;
        m_mem = std::make_shared<EmuMem>();
        m_mem->deviceName = m_info.name;
        m_mem->trace = m_trace.atomic();
        auto arena = Arena::create(index);
        if (arena.isOk()) m_mem->arena = std::move(arena).value();
        else m_mem->arenaError = arena.status();
    }
    ~EmuDevice() override {
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
        if (!m_mem->arena) return m_mem->arenaError;
        const size_t cls = emuClass(bytes);
        int64_t current = 0;
        FreeBlock block;
        uint64_t serial = 0;
        EmuStream* capture = nullptr;
        {
            std::lock_guard<std::mutex> lock(m_mem->mutex);
            // Only the capturing thread's allocations are the graph's (other threads' work is not
            // being captured).
            if (m_mem->capturingThreadLocked()) capture = m_mem->captureStream;
            bool pooled = false;
            uintptr_t pooledOff = 0;
            TS_RETURN_IF_ERROR(m_mem->reserveNewLocked(bytes, cls, cat, &current, &serial, &pooled, &pooledOff));
            if (pooled) {
                block = FreeBlock{size_t(pooledOff), false, true};
            } else {
                m_mem->collectLocked();
                auto it = m_mem->ready.find(cls);
                if (it != m_mem->ready.end() && !it->second.empty()) {
                    block = it->second.back();
                    it->second.pop_back();
                    if (block.held) m_mem->cachedBytes -= cls;
                } else {
                    auto off = m_mem->arena->carve(cls);
                    if (!off) {
                        m_mem->releaseLocked(bytes, cat);
                        return off.status();
                    }
                    block = FreeBlock{*off, true, true};
                }
                if (capture) m_mem->graphs.adoptNew(cls);  // now part of the capture's pool
            }
        }
        if (capture) {
            // Captured: the graph zeroes it when it runs, in stream order (as a captured memset).
            if (zero) capture->recordZeroFill(m_mem->arena->host() + block.off, cls);
        } else if (zero && !block.zero) {
            std::memset(m_mem->arena->host() + block.off, 0, cls);
        }
        m_mem->reportCounter(cat, current);
        return std::unique_ptr<Buffer>(
            std::make_unique<EmuBuffer>(*this, m_mem, block.off, bytes, cat, serial, capture != nullptr));
    }

    std::unique_ptr<Stream> createStream(trace::TrackKind kind, const std::string& name) override {
        int index = 0;
        {
            std::lock_guard<std::mutex> lock(m_streamMutex);
            index = m_streamsPerKind[size_t(kind)]++;
        }
        return std::make_unique<EmuStream>(m_mem, m_trace, kind, name, index);
    }

    std::unique_ptr<Event> createEvent() override { return std::make_unique<HostEvent>(); }

    MemoryStats memoryStats() const override { return m_mem->snapshot(); }
    void resetPeak() override { m_mem->resetPeak(); }
    void setMemoryLimit(int64_t bytes) override { m_mem->setLimit(bytes); }

    bool supports(const std::string&) const override { return true; }  // every op of the CPU oracle

    void setTrace(trace::Recorder* rec, int rank) override { m_trace.set(rec, rank, m_info.index); }
    TraceTarget traceTarget() const override { return m_trace.target(); }

    std::map<std::string, int64_t> hostWaits() {
        std::lock_guard<std::mutex> lock(m_mem->waitsMutex);
        return m_mem->hostWaits;
    }

private:
    DeviceInfo m_info;
    std::shared_ptr<EmuMem> m_mem;
    std::mutex m_streamMutex;
    int m_streamsPerKind[8] = {};
    TracePublisher m_trace;
};

EmuBuffer::~EmuBuffer() {
    kernels::fp8codes::map().forget(data(), m_bytes);  // what was quantized into it
    // Fences first (takes the stream registry's lock, not the accounting lock).
    auto fences = m_mem->fencesNow();
    std::lock_guard<std::mutex> lock(m_mem->mutex);
    const size_t cls = emuClass(m_bytes);
    // A graph that may use the block keeps it, still counted (graph.h).
    if (m_mem->graphs.keep(host::PoolBlock{m_off, m_serial, cls, m_bytes, m_cat}, m_fromPool)) return;
    const int64_t current = m_mem->releaseLocked(m_bytes, m_cat);
    m_mem->reportCounter(m_cat, current);
    m_mem->pending.push_back(PendingBlock{m_off, cls, std::move(fences)});
    m_mem->cachedBytes += cls;
    m_mem->collectLocked();
}

Device& EmuBuffer::device() { return m_device; }

// ----- backend ------------------------------------------------------------------------------

class EmuBackend final : public Backend {
public:
    explicit EmuBackend(int n) {
        const long pages = sysconf(_SC_PHYS_PAGES);
        const long pageSize = sysconf(_SC_PAGE_SIZE);
        const int64_t ram = (pages > 0 && pageSize > 0) ? int64_t(pages) * pageSize : 0;
        const int count = n < 1 ? 1 : n;
        for (int i = 0; i < count; ++i) m_devices.push_back(std::make_unique<EmuDevice>(i, ram / count));
    }
    BackendKind kind() const override { return BackendKind::EmulatedDevice; }
    int deviceCount() const override { return int(m_devices.size()); }
    Device& device(int index) override { return *m_devices.at(size_t(index)); }

private:
    std::vector<std::unique_ptr<EmuDevice>> m_devices;
};

}  // namespace

void* hostAlias(const void* p) {
    const auto u = reinterpret_cast<uintptr_t>(p);
    if (const ArenaSlot* s = slotOfDevice(u))
        return reinterpret_cast<void*>(s->hostBegin.load(std::memory_order_relaxed) +
                                       (u - s->devBegin.load(std::memory_order_relaxed)));
    return const_cast<void*>(p);
}

std::map<std::string, int64_t> emulatedHostWaits(Device& device) {
    auto* emu = dynamic_cast<EmuDevice*>(&device);
    return emu ? emu->hostWaits() : std::map<std::string, int64_t>{};
}

bool isEmulatedDevicePointer(const void* p) { return slotOfDevice(reinterpret_cast<uintptr_t>(p)) != nullptr; }

bool isEmulatedHostView(const void* p) { return slotOfHost(reinterpret_cast<uintptr_t>(p)) != nullptr; }

std::unique_ptr<Backend> makeEmulatedDeviceBackend(int devices) { return std::make_unique<EmuBackend>(devices); }

namespace {
bool envIsOne(const char* name) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, "1") == 0;
}
}  // namespace

bool unverifiedCudaRequested() {
    static const bool requested = envIsOne("TS_CUDA_UNVERIFIED");
    return requested;
}

bool hostSyncCollectivesRequested() {
    static const bool requested = envIsOne("TS_HOST_SYNC_COLLECTIVES");
    return requested;
}

bool emulatedDeviceRequested() {
    static const bool requested = envIsOne("TS_EMULATE_DEVICE");
    return requested;
}

}  // namespace ts::engine
