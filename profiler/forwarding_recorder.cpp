// ForwardingRecorder / TraceReplayer (see forwarding_recorder.h).
#include "profiler/forwarding_recorder.h"

#include <cstring>

#include "common/clock.h"

namespace ts::profiler {

namespace {

enum Tag : uint8_t { kTrack = 'T', kName = 'N', kSlice = 'S', kCounter = 'C', kLog = 'L' };

template <typename T> void put(std::string& b, const T& v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
}

void putStr(std::string& b, std::string_view s) {
    put(b, uint32_t(s.size()));
    b.append(s.data(), s.size());
}

struct Reader {
    std::string_view b;
    size_t at = 0;
    bool ok = true;
    template <typename T> T get() {
        T v{};
        if (!ok || b.size() - at < sizeof(T)) {
            ok = false;
            return v;
        }
        std::memcpy(&v, b.data() + at, sizeof(T));
        at += sizeof(T);
        return v;
    }
    std::string str() {
        const uint32_t n = get<uint32_t>();
        if (!ok || b.size() - at < n) {
            ok = false;
            return {};
        }
        std::string s(b.substr(at, n));
        at += n;
        return s;
    }
};

}  // namespace

uint32_t ForwardingRecorder::track(const trace::TrackDesc& d) {
    std::lock_guard<std::mutex> lock(m_mutex);
    const uint32_t id = m_nextTrack++;
    put(m_buf, uint8_t(kTrack));
    put(m_buf, id);
    put(m_buf, d.rank);
    put(m_buf, d.device);
    put(m_buf, uint8_t(d.kind));
    put(m_buf, d.streamIndex);
    putStr(m_buf, d.name);
    return id;
}

uint32_t ForwardingRecorder::intern(std::string_view text) {
    if (text.empty()) return 0;
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_names.find(std::string(text));
    if (it != m_names.end()) return it->second;
    const uint32_t id = m_nextName++;
    m_names.emplace(std::string(text), id);
    put(m_buf, uint8_t(kName));
    put(m_buf, id);
    putStr(m_buf, text);
    return id;
}

void ForwardingRecorder::slice(const trace::Slice& s) {
    std::lock_guard<std::mutex> lock(m_mutex);
    put(m_buf, uint8_t(kSlice));
    put(m_buf, s.track);
    put(m_buf, s.name);
    put(m_buf, uint8_t(s.category));
    put(m_buf, s.startNs);
    put(m_buf, s.durNs);
    put(m_buf, s.step);
    put(m_buf, s.microbatch);
    put(m_buf, s.chunk);
    put(m_buf, s.layer);
    put(m_buf, s.correlation);
    put(m_buf, s.bytes);
    put(m_buf, s.flops);
    put(m_buf, s.group);
    put(m_buf, s.depth);
}

void ForwardingRecorder::counter(const trace::Counter& c) {
    std::lock_guard<std::mutex> lock(m_mutex);
    put(m_buf, uint8_t(kCounter));
    put(m_buf, c.rank);
    put(m_buf, c.name);
    put(m_buf, c.tsNs);
    put(m_buf, c.value);
}

void ForwardingRecorder::metadata(std::string_view, std::string_view) {}

uint64_t ForwardingRecorder::nextCorrelation() {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_nextCorrelation++;
}

void ForwardingRecorder::log(std::string_view level, std::string_view text) {
    const int64_t ts = monotonicNs();
    std::lock_guard<std::mutex> lock(m_mutex);
    put(m_buf, uint8_t(kLog));
    put(m_buf, ts);
    putStr(m_buf, level);
    putStr(m_buf, text);
}

std::string ForwardingRecorder::drain() {
    std::lock_guard<std::mutex> lock(m_mutex);
    std::string out;
    out.swap(m_buf);
    return out;
}

size_t ForwardingRecorder::pendingBytes() const {
    std::lock_guard<std::mutex> lock(m_mutex);
    return m_buf.size();
}

TraceReplayer::TraceReplayer(trace::Recorder& dst, Options opts) : m_dst(dst), m_opts(std::move(opts)) {}

Status TraceReplayer::apply(std::string_view blob) {
    Reader r{blob};
    const int64_t off = m_opts.clockOffsetNs;
    while (r.ok && r.at < blob.size()) {
        const size_t recordAt = r.at;
        const uint8_t tag = r.get<uint8_t>();
        switch (tag) {
            case kTrack: {
                const uint32_t id = r.get<uint32_t>();
                trace::TrackDesc d;
                d.rank = r.get<int32_t>();
                d.device = r.get<int32_t>();
                d.kind = trace::TrackKind(r.get<uint8_t>());
                d.streamIndex = r.get<int32_t>();
                d.name = r.str();
                if (r.ok) m_tracks[id] = m_dst.track(d);
                break;
            }
            case kName: {
                const uint32_t id = r.get<uint32_t>();
                const std::string text = r.str();
                if (r.ok) m_names[id] = m_dst.intern(text);
                break;
            }
            case kSlice: {
                trace::Slice s;
                s.track = r.get<uint32_t>();
                s.name = r.get<uint32_t>();
                s.category = trace::Category(r.get<uint8_t>());
                s.startNs = r.get<int64_t>();
                s.durNs = r.get<int64_t>();
                s.step = r.get<int32_t>();
                s.microbatch = r.get<int32_t>();
                s.chunk = r.get<int32_t>();
                s.layer = r.get<int32_t>();
                s.correlation = r.get<uint64_t>();
                s.bytes = r.get<uint64_t>();
                s.flops = r.get<double>();
                s.group = r.get<uint32_t>();
                s.depth = r.get<int32_t>();
                if (!r.ok) break;
                auto t = m_tracks.find(s.track);
                if (t == m_tracks.end())
                    return Status::invalid("trace blob: slice at byte " + std::to_string(recordAt) +
                                           " names track " + std::to_string(s.track) + " that was never sent");
                s.track = t->second;
                s.name = s.name ? m_names[s.name] : 0;
                s.group = s.group ? m_names[s.group] : 0;
                s.startNs -= off;
                if (s.correlation) s.correlation |= m_opts.correlationTag;
                m_dst.slice(s);
                ++m_slices;
                break;
            }
            case kCounter: {
                trace::Counter c;
                c.rank = r.get<int32_t>();
                c.name = r.get<uint32_t>();
                c.tsNs = r.get<int64_t>();
                c.value = r.get<double>();
                if (!r.ok) break;
                c.name = c.name ? m_names[c.name] : 0;
                c.tsNs -= off;
                m_dst.counter(c);
                ++m_counters;
                break;
            }
            case kLog: {
                const int64_t ts = r.get<int64_t>();
                const std::string level = r.str();
                const std::string text = r.str();
                if (r.ok && m_opts.onLog) m_opts.onLog(ts - off, level, text);
                break;
            }
            default:
                return Status::invalid("trace blob: unknown record tag " + std::to_string(int(tag)) + " at byte " +
                                       std::to_string(recordAt));
        }
        if (!r.ok)
            return Status::invalid("trace blob truncated in the record at byte " + std::to_string(recordAt) + " of " +
                                   std::to_string(blob.size()));
    }
    return Status::ok();
}

}  // namespace ts::profiler
