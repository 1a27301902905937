// Internal to the profiler analyses: one rank's trace loaded once into compact arrays, so the
// report computes every per-step metric from memory instead of re-querying SQLite.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "profiler/analysis.h"
#include <cstdint>

namespace ts::profiler::detail {

// A device-stream kernel (anything on a non-host track that is not a Range/Launch slice).
struct Kernel {
    int64_t start = 0, end = 0;
    uint32_t track = 0, name = 0, group = 0;
    trace::Category category = trace::Category::Other;
    KernelClass cls = KernelClass::Compute;  // under the report's Definitions
    bool wait = false;                       // a cuda_sync wait row (isGpuWaitName), not a kernel
    int32_t microbatch = -1, chunk = -1;
    uint64_t correlation = 0, bytes = 0;
    double flops = 0;
};

struct HostSlice {
    int64_t start = 0, end = 0;
    uint32_t name = 0;
    trace::Category category = trace::Category::Other;
    int32_t step = -1;
    uint64_t correlation = 0;
    uint32_t group = 0;  // imported host ops that name a GPU stream: "stream N"
};

// Class of every interned name under one set of Definitions, computed once per report:
// per-kernel classification is then an array lookup.
struct NameClasses {
    Definitions defs;
    std::vector<KernelClass> htaClass;  // by string id (htaKernelClasses only)
    std::vector<uint8_t> wait;          // by string id: isGpuWaitName
    std::vector<uint8_t> streamGroup;   // by string id: "stream N" (a host op's GPU stream)
    std::vector<uint8_t> profilerStep;  // by string id: "ProfilerStep#N"
    std::vector<uint8_t> stepRange;     // by string id: "step N" / "step" / "ProfilerStep#N"
    // Rounding to whole us happens on the trace's absolute clock (stored ts + this origin,
    // metadata "import.time_origin_unix_ns"), where the source's us grid lies.
    int64_t originNs = 0;
    KernelClass classOf(trace::Category c, uint32_t name) const;
};
NameClasses nameClasses(const std::vector<std::string>& strings, const Definitions& defs, int64_t originNs = 0);
// nameClasses with the origin read from the store's metadata.
Result<NameClasses> nameClassesFor(TraceStore& store, const std::vector<std::string>& strings, const Definitions& defs);

struct RankData {
    int rank = 0;
    std::vector<TrackRow> tracks;      // this rank's tracks
    std::vector<Kernel> kernels;       // sorted by (track, start)
    std::vector<HostSlice> host;       // host-track slices, sorted by (track, start)
    std::vector<Interval> computeStreamBusy;  // raw slices of Compute-kind tracks (for bubbles)
    std::vector<HostSlice> gpuRanges;  // Range slices on device tracks (gpu_user_annotation copies)
    std::vector<Kernel> hostStreamOps; // host ops naming a GPU stream, as kernels (HTA counts them)
    bool htaFiltered = false;          // the HTA last-profiler-step filter was applied
    // Built by indexRank(): kernels by start time and whole-trace merged sets, so per-step
    // metrics binary-search and clip instead of rescanning every kernel of the rank.
    bool indexed = false;
    std::vector<Kernel> byStart;
    int64_t maxKernelDur = 0;
    IntervalSet computeSet, commSet, computeStreamSet;
};

void indexRank(RankData& d);
// Kernels that may overlap [from, to) (start in [from - maxKernelDur, to)), by start; needs indexRank.
std::pair<const Kernel*, const Kernel*> kernelsNear(const RankData& d, int64_t from, int64_t to);

// Loads one rank's slices under the classes' Definitions (HTA: inward us rounding).
Result<RankData> loadRank(TraceStore& store, int rank, const NameClasses& classes);
// HTA's trace filter (hta/common/trace.py _filter_irrelevant_gpu_kernels): when the rank has
// profiler steps ("ProfilerStep#N" ranges; in imported traces also "step N"), keep only kernels whose correlation id matches a host slice that
// started before the last ProfilerStep started (or, with a single step, ended by its end).
// Skipped when the importer already did it (metadata "import.dropped_last_step" = "1" or
// stats "import.dropped_last_step_slices" > 0). Returns the kernels HTA's numbers use.
struct HtaContext {
    bool importerDropped = false;  // the importer already applied the filter
    bool imported = false;         // metadata "import.source" present (nsys / Kineto trace)
};
// timeOrder: filter d.byStart (needs indexRank) instead of d.kernels ((track, start) order).
// forIdle: without the host ops that name a stream (HTA's idle breakdown takes GPU activity
// categories only).
std::vector<Kernel> htaKernels(const RankData& d, const NameClasses& classes, const HtaContext& ctx,
                               bool timeOrder = false, bool forIdle = false);
// Same without copying: returns the rank's own vector when nothing is filtered, else storage.
const std::vector<Kernel>& htaKernelsRef(const RankData& d, const NameClasses& classes, const HtaContext& ctx,
                                         bool timeOrder, std::vector<Kernel>& storage, bool forIdle = false);
Result<HtaContext> htaContext(TraceStore& store);

IntervalSet classSet(const std::vector<Kernel>& ks, KernelClass cls, int64_t from = INT64_MIN,
                     int64_t to = INT64_MAX);
IntervalSet allKernelSet(const std::vector<Kernel>& ks, int64_t from = INT64_MIN, int64_t to = INT64_MAX);

OverlapResult overlapOf(const std::vector<Kernel>& ks, int64_t from = INT64_MIN, int64_t to = INT64_MAX);
TemporalBreakdown temporalOf(const std::vector<Kernel>& ks);
IdleBreakdown idleOf(const RankData& d, const std::vector<Kernel>& ks, int64_t from, int64_t to, const Definitions& defs);
std::vector<CommGroupStat> commOf(const RankData& d, const std::vector<std::string>& strings, int64_t from, int64_t to);
KernelBreakdown kernelsOf(const std::vector<Kernel>& ks, const std::vector<std::string>& strings, int topN,
                          int64_t from, int64_t to);
std::vector<StepWindow> stepsOf(const RankData& d, const std::vector<std::string>& strings);
double bubbleTheory(const std::map<std::string, std::string>& meta);
BubbleResult bubbleOf(const RankData& d, const StepWindow& w, double theory);
CriticalPath criticalPathOf(const std::vector<const RankData*>& ranks, const std::vector<std::string>& strings,
                            const std::vector<StepWindow>& windows, size_t maxEntries);

}  // namespace ts::profiler::detail
