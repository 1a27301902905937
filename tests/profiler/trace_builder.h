// Test helper: builds small hand-made traces in an in-memory run file through TraceWriter,
// so analysis tests read rows exactly as the real writer stores them.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "profiler/store.h"

namespace ts::profiler::testing {

class TraceBuilder {
public:
    explicit TraceBuilder(const std::string& path = ":memory:") {
        auto s = TraceStore::create(path);
        EXPECT_TRUE(s.isOk()) << s.status().toString();
        store = std::move(s).value();
        writer = std::make_unique<TraceWriter>(*store, 1000);
    }
    uint32_t track(int rank, trace::TrackKind kind, int stream = 0) {
        return writer->track({rank, 0, kind, stream,
                              "rank " + std::to_string(rank) + " " + trace::trackKindName(kind) + " " + std::to_string(stream)});
    }
    // Adds [start, end) on track; returns the slice for chaining tweaks.
    trace::Slice& add(uint32_t track, trace::Category cat, int64_t start, int64_t end, const std::string& name = "k",
                      const std::string& group = "", uint64_t correlation = 0) {
        commitLast();
        m_last = trace::Slice{};
        m_last.track = track;
        m_last.category = cat;
        m_last.startNs = start;
        m_last.durNs = end - start;
        m_last.name = writer->intern(name);
        m_last.group = group.empty() ? 0 : writer->intern(group);
        m_last.correlation = correlation;
        m_pending = true;
        return m_last;
    }
    void commitLast() {
        if (m_pending) writer->slice(m_last);
        m_pending = false;
    }
    // Flushes the last added slice and the writer; call before analysing.
    TraceStore& done() {
        commitLast();
        Status st = writer->flush();
        EXPECT_TRUE(st.isOk()) << st.toString();
        return *store;
    }
    // add() then commit immediately.
    void put(uint32_t track, trace::Category cat, int64_t start, int64_t end, const std::string& name = "k",
             const std::string& group = "", uint64_t correlation = 0) {
        commitLast();
        add(track, cat, start, end, name, group, correlation);
        commitLast();
    }
    void putStep(uint32_t hostTrack, int step, int64_t start, int64_t end) {
        commitLast();
        auto& s = add(hostTrack, trace::Category::Range, start, end, "step " + std::to_string(step));
        s.step = step;
        commitLast();
    }

    std::unique_ptr<TraceStore> store;
    std::unique_ptr<TraceWriter> writer;

private:
    trace::Slice m_last;
    bool m_pending = false;
};

}  // namespace ts::profiler::testing
