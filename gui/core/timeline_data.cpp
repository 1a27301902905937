// Building TimelineData from a run file (see timeline_data.h).
#include "gui/core/timeline_data.h"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <mutex>
#include <optional>
#include <map>
#include <thread>
#include <unordered_map>

#include <QHash>

#include "gui/core/format.h"
#include "profiler/analysis.h"
#include "profiler/store.h"

namespace ts::gui {

using trace::Category;
using trace::TrackKind;

// ---- CounterSeries -------------------------------------------------------------------------

void CounterSeries::buildBlocks() {
    size_t nb = (value.size() + kBlock - 1) / kBlock;
    blockMin.assign(nb, 0);
    blockMax.assign(nb, 0);
    maxValue = 0;
    for (size_t b = 0; b < nb; ++b) {
        size_t a = b * kBlock, e = std::min(value.size(), a + kBlock);
        auto [mn, mx] = std::minmax_element(value.begin() + long(a), value.begin() + long(e));
        blockMin[b] = *mn;
        blockMax[b] = *mx;
        maxValue = std::max(maxValue, *mx);
    }
}

std::pair<double, double> CounterSeries::minMax(size_t a, size_t b) const {
    double mn = value[a], mx = value[a];
    auto scan = [&](size_t from, size_t to) {
        for (size_t i = from; i < to; ++i) {
            mn = std::min(mn, value[i]);
            mx = std::max(mx, value[i]);
        }
    };
    size_t ba = (a + kBlock - 1) / kBlock, bb = b / kBlock;
    if (ba >= bb) {
        scan(a, b);
        return {mn, mx};
    }
    scan(a, ba * kBlock);
    for (size_t k = ba; k < bb; ++k) {
        mn = std::min(mn, blockMin[k]);
        mx = std::max(mx, blockMax[k]);
    }
    scan(bb * kBlock, b);
    return {mn, mx};
}

int64_t CounterSeries::indexAt(int64_t t) const {
    auto it = std::upper_bound(ts.begin(), ts.end(), t);
    return int64_t(it - ts.begin()) - 1;
}

RowSpan TimelineRow::span(int64_t offsetNs) const {
    RowSpan s;
    s.start = start.data();
    s.end = end.data();
    s.maxEnd = maxEnd.empty() ? end.data() : maxEnd.data();
    s.n = start.size();
    s.offsetNs = offsetNs;
    if (!opsPrefix.empty()) s.opsPrefix = opsPrefix.data();
    return s;
}

// ---- colours -------------------------------------------------------------------------------

QColor sliceColor(Category c, const QString& group) {
    switch (c) {
    case Category::Gemm: return QColor(0x3f, 0x7f, 0xbf);
    case Category::Attention: return QColor(0x7b, 0x5e, 0xc6);
    case Category::Norm: return QColor(0x3a, 0xa6, 0x9b);
    case Category::Elementwise: return QColor(0x6a, 0xa8, 0x4f);
    case Category::Softmax: return QColor(0x9a, 0xb8, 0x3a);
    case Category::Embedding: return QColor(0x8c, 0x6d, 0x4f);
    case Category::Loss: return QColor(0xc0, 0x5b, 0x8c);
    case Category::Optimizer: return QColor(0xb8, 0x86, 0x2e);
    case Category::P2P: return QColor(0x17, 0xa2, 0xb8);
    case Category::Memcpy: return QColor(0x80, 0x80, 0x80);
    case Category::Memset: return QColor(0xa8, 0xa8, 0xa8);
    case Category::Collective: {
        // One hue per process group, all warm, so communication reads apart from compute.
        if (group == "tp") return QColor(0xd6, 0x45, 0x45);
        if (group == "dp") return QColor(0xf0, 0x8a, 0x24);
        if (group == "pp") return QColor(0xe0, 0xb8, 0x20);
        if (group == "cp" || group == "hcp-a2a" || group == "hcp-p2p") return QColor(0xc2, 0x4f, 0xa8);
        if (group == "ep") return QColor(0xa0, 0x52, 0x2d);
        if (group == "tp-sp" || group == "sp") return QColor(0xff, 0x70, 0x70);
        if (group.isEmpty()) return QColor(0xcc, 0x55, 0x33);
        return QColor::fromHsv(int(qHash(group) % 60), 170, 220);
    }
    case Category::Range: return QColor(0x90, 0x90, 0xa0);
    case Category::Launch: return QColor(0xb0, 0xb0, 0xb0);
    case Category::Other: break;
    }
    return QColor(0x95, 0x95, 0x8a);
}

QColor rangeColor(const QString& name, int depth) {
    // Ranges are context, not the data: muted colours, darker outer ranges.
    if (name.startsWith("step") || name.startsWith("ProfilerStep")) return QColor(0x5b, 0x67, 0x7a);
    if (name.startsWith("forward")) return QColor(0x9c, 0xc3, 0xe6);
    if (name.startsWith("backward")) return QColor(0xf2, 0xc0, 0x94);
    if (name.startsWith("optimizer")) return QColor(0xe3, 0xd2, 0x8b);
    if (name.startsWith("microbatch")) return QColor(0x8f, 0x9f, 0xb5);
    if (name.startsWith("stage") || name.startsWith("chunk")) return QColor(0xa9, 0xb7, 0xc9);
    if (name.startsWith("layer")) return QColor(0xc5, 0xcf, 0xdc);
    int v = std::clamp(200 - depth * 8, 120, 220);
    return QColor(v - 10, v - 4, v + 10 > 255 ? 255 : v + 10);
}

QString streamKindName(TrackKind k) { return QString::fromLatin1(trace::trackKindName(k)); }

// ---- loading -------------------------------------------------------------------------------

namespace {

bool isStepName(const std::string& n) {
    return n == "step" || n.rfind("step ", 0) == 0 || n.rfind("ProfilerStep#", 0) == 0;
}

// Same rule as profiler/analysis.cpp stepNumber: the slice's step field, else the digits.
std::optional<int> stepNumberOf(const std::string& n, int32_t sliceStep) {
    if (!isStepName(n)) return std::nullopt;
    if (sliceStep >= 0) return sliceStep;
    size_t pos = n.find_first_of("0123456789");
    if (pos == std::string::npos) return std::nullopt;
    int v = 0;
    if (std::from_chars(n.data() + pos, n.data() + n.size(), v).ec != std::errc()) return std::nullopt;
    return v;
}

int16_t narrow16(int32_t v) { return int16_t(std::clamp<int32_t>(v, -1, INT16_MAX)); }

// Shared tables the loading threads fill under one lock (only when they see something new).
struct Interner {
    std::mutex mu;
    std::vector<QString>* groups;
    std::unordered_map<uint32_t, uint8_t> groupOf;  // string id -> group index
    std::vector<std::pair<uint64_t, double>>* payloads;
    std::map<std::pair<uint64_t, double>, uint32_t> payloadOf;
    const std::vector<std::string>* strings;
};

// Per-thread caches in front of the Interner (payloads repeat: same layer, same shapes).
struct LocalInterner {
    Interner& shared;
    std::unordered_map<uint32_t, uint8_t> groups;
    std::map<std::pair<uint64_t, double>, uint32_t> payloads;
    uint8_t group(uint32_t id) {
        if (id == 0) return 0;
        auto it = groups.find(id);
        if (it != groups.end()) return it->second;
        std::lock_guard lock(shared.mu);
        auto jt = shared.groupOf.find(id);
        uint8_t g;
        if (jt != shared.groupOf.end()) {
            g = jt->second;
        } else {
            g = shared.groups->size() < 255 ? uint8_t(shared.groups->size()) : uint8_t(254);
            if (shared.groups->size() < 255)
                shared.groups->push_back(id < shared.strings->size() ? QString::fromStdString((*shared.strings)[id]) : QString());
            shared.groupOf[id] = g;
        }
        groups[id] = g;
        return g;
    }
    uint32_t payload(uint64_t bytes, double flops) {
        if (bytes == 0 && flops == 0) return 0;
        auto key = std::make_pair(bytes, flops);
        auto it = payloads.find(key);
        if (it != payloads.end()) return it->second;
        std::lock_guard lock(shared.mu);
        auto jt = shared.payloadOf.find(key);
        uint32_t p;
        if (jt != shared.payloadOf.end()) {
            p = jt->second;
        } else {
            p = uint32_t(shared.payloads->size());
            shared.payloads->push_back(key);
            shared.payloadOf[key] = p;
        }
        payloads[key] = p;
        return p;
    }
};

void appendSlice(TimelineRow& r, const trace::Slice& s, LocalInterner& in) {
    r.start.push_back(s.startNs);
    r.end.push_back(s.startNs + std::max<int64_t>(0, s.durNs));
    r.name.push_back(s.name);
    r.category.push_back(uint8_t(s.category));
    r.group.push_back(in.group(s.group));
    r.step.push_back(s.step);
    r.microbatch.push_back(narrow16(s.microbatch));
    r.layer.push_back(narrow16(s.layer));
    r.chunk.push_back(narrow16(s.chunk));
    r.correlation.push_back(s.correlation);
    r.payload.push_back(in.payload(s.bytes, s.flops));
}

// Sorts a row by start (stable) when its input was not sorted (ranges from several host
// tracks), then builds maxEnd, dropped again when ends never decrease.
void finishRow(TimelineRow& r) {
    const size_t n = r.size();
    if (!std::is_sorted(r.start.begin(), r.start.end())) {
        std::vector<uint32_t> perm(n);
        for (uint32_t i = 0; i < n; ++i) perm[i] = i;
        std::stable_sort(perm.begin(), perm.end(), [&](uint32_t a, uint32_t b) { return r.start[a] < r.start[b]; });
        auto apply = [&](auto& v) {
            std::remove_reference_t<decltype(v)> out(n);
            for (size_t i = 0; i < n; ++i) out[i] = v[perm[i]];
            v.swap(out);
        };
        apply(r.start), apply(r.end), apply(r.name), apply(r.category), apply(r.group), apply(r.step);
        apply(r.microbatch), apply(r.layer), apply(r.chunk), apply(r.correlation), apply(r.payload);
    }
    r.maxEnd.resize(n);
    int64_t m = INT64_MIN;
    bool monotone = true;
    for (size_t i = 0; i < n; ++i) {
        if (r.end[i] < m) monotone = false;
        m = std::max(m, r.end[i]);
        r.maxEnd[i] = m;
    }
    if (monotone) {
        r.maxEnd.clear();
        r.maxEnd.shrink_to_fit();
    }
}

int kindOrder(TrackKind k) {
    switch (k) {
    case TrackKind::HostThread: return 0;
    case TrackKind::Compute: return 1;
    case TrackKind::Comm: return 2;
    case TrackKind::P2P: return 3;
    case TrackKind::Copy: return 4;
    }
    return 5;
}

// The rows of one rank, built by one thread with its own connection.
struct RankRows {
    int rank = 0;
    std::vector<TimelineRow> ranges;  // by depth
    TimelineRow host;                 // non-range, non-launch host slices
    std::vector<TimelineRow> streams;
    Status status = Status::ok();
};

Status loadRankRows(profiler::TraceStore& store, const std::vector<profiler::TrackRow>& tracks,
                    const std::unordered_map<uint32_t, int64_t>& countOfTrack, RankRows& out, LocalInterner& in) {
    for (const auto& t : tracks) {
        if (t.kind == TrackKind::HostThread) {
            profiler::SliceFilter f;
            f.track = t.id;
            TS_RETURN_IF_ERROR(store.forEachSlice(f, [&](const trace::Slice& s) {
                if (s.category == Category::Launch) return true;
                if (s.category == Category::Range) {
                    int d = std::clamp<int>(s.depth, 0, 63);
                    if (int(out.ranges.size()) <= d) out.ranges.resize(size_t(d) + 1);
                    TimelineRow& r = out.ranges[size_t(d)];
                    if (r.size() == 0) {
                        r.kind = RowKind::Range;
                        r.rank = t.rank;
                        r.trackId = t.id;
                        r.trackKind = TrackKind::HostThread;
                        r.depth = d;
                        r.trackName = QString::fromStdString(t.name);
                    }
                    appendSlice(r, s, in);
                } else {
                    if (out.host.size() == 0) {
                        out.host.kind = RowKind::Host;
                        out.host.rank = t.rank;
                        out.host.trackId = t.id;
                        out.host.trackKind = TrackKind::HostThread;
                        out.host.trackName = QString::fromStdString(t.name);
                    }
                    appendSlice(out.host, s, in);
                }
                return true;
            }));
            continue;
        }
        TimelineRow r;
        r.kind = RowKind::Stream;
        r.rank = t.rank;
        r.trackId = t.id;
        r.trackKind = t.kind;
        r.streamIndex = t.streamIndex;
        r.trackName = QString::fromStdString(t.name);
        if (auto it = countOfTrack.find(t.id); it != countOfTrack.end() && it->second > 0) {
            size_t n = size_t(it->second);
            r.start.reserve(n), r.end.reserve(n), r.name.reserve(n), r.category.reserve(n), r.group.reserve(n);
            r.step.reserve(n), r.microbatch.reserve(n), r.layer.reserve(n), r.chunk.reserve(n);
            r.correlation.reserve(n), r.payload.reserve(n);
        }
        // Ranges on a device stream (an imported trace's gpu_user_annotation) are context,
        // not work: their own row above the stream, never busy time in the bubble shading.
        TimelineRow ann;
        profiler::SliceFilter f;
        f.track = t.id;
        TS_RETURN_IF_ERROR(store.forEachSlice(f, [&](const trace::Slice& s) {
            if (s.category == Category::Range) {
                if (ann.size() == 0) {
                    ann.kind = RowKind::Range;
                    ann.rank = t.rank;
                    ann.trackId = t.id;
                    ann.trackKind = t.kind;
                    ann.streamIndex = t.streamIndex;
                    ann.trackName = r.trackName;
                }
                appendSlice(ann, s, in);
            } else {
                appendSlice(r, s, in);
            }
            return true;
        }));
        if (ann.size()) out.streams.push_back(std::move(ann));
        out.streams.push_back(std::move(r));
    }
    return Status::ok();
}

// Row label helpers.
QString rangeRowLabel(const TimelineRow& r, const std::vector<std::string>& strings) {
    // Name the row after what its ranges are ("step", "forward/backward"): the distinct stems
    // (names without trailing digits) of its first few hundred ranges.
    std::vector<QString> stems;
    for (size_t i = 0; i < r.size() && i < 400 && stems.size() < 3; ++i) {
        QString n = r.name[i] < strings.size() ? QString::fromStdString(strings[r.name[i]]) : QString();
        int cut = int(n.size());
        while (cut > 0 && (n[cut - 1].isDigit() || n[cut - 1] == ' ' || n[cut - 1] == '#')) --cut;
        n.truncate(cut);
        if (n.isEmpty()) n = "range";
        if (std::find(stems.begin(), stems.end(), n) == stems.end()) stems.push_back(n);
    }
    QStringList parts;
    for (auto& s : stems) parts << s;
    return QString("rank %1 · %2").arg(r.rank).arg(parts.isEmpty() ? QString("ranges") : parts.join('/'));
}

}  // namespace

Result<std::shared_ptr<const TimelineData>> loadTimelineData(const std::string& path, const TimelineLoadOptions& opt) {
    TS_ASSIGN_OR_RETURN(auto store, profiler::TraceStore::open(path, true));
    auto data = std::make_shared<TimelineData>();
    data->path = path;
    if (auto info = store->runInfo(); info.isOk()) {
        data->runName = QString::fromStdString(info.value().name);
        data->status = QString::fromStdString(info.value().status);
        data->layout = QString::fromStdString(info.value().layout);
    }
    if (auto pp = store->metadata("pp"); pp.isOk() && pp.value()) data->pp = std::max(1, std::atoi(pp.value()->c_str()));
    TS_ASSIGN_OR_RETURN(data->strings, store->strings());
    TS_ASSIGN_OR_RETURN(auto tracks, store->tracks());
    TS_ASSIGN_OR_RETURN(data->lastLoadedSliceCount, store->sliceCount());

    // Slices per track from the chunk index (v2 files), to size the arrays once.
    std::unordered_map<uint32_t, int64_t> countOfTrack;
    if (auto v = store->schemaVersion(); v.isOk() && v.value() >= 2) {
        // Only the chunk rows' leading columns are read (the blobs are not touched).
        sqlite3_stmt* q = nullptr;
        if (sqlite3_prepare_v2(store->db(), "SELECT track, sum(n) FROM slice_chunks GROUP BY track", -1, &q, nullptr) ==
            SQLITE_OK) {
            while (sqlite3_step(q) == SQLITE_ROW)
                countOfTrack[uint32_t(sqlite3_column_int64(q, 0))] = sqlite3_column_int64(q, 1);
        }
        sqlite3_finalize(q);
    }

    std::map<int, std::vector<profiler::TrackRow>> byRank;
    for (auto& t : tracks) byRank[t.rank].push_back(t);
    for (auto& [rank, ts] : byRank) {
        std::stable_sort(ts.begin(), ts.end(), [](const profiler::TrackRow& a, const profiler::TrackRow& b) {
            if (kindOrder(a.kind) != kindOrder(b.kind)) return kindOrder(a.kind) < kindOrder(b.kind);
            if (a.streamIndex != b.streamIndex) return a.streamIndex < b.streamIndex;
            return a.id < b.id;
        });
        data->ranks.push_back(rank);
    }

    Interner shared;
    shared.groups = &data->groups;
    shared.payloads = &data->payloads;
    shared.strings = &data->strings;
    std::vector<RankRows> perRank(data->ranks.size());
    const int nThreads = std::clamp(opt.threads, 1, std::max(1, int(data->ranks.size())));
    std::atomic<size_t> next{0};
    auto work = [&](profiler::TraceStore* own) {
        std::unique_ptr<profiler::TraceStore> mine;
        if (!own) {
            auto s = profiler::TraceStore::open(path, true);
            if (!s.isOk()) {
                for (size_t k; (k = next.fetch_add(1)) < perRank.size();) perRank[k].status = s.status();
                return;
            }
            mine = std::move(s).value();
            own = mine.get();
        }
        LocalInterner in{shared, {}, {}};
        for (size_t k; (k = next.fetch_add(1)) < perRank.size();) {
            perRank[k].rank = data->ranks[k];
            perRank[k].status = loadRankRows(*own, byRank[data->ranks[k]], countOfTrack, perRank[k], in);
        }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < nThreads; ++t) pool.emplace_back(work, nullptr);
    work(store.get());
    for (auto& t : pool) t.join();

    // Assemble rows in display order, finish each, compute labels and the data extent.
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (size_t k = 0; k < perRank.size(); ++k) {
        RankRows& rr = perRank[k];
        if (!rr.status.isOk()) return rr.status;
        auto push = [&](TimelineRow&& r) {
            finishRow(r);
            if (r.size()) {
                lo = std::min(lo, r.start.front());
                hi = std::max(hi, r.maxEnd.empty() ? r.end.back() : r.maxEnd.back());
            }
            data->sliceCount += int64_t(r.size());
            data->rows.push_back(std::move(r));
        };
        for (auto& r : rr.ranges) {
            if (r.size() == 0) continue;
            r.label = rangeRowLabel(r, data->strings);
            push(std::move(r));
        }
        if (rr.host.size()) {
            rr.host.label = QString("rank %1 · host").arg(rr.rank);
            push(std::move(rr.host));
        }
        // Several streams of one kind get their index in the label ("comm dp #1").
        std::map<std::pair<int, int>, int> kindCount;
        for (auto& r : rr.streams)
            if (r.kind == RowKind::Stream) kindCount[{int(r.trackKind), 0}]++;
        for (auto& r : rr.streams) {
            QString kind = streamKindName(r.trackKind);
            if (r.kind == RowKind::Range) {
                r.label = QString("rank %1 · %2 annotations").arg(rr.rank).arg(kind);
                push(std::move(r));
                continue;
            }
            if (r.trackKind == TrackKind::Comm || r.trackKind == TrackKind::P2P) {
                std::vector<size_t> hist(data->groups.size() + 1, 0);
                for (size_t i = 0; i < r.size(); i += std::max<size_t>(1, r.size() / 4096)) hist[r.group[i]]++;
                r.mainGroup = uint8_t(std::max_element(hist.begin(), hist.end()) - hist.begin());
                if (r.mainGroup && r.mainGroup < data->groups.size()) kind += " " + data->groups[r.mainGroup];
            }
            if (kindCount[{int(r.trackKind), 0}] > 1) kind += QString(" #%1").arg(r.streamIndex);
            r.label = QString("rank %1 · %2").arg(rr.rank).arg(kind);
            push(std::move(r));
        }
        if (opt.loadCounters) {
            // Memory: the rank's total as profiler::memoryTotalCategories defines it (the
            // engine's categories summed, or one allocator view of an imported trace), each
            // counter holding its latest level.
            TS_ASSIGN_OR_RETURN(auto cs, store->counters(rr.rank));
            auto categoryOf = [&](const trace::Counter& c) -> const std::string* {
                if (c.name >= data->strings.size()) return nullptr;
                const std::string& n = data->strings[c.name];
                return n.rfind("memory.", 0) == 0 ? &n : nullptr;
            };
            std::vector<std::string> cats;
            for (auto& c : cs)
                if (auto* n = categoryOf(c); n && std::find(cats.begin(), cats.end(), n->substr(7)) == cats.end())
                    cats.push_back(n->substr(7));
            const std::vector<std::string> summed = profiler::memoryTotalCategories(cats);
            std::vector<const trace::Counter*> mem;
            for (auto& c : cs)
                if (auto* n = categoryOf(c); n && std::find(summed.begin(), summed.end(), n->substr(7)) != summed.end())
                    mem.push_back(&c);
            if (!mem.empty()) {
                std::stable_sort(mem.begin(), mem.end(), [](auto* a, auto* b) { return a->tsNs < b->tsNs; });
                TimelineRow r;
                r.kind = RowKind::Counter;
                r.rank = rr.rank;
                r.label = QString("rank %1 · memory").arg(rr.rank);
                std::unordered_map<uint32_t, double> level;
                double total = 0;
                for (auto* c : mem) {
                    double& l = level[c->name];
                    total += c->value - l;
                    l = c->value;
                    if (!r.counter.ts.empty() && r.counter.ts.back() == c->tsNs) {
                        r.counter.value.back() = total;
                    } else {
                        r.counter.ts.push_back(c->tsNs);
                        r.counter.value.push_back(total);
                    }
                }
                r.counter.buildBlocks();
                lo = std::min(lo, r.counter.ts.front());
                hi = std::max(hi, r.counter.ts.back());
                data->rows.push_back(std::move(r));
            }
        }
    }
    if (lo > hi) lo = hi = 0;
    data->minNs = lo;
    data->maxNs = hi;

    // Steps: per rank windows from the Range rows (outermost wins for equal numbers, as in the
    // analysis), and their spans over ranks.
    std::map<int, StepSpan> spans;
    data->stepWindows.assign(data->ranks.size(), {});
    data->computeRowsOfRank.assign(data->ranks.size(), {});
    for (size_t ri = 0; ri < data->rows.size(); ++ri) {
        const TimelineRow& r = data->rows[ri];
        if (r.kind == RowKind::Stream && r.trackKind == TrackKind::Compute)
            data->computeRowsOfRank[size_t(data->rankIndex(r.rank))].push_back(int(ri));
    }
    for (size_t k = 0; k < data->ranks.size(); ++k) {
        std::map<int, std::pair<int64_t, int64_t>> windows;
        for (const auto& r : data->rows) {
            // Host ranges only: a step is the host's step range, as in the analysis (the GPU
            // copies of an imported trace's steps are drawn, not used for the windows).
            if (r.rank != data->ranks[k] || r.kind != RowKind::Range || r.trackKind != TrackKind::HostThread) continue;
            for (size_t i = 0; i < r.size(); ++i) {
                if (r.name[i] >= data->strings.size()) continue;
                auto n = stepNumberOf(data->strings[r.name[i]], r.step[i]);
                if (!n) continue;
                auto [it, fresh] = windows.try_emplace(*n, r.start[i], r.end[i]);
                if (!fresh) {
                    it->second.first = std::min(it->second.first, r.start[i]);
                    it->second.second = std::max(it->second.second, r.end[i]);
                }
            }
        }
        for (auto& [step, w] : windows) {
            data->stepWindows[k].push_back({step, w.first, w.second});
            StepSpan& sp = spans.try_emplace(step, StepSpan{step, w.first, w.second}).first->second;
            sp.startNs = std::min(sp.startNs, w.first);
            sp.endNs = std::max(sp.endNs, w.second);
        }
    }
    for (auto& [step, sp] : spans) data->steps.push_back(sp);
    return std::shared_ptr<const TimelineData>(std::move(data));
}

Result<std::shared_ptr<const TimelineData>> loadTimelineOverview(const std::string& path) {
    TS_ASSIGN_OR_RETURN(auto store, profiler::TraceStore::open(path, true));
    TS_ASSIGN_OR_RETURN(int version, store->schemaVersion());
    if (version < 2) return Status::notFound("run file without a chunk index (schema v" + std::to_string(version) + ")");
    auto data = std::make_shared<TimelineData>();
    data->path = path;
    data->overview = true;
    if (auto info = store->runInfo(); info.isOk()) {
        data->runName = QString::fromStdString(info.value().name);
        data->status = QString::fromStdString(info.value().status);
        data->layout = QString::fromStdString(info.value().layout);
    }
    TS_ASSIGN_OR_RETURN(auto tracks, store->tracks());
    std::stable_sort(tracks.begin(), tracks.end(), [](const profiler::TrackRow& a, const profiler::TrackRow& b) {
        if (a.rank != b.rank) return a.rank < b.rank;
        if (kindOrder(a.kind) != kindOrder(b.kind)) return kindOrder(a.kind) < kindOrder(b.kind);
        if (a.streamIndex != b.streamIndex) return a.streamIndex < b.streamIndex;
        return a.id < b.id;
    });
    std::unordered_map<uint32_t, size_t> rowOfTrack;
    for (const auto& t : tracks) {
        if (data->ranks.empty() || data->ranks.back() != t.rank) data->ranks.push_back(t.rank);
        if (t.kind == TrackKind::HostThread) continue;
        TimelineRow r;
        r.kind = RowKind::Stream;
        r.rank = t.rank;
        r.trackId = t.id;
        r.trackKind = t.kind;
        r.streamIndex = t.streamIndex;
        r.trackName = QString::fromStdString(t.name);
        // The group is not known without decoding: the track name's last word ("rank 0 comm dp").
        QString kind = streamKindName(t.kind);
        if (t.kind == TrackKind::Comm || t.kind == TrackKind::P2P) {
            QString last = r.trackName.section(' ', -1);
            if (!last.isEmpty() && !last.front().isDigit() && last != kind) {
                auto it = std::find(data->groups.begin(), data->groups.end(), last);
                if (it == data->groups.end()) it = data->groups.insert(data->groups.end(), last);
                r.mainGroup = uint8_t(it - data->groups.begin());
                kind += " " + last;
            }
        }
        r.label = QString("rank %1 · %2").arg(t.rank).arg(kind);
        rowOfTrack[t.id] = data->rows.size();
        data->rows.push_back(std::move(r));
    }
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(store->db(), "SELECT track, ts_first, ts_last, n FROM slice_chunks ORDER BY track, ts_first", -1, &q,
                           nullptr) != SQLITE_OK)
        return Status::io(std::string("reading the chunk index: ") + sqlite3_errmsg(store->db()));
    const Category kindCategory[] = {Category::Other, Category::Gemm, Category::Collective, Category::P2P, Category::Memcpy};
    while (sqlite3_step(q) == SQLITE_ROW) {
        auto it = rowOfTrack.find(uint32_t(sqlite3_column_int64(q, 0)));
        if (it == rowOfTrack.end()) continue;
        TimelineRow& r = data->rows[it->second];
        const int64_t n = sqlite3_column_int64(q, 3);
        r.start.push_back(sqlite3_column_int64(q, 1));
        r.end.push_back(std::max<int64_t>(r.start.back(), sqlite3_column_int64(q, 2)));
        r.name.push_back(0);
        r.category.push_back(uint8_t(kindCategory[std::min<size_t>(size_t(r.trackKind), 4)]));
        r.group.push_back(r.mainGroup);
        r.step.push_back(-1), r.microbatch.push_back(-1), r.layer.push_back(-1), r.chunk.push_back(-1);
        r.correlation.push_back(0), r.payload.push_back(0);
        if (r.opsPrefix.empty()) r.opsPrefix.push_back(0);
        r.opsPrefix.push_back(r.opsPrefix.back() + uint64_t(std::max<int64_t>(n, 0)));
        data->sliceCount += n;
    }
    sqlite3_finalize(q);
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (auto& r : data->rows) {
        finishRow(r);
        if (r.size()) {
            lo = std::min(lo, r.start.front());
            hi = std::max(hi, r.maxEnd.empty() ? r.end.back() : r.maxEnd.back());
        }
    }
    data->minNs = lo > hi ? 0 : lo;
    data->maxNs = lo > hi ? 0 : hi;
    data->stepWindows.assign(data->ranks.size(), {});
    data->computeRowsOfRank.assign(data->ranks.size(), {});
    data->strings.assign(1, std::string());
    return std::shared_ptr<const TimelineData>(std::move(data));
}

// ---- queries -------------------------------------------------------------------------------

int TimelineData::rankIndex(int rank) const {
    auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
    return it != ranks.end() && *it == rank ? int(it - ranks.begin()) : -1;
}

std::vector<BubbleInterval> TimelineData::bubbleIntervals(int k, int step) const {
    std::vector<BubbleInterval> out;
    if (k < 0 || size_t(k) >= stepWindows.size()) return out;
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const StepSpan& w : stepWindows[size_t(k)]) {
        if (step >= 0 && w.step != step) continue;
        busy.clear();
        for (int ri : computeRowsOfRank[size_t(k)]) {
            const TimelineRow& r = rows[size_t(ri)];
            auto [a, b] = visibleRange(r.span(), w.startNs, w.endNs);
            for (size_t i = a; i < b; ++i)
                if (r.end[i] > w.startNs) busy.push_back({std::max(r.start[i], w.startNs), std::min(r.end[i], w.endNs)});
        }
        if (computeRowsOfRank[size_t(k)].size() > 1) std::sort(busy.begin(), busy.end());
        int64_t cursor = w.startNs;
        for (auto& [s, e] : busy) {
            if (s > cursor) out.push_back({w.step, cursor, s});
            cursor = std::max(cursor, e);
        }
        if (cursor < w.endNs) out.push_back({w.step, cursor, w.endNs});
    }
    std::sort(out.begin(), out.end(), [](const BubbleInterval& a, const BubbleInterval& b) { return a.fromNs < b.fromNs; });
    return out;
}

const StepSpan* TimelineData::stepSpan(int step) const {
    for (const auto& s : steps)
        if (s.step == step) return &s;
    return nullptr;
}

QString TimelineData::sliceName(const TimelineRow& r, size_t i) const {
    uint32_t id = r.name[i];
    return id < strings.size() ? QString::fromStdString(strings[id]) : QString();
}

SliceDetails TimelineData::details(int rowIndex, size_t i) const {
    SliceDetails d;
    if (rowIndex < 0 || size_t(rowIndex) >= rows.size()) return d;
    const TimelineRow& r = rows[size_t(rowIndex)];
    if (i >= r.size() || overview) return d;
    d.valid = true;
    d.name = sliceName(r, i);
    d.rank = r.rank;
    d.track = r.trackName;
    d.streamKind = streamKindName(r.trackKind);
    d.streamIndex = r.streamIndex;
    d.category = QString::fromLatin1(trace::categoryName(Category(r.category[i])));
    d.group = r.group[i] < groups.size() ? groups[r.group[i]] : QString();
    d.startNs = r.start[i];
    d.startRelNs = r.start[i] - minNs;
    d.durNs = r.end[i] - r.start[i];
    const auto& p = payloads[r.payload[i] < payloads.size() ? r.payload[i] : 0];
    d.bytes = p.first;
    d.flops = p.second;
    d.flopRate = d.durNs > 0 && d.flops > 0 ? d.flops / (double(d.durNs) * 1e-9) : 0;
    d.step = r.step[i];
    d.microbatch = r.microbatch[i];
    d.layer = r.layer[i];
    d.chunk = r.chunk[i];
    d.correlation = r.correlation[i];
    return d;
}

std::vector<FindMatch> TimelineData::findByName(const QString& text, size_t maxMatches) const {
    std::vector<FindMatch> out;
    if (text.isEmpty()) return out;
    // Match the (few) interned names once, then scan the rows' name ids.
    std::vector<uint8_t> hit(strings.size(), 0);
    bool any = false;
    const QByteArray needle = text.toUtf8().toLower();
    for (size_t s = 0; s < strings.size(); ++s) {
        QByteArray lower = QByteArray::fromStdString(strings[s]).toLower();
        if (lower.contains(needle)) hit[s] = 1, any = true;
    }
    if (!any) return out;
    for (size_t ri = 0; ri < rows.size() && out.size() < maxMatches; ++ri) {
        const TimelineRow& r = rows[ri];
        for (size_t i = 0; i < r.size() && out.size() < maxMatches; ++i)
            if (r.name[i] < hit.size() && hit[r.name[i]]) out.push_back({int(ri), i, r.start[i]});
    }
    std::stable_sort(out.begin(), out.end(), [](const FindMatch& a, const FindMatch& b) { return a.startNs < b.startNs; });
    return out;
}

QString sliceDetailsHtml(const SliceDetails& d) {
    if (!d.valid) return QStringLiteral("<i>No slice selected</i>");
    QString h = "<table cellspacing='0' cellpadding='2'>";
    auto row = [&](const QString& k, const QString& v) {
        h += "<tr><td style='color:#667'>" + k.toHtmlEscaped() + "</td><td><b>" + v.toHtmlEscaped() + "</b></td></tr>";
    };
    auto num = [](int v) { return v >= 0 ? QString::number(v) : QString::fromUtf8("–"); };
    h = "<div style='font-size:larger'><b>" + d.name.toHtmlEscaped() + "</b></div>" + h;
    if (!d.runLabel.isEmpty()) row("run", d.runLabel);
    row("rank", QString::number(d.rank));
    row("stream", d.streamKind + (d.streamIndex ? QString(" #%1").arg(d.streamIndex) : QString()) + "  (" + d.track + ")");
    row("category", d.category);
    if (!d.group.isEmpty()) row("group", d.group);
    row("start", formatDurationNs(double(d.startRelNs)) + QString("  (%1 ns)").arg(d.startNs));
    row("duration", formatDurationNs(double(d.durNs)));
    if (d.bytes) row("bytes", formatBytes(double(d.bytes)));
    if (d.flops > 0) {
        row("FLOPs", formatFlops(d.flops));
        row("achieved", formatFlopRate(d.flopRate));
    }
    row("step", num(d.step));
    row("microbatch", num(d.microbatch));
    if (d.layer >= 0) row("layer", num(d.layer));
    if (d.chunk >= 0) row("chunk", num(d.chunk));
    if (d.correlation) row("correlation", QString::number(d.correlation));
    return h + "</table>";
}

}  // namespace ts::gui
