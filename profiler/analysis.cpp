// The per-rank analyses: HTA overlap and temporal/idle breakdown, steps, pipeline bubbles,
// communication split into overlapped/exposed, kernel breakdown, memory, critical path.
// Definitions: analysis.h and docs/profiler.md. Every function works on one rank's slices
// loaded once in (track, ts) order (loadRank) and on merged interval sets.
#include "profiler/analysis.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <tuple>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "profiler/analysis_internal.h"

namespace ts::profiler {
namespace detail {

namespace {
bool startsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }


// "step 12" / "step" / "ProfilerStep#12" -> step number (fallback when Slice.step is unset).
std::optional<int> stepNumber(const std::string& name, int32_t sliceStep) {
    bool isStep = name == "step" || startsWith(name, "step ") || startsWith(name, "ProfilerStep#");
    if (!isStep) return std::nullopt;
    if (sliceStep >= 0) return sliceStep;
    size_t pos = name.find_first_of("0123456789");
    if (pos == std::string::npos) return std::nullopt;
    int v = 0;
    auto r = std::from_chars(name.data() + pos, name.data() + name.size(), v);
    if (r.ec != std::errc()) return std::nullopt;
    return v;
}

const std::string& str(const std::vector<std::string>& strings, uint32_t id) {
    static const std::string empty;
    return id < strings.size() ? strings[id] : empty;
}
}  // namespace

}  // namespace detail

Definitions Definitions::hta() {
    Definitions d;
    d.set = Set::Hta;
    d.roundInwardToMicros = true;
    d.htaKernelClasses = true;
    d.gpuStepCopiesCut = true;
    d.hostOpsWithStreamAreKernels = true;
    d.idleSumsNegativeGaps = true;
    return d;
}

Result<Definitions> definitionsByName(const std::string& name) {
    if (name == "trainscope" || name == "default") return Definitions::trainscope();
    if (name == "hta") return Definitions::hta();
    return Status::invalid("unknown definitions '" + name + "': use 'trainscope' (the default) or 'hta' (HTA's defaults)");
}

bool isGpuWaitName(const std::string& n) {
    return n == "Stream Sync" || n == "Event Sync" || n == "Context Sync" || n == "Device Sync" ||
           n == "Stream Wait Event";
}

KernelClass htaKernelClass(const std::string& n) {
    // HTA 0.5.0, hta/common/types.py: CommunicateKernelGroupingPattern "^nccl",
    // ComputeKernelGroupingPattern (inverse match) "^nccl | .*Memcpy | .*Memset | .*dma |
    // ^.*Sync | cuda.*LaunchKernel | ^runFunction"; what is neither is memory or other, both
    // non-compute in its temporal breakdown. Python's re.match anchors at the start only.
    // (Later HTA versions add ^hip / ^hccl to communication and more non-compute prefixes.)
    auto has = [&](const char* p) { return n.find(p) != std::string::npos; };
    if (detail::startsWith(n, "nccl")) return KernelClass::Communication;
    bool cudaLaunch = detail::startsWith(n, "cuda") && n.find("LaunchKernel", 4) != std::string::npos;
    bool notCompute = has("Memcpy") || has("Memset") || has("dma") || has("Sync") || cudaLaunch ||
                      detail::startsWith(n, "runFunction");
    return notCompute ? KernelClass::NonCompute : KernelClass::Compute;
}

namespace detail {

NameClasses nameClasses(const std::vector<std::string>& strings, const Definitions& defs, int64_t originNs) {
    NameClasses c;
    c.defs = defs;
    c.originNs = originNs;
    c.wait.resize(strings.size());
    c.streamGroup.resize(strings.size());
    c.profilerStep.resize(strings.size());
    c.stepRange.resize(strings.size());
    if (defs.htaKernelClasses) c.htaClass.resize(strings.size());
    for (size_t i = 0; i < strings.size(); ++i) {
        const std::string& n = strings[i];
        c.wait[i] = isGpuWaitName(n);
        c.streamGroup[i] = startsWith(n, "stream ") && n.size() > 7 && std::isdigit(static_cast<unsigned char>(n[7]));
        c.profilerStep[i] = n.find("ProfilerStep") != std::string::npos;  // HTA 0.5: any name containing it
        c.stepRange[i] = n == "step" || startsWith(n, "step ") || c.profilerStep[i];
        if (defs.htaKernelClasses) c.htaClass[i] = htaKernelClass(n);
    }
    return c;
}

Result<NameClasses> nameClassesFor(TraceStore& store, const std::vector<std::string>& strings, const Definitions& defs) {
    int64_t origin = 0;
    if (defs.roundInwardToMicros) {
        TS_ASSIGN_OR_RETURN(auto o, store.metadata("import.time_origin_unix_ns"));
        if (o) {
            int64_t v = 0;
            auto r = std::from_chars(o->data(), o->data() + o->size(), v);
            if (r.ec == std::errc()) origin = v;
        }
    }
    return nameClasses(strings, defs, origin);
}

KernelClass NameClasses::classOf(trace::Category c, uint32_t name) const {
    KernelClass base = classify(c);
    if (base == KernelClass::NotKernel) return base;
    if (defs.htaKernelClasses && name < htaClass.size()) return htaClass[name];
    if (name < wait.size() && wait[name]) return KernelClass::NonCompute;
    return base;
}

namespace {
// Inward rounding to whole us (start up, end down), HTA's round_down_time_stamps. `toSource`
// takes a stored ts to the source's own clock, where its us grid lies. HTA parses Kineto's
// ts and dur as double microseconds and rounds those: with epoch-sized ts (older Kineto, no
// baseTimeNanoseconds) a double resolves only 0.25 us, so with `asDouble` the start and the
// end (ts + dur, added in doubles) are first taken to the nearest double as HTA has them.
// A sub-us event can come out reversed; it then covers nothing.
int64_t floorDiv(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
void roundInward(int64_t& start, int64_t& end, int64_t toSource, bool asDouble) {
    const int64_t s = start + toSource, e = end + toSource;
    int64_t rs, re;
    if (asDouble) {
        const double ts = double(floorDiv(s, 1000)) + double(s - floorDiv(s, 1000) * 1000) / 1000.0;
        const double te = ts + double(e - s) / 1000.0;
        rs = int64_t(std::ceil(ts)) * 1000;
        re = int64_t(std::floor(te)) * 1000;
    } else {
        rs = -floorDiv(-s, 1000) * 1000;
        re = floorDiv(e, 1000) * 1000;
    }
    start = rs - toSource;
    end = std::max(re - toSource, start);
}
}  // namespace

Result<RankData> loadRank(TraceStore& store, int rank, const NameClasses& classes) {
    RankData d;
    d.rank = rank;
    TS_ASSIGN_OR_RETURN(auto all, store.tracks());
    std::unordered_map<uint32_t, trace::TrackKind> kindOf;
    for (auto& t : all)
        if (t.rank == rank) {
            kindOf[t.id] = t.kind;
            d.tracks.push_back(t);
        }
    if (d.tracks.empty()) return Status::notFound("the trace has no tracks for rank " + std::to_string(rank));
    // Reserve once (the count includes host slices: an upper bound): growing by doubling would
    // copy and page-fault the largest arrays several times.
    TS_ASSIGN_OR_RETURN(int64_t count, store.sliceCount(rank));
    d.kernels.reserve(size_t(count));
    SliceFilter f;
    f.rank = rank;
    uint32_t lastTrack = 0;
    trace::TrackKind lastKind = trace::TrackKind::HostThread;
    const bool round = classes.defs.roundInwardToMicros;
    int64_t toSource = classes.originNs;  // stored ts -> Unix ns
    bool asDouble = false;
    if (round) {
        // A Kineto file: round on its own ts scale, as HTA does (see roundInward).
        TS_ASSIGN_OR_RETURN(auto zero, store.metadata("import.kineto_ts_zero_unix_ns." + std::to_string(rank)));
        int64_t z = 0;
        if (zero && std::from_chars(zero->data(), zero->data() + zero->size(), z).ec == std::errc()) {
            toSource = classes.originNs - z;
            asDouble = true;
        }
    }
    TS_RETURN_IF_ERROR(store.forEachSlice(f, [&](const trace::Slice& s) {
        // Slices come track by track: one map lookup per track, not per slice.
        if (s.track != lastTrack || lastTrack == 0) {
            lastTrack = s.track;
            lastKind = kindOf[s.track];
        }
        trace::TrackKind k = lastKind;
        int64_t start = s.startNs, end = s.startNs + s.durNs;
        if (round) roundInward(start, end, toSource, asDouble);
        if (k == trace::TrackKind::HostThread) {
            d.host.push_back({start, end, s.name, s.category, s.step, s.correlation, s.group});
            if (classes.defs.hostOpsWithStreamAreKernels && s.group < classes.streamGroup.size() &&
                classes.streamGroup[s.group] && s.category != trace::Category::Range) {
                Kernel kn;
                kn.start = start;
                kn.end = end;
                kn.name = s.name;
                kn.category = s.category;
                kn.cls = classes.classOf(trace::Category::Other, s.name);
                d.hostStreamOps.push_back(kn);
            }
            return true;
        }
        if (s.category == trace::Category::Range) {
            // GPU-side annotation copies: not work on the stream (not busy time for bubbles).
            d.gpuRanges.push_back({start, end, s.name, s.category, s.step, s.correlation, s.group});
            return true;
        }
        const bool wait = s.name < classes.wait.size() && classes.wait[s.name];
        // A wait row on the stream (cuda_sync) is not work: not busy time for bubbles.
        if (k == trace::TrackKind::Compute && !wait) d.computeStreamBusy.push_back({start, end});
        KernelClass cls = classes.classOf(s.category, s.name);
        if (cls == KernelClass::NotKernel) return true;
        Kernel kn;
        kn.start = start;
        kn.end = end;
        kn.track = s.track;
        kn.name = s.name;
        kn.group = s.group;
        kn.category = s.category;
        kn.cls = cls;
        kn.wait = wait;
        kn.microbatch = s.microbatch;
        kn.chunk = s.chunk;
        kn.correlation = s.correlation;
        kn.bytes = s.bytes;
        kn.flops = s.flops;
        d.kernels.push_back(kn);
        return true;
    }));
    return d;
}

Result<HtaContext> htaContext(TraceStore& store) {
    HtaContext c;
    TS_ASSIGN_OR_RETURN(auto flag, store.metadata("import.dropped_last_step"));
    TS_ASSIGN_OR_RETURN(auto st, store.stats());
    auto it = st.find("import.dropped_last_step_slices");
    c.importerDropped = (flag && (*flag == "1" || *flag == "true")) || (it != st.end() && it->second > 0);
    TS_ASSIGN_OR_RETURN(auto source, store.metadata("import.source"));
    c.imported = source.has_value();
    return c;
}

std::vector<Kernel> htaKernels(const RankData& d, const NameClasses& classes, const HtaContext& ctx, bool timeOrder,
                               bool forIdle) {
    std::vector<Kernel> storage;
    const std::vector<Kernel>& r = htaKernelsRef(d, classes, ctx, timeOrder, storage, forIdle);
    return &r == &storage ? std::move(storage) : r;
}

const std::vector<Kernel>& htaKernelsRef(const RankData& d, const NameClasses& classes, const HtaContext& ctx,
                                         bool timeOrder, std::vector<Kernel>& storage, bool forIdle) {
    const std::vector<Kernel>& source = timeOrder && d.indexed ? d.byStart : d.kernels;
    const bool addHostOps = !forIdle && !d.hostStreamOps.empty();
    // Profiler steps: "ProfilerStep#N" ranges, or in an imported trace the importer's "step N"
    // ranges (it renames ProfilerStep#N); with gpuStepCopiesCut also the GPU-side copies.
    // Native trainscope steps are never dropped.
    std::unordered_set<uint32_t> stepNames;
    int64_t lastStart = INT64_MIN;
    if (!ctx.importerDropped) {
        for (const auto& h : d.host) {
            bool isStep = (h.name < classes.profilerStep.size() && classes.profilerStep[h.name]) ||
                          (ctx.imported && h.category == trace::Category::Range && h.step >= 0 &&
                           h.name < classes.stepRange.size() && classes.stepRange[h.name]);
            if (!isStep) continue;
            // Distinct step names (HTA counts the distinct ProfilerStep#N symbols).
            stepNames.insert(h.step >= 0 ? uint32_t(h.step) + 0x80000000u : h.name);
            lastStart = std::max(lastStart, h.start);
        }
        if (classes.defs.gpuStepCopiesCut)
            for (const auto& g : d.gpuRanges)
                if (g.name < classes.profilerStep.size() && classes.profilerStep[g.name]) {
                    stepNames.insert(g.step >= 0 ? uint32_t(g.step) + 0x80000000u : g.name);
                    lastStart = std::max(lastStart, g.start);
                }
    }
    // HTA drops nothing with fewer than two profiler steps (hta/common/trace.py,
    // _filter_irrelevant_gpu_kernels): a single step is kept whole.
    if (stepNames.size() < 2) {
        if (!addHostOps) return source;
        storage = source;
        storage.insert(storage.end(), d.hostStreamOps.begin(), d.hostStreamOps.end());
        if (timeOrder)
            std::stable_sort(storage.begin(), storage.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
        return storage;
    }
    std::unordered_set<uint64_t> kept;
    for (const auto& h : d.host)
        if (h.correlation != 0 && h.start < lastStart) kept.insert(h.correlation);
    storage.clear();
    for (const auto& k : source)
        if (k.correlation != 0 && kept.count(k.correlation)) storage.push_back(k);
    if (addHostOps) {
        // HTA keeps them as host events: when they start before the cut-off.
        for (const auto& k : d.hostStreamOps)
            if (k.start < lastStart) storage.push_back(k);
        if (timeOrder)
            std::stable_sort(storage.begin(), storage.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
    }
    return storage;
}

IntervalSet classSet(const std::vector<Kernel>& ks, KernelClass cls, int64_t from, int64_t to) {
    std::vector<Interval> v;
    for (const auto& k : ks)
        if (k.cls == cls && k.end > from && k.start < to)
            v.push_back({std::max(k.start, from), std::min(k.end, to)});
    return mergeIntervals(std::move(v));
}

IntervalSet allKernelSet(const std::vector<Kernel>& ks, int64_t from, int64_t to) {
    std::vector<Interval> v;
    for (const auto& k : ks)
        if (k.end > from && k.start < to) v.push_back({std::max(k.start, from), std::min(k.end, to)});
    return mergeIntervals(std::move(v));
}

OverlapResult overlapOf(const std::vector<Kernel>& ks, int64_t from, int64_t to) {
    IntervalSet comp = classSet(ks, KernelClass::Compute, from, to);
    IntervalSet comm = classSet(ks, KernelClass::Communication, from, to);
    OverlapResult r;
    r.commNs = double(totalLength(comm));
    r.overlappedNs = double(totalLength(intersectSets(comp, comm)));
    r.pct = r.commNs > 0 ? 100.0 * r.overlappedNs / r.commNs : 0.0;
    return r;
}

TemporalBreakdown temporalOf(const std::vector<Kernel>& ks) {
    TemporalBreakdown t;
    IntervalSet all = allKernelSet(ks);
    if (all.empty()) return t;
    double window = double(all.back().end - all.front().start);
    double busy = double(totalLength(all));
    t.kernelTimeNs = window;
    t.computeNs = double(totalLength(classSet(ks, KernelClass::Compute)));
    t.idleNs = window - busy;
    t.nonComputeNs = busy - t.computeNs;
    if (window > 0) {
        t.idlePct = 100.0 * t.idleNs / window;
        t.computePct = 100.0 * t.computeNs / window;
        t.nonComputePct = 100.0 * t.nonComputeNs / window;
    }
    return t;
}

IdleBreakdown idleOf(const RankData& d, const std::vector<Kernel>& ks, int64_t from, int64_t to,
                     const Definitions& defs) {
    std::unordered_map<uint64_t, int64_t> launchStart;
    for (const auto& h : d.host)
        if (h.correlation != 0) launchStart.emplace(h.correlation, h.start);
    IdleBreakdown r;
    const double threshold = double(defs.kernelWaitThresholdNs);
    // ks is sorted by (track, start): each stream's kernels are consecutive. Wait rows
    // (cuda_sync) are not kernels: the gap runs from the previous kernel to the next one.
    const Kernel* prev = nullptr;
    for (const Kernel& k : ks) {
        if (k.wait) continue;
        if (!prev || prev->track != k.track) {
            prev = &k;
            continue;
        }
        const Kernel& p = *prev;
        prev = &k;
        if (k.start < from || k.start >= to) continue;
        double gap = double(k.start - p.end);
        // Ours: a kernel that starts before the previous one ended leaves no gap. HTA sums the
        // negative gap (into kernel wait, or host wait when the launch came late).
        if (gap <= 0 && !(defs.idleSumsNegativeGaps && gap < 0)) continue;
        auto it = k.correlation ? launchStart.find(k.correlation) : launchStart.end();
        if (it != launchStart.end() && it->second > p.end) r.hostWaitNs += gap;
        else if (gap < threshold) r.kernelWaitNs += gap;
        else r.otherNs += gap;
    }
    return r;
}

void indexRank(RankData& d) {
    // Total order (start, track, end) keeps results deterministic without a stable sort.
    auto less = [](const Kernel& a, const Kernel& b) {
        if (a.start != b.start) return a.start < b.start;
        return a.track != b.track ? a.track < b.track : a.end < b.end;
    };
    // d.kernels comes track by track, each track in time order (the store's read order): one
    // k-way merge of those runs straight into byStart (O(n log tracks), no scratch copies of
    // the rank's kernels); a run out of order is sorted in a copy first.
    std::vector<std::pair<const Kernel*, const Kernel*>> runs;  // [begin, end) per run
    std::vector<std::vector<Kernel>> sortedRuns;
    const Kernel* base = d.kernels.data();
    for (size_t i = 0, n = d.kernels.size(); i < n;) {
        size_t j = i + 1;
        while (j < n && d.kernels[j].track == d.kernels[i].track) ++j;
        if (std::is_sorted(base + i, base + j, less)) {
            runs.emplace_back(base + i, base + j);
        } else {
            sortedRuns.emplace_back(base + i, base + j);
            std::sort(sortedRuns.back().begin(), sortedRuns.back().end(), less);
        }
        i = j;
    }
    for (const auto& r : sortedRuns) runs.emplace_back(r.data(), r.data() + r.size());
    d.byStart.clear();
    d.byStart.reserve(d.kernels.size());
    // Heap of run heads; "greater" makes it a min-heap.
    auto greater = [&](const std::pair<const Kernel*, const Kernel*>& a, const std::pair<const Kernel*, const Kernel*>& b) {
        return less(*b.first, *a.first);
    };
    std::make_heap(runs.begin(), runs.end(), greater);
    while (!runs.empty()) {
        std::pop_heap(runs.begin(), runs.end(), greater);
        auto& r = runs.back();
        d.byStart.push_back(*r.first);
        if (++r.first == r.second) {
            runs.pop_back();
        } else {
            std::push_heap(runs.begin(), runs.end(), greater);
        }
    }
    d.maxKernelDur = 0;
    for (const auto& k : d.kernels) d.maxKernelDur = std::max(d.maxKernelDur, k.end - k.start);
    d.computeSet = classSet(d.byStart, KernelClass::Compute);
    d.commSet = classSet(d.byStart, KernelClass::Communication);
    d.computeStreamSet = mergeIntervals(d.computeStreamBusy);
    d.indexed = true;
}

std::pair<const Kernel*, const Kernel*> kernelsNear(const RankData& d, int64_t from, int64_t to) {
    auto byStartLess = [](const Kernel& k, int64_t t) { return k.start < t; };
    int64_t lo = from == INT64_MIN ? INT64_MIN : from - d.maxKernelDur;
    auto b = std::lower_bound(d.byStart.begin(), d.byStart.end(), lo, byStartLess);
    auto e = std::lower_bound(b, d.byStart.end(), to, byStartLess);
    const Kernel* base = d.byStart.data();
    return {base + (b - d.byStart.begin()), base + (e - d.byStart.begin())};
}

std::vector<CommGroupStat> commOf(const RankData& d, const std::vector<std::string>& strings, int64_t from,
                                  int64_t to) {
    IntervalSet comp = d.indexed ? clipSet(d.computeSet, from, to) : classSet(d.kernels, KernelClass::Compute, from, to);
    const Kernel *first = d.kernels.data(), *last = d.kernels.data() + d.kernels.size();
    if (d.indexed) std::tie(first, last) = kernelsNear(d, from, to);
    // Keyed by (group id, name id): no string building per kernel.
    std::map<std::pair<uint32_t, uint32_t>, std::pair<CommGroupStat, std::vector<Interval>>> groups;
    for (const Kernel* k = first; k != last; ++k) {
        if (k->cls != KernelClass::Communication || k->end <= from || k->start >= to) continue;
        auto& [st, iv] = groups[{k->group, k->name}];
        st.count += 1;
        st.bytes += k->bytes;
        iv.push_back({std::max(k->start, from), std::min(k->end, to)});
    }
    std::vector<CommGroupStat> out;
    for (auto& [key, val] : groups) {
        auto& [st, iv] = val;
        st.group = str(strings, key.first);
        st.kind = str(strings, key.second);
        IntervalSet u = mergeIntervals(std::move(iv));
        st.totalNs = double(totalLength(u));
        st.overlappedNs = double(totalLength(intersectSets(u, comp)));
        st.exposedNs = st.totalNs - st.overlappedNs;
        out.push_back(st);
    }
    return out;
}

KernelBreakdown kernelsOf(const std::vector<Kernel>& ks, const std::vector<std::string>& strings, int topN,
                          int64_t from, int64_t to) {
    std::unordered_map<uint32_t, KernelStat> byName;
    std::map<std::string, KernelStat> byCat, byClass;
    KernelBreakdown r;
    for (const auto& k : ks) {
        if (k.start < from || k.start >= to) continue;
        double dur = double(k.end - k.start);
        const char* cat = k.wait ? "sync" : trace::categoryName(k.category);
        auto& s = byName[k.name];
        s.count += 1;
        s.totalNs += dur;
        s.maxNs = std::max(s.maxNs, dur);
        s.flops += k.flops;
        s.category = cat;
        auto& c = byCat[cat];
        c.count += 1;
        c.totalNs += dur;
        c.maxNs = std::max(c.maxNs, dur);
        c.flops += k.flops;
        const char* cls = k.cls == KernelClass::Compute         ? "compute"
                          : k.cls == KernelClass::Communication ? "communication"
                          : k.wait                              ? "wait"
                                                                : "non_compute";
        auto& x = byClass[cls];
        x.count += 1;
        x.totalNs += dur;
        x.maxNs = std::max(x.maxNs, dur);
        x.flops += k.flops;
        r.totalNs += dur;
    }
    for (auto& [name, c] : byClass) {
        c.name = name;
        c.category = name;
        r.byClass.push_back(c);
    }
    std::sort(r.byClass.begin(), r.byClass.end(),
              [](const KernelStat& a, const KernelStat& b) { return a.totalNs > b.totalNs; });
    for (auto& [id, s] : byName) {
        s.name = str(strings, id);
        r.topKernels.push_back(s);
    }
    std::sort(r.topKernels.begin(), r.topKernels.end(), [](const KernelStat& a, const KernelStat& b) {
        return a.totalNs != b.totalNs ? a.totalNs > b.totalNs : a.name < b.name;
    });
    if (topN >= 0 && r.topKernels.size() > size_t(topN)) {
        KernelStat other;
        other.name = "other";
        other.category = "mixed";
        for (size_t i = size_t(topN); i < r.topKernels.size(); ++i) {
            other.count += r.topKernels[i].count;
            other.totalNs += r.topKernels[i].totalNs;
            other.maxNs = std::max(other.maxNs, r.topKernels[i].maxNs);
            other.flops += r.topKernels[i].flops;
        }
        r.topKernels.resize(size_t(topN));
        r.topKernels.push_back(other);
    }
    for (auto& [name, c] : byCat) {
        c.name = name;
        c.category = name;
        r.byCategory.push_back(c);
    }
    std::sort(r.byCategory.begin(), r.byCategory.end(),
              [](const KernelStat& a, const KernelStat& b) { return a.totalNs > b.totalNs; });
    return r;
}

std::vector<StepWindow> stepsOf(const RankData& d, const std::vector<std::string>& strings) {
    std::vector<StepWindow> out;
    for (const auto& h : d.host) {
        if (h.category != trace::Category::Range) continue;
        auto n = stepNumber(str(strings, h.name), h.step);
        if (!n) continue;
        out.push_back({*n, d.rank, h.start, h.end});
    }
    std::sort(out.begin(), out.end(), [](const StepWindow& a, const StepWindow& b) { return a.step < b.step; });
    // Nested ranges with the same step number (e.g. "step 3" inside "ProfilerStep#3"): keep the outer.
    std::vector<StepWindow> dedup;
    for (const auto& w : out) {
        if (!dedup.empty() && dedup.back().step == w.step) {
            dedup.back().startNs = std::min(dedup.back().startNs, w.startNs);
            dedup.back().endNs = std::max(dedup.back().endNs, w.endNs);
        } else {
            dedup.push_back(w);
        }
    }
    return dedup;
}

double bubbleTheory(const std::map<std::string, std::string>& meta) {
    auto num = [&](const char* key, double def) {
        auto it = meta.find(key);
        if (it == meta.end()) return def;
        try {
            return std::stod(it->second);
        } catch (...) {
            return def;
        }
    };
    double p = num("pp", 1), v = std::max(1.0, num("vpp", 1)), m = num("num_microbatches", 0);
    if (p <= 1 || m <= 0) return 0.0;
    return (p - 1) / (v * m);  // t_pb / t_id
}

// ratio theory (p-1)/(vm) -> step-fraction theory (p-1)/(vm + p-1).
static void setBubbleTheory(BubbleResult& r, double ratioTheory) {
    r.ratioTheory = ratioTheory;
    r.theory = ratioTheory > 0 ? ratioTheory / (1 + ratioTheory) : 0;
    const double busy = r.stepNs - r.bubbleNs;
    r.ratio = busy > 0 ? r.bubbleNs / busy : 0;
}

BubbleResult bubbleOf(const RankData& d, const StepWindow& w, double theory) {
    BubbleResult r;
    r.stepNs = w.durNs();
    if (d.indexed) {
        r.bubbleNs = r.stepNs - double(totalLength(clipSet(d.computeStreamSet, w.startNs, w.endNs)));
        r.fraction = r.stepNs > 0 ? r.bubbleNs / r.stepNs : 0;
        setBubbleTheory(r, theory);
        return r;
    }
    std::vector<Interval> v;
    for (const auto& i : d.computeStreamBusy)
        if (i.end > w.startNs && i.start < w.endNs) v.push_back({std::max(i.start, w.startNs), std::min(i.end, w.endNs)});
    r.bubbleNs = r.stepNs - double(totalLength(mergeIntervals(std::move(v))));
    r.fraction = r.stepNs > 0 ? r.bubbleNs / r.stepNs : 0;
    setBubbleTheory(r, theory);
    return r;
}

// ---- critical path ------------------------------------------------------------------------
CriticalPath criticalPathOf(const std::vector<const RankData*>& ranks, const std::vector<std::string>& strings,
                            const std::vector<StepWindow>& windows, size_t maxEntries) {
    // Node i: kernel k[i] of rank rk[i]; st/en copied into flat arrays (the loops below touch
    // them millions of times). Nodes of one rank are contiguous and in start order (byStart).
    std::vector<const Kernel*> kn;
    std::vector<int> rk;
    std::vector<int64_t> st, en;
    std::vector<uint32_t> slotOfNode;
    // Track -> slot. The unordered_map's iteration order (same key insertion sequence as a map
    // of track -> node list) fixes the order of cross-stream edges, hence tie-breaks below.
    std::unordered_map<uint64_t, uint32_t> slotOf;
    std::vector<std::vector<uint32_t>> bySlot;  // slot -> node indices in start order
    std::vector<std::pair<size_t, size_t>> rankRange;  // per rank: [first node, last node)
    // Ranks not run through indexRank() get a start-ordered copy here (the cursor walk below
    // needs each rank's nodes in start order).
    std::vector<RankData> indexedCopies;
    indexedCopies.reserve(ranks.size());
    for (const RankData* d : ranks) {
        auto w = std::find_if(windows.begin(), windows.end(), [&](const StepWindow& x) { return x.rank == d->rank; });
        if (w == windows.end()) continue;
        if (!d->indexed) {
            RankData copy;
            copy.rank = d->rank;
            copy.kernels = d->kernels;
            indexRank(copy);
            indexedCopies.push_back(std::move(copy));
            d = &indexedCopies.back();
        }
        auto [first, last] = kernelsNear(*d, w->startNs, w->endNs);
        size_t begin = kn.size();
        for (const Kernel* k = first; k != last; ++k) {
            if (k->start < w->startNs || k->start >= w->endNs) continue;
            auto [it, fresh] = slotOf.try_emplace(k->track, uint32_t(bySlot.size()));
            if (fresh) bySlot.emplace_back();
            bySlot[it->second].push_back(uint32_t(kn.size()));
            slotOfNode.push_back(it->second);
            kn.push_back(k);
            rk.push_back(d->rank);
            st.push_back(k->start);
            en.push_back(k->end);
        }
        if (kn.size() > begin) rankRange.emplace_back(begin, kn.size());
    }
    CriticalPath cp;
    if (kn.empty()) return cp;
    const size_t n = kn.size();
    // Edges (v <- u) collected flat, turned into CSR below (no per-node vectors: steps have ~1M kernels).
    std::vector<std::pair<uint32_t, uint32_t>> edges;
    edges.reserve(n * 2);
    auto addEdge = [&](size_t v, size_t u) { edges.emplace_back(uint32_t(v), uint32_t(u)); };
    std::vector<size_t> prevOnTrack(n, SIZE_MAX);
    for (const auto& idx : bySlot)
        for (size_t i = 1; i < idx.size(); ++i) prevOnTrack[idx[i]] = idx[i - 1];
    // Slots of each rank in the map's iteration order.
    std::unordered_map<int, std::vector<uint32_t>> slotsOfRank;
    for (auto& [t, slot] : slotOf) slotsOfRank[rk[bySlot[slot][0]]].push_back(slot);
    // Cross-stream waits on a rank: v waited for the latest kernel u on another stream of the
    // same rank that ended while v's stream was idle just before v (prev end <= u.end <= v.start).
    // Nodes of a rank come in start order, so "last kernel on t starting at or before v" is a
    // cursor that only moves forward.
    std::vector<size_t> cursor(bySlot.size(), 0);
    for (auto [begin, end] : rankRange) {
        const std::vector<uint32_t>& slots = slotsOfRank[rk[begin]];
        for (uint32_t s : slots) cursor[s] = 0;
        for (size_t v = begin; v < end; ++v) {
            if (prevOnTrack[v] != SIZE_MAX) addEdge(v, prevOnTrack[v]);
            const int64_t vs = st[v];
            int64_t idleFrom = prevOnTrack[v] == SIZE_MAX ? INT64_MIN : en[prevOnTrack[v]];
            for (uint32_t s : slots) {
                const auto& idx = bySlot[s];
                size_t& c = cursor[s];
                while (c < idx.size() && st[idx[c]] <= vs) ++c;
                if (s == slotOfNode[v]) continue;
                // Last kernel on t starting before v; walk back over a few to find one that ended in time.
                size_t it = c;
                for (int steps = 0; it != 0 && steps < 4; ++steps) {
                    --it;
                    const int64_t ue = en[idx[it]];
                    if (ue <= vs && ue >= idleFrom) {
                        addEdge(v, idx[it]);
                        break;
                    }
                    if (ue < idleFrom) break;
                }
            }
        }
    }
    // Cross-rank communication edges. Collectives: the k-th (group, name) collective of each rank
    // in the step is one operation; it cannot finish before every participant arrived, so each
    // participant's stream predecessor precedes it. P2P: the k-th "recv" with (group, microbatch,
    // chunk) matches the k-th "send" with the same key on another rank. Members are taken in
    // start order (ties: rank order, then a rank's byStart order).
    std::map<std::tuple<uint32_t, uint32_t, int>, std::vector<size_t>> collectives;
    std::map<std::tuple<uint32_t, int32_t, int32_t, int>, std::vector<size_t>> sends, recvs;
    {
        std::vector<std::pair<int64_t, uint32_t>> commOrder;  // (start, node) of comm nodes
        for (size_t i = 0; i < n; ++i)
            if (kn[i]->category == trace::Category::Collective || kn[i]->category == trace::Category::P2P)
                commOrder.emplace_back(st[i], uint32_t(i));
        std::sort(commOrder.begin(), commOrder.end());
        std::map<std::tuple<int, uint32_t, uint32_t>, int> collCount;
        std::map<std::tuple<int, bool, uint32_t, int32_t, int32_t>, int> p2pCount;
        std::unordered_map<uint32_t, int> p2pDir;  // name id -> 1 recv, 2 send, 0 neither/both
        for (auto [s0, i] : commOrder) {
            const Kernel& k = *kn[i];
            if (k.category == trace::Category::Collective) {
                int c = collCount[{rk[i], k.group, k.name}]++;
                collectives[{k.group, k.name, c}].push_back(i);
            } else {
                auto [dit, fresh] = p2pDir.try_emplace(k.name, 0);
                if (fresh) {
                    const std::string& nm = str(strings, k.name);
                    bool isRecv = nm.find("recv") != std::string::npos;
                    bool isSend = nm.find("send") != std::string::npos;
                    dit->second = isRecv == isSend ? 0 : isRecv ? 1 : 2;
                }
                if (dit->second == 0) continue;  // batched send+recv or unknown: no edge
                bool isRecv = dit->second == 1;
                int c = p2pCount[{rk[i], isRecv, k.group, k.microbatch, k.chunk}]++;
                (isRecv ? recvs : sends)[{k.group, k.microbatch, k.chunk, c}].push_back(i);
            }
        }
    }
    for (auto& [key, members] : collectives)
        for (size_t v : members)
            for (size_t u : members)
                if (u != v && prevOnTrack[u] != SIZE_MAX) addEdge(v, prevOnTrack[u]);
    for (auto& [key, rs] : recvs) {
        auto it = sends.find(key);
        if (it == sends.end()) continue;
        for (size_t v : rs)
            for (size_t u : it->second) {
                if (rk[u] == rk[v]) continue;
                addEdge(v, u);
                if (prevOnTrack[u] != SIZE_MAX) addEdge(v, prevOnTrack[u]);
            }
    }
    // CSR keeping each node's edges in the order they were added (the order decides ties).
    std::vector<uint32_t> predStart(n + 1, 0), preds(edges.size());
    for (auto& e : edges) ++predStart[e.first + 1];
    for (size_t i = 0; i < n; ++i) predStart[i + 1] += predStart[i];
    {
        std::vector<uint32_t> fill(predStart.begin(), predStart.end() - 1);
        for (auto& e : edges) preds[fill[e.first]++] = e.second;
    }
    edges = {};
    // Longest path; edges only go forward in (end, start, index) order, which makes the graph a DAG.
    // Each track's nodes are in start order and, on a stream, usually in end order too: merge
    // those runs with a heap (O(n log tracks)); fall back to one sort when a run is not ordered.
    using Key = std::tuple<int64_t, int64_t, uint32_t>;  // (end, start, node)
    std::vector<uint32_t> topo(n), pos(n);
    bool runsOrdered = true;
    for (const auto& idx : bySlot)
        for (size_t i = 1; i < idx.size() && runsOrdered; ++i)
            runsOrdered = Key{en[idx[i - 1]], st[idx[i - 1]], idx[i - 1]} < Key{en[idx[i]], st[idx[i]], idx[i]};
    if (runsOrdered) {
        std::vector<std::pair<Key, uint32_t>> heap;  // (head key, slot)
        std::vector<size_t> head(bySlot.size(), 0);
        for (uint32_t sl = 0; sl < bySlot.size(); ++sl)
            if (!bySlot[sl].empty()) heap.push_back({Key{en[bySlot[sl][0]], st[bySlot[sl][0]], bySlot[sl][0]}, sl});
        auto greater = [](const std::pair<Key, uint32_t>& a, const std::pair<Key, uint32_t>& b) { return a.first > b.first; };
        std::make_heap(heap.begin(), heap.end(), greater);
        for (size_t i = 0; i < n; ++i) {
            std::pop_heap(heap.begin(), heap.end(), greater);
            auto [key, sl] = heap.back();
            heap.pop_back();
            topo[i] = std::get<2>(key);
            if (++head[sl] < bySlot[sl].size()) {
                uint32_t u = bySlot[sl][head[sl]];
                heap.push_back({Key{en[u], st[u], u}, sl});
                std::push_heap(heap.begin(), heap.end(), greater);
            }
        }
    } else {
        std::vector<Key> keyed(n);
        for (size_t i = 0; i < n; ++i) keyed[i] = {en[i], st[i], uint32_t(i)};
        std::sort(keyed.begin(), keyed.end());
        for (size_t i = 0; i < n; ++i) topo[i] = std::get<2>(keyed[i]);
    }
    for (size_t i = 0; i < n; ++i) pos[topo[i]] = uint32_t(i);
    std::vector<double> best(n, 0);
    std::vector<size_t> from(n, SIZE_MAX);
    size_t argmax = topo[0];
    // Path length counts wall time, not summed durations: v adds only the part of it after its
    // predecessor ended (a recv that waited for the send adds the transfer tail, not the wait),
    // so the length is at most the step time and equals it when the path has no gaps.
    auto gain = [&](size_t u, size_t v) { return double(en[v] - std::max(st[v], u == SIZE_MAX ? st[v] : en[u])); };
    std::vector<double> own(n, 0);
    for (size_t v : topo) {
        best[v] = gain(SIZE_MAX, v);
        own[v] = best[v];
        for (uint32_t pi = predStart[v]; pi < predStart[v + 1]; ++pi)
            // >=: on a tie prefer the explanation with a predecessor (a recv that waited is
            // explained by its send, not by its own start).
            if (size_t u = preds[pi]; pos[u] < pos[v] && best[u] + gain(u, v) >= best[v]) {
                best[v] = best[u] + gain(u, v);
                own[v] = gain(u, v);
                from[v] = u;
            }
        if (best[v] > best[argmax]) argmax = v;
    }
    cp.lengthNs = best[argmax];
    std::vector<size_t> chain;
    for (size_t v = argmax; v != SIZE_MAX; v = from[v]) chain.push_back(v);
    std::reverse(chain.begin(), chain.end());
    std::unordered_map<uint32_t, std::string> trackName;
    for (const RankData* d : ranks)
        for (const auto& t : d->tracks) trackName[t.id] = t.name;
    for (size_t v : chain) cp.nsByCategory[trace::categoryName(kn[v]->category)] += own[v];
    // Keep the first and last entries when truncating (where the path starts and ends).
    for (size_t i = 0; i < chain.size(); ++i) {
        if (chain.size() > maxEntries && i >= maxEntries / 2 && i < chain.size() - maxEntries / 2) continue;
        const Kernel& k = *kn[chain[i]];
        cp.path.push_back({rk[chain[i]], trackName[k.track], str(strings, k.name), trace::categoryName(k.category),
                           k.start, k.end - k.start});
    }
    return cp;
}

}  // namespace detail

using namespace detail;

// ---- public wrappers ------------------------------------------------------------------------

namespace {
struct Loaded {
    std::vector<std::string> strings;
    NameClasses classes;
    RankData data;
    HtaContext hta;
};
Result<Loaded> loadFor(TraceStore& store, int rank, const Definitions& defs) {
    Loaded l;
    TS_ASSIGN_OR_RETURN(l.strings, store.strings());
    TS_ASSIGN_OR_RETURN(l.classes, nameClassesFor(store, l.strings, defs));
    TS_ASSIGN_OR_RETURN(l.data, loadRank(store, rank, l.classes));
    TS_ASSIGN_OR_RETURN(l.hta, htaContext(store));
    return l;
}
}  // namespace

Result<OverlapResult> commComputeOverlap(TraceStore& store, int rank, const Definitions& defs) {
    TS_ASSIGN_OR_RETURN(Loaded l, loadFor(store, rank, defs));
    return overlapOf(htaKernels(l.data, l.classes, l.hta));
}

Result<TemporalBreakdown> temporalBreakdown(TraceStore& store, int rank, const Definitions& defs) {
    TS_ASSIGN_OR_RETURN(Loaded l, loadFor(store, rank, defs));
    return temporalOf(htaKernels(l.data, l.classes, l.hta));
}

Result<IdleBreakdown> idleBreakdown(TraceStore& store, int rank, int64_t fromNs, int64_t toNs, const Definitions& defs) {
    TS_ASSIGN_OR_RETURN(Loaded l, loadFor(store, rank, defs));
    return idleOf(l.data, htaKernels(l.data, l.classes, l.hta, false, /*forIdle=*/true), fromNs, toNs, defs);
}

Result<std::vector<StepWindow>> stepWindows(TraceStore& store) {
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    TS_ASSIGN_OR_RETURN(auto ranks, store.ranks());
    const NameClasses classes = nameClasses(strings, Definitions::trainscope());
    std::vector<StepWindow> out;
    for (int r : ranks) {
        TS_ASSIGN_OR_RETURN(RankData d, loadRank(store, r, classes));
        auto w = stepsOf(d, strings);
        out.insert(out.end(), w.begin(), w.end());
    }
    std::sort(out.begin(), out.end(), [](const StepWindow& a, const StepWindow& b) {
        return a.step != b.step ? a.step < b.step : a.rank < b.rank;
    });
    return out;
}

Result<BubbleResult> pipelineBubble(TraceStore& store, const StepWindow& window) {
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    TS_ASSIGN_OR_RETURN(RankData d, loadRank(store, window.rank, nameClasses(strings, Definitions::trainscope())));
    TS_ASSIGN_OR_RETURN(auto meta, store.allMetadata());
    return bubbleOf(d, window, bubbleTheory(meta));
}

Result<std::vector<CommGroupStat>> commBreakdown(TraceStore& store, int rank, int64_t fromNs, int64_t toNs) {
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    TS_ASSIGN_OR_RETURN(RankData d, loadRank(store, rank, nameClasses(strings, Definitions::trainscope())));
    return commOf(d, strings, fromNs, toNs);
}

Result<KernelBreakdown> kernelBreakdown(TraceStore& store, int rank, int topN, int64_t fromNs, int64_t toNs,
                                        const Definitions& defs) {
    TS_ASSIGN_OR_RETURN(Loaded l, loadFor(store, rank, defs));
    return kernelsOf(htaKernels(l.data, l.classes, l.hta), l.strings, topN, fromNs, toNs);
}

std::vector<MemoryPoint> downsampleKeepPeaks(const std::vector<MemoryPoint>& points, size_t maxPoints) {
    if (maxPoints == 0 || points.size() <= maxPoints) return points;
    // Equal-time buckets over [first, last]; each non-empty bucket keeps its maximum point, so
    // the global peak always survives. Result has at most maxPoints points.
    std::vector<MemoryPoint> out;
    int64_t t0 = points.front().tsNs, t1 = points.back().tsNs;
    double width = double(t1 - t0 + 1) / double(maxPoints);
    size_t i = 0;
    for (size_t b = 0; b < maxPoints && i < points.size(); ++b) {
        int64_t bucketEnd = t0 + int64_t(std::ceil(width * double(b + 1)));
        if (b + 1 == maxPoints) bucketEnd = INT64_MAX;
        const MemoryPoint* best = nullptr;
        for (; i < points.size() && points[i].tsNs < bucketEnd; ++i)
            if (!best || points[i].totalBytes > best->totalBytes) best = &points[i];
        if (best) out.push_back(*best);
    }
    return out;
}

bool isAllocatorMemoryCounter(const std::string& c) {
    return c == "allocated" || c == "reserved" || c == "host_allocated" || c == "host_reserved" ||
           c == "allocated_since_trace_start" || c == "host_allocated_since_trace_start";
}

std::vector<std::string> memoryTotalCategories(const std::vector<std::string>& categories, std::string* measure) {
    std::vector<std::string> out;
    for (const auto& c : categories)
        if (!isAllocatorMemoryCounter(c) && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    if (!out.empty()) {
        if (measure) *measure = "sum of the memory categories";
        return out;
    }
    static const std::pair<const char*, const char*> views[] = {
        {"allocated", "device memory allocated (allocator's Total Allocated)"},
        {"allocated_since_trace_start", "device memory allocated since the trace began (sum of Kineto's allocation deltas)"},
        {"host_allocated", "host memory allocated (no device memory events)"},
        {"host_allocated_since_trace_start", "host memory allocated since the trace began (no device memory events)"}};
    for (const auto& [c, what] : views)
        if (std::find(categories.begin(), categories.end(), c) != categories.end()) {
            if (measure) *measure = what;
            return {c};
        }
    if (measure) measure->clear();
    return out;
}

Result<MemorySummary> memorySummary(TraceStore& store, int rank, size_t maxPoints) {
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    TS_ASSIGN_OR_RETURN(auto cs, store.counters(rank));
    MemorySummary m;
    m.rank = rank;
    // Counters are levels (bytes currently held), per category; total(t) = sum of the latest
    // value of every summed category at t.
    struct Ev {
        int64_t ts;
        std::string cat;
        double v;
    };
    std::vector<Ev> evs;
    std::vector<std::string> cats;
    for (const auto& c : cs) {
        const std::string& n = str(strings, c.name);
        if (!startsWith(n, "memory.")) continue;
        std::string cat = n.substr(7);
        double& pk = m.peakBytesByCategory[cat];
        pk = std::max(pk, c.value);
        if (std::find(cats.begin(), cats.end(), cat) == cats.end()) cats.push_back(cat);
        evs.push_back({c.tsNs, std::move(cat), c.value});
    }
    if (auto it = m.peakBytesByCategory.find("allocated"); it != m.peakBytesByCategory.end())
        m.peakAllocatedBytes = it->second;
    if (auto it = m.peakBytesByCategory.find("reserved"); it != m.peakBytesByCategory.end())
        m.peakReservedBytes = it->second;
    const std::vector<std::string> summed = memoryTotalCategories(cats, &m.measure);
    std::erase_if(evs, [&](const Ev& e) { return std::find(summed.begin(), summed.end(), e.cat) == summed.end(); });
    std::stable_sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) { return a.ts < b.ts; });
    std::map<std::string, double> cur;
    double total = 0;
    std::vector<MemoryPoint> pts;
    for (size_t i = 0; i < evs.size(); ++i) {
        total += evs[i].v - cur[evs[i].cat];
        cur[evs[i].cat] = evs[i].v;
        // One point per timestamp (after all updates at that time).
        if (i + 1 == evs.size() || evs[i + 1].ts != evs[i].ts) {
            pts.push_back({evs[i].ts, total});
            m.peakTotalBytes = std::max(m.peakTotalBytes, total);
        }
    }
    m.series = downsampleKeepPeaks(pts, maxPoints);
    return m;
}

Result<CriticalPath> criticalPath(TraceStore& store, int step, size_t maxEntries) {
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    TS_ASSIGN_OR_RETURN(auto ranks, store.ranks());
    std::vector<RankData> data;
    std::vector<StepWindow> windows;
    const NameClasses classes = nameClasses(strings, Definitions::trainscope());
    for (int r : ranks) {
        TS_ASSIGN_OR_RETURN(RankData d, loadRank(store, r, classes));
        for (const auto& w : stepsOf(d, strings))
            if (w.step == step) windows.push_back(w);
        data.push_back(std::move(d));
    }
    if (windows.empty()) return Status::notFound("no rank has a 'step " + std::to_string(step) + "' range");
    std::vector<const RankData*> ptrs;
    for (auto& d : data) ptrs.push_back(&d);
    return criticalPathOf(ptrs, strings, windows, maxEntries);
}

}  // namespace ts::profiler
