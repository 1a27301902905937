// Chrome / Perfetto trace-event JSON export: pid = rank, tid = track id, "X" complete events
// (µs, fractional), "C" counters, "M" metadata naming processes/threads, and flow arrows
// ("s"/"f", binding to the enclosing slice) from a host Launch slice to the execution slice
// that shares its correlation id. Streams rows out; never holds the whole trace in memory.
#include <cstdio>
#include <fstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "profiler/analysis.h"

namespace ts::profiler {

namespace {
// Names come from trace files: written as valid JSON even when they are not valid UTF-8.
std::string jsonStr(const std::string& s) { return dumpJson(nlohmann::json(s)); }

void us(std::ostream& o, int64_t ns) {
    // Microseconds with ns precision, without float rounding noise.
    char buf[48];
    int64_t a = ns < 0 ? -ns : ns;
    std::snprintf(buf, sizeof buf, "%s%lld.%03lld", ns < 0 ? "-" : "", (long long)(a / 1000), (long long)(a % 1000));
    o << buf;
}
}  // namespace

Status exportChromeTrace(TraceStore& store, const std::string& outPath) {
    std::ofstream o(outPath, std::ios::binary);
    if (!o) return Status::io("cannot write '" + outPath + "'");
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    TS_ASSIGN_OR_RETURN(auto tracks, store.tracks());
    auto name = [&](uint32_t id) -> const std::string& {
        static const std::string empty;
        return id < strings.size() ? strings[id] : empty;
    };
    // Timestamps relative to the first event keep the numbers short (Perfetto shows relative time).
    int64_t origin = INT64_MAX;
    {
        SliceFilter f;
        for (auto& t : tracks) {
            f.track = t.id;
            TS_RETURN_IF_ERROR(store.forEachSlice(f, [&](const trace::Slice& s) {
                origin = std::min(origin, s.startNs);
                return false;  // first row of each track is its earliest
            }));
        }
        if (origin == INT64_MAX) origin = 0;
    }
    o << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"origin_ns\":" << origin << "},\"traceEvents\":[\n";
    bool first = true;
    auto sep = [&] {
        if (!first) o << ",\n";
        first = false;
    };
    std::unordered_map<uint32_t, int> rankOf;
    std::map<int, bool> ranksSeen;
    for (auto& t : tracks) {
        rankOf[t.id] = t.rank;
        if (!ranksSeen[t.rank]) {
            ranksSeen[t.rank] = true;
            sep();
            o << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << t.rank << ",\"args\":{\"name\":\"rank " << t.rank
              << "\"}}";
            sep();
            o << "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" << t.rank << ",\"args\":{\"sort_index\":" << t.rank
              << "}}";
        }
        sep();
        o << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << t.rank << ",\"tid\":" << t.id
          << ",\"args\":{\"name\":" << jsonStr(t.name.empty() ? trace::trackKindName(t.kind) : t.name) << "}}";
    }
    for (auto& t : tracks) {
        SliceFilter f;
        f.track = t.id;
        bool host = t.kind == trace::TrackKind::HostThread;
        TS_RETURN_IF_ERROR(store.forEachSlice(f, [&](const trace::Slice& s) {
            sep();
            o << "{\"ph\":\"X\",\"pid\":" << t.rank << ",\"tid\":" << t.id << ",\"ts\":";
            us(o, s.startNs - origin);
            o << ",\"dur\":";
            us(o, s.durNs);
            o << ",\"name\":" << jsonStr(name(s.name)) << ",\"cat\":\"" << trace::categoryName(s.category) << "\"";
            o << ",\"args\":{";
            bool a = false;
            auto arg = [&](const char* k, auto v) {
                o << (a ? "," : "") << "\"" << k << "\":" << v;
                a = true;
            };
            if (s.step >= 0) arg("step", s.step);
            if (s.microbatch >= 0) arg("microbatch", s.microbatch);
            if (s.chunk >= 0) arg("chunk", s.chunk);
            if (s.layer >= 0) arg("layer", s.layer);
            if (s.correlation) arg("correlation", s.correlation);
            if (s.bytes) arg("bytes", s.bytes);
            if (s.flops > 0) arg("flops", nlohmann::json(s.flops).dump());
            if (s.group) arg("group", jsonStr(name(s.group)));
            o << "}}";
            // Flow arrow launch -> execution (Chrome binds "s" to the enclosing slice at ts).
            if (s.correlation && s.category != trace::Category::Range) {
                sep();
                o << "{\"ph\":\"" << (host ? "s" : "f") << "\",\"id\":" << s.correlation << ",\"pid\":" << t.rank
                  << ",\"tid\":" << t.id << ",\"ts\":";
                us(o, s.startNs - origin);
                o << ",\"name\":\"launch\",\"cat\":\"flow\"" << (host ? "" : ",\"bp\":\"e\"") << "}";
            }
            return true;
        }));
    }
    TS_ASSIGN_OR_RETURN(auto counters, store.counters(-1));
    for (auto& c : counters) {
        sep();
        o << "{\"ph\":\"C\",\"pid\":" << c.rank << ",\"ts\":";
        us(o, c.tsNs - origin);
        o << ",\"name\":" << jsonStr(name(c.name)) << ",\"args\":{\"value\":" << nlohmann::json(c.value).dump() << "}}";
    }
    o << "\n]}\n";
    o.close();
    if (!o) return Status::io("writing '" + outPath + "' failed (disk full?)");
    return Status::ok();
}

}  // namespace ts::profiler
