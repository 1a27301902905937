// TimeAxis: the timeline's time <-> pixel mapping (hotspot/Tracy keep this in one small
// tested struct). Visible time is [startNs, endNs) over widthPx pixels; x = 0 is startNs.
//
// Invariants kept by every mutator: endNs - startNs >= kMinSpanNs, and, when limits are set,
// the span is at most the limits' span plus a margin on each side and the view does not drift
// further than that margin past either limit. Times are int64 ns (a run hours long is ~1e13 ns,
// far from overflow); the scale is a double, and differences are taken in int64 before being
// converted, so precision does not depend on the absolute clock value (monotonic ns ~1e15).
#pragma once

#include <cstdint>

namespace ts::gui {

struct TimeAxis {
    static constexpr int64_t kMinSpanNs = 100;
    static constexpr double kMarginFraction = 0.05;  // of the limits' span, each side

    int64_t startNs = 0;
    int64_t endNs = 1'000'000;
    double widthPx = 1000;
    // Data extent the view may not leave (beyond the margin); hasLimits=false = unbounded.
    bool hasLimits = false;
    int64_t limitFromNs = 0, limitToNs = 0;

    int64_t spanNs() const { return endNs - startNs; }
    double nsPerPx() const { return double(spanNs()) / (widthPx > 0 ? widthPx : 1); }
    double mapTimeToX(int64_t t) const;
    // Rounded to the nearest ns.
    int64_t mapXToTime(double x) const;
    // Duration of dx pixels in ns (not rounded).
    double pxToNs(double dx) const { return dx * nsPerPx(); }

    void setWidth(double px);
    void setLimits(int64_t fromNs, int64_t toNs);
    // factor > 1 zooms in (span / factor), < 1 zooms out; the time under x stays under x
    // (up to clamping at the span limits and at the edges).
    void zoomAt(double x, double factor);
    // Moves the content by dx pixels: dx > 0 drags the content right (earlier time shows).
    void pan(double dxPx);
    // Shows [fromNs, toNs) (a small margin is not added: callers fit what they ask for).
    void fit(int64_t fromNs, int64_t toNs);
    // Re-establishes the invariants (called by every mutator).
    void clamp();
};

}  // namespace ts::gui
