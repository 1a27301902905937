// Level-of-detail folding (gui/core/timeline_lod.h): rows in, boxes out. Wide slices are
// boxes, runs of narrow ones fold into one counted box, zero-length ops stay visible, ops
// crossing the view's edges are clipped, and a row of 10^7 ops yields ~width boxes quickly.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <vector>

#include "gui/core/timeline_lod.h"

using namespace ts::gui;

namespace {
struct Row {
    std::vector<int64_t> start, end, maxEnd;
    void add(int64_t s, int64_t e) {
        start.push_back(s);
        end.push_back(e);
        maxEnd.push_back(maxEnd.empty() ? e : std::max(maxEnd.back(), e));
    }
    RowSpan span() const { return {start.data(), end.data(), maxEnd.data(), nullptr, start.size(), 0}; }
};

TimeAxis axis(int64_t from, int64_t to, double width) {
    TimeAxis a;
    a.widthPx = width;
    a.startNs = from;
    a.endNs = to;
    return a;
}

uint64_t totalOps(const std::vector<LodBox>& boxes) {
    uint64_t n = 0;
    for (auto& b : boxes) n += b.ops;
    return n;
}

void expectOrderedAndInside(const std::vector<LodBox>& boxes, double width) {
    for (size_t i = 0; i < boxes.size(); ++i) {
        EXPECT_GE(boxes[i].x0, 0);
        EXPECT_LE(boxes[i].x1, width);
        EXPECT_GE(boxes[i].x1 - boxes[i].x0, 1.0 - 1e-9);
        if (i) {
            EXPECT_GE(boxes[i].x0, boxes[i - 1].x1 - 1e-9);
            EXPECT_EQ(boxes[i].first, boxes[i - 1].first + boxes[i - 1].count);
        }
    }
}
}  // namespace

TEST(TimelineLod, WideSlicesAreOneBoxEach) {
    Row r;  // 1 ns per pixel: slices of 10-50 px with gaps
    r.add(0, 10), r.add(20, 70), r.add(100, 130);
    std::vector<LodBox> out;
    foldRow(r.span(), axis(0, 200, 200), out);
    ASSERT_EQ(out.size(), 3u);
    EXPECT_DOUBLE_EQ(out[0].x0, 0); EXPECT_DOUBLE_EQ(out[0].x1, 10);
    EXPECT_DOUBLE_EQ(out[1].x0, 20); EXPECT_DOUBLE_EQ(out[1].x1, 70);
    EXPECT_DOUBLE_EQ(out[2].x0, 100); EXPECT_DOUBLE_EQ(out[2].x1, 130);
    for (auto& b : out) EXPECT_FALSE(b.folded());
}

TEST(TimelineLod, NarrowNeighboursFoldIntoOneCountedBox) {
    Row r;
    r.add(0, 50);                                      // wide
    for (int64_t t = 60; t < 100; t += 2) r.add(t, t + 1);  // 20 ops of 1 px, 1 px apart
    r.add(150, 190);                                   // wide again, after a gap
    std::vector<LodBox> out;
    foldRow(r.span(), axis(0, 200, 200), out);
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[1].count, 20u);
    EXPECT_EQ(out[1].ops, 20u);
    EXPECT_TRUE(out[1].folded());
    EXPECT_DOUBLE_EQ(out[1].x0, 60);
    EXPECT_DOUBLE_EQ(out[1].x1, 99);
    EXPECT_EQ(out[2].first, 21u);
    expectOrderedAndInside(out, 200);
}

TEST(TimelineLod, NarrowOpsSeparatedByVisibleGapsStaySeparate) {
    Row r;  // 1-px ops 10 px apart: the gaps are wider than the fold distance
    for (int64_t t = 0; t < 100; t += 10) r.add(t, t + 1);
    std::vector<LodBox> out;
    foldRow(r.span(), axis(0, 100, 100), out);
    ASSERT_EQ(out.size(), 10u);
    for (auto& b : out) EXPECT_EQ(b.count, 1u);
}

TEST(TimelineLod, ZeroLengthOpsAreOnePixelWide) {
    Row r;
    r.add(10, 10), r.add(50, 50), r.add(100, 100);  // the last one exactly at the right edge
    std::vector<LodBox> out;
    foldRow(r.span(), axis(0, 100, 100), out);
    ASSERT_EQ(out.size(), 2u);  // [start, end) view: an op at t == end is outside
    EXPECT_DOUBLE_EQ(out[0].x0, 10); EXPECT_DOUBLE_EQ(out[0].x1, 11);
    EXPECT_DOUBLE_EQ(out[1].x0, 50); EXPECT_DOUBLE_EQ(out[1].x1, 51);
    // A zero-length op at exactly the view start is visible; one at the last pixel too.
    Row z;
    z.add(0, 0), z.add(99, 99);
    foldRow(z.span(), axis(0, 100, 100), out);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_DOUBLE_EQ(out[0].x0, 0); EXPECT_DOUBLE_EQ(out[0].x1, 1);
    EXPECT_DOUBLE_EQ(out[1].x0, 99); EXPECT_DOUBLE_EQ(out[1].x1, 100);
}

TEST(TimelineLod, OpsCrossingTheEdgesAreClipped) {
    Row r;
    r.add(-500, 30);   // crosses the left edge
    r.add(40, 60);
    r.add(90, 5000);   // crosses the right edge
    r.add(6000, 7000); // after the view
    std::vector<LodBox> out;
    foldRow(r.span(), axis(0, 100, 100), out);
    ASSERT_EQ(out.size(), 3u);
    EXPECT_DOUBLE_EQ(out[0].x0, 0); EXPECT_DOUBLE_EQ(out[0].x1, 30);
    EXPECT_DOUBLE_EQ(out[2].x0, 90); EXPECT_DOUBLE_EQ(out[2].x1, 100);
    // One op covering the whole view and beyond: a single full-width box.
    Row big;
    big.add(-1'000'000, 1'000'000);
    foldRow(big.span(), axis(0, 100, 100), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_DOUBLE_EQ(out[0].x0, 0); EXPECT_DOUBLE_EQ(out[0].x1, 100);
    // Ending exactly at the view start: not visible.
    Row before;
    before.add(-50, 0);
    foldRow(before.span(), axis(0, 100, 100), out);
    EXPECT_TRUE(out.empty());
}

TEST(TimelineLod, OneOpPerPixelFoldsIntoFewBoxesHoldingEveryOp) {
    Row r;  // 1000 back-to-back 1-px ops over a 1000-px view
    for (int64_t t = 0; t < 1000; ++t) r.add(t * 10, t * 10 + 10);
    std::vector<LodBox> out;
    foldRow(r.span(), axis(0, 10'000, 1000), out);
    EXPECT_LE(out.size(), 2u);
    EXPECT_EQ(totalOps(out), 1000u);
    expectOrderedAndInside(out, 1000);
    // Zoomed in 10x, each op is 10 px: one box per visible op.
    foldRow(r.span(), axis(0, 1000, 1000), out);
    EXPECT_EQ(out.size(), 100u);
    EXPECT_EQ(totalOps(out), 100u);
}

TEST(TimelineLod, WideSliceAfterNarrowOnesIsItsOwnBox) {
    Row r;
    r.add(0, 1), r.add(1, 2), r.add(2, 40);  // two narrow then one wide, touching
    std::vector<LodBox> out;
    foldRow(r.span(), axis(0, 100, 100), out);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].count, 2u);
    EXPECT_EQ(out[1].count, 1u);
    EXPECT_DOUBLE_EQ(out[1].x1, 40);
}

TEST(TimelineLod, OverlappingRowUsesPrefixMaxEnd) {
    Row r;  // nested: a long range then short ones inside it
    r.add(0, 1000), r.add(10, 20), r.add(30, 40), r.add(2000, 2100);
    std::vector<LodBox> out;
    // View inside the long range after the short ones: only the long one is visible.
    foldRow(r.span(), axis(500, 600, 100), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].first, 0u);
    auto [a, b] = visibleRange(r.span(), 500, 600);
    EXPECT_EQ(a, 0u);
    EXPECT_EQ(b, 3u);
}

TEST(TimelineLod, OpsPrefixCountsAggregatedElements) {
    Row r;
    r.add(0, 1), r.add(1, 2), r.add(2, 3);
    std::vector<uint64_t> prefix{0, 100, 250, 300};
    RowSpan s = r.span();
    s.opsPrefix = prefix.data();
    std::vector<LodBox> out;
    foldRow(s, axis(0, 100, 100), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].count, 3u);
    EXPECT_EQ(out[0].ops, 300u);
}

TEST(TimelineLod, OffsetShiftsTheRowOnTheAxis) {
    Row r;
    r.add(1'000'000'050, 1'000'000'080);
    RowSpan s = r.span();
    s.offsetNs = 1'000'000'000;
    std::vector<LodBox> out;
    foldRow(s, axis(0, 100, 100), out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_DOUBLE_EQ(out[0].x0, 50);
    EXPECT_DOUBLE_EQ(out[0].x1, 80);
}

TEST(TimelineLod, TenMillionOpsGiveAtMostAboutWidthBoxesFast) {
    const size_t n = 10'000'000;
    Row r;
    r.start.resize(n), r.end.resize(n), r.maxEnd.resize(n);
    // Ops of 600-1400 ns with 100-ns gaps, and a 50-ms gap every 50000 ops (200 gaps of
    // ~4.5 px at full view: visible idle time that must break the folds).
    int64_t t = 0;
    for (size_t i = 0; i < n; ++i) {
        if (i % 50000 == 0 && i) t += 50'000'000;
        r.start[i] = t;
        t += 600 + int64_t((i * 7919) % 800);
        r.end[i] = t;
        r.maxEnd[i] = t;
        t += 100;
    }
    const double width = 1920;
    std::vector<LodBox> out;
    auto t0 = std::chrono::steady_clock::now();
    foldRow(r.span(), axis(0, t, width), out);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LE(out.size(), size_t(2 * width / kMinBoxPx + 2));
    EXPECT_GE(out.size(), 200u);  // one fold per run between gaps
    EXPECT_EQ(totalOps(out), n);
    expectOrderedAndInside(out, width);
    // O(boxes log n): far below touching 10^7 slices (which takes ~10+ ms even when trivial).
    EXPECT_LT(ms, 50.0);
    // Zoomed into the middle: every visible op is wide enough to be its own box.
    int64_t mid = r.start[n / 2];
    foldRow(r.span(), axis(mid, mid + 20'000, width), out);
    EXPECT_GE(out.size(), 10u);
    for (auto& b : out) EXPECT_EQ(b.count, 1u);
}
