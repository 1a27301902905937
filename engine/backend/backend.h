// The device cut (DESIGN.md "Engine / Backends"), shaped so CUDA and NCCL fit unchanged:
//   Backend -> Device -> Stream (ordered async work, record/wait Event) -> Buffer (tracked).
// CPU backend: each rank is a virtual device; every Stream is a worker thread executing its
// queue in order, so compute/communication overlap is real. CUDA backend: Stream wraps a
// cudaStream_t and submit() runs the launcher immediately on the calling thread (it enqueues
// kernels on native()). Emulated device (emulated_backend.h): CPU threads with CUDA's execution
// model and memory that host code cannot touch, so device-only code is tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/recorder.h"
#include "common/status.h"

namespace ts::engine {

using trace::MemCategory;

enum class DType : uint8_t { F32 = 0, BF16, F16, FP8E4M3, FP8E5M2, I32, I64, U8 };
size_t dtypeSize(DType t);
const char* dtypeName(DType t);

// EmulatedDevice: makeEmulatedDeviceBackend. Its own kind so that run metadata and traces never
// pass an emulated run off as a CPU one; code that needs to know whether kernels run on a device
// asks kern::onDevice() (true on CUDA and emulated streams), not the kind.
enum class BackendKind : uint8_t { Cpu = 0, Cuda, EmulatedDevice };
const char* backendName(BackendKind k);

// Memory accounting per category; current and peak bytes (peak since last resetPeak()).
struct MemoryStats {
    int64_t current[size_t(MemCategory::Count)] = {};
    int64_t peak[size_t(MemCategory::Count)] = {};
    int64_t currentTotal = 0;
    int64_t peakTotal = 0;
    int64_t cached = 0;  // freed blocks a caching allocator keeps for reuse (not in current)
};

class Device;

// Owns device memory. Freed (and un-accounted) on destruction.
class Buffer {
public:
    virtual ~Buffer() = default;
    virtual void* data() = 0;
    virtual const void* data() const = 0;
    virtual size_t bytes() const = 0;
    virtual MemCategory category() const = 0;
    virtual Device& device() = 0;
    template <typename T> T* as() { return static_cast<T*>(data()); }
    template <typename T> const T* as() const { return static_cast<const T*>(data()); }
};

// What the trace needs to know about a unit of work submitted to a stream.
struct OpDesc {
    const char* name = "";          // kernel/collective name, e.g. "linear_fc1.fwd"
    trace::Category category = trace::Category::Other;
    double flops = 0;
    uint64_t bytes = 0;
    const char* group = nullptr;    // process-group name for comm ops
    int32_t step = -1, microbatch = -1, chunk = -1, layer = -1;
};

class Event {
public:
    virtual ~Event() = default;
    virtual bool query() = 0;          // completed?
    virtual void synchronize() = 0;    // host waits
};

class Stream {
public:
    virtual ~Stream() = default;
    // Enqueue work. CPU: fn runs later on this stream's thread, in submission order.
    // CUDA: fn runs now on the caller's thread and must only enqueue on native().
    // A failing fn returns a non-ok Status: the stream becomes failed, later work is skipped,
    // and synchronize() returns that Status.
    virtual void submit(const OpDesc& desc, std::function<Status()> fn) = 0;
    virtual void record(Event& e) = 0;     // e completes when all work submitted so far did
    // Keeps `owner` (buffers that work submitted so far reads or writes through raw pointers,
    // such as a collective's) alive until that work no longer needs it, and no longer. CPU:
    // dropped on the stream's thread when it gets there. CUDA and the emulated device: dropped
    // now, since a freed block is reused only after the work pending on every stream then.
    virtual void keepUntilPassed(std::shared_ptr<const void> owner) {
        OpDesc d;
        d.name = "keep";
        submit(d, [owner = std::move(owner)] { return Status::ok(); });
    }
    virtual void wait(Event& e) = 0;       // work submitted after this waits for e
    virtual Status synchronize() = 0;      // host waits for all submitted work
    virtual void* native() = 0;            // cudaStream_t on CUDA, nullptr on CPU
    virtual trace::TrackKind kind() const = 0;
    virtual const std::string& name() const = 0;

    // How the kernel dispatch (kernels.h) runs a kernel launched on this thread while this
    // stream is current (currentStream()). Only the emulated device overrides these.
    enum class KernelLaunch : uint8_t {
        Now,          // run it on the calling thread with the pointers as given (CPU)
        NowHostView,  // run it now, pointers through hostAlias (emulated stream's worker thread)
        Defer,        // hand it to deferKernel, pointers through hostAlias (emulated submit)
    };
    virtual KernelLaunch kernelLaunch() const { return KernelLaunch::Now; }
    // A kernel over host-view pointers, to run on this stream after everything queued before it
    // (the emulated stream queues it; CUDA streams enqueue natively instead).
    virtual void deferKernel(std::function<void()> kernel) { kernel(); }
};

struct DeviceInfo {
    BackendKind backend = BackendKind::Cpu;
    int index = 0;               // CPU: the virtual device; CUDA: the GPU's ordinal (ranks sharing a
                                 // GPU, makeSharedCudaBackend, have the same)
    std::string name;            // "cpu:0 (virtual)", "NVIDIA H100 80GB HBM3"
    int64_t memoryTotal = 0;     // bytes (CPU: physical RAM / devices)
    int64_t memoryFree = 0;
    double peakTflopsFp32 = 0;   // for MFU; 0 = unknown (resources/peak_flops.json by name)
    double peakTflopsBf16 = 0;
    // CUDA only (0 on the CPU backend): streaming multiprocessors, compute capability.
    int smCount = 0;
    int computeCapabilityMajor = 0;
    int computeCapabilityMinor = 0;
};

// Where a device's trace goes (see setTrace). `generation` is unique per setTrace() call in
// the process, so caches keyed by it never confuse two recorders that share an address.
struct TraceTarget {
    trace::Recorder* recorder = nullptr;
    int rank = 0;
    int device = 0;
    uint64_t generation = 0;
    // Ranges are also NVTX ranges (CUDA devices, traced or not: Nsight Systems shows the step /
    // microbatch / layer structure of any run).
    bool nvtx = false;
};

class Device {
public:
    virtual ~Device() = default;
    virtual const DeviceInfo& info() const = 0;
    // Allocation with accounting. Memory is zero-initialized on the CPU backend.
    virtual Result<std::unique_ptr<Buffer>> allocate(size_t bytes, MemCategory cat) = 0;
    // Same accounting, contents unspecified: for buffers the first kernel fully overwrites.
    virtual Result<std::unique_ptr<Buffer>> allocateUninitialized(size_t bytes, MemCategory cat) {
        return allocate(bytes, cat);
    }
    virtual std::unique_ptr<Stream> createStream(trace::TrackKind kind, const std::string& name) = 0;
    virtual std::unique_ptr<Event> createEvent() = 0;
    virtual MemoryStats memoryStats() const = 0;
    virtual void resetPeak() = 0;
    // Memory limit for this device (bytes, 0 = none); allocate() fails with OutOfMemory past it.
    virtual void setMemoryLimit(int64_t bytes) = 0;
    virtual bool supports(const std::string& op) const = 0;
    // Trace identity: global rank this device serves, recorder (may be null).
    virtual void setTrace(trace::Recorder* rec, int rank) = 0;
    // The current trace target (recorder null = tracing off). Used by RangeScope.
    virtual TraceTarget traceTarget() const { return {}; }
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual BackendKind kind() const = 0;
    virtual int deviceCount() const = 0;
    virtual Device& device(int index) = 0;
};

// The stream whose op this thread is running: a Stream implementation sets it around each fn
// it runs (CUDA: submit() on the caller's thread; CPU: its worker thread), so the kernel
// dispatch (engine/backend/kernels.h) launches on that stream. Null outside an op.
Stream* currentStream();
class CurrentStreamScope {
public:
    explicit CurrentStreamScope(Stream* s);
    ~CurrentStreamScope();
    CurrentStreamScope(const CurrentStreamScope&) = delete;
    CurrentStreamScope& operator=(const CurrentStreamScope&) = delete;

private:
    Stream* m_prev;
};
// A kernel launched through the dispatch inside an op failed to launch (CUDA: bad launch,
// cuBLAS error). Kept for the op: the stream running it takes it after fn returns
// (takeKernelError) and fails like a fn returning that Status. The first error of an op wins.
void reportKernelError(const Status& s);
Status takeKernelError();

// CPU backend with `virtualDevices` ranks (each a virtual device).
std::unique_ptr<Backend> makeCpuBackend(int virtualDevices);
// Emulated device backend with `devices` devices (emulated_backend.h): buffers whose data() host
// code cannot dereference (SIGSEGV), streams whose submit() runs fn at once and queue its kernels.
std::unique_ptr<Backend> makeEmulatedDeviceBackend(int devices);
// Where kernels and communicators running on the host reach emulated device memory: for a
// pointer into an emulated device's memory (interior pointers too) the same byte in its host
// view; any other pointer unchanged (identity on the CPU and CUDA backends).
void* hostAlias(const void* p);
// True for a pointer into an emulated device's memory as Buffer::data() hands it out.
bool isEmulatedDevicePointer(const void* p);
// True for a pointer into an emulated device's host view (what hostAlias returns for it).
bool isEmulatedHostView(const void* p);
// The environment asks for the emulated device (TS_EMULATE_DEVICE=1, read here only, once):
// the default of TrainerOptions::emulateDevice and ParallelTrainerOptions::emulateDevice, so any
// test or run can be repeated under emulation.
bool emulatedDeviceRequested();
// CUDA backend (engine/backend/cuda/cuda_backend.h): one Device per visible GPU. Unsupported,
// with the cause and what to do, when not built with CUDA, without a driver, or when no device
// is visible (none installed, CUDA_VISIBLE_DEVICES empty).
Result<std::unique_ptr<Backend>> makeCudaBackend();
// CUDA backend of `devices` Devices over the visible GPUs, device i on GPU i % count: several
// ranks on one GPU, to check a layout on fewer GPUs than it has ranks (NCCL refuses two members of
// one group on a GPU). Each Device keeps its own caching allocator, accounting and streams, as a
// rank's GPU would; its memory total is its GPU's divided among the devices on it. Buffers are
// CUDA managed memory, so the in-process communicator reaches them from the host once the stream
// that wrote them has finished (hostSynchronized, communicator.h). Timings of such a run are not
// a real layout's: the ranks share the GPU, and collectives go through host memory. Unsupported
// where makeCudaBackend is, for devices < 1, and on a GPU without concurrent managed access.
Result<std::unique_ptr<Backend>> makeSharedCudaBackend(int devices);

// How the visible GPUs reach each other, from the CUDA runtime's peer attributes (NVML is not
// used: the toolkit ships no header for it and the driver's library may be absent). Link kinds,
// as `nvidia-smi topo -m` would group them:
//   NVLink  peer access with native atomics (cudaDevP2PAttrNativeAtomicSupported): NVLink or
//           NVSwitch; PCIe peer access has no native atomics
//   PCIe    peer access without native atomics (through a PCIe switch or the root complex)
//   host    no peer access: NCCL goes through host memory (SHM) or the network
struct GpuPeerLink {
    bool p2p = false;
    bool nativeAtomics = false;
    int performanceRank = -1;  // cudaDevP2PAttrPerformanceRank: lower is faster; -1 unknown
    const char* kind() const { return !p2p ? "host" : nativeAtomics ? "NVLink" : "PCIe"; }
};
struct GpuTopology {
    std::vector<std::string> pciBusIds;             // per device: "0000:19:00.0"
    std::vector<int> numaNodes;                     // per device (sysfs), -1 unknown
    std::vector<std::vector<GpuPeerLink>> links;    // [i][j], i != j ([i][i] unused)
    int count() const { return int(pciBusIds.size()); }
};
// Unsupported where makeCudaBackend is.
Result<GpuTopology> probeGpuTopology();
// The matrix `devices` prints: a row per GPU with the link kind to every other ("X" on the
// diagonal), its PCI bus id and NUMA node, then the legend.
std::string formatGpuTopology(const GpuTopology& t);
// Tensor-parallel groups (CUDA device ordinals of each group's ranks) whose members do not all
// reach each other over NVLink: one line each, naming the pair and the link (TP's collectives
// run on every layer, so Megatron keeps a TP group inside an NVLink domain).
std::vector<std::string> tpTopologyWarnings(const GpuTopology& t, const std::vector<std::vector<int>>& tpGroups);
// The environment opts in to layouts over several GPUs before they have been checked against the
// CPU backend on a machine with several (TS_CUDA_UNVERIFIED=1, read once): the default of
// TrainerOptions / ParallelTrainerOptions::allowUnverifiedCuda. One GPU needs no opt-in.
bool unverifiedCudaRequested();
// The environment asks for host-synchronized collectives on every backend
// (TS_HOST_SYNC_COLLECTIVES=1, read once): the default of
// ParallelTrainerOptions::hostSyncCollectives, so the CPU suite can check the order a
// shared-GPU run (which always synchronizes) puts collectives in.
bool hostSyncCollectivesRequested();

}  // namespace ts::engine
