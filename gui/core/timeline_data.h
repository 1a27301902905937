// TimelineData: one run's trace as the timeline draws it, built off the UI thread into compact
// immutable arrays and handed to the UI as shared_ptr<const TimelineData> (never mutated
// after loadTimelineData returns, so any thread may read it).
//
// Rows, per rank in rank order: the host tracks' Range slices by nesting depth (step,
// microbatch, forward/backward, stage, layer ...), then host slices that are neither ranges
// nor launches (if any), then one row per device stream (compute, comm by stream index, p2p,
// copy), then the rank's memory counter (sum of its memory.* counters). Launch slices are not
// drawn (their executions are, on the streams). Each slice row is sorted by start and carries
// a prefix maximum of ends, so the visible part is found by binary search (timeline_lod.h).
//
// Pipeline bubbles: per rank and step, the gaps inside the step window not covered by any
// slice on the rank's compute-stream tracks: profiler/analysis.h pipelineBubble's definition
// (bubbleIntervals(); the widget shades the gaps between the boxes it draws).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <QColor>
#include <QMetaType>
#include <QString>

#include "common/recorder.h"
#include "common/status.h"
#include "gui/core/timeline_lod.h"

namespace ts::gui {

enum class RowKind : uint8_t { Range, Host, Stream, Counter };

// Per-pixel min/max of a counter series without visiting every sample: samples, plus block
// minima/maxima for blocks of kBlock samples.
struct CounterSeries {
    static constexpr size_t kBlock = 64;
    std::vector<int64_t> ts;
    std::vector<double> value;
    std::vector<double> blockMin, blockMax;
    double maxValue = 0;
    void buildBlocks();
    // min/max over samples [a, b) (a < b).
    std::pair<double, double> minMax(size_t a, size_t b) const;
    // The sample in force at t (the last at or before t): index, or -1 before the first.
    int64_t indexAt(int64_t t) const;
};

struct TimelineRow {
    RowKind kind = RowKind::Stream;
    int rank = 0;
    uint32_t trackId = 0;          // first track of the row (ranges may merge several host tracks)
    trace::TrackKind trackKind = trace::TrackKind::Compute;
    int streamIndex = 0;
    int depth = 0;                 // Range rows
    uint8_t mainGroup = 0;         // comm rows: the group most of its slices belong to
    QString label;                 // "rank 0 · compute"
    QString trackName;             // the stored track name

    // Slices, by start.
    std::vector<int64_t> start, end, maxEnd;  // maxEnd empty when ends never decrease (then = end)
    std::vector<uint32_t> name;                // string id
    std::vector<uint8_t> category;             // trace::Category
    std::vector<uint8_t> group;                // index into TimelineData::groups (0 = none)
    std::vector<int32_t> step;
    std::vector<int16_t> microbatch, layer, chunk;
    std::vector<uint64_t> correlation;
    std::vector<uint32_t> payload;             // index into TimelineData::payloads (bytes, flops)

    CounterSeries counter;                     // Counter rows
    // Overview rows only: each element is a stored chunk of `opsPrefix[i+1] - opsPrefix[i]`
    // slices (the run file's per-track chunk index), so folds count real ops.
    std::vector<uint64_t> opsPrefix;

    size_t size() const { return start.size(); }
    int64_t endAt(size_t i) const { return end[i]; }
    RowSpan span(int64_t offsetNs = 0) const;
};

struct BubbleInterval {
    int step = 0;
    int64_t fromNs = 0, toNs = 0;
};

struct StepSpan {
    int step = 0;
    int64_t startNs = 0, endNs = 0;  // earliest start / latest end over ranks
};

// Everything the details pane shows about one slice.
struct SliceDetails {
    bool valid = false;
    QString runLabel;
    QString name;
    int rank = 0;
    QString track;       // stored track name
    QString streamKind;  // host | compute | comm | p2p | copy
    int streamIndex = 0;
    QString category, group;
    int64_t startNs = 0;     // trace clock
    int64_t startRelNs = 0;  // since the run's first event
    int64_t durNs = 0;
    uint64_t bytes = 0;
    double flops = 0;
    double flopRate = 0;  // flops / duration, FLOP/s (0 when either is 0)
    int step = -1, microbatch = -1, layer = -1, chunk = -1;
    uint64_t correlation = 0;
};

// HTML for the details pane (a small two-column table).
QString sliceDetailsHtml(const SliceDetails& d);

struct FindMatch {
    int row = 0;
    size_t index = 0;
    int64_t startNs = 0;
};

class TimelineData {
public:
    std::string path;
    // An overview is the quick first stage (loadTimelineOverview): stream rows made of the
    // file's chunk index, no ranges, counters or slice details. The full data replaces it.
    bool overview = false;
    QString runName, status, layout;
    int pp = 1;
    std::vector<std::string> strings;
    std::vector<QString> groups{QString()};  // index 0 = none
    std::vector<std::pair<uint64_t, double>> payloads{{0, 0.0}};  // (bytes, flops); 0 = none
    std::vector<TimelineRow> rows;
    std::vector<int> ranks;
    // Per rank (index into `ranks`): its step windows by step, and its compute-stream rows.
    std::vector<std::vector<StepSpan>> stepWindows;
    std::vector<std::vector<int>> computeRowsOfRank;
    std::vector<StepSpan> steps;        // by step number
    int64_t minNs = 0, maxNs = 0;       // extent of all slices and counters
    int64_t sliceCount = 0;             // slices held in rows (launches excluded)
    int64_t lastLoadedSliceCount = 0;   // slices in the file when loaded (follow mode)

    int rankIndex(int rank) const;
    // Pipeline bubbles of a rank (index into `ranks`) in one step (-1 = every step): the gaps
    // inside the step window covered by no slice of the rank's compute streams, by start.
    // Computed on demand from the rows (binary search to the window), never stored: a trace
    // has about as many gaps as kernels.
    std::vector<BubbleInterval> bubbleIntervals(int rankIndex, int step = -1) const;
    const StepSpan* stepSpan(int step) const;
    QString sliceName(const TimelineRow& r, size_t i) const;
    SliceDetails details(int row, size_t index) const;
    // Slices whose name contains `text` (case-insensitive), by start time; at most maxMatches.
    std::vector<FindMatch> findByName(const QString& text, size_t maxMatches = 1'000'000) const;
};

struct TimelineLoadOptions {
    bool loadCounters = true;
    int threads = 2;  // decoding threads (each with its own read-only connection)
};

// The first stage, in milliseconds whatever the run's size: per stream track one element per
// stored chunk (up to 1024 slices: [first start, last start], with its slice count), read from
// the chunk index of a v2 run file without decoding a slice. NotFound for files without chunks
// (schema v1: the caller goes straight to loadTimelineData). Worker thread only.
Result<std::shared_ptr<const TimelineData>> loadTimelineOverview(const std::string& path);

// Opens `path` read-only and builds the timeline. Runs on a worker thread (file + SQLite work).
Result<std::shared_ptr<const TimelineData>> loadTimelineData(const std::string& path,
                                                             const TimelineLoadOptions& options = {});

// Colours (one palette for every view): compute categories, communication by group, p2p,
// memcpy/memset; ranges by what they are (step, microbatch, forward, backward, ...).
QColor sliceColor(trace::Category category, const QString& group);
QColor rangeColor(const QString& name, int depth);
QString streamKindName(trace::TrackKind k);

}  // namespace ts::gui

Q_DECLARE_METATYPE(ts::gui::SliceDetails)
Q_DECLARE_METATYPE(std::shared_ptr<const ts::gui::TimelineData>)
