// Level of detail for one timeline row (Tracy's zone folding): rows in, boxes out.
//
// A row is slices sorted by start with a prefix maximum of their ends (maxEnd[i] = max end of
// slices 0..i, non-decreasing), so the first slice that can reach into the view is found by
// binary search. foldRow() walks only what is visible and jumps over runs of narrow slices
// with binary searches, so its cost is O(boxes * log n), independent of how many slices the
// view holds: boxes <= 2 * width / minBoxPx + 2 whatever the row size.
//
// Rules:
//  - a slice at least minBoxPx wide becomes its own box (count 1), clipped to [0, width];
//  - consecutive slices narrower than that fold into one box holding `count` slices (and
//    `ops` operations, which differs from count for overview rows whose elements already
//    aggregate several ops); a fold keeps growing while the next slice is also narrow and
//    starts less than minBoxPx after the fold's end;
//  - every box is at least 1 px wide (zero-length ops stay visible);
//  - slices ending before the view or starting at/after its end are not drawn; a zero-length
//    slice at exactly the view start is drawn.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gui/core/timeline_axis.h"

namespace ts::gui {

struct RowSpan {
    const int64_t* start = nullptr;   // sorted ascending
    const int64_t* end = nullptr;     // end >= start
    const int64_t* maxEnd = nullptr;  // prefix max of end; may equal `end` when ends never decrease
    const uint64_t* opsPrefix = nullptr;  // optional: opsPrefix[i] = ops in slices [0, i); size n+1
    size_t n = 0;
    int64_t offsetNs = 0;             // subtracted from the row's times to get axis time
};

struct LodBox {
    double x0 = 0, x1 = 0;  // pixels, clipped to [0, width], x1 - x0 >= 1
    size_t first = 0;       // index of the first slice in the box
    size_t count = 0;       // slices in the box: [first, first + count)
    uint64_t ops = 0;       // operations they hold (== count unless opsPrefix was given)
    bool folded() const { return count > 1 || ops > 1; }
};

inline constexpr double kMinBoxPx = 3.0;

// Replaces `out` with the boxes of `row` for `axis`, left to right.
void foldRow(const RowSpan& row, const TimeAxis& axis, std::vector<LodBox>& out, double minBoxPx = kMinBoxPx);

// Index range [first, last) of slices that may be visible in [fromNs, toNs) (axis time):
// first = first slice whose maxEnd >= fromNs, last = first slice starting at/after toNs.
std::pair<size_t, size_t> visibleRange(const RowSpan& row, int64_t fromNs, int64_t toNs);

}  // namespace ts::gui
