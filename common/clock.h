// The one clock every trace timestamp comes from: CLOCK_MONOTONIC nanoseconds (the same
// clock CUPTI/NVTX host timestamps and nsys use on Linux), plus the wall-clock epoch at a
// reference point so traces from several processes/nodes can be aligned.
#pragma once
#include <cstdint>

namespace ts {

// Monotonic nanoseconds (CLOCK_MONOTONIC).
int64_t monotonicNs();
// Wall-clock nanoseconds since the Unix epoch (CLOCK_REALTIME).
int64_t wallNs();

struct ClockAnchor {
    int64_t monotonicNs = 0;  // both read back to back, so
    int64_t wallNs = 0;       // wall = monotonic + (wallNs - monotonicNs)
};
ClockAnchor captureClockAnchor();

}  // namespace ts
