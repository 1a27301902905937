// Interval algebra on sorted, disjoint half-open intervals: the building block of every
// overlap / idle / exposed-time metric. All operations are linear merges.
#include <algorithm>

#include "profiler/analysis.h"

namespace ts::profiler {

IntervalSet mergeIntervals(std::vector<Interval> v) {
    std::erase_if(v, [](const Interval& i) { return i.end <= i.start; });
    auto byStart = [](const Interval& a, const Interval& b) { return a.start < b.start; };
    // Callers often pass time-ordered kernels: an O(n) check saves the O(n log n) sort.
    if (!std::is_sorted(v.begin(), v.end(), byStart)) std::sort(v.begin(), v.end(), byStart);
    IntervalSet out;
    out.reserve(v.size());
    for (const Interval& i : v) {
        // Touching intervals merge too (HTA: a kernel starting exactly at the previous end).
        if (!out.empty() && i.start <= out.back().end) {
            out.back().end = std::max(out.back().end, i.end);
        } else {
            out.push_back(i);
        }
    }
    return out;
}

int64_t totalLength(const IntervalSet& a) {
    int64_t t = 0;
    for (const Interval& i : a) t += i.end - i.start;
    return t;
}

IntervalSet intersectSets(const IntervalSet& a, const IntervalSet& b) {
    IntervalSet out;
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        int64_t s = std::max(a[i].start, b[j].start);
        int64_t e = std::min(a[i].end, b[j].end);
        if (s < e) out.push_back({s, e});
        if (a[i].end < b[j].end) ++i;
        else ++j;
    }
    return out;
}

IntervalSet subtractSets(const IntervalSet& a, const IntervalSet& b) {
    IntervalSet out;
    size_t j = 0;
    for (const Interval& x : a) {
        int64_t cur = x.start;
        while (j < b.size() && b[j].end <= cur) ++j;
        size_t k = j;
        while (k < b.size() && b[k].start < x.end) {
            if (b[k].start > cur) out.push_back({cur, b[k].start});
            cur = std::max(cur, b[k].end);
            if (cur >= x.end) break;
            ++k;
        }
        if (cur < x.end) out.push_back({cur, x.end});
    }
    return out;
}

IntervalSet clipSet(const IntervalSet& a, int64_t from, int64_t to) {
    IntervalSet out;
    auto it = std::lower_bound(a.begin(), a.end(), from, [](const Interval& i, int64_t t) { return i.end <= t; });
    for (; it != a.end() && it->start < to; ++it) {
        int64_t s = std::max(it->start, from), e = std::min(it->end, to);
        if (s < e) out.push_back({s, e});
    }
    return out;
}

KernelClass classify(trace::Category c) {
    switch (c) {
        case trace::Category::Collective:
        case trace::Category::P2P: return KernelClass::Communication;
        case trace::Category::Memcpy:
        case trace::Category::Memset: return KernelClass::NonCompute;
        case trace::Category::Range:
        case trace::Category::Launch: return KernelClass::NotKernel;
        default: return KernelClass::Compute;
    }
}

}  // namespace ts::profiler
