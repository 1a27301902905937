// Trace helpers shared by the backends: the host-thread track of the calling thread and
// NVTX-style ranges (step, microbatch, forward, backward, stage, layer) recorded as
// Category::Range slices on that track, nested by depth.
//
// On a CUDA device (TraceTarget::nvtx) each range is also an NVTX range ("forward step 3 mb 1
// layer 5"), traced or not, so Nsight Systems shows the same structure; the CUPTI capture of a
// run leaves NVTX off, so a range is recorded once.
//
// Cost model: with no recorder set (TraceTarget::recorder == nullptr) and no NVTX a RangeScope
// is two branches; no clock is read and nothing is allocated.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/backend.h"

namespace ts::engine {

// Track id of the calling thread's host track for `target` (registered on first use, named
// "rank R host", or "rank R host K" for the K-th further thread of that rank). Requires
// target.recorder != nullptr.
uint32_t hostTrack(const TraceTarget& target);

// A fresh TraceTarget::generation, unique in the process across every backend (setTrace).
uint64_t nextTraceGeneration();

// Range nesting depth of the calling thread on `target`'s host track (0 = no open range).
int hostRangeDepth(const TraceTarget& target);

// Which ranges the engine records (names are what the analyses match on).
namespace range {
inline constexpr const char* kStep = "step";
inline constexpr const char* kMicrobatch = "microbatch";
inline constexpr const char* kForward = "forward";
inline constexpr const char* kBackward = "backward";
inline constexpr const char* kStage = "stage";
inline constexpr const char* kLayer = "layer";
inline constexpr const char* kOptimizer = "optimizer";
}  // namespace range

struct RangeInfo {
    int32_t step = -1, microbatch = -1, chunk = -1, layer = -1;
};

// RAII range: opens at construction, records one Range slice at destruction with the depth it
// had when it opened (outermost = 0). Must be destroyed on the thread that created it.
class RangeScope {
public:
    RangeScope(const TraceTarget& target, std::string_view name, const RangeInfo& info = {});
    RangeScope(const Device& device, std::string_view name, const RangeInfo& info = {})
        : RangeScope(device.traceTarget(), name, info) {}
    ~RangeScope();
    RangeScope(const RangeScope&) = delete;
    RangeScope& operator=(const RangeScope&) = delete;

private:
    TraceTarget m_target;
    uint32_t m_track = 0;
    uint32_t m_name = 0;
    int32_t m_depth = 0;
    int64_t m_startNs = 0;
    RangeInfo m_info;
};

}  // namespace ts::engine
