// Moving one process's trace into another process's run file (issue #18: `mpirun -np N
// trainscope run` writes one run file holding every rank).
//
// ForwardingRecorder is the trace::Recorder of a process that does not write the run file: it
// keeps what the engine records (tracks, interned names, slices, counters) and the process's
// log lines in memory and hands them out as a self-contained byte blob (drain()), which the
// caller sends to the writing process. TraceReplayer, in the writing process, applies the
// blobs of one sending process, in order, to the run file's recorder: track and name ids are
// mapped to the writer's ids, correlation ids are tagged with the sender so they never collide
// with the writer's, and timestamps are shifted by the sender's measured clock offset.
//
// Metadata written by the sender is dropped (the writing process records the run's metadata
// once). Blob format (little-endian, host order, both ends run the same build): a sequence of
// records, each a one-byte tag followed by its fields; strings are u32 length + bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/recorder.h"
#include "common/status.h"

namespace ts::profiler {

class ForwardingRecorder : public trace::Recorder {
public:
    ForwardingRecorder() = default;

    uint32_t track(const trace::TrackDesc& desc) override;
    uint32_t intern(std::string_view text) override;
    void slice(const trace::Slice& s) override;
    void counter(const trace::Counter& c) override;
    void metadata(std::string_view key, std::string_view value) override;
    uint64_t nextCorrelation() override;

    // A log line of this process (level "info" | "warning" | "error"), stamped now.
    void log(std::string_view level, std::string_view text);

    // Everything recorded since the last drain(), as one blob (empty string: nothing new).
    std::string drain();
    // Bytes waiting for the next drain().
    size_t pendingBytes() const;

private:
    mutable std::mutex m_mutex;
    std::string m_buf;
    std::unordered_map<std::string, uint32_t> m_names;
    uint32_t m_nextTrack = 1, m_nextName = 1;
    uint64_t m_nextCorrelation = 1;
};

class TraceReplayer {
public:
    struct Options {
        int64_t clockOffsetNs = 0;    // sender clock - writer clock; subtracted from timestamps
        uint64_t correlationTag = 0;  // OR-ed into every non-zero correlation id (sender's tag)
        // Receives the sender's log lines (timestamp already shifted); null = dropped.
        std::function<void(int64_t tsNs, const std::string& level, const std::string& text)> onLog;
    };
    TraceReplayer(trace::Recorder& dst, Options opts);

    // Applies one blob from drain(). A truncated or malformed blob applies its complete
    // records and returns InvalidArgument naming the offset.
    Status apply(std::string_view blob);

    uint64_t slices() const { return m_slices; }
    uint64_t counters() const { return m_counters; }

private:
    trace::Recorder& m_dst;
    Options m_opts;
    std::unordered_map<uint32_t, uint32_t> m_tracks, m_names;
    uint64_t m_slices = 0, m_counters = 0;
};

// The tag for sender `process` (1-based: process 0 is the writer and keeps untagged ids).
inline uint64_t correlationTagFor(int process) { return uint64_t(uint32_t(process)) << 40; }

}  // namespace ts::profiler
