// Host-thread tracks and NVTX-style ranges (see backend_trace.h).
#include "engine/backend/backend_trace.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/nvtx.h"

namespace ts::engine {

namespace {

struct HostTrackEntry {
    uint64_t generation = 0;
    uint32_t track = 0;
    int depth = 0;
};

// Per thread: one entry per trace target this thread has touched (a handful at most).
thread_local std::vector<HostTrackEntry> t_hostTracks;

// How many host threads each trace generation has registered so far (for naming).
std::mutex g_threadCountMutex;
std::map<uint64_t, int> g_threadCount;

HostTrackEntry& entryFor(const TraceTarget& target) {
    for (auto& e : t_hostTracks)
        if (e.generation == target.generation) return e;
    int index = 0;
    {
        std::lock_guard<std::mutex> lock(g_threadCountMutex);
        index = g_threadCount[target.generation]++;
    }
    trace::TrackDesc desc;
    desc.rank = target.rank;
    desc.device = target.device;
    desc.kind = trace::TrackKind::HostThread;
    desc.streamIndex = index;
    desc.name = "rank " + std::to_string(target.rank) + " host";
    if (index > 0) desc.name += " " + std::to_string(index);
    HostTrackEntry e;
    e.generation = target.generation;
    e.track = target.recorder->track(desc);
    t_hostTracks.push_back(e);
    return t_hostTracks.back();
}

}  // namespace

uint32_t hostTrack(const TraceTarget& target) { return entryFor(target).track; }

uint64_t nextTraceGeneration() {
    static std::atomic<uint64_t> generation{0};
    return ++generation;
}

int hostRangeDepth(const TraceTarget& target) {
    for (auto& e : t_hostTracks)
        if (e.generation == target.generation) return e.depth;
    return 0;
}

RangeScope::RangeScope(const TraceTarget& target, std::string_view name, const RangeInfo& info)
    : m_target(target), m_info(info) {
    if (m_target.nvtx && nvtx::kEnabled) {
        // "forward step 3 mb 1 chunk 0 layer 5": the fields the range has.
        std::string text(name);
        for (const auto& [label, v] : {std::pair<const char*, int32_t>{" step ", info.step}, {" mb ", info.microbatch},
                                       {" chunk ", info.chunk}, {" layer ", info.layer}})
            if (v >= 0) text += label + std::to_string(v);
        nvtx::push(text.c_str());
    }
    if (!m_target.recorder) return;
    HostTrackEntry& e = entryFor(m_target);
    m_track = e.track;
    m_depth = e.depth++;
    m_name = m_target.recorder->intern(name);
    m_startNs = monotonicNs();
}

RangeScope::~RangeScope() {
    if (m_target.nvtx && nvtx::kEnabled) nvtx::pop();
    if (!m_target.recorder) return;
    const int64_t end = monotonicNs();
    // Look the entry up again: t_hostTracks may have grown (and moved) since construction.
    for (auto& e : t_hostTracks)
        if (e.generation == m_target.generation) e.depth = m_depth;
    trace::Slice s;
    s.track = m_track;
    s.name = m_name;
    s.category = trace::Category::Range;
    s.startNs = m_startNs;
    s.durNs = end - m_startNs;
    s.step = m_info.step;
    s.microbatch = m_info.microbatch;
    s.chunk = m_info.chunk;
    s.layer = m_info.layer;
    s.depth = m_depth;
    m_target.recorder->slice(s);
}

}  // namespace ts::engine
