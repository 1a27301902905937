// The intermediate form shared by the trace importers (nsys SQLite, Kineto JSON).
//
// A parser turns one source (one rank) into a StagedFile: tracks, slices and counters with
// file-local ids and the file's own clock. Only after every file is parsed do we know the
// rank of each file (hints may collide), the common time origin (files are aligned on the
// Unix-epoch clock their tools record) and the run-wide ids; emitStaged() then feeds the
// rows to a trace::Recorder. Importers never write SQL: the Recorder is the only output
// (the perfetto trace_processor pattern). Malformed input is counted in ImportStats and
// skipped; programming errors assert.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/recorder.h"
#include "common/status.h"

namespace ts::profiler::import {

enum class SourceFormat : uint8_t { Kineto, Nsys };
const char* sourceFormatName(SourceFormat f);  // "kineto" | "nsys"

struct ImportOptions {
    // Holistic Trace Analysis compatibility (HTA's include_last_profiler_step=False): drop
    // host ops that start at or after the start of the last ProfilerStep, and GPU ops whose
    // launch was dropped (or that no host op launched). HTA assumes the last step is cut
    // short by the profiler stopping. Off by default: an import keeps everything.
    bool dropLastProfilerStep = false;
};

// Counts of skipped / malformed / notable records, by name ("import.kineto.malformed_events").
// They end up in the run's stats table (docs/import.md lists every name).
class ImportStats {
public:
    void add(std::string_view name, int64_t delta = 1);
    int64_t get(std::string_view name) const;
    const std::map<std::string, int64_t, std::less<>>& all() const { return m_counts; }
    void merge(const ImportStats& other);

private:
    std::map<std::string, int64_t, std::less<>> m_counts;
};

// File-local string interning: id 0 is "", ids are dense. Text is stored as valid UTF-8
// (ill-formed sequences become U+FFFD): names from trace files end up in JSON.
class StringTable {
public:
    StringTable();
    uint32_t intern(std::string_view text);
    const std::string& text(uint32_t id) const { return m_texts.at(id); }
    size_t size() const { return m_texts.size(); }

private:
    std::deque<std::string> m_texts;  // a deque never moves its elements: the views stay valid
    std::unordered_map<std::string_view, uint32_t> m_ids;
};

struct StagedTrack {
    trace::TrackKind kind = trace::TrackKind::HostThread;
    bool gpu = false;           // a GPU stream (kind decided by finalizeStaged) or a CPU thread
    int32_t device = 0;         // CUDA device for GPU streams
    int32_t streamIndex = 0;    // CUDA stream id for GPU streams; thread ordinal for host
    int64_t pid = 0, tid = 0;   // host: OS process / thread ids
    std::string label;          // "gpu 3 stream 7", "thread 1234 (python3)"; emitted as "rank R <label>"
};

struct StagedFile {
    std::string path;
    SourceFormat format = SourceFormat::Kineto;
    std::optional<int> rankHint;     // from distributedInfo / nsys hints; may collide
    std::string rankSource;          // how rankHint was found ("distributedInfo.rank", ...)
    std::optional<int> worldSize;
    // ts + epochOffsetNs = nanoseconds since the Unix epoch. nullopt: the file's clock is
    // unknown and it is aligned by its first event instead (counted as import.unaligned_files).
    std::optional<int64_t> epochOffsetNs;
    StringTable strings;
    std::vector<StagedTrack> tracks;
    // Slice.track = index into tracks, Slice.name/group = ids in strings, Slice.correlation
    // = the file's own correlation id (0 none). Counter.name = id in strings, rank unused.
    std::vector<trace::Slice> slices;
    std::vector<trace::Counter> counters;
    std::map<std::string, std::string> info;  // facts for the run metadata (schema version ...)
    ImportStats stats;
};

// Parses "ProfilerStep#12", "step 12", "iteration 12" (NVTX/annotation spellings of a
// training step) into 12; nullopt for anything else.
std::optional<int> parseStepName(std::string_view name);

// Format-independent passes, run once per parsed file:
//  - GPU track kind from what runs on it: only NCCL collectives -> Comm, only send/recv -> P2P,
//    only memcpy/memset -> Copy, anything else -> Compute;
//  - host slices that launched GPU work become Launch slices;
//  - nesting depth of host slices;
//  - step of every slice: host slices by time inside a "step N" range, GPU slices by the step
//    of the host slice that launched them (correlation);
//  - options.dropLastProfilerStep.
void finalizeStaged(StagedFile& file, const ImportOptions& options);

struct EmittedFile {
    std::string path;
    SourceFormat format = SourceFormat::Kineto;
    int rank = 0;
    std::string rankSource;  // "" when assigned from the file order
    bool aligned = false;    // placed by its epoch clock (false: by its first event)
    int64_t tracks = 0, slices = 0, counters = 0;
};

struct EmitSummary {
    std::vector<EmittedFile> files;
    int64_t originUnixNs = 0;  // timestamps in the trace are ns since this instant (0 unknown)
    int64_t tracks = 0, slices = 0, counters = 0;
};

// Assigns ranks (hint if free, else the file's position if free, else the lowest free rank;
// collisions counted as import.rank_conflicts), aligns all files on one clock whose zero is
// the earliest event of any file, and feeds every row to rec. Correlation ids are renumbered
// with rec.nextCorrelation() so ids from different files never collide. Run metadata:
// "import.files" (JSON array, one object per file), "import.time_origin_unix_ns".
EmitSummary emitStaged(std::vector<StagedFile>& files, trace::Recorder& rec, ImportStats& stats);

}  // namespace ts::profiler::import
