// Kineto / Chrome-trace JSON importer: a SAX state machine over nlohmann's parser.
#include "profiler/import/kineto_import.h"

#include <cmath>
#include <istream>
#include <limits>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "profiler/import/gzip_reader.h"
#include "profiler/import/kernel_names.h"

namespace ts::profiler::import {

namespace {
__extension__ typedef __int128 Int128;  // GCC/Clang builtin; exact arithmetic for us -> ns
}  // namespace

bool microsTextToNs(std::string_view text, int64_t& ns) {
    // mantissa * 10^exp10 microseconds; computed exactly in 128-bit integers.
    size_t i = 0;
    bool negative = false;
    if (i < text.size() && (text[i] == '-' || text[i] == '+')) negative = text[i++] == '-';
    Int128 mantissa = 0;
    int exp10 = 0, digits = 0;
    bool seenDigit = false, seenPoint = false;
    for (; i < text.size(); ++i) {
        char c = text[i];
        if (c >= '0' && c <= '9') {
            seenDigit = true;
            if (digits < 36) {
                mantissa = mantissa * 10 + (c - '0');
                if (mantissa != 0) ++digits;
                if (seenPoint) --exp10;
            } else if (!seenPoint) {
                ++exp10;  // digits beyond 36 significant ones only scale the value
            }
        } else if (c == '.' && !seenPoint) {
            seenPoint = true;
        } else {
            break;
        }
    }
    if (!seenDigit) return false;
    if (i < text.size()) {
        if (text[i] != 'e' && text[i] != 'E') return false;
        ++i;
        bool expNeg = false;
        if (i < text.size() && (text[i] == '-' || text[i] == '+')) expNeg = text[i++] == '-';
        int e = 0;
        bool expDigit = false;
        for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
            expDigit = true;
            if (e < 10000) e = e * 10 + (text[i] - '0');
        }
        if (!expDigit || i != text.size()) return false;
        exp10 += expNeg ? -e : e;
    }
    exp10 += 3;  // us -> ns
    const Int128 limit = static_cast<Int128>(std::numeric_limits<int64_t>::max());
    if (mantissa == 0) {
        ns = 0;
        return true;
    }
    while (exp10 > 0) {
        if (mantissa > limit) return false;
        mantissa *= 10;
        --exp10;
    }
    if (exp10 < 0) {
        if (exp10 < -38) {
            mantissa = 0;
        } else {
            Int128 div = 1;
            for (int k = 0; k < -exp10; ++k) div *= 10;
            Int128 q = mantissa / div, r = mantissa % div;
            if (2 * r >= div) ++q;
            mantissa = q;
        }
    }
    if (mantissa > limit) return false;
    ns = static_cast<int64_t>(negative ? -mantissa : mantissa);
    return true;
}

namespace {

using json = nlohmann::json;
using trace::Category;

// "stream 7 " -> 7, "GPU 0" -> 0 (older Kineto names GPU rows by text); 0 when there is no number.
int64_t trailingNumber(const std::string& text) {
    size_t end = text.find_last_of("0123456789");
    if (end == std::string::npos) return 0;
    size_t begin = text.find_last_not_of("0123456789", end);
    begin = begin == std::string::npos ? 0 : begin + 1;
    if (end - begin + 1 > 18) return 0;
    return std::stoll(text.substr(begin, end - begin + 1));
}

// One traceEvents entry as read; reused between events (strings keep their capacity).
struct RawEvent {
    std::string ph, cat, name;
    bool pidIsText = false, tidIsText = false;
    int64_t pid = 0, tid = 0;
    std::string pidText, tidText;
    bool hasTs = false, hasDur = false;
    int64_t tsNs = 0, durNs = 0;
    bool malformed = false;  // a known field had the wrong type
    // args
    int64_t correlation = 0, stream = -1, device = -1, bytes = -1;
    int64_t deviceType = -1, inNelems = -1, outNelems = -1;
    bool hasAllocated = false, hasReserved = false, hasMemBytes = false;
    double memBytes = 0;  // "Bytes" of a [memory] event: + allocation, - free
    double totalAllocated = 0, totalReserved = 0;
    std::string dtype, groupName, groupDesc, argName;

    void reset() {
        ph.clear(); cat.clear(); name.clear(); pidText.clear(); tidText.clear();
        pidIsText = tidIsText = hasTs = hasDur = malformed = hasAllocated = hasReserved = hasMemBytes = false;
        memBytes = 0;
        pid = tid = tsNs = durNs = 0;
        correlation = 0;
        stream = device = bytes = deviceType = inNelems = outNelems = -1;
        totalAllocated = totalReserved = 0;
        dtype.clear(); groupName.clear(); groupDesc.clear(); argName.clear();
    }
};

enum class Field : uint8_t {
    None, Ph, Cat, Name, Pid, Tid, Ts, Dur, Args,
    // args
    Correlation, Stream, Device, Bytes, DeviceType, TotalAllocated, TotalReserved, InNelems,
    OutNelems, Dtype, GroupName, GroupDesc, ArgName, MemBytes,
    // top level
    BaseTime, DistRank, DistWorldSize, DistBackend, DeviceName, DeviceMemory, SchemaVersion,
};

class KinetoSax {
public:
    explicit KinetoSax(StagedFile& out) : m_out(out) {}

    // ---- nlohmann SAX interface
    bool null() { return scalarOther(); }
    bool boolean(bool) { return scalarOther(); }
    bool number_integer(json::number_integer_t v) { return number(static_cast<double>(v), &v, nullptr); }
    bool number_unsigned(json::number_unsigned_t v) {
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return number(static_cast<double>(v), nullptr, nullptr);
        auto i = static_cast<int64_t>(v);
        return number(static_cast<double>(v), &i, nullptr);
    }
    bool number_float(json::number_float_t v, const std::string& text) { return number(v, nullptr, &text); }
    bool string(std::string& s);
    bool binary(json::binary_t&) { return scalarOther(); }
    bool start_object(std::size_t);
    bool end_object();
    bool start_array(std::size_t);
    bool end_array();
    bool key(std::string& k);
    bool parse_error(std::size_t position, const std::string& lastToken, const nlohmann::detail::exception& e) {
        m_error = "JSON error at byte " + std::to_string(position) + ": " + e.what();
        (void)lastToken;
        return false;
    }

    void finish();
    bool sawTrace() const { return m_sawEvents; }
    const std::string& error() const { return m_error; }
    int64_t eventsSeen() const { return m_eventsSeen; }

private:
    bool scalarOther() {
        // null/true/false where an event field needs a string or number: wrong type.
        if (m_eventDepth > 0 && !m_inArgs && m_depth == m_eventDepth && m_field != Field::None)
            m_ev.malformed = true;
        m_field = Field::None;
        return true;
    }
    bool number(double v, const int64_t* asInt, const std::string* text);
    void processEvent();
    uint32_t gpuTrack(int64_t device, int64_t stream);
    uint32_t hostTrack();

    StagedFile& m_out;
    RawEvent m_ev;
    int m_depth = 0;
    bool m_rootIsArray = false;
    std::string m_topKey;      // last key at depth 1
    int m_eventsDepth = -1;    // depth of the traceEvents array's contents' container
    int m_eventDepth = 0;      // depth inside the current event object (0: not in an event)
    bool m_inArgs = false;
    bool m_inDistInfo = false;
    int m_devicePropsDepth = 0;
    Field m_field = Field::None;
    bool m_sawEvents = false;
    int64_t m_eventsSeen = 0;
    std::string m_error;
    std::optional<int64_t> m_baseTimeNs;
    int64_t m_minTsNs = std::numeric_limits<int64_t>::max();
    double m_deviceDeltaLevel = 0, m_hostDeltaLevel = 0;  // 2021-format memory events
    // What the import kept and converted, by kind (stats "import.kineto.kept.*" /
    // ".converted.*"); counted in plain integers, the per-event path stays cheap.
    enum CountKind { KeptKernels, KeptGpuCopies, KeptGpuSyncs, KeptGpuAnnotations, KeptHostEvents, KeptHostAnnotations,
                     KeptMemoryEvents, ConvertedHostOpsWithStream, ConvertedMemoryDeltas, SkippedFlows,
                     SkippedMetadata, SkippedProfilerSpans, SkippedInstants, CountKinds };
    int64_t m_counts[CountKinds] = {};

    std::map<std::pair<int64_t, int64_t>, uint32_t> m_gpuTracks;   // (device, stream)
    std::map<std::pair<int64_t, int64_t>, uint32_t> m_hostTracks;  // (pid, tid)
    std::unordered_map<std::string, int64_t> m_textIds;            // textual pid/tid -> synthetic id
    std::map<std::pair<int64_t, int64_t>, std::string> m_threadNames;
    std::map<int64_t, std::string> m_processNames;
};

bool KinetoSax::start_object(std::size_t) {
    ++m_depth;
    if (m_depth == 1) {
        m_rootIsArray = false;
    } else if (m_eventsDepth > 0 && m_depth == m_eventsDepth + 1 && m_eventDepth == 0) {
        m_eventDepth = m_depth;
        m_ev.reset();
        ++m_eventsSeen;
    } else if (m_eventDepth > 0 && m_depth == m_eventDepth + 1 && m_field == Field::Args) {
        m_inArgs = true;
    } else if (m_eventDepth > 0 && m_field != Field::None && m_field != Field::Args && !m_inArgs) {
        m_ev.malformed = true;  // e.g. "ts": {...}
    } else if (m_depth == 2 && m_topKey == "distributedInfo") {
        m_inDistInfo = true;
    }
    m_field = Field::None;
    return true;
}

bool KinetoSax::end_object() {
    if (m_inArgs && m_depth == m_eventDepth + 1) m_inArgs = false;
    if (m_eventDepth > 0 && m_depth == m_eventDepth) {
        processEvent();
        m_eventDepth = 0;
    }
    if (m_inDistInfo && m_depth == 2) m_inDistInfo = false;
    --m_depth;
    m_field = Field::None;
    return true;
}

bool KinetoSax::start_array(std::size_t) {
    ++m_depth;
    if (m_depth == 1) {
        m_rootIsArray = true;  // JSON Array Format: the root is the event list
        m_eventsDepth = 1;
        m_sawEvents = true;
    } else if (m_depth == 2 && !m_rootIsArray && m_topKey == "traceEvents") {
        m_eventsDepth = 2;
        m_sawEvents = true;
    } else if (m_depth == 2 && m_topKey == "deviceProperties") {
        m_devicePropsDepth = 2;
    } else if (m_eventDepth > 0 && m_field != Field::None && !m_inArgs) {
        m_ev.malformed = true;
    }
    m_field = Field::None;
    return true;
}

bool KinetoSax::end_array() {
    if (m_depth == m_eventsDepth) m_eventsDepth = -1;
    if (m_depth == m_devicePropsDepth) m_devicePropsDepth = 0;
    --m_depth;
    m_field = Field::None;
    return true;
}

bool KinetoSax::key(std::string& k) {
    m_field = Field::None;
    if (m_depth == 1 && !m_rootIsArray) {
        m_topKey = k;
        if (k == "baseTimeNanoseconds") m_field = Field::BaseTime;
        else if (k == "schemaVersion") m_field = Field::SchemaVersion;
        return true;
    }
    if (m_eventDepth > 0 && m_inArgs && m_depth == m_eventDepth + 1) {
        // args keys used by the importer (Kineto spells them with spaces and capitals).
        if (k == "correlation") m_field = Field::Correlation;
        else if (k == "stream") m_field = Field::Stream;
        else if (k == "device") m_field = Field::Device;
        else if (k == "bytes") m_field = Field::Bytes;
        else if (k == "Device Type") m_field = Field::DeviceType;
        else if (k == "Total Allocated") m_field = Field::TotalAllocated;
        else if (k == "Total Reserved") m_field = Field::TotalReserved;
        else if (k == "In msg nelems") m_field = Field::InNelems;
        else if (k == "Out msg nelems") m_field = Field::OutNelems;
        else if (k == "dtype") m_field = Field::Dtype;
        else if (k == "Process Group Name") m_field = Field::GroupName;
        else if (k == "Process Group Description") m_field = Field::GroupDesc;
        else if (k == "name") m_field = Field::ArgName;
        else if (k == "Bytes") m_field = Field::MemBytes;
        return true;
    }
    if (m_eventDepth > 0 && m_depth == m_eventDepth) {
        if (k == "ph") m_field = Field::Ph;
        else if (k == "cat") m_field = Field::Cat;
        else if (k == "name") m_field = Field::Name;
        else if (k == "pid") m_field = Field::Pid;
        else if (k == "tid") m_field = Field::Tid;
        else if (k == "ts") m_field = Field::Ts;
        else if (k == "dur") m_field = Field::Dur;
        else if (k == "args") m_field = Field::Args;
        return true;
    }
    if (m_inDistInfo && m_depth == 2) {
        if (k == "rank") m_field = Field::DistRank;
        else if (k == "world_size") m_field = Field::DistWorldSize;
        else if (k == "backend") m_field = Field::DistBackend;
        return true;
    }
    if (m_devicePropsDepth > 0 && m_depth == m_devicePropsDepth + 1) {
        if (k == "name") m_field = Field::DeviceName;
        else if (k == "totalGlobalMem") m_field = Field::DeviceMemory;
    }
    return true;
}

bool KinetoSax::string(std::string& s) {
    Field f = m_field;
    m_field = Field::None;
    switch (f) {
        case Field::Ph: m_ev.ph = s; break;
        case Field::Cat: m_ev.cat = s; break;
        case Field::Name: m_ev.name = s; break;
        case Field::Pid: m_ev.pidIsText = true; m_ev.pidText = s; break;
        case Field::Tid: m_ev.tidIsText = true; m_ev.tidText = s; break;
        case Field::Ts:
            m_ev.hasTs = microsTextToNs(s, m_ev.tsNs);
            m_ev.malformed |= !m_ev.hasTs;
            break;
        case Field::Dur:
            m_ev.hasDur = microsTextToNs(s, m_ev.durNs);
            m_ev.malformed |= !m_ev.hasDur;
            break;
        case Field::Dtype: m_ev.dtype = s; break;
        case Field::GroupName: m_ev.groupName = s; break;
        case Field::GroupDesc: m_ev.groupDesc = s; break;
        case Field::ArgName: m_ev.argName = s; break;
        case Field::DistBackend: m_out.info["backend"] = s; break;
        case Field::DeviceName:
            if (!m_out.info.count("device_name")) m_out.info["device_name"] = s;
            break;
        case Field::Args: m_ev.malformed = true; break;
        default: break;
    }
    return true;
}

bool KinetoSax::number(double v, const int64_t* asInt, const std::string* text) {
    Field f = m_field;
    m_field = Field::None;
    auto toInt = [&](int64_t& out) {
        if (asInt) { out = *asInt; return true; }
        if (std::isfinite(v) && std::fabs(v) < 9.0e18) { out = static_cast<int64_t>(std::llround(v)); return true; }
        return false;
    };
    auto toNs = [&](int64_t& out) {
        if (text) return microsTextToNs(*text, out);
        if (asInt) {
            if (*asInt > std::numeric_limits<int64_t>::max() / 1000 || *asInt < std::numeric_limits<int64_t>::min() / 1000)
                return false;
            out = *asInt * 1000;
            return true;
        }
        return false;
    };
    switch (f) {
        case Field::Pid: m_ev.malformed |= !toInt(m_ev.pid); break;
        case Field::Tid: m_ev.malformed |= !toInt(m_ev.tid); break;
        case Field::Ts:
            m_ev.hasTs = toNs(m_ev.tsNs);
            m_ev.malformed |= !m_ev.hasTs;
            break;
        case Field::Dur:
            m_ev.hasDur = toNs(m_ev.durNs);
            m_ev.malformed |= !m_ev.hasDur;
            break;
        case Field::Correlation: {
            int64_t c = 0;
            if (toInt(c) && c > 0) m_ev.correlation = c;
            break;
        }
        case Field::Stream: toInt(m_ev.stream); break;
        case Field::Device: toInt(m_ev.device); break;
        case Field::Bytes: toInt(m_ev.bytes); break;
        case Field::DeviceType: toInt(m_ev.deviceType); break;
        case Field::InNelems: toInt(m_ev.inNelems); break;
        case Field::OutNelems: toInt(m_ev.outNelems); break;
        case Field::TotalAllocated: m_ev.hasAllocated = true; m_ev.totalAllocated = v; break;
        case Field::TotalReserved: m_ev.hasReserved = true; m_ev.totalReserved = v; break;
        case Field::MemBytes: m_ev.hasMemBytes = true; m_ev.memBytes = v; break;
        case Field::DeviceMemory:
            // First device only, as for device_name (a rank uses one GPU type).
            if (v > 0 && !m_out.info.count("device_memory_bytes"))
                m_out.info["device_memory_bytes"] = std::to_string(static_cast<int64_t>(v));
            break;
        case Field::BaseTime: {
            int64_t b = 0;
            if (toInt(b)) m_baseTimeNs = b;
            break;
        }
        case Field::SchemaVersion: m_out.info["kineto_schema_version"] = std::to_string(static_cast<int64_t>(v)); break;
        case Field::DistRank: {
            int64_t r = 0;
            if (toInt(r) && r >= 0 && r < (1 << 30)) {
                m_out.rankHint = static_cast<int>(r);
                m_out.rankSource = "distributedInfo.rank";
            }
            break;
        }
        case Field::DistWorldSize: {
            int64_t w = 0;
            if (toInt(w) && w > 0 && w < (1 << 30)) m_out.worldSize = static_cast<int>(w);
            break;
        }
        case Field::Ph: case Field::Cat: case Field::Name: case Field::Args: m_ev.malformed = true; break;
        default: break;
    }
    return true;
}

uint32_t KinetoSax::gpuTrack(int64_t device, int64_t stream) {
    auto [it, inserted] = m_gpuTracks.try_emplace({device, stream}, 0u);
    if (inserted) {
        StagedTrack t;
        t.gpu = true;
        t.kind = trace::TrackKind::Compute;
        t.device = static_cast<int32_t>(device);
        t.streamIndex = static_cast<int32_t>(stream);
        t.label = "gpu " + std::to_string(device) + " stream " + std::to_string(stream);
        it->second = static_cast<uint32_t>(m_out.tracks.size());
        m_out.tracks.push_back(std::move(t));
    }
    return it->second;
}

uint32_t KinetoSax::hostTrack() {
    auto textId = [&](const std::string& text) {
        auto [it, inserted] = m_textIds.try_emplace(text, -static_cast<int64_t>(m_textIds.size()) - 1);
        return it->second;
    };
    int64_t pid = m_ev.pidIsText ? textId(m_ev.pidText) : m_ev.pid;
    int64_t tid = m_ev.tidIsText ? textId(m_ev.tidText) : m_ev.tid;
    auto [it, inserted] = m_hostTracks.try_emplace({pid, tid}, 0u);
    if (inserted) {
        StagedTrack t;
        t.gpu = false;
        t.kind = trace::TrackKind::HostThread;
        t.pid = pid;
        t.tid = tid;
        it->second = static_cast<uint32_t>(m_out.tracks.size());
        m_out.tracks.push_back(std::move(t));
    }
    return it->second;
}

void KinetoSax::processEvent() {
    RawEvent& e = m_ev;
    StagedFile& out = m_out;
    if (e.ph.empty()) {
        out.stats.add("import.kineto.malformed_events");
        return;
    }
    const char ph = e.ph[0];
    if (ph == 'M') {
        ++m_counts[SkippedMetadata];  // read for names, not imported as events
        if (e.malformed) return;
        if (e.name == "process_name" && !e.pidIsText) m_processNames[e.pid] = e.argName;
        else if (e.name == "thread_name" && !e.pidIsText && !e.tidIsText) m_threadNames[{e.pid, e.tid}] = e.argName;
        return;
    }
    if (ph == 's' || ph == 'f' || ph == 't') {  // flows: correlation ids already link launches
        ++m_counts[SkippedFlows];
        return;
    }
    if (ph == 'i' || ph == 'I') {
        if (e.name != "[memory]") {
            ++m_counts[SkippedInstants];
            return;
        }
        const bool host = e.deviceType == 0;
        if (!e.malformed && e.hasTs && !e.hasAllocated && !e.hasReserved && e.hasMemBytes) {
            // Older Kineto (2021) writes only the change ("Bytes": + allocated, - freed). The
            // running sum is the memory allocated since the trace began, not the allocator's
            // total (which that format does not record): a counter of its own name.
            double& level = host ? m_hostDeltaLevel : m_deviceDeltaLevel;
            level += e.memBytes;
            trace::Counter c;
            c.name = out.strings.intern(host ? "memory.host_allocated_since_trace_start"
                                             : "memory.allocated_since_trace_start");
            c.tsNs = e.tsNs;
            c.value = level;
            out.counters.push_back(c);
            ++m_counts[ConvertedMemoryDeltas];
            m_minTsNs = std::min(m_minTsNs, e.tsNs);
            return;
        }
        if (e.malformed || !e.hasTs || (!e.hasAllocated && !e.hasReserved)) {
            out.stats.add("import.kineto.malformed_events");
            return;
        }
        if (e.hasAllocated) {
            trace::Counter c;
            c.name = out.strings.intern(host ? "memory.host_allocated" : "memory.allocated");
            c.tsNs = e.tsNs;
            c.value = e.totalAllocated;
            out.counters.push_back(c);
        }
        if (e.hasReserved) {
            trace::Counter c;
            c.name = out.strings.intern(host ? "memory.host_reserved" : "memory.reserved");
            c.tsNs = e.tsNs;
            c.value = e.totalReserved;
            out.counters.push_back(c);
        }
        m_minTsNs = std::min(m_minTsNs, e.tsNs);
        ++m_counts[KeptMemoryEvents];
        return;
    }
    if (ph != 'X') {
        out.stats.add("import.kineto.unsupported_events");  // B/E pairs, counters, async ...
        return;
    }
    if (e.malformed || !e.hasTs || !e.hasDur || e.durNs < 0) {
        out.stats.add("import.kineto.malformed_events");
        return;
    }
    if (e.cat == "Trace" || (e.pidIsText && e.cat.empty())) {  // profiler's own span
        ++m_counts[SkippedProfilerSpans];
        return;
    }
    trace::Slice s;
    s.startNs = e.tsNs;
    s.durNs = e.durNs;
    m_minTsNs = std::min(m_minTsNs, e.tsNs);
    auto gpuDevice = [&] { return e.device >= 0 ? e.device : (e.pidIsText ? trailingNumber(e.pidText) : e.pid); };
    auto gpuStream = [&] { return e.stream >= 0 ? e.stream : (e.tidIsText ? trailingNumber(e.tidText) : e.tid); };
    if (e.cat == "gpu_user_annotation") {
        // GPU-side copy of a user annotation (Kineto draws it on the stream's row): a Range on
        // the GPU track, never a kernel. ProfilerStep#N copies keep their name and step: HTA's
        // last-step cut-off reads them (docs/profiler.md, "definitions").
        s.track = gpuTrack(gpuDevice(), gpuStream());
        s.category = Category::Range;
        if (auto step = parseStepName(e.name)) s.step = *step;
        s.name = out.strings.intern(e.name);
        out.slices.push_back(s);
        ++m_counts[KeptGpuAnnotations];
        return;
    }
    // GPU work: the GPU activity categories, cuda_sync events that name a stream (Kineto's
    // "Stream Sync" / "Stream Wait Event" rows on the stream), and an event of another
    // category only when it has both a stream and a correlation id (HTA's rule). Host-side
    // categories never become kernels, even with args.stream: Triton/Inductor cpu_op events
    // carry the stream they launch on (the kernel itself is a separate "kernel" event).
    const bool gpuCat = e.cat == "kernel" || e.cat == "gpu_memcpy" || e.cat == "gpu_memset" || e.cat == "Kernel" ||
                        e.cat == "Memcpy" || e.cat == "Memset" || e.cat == "mtia_ccp_events";
    const bool hostCat = e.cat == "cpu_op" || e.cat == "user_annotation" || e.cat == "python_function" ||
                         e.cat == "cuda_runtime" || e.cat == "cuda_driver" || e.cat == "cpu_instant_event" ||
                         e.cat == "Runtime" || e.cat == "Operator";
    const bool sync = e.cat == "cuda_sync";
    const bool gpu = gpuCat || (sync && e.stream >= 0) || (!hostCat && !sync && e.stream >= 0 && e.correlation > 0);
    if (gpu) {
        s.track = gpuTrack(gpuDevice(), gpuStream());
        s.name = out.strings.intern(e.name);
        if (e.cat == "gpu_memcpy" || e.cat == "Memcpy") s.category = Category::Memcpy;
        else if (e.cat == "gpu_memset" || e.cat == "Memset") s.category = Category::Memset;
        else if (sync) s.category = Category::Other;  // a wait; the analyses class it by name
        else s.category = classifyKernel(e.name);
        s.correlation = static_cast<uint64_t>(e.correlation);
        if (e.bytes > 0) s.bytes = static_cast<uint64_t>(e.bytes);
        if (s.category == Category::Collective || s.category == Category::P2P) {
            int elemBytes = dtypeBytes(e.dtype);
            int64_t nelems = std::max(e.inNelems, e.outNelems);
            if (elemBytes > 0 && nelems > 0) s.bytes = static_cast<uint64_t>(nelems) * static_cast<uint64_t>(elemBytes);
            const std::string& group = !e.groupDesc.empty() ? e.groupDesc : e.groupName;
            if (!group.empty()) s.group = out.strings.intern(group);
        }
        out.slices.push_back(s);
        ++m_counts[sync ? KeptGpuSyncs
                    : s.category == Category::Memcpy || s.category == Category::Memset ? KeptGpuCopies
                                                                                      : KeptKernels];
        return;
    }

    s.track = hostTrack();
    s.correlation = static_cast<uint64_t>(e.correlation);
    if (e.stream >= 0) {
        // A host op that names a GPU stream (Triton launches): it stays a host slice; its
        // group records the stream, which HTA's definitions count as GPU time (HTA takes any
        // event with a stream for a kernel). docs/import.md.
        s.group = out.strings.intern("stream " + std::to_string(e.stream));
        ++m_counts[ConvertedHostOpsWithStream];
    }
    ++m_counts[e.cat == "user_annotation" ? KeptHostAnnotations : KeptHostEvents];
    if (e.cat == "user_annotation") {
        s.category = Category::Range;
        if (auto step = parseStepName(e.name)) {
            s.step = *step;
            s.name = out.strings.intern("step " + std::to_string(*step));
        } else {
            s.name = out.strings.intern(e.name);
        }
    } else {
        // cuda_runtime / cuda_driver become Launch in finalizeStaged when they launched GPU work.
        s.category = Category::Other;
        s.name = out.strings.intern(e.name);
    }
    out.slices.push_back(s);
}

void KinetoSax::finish() {
    static const char* const kCountNames[CountKinds] = {
        "import.kineto.kept.kernels",          "import.kineto.kept.gpu_copies",
        "import.kineto.kept.gpu_syncs",        "import.kineto.kept.gpu_annotations",
        "import.kineto.kept.host_events",      "import.kineto.kept.host_annotations",
        "import.kineto.kept.memory_events",    "import.kineto.converted.host_ops_with_stream",
        "import.kineto.converted.memory_delta_events", "import.kineto.skipped.flow_events",
        "import.kineto.skipped.metadata_events",       "import.kineto.skipped.profiler_spans",
        "import.kineto.skipped.instant_events"};
    for (int k = 0; k < CountKinds; ++k)
        if (m_counts[k] > 0) m_out.stats.add(kCountNames[k], m_counts[k]);
    // Host thread ordinals: the process's main thread (tid == pid) first, then by first use.
    std::map<int64_t, int32_t> nextOrdinal;
    for (auto& t : m_out.tracks) {
        if (t.gpu) continue;
        if (t.tid == t.pid) nextOrdinal.try_emplace(t.pid, 1);
    }
    for (auto& t : m_out.tracks) {
        if (t.gpu) continue;
        if (t.tid == t.pid) {
            t.streamIndex = 0;
        } else {
            auto [it, inserted] = nextOrdinal.try_emplace(t.pid, 0);
            t.streamIndex = it->second++;
        }
        std::string label = "thread " + std::to_string(t.tid);
        auto name = m_threadNames.find({t.pid, t.tid});
        if (name != m_threadNames.end() && !name->second.empty()) label += " (" + name->second + ")";
        t.label = std::move(label);
    }
    if (m_baseTimeNs) {
        m_out.epochOffsetNs = *m_baseTimeNs;  // ts are relative to baseTimeNanoseconds
        m_out.info["clock"] = "baseTimeNanoseconds + ts";
    } else if (m_minTsNs != std::numeric_limits<int64_t>::max() && m_minTsNs > 100'000'000'000'000'000LL) {
        // Older Kineto writes absolute Unix-epoch microseconds (after 1973 => epoch-sized).
        m_out.epochOffsetNs = 0;
        m_out.info["clock"] = "unix epoch us";
    }
    for (const auto& [pid, name] : m_processNames)
        if (pid > 1000 && !name.empty() && !m_out.info.count("process_name")) m_out.info["process_name"] = name;
}

}  // namespace

Result<StagedFile> parseKinetoTrace(const std::string& path) {
    TS_ASSIGN_OR_RETURN(auto buf, GzipStreamBuf::open(path));
    StagedFile out;
    out.path = path;
    out.format = SourceFormat::Kineto;
    KinetoSax sax(out);
    std::istream in(buf.get());
    bool ok = false;
    try {
        ok = json::sax_parse(in, &sax, json::input_format_t::json, /*strict=*/false);
    } catch (const std::exception& e) {
        // nlohmann reports through parse_error; this only catches allocation failures etc.
        return Status::io("reading '" + path + "': " + e.what());
    }
    if (buf->failed()) {
        out.stats.add("import.truncated_input");
        out.info["read_error"] = buf->error();
    }
    if (!ok) {
        out.stats.add("import.kineto.parse_errors");
        out.info["parse_error"] = sax.error();
    }
    if (!sax.sawTrace()) {
        if (buf->failed())
            return Status::invalid("'" + path + "' is a truncated or damaged gzip file (zlib: " + buf->error() + ")" +
                                   (buf->bytesOut() > 0 ? "" : "; nothing could be decompressed"));
        if (!ok && sax.eventsSeen() == 0 && buf->bytesOut() > 0 && !buf->failed())
            return Status::invalid("'" + path + "' is not a trace: " + sax.error());
        return Status::invalid("'" + path + "' holds no Chrome/Kineto trace (no \"traceEvents\" array)" +
                               (sax.error().empty() ? std::string() : ": " + sax.error()));
    }
    sax.finish();
    return out;
}

}  // namespace ts::profiler::import
