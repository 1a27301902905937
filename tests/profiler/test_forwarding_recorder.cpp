// ForwardingRecorder -> blob -> TraceReplayer: what one process records arrives in another
// process's recorder with the writer's ids, shifted clocks and tagged correlations (issue #18).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "profiler/forwarding_recorder.h"
#include "tests/parallel/fake_recorder.h"

namespace ts::profiler {
namespace {

trace::Slice sliceOn(uint32_t track, uint32_t name, int64_t start, uint64_t corr, uint32_t group = 0) {
    trace::Slice s;
    s.track = track;
    s.name = name;
    s.category = trace::Category::Collective;
    s.startNs = start;
    s.durNs = 50;
    s.step = 3;
    s.microbatch = 1;
    s.layer = 2;
    s.correlation = corr;
    s.bytes = 4096;
    s.flops = 1.5e6;
    s.group = group;
    return s;
}

TEST(ForwardingRecorder, ReplaysTracksNamesSlicesCountersAndLogsWithTheWritersIds) {
    ForwardingRecorder fwd;
    trace::TrackDesc d;
    d.rank = 3;
    d.kind = trace::TrackKind::Comm;
    d.streamIndex = 1;
    d.name = "rank 3 comm dp";
    const uint32_t tr = fwd.track(d);
    const uint32_t ar = fwd.intern("all_reduce");
    EXPECT_EQ(fwd.intern("all_reduce"), ar);  // same text, same id
    const uint32_t dp = fwd.intern("dp");
    fwd.slice(sliceOn(tr, ar, 10'000, 7, dp));
    fwd.counter(trace::Counter{3, fwd.intern("memory.params"), 12'000, 42.0});
    fwd.log("info", "hello from rank 3");

    // The writer already has names and tracks of its own: the replayed ids must be its ids.
    test::FakeRecorder dst;
    dst.intern("forward");
    dst.intern("dp");
    trace::TrackDesc own;
    own.name = "rank 0 compute";
    dst.track(own);

    std::vector<std::string> logs;
    std::vector<int64_t> logTs;
    TraceReplayer::Options o;
    o.clockOffsetNs = 1'000;  // the sender's clock runs 1 us ahead
    o.correlationTag = correlationTagFor(3);
    o.onLog = [&](int64_t ts, const std::string& level, const std::string& text) {
        logs.push_back(level + ": " + text);
        logTs.push_back(ts);
    };
    TraceReplayer rep(dst, o);
    const std::string blob = fwd.drain();
    ASSERT_TRUE(rep.apply(blob).isOk());
    EXPECT_EQ(fwd.drain(), "");  // drained

    ASSERT_EQ(dst.tracks.size(), 2u);
    EXPECT_EQ(dst.tracks[1].name, "rank 3 comm dp");
    EXPECT_EQ(dst.tracks[1].rank, 3);
    EXPECT_EQ(dst.tracks[1].kind, trace::TrackKind::Comm);
    EXPECT_EQ(dst.tracks[1].streamIndex, 1);
    ASSERT_EQ(dst.slices.size(), 1u);
    const trace::Slice& s = dst.slices[0];
    EXPECT_EQ(s.track, 2u);
    EXPECT_EQ(dst.str(s.name), "all_reduce");
    EXPECT_EQ(dst.str(s.group), "dp");
    EXPECT_EQ(s.group, 2u);  // the writer's existing id for "dp"
    EXPECT_EQ(s.startNs, 9'000);
    EXPECT_EQ(s.durNs, 50);
    EXPECT_EQ(s.step, 3);
    EXPECT_EQ(s.microbatch, 1);
    EXPECT_EQ(s.layer, 2);
    EXPECT_EQ(s.bytes, 4096u);
    EXPECT_DOUBLE_EQ(s.flops, 1.5e6);
    EXPECT_EQ(s.correlation, 7u | (uint64_t(3) << 40));
    ASSERT_EQ(dst.counters.size(), 1u);
    EXPECT_EQ(dst.str(dst.counters[0].name), "memory.params");
    EXPECT_EQ(dst.counters[0].tsNs, 11'000);
    EXPECT_EQ(dst.counters[0].value, 42.0);
    ASSERT_EQ(logs.size(), 1u);
    EXPECT_EQ(logs[0], "info: hello from rank 3");

    // A later blob uses ids sent in the first one (the replayer remembers them).
    fwd.slice(sliceOn(tr, ar, 20'000, 0));
    ASSERT_TRUE(rep.apply(fwd.drain()).isOk());
    ASSERT_EQ(dst.slices.size(), 2u);
    EXPECT_EQ(dst.str(dst.slices[1].name), "all_reduce");
    EXPECT_EQ(dst.slices[1].correlation, 0u);  // "none" stays none
    EXPECT_EQ(rep.slices(), 2u);
    EXPECT_EQ(rep.counters(), 1u);
}

TEST(ForwardingRecorder, ATruncatedBlobAppliesItsCompleteRecordsAndSaysWhere) {
    ForwardingRecorder fwd;
    trace::TrackDesc d;
    d.name = "rank 1 compute";
    const uint32_t tr = fwd.track(d);
    const uint32_t n = fwd.intern("linear_fc1.fwd");
    fwd.slice(sliceOn(tr, n, 100, 1));
    fwd.slice(sliceOn(tr, n, 200, 2));
    std::string blob = fwd.drain();
    blob.resize(blob.size() - 5);  // cut into the second slice

    test::FakeRecorder dst;
    TraceReplayer rep(dst, {});
    const Status st = rep.apply(blob);
    EXPECT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.message();
    ASSERT_EQ(dst.slices.size(), 1u);
    EXPECT_EQ(dst.slices[0].startNs, 100);
}

TEST(ForwardingRecorder, ASliceOnATrackNeverSentIsAnError) {
    ForwardingRecorder fwd;
    const uint32_t n = fwd.intern("x");
    fwd.slice(sliceOn(99, n, 1, 0));
    test::FakeRecorder dst;
    TraceReplayer rep(dst, {});
    const Status st = rep.apply(fwd.drain());
    EXPECT_FALSE(st.isOk());
    EXPECT_NE(st.message().find("track 99"), std::string::npos) << st.message();
    EXPECT_TRUE(dst.slices.empty());
}

}  // namespace
}  // namespace ts::profiler
