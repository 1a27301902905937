// TimeAxis maths (gui/core/timeline_axis.h): time <-> pixel round trips, zoom keeps the time
// under the cursor, pan, fit, clamps, and traces hours long on a monotonic clock.
#include <gtest/gtest.h>

#include "gui/core/timeline_axis.h"

using namespace ts::gui;

namespace {
TimeAxis makeAxis(int64_t from, int64_t to, double width) {
    TimeAxis a;
    a.widthPx = width;
    a.setLimits(from, to);
    a.fit(from, to);
    return a;
}
}  // namespace

TEST(TimelineAxis, MapsTimeToPixelsAndBack) {
    TimeAxis a = makeAxis(1000, 11000, 1000);  // 10 ns per pixel
    EXPECT_DOUBLE_EQ(a.nsPerPx(), 10.0);
    EXPECT_DOUBLE_EQ(a.mapTimeToX(1000), 0.0);
    EXPECT_DOUBLE_EQ(a.mapTimeToX(6000), 500.0);
    EXPECT_DOUBLE_EQ(a.mapTimeToX(11000), 1000.0);
    EXPECT_EQ(a.mapXToTime(0), 1000);
    EXPECT_EQ(a.mapXToTime(250.4), 3504);
    for (int64_t t = 1000; t <= 11000; t += 777) EXPECT_EQ(a.mapXToTime(a.mapTimeToX(t)), t);
    // Outside the view maps outside [0, width].
    EXPECT_LT(a.mapTimeToX(0), 0);
    EXPECT_GT(a.mapTimeToX(20000), 1000);
}

TEST(TimelineAxis, ZoomKeepsTheTimeUnderTheCursor) {
    TimeAxis a = makeAxis(0, 1'000'000'000, 1200);
    for (double x : {100.0, 600.0, 1033.0}) {
        TimeAxis b = a;
        int64_t before = b.mapXToTime(x);
        b.zoomAt(x, 4.0);
        EXPECT_NEAR(double(b.spanNs()), 250'000'000.0, 2.0);
        EXPECT_NEAR(double(b.mapXToTime(x)), double(before), b.nsPerPx()) << x;
        int64_t mid = b.mapXToTime(x);
        b.zoomAt(x, 0.5);
        EXPECT_NEAR(double(b.mapXToTime(x)), double(mid), b.nsPerPx()) << x;
        EXPECT_NEAR(double(b.spanNs()), 500'000'000.0, 2.0);
    }
}

TEST(TimelineAxis, ClampsSpanToMinimumAndToTheDataWithMargin) {
    TimeAxis a = makeAxis(0, 1'000'000, 1000);
    for (int i = 0; i < 200; ++i) a.zoomAt(500, 10);
    EXPECT_EQ(a.spanNs(), TimeAxis::kMinSpanNs);
    EXPECT_GE(a.startNs, 0);
    EXPECT_LE(a.endNs, 1'000'000);
    for (int i = 0; i < 200; ++i) a.zoomAt(500, 0.1);
    // Zoomed all the way out: the data plus at most the margin on each side.
    EXPECT_LE(a.spanNs(), int64_t(1'000'000 * (1 + 2 * TimeAxis::kMarginFraction)) + 1);
    EXPECT_LE(a.startNs, 0);
    EXPECT_GE(a.endNs, 1'000'000);
    EXPECT_GE(a.startNs, -int64_t(1'000'000 * TimeAxis::kMarginFraction) - 1);
}

TEST(TimelineAxis, PanMovesContentWithTheMouseAndStopsAtTheEdges) {
    TimeAxis a = makeAxis(0, 1'000'000, 1000);
    a.fit(400'000, 500'000);  // 100 ns per pixel
    a.pan(100);               // drag right: earlier time comes into view
    EXPECT_EQ(a.startNs, 390'000);
    EXPECT_EQ(a.spanNs(), 100'000);
    a.pan(-300);
    EXPECT_EQ(a.startNs, 420'000);
    a.pan(1e9);  // far left: stops at the margin before the data
    EXPECT_EQ(a.startNs, -int64_t(1'000'000 * TimeAxis::kMarginFraction));
    EXPECT_EQ(a.spanNs(), 100'000);
    a.pan(-1e9);
    EXPECT_EQ(a.endNs, 1'000'000 + int64_t(1'000'000 * TimeAxis::kMarginFraction));
}

TEST(TimelineAxis, HoursLongTraceOnAMonotonicClockKeepsNanosecondPrecision) {
    // A 10-hour trace starting at a monotonic clock of ~11 days, zoomed to 1 µs at its end.
    const int64_t t0 = 950'000'000'000'000LL, hours10 = 36'000'000'000'000LL;
    TimeAxis a = makeAxis(t0, t0 + hours10, 1920);
    EXPECT_NEAR(a.mapTimeToX(t0 + hours10 / 2), 960.0, 1e-6);
    a.fit(t0 + hours10 - 1000, t0 + hours10);
    EXPECT_EQ(a.spanNs(), 1000);
    EXPECT_EQ(a.mapXToTime(0), t0 + hours10 - 1000);
    EXPECT_EQ(a.mapXToTime(1920), t0 + hours10);
    for (int64_t t = t0 + hours10 - 1000; t <= t0 + hours10; t += 7)
        EXPECT_EQ(a.mapXToTime(a.mapTimeToX(t)), t);
    for (int i = 0; i < 40; ++i) a.zoomAt(960, 0.1);  // all the way out
    EXPECT_LE(a.startNs, t0);
    EXPECT_GE(a.endNs, t0 + hours10);
    // Extreme values do not overflow.
    TimeAxis w;
    w.widthPx = 100;
    w.fit(INT64_MIN / 4, INT64_MAX / 4);
    EXPECT_GT(w.mapTimeToX(0), 0);
    EXPECT_LT(w.mapTimeToX(0), 100);
}

TEST(TimelineAxis, ResizeKeepsScaleAndLeftEdge) {
    TimeAxis a = makeAxis(0, 1'000'000, 1000);
    a.fit(100'000, 200'000);
    a.setWidth(500);
    EXPECT_EQ(a.startNs, 100'000);
    EXPECT_EQ(a.spanNs(), 50'000);
    EXPECT_DOUBLE_EQ(a.nsPerPx(), 100.0);
}
