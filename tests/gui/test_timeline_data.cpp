// TimelineData from a real run file (gui/core/timeline_data.h): rows per rank x stream in
// display order with the ranges above the ops, launches left out, bubbles equal to the
// analysis' pipelineBubble, details of a slice, find by name, and the background loader
// (delivery, stale results dropped by generation, follow mode).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <QElapsedTimer>
#include <QSignalSpy>
#include <QTest>

#include "gui/core/timeline_data.h"
#include "gui/core/timeline_loader.h"
#include "gui/core/view_state.h"
#include "profiler/analysis.h"
#include "tests/gui/test_timeline_util.h"

using namespace ts;
using namespace ts::gui;
using namespace ts::gui::testing;

namespace {
// Waits until the loader delivered the full data (an overview comes first on a first load).
std::shared_ptr<const TimelineData> waitForDetail(QSignalSpy& spy, int timeoutMs = 20000) {
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < timeoutMs) {
        if (spy.count() > 0) {
            auto d = spy.last().at(0).value<std::shared_ptr<const TimelineData>>();
            if (d && !d->overview) return d;
        }
        spy.wait(100);
    }
    return nullptr;
}

std::shared_ptr<const TimelineData> loadOrDie(const std::string& path) {
    auto r = loadTimelineData(path);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    return r.isOk() ? r.value() : nullptr;
}
}  // namespace

TEST(TimelineData, RowsPerRankRangesAboveStreamsInOrder) {
    const std::string path = tempRunPath("rows.sqlite");
    TinyTrace tt = writeTinyPipeline(path);
    auto data = loadOrDie(path);
    ASSERT_TRUE(data);
    std::vector<QString> labels;
    for (auto& r : data->rows) labels.push_back(r.label);
    const std::vector<QString> expected = {
        "rank 0 · step", "rank 0 · microbatch", "rank 0 · forward/backward", "rank 0 · compute",
        "rank 0 · comm dp", "rank 0 · p2p pp", "rank 0 · memory",
        "rank 1 · step", "rank 1 · microbatch", "rank 1 · forward/backward", "rank 1 · compute",
        "rank 1 · comm dp", "rank 1 · p2p pp", "rank 1 · memory"};
    EXPECT_EQ(labels, expected);
    EXPECT_EQ(data->ranks, (std::vector<int>{0, 1}));
    EXPECT_EQ(data->rows[0].kind, RowKind::Range);
    EXPECT_EQ(data->rows[2].depth, 2);
    EXPECT_EQ(data->rows[3].trackKind, trace::TrackKind::Compute);
    EXPECT_EQ(data->rows[6].kind, RowKind::Counter);
    // Every slice but the launches, each row sorted by start.
    auto store = profiler::TraceStore::open(path).value();
    int64_t all = store->sliceCount().value();
    EXPECT_EQ(data->sliceCount, all - tt.launches);
    EXPECT_EQ(int64_t(data->rows[3].size()), tt.gemmsPerRank);
    for (auto& r : data->rows) EXPECT_TRUE(std::is_sorted(r.start.begin(), r.start.end())) << r.label.toStdString();
    EXPECT_EQ(data->steps.size(), 2u);
    EXPECT_EQ(data->steps[0].startNs, tt.t0);
    EXPECT_EQ(data->minNs, tt.t0);
    EXPECT_EQ(data->pp, 2);
    EXPECT_EQ(data->status, "completed");
    // Memory: sum of the rank's memory.* levels; the last level is params 3*64M + activations 4*64M.
    const CounterSeries& mem = data->rows[6].counter;
    ASSERT_FALSE(mem.ts.empty());
    EXPECT_DOUBLE_EQ(mem.value.back(), double(7 * (64 << 20)));
    EXPECT_DOUBLE_EQ(mem.maxValue, double(7 * (64 << 20)));
}

TEST(TimelineData, BubblesEqualTheAnalysisDefinition) {
    const std::string path = tempRunPath("bubbles.sqlite");
    writeTinyPipeline(path);
    auto data = loadOrDie(path);
    ASSERT_TRUE(data);
    auto store = profiler::TraceStore::open(path).value();
    auto windows = profiler::stepWindows(*store);
    ASSERT_TRUE(windows.isOk());
    ASSERT_EQ(windows.value().size(), 4u);  // 2 steps x 2 ranks
    for (const auto& w : windows.value()) {
        auto expected = profiler::pipelineBubble(*store, w);
        ASSERT_TRUE(expected.isOk());
        auto gaps = data->bubbleIntervals(data->rankIndex(w.rank), w.step);
        int64_t total = 0, prevEnd = INT64_MIN;
        for (auto& g : gaps) {
            EXPECT_EQ(g.step, w.step);
            EXPECT_GE(g.fromNs, w.startNs);
            EXPECT_LE(g.toNs, w.endNs);
            EXPECT_LT(g.fromNs, g.toNs);
            EXPECT_GE(g.fromNs, prevEnd);  // disjoint, by start
            prevEnd = g.toNs;
            total += g.toNs - g.fromNs;
        }
        EXPECT_DOUBLE_EQ(double(total), expected.value().bubbleNs) << "rank " << w.rank << " step " << w.step;
        EXPECT_GT(total, 0);
    }
    // Rank 1 starts its kernels 60 µs later: its first gap of each step is 60 µs longer.
    auto first = [&](int rank, int step) {
        auto g = data->bubbleIntervals(data->rankIndex(rank), step);
        return g.empty() ? int64_t(0) : g.front().toNs - g.front().fromNs;
    };
    EXPECT_EQ(first(0, 0), 15'000);
    EXPECT_EQ(first(1, 0), 75'000);
    EXPECT_EQ(first(1, 1) - first(0, 1), 60'000);
}

TEST(TimelineData, DetailsOfASliceCarryEveryField) {
    const std::string path = tempRunPath("details.sqlite");
    TinyTrace tt = writeTinyPipeline(path);
    auto data = loadOrDie(path);
    ASSERT_TRUE(data);
    const int compute = 3;
    SliceDetails d = data->details(compute, 1);
    ASSERT_TRUE(d.valid);
    EXPECT_EQ(d.name, "gemm_fwd");
    EXPECT_EQ(d.rank, 0);
    EXPECT_EQ(d.streamKind, "compute");
    EXPECT_EQ(d.category, "gemm");
    EXPECT_EQ(d.durNs, tt.gemmNs);
    EXPECT_EQ(d.step, 0);
    EXPECT_EQ(d.microbatch, 0);
    EXPECT_EQ(d.layer, 1);
    EXPECT_GT(d.correlation, 0u);
    EXPECT_DOUBLE_EQ(d.flops, 2.0 * 1024 * 1024 * 1024);
    EXPECT_DOUBLE_EQ(d.flopRate, d.flops / (double(tt.gemmNs) * 1e-9));
    EXPECT_EQ(d.startRelNs, d.startNs - data->minNs);
    SliceDetails ar = data->details(4, 0);
    EXPECT_EQ(ar.name, "all_reduce");
    EXPECT_EQ(ar.group, "dp");
    EXPECT_EQ(ar.bytes, 64ull << 20);
    const QString html = sliceDetailsHtml(ar);
    EXPECT_TRUE(html.contains("all_reduce"));
    EXPECT_TRUE(html.contains("64.0 MiB"));
    EXPECT_TRUE(html.contains("dp"));
    EXPECT_FALSE(data->details(99, 0).valid);
    EXPECT_FALSE(data->details(compute, 1'000'000).valid);
}

TEST(TimelineData, FindByNameIsCaseInsensitiveAndOrderedByTime) {
    const std::string path = tempRunPath("find.sqlite");
    TinyTrace tt = writeTinyPipeline(path);
    auto data = loadOrDie(path);
    ASSERT_TRUE(data);
    auto m = data->findByName("ALL_red");
    ASSERT_EQ(int(m.size()), tt.allReduces);
    for (size_t i = 0; i < m.size(); ++i) {
        EXPECT_EQ(data->sliceName(data->rows[size_t(m[i].row)], m[i].index), "all_reduce");
        if (i) {
            EXPECT_LE(m[i - 1].startNs, m[i].startNs);
        }
    }
    EXPECT_EQ(int(data->findByName("gemm").size()), 2 * tt.gemmsPerRank);
    EXPECT_EQ(data->findByName("gemm", 5).size(), 5u);
    EXPECT_TRUE(data->findByName("no such kernel").empty());
    EXPECT_TRUE(data->findByName("cudaLaunch").empty());  // launches are not in the rows
}

TEST(TimelineData, MissingFileFailsWithAMessage) {
    auto r = loadTimelineData("/nonexistent/dir/run.sqlite");
    EXPECT_FALSE(r.isOk());
}

TEST(TimelineLoader, DeliversOnTheUiThreadAndDropsStaleResults) {
    ensureApp();
    const std::string a = tempRunPath("loader_a.sqlite"), b = tempRunPath("loader_b.sqlite");
    writeTinyPipeline(a);
    writeTinyPipeline(b);
    TimelineLoader loader;
    QSignalSpy spy(&loader, &TimelineLoader::loaded);
    loader.load(QString::fromStdString(a));
    loader.load(QString::fromStdString(b));  // supersedes a: a's results must be dropped
    auto data = waitForDetail(spy);
    ASSERT_TRUE(data);
    QTest::qWait(200);  // let a stale delivery (if any) arrive too
    // b's overview (stream rows from the chunk index, counting every op) then b's detail.
    ASSERT_EQ(spy.count(), 2);
    auto overview = spy.at(0).at(0).value<std::shared_ptr<const TimelineData>>();
    EXPECT_TRUE(overview->overview);
    EXPECT_EQ(overview->path, b);
    EXPECT_EQ(data->path, b);
    EXPECT_FALSE(data->overview);
    EXPECT_FALSE(loader.isBusy());
    // The overview holds the stream rows with every device op of the file (not the ranges).
    int64_t streamOps = 0;
    for (auto& r : data->rows)
        if (r.kind == RowKind::Stream) streamOps += int64_t(r.size());
    int64_t overviewOps = 0;
    for (auto& r : overview->rows) {
        EXPECT_EQ(r.kind, RowKind::Stream);
        overviewOps += int64_t(r.opsPrefix.empty() ? 0 : r.opsPrefix.back());
    }
    EXPECT_EQ(overviewOps, streamOps);
    EXPECT_EQ(overview->rows.size(), 6u);  // 2 ranks x (compute, comm, p2p)
    EXPECT_FALSE(overview->details(0, 0).valid);
    QSignalSpy failed(&loader, &TimelineLoader::loadFailed);
    loader.load("/nonexistent/run.sqlite");
    ASSERT_TRUE(failed.wait(20000));
}

TEST(TimelineLoader, FollowReloadsWhileRunningAndStopsWhenTheRunEnds) {
    ensureApp();
    const std::string path = tempRunPath("follow.sqlite");
    writeTinyPipeline(path, "running");
    TimelineLoader loader;
    QSignalSpy spy(&loader, &TimelineLoader::loaded);
    loader.follow(QString::fromStdString(path), 100);
    auto firstFull = waitForDetail(spy);
    ASSERT_TRUE(firstFull);
    EXPECT_TRUE(loader.isFollowing());
    const int64_t before = firstFull->sliceCount;
    {
        // The run writes more and finishes.
        auto store = profiler::TraceStore::open(path, false).value();
        profiler::TraceWriter w(*store);
        uint32_t comp = w.track({0, 0, trace::TrackKind::Compute, 0, "rank 0 compute"});
        trace::Slice s;
        s.track = comp;
        s.category = trace::Category::Gemm;
        s.name = w.intern("late_gemm");
        s.startNs = 9'000'000'000;
        s.durNs = 1000;
        w.slice(s);
        ASSERT_TRUE(w.finish().isOk());
        ASSERT_TRUE(store->setRunStatus("completed", "").isOk());
    }
    for (int i = 0; i < 100 && loader.isFollowing(); ++i) spy.wait(200);
    EXPECT_FALSE(loader.isFollowing());
    auto last = spy.last().at(0).value<std::shared_ptr<const TimelineData>>();
    EXPECT_EQ(last->sliceCount, before + 1);
    EXPECT_EQ(last->status, "completed");
    EXPECT_EQ(last->findByName("late_gemm").size(), 1u);
}

// An imported trace's gpu_user_annotation ranges sit on the GPU stream's track: they get their
// own range row, and neither cover the stream's gaps (bubbles) nor make step windows.
TEST(TimelineData, GpuAnnotationsAreTheirOwnRowAndNotBusyTime) {
    const std::string path = tempRunPath("gpu_annotations.sqlite");
    {
        auto store = profiler::TraceStore::create(path).value();
        profiler::TraceWriter w(*store);
        const uint32_t host = w.track({0, 0, trace::TrackKind::HostThread, 0, "host"});
        const uint32_t gpu = w.track({0, 0, trace::TrackKind::Compute, 7, "gpu 0 stream 7"});
        auto add = [&](uint32_t track, trace::Category c, const char* name, int64_t s, int64_t d, int step = -1) {
            trace::Slice x;
            x.track = track, x.category = c, x.name = w.intern(name), x.startNs = s, x.durNs = d, x.step = step;
            w.slice(x);
        };
        add(host, trace::Category::Range, "step 1", 1000, 1000, 1);
        add(gpu, trace::Category::Range, "ProfilerStep#1", 1100, 1200, 1);  // the GPU copy, to 2300
        add(gpu, trace::Category::Gemm, "gemm_a", 1000, 200);
        add(gpu, trace::Category::Gemm, "gemm_b", 1700, 300);                // gap 1200..1700
        ASSERT_TRUE(w.finish().isOk());
    }
    auto data = loadTimelineData(path);
    ASSERT_TRUE(data.isOk()) << data.status().toString();
    const TimelineData& d = *data.value();
    int annRow = -1, streamRow = -1;
    for (size_t i = 0; i < d.rows.size(); ++i) {
        if (d.rows[i].kind == RowKind::Range && d.rows[i].trackKind == trace::TrackKind::Compute) annRow = int(i);
        if (d.rows[i].kind == RowKind::Stream) streamRow = int(i);
    }
    ASSERT_GE(annRow, 0);
    ASSERT_GE(streamRow, 0);
    EXPECT_LT(annRow, streamRow);  // drawn above its stream
    EXPECT_EQ(d.rows[size_t(annRow)].size(), 1u);
    EXPECT_EQ(d.rows[size_t(streamRow)].size(), 2u);
    EXPECT_NE(d.rows[size_t(annRow)].label.indexOf("annotations"), -1);
    // The step window is the host's [1000, 2000]; the gap 1200..1700 is a bubble.
    ASSERT_NE(d.stepSpan(1), nullptr);
    EXPECT_EQ(d.stepSpan(1)->endNs, 2000);
    auto gaps = d.bubbleIntervals(0, 1);
    ASSERT_EQ(gaps.size(), 1u);
    EXPECT_EQ(gaps[0].fromNs, 1200);
    EXPECT_EQ(gaps[0].toNs, 1700);
}

// A run creates its file before writing anything: following it then is waiting, not failing,
// and the first batch is picked up by the next poll. A one-shot load of the same empty file
// is an error.
TEST(TimelineLoader, FollowWaitsForAFileTheRunHasNotWrittenYet) {
    ensureApp();
    const std::string path = tempRunPath("follow_empty.sqlite");
    std::filesystem::remove(path);
    { std::ofstream(path).flush(); }  // 0 bytes, as a run leaves it at creation
    TimelineLoader loader;
    QSignalSpy loaded(&loader, &TimelineLoader::loaded), failed(&loader, &TimelineLoader::loadFailed),
        waiting(&loader, &TimelineLoader::waiting);
    loader.follow(QString::fromStdString(path), 100);
    for (int i = 0; i < 100 && waiting.count() < 2; ++i) waiting.wait(100);
    EXPECT_GE(waiting.count(), 2);  // polled again after the first try
    EXPECT_EQ(failed.count(), 0);
    EXPECT_TRUE(loader.isFollowing());
    std::filesystem::remove(path);
    writeTinyPipeline(path, "running");
    auto data = waitForDetail(loaded);
    ASSERT_TRUE(data);
    EXPECT_GT(data->sliceCount, 0);
    EXPECT_EQ(failed.count(), 0);
    loader.stop();

    std::filesystem::remove(path);
    { std::ofstream(path).flush(); }
    loader.load(QString::fromStdString(path));
    ASSERT_TRUE(failed.wait(20000));
    EXPECT_NE(failed.last().at(0).toString().indexOf("empty"), -1);
}

TEST(ViewState, EmitsOnlyOnChange) {
    ViewState vs;
    QSignalSpy steps(&vs, &ViewState::stepChanged), ranges(&vs, &ViewState::timeRangeChanged),
        slices(&vs, &ViewState::sliceSelected);
    vs.setStep(3);
    vs.setStep(3);
    EXPECT_EQ(steps.count(), 1);
    EXPECT_EQ(vs.step(), 3);
    vs.setStep(-5);
    EXPECT_EQ(vs.step(), -1);
    vs.setTimeRange(200, 100);
    ASSERT_TRUE(vs.timeRange());
    EXPECT_EQ(vs.timeRange()->fromNs, 100);
    vs.setTimeRange(100, 200);
    vs.clearTimeRange();
    vs.clearTimeRange();
    EXPECT_EQ(ranges.count(), 2);
    vs.selectSlice({0, 2, 7});
    vs.selectSlice({0, 2, 7});
    vs.clearSelection();
    EXPECT_EQ(slices.count(), 2);
    EXPECT_FALSE(vs.selectedSlice().valid());
}
