// GPU activity records -> trace rows (see gpu_activity.h). No CUPTI types here.
#include "profiler/gpu_activity.h"

#include <cxxabi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "profiler/import/kernel_names.h"

namespace ts::profiler::gpu {

using trace::Category;
using trace::TrackKind;

const char* memcpyKindName(MemcpyKind k) {
    switch (k) {
        case MemcpyKind::HtoD: return "HtoD";
        case MemcpyKind::DtoH: return "DtoH";
        case MemcpyKind::HtoA: return "HtoA";
        case MemcpyKind::AtoH: return "AtoH";
        case MemcpyKind::AtoA: return "AtoA";
        case MemcpyKind::AtoD: return "AtoD";
        case MemcpyKind::DtoA: return "DtoA";
        case MemcpyKind::DtoD: return "DtoD";
        case MemcpyKind::HtoH: return "HtoH";
        case MemcpyKind::PtoP: return "PtoP";
        default: return "Unknown";
    }
}

// ---- clocks

ClockSample sampleClocks(const std::function<int64_t()>& hostNow, const std::function<int64_t()>& gpuNow,
                         int rounds) {
    ClockSample best;
    int64_t bestWidth = std::numeric_limits<int64_t>::max();
    for (int i = 0; i < std::max(1, rounds); ++i) {
        const int64_t h0 = hostNow();
        const int64_t g = gpuNow();
        const int64_t h1 = hostNow();
        const int64_t width = h1 - h0;
        if (width < 0 || width >= bestWidth) continue;
        bestWidth = width;
        // Midpoint without overflow; the GPU read happened somewhere inside [h0, h1].
        best.hostNs = h0 + width / 2;
        best.gpuNs = g;
        best.uncertaintyNs = (width + 1) / 2;
    }
    return best;
}

ClockAlignment ClockAlignment::fromSample(const ClockSample& s) {
    ClockAlignment c;
    c.m_first = c.m_last = s;
    return c;
}

ClockAlignment ClockAlignment::fromSamples(const ClockSample& first, const ClockSample& last) {
    ClockAlignment c;
    c.m_first = first;
    c.m_last = last;
    const int64_t span = last.gpuNs - first.gpuNs;
    if (span > 0) {
        c.m_slope = double(last.offsetNs() - first.offsetNs()) / double(span);
        c.m_twoPoint = true;
    } else {
        c.m_last = first;  // no usable span: constant offset from the first sample
    }
    return c;
}

int64_t ClockAlignment::offsetAt(int64_t gpuNs) const {
    // (gpuNs - first.gpuNs) is at most ~1e13 for a day-long run; slope ~1e-5: double is exact enough.
    return m_first.offsetNs() + static_cast<int64_t>(std::llround(m_slope * double(gpuNs - m_first.gpuNs)));
}

int64_t ClockAlignment::toHost(int64_t gpuNs) const { return gpuNs + offsetAt(gpuNs); }

std::string ClockAlignment::toJson() const {
    auto sample = [](const ClockSample& s) {
        return nlohmann::json{{"host_ns", s.hostNs}, {"gpu_ns", s.gpuNs}, {"offset_ns", s.offsetNs()},
                              {"uncertainty_ns", s.uncertaintyNs}};
    };
    nlohmann::json j = {{"host_clock", "CLOCK_MONOTONIC"},
                        {"gpu_clock", "cuptiGetTimestamp"},
                        {"first", sample(m_first)},
                        {"last", sample(m_last)},
                        {"two_point", m_twoPoint},
                        {"drift_ppm", driftPpm()}};
    return j.dump();
}

// ---- names

std::string demangle(const std::string& name) {
    if (name.size() < 2 || name[0] != '_' || name[1] != 'Z') return name;
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                               std::free);
    return status == 0 && out ? std::string(out.get()) : name;
}

std::string_view apiBaseName(std::string_view name) {
    const size_t pos = name.rfind("_v");
    if (pos == std::string_view::npos || pos + 2 >= name.size()) return name;
    for (size_t i = pos + 2; i < name.size(); ++i)
        if (name[i] < '0' || name[i] > '9') return name;
    return name.substr(0, pos);
}

bool isLaunchApi(std::string_view n) {
    // cudaLaunchKernel, cudaLaunchKernelExC, cudaLaunchCooperativeKernel, cuLaunchKernel(Ex),
    // cudaGraphLaunch, cudaMemcpy*, cudaMemset*, cuMemcpy*, cuMemset*.
    return n.find("Launch") != std::string_view::npos || n.find("Memcpy") != std::string_view::npos ||
           n.find("Memset") != std::string_view::npos;
}

uint64_t runCorrelation(int32_t rank, uint32_t cuptiCorrelation) {
    if (cuptiCorrelation == 0) return 0;
    const uint64_t r = static_cast<uint64_t>(static_cast<uint32_t>(rank)) & ((uint64_t(1) << 30) - 1);
    return (uint64_t(1) << 62) | (r << 32) | cuptiCorrelation;
}

// ---- converter

ActivityConverter::ActivityConverter(trace::Recorder& rec) : ActivityConverter(rec, Options{}) {}
ActivityConverter::ActivityConverter(trace::Recorder& rec, const Options& options) : m_rec(rec), m_opt(options) {}

void ActivityConverter::bindHostThread(uint32_t threadId, uint32_t track) { m_hostTracks[threadId] = track; }

void ActivityConverter::nameStream(uint32_t device, uint32_t stream, trace::TrackKind kind, std::string name,
                                   int32_t rank) {
    m_streamNames[(uint64_t(device) << 32) | stream] = {kind, std::move(name), rank};
}

int32_t ActivityConverter::rankOfDevice(uint32_t device) const {
    return device < m_opt.rankOfDevice.size() ? m_opt.rankOfDevice[device] : m_opt.rank;
}

namespace {
bool badTimes(uint64_t start, uint64_t end) { return start == 0 || end < start; }
}  // namespace

void ActivityConverter::stageDevice(uint32_t device, uint32_t stream, uint64_t start, uint64_t end, trace::Slice s) {
    s.startNs = static_cast<int64_t>(start);
    s.durNs = static_cast<int64_t>(end - start);
    m_staged.push_back({s, (uint64_t(device) << 32) | stream, false});
}

void ActivityConverter::stageHost(uint32_t threadId, uint64_t start, uint64_t end, trace::Slice s) {
    s.startNs = static_cast<int64_t>(start);
    s.durNs = static_cast<int64_t>(end - start);
    m_staged.push_back({s, threadId, true});
}

void ActivityConverter::add(const KernelRecord& r) {
    if (badTimes(r.startNs, r.endNs)) {
        ++m_stats.malformed;
        return;
    }
    auto it = m_names.find(r.name);
    if (it == m_names.end()) {
        // Classify on the demangled text: NCCL's kernels are C++ symbols (ncclDevKernel_...(args)).
        const std::string demangled = demangle(r.name);
        it = m_names.emplace(r.name, std::make_pair(localName(demangled), import::classifyKernel(demangled))).first;
    }
    trace::Slice s;
    s.name = it->second.first;
    s.category = it->second.second;
    s.correlation = runCorrelation(m_opt.rank, r.correlationId);
    ++m_stats.kernels;
    stageDevice(r.deviceId, r.streamId, r.startNs, r.endNs, s);
}

void ActivityConverter::add(const MemcpyRecord& r) {
    if (badTimes(r.startNs, r.endNs)) {
        ++m_stats.malformed;
        return;
    }
    trace::Slice s;
    s.name = localName(std::string("Memcpy ") + memcpyKindName(r.kind));
    s.category = Category::Memcpy;
    s.bytes = r.bytes;
    s.correlation = runCorrelation(m_opt.rank, r.correlationId);
    ++m_stats.memcpys;
    stageDevice(r.deviceId, r.streamId, r.startNs, r.endNs, s);
}

void ActivityConverter::add(const MemsetRecord& r) {
    if (badTimes(r.startNs, r.endNs)) {
        ++m_stats.malformed;
        return;
    }
    trace::Slice s;
    s.name = localName("Memset");
    s.category = Category::Memset;
    s.bytes = r.bytes;
    s.correlation = runCorrelation(m_opt.rank, r.correlationId);
    ++m_stats.memsets;
    stageDevice(r.deviceId, r.streamId, r.startNs, r.endNs, s);
}

int32_t ActivityConverter::openDepth(uint32_t threadId) const {
    int32_t d = 0;
    for (const auto& [id, o] : m_open)
        if (o.threadId == threadId) ++d;
    return d;
}

void ActivityConverter::add(const ApiRecord& r) {
    if (badTimes(r.startNs, r.endNs)) {
        ++m_stats.malformed;
        return;
    }
    const std::string_view base = apiBaseName(r.name);
    const bool launch = isLaunchApi(base);
    if (r.driver && !launch && !m_opt.keepAllDriverApi) {
        ++m_stats.filteredDriverApi;
        return;
    }
    trace::Slice s;
    s.name = localName(base);
    s.category = launch ? Category::Launch : Category::Other;
    s.correlation = runCorrelation(m_opt.rank, r.correlationId);
    // Depth: NVTX ranges of this thread open around the call (ranges close after the calls
    // inside them, so they are still open when the call's record arrives).
    int32_t depth = 0;
    for (const auto& [id, o] : m_open)
        if (o.threadId == r.threadId && o.startNs <= r.startNs) ++depth;
    s.depth = depth + (r.driver ? 1 : 0);  // a driver call runs inside the runtime call
    ++m_stats.apiCalls;
    stageHost(r.threadId, r.startNs, r.endNs, s);
}

void ActivityConverter::add(const MarkerRecord& r) {
    if (r.tsNs == 0) {
        ++m_stats.malformed;
        return;
    }
    switch (r.phase) {
        case MarkerPhase::Instant: {
            trace::Slice s;
            s.name = localName(r.name);
            s.category = Category::Range;
            s.depth = openDepth(r.threadId);
            ++m_stats.instants;
            stageHost(r.threadId, r.tsNs, r.tsNs, s);
            return;
        }
        case MarkerPhase::Start: {
            OpenRange o;
            o.startNs = r.tsNs;
            o.threadId = r.threadId;
            o.depth = openDepth(r.threadId);
            o.name = r.name;
            m_open[r.id] = std::move(o);
            return;
        }
        case MarkerPhase::End: {
            auto it = m_open.find(r.id);
            if (it == m_open.end()) {
                ++m_stats.unmatchedRangeEnds;
                return;
            }
            OpenRange o = std::move(it->second);
            m_open.erase(it);
            if (r.tsNs < o.startNs) {
                ++m_stats.malformed;
                return;
            }
            trace::Slice s;
            s.name = localName(o.name);
            s.category = Category::Range;
            s.depth = o.depth;
            ++m_stats.ranges;
            // A start/end range may end on another thread; it stays on the thread that opened it.
            stageHost(o.threadId, o.startNs, r.tsNs, s);
            return;
        }
    }
}

uint32_t ActivityConverter::localName(std::string_view text) {
    auto it = m_localIds.find(std::string(text));
    if (it != m_localIds.end()) return it->second;
    const auto id = static_cast<uint32_t>(m_localNames.size());
    m_localNames.emplace_back(text);
    m_localIds.emplace(m_localNames.back(), id);
    return id;
}

uint32_t ActivityConverter::recorderName(uint32_t localId) {
    if (m_localToRec.size() < m_localNames.size()) m_localToRec.resize(m_localNames.size(), 0);
    uint32_t& id = m_localToRec[localId];
    if (id == 0) id = m_rec.intern(m_localNames[localId]);
    return id;
}

uint32_t ActivityConverter::hostTrack(uint32_t threadId) {
    auto it = m_hostTracks.find(threadId);
    if (it != m_hostTracks.end()) return it->second;
    trace::TrackDesc d;
    d.rank = m_opt.rank;
    d.device = m_opt.hostDevice;
    d.kind = TrackKind::HostThread;
    // Distinct streamIndex per thread so two threads never share a (rank, kind, index) key.
    d.streamIndex = 1000 + static_cast<int32_t>(m_hostTracks.size());
    d.name = "rank " + std::to_string(m_opt.rank) + " thread " + std::to_string(threadId);
    const uint32_t id = m_rec.track(d);
    m_hostTracks.emplace(threadId, id);
    return id;
}

void ActivityConverter::flush() {
    if (m_staged.empty()) return;
    // Track kinds of streams seen for the first time (same rule as the importers).
    struct Mix {
        int64_t collective = 0, p2p = 0, copy = 0, other = 0;
    };
    std::map<uint64_t, Mix> fresh;
    for (const Staged& st : m_staged) {
        if (st.host || m_streamTracks.count(st.streamKey)) continue;
        Mix& m = fresh[st.streamKey];
        switch (st.slice.category) {
            case Category::Collective: ++m.collective; break;
            case Category::P2P: ++m.p2p; break;
            case Category::Memcpy:
            case Category::Memset: ++m.copy; break;
            default: ++m.other; break;
        }
    }
    for (const auto& [key, m] : fresh) {
        trace::TrackDesc d;
        d.device = static_cast<int32_t>(key >> 32);
        d.rank = rankOfDevice(static_cast<uint32_t>(d.device));
        d.streamIndex = static_cast<int32_t>(key & 0xffffffffu);
        if (auto named = m_streamNames.find(key); named != m_streamNames.end()) {
            if (named->second.rank >= 0) d.rank = named->second.rank;
            d.kind = named->second.kind;
            d.name = "rank " + std::to_string(d.rank) + " " + named->second.name;
            m_streamTracks.emplace(key, m_rec.track(d));
            continue;
        }
        if (m.other == 0 && m.copy == 0 && m.collective + m.p2p > 0)
            d.kind = m.collective > 0 ? TrackKind::Comm : TrackKind::P2P;
        else if (m.other == 0 && m.collective + m.p2p == 0 && m.copy > 0)
            d.kind = TrackKind::Copy;
        else
            d.kind = TrackKind::Compute;
        d.name = "rank " + std::to_string(d.rank) + " gpu " + std::to_string(d.device) + " stream " +
                 std::to_string(d.streamIndex) + " (" + trace::trackKindName(d.kind) + ")";
        m_streamTracks.emplace(key, m_rec.track(d));
    }
    for (Staged& st : m_staged) {
        trace::Slice& s = st.slice;
        s.name = recorderName(s.name);
        s.track = st.host ? hostTrack(static_cast<uint32_t>(st.streamKey)) : m_streamTracks.at(st.streamKey);
        const int64_t start = m_clock.toHost(s.startNs);
        const int64_t end = m_clock.toHost(s.startNs + s.durNs);
        s.startNs = start;
        s.durNs = std::max<int64_t>(0, end - start);
    }
    // (track, ts) order: the store's clustered key, fastest to insert.
    std::sort(m_staged.begin(), m_staged.end(), [](const Staged& a, const Staged& b) {
        return a.slice.track != b.slice.track ? a.slice.track < b.slice.track : a.slice.startNs < b.slice.startNs;
    });
    for (const Staged& st : m_staged) m_rec.slice(st.slice);
    m_staged.clear();
}

std::string ActivityConverter::statsJson() const {
    nlohmann::json j = {{"kernels", m_stats.kernels},
                        {"memcpys", m_stats.memcpys},
                        {"memsets", m_stats.memsets},
                        {"api_calls", m_stats.apiCalls},
                        {"ranges", m_stats.ranges},
                        {"instants", m_stats.instants},
                        {"filtered_driver_api", m_stats.filteredDriverApi},
                        {"malformed", m_stats.malformed},
                        {"unmatched_range_ends", m_stats.unmatchedRangeEnds},
                        {"open_ranges", m_stats.openRanges},
                        {"dropped_by_cupti", m_stats.droppedByCupti}};
    return j.dump();
}

void ActivityConverter::finish() {
    flush();
    m_stats.openRanges = static_cast<int64_t>(m_open.size());
    m_rec.metadata("cupti.clock", m_clock.toJson());
    m_rec.metadata("cupti.stats", statsJson());
}

}  // namespace ts::profiler::gpu
