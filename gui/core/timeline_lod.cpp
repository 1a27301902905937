// Level-of-detail folding (see timeline_lod.h).
#include "gui/core/timeline_lod.h"

#include <algorithm>
#include <cmath>

namespace ts::gui {

std::pair<size_t, size_t> visibleRange(const RowSpan& row, int64_t fromNs, int64_t toNs) {
    if (row.n == 0) return {0, 0};
    const int64_t from = fromNs + row.offsetNs, to = toNs + row.offsetNs;
    // maxEnd is non-decreasing: every slice before `first` ends before the view.
    size_t first = size_t(std::lower_bound(row.maxEnd, row.maxEnd + row.n, from) - row.maxEnd);
    size_t last = size_t(std::lower_bound(row.start + first, row.start + row.n, to) - row.start);
    return {first, std::max(first, last)};
}

void foldRow(const RowSpan& row, const TimeAxis& axis, std::vector<LodBox>& out, double minBoxPx) {
    out.clear();
    if (row.n == 0 || axis.widthPx <= 0) return;
    auto [i, last] = visibleRange(row, axis.startNs, axis.endNs);
    const double width = axis.widthPx;
    const double nsPerPx = axis.nsPerPx();
    // Narrow means shorter than minBoxPx on screen; compared in ns to avoid rounding noise.
    const double minNs = minBoxPx * nsPerPx;
    const int64_t off = row.offsetNs;
    const int64_t viewFrom = axis.startNs + off;
    auto xOf = [&](int64_t t) { return axis.mapTimeToX(t - off); };
    auto opsOf = [&](size_t a, size_t b) -> uint64_t { return row.opsPrefix ? row.opsPrefix[b] - row.opsPrefix[a] : b - a; };
    auto emit = [&](int64_t s, int64_t e, size_t first, size_t count) {
        double x0 = std::max(0.0, xOf(s));
        double x1 = std::min(width, xOf(e));
        if (x1 - x0 < 1) {
            // At least one pixel; keep it inside the view.
            x1 = std::min(width, x0 + 1);
            x0 = std::max(0.0, x1 - 1);
        }
        // Boxes never overlap their left neighbour: the row reads left to right.
        if (!out.empty() && x0 < out.back().x1) {
            x0 = out.back().x1;
            if (x1 < x0 + 1) x1 = std::min(width, x0 + 1);
            if (x1 <= x0) {  // no room left at the right edge: merge into the previous box
                LodBox& b = out.back();
                b.count = first + count - b.first;
                b.ops = opsOf(b.first, first + count);
                return;
            }
        }
        out.push_back({x0, x1, first, count, opsOf(first, first + count)});
    };
    while (i < last) {
        const int64_t s = row.start[i], e = row.end[i];
        // Skip slices wholly before the view (maxEnd found a later slice reaching in, or an
        // overlapping row): a zero-length op exactly at the view start stays.
        if (e < viewFrom || (e == viewFrom && e != s)) {
            ++i;
            continue;
        }
        if (double(e - s) >= minNs) {
            emit(s, e, i, 1);
            ++i;
            continue;
        }
        // Fold: take every slice starting within minNs of the fold's start, then keep going
        // while the next one is narrow and close to the fold's end.
        const size_t foldFirst = i;
        int64_t foldEnd = e;
        size_t j = i + 1;
        for (;;) {
            const int64_t reach = row.start[j - 1] + int64_t(std::ceil(minNs));
            size_t k = size_t(std::lower_bound(row.start + j, row.start + last, reach) - row.start);
            // A wide slice at the end of the jump is drawn on its own (rows whose slices do not
            // overlap have only the last one of the jump able to be wide).
            if (k > j && double(row.end[k - 1] - row.start[k - 1]) >= minNs) --k;
            if (k > j) {
                foldEnd = std::max(foldEnd, row.end[k - 1]);
                j = k;
            }
            if (j >= last) break;
            // Continue with the next slice if it is narrow and starts close to the fold.
            const int64_t ns = row.start[j], ne = row.end[j];
            if (double(ne - ns) >= minNs || double(ns - foldEnd) >= minNs) break;
            foldEnd = std::max(foldEnd, ne);
            ++j;
        }
        emit(row.start[foldFirst], foldEnd, foldFirst, j - foldFirst);
        i = j;
    }
}

}  // namespace ts::gui
