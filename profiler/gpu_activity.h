// GPU activity -> trace rows, without CUPTI. The CUPTI glue (profiler/cupti/) copies each
// CUPTI activity record into one of the plain structs below and hands it to an
// ActivityConverter, which writes tracks and slices through trace::Recorder exactly as the CPU
// backend does. Keeping this part free of CUPTI types lets tests/profiler run it on machines
// without a GPU (tests/profiler/test_cupti_convert.cpp).
//
// Rows written (docs/profiler.md "CUDA capture"):
//   kernels, memcpy, memset  -> slices on one track per (device, stream); track kind from the
//                               stream's content (only NCCL collectives -> Comm, only NCCL
//                               send/recv -> P2P, only copies -> Copy, else Compute), the rule
//                               the importers use (profiler/import/staging.cpp)
//   runtime / driver API     -> slices on the calling thread's HostThread track; launches
//                               (kernel/memcpy/memset APIs) have category Launch
//   NVTX push/pop, start/end -> Range slices on the HostThread track of the thread that opened them
// A host API slice and the device work it launched carry the same Slice.correlation.
//
// Timestamps: records carry CUPTI's timestamps (cuptiGetTimestamp's clock). Records are staged
// in that clock and converted to the host clock (common/clock.h) when flush() emits them, with
// the ClockAlignment in effect then, so a collector can refine the alignment (a second offset
// sample at stop) before anything is written.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/recorder.h"

namespace ts::profiler::gpu {

// Same numbering as CUPTI's CUpti_ActivityMemcpyKind (A = CUDA array).
enum class MemcpyKind : uint8_t {
    Unknown = 0, HtoD = 1, DtoH = 2, HtoA = 3, AtoH = 4, AtoA = 5, AtoD = 6, DtoA = 7, DtoD = 8,
    HtoH = 9, PtoP = 10,
};
const char* memcpyKindName(MemcpyKind k);  // "HtoD", ... "Unknown"

// Fields of CUpti_ActivityKernel* we use. Times in CUPTI ns.
struct KernelRecord {
    uint64_t startNs = 0, endNs = 0;
    uint32_t deviceId = 0, contextId = 0, streamId = 0, correlationId = 0;
    std::string name;  // as CUPTI reports it (mangled for C++ kernels)
    std::array<int32_t, 3> grid{}, block{};
    int32_t sharedMemBytes = 0;  // static + dynamic
};

struct MemcpyRecord {
    uint64_t startNs = 0, endNs = 0;
    uint32_t deviceId = 0, contextId = 0, streamId = 0, correlationId = 0;
    uint64_t bytes = 0;
    MemcpyKind kind = MemcpyKind::Unknown;
};

struct MemsetRecord {
    uint64_t startNs = 0, endNs = 0;
    uint32_t deviceId = 0, contextId = 0, streamId = 0, correlationId = 0;
    uint64_t bytes = 0;
    uint32_t value = 0;
};

// CUpti_ActivityAPI (runtime or driver domain).
struct ApiRecord {
    uint64_t startNs = 0, endNs = 0;
    uint32_t processId = 0, threadId = 0, correlationId = 0;
    std::string name;  // callback name, e.g. "cudaLaunchKernel_v7000" (the _vNNNN suffix is dropped)
    bool driver = false;
};

// CUpti_ActivityMarker2: an NVTX range is a Start record and an End record with the same id
// (the End has no name); an Instant record is a point (nvtxMark).
enum class MarkerPhase : uint8_t { Instant, Start, End };
struct MarkerRecord {
    uint64_t tsNs = 0;
    uint32_t id = 0;
    MarkerPhase phase = MarkerPhase::Instant;
    uint32_t processId = 0, threadId = 0;  // objectKind THREAD; 0 when not a thread object
    std::string name, domain;
};

// ---- clock alignment
// One simultaneous reading of both clocks: gpuNs was read while the host clock went from
// hostNs - uncertaintyNs to hostNs + uncertaintyNs.
struct ClockSample {
    int64_t hostNs = 0;
    int64_t gpuNs = 0;
    int64_t uncertaintyNs = 0;
    int64_t offsetNs() const { return hostNs - gpuNs; }  // host = gpu + offset
};

// Reads host, gpu, host `rounds` times and keeps the round with the narrowest host bracket
// (least preempted); hostNs is that bracket's midpoint.
ClockSample sampleClocks(const std::function<int64_t()>& hostNow, const std::function<int64_t()>& gpuNow,
                         int rounds = 7);

// host(g) = g + offset(g), offset linear in g through the two samples (drift correction);
// constant with one sample; identity by default. Outside the samples' span the line is extended.
class ClockAlignment {
public:
    ClockAlignment() = default;
    static ClockAlignment fromSample(const ClockSample& s);
    static ClockAlignment fromSamples(const ClockSample& first, const ClockSample& last);

    int64_t toHost(int64_t gpuNs) const;
    int64_t offsetAt(int64_t gpuNs) const;
    double driftPpm() const { return m_slope * 1e6; }  // us the host clock gains per s of GPU time
    const ClockSample& first() const { return m_first; }
    const ClockSample& last() const { return m_last; }
    bool twoPoint() const { return m_twoPoint; }
    // {"first":{"host_ns","gpu_ns","offset_ns","uncertainty_ns"},"last":{...},"drift_ppm":...}
    std::string toJson() const;

private:
    ClockSample m_first, m_last;
    double m_slope = 0;  // d(offset)/d(gpu)
    bool m_twoPoint = false;
};

// C++ ABI demangling ("_Z9addKernelPfS_" -> "addKernel(float*, float*)"); the input when it is
// not a mangled name.
std::string demangle(const std::string& name);
// Drops CUPTI's "_vNNNN" version suffix: "cudaLaunchKernel_v7000" -> "cudaLaunchKernel".
std::string_view apiBaseName(std::string_view name);
// Whether a runtime/driver API call launches device work (category Launch on the host track).
bool isLaunchApi(std::string_view baseName);

// Correlation ids in the run: CUPTI's are per process, 32-bit; the engine's come from
// Recorder::nextCorrelation() (small counters). A CUPTI id c of rank r becomes
// 2^62 | r << 32 | c, disjoint from the engine's ids and from other ranks' CUPTI ids, with
// no table to keep. 0 stays 0 (no correlation).
uint64_t runCorrelation(int32_t rank, uint32_t cuptiCorrelation);

// Not thread-safe (the CUPTI glue serialises calls); only flush()/finish() call the recorder.
class ActivityConverter {
public:
    struct Options {
        int32_t rank = 0;              // host thread tracks and correlation ids (one per process)
        int32_t hostDevice = 0;        // TrackDesc.device of host thread tracks
        bool keepAllDriverApi = false; // false: only driver launch/memcpy/memset calls (the rest is noise)
        // Global rank of each CUDA device's work (index = device id of the records): a process
        // running one rank per GPU. Devices past its end (or all, when empty) are `rank`'s.
        std::vector<int32_t> rankOfDevice;
    };
    struct Stats {
        int64_t kernels = 0, memcpys = 0, memsets = 0, apiCalls = 0, ranges = 0, instants = 0;
        int64_t filteredDriverApi = 0;  // driver calls not kept (keepAllDriverApi=false)
        int64_t malformed = 0;          // end < start or zero timestamps
        int64_t unmatchedRangeEnds = 0; // End marker whose Start was never seen
        int64_t openRanges = 0;         // Start markers still open at finish()
        int64_t droppedByCupti = 0;     // records CUPTI reported as dropped (buffers full)
    };

    explicit ActivityConverter(trace::Recorder& rec);
    ActivityConverter(trace::Recorder& rec, const Options& options);

    void setClock(const ClockAlignment& clock) { m_clock = clock; }
    const ClockAlignment& clock() const { return m_clock; }
    // API calls and ranges of this OS thread go to an existing host track (e.g. the engine's
    // "rank R host" track) instead of a new "rank R thread T" track.
    void bindHostThread(uint32_t threadId, uint32_t track);
    // The work of CUDA stream `stream` (CUPTI's stream id) on `device` goes to a track of this
    // kind named "rank R <name>", as the CPU backend names its streams ("rank 0 compute", "rank 0
    // dp_comm"), instead of a track named by stream id with its kind guessed from its content.
    // Takes effect for a stream whose track is not registered yet (before its first flush).
    // `rank` >= 0: the stream works for that rank (ranks sharing a GPU); else rankOfDevice's.
    void nameStream(uint32_t device, uint32_t stream, trace::TrackKind kind, std::string name, int32_t rank = -1);
    int32_t rankOfDevice(uint32_t device) const;

    // Staging (no rows written yet). Records may come in any order and from several buffers.
    void add(const KernelRecord& r);
    void add(const MemcpyRecord& r);
    void add(const MemsetRecord& r);
    void add(const ApiRecord& r);
    void add(const MarkerRecord& r);
    void addDropped(uint64_t n) { m_stats.droppedByCupti += static_cast<int64_t>(n); }

    // Converts everything staged with the current clock and writes it. New stream tracks are
    // registered here, their kind decided from the staged slices of that stream (a track keeps
    // its kind afterwards). NVTX ranges still open stay pending.
    void flush();
    // flush(), then counts still-open ranges and writes run metadata: "cupti.clock"
    // (ClockAlignment::toJson) and "cupti.stats".
    void finish();

    const Stats& stats() const { return m_stats; }
    std::string statsJson() const;

private:
    struct Staged {
        trace::Slice slice;       // until emitted: name is a local id, track unused, times in CUPTI ns
        uint64_t streamKey = 0;   // device stream (device << 32 | stream) or host thread id
        bool host = false;
    };
    struct OpenRange {
        uint64_t startNs = 0;
        uint32_t threadId = 0;
        int32_t depth = 0;
        std::string name;
    };
    void stageDevice(uint32_t device, uint32_t stream, uint64_t start, uint64_t end, trace::Slice s);
    void stageHost(uint32_t threadId, uint64_t start, uint64_t end, trace::Slice s);
    uint32_t hostTrack(uint32_t threadId);
    struct StreamName {
        trace::TrackKind kind;
        std::string name;
        int32_t rank = -1;
    };
    std::map<uint64_t, StreamName> m_streamNames;  // device << 32 | stream
    // add() may run on CUPTI's thread while the owner uses the recorder: names are interned
    // locally and only flush() talks to the recorder.
    uint32_t localName(std::string_view text);
    uint32_t recorderName(uint32_t localId);
    int32_t openDepth(uint32_t threadId) const;

    trace::Recorder& m_rec;
    Options m_opt;
    ClockAlignment m_clock;
    std::vector<Staged> m_staged;
    std::unordered_map<uint64_t, uint32_t> m_streamTracks;  // device << 32 | stream -> track
    std::unordered_map<uint32_t, uint32_t> m_hostTracks;    // OS thread id -> track
    std::map<uint32_t, OpenRange> m_open;                   // NVTX marker id -> open range
    std::vector<std::string> m_localNames;               // local name id -> text
    std::unordered_map<std::string, uint32_t> m_localIds;
    std::vector<uint32_t> m_localToRec;                  // local name id -> recorder id (0 = not yet)
    // raw kernel name -> (interned demangled name, category)
    std::unordered_map<std::string, std::pair<uint32_t, trace::Category>> m_names;
    Stats m_stats;
};

}  // namespace ts::profiler::gpu
