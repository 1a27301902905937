// Analyses on hand-built traces whose answers are computed by hand in each test, plus the
// interval algebra against a brute-force per-nanosecond reference.
#include <gtest/gtest.h>

#include <random>

#include "profiler/analysis.h"
#include "tests/profiler/trace_builder.h"

using namespace ts;
using namespace ts::profiler;
using ts::profiler::testing::TraceBuilder;
using trace::Category;
using trace::TrackKind;

namespace {

// Brute-force reference: a bitmap over [0, horizon).
std::vector<bool> bitmap(const std::vector<Interval>& v, int64_t horizon) {
    std::vector<bool> b(size_t(horizon), false);
    for (auto& i : v)
        for (int64_t t = std::max<int64_t>(i.start, 0); t < std::min(i.end, horizon); ++t) b[size_t(t)] = true;
    return b;
}

}  // namespace

TEST(Intervals, AgreeWithBruteForceBitmap) {
    std::mt19937 rng(7);
    const int64_t H = 500;
    for (int trial = 0; trial < 200; ++trial) {
        auto rnd = [&] {
            std::vector<Interval> v;
            int n = int(rng() % 12);
            for (int i = 0; i < n; ++i) {
                int64_t s = int64_t(rng() % H), d = int64_t(rng() % 60);
                v.push_back({s, s + d});
            }
            return v;
        };
        auto a = rnd(), b = rnd();
        IntervalSet ma = mergeIntervals(a), mb = mergeIntervals(b);
        auto ba = bitmap(a, H + 100), bb = bitmap(b, H + 100);
        int64_t ua = 0, inter = 0, diff = 0, clipped = 0;
        for (size_t t = 0; t < ba.size(); ++t) {
            ua += ba[t];
            inter += ba[t] && bb[t];
            diff += ba[t] && !bb[t];
            clipped += ba[t] && t >= 100 && t < 300;
        }
        ASSERT_EQ(totalLength(ma), ua);
        ASSERT_EQ(totalLength(intersectSets(ma, mb)), inter);
        ASSERT_EQ(totalLength(subtractSets(ma, mb)), diff);
        ASSERT_EQ(totalLength(clipSet(ma, 100, 300)), clipped);
        for (size_t i = 1; i < ma.size(); ++i) ASSERT_LT(ma[i - 1].end, ma[i].start);  // disjoint, not touching
    }
}

TEST(Overlap, TwoCommIntervalsHalfCoveredIsFiftyPercent) {
    TraceBuilder b;
    uint32_t comp = b.track(0, TrackKind::Compute), comm = b.track(0, TrackKind::Comm);
    b.put(comm, Category::Collective, 0, 100, "all_reduce", "dp");
    b.put(comm, Category::Collective, 200, 300, "all_reduce", "dp");
    b.put(comp, Category::Gemm, 50, 100);
    b.put(comp, Category::Gemm, 200, 250);
    // Memcpy on top of comm must not count as compute.
    b.put(b.track(0, TrackKind::Copy), Category::Memcpy, 0, 50);
    auto r = commComputeOverlap(b.done(), 0);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_DOUBLE_EQ(r->commNs, 200);
    EXPECT_DOUBLE_EQ(r->overlappedNs, 100);
    EXPECT_DOUBLE_EQ(r->pct, 50.0);
}

TEST(Overlap, IntervalsAreMergedAcrossStreamsBeforeIntersecting) {
    TraceBuilder b;
    uint32_t c0 = b.track(0, TrackKind::Compute, 0), c1 = b.track(0, TrackKind::Compute, 1);
    uint32_t m0 = b.track(0, TrackKind::Comm, 0), m1 = b.track(0, TrackKind::Comm, 1);
    // Two comm kernels overlapping each other: union [0, 150). Compute on two streams: union [100, 200).
    b.put(m0, Category::Collective, 0, 100, "ar", "dp");
    b.put(m1, Category::P2P, 50, 150, "send", "pp");
    b.put(c0, Category::Gemm, 100, 140);
    b.put(c1, Category::Attention, 120, 200);
    auto r = commComputeOverlap(b.done(), 0);
    ASSERT_TRUE(r.isOk());
    EXPECT_DOUBLE_EQ(r->commNs, 150);
    EXPECT_DOUBLE_EQ(r->overlappedNs, 50);  // [100, 150)
    EXPECT_NEAR(r->pct, 100.0 / 3.0, 1e-9);
}

TEST(Temporal, IdleComputeNonComputeSplitTheWindow) {
    TraceBuilder b;
    uint32_t comp = b.track(0, TrackKind::Compute), comm = b.track(0, TrackKind::Comm), copy = b.track(0, TrackKind::Copy);
    b.put(comp, Category::Gemm, 0, 100);
    b.put(comm, Category::Collective, 50, 150, "ar", "dp");
    b.put(copy, Category::Memcpy, 300, 400);
    // Ranges on device tracks are not kernels.
    b.put(comp, Category::Range, 0, 1000, "annotation");
    auto t = temporalBreakdown(b.done(), 0);
    ASSERT_TRUE(t.isOk());
    // window [0, 400); busy = [0,150) + [300,400) = 250; compute 100; non-compute 150; idle 150.
    EXPECT_DOUBLE_EQ(t->kernelTimeNs, 400);
    EXPECT_DOUBLE_EQ(t->computeNs, 100);
    EXPECT_DOUBLE_EQ(t->nonComputeNs, 150);
    EXPECT_DOUBLE_EQ(t->idleNs, 150);
    EXPECT_DOUBLE_EQ(t->idlePct + t->computePct + t->nonComputePct, 100.0);
    EXPECT_DOUBLE_EQ(t->computePct, 25.0);
}

TEST(Temporal, HtaDropsKernelsLaunchedInTheLastProfilerStep) {
    auto build = [](TraceBuilder& b) {
        uint32_t host = b.track(0, TrackKind::HostThread), comp = b.track(0, TrackKind::Compute);
        b.put(host, Category::Range, 0, 1000, "ProfilerStep#1");
        b.put(host, Category::Range, 1000, 2000, "ProfilerStep#2");
        b.put(host, Category::Launch, 10, 20, "cudaLaunchKernel", "", 1);
        b.put(host, Category::Launch, 1500, 1510, "cudaLaunchKernel", "", 2);
        b.put(comp, Category::Gemm, 100, 200, "k1", "", 1);   // launched in step 1: kept
        b.put(comp, Category::Gemm, 1600, 1700, "k2", "", 2); // launched in the last step: dropped
        b.put(comp, Category::Gemm, 300, 350, "k3", "", 0);   // no launch: HTA drops it too
    };
    TraceBuilder b;
    build(b);
    auto t = temporalBreakdown(b.done(), 0);
    ASSERT_TRUE(t.isOk());
    EXPECT_DOUBLE_EQ(t->kernelTimeNs, 100);
    EXPECT_DOUBLE_EQ(t->computePct, 100.0);

    // When the importer already dropped the last step, the analysis must not drop again.
    TraceBuilder b2;
    build(b2);
    TraceStore& s2 = b2.done();
    ASSERT_TRUE(s2.addStat("import.dropped_last_step_slices", 3).isOk());
    auto t2 = temporalBreakdown(s2, 0);
    ASSERT_TRUE(t2.isOk());
    EXPECT_DOUBLE_EQ(t2->kernelTimeNs, 1600);  // [100, 1700)
}

TEST(Idle, GapsSplitIntoHostWaitKernelWaitOther) {
    TraceBuilder b;
    uint32_t host = b.track(0, TrackKind::HostThread), comp = b.track(0, TrackKind::Compute);
    // k1 [0,1000). k2 launched at 500 (before k1 ended), starts 1010: gap 10 ns < 30 us -> kernel wait.
    // k3 launched at 1500 (after k2 ended at 2000? no: 1500 < 2000) starts 100000: gap 98000 -> other.
    // k4 launched at 150000 (after k3 ended at 101000), starts 150100: gap 49100 -> host wait.
    b.put(host, Category::Launch, 0, 5, "l", "", 1);
    b.put(host, Category::Launch, 500, 505, "l", "", 2);
    b.put(host, Category::Launch, 1500, 1505, "l", "", 3);
    b.put(host, Category::Launch, 150000, 150005, "l", "", 4);
    b.put(comp, Category::Gemm, 0, 1000, "k", "", 1);
    b.put(comp, Category::Gemm, 1010, 2000, "k", "", 2);
    b.put(comp, Category::Gemm, 100000, 101000, "k", "", 3);
    b.put(comp, Category::Gemm, 150100, 151000, "k", "", 4);
    auto r = idleBreakdown(b.done(), 0);
    ASSERT_TRUE(r.isOk());
    EXPECT_DOUBLE_EQ(r->kernelWaitNs, 10);
    EXPECT_DOUBLE_EQ(r->otherNs, 98000);
    EXPECT_DOUBLE_EQ(r->hostWaitNs, 49100);
}

TEST(Bubble, IdleComputeStreamInsideStepAgainstTheory) {
    TraceBuilder b;
    uint32_t host = b.track(0, TrackKind::HostThread), comp = b.track(0, TrackKind::Compute);
    b.putStep(host, 3, 0, 1000);
    b.put(comp, Category::Gemm, 100, 300);
    b.put(comp, Category::Gemm, 250, 400);
    b.put(comp, Category::Gemm, 600, 700);
    b.put(comp, Category::Gemm, 950, 1200);  // crosses the step end: only [950, 1000) counts
    TraceStore& s = b.done();
    ASSERT_TRUE(s.setMetadata("pp", "4").isOk());
    ASSERT_TRUE(s.setMetadata("num_microbatches", "8").isOk());
    auto ws = stepWindows(s);
    ASSERT_TRUE(ws.isOk());
    ASSERT_EQ(ws->size(), 1u);
    EXPECT_EQ((*ws)[0].step, 3);
    auto r = pipelineBubble(s, (*ws)[0]);
    ASSERT_TRUE(r.isOk());
    // covered: [100,400) 300 + [600,700) 100 + [950,1000) 50 = 450 -> bubble 550
    EXPECT_DOUBLE_EQ(r->bubbleNs, 550);
    EXPECT_DOUBLE_EQ(r->fraction, 0.55);
    EXPECT_DOUBLE_EQ(r->ratioTheory, 3.0 / 8.0);
    EXPECT_DOUBLE_EQ(r->theory, 3.0 / 11.0);  // (p-1)/(vm+p-1)
    EXPECT_DOUBLE_EQ(r->ratio, r->bubbleNs / (r->stepNs - r->bubbleNs));
    ASSERT_TRUE(s.setMetadata("vpp", "2").isOk());
    EXPECT_DOUBLE_EQ(pipelineBubble(s, (*ws)[0])->ratioTheory, 3.0 / 16.0);
    EXPECT_DOUBLE_EQ(pipelineBubble(s, (*ws)[0])->theory, 3.0 / 19.0);
}

TEST(Comm, PerGroupOverlappedAndExposed) {
    TraceBuilder b;
    uint32_t comp = b.track(0, TrackKind::Compute), comm = b.track(0, TrackKind::Comm), p2p = b.track(0, TrackKind::P2P);
    b.put(comp, Category::Gemm, 50, 150);
    b.put(comm, Category::Collective, 0, 100, "all_reduce", "dp");
    auto& s = b.add(comm, Category::Collective, 200, 300, "all_gather", "tp");
    s.bytes = 4096;
    b.commitLast();
    b.put(p2p, Category::P2P, 120, 180, "send", "pp");
    auto r = commBreakdown(b.done(), 0);
    ASSERT_TRUE(r.isOk());
    ASSERT_EQ(r->size(), 3u);
    std::map<std::string, CommGroupStat> by;
    for (auto& c : *r) by[c.group] = c;
    EXPECT_DOUBLE_EQ(by["dp"].overlappedNs, 50);
    EXPECT_DOUBLE_EQ(by["dp"].exposedNs, 50);
    EXPECT_DOUBLE_EQ(by["tp"].exposedNs, 100);
    EXPECT_EQ(by["tp"].bytes, 4096u);
    EXPECT_DOUBLE_EQ(by["pp"].overlappedNs, 30);  // [120,150)
    EXPECT_DOUBLE_EQ(by["pp"].exposedNs, 30);
    EXPECT_EQ(by["pp"].kind, "send");
}

TEST(Kernels, TopByTotalTimeWithOtherBucket) {
    TraceBuilder b;
    uint32_t comp = b.track(0, TrackKind::Compute);
    int64_t t = 0;
    // gemm: 3 x 100, softmax 1 x 250, norm 2 x 10, elementwise 1 x 5
    for (int i = 0; i < 3; ++i, t += 1000) b.put(comp, Category::Gemm, t, t + 100, "gemm");
    b.put(comp, Category::Softmax, t, t + 250, "softmax"), t += 1000;
    for (int i = 0; i < 2; ++i, t += 1000) b.put(comp, Category::Norm, t, t + 10, "norm");
    b.put(comp, Category::Elementwise, t, t + 5, "gelu");
    auto r = kernelBreakdown(b.done(), 0, 2);
    ASSERT_TRUE(r.isOk());
    ASSERT_EQ(r->topKernels.size(), 3u);
    EXPECT_EQ(r->topKernels[0].name, "gemm");
    EXPECT_DOUBLE_EQ(r->topKernels[0].totalNs, 300);
    EXPECT_EQ(r->topKernels[0].count, 3);
    EXPECT_EQ(r->topKernels[1].name, "softmax");
    EXPECT_EQ(r->topKernels[2].name, "other");
    EXPECT_DOUBLE_EQ(r->topKernels[2].totalNs, 25);
    EXPECT_DOUBLE_EQ(r->totalNs, 575);
    EXPECT_EQ(r->byCategory.size(), 4u);
}

TEST(Memory, PeakOfSumAndDownsamplingKeepsPeak) {
    TraceBuilder b;
    b.track(0, TrackKind::Compute);
    uint32_t params = b.writer->intern("memory.params"), act = b.writer->intern("memory.activations");
    b.writer->counter({0, params, 0, 100});
    b.writer->counter({0, act, 10, 50});
    b.writer->counter({0, act, 20, 500});  // total 600 at t=20: the peak
    b.writer->counter({0, act, 30, 0});
    b.writer->counter({0, params, 40, 120});
    b.writer->counter({1, act, 20, 9999});  // another rank: ignored
    auto m = memorySummary(b.done(), 0, 200);
    ASSERT_TRUE(m.isOk());
    EXPECT_DOUBLE_EQ(m->peakTotalBytes, 600);
    EXPECT_DOUBLE_EQ(m->peakBytesByCategory["activations"], 500);
    EXPECT_DOUBLE_EQ(m->peakBytesByCategory["params"], 120);
    ASSERT_EQ(m->series.size(), 5u);

    std::vector<MemoryPoint> pts;
    std::mt19937 rng(3);
    for (int i = 0; i < 10000; ++i) pts.push_back({i, double(rng() % 1000)});
    pts[7777].totalBytes = 5000;
    auto d = downsampleKeepPeaks(pts, 100);
    EXPECT_LE(d.size(), 100u);
    double mx = 0;
    for (auto& p : d) mx = std::max(mx, p.totalBytes);
    EXPECT_DOUBLE_EQ(mx, 5000);
}

TEST(CriticalPath, FollowsSendRecvAcrossRanks) {
    TraceBuilder b;
    uint32_t h0 = b.track(0, TrackKind::HostThread), c0 = b.track(0, TrackKind::Compute), p0 = b.track(0, TrackKind::P2P);
    uint32_t h1 = b.track(1, TrackKind::HostThread), c1 = b.track(1, TrackKind::Compute), p1 = b.track(1, TrackKind::P2P);
    b.putStep(h0, 0, 0, 300);
    b.putStep(h1, 0, 0, 300);
    b.put(c0, Category::Gemm, 0, 100, "fwd0");
    b.add(p0, Category::P2P, 100, 110, "send_forward", "pp").microbatch = 0;
    b.add(p1, Category::P2P, 0, 115, "recv_forward", "pp").microbatch = 0;
    b.put(c1, Category::Gemm, 115, 215, "fwd1");
    b.put(c1, Category::Gemm, 5, 20, "unrelated");  // short compute on rank 1 before the recv
    auto cp = criticalPath(b.done(), 0);
    ASSERT_TRUE(cp.isOk()) << cp.status().toString();
    // Chain fwd0 (100) -> send (+10) -> recv (+5 after the send ended) -> fwd1 (+100) = 215 = wall time.
    EXPECT_DOUBLE_EQ(cp->lengthNs, 215);
    ASSERT_EQ(cp->path.size(), 4u);
    EXPECT_EQ(cp->path[0].name, "fwd0");
    EXPECT_EQ(cp->path[1].name, "send_forward");
    EXPECT_EQ(cp->path[2].name, "recv_forward");
    EXPECT_EQ(cp->path[3].name, "fwd1");
    EXPECT_DOUBLE_EQ(cp->nsByCategory["gemm"], 200);
    EXPECT_DOUBLE_EQ(cp->nsByCategory["p2p"], 15);
}
