// Format-independent import passes: finalizeStaged (track kinds, launches, depth, steps,
// HTA's last-step filter) and emitStaged (ranks, clock alignment, renumbering, Recorder calls).
#include "profiler/import/staging.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <charconv>
#include <limits>
#include <set>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "common/text.h"

namespace ts::profiler::import {

const char* sourceFormatName(SourceFormat f) {
    switch (f) {
        case SourceFormat::Kineto: return "kineto";
        case SourceFormat::Nsys: return "nsys";
    }
    return "unknown";
}

void ImportStats::add(std::string_view name, int64_t delta) {
    auto it = m_counts.find(name);
    if (it == m_counts.end()) m_counts.emplace(std::string(name), delta);
    else it->second += delta;
}

int64_t ImportStats::get(std::string_view name) const {
    auto it = m_counts.find(name);
    return it == m_counts.end() ? 0 : it->second;
}

void ImportStats::merge(const ImportStats& other) {
    for (const auto& [k, v] : other.m_counts) add(k, v);
}

StringTable::StringTable() {
    m_texts.emplace_back();
    m_ids.emplace(std::string_view(m_texts.back()), 0u);
}

uint32_t StringTable::intern(std::string_view raw) {
    auto it = m_ids.find(raw);
    if (it != m_ids.end()) return it->second;
    // Names come from the trace file: stored as valid UTF-8 (they end up in JSON).
    std::string clean;
    std::string_view text = raw;
    if (!isValidUtf8(raw)) {
        clean = sanitizeUtf8(raw);
        text = clean;
        it = m_ids.find(text);
        if (it != m_ids.end()) return it->second;
    }
    auto id = static_cast<uint32_t>(m_texts.size());
    m_texts.emplace_back(text);
    m_ids.emplace(std::string_view(m_texts.back()), id);
    return id;
}

std::optional<int> parseStepName(std::string_view name) {
    std::string_view rest;
    auto strip = [&](std::string_view prefix) {
        if (name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix) {
            rest = name.substr(prefix.size());
            return true;
        }
        return false;
    };
    if (!strip("ProfilerStep#") && !strip("step ") && !strip("iteration ") && !strip("Step ") &&
        !strip("Iteration "))
        return std::nullopt;
    int value = 0;
    auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (ec != std::errc() || ptr != rest.data() + rest.size() || value < 0) return std::nullopt;
    return value;
}

namespace {

using trace::Category;
using trace::TrackKind;

void inferGpuTrackKinds(StagedFile& f) {
    struct Mix {
        int64_t collective = 0, p2p = 0, copy = 0, other = 0;
    };
    std::vector<Mix> mix(f.tracks.size());
    for (const auto& s : f.slices) {
        assert(s.track < f.tracks.size());
        if (!f.tracks[s.track].gpu) continue;
        Mix& m = mix[s.track];
        switch (s.category) {
            case Category::Collective: ++m.collective; break;
            case Category::P2P: ++m.p2p; break;
            case Category::Memcpy:
            case Category::Memset: ++m.copy; break;
            case Category::Range: break;  // GPU-side annotations say nothing about the stream's work
            default: ++m.other; break;
        }
    }
    for (size_t i = 0; i < f.tracks.size(); ++i) {
        StagedTrack& t = f.tracks[i];
        if (!t.gpu) continue;
        const Mix& m = mix[i];
        if (m.other == 0 && m.copy == 0 && m.collective + m.p2p > 0)
            t.kind = m.collective > 0 ? TrackKind::Comm : TrackKind::P2P;
        else if (m.other == 0 && m.collective + m.p2p == 0 && m.copy > 0)
            t.kind = TrackKind::Copy;
        else
            t.kind = TrackKind::Compute;
    }
}

struct StepRange {
    int64_t start, end;
    int32_t step;
};

void assignSteps(StagedFile& f, const std::vector<StepRange>& steps) {
    if (steps.empty()) return;
    std::unordered_map<uint64_t, int32_t> stepOfLaunch;
    for (auto& s : f.slices) {
        if (f.tracks[s.track].gpu) continue;
        if (s.step < 0) {
            // Last step range starting at or before s; steps do not overlap in practice.
            auto it = std::upper_bound(steps.begin(), steps.end(), s.startNs,
                                       [](int64_t ts, const StepRange& r) { return ts < r.start; });
            if (it != steps.begin()) {
                --it;
                if (s.startNs < it->end) s.step = it->step;
            }
        }
        if (s.correlation != 0 && s.step >= 0) stepOfLaunch.emplace(s.correlation, s.step);
    }
    for (auto& s : f.slices) {
        if (!f.tracks[s.track].gpu || s.step >= 0 || s.correlation == 0) continue;
        auto it = stepOfLaunch.find(s.correlation);
        if (it != stepOfLaunch.end()) s.step = it->second;
    }
}

void dropLastStep(StagedFile& f, const std::vector<StepRange>& steps) {
    if (steps.empty()) return;
    int64_t lastStart = std::numeric_limits<int64_t>::min();
    std::set<int32_t> distinct;
    for (const auto& r : steps) {
        lastStart = std::max(lastStart, r.start);
        distinct.insert(r.step);
    }
    // HTA drops nothing when the trace has a single profiler step (its rule needs two or more:
    // hta/common/trace.py, _filter_irrelevant_gpu_kernels).
    if (distinct.size() < 2) return;
    auto hostKept = [&](const trace::Slice& s) { return s.startNs < lastStart; };
    std::unordered_set<uint64_t> keptLaunches;
    for (const auto& s : f.slices)
        if (!f.tracks[s.track].gpu && s.correlation != 0 && hostKept(s)) keptLaunches.insert(s.correlation);
    size_t before = f.slices.size();
    std::erase_if(f.slices, [&](const trace::Slice& s) {
        if (f.tracks[s.track].gpu) {
            // GPU-side annotations are not launched: kept when they start before the cut-off.
            if (s.category == Category::Range) return !hostKept(s);
            return s.correlation == 0 || !keptLaunches.count(s.correlation);
        }
        return !hostKept(s);
    });
    f.stats.add("import.dropped_last_step_slices", static_cast<int64_t>(before - f.slices.size()));
}

void assignDepth(StagedFile& f) {
    std::vector<uint32_t> order;
    order.reserve(f.slices.size());
    for (uint32_t i = 0; i < f.slices.size(); ++i)
        if (!f.tracks[f.slices[i].track].gpu) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        const auto& x = f.slices[a];
        const auto& y = f.slices[b];
        if (x.track != y.track) return x.track < y.track;
        if (x.startNs != y.startNs) return x.startNs < y.startNs;
        return x.durNs > y.durNs;  // the enclosing slice first
    });
    std::vector<int64_t> openEnds;
    uint32_t track = std::numeric_limits<uint32_t>::max();
    for (uint32_t i : order) {
        auto& s = f.slices[i];
        if (s.track != track) {
            track = s.track;
            openEnds.clear();
        }
        while (!openEnds.empty() && openEnds.back() <= s.startNs) openEnds.pop_back();
        s.depth = static_cast<int32_t>(openEnds.size());
        openEnds.push_back(s.startNs + s.durNs);
    }
}

}  // namespace

void finalizeStaged(StagedFile& f, const ImportOptions& options) {
    inferGpuTrackKinds(f);

    std::unordered_set<uint64_t> gpuCorrelations;
    for (const auto& s : f.slices)
        if (f.tracks[s.track].gpu && s.correlation != 0) gpuCorrelations.insert(s.correlation);
    for (auto& s : f.slices)
        if (!f.tracks[s.track].gpu && s.correlation != 0 && s.category != Category::Range &&
            gpuCorrelations.count(s.correlation))
            s.category = Category::Launch;

    std::vector<StepRange> steps;
    for (const auto& s : f.slices)
        if (!f.tracks[s.track].gpu && s.category == Category::Range && s.step >= 0)
            steps.push_back({s.startNs, s.startNs + s.durNs, s.step});
    std::sort(steps.begin(), steps.end(), [](const StepRange& a, const StepRange& b) { return a.start < b.start; });

    if (options.dropLastProfilerStep) dropLastStep(f, steps);
    assignSteps(f, steps);
    assignDepth(f);
}

EmitSummary emitStaged(std::vector<StagedFile>& files, trace::Recorder& rec, ImportStats& stats) {
    EmitSummary summary;
    const size_t n = files.size();

    // Ranks: a hint wins if free; otherwise the file position, otherwise the lowest free rank.
    std::vector<int> rank(n, -1);
    std::set<int> taken;
    for (size_t i = 0; i < n; ++i) {
        if (!files[i].rankHint) continue;
        int hint = *files[i].rankHint;
        if (hint >= 0 && !taken.count(hint)) {
            rank[i] = hint;
            taken.insert(hint);
        } else {
            stats.add("import.rank_conflicts");
        }
    }
    for (size_t i = 0; i < n; ++i) {
        if (rank[i] >= 0) continue;
        int r = static_cast<int>(i);
        if (taken.count(r)) {
            r = 0;
            while (taken.count(r)) ++r;
        }
        rank[i] = r;
        taken.insert(r);
    }

    // Clock: every file with a known epoch offset goes on the Unix clock; zero = earliest event.
    std::vector<int64_t> first(n, 0);
    std::optional<int64_t> origin;
    for (size_t i = 0; i < n; ++i) {
        int64_t lo = std::numeric_limits<int64_t>::max();
        for (const auto& s : files[i].slices) lo = std::min(lo, s.startNs);
        for (const auto& c : files[i].counters) lo = std::min(lo, c.tsNs);
        first[i] = lo == std::numeric_limits<int64_t>::max() ? 0 : lo;
        if (files[i].epochOffsetNs) {
            int64_t abs = first[i] + *files[i].epochOffsetNs;
            origin = origin ? std::min(*origin, abs) : abs;
        }
    }
    summary.originUnixNs = origin.value_or(0);

    nlohmann::json fileList = nlohmann::json::array();
    std::set<std::string> formats;
    for (size_t i = 0; i < n; ++i) {
        StagedFile& f = files[i];
        const bool aligned = f.epochOffsetNs.has_value();
        const int64_t shift = aligned ? *f.epochOffsetNs - *origin : -first[i];
        if (!aligned) stats.add("import.unaligned_files");
        stats.merge(f.stats);
        formats.insert(sourceFormatName(f.format));

        std::vector<uint32_t> nameId(f.strings.size(), std::numeric_limits<uint32_t>::max());
        nameId[0] = 0;
        auto mapName = [&](uint32_t local) {
            assert(local < nameId.size());
            uint32_t& id = nameId[local];
            if (id == std::numeric_limits<uint32_t>::max()) id = rec.intern(f.strings.text(local));
            return id;
        };

        std::vector<uint32_t> trackId(f.tracks.size());
        for (size_t t = 0; t < f.tracks.size(); ++t) {
            const StagedTrack& st = f.tracks[t];
            trace::TrackDesc d;
            d.rank = rank[i];
            d.device = st.device;
            d.kind = st.kind;
            d.streamIndex = st.streamIndex;
            d.name = "rank " + std::to_string(rank[i]) + " " + sanitizeUtf8(st.label);
            trackId[t] = rec.track(d);
        }

        std::unordered_map<uint64_t, uint64_t> correlation;
        for (const trace::Slice& src : f.slices) {
            trace::Slice s = src;
            s.track = trackId[src.track];
            s.name = mapName(src.name);
            s.group = mapName(src.group);
            s.startNs = src.startNs + shift;
            if (src.correlation != 0) {
                auto [it, inserted] = correlation.try_emplace(src.correlation, 0);
                if (inserted) it->second = rec.nextCorrelation();
                s.correlation = it->second;
            }
            rec.slice(s);
        }
        for (const trace::Counter& src : f.counters) {
            trace::Counter c = src;
            c.rank = rank[i];
            c.name = mapName(src.name);
            c.tsNs = src.tsNs + shift;
            rec.counter(c);
        }

        // The Unix time a Kineto file's ts 0 stands for: HTA reads ts as double microseconds,
        // and `analyze --definitions hta` reproduces its rounding on that scale.
        if (aligned && f.format == SourceFormat::Kineto)
            rec.metadata("import.kineto_ts_zero_unix_ns." + std::to_string(rank[i]), std::to_string(*f.epochOffsetNs));

        EmittedFile e;
        e.path = sanitizeUtf8(f.path);
        e.format = f.format;
        e.rank = rank[i];
        e.rankSource = rank[i] == f.rankHint.value_or(-1) ? sanitizeUtf8(f.rankSource) : "";
        e.aligned = aligned;
        e.tracks = static_cast<int64_t>(f.tracks.size());
        e.slices = static_cast<int64_t>(f.slices.size());
        e.counters = static_cast<int64_t>(f.counters.size());
        summary.tracks += e.tracks;
        summary.slices += e.slices;
        summary.counters += e.counters;

        nlohmann::json j = {{"path", e.path},
                            {"format", sourceFormatName(f.format)},
                            {"rank", rank[i]},
                            {"rank_source", e.rankSource.empty() ? "file order" : e.rankSource},
                            {"aligned_by", aligned ? "epoch clock" : "first event"},
                            {"tracks", e.tracks},
                            {"slices", e.slices},
                            {"counters", e.counters}};
        if (f.worldSize) j["world_size"] = *f.worldSize;
        for (const auto& [k, v] : f.info) j["info"][sanitizeUtf8(k)] = sanitizeUtf8(v);
        fileList.push_back(std::move(j));
        summary.files.push_back(std::move(e));
    }

    std::string source = formats.size() == 1 ? *formats.begin() : "mixed";
    rec.metadata("import.source", source);
    rec.metadata("import.files", dumpJson(fileList));
    rec.metadata("import.time_origin_unix_ns", std::to_string(summary.originUnixNs));
    // MFU looks the peak FLOPS up by metadata "device_name" (profiler/report.cpp); the first
    // file that names its GPU gives it (a run is assumed to use one device type).
    for (const auto& f : files) {
        auto it = f.info.find("device_name");
        if (it != f.info.end() && !it->second.empty()) {
            rec.metadata("device_name", sanitizeUtf8(it->second));
            auto mem = f.info.find("device_memory_bytes");
            if (mem != f.info.end()) rec.metadata("device_memory_bytes", sanitizeUtf8(mem->second));
            break;
        }
    }
    return summary;
}

}  // namespace ts::profiler::import
