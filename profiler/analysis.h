// Analyses over a run's trace: the functions that explain a step. Every definition is stated
// next to its function and in docs/profiler.md; they follow Holistic Trace Analysis (HTA)
// where HTA defines the metric. All analyses stream slices ordered by (track, ts) and work
// on merged interval lists in C++ (no SQL self-joins), so a 10M-slice trace takes seconds.
//
// Slice classes (by Category, only slices on device-stream tracks, i.e. not HostThread):
//   communication = Collective | P2P
//   non-compute   = Memcpy | Memset
//   compute       = every other kernel category (Gemm ... Optimizer, Other)
//   Range / Launch slices are never kernels.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/peak_flops.h"
#include "common/recorder.h"
#include "common/status.h"
#include "profiler/store.h"

namespace ts::profiler {

// ---- interval algebra (half-open [start, end) in ns). Exposed for tests and other analyses.
struct Interval {
    int64_t start = 0, end = 0;
    bool operator==(const Interval&) const = default;
};
using IntervalSet = std::vector<Interval>;  // sorted, disjoint, non-empty intervals
// Sorts and merges overlapping or touching intervals; drops empty ones.
IntervalSet mergeIntervals(std::vector<Interval> intervals);
int64_t totalLength(const IntervalSet& a);
IntervalSet intersectSets(const IntervalSet& a, const IntervalSet& b);
IntervalSet subtractSets(const IntervalSet& a, const IntervalSet& b);  // a \ b
IntervalSet clipSet(const IntervalSet& a, int64_t from, int64_t to);

enum class KernelClass { NotKernel, Compute, Communication, NonCompute };
KernelClass classify(trace::Category c);

// ---- definitions: the rules every analysis below follows, chosen once per report and passed
// through (never per-analysis flags). Two sets: trainscope's own (the default) and HTA's
// defaults (Holistic Trace Analysis 0.5, so a user can check our numbers against the tool they
// know). docs/profiler.md lists each difference and why ours differs.
struct Definitions {
    enum class Set { Trainscope, Hta };
    Set set = Set::Trainscope;
    // HTA rounds every event inward to whole microseconds (start up, end down) unless
    // HTA_DISABLE_NS_ROUNDING=1; ours keeps the trace's nanoseconds.
    bool roundInwardToMicros = false;
    // Kernel classes from HTA's name patterns (hta/common/types.py) instead of our categories.
    bool htaKernelClasses = false;
    // Last-step cut-off also at GPU-side "ProfilerStep#N" copies (gpu_user_annotation), as HTA
    // does; ours cuts at the last host ProfilerStep start.
    bool gpuStepCopiesCut = false;
    // Host ops that name a GPU stream (Triton cpu_op with args.stream) count as GPU time (HTA).
    bool hostOpsWithStreamAreKernels = false;
    // Idle breakdown: overlapping consecutive kernels on a stream give a negative gap that is
    // summed (HTA) instead of skipped (ours).
    bool idleSumsNegativeGaps = false;
    int64_t kernelWaitThresholdNs = 30000;  // HTA's consecutive_kernel_delay default, 30 us

    static Definitions trainscope() { return {}; }
    static Definitions hta();
    const char* name() const { return set == Set::Hta ? "hta" : "trainscope"; }
};
// "trainscope" (also "default") or "hta"; anything else is an error naming both.
Result<Definitions> definitionsByName(const std::string& name);
// HTA's kernel type of a name (hta/utils/utils.py get_kernel_type): communication, memory,
// compute or other; memory and other are both non-compute.
KernelClass htaKernelClass(const std::string& name);
// Kineto's cuda_sync rows ("Stream Sync", "Event Sync", "Context Sync", "Device Sync",
// "Stream Wait Event"): waits drawn on a stream, not kernels. Non-compute time in the
// temporal breakdown (as in HTA); never a kernel in the idle breakdown.
bool isGpuWaitName(const std::string& name);

// ---- HTA comm/compute overlap (per rank):
//   overlap = |union(compute) ∩ union(comm)| / |union(comm)| * 100, intervals merged across
//   all of the rank's device streams. pct = 0 when the rank has no communication.
struct OverlapResult {
    double commNs = 0, overlappedNs = 0, pct = 0;
};
Result<OverlapResult> commComputeOverlap(TraceStore& store, int rank, const Definitions& defs = {});

// ---- HTA temporal breakdown (per rank), as HTA's get_temporal_breakdown computes it:
//   window  = [first device-kernel start, last device-kernel end] of the rank; when the rank
//             has host "ProfilerStep#N" ranges (imported PyTorch traces) the kernels of the
//             last profiler step are dropped first (HTA drops the last step).
//   compute = union of compute-kernel time; non-compute = union of (comm + memcpy/memset)
//   time minus what compute already covers; idle = window - compute - non-compute.
//   Percentages are of the window. See docs/profiler.md for the exact HTA correspondence.
struct TemporalBreakdown {
    double idleNs = 0, computeNs = 0, nonComputeNs = 0;
    double idlePct = 0, computePct = 0, nonComputePct = 0;
    double kernelTimeNs = 0;  // window length (HTA's "kernel_time")
};
Result<TemporalBreakdown> temporalBreakdown(TraceStore& store, int rank, const Definitions& defs = {});

// ---- HTA idle time breakdown (per rank, per stream, summed over the rank's streams):
//   each gap between consecutive kernels on a stream is
//   host_wait   if the next kernel's host launch (matched by correlation) started after the gap began
//               (the GPU waited for the CPU to launch),
//   kernel_wait if the gap is shorter than kernelWaitThresholdNs (HTA default 30 us) — short
//               back-to-back launch overhead,
//   other       otherwise (waiting on events, synchronization, other streams).
struct IdleBreakdown {
    double hostWaitNs = 0, kernelWaitNs = 0, otherNs = 0;
    double idleNs() const { return hostWaitNs + kernelWaitNs + otherNs; }
};
Result<IdleBreakdown> idleBreakdown(TraceStore& store, int rank, int64_t fromNs = INT64_MIN,
                                    int64_t toNs = INT64_MAX, const Definitions& defs = {});

// ---- steps: "step N" Range slices on each rank's host track (imported traces:
// "ProfilerStep#N"). One window per (step, rank).
struct StepWindow {
    int step = 0;
    int rank = 0;
    int64_t startNs = 0, endNs = 0;
    double durNs() const { return double(endNs - startNs); }
};
Result<std::vector<StepWindow>> stepWindows(TraceStore& store);

// ---- pipeline bubble of a rank inside a step:
//   bubble = time inside [step.start, step.end) not covered by any slice on the rank's compute
//   stream track(s). Two normalisations, each with its theory from metadata "pp", "vpp"
//   (default 1), "num_microbatches" (theories 0 when unknown or p == 1):
//     fraction = bubble / step time,           theory      = (p-1) / (v*m + p-1)
//     ratio    = bubble / (step time - bubble), ratioTheory = (p-1) / (v*m)
//   ratio is the paper's t_pb / t_id (Narayanan et al. 2021 §2.2); fraction is the share of
//   the step a user sees idle. A perfect 1F1B pipeline has fraction == theory.
struct BubbleResult {
    double stepNs = 0, bubbleNs = 0, fraction = 0, theory = 0, ratio = 0, ratioTheory = 0;
};
Result<BubbleResult> pipelineBubble(TraceStore& store, const StepWindow& window);

// ---- communication per kind and group inside a window, split by whether compute on the
// same rank covers it: overlapped = |comm_g ∩ union(compute)|, exposed = |comm_g| - overlapped
// (comm_g = union of the group's slices; a slice's kind is its name, group its Slice.group).
struct CommGroupStat {
    std::string group;  // "tp", "dp", "pp", ... ("" unknown)
    std::string kind;   // slice name, e.g. "all_reduce", "send"
    int64_t count = 0;
    uint64_t bytes = 0;
    double totalNs = 0, overlappedNs = 0, exposedNs = 0;
};
Result<std::vector<CommGroupStat>> commBreakdown(TraceStore& store, int rank, int64_t fromNs = INT64_MIN,
                                                 int64_t toNs = INT64_MAX);

// ---- kernels: total time by name and by category (device-stream kernels only).
struct KernelStat {
    std::string name, category;
    int64_t count = 0;
    double totalNs = 0, maxNs = 0;
    double flops = 0;
};
struct KernelBreakdown {
    std::vector<KernelStat> topKernels;   // by total time, at most topN, then "other"
    std::vector<KernelStat> byCategory;   // name = category
    // name = the kernel's class under the report's Definitions: "compute", "communication",
    // "non_compute", "wait" (cuda_sync rows); with HTA's definitions HTA's classes.
    std::vector<KernelStat> byClass;
    double totalNs = 0;
};
// Over the same kernels as overlap / temporal / idle (after the last-step filter).
Result<KernelBreakdown> kernelBreakdown(TraceStore& store, int rank, int topN = 10,
                                        int64_t fromNs = INT64_MIN, int64_t toNs = INT64_MAX,
                                        const Definitions& defs = {});

// ---- memory: counters named "memory.<category>" per rank. Peak per category, peak of the sum
// of all categories, and a series downsampled to at most maxPoints buckets keeping each
// bucket's maximum (so peaks survive downsampling).
struct MemoryPoint {
    int64_t tsNs = 0;
    double totalBytes = 0;
};
// Allocator counters of imported traces (memory.allocated / .reserved, host_*, and the
// *_since_trace_start sums of 2021-format Kineto deltas) are different views of the same
// memory, never added together: with engine categories present, the peak is their sum; else
// it is the peak of the device's allocated memory (then the host's). `measure` says which.
struct MemorySummary {
    int rank = 0;
    std::map<std::string, double> peakBytesByCategory;
    double peakTotalBytes = 0;
    std::string measure;  // what peakTotalBytes and series measure; "" = no memory counters
    std::optional<double> peakAllocatedBytes, peakReservedBytes;  // device allocator, when recorded
    std::vector<MemoryPoint> series;
};
bool isAllocatorMemoryCounter(const std::string& category);  // "allocated", "reserved", ...
// The memory.* categories whose levels add up to a rank's total, from the categories a rank
// has: the engine's own (params, grads, activations, ...) when there are any, else the one
// allocator view an imported trace offers (allocated, else allocated since the trace began,
// else the host's), never allocated + reserved. `measure` (optional) says what the total is.
// One rule for memorySummary, the timeline's memory row and the memory panel.
std::vector<std::string> memoryTotalCategories(const std::vector<std::string>& categories, std::string* measure = nullptr);
Result<MemorySummary> memorySummary(TraceStore& store, int rank, size_t maxPoints = 200);
// Downsampling used above; exposed for tests. Points must be sorted by ts.
std::vector<MemoryPoint> downsampleKeepPeaks(const std::vector<MemoryPoint>& points, size_t maxPoints);

// ---- model counters the engine records per rank (engine/model/gpt_moe.cpp, gpt_fp8.cpp).
// A sample belongs to the step whose window (same rank) contains its timestamp; samples in no
// window of their rank are only counted. Without such counters the summaries are empty and the
// report has no "moe" / "fp8" key. Counter names other than the ones below are ignored, so a
// "memory.*" counter is never read here and these are never read as memory.
//
// MoE router, "moe.layer<L>.aux_loss", ".z_loss" and ".tokens.expert<E>", one sample per
// forward of the layer on each rank (every microbatch, recomputed forwards too):
//   step value of aux/z   = mean of the step's samples over ranks and forwards
//   aux/z mean            = mean of the step values over the steps with samples
//   tokens of expert e    = sum over ranks and forwards in the step, then mean over steps
//   imbalance             = max_e tokens / mean_e tokens (1 = perfectly balanced; 0 = no tokens)
struct MoeLayerStats {
    int layer = 0;
    int steps = 0;     // steps with samples of this layer
    int lastStep = -1;
    double auxLossMean = 0, zLossMean = 0;
    double auxLossLast = 0, zLossLast = 0;    // the last step's values
    std::vector<double> tokensPerExpert;      // index = expert
    std::vector<double> tokensPerExpertLast;
    double imbalance = 0, imbalanceLast = 0;
    // Token dropping ("moe.layer<L>.dropped_tokens", recorded only with a capacity): token
    // copies dropped in a step, summed over ranks and forwards, mean over steps; the last step's.
    bool hasDropped = false;
    double droppedMean = 0, droppedLast = 0;
    int maxExpert = -1;                       // argmax of tokensPerExpert (lowest index on ties)
};
struct MoeSummary {
    std::vector<MoeLayerStats> layers;  // by layer
    int64_t samplesOutsideSteps = 0;
};
// step >= 0: only that step's samples.
Result<MoeSummary> moeSummary(TraceStore& store, const std::vector<StepWindow>& windows, int step = -1);

// FP8 scaling, "fp8.layer<L>.<linear>.<slot>.amax" / ".scale", one sample per tensor at the
// start of every step on each rank (the scales that step quantizes with). Per tensor the last
// sample of each rank (latest timestamp), then over ranks: amax = max, scale = min and max
// (ranks may hold different scales, e.g. tensor-parallel shards without a shared amax).
struct Fp8TensorStats {
    std::string tensor;  // "layer0.linear_qkv.input"
    int layer = -1;
    double amax = 0, scaleMin = 0, scaleMax = 0;
    int ranks = 0;
};
struct Fp8Summary {
    std::vector<Fp8TensorStats> tensors;  // by (layer, tensor name)
    const Fp8TensorStats* smallestScale() const;  // by scaleMin; nullptr when empty
    const Fp8TensorStats* largestScale() const;   // by scaleMax
};
// step >= 0: the last samples inside that step; otherwise the last samples of the run.
Result<Fp8Summary> fp8Summary(TraceStore& store, const std::vector<StepWindow>& windows, int step = -1);

// ---- peak FLOPS table: common/peak_flops.h (shared with the CUDA backend's DeviceInfo).
using ts::PeakFlopsTable;
using ts::loadPeakFlopsTable;
using ts::defaultPeakFlopsTablePath;

// ---- critical path of one step across ranks (documented approximation, docs/profiler.md):
// nodes = compute and communication slices of the step; edges = stream order on each track,
// and for communication slices sharing a correlation id (or for p2p send/recv pairs matched by
// (group, microbatch, chunk)) an edge from the earlier-starting to the later-ending partner.
// Length = wall time covered by the path: each slice adds the part of it after its predecessor
// on the path ended (gaps are not counted), so length <= step time.
struct CriticalPathEntry {
    int rank = 0;
    std::string track, name, category;
    int64_t startNs = 0, durNs = 0;
};
struct CriticalPath {
    double lengthNs = 0;                     // wall time covered by the path (see above)
    std::map<std::string, double> nsByCategory;
    std::vector<CriticalPathEntry> path;      // in time order (may be truncated to maxEntries)
};
Result<CriticalPath> criticalPath(TraceStore& store, int step, size_t maxEntries = 64);

// ---- the whole report (what `trainscope analyze --json` prints; keys in docs/profiler.md).
struct AnalyzeOptions {
    int step = -1;                 // -1: every step
    int topKernels = 10;
    size_t memoryPoints = 200;
    std::string peakFlopsTable;    // "" = defaultPeakFlopsTablePath()
    std::string deviceName;        // "" = metadata "device_name", else "cpu"
    std::string dtype;             // "" = metadata "dtype", else "fp32"
    bool criticalPath = true;
    Definitions definitions;       // trainscope's (default) or HTA's
};
Result<nlohmann::json> analyzeRun(TraceStore& store, const AnalyzeOptions& options);
// Human-readable rendering of analyzeRun's document (each definition printed once).
std::string formatAnalysisText(const nlohmann::json& report);

// ---- export: Chrome / Perfetto trace JSON (pid = rank, tid = track id, "X" slices,
// "C" counters, flow arrows "s"/"f" for correlation ids linking launches to executions).
Status exportChromeTrace(TraceStore& store, const std::string& outPath);

}  // namespace ts::profiler
