// Clock reads.
#include "common/clock.h"

#include <ctime>

namespace ts {

static int64_t readClock(clockid_t id) {
    timespec t{};
    clock_gettime(id, &t);
    return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

int64_t monotonicNs() { return readClock(CLOCK_MONOTONIC); }
int64_t wallNs() { return readClock(CLOCK_REALTIME); }

ClockAnchor captureClockAnchor() {
    ClockAnchor a;
    a.monotonicNs = monotonicNs();
    a.wallNs = wallNs();
    return a;
}

}  // namespace ts
