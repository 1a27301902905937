// Packed slice chunks: encoder, decoder and the (track, ts) ordering used before encoding.
// Layout in slice_codec.h.
#include "profiler/slice_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ts::profiler::codec {

namespace {

inline uint64_t zigzag(int64_t v) { return (uint64_t(v) << 1) ^ uint64_t(v >> 63); }
inline int64_t unzigzag(uint64_t v) { return int64_t(v >> 1) ^ -int64_t(v & 1); }

inline uint8_t* putVarint(uint8_t* p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = uint8_t(v | 0x80);
        v >>= 7;
    }
    *p++ = uint8_t(v);
    return p;
}

struct Reader {
    const uint8_t* p;
    const uint8_t* end;
    bool ok = true;
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (p == end) break;
            uint8_t b = *p++;
            v |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        ok = false;
        return 0;
    }
};

// Worst case bytes of one encoded slice: 13 varints of <= 10 bytes + raw flops.
constexpr size_t kMaxSliceBytes = 13 * 10 + 9;

}  // namespace

void encodeChunk(const trace::Slice* const* slices, size_t n, std::vector<uint8_t>& out) {
    size_t old = out.size();
    out.resize(old + 1 + n * kMaxSliceBytes);
    uint8_t* p = out.data() + old;
    *p++ = kChunkFormat;
    // Deltas in unsigned arithmetic: wraps instead of overflowing for extreme timestamps.
    uint64_t prev = n ? uint64_t(slices[0]->startNs) : 0;
    for (size_t i = 0; i < n; ++i) {
        const trace::Slice& s = *slices[i];
        p = putVarint(p, zigzag(int64_t(uint64_t(s.startNs) - prev)));
        prev = uint64_t(s.startNs);
        p = putVarint(p, zigzag(s.durNs));
        p = putVarint(p, s.name);
        p = putVarint(p, uint64_t(s.category));
        uint64_t flopsBits;
        std::memcpy(&flopsBits, &s.flops, sizeof flopsBits);
        unsigned mask = (s.step != -1 ? 1u : 0u) | (s.microbatch != -1 ? 2u : 0u) | (s.chunk != -1 ? 4u : 0u) |
                        (s.layer != -1 ? 8u : 0u) | (s.correlation != 0 ? 16u : 0u) | (s.bytes != 0 ? 32u : 0u) |
                        (flopsBits != 0 ? 64u : 0u) | (s.group != 0 ? 128u : 0u) | (s.depth != 0 ? 256u : 0u);
        p = putVarint(p, mask);
        if (mask & 1) p = putVarint(p, zigzag(s.step));
        if (mask & 2) p = putVarint(p, zigzag(s.microbatch));
        if (mask & 4) p = putVarint(p, zigzag(s.chunk));
        if (mask & 8) p = putVarint(p, zigzag(s.layer));
        if (mask & 16) p = putVarint(p, s.correlation);
        if (mask & 32) p = putVarint(p, s.bytes);
        if (mask & 64) {
            double f = s.flops;
            if (f >= 0 && !std::signbit(f) && f < 9007199254740992.0 && f == std::floor(f)) {
                p = putVarint(p, uint64_t(f) << 1);
            } else {
                *p++ = 1;
                std::memcpy(p, &flopsBits, 8);
                p += 8;
            }
        }
        if (mask & 128) p = putVarint(p, s.group);
        if (mask & 256) p = putVarint(p, zigzag(s.depth));
    }
    out.resize(size_t(p - out.data()));
}

bool decodeChunk(const uint8_t* data, size_t size, size_t n, uint32_t track, int64_t tsFirst,
                 std::vector<trace::Slice>& out) {
    const size_t old = out.size();
    if (size < 1 || data[0] != kChunkFormat) return false;
    // Every slice takes at least 5 bytes, so a bogus n cannot make us allocate much.
    if (n > (size - 1) / 5) return false;
    out.resize(old + n);
    Reader r{data + 1, data + size};
    uint64_t ts = uint64_t(tsFirst);
    for (size_t i = 0; i < n && r.ok; ++i) {
        trace::Slice& s = out[old + i];
        s = trace::Slice{};
        s.track = track;
        ts += uint64_t(unzigzag(r.varint()));
        s.startNs = int64_t(ts);
        s.durNs = unzigzag(r.varint());
        s.name = uint32_t(r.varint());
        uint64_t cat = r.varint();
        s.category = cat <= uint64_t(trace::Category::Other) ? trace::Category(cat) : trace::Category::Other;
        uint64_t mask = r.varint();
        if (mask >= 512) r.ok = false;
        if (mask & 1) s.step = int32_t(unzigzag(r.varint()));
        if (mask & 2) s.microbatch = int32_t(unzigzag(r.varint()));
        if (mask & 4) s.chunk = int32_t(unzigzag(r.varint()));
        if (mask & 8) s.layer = int32_t(unzigzag(r.varint()));
        if (mask & 16) s.correlation = r.varint();
        if (mask & 32) s.bytes = r.varint();
        if (mask & 64) {
            uint64_t v = r.varint();
            if (v & 1) {
                if (v != 1 || r.end - r.p < 8) {
                    r.ok = false;
                } else {
                    std::memcpy(&s.flops, r.p, 8);
                    r.p += 8;
                }
            } else {
                s.flops = double(v >> 1);
            }
        }
        if (mask & 128) s.group = uint32_t(r.varint());
        if (mask & 256) s.depth = int32_t(unzigzag(r.varint()));
    }
    if (!r.ok || r.p != r.end) {
        out.resize(old);
        return false;
    }
    return true;
}

void orderByTrackAndTs(const trace::Slice* s, size_t n, std::vector<const trace::Slice*>& out) {
    out.resize(n);
    bool sorted = true;
    uint32_t maxTrack = 0;
    for (size_t i = 0; i < n; ++i) {
        maxTrack = std::max(maxTrack, s[i].track);
        if (i && (s[i - 1].track > s[i].track || (s[i - 1].track == s[i].track && s[i - 1].startNs > s[i].startNs)))
            sorted = false;
    }
    if (sorted) {
        for (size_t i = 0; i < n; ++i) out[i] = s + i;
        return;
    }
    if (size_t(maxTrack) <= 4 * n + 1024) {
        // Stable counting sort by track (track ids are small and dense).
        std::vector<size_t> start(size_t(maxTrack) + 2, 0);
        for (size_t i = 0; i < n; ++i) ++start[size_t(s[i].track) + 1];
        for (size_t t = 1; t < start.size(); ++t) start[t] += start[t - 1];
        std::vector<size_t> fill(start.begin(), start.end() - 1);
        for (size_t i = 0; i < n; ++i) out[fill[s[i].track]++] = s + i;
    } else {
        for (size_t i = 0; i < n; ++i) out[i] = s + i;
        std::stable_sort(out.begin(), out.end(),
                         [](const trace::Slice* a, const trace::Slice* b) { return a->track < b->track; });
    }
    // Then each track's run by time, sorting only runs that are out of order.
    auto byTs = [](const trace::Slice* a, const trace::Slice* b) { return a->startNs < b->startNs; };
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        bool runSorted = true;
        for (; j < n && out[j]->track == out[i]->track; ++j) runSorted = runSorted && out[j - 1]->startNs <= out[j]->startNs;
        if (!runSorted) std::stable_sort(out.begin() + ptrdiff_t(i), out.begin() + ptrdiff_t(j), byTs);
        i = j;
    }
}

}  // namespace ts::profiler::codec
