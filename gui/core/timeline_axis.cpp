// TimeAxis maths (see timeline_axis.h).
#include "gui/core/timeline_axis.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ts::gui {

namespace {
// a - b as a double without int64 overflow (a, b may be far apart in extreme inputs).
double diff(int64_t a, int64_t b) {
    int64_t d;
    if (!__builtin_sub_overflow(a, b, &d)) return double(d);
    return double(a) - double(b);
}

int64_t saturate(double v) {
    if (!(v == v)) return 0;
    if (v >= 9.2e18) return std::numeric_limits<int64_t>::max() / 2;
    if (v <= -9.2e18) return std::numeric_limits<int64_t>::min() / 2;
    return int64_t(std::llround(v));
}

int64_t addSat(int64_t a, double d) { return saturate(double(a) + d); }
}  // namespace

double TimeAxis::mapTimeToX(int64_t t) const { return diff(t, startNs) / nsPerPx(); }

int64_t TimeAxis::mapXToTime(double x) const {
    double off = x * nsPerPx();
    // Exact in int64 for offsets below 2^53 ns (104 days): start + rounded offset.
    if (std::fabs(off) < 9e15) return startNs + int64_t(std::llround(off));
    return addSat(startNs, off);
}

void TimeAxis::setWidth(double px) {
    // Keep the scale and the left edge; the right edge follows the new width.
    double scale = nsPerPx();
    widthPx = std::max(1.0, px);
    endNs = addSat(startNs, scale * widthPx);
    clamp();
}

void TimeAxis::setLimits(int64_t fromNs, int64_t toNs) {
    if (toNs < fromNs) std::swap(fromNs, toNs);
    hasLimits = true;
    limitFromNs = fromNs;
    limitToNs = toNs;
    clamp();
}

void TimeAxis::zoomAt(double x, double factor) {
    if (!(factor > 0) || !std::isfinite(factor)) return;
    x = std::clamp(x, 0.0, widthPx);
    int64_t anchor = mapXToTime(x);
    double newSpan = diff(endNs, startNs) / factor;
    newSpan = std::max(newSpan, double(kMinSpanNs));
    if (hasLimits) newSpan = std::min(newSpan, diff(limitToNs, limitFromNs) * (1 + 2 * kMarginFraction) + kMinSpanNs);
    // Anchor stays at the same fraction of the width.
    double frac = x / widthPx;
    startNs = addSat(anchor, -frac * newSpan);
    endNs = addSat(startNs, newSpan);
    clamp();
}

void TimeAxis::pan(double dxPx) {
    double dt = -dxPx * nsPerPx();
    int64_t span = spanNs();
    startNs = addSat(startNs, dt);
    endNs = startNs + span;
    clamp();
}

void TimeAxis::fit(int64_t fromNs, int64_t toNs) {
    if (toNs < fromNs) std::swap(fromNs, toNs);
    startNs = fromNs;
    endNs = toNs;
    clamp();
}

void TimeAxis::clamp() {
    if (!(widthPx >= 1)) widthPx = 1;
    if (endNs - startNs < kMinSpanNs) {
        // Grow symmetrically around the centre.
        int64_t mid = startNs + (endNs - startNs) / 2;
        startNs = mid - kMinSpanNs / 2;
        endNs = startNs + kMinSpanNs;
    }
    if (!hasLimits) return;
    double dataSpan = diff(limitToNs, limitFromNs);
    int64_t margin = saturate(dataSpan * kMarginFraction);
    int64_t lo = limitFromNs - margin, hi = limitToNs + margin;
    int64_t maxSpan = std::max<int64_t>(hi - lo, kMinSpanNs);
    int64_t span = std::min<int64_t>(endNs - startNs, maxSpan);
    if (span < kMinSpanNs) span = kMinSpanNs;
    if (startNs < lo) startNs = lo;
    if (startNs + span > hi) startNs = std::max(lo, hi - span);
    endNs = startNs + span;
}

}  // namespace ts::gui
