// TimelineWidget offscreen (gui/app/timeline_widget.h): it paints the op rows, a click on a
// known op emits sliceSelected with that op, keys zoom/pan/fit, find highlights and jumps,
// the step selector zooms to the step, and two runs share one axis aligned at a step.
#include <gtest/gtest.h>

#include <QImage>
#include <QSignalSpy>
#include <QTest>

#include "gui/app/timeline_view.h"
#include "gui/app/timeline_widget.h"
#include "tests/gui/test_timeline_util.h"

using namespace ts;
using namespace ts::gui;
using namespace ts::gui::testing;

namespace {
std::shared_ptr<const TimelineData> tinyData(const std::string& name, TinyTrace* tt = nullptr) {
    const std::string path = tempRunPath(name);
    TinyTrace t = writeTinyPipeline(path);
    if (tt) *tt = t;
    auto r = loadTimelineData(path);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    return r.isOk() ? r.value() : nullptr;
}

// Pixels in the row's canvas part (right of the gutter) that differ from both row backgrounds.
int paintedPixels(const QImage& img, const QRect& row) {
    int n = 0;
    const QRgb bg1 = qRgb(0xff, 0xff, 0xff), bg2 = qRgb(0xf4, 0xf6, 0xf9);
    for (int y = row.top() + 2; y < row.bottom() - 1; ++y)
        for (int x = TimelineWidget::kGutterPx + 1; x < img.width(); ++x) {
            QRgb c = img.pixel(x, y) & 0xffffff;
            if (c != (bg1 & 0xffffff) && c != (bg2 & 0xffffff)) ++n;
        }
    return n;
}
}  // namespace

TEST(TimelineWidget, PaintsOpRowsAndClickSelectsTheOpUnderTheCursor) {
    ensureApp();
    TinyTrace tt;
    auto data = tinyData("widget.sqlite", &tt);
    ASSERT_TRUE(data);
    TimelineWidget w;
    w.resize(1200, 600);
    w.setData(data);
    const QImage img = w.grab().toImage();
    ASSERT_FALSE(img.isNull());
    const int compute = 3, comm = 4;
    for (int row : {0, 1, 2, compute, comm}) {
        QRect r = w.rowRect(0, row);
        ASSERT_TRUE(r.isValid()) << row;
        EXPECT_GT(paintedPixels(img, r), 50) << data->rows[size_t(row)].label.toStdString();
    }
    // An empty stretch between the two steps paints nothing on the comm row.
    {
        QRect r = w.rowRect(0, comm);
        double xGap = w.xForTime(0, tt.t0 + 1'050'000);
        QImage strip = img.copy(QRect(int(xGap) - 1, r.top(), 3, r.height()));
        int n = 0;
        for (int y = 2; y < strip.height() - 2; ++y)
            for (int x = 0; x < strip.width(); ++x)
                if ((strip.pixel(x, y) & 0xffffff) != 0xffffff && (strip.pixel(x, y) & 0xffffff) != 0xf4f6f9) ++n;
        EXPECT_EQ(n, 0);
    }

    // Zoom to step 0's first microbatch so the gemms are wide, then click the 2nd gemm.
    w.setVisibleRange(0, 400'000);
    const TimelineRow& row = data->rows[compute];
    const size_t target = 1;
    const int64_t mid = (row.start[target] + row.end[target]) / 2;
    const QPoint at(int(w.xForTime(0, mid)), w.rowRect(0, compute).center().y());
    QSignalSpy spy(&w, &TimelineWidget::sliceSelected);
    QTest::mouseClick(&w, Qt::LeftButton, Qt::NoModifier, at);
    ASSERT_EQ(spy.count(), 1);
    auto d = spy.at(0).at(0).value<SliceDetails>();
    ASSERT_TRUE(d.valid);
    EXPECT_EQ(d.name, "gemm_fwd");
    EXPECT_EQ(d.startNs, row.start[target]);
    EXPECT_EQ(d.rank, 0);
    EXPECT_EQ(d.layer, 1);
    EXPECT_EQ(w.selectedSlice().index, int64_t(target));
    // Clicking empty space clears the selection (an invalid details value).
    QTest::mouseClick(&w, Qt::LeftButton, Qt::NoModifier, QPoint(at.x(), w.rowRect(0, comm).center().y()));
    ASSERT_EQ(spy.count(), 2);
    EXPECT_FALSE(spy.at(1).at(0).value<SliceDetails>().valid);
}

TEST(TimelineWidget, KeysZoomPanAndFit) {
    ensureApp();
    auto data = tinyData("keys.sqlite");
    ASSERT_TRUE(data);
    TimelineWidget w;
    w.resize(1000, 500);
    w.setData(data);
    const int64_t fullSpan = w.axis().spanNs();
    QTest::keyClick(&w, Qt::Key_W);
    EXPECT_LT(w.axis().spanNs(), fullSpan);
    // Pan in the middle of the run, away from the edges where panning stops.
    w.setVisibleRange(fullSpan / 3, fullSpan / 3 + fullSpan / 10);
    const int64_t start = w.axis().startNs, span = w.axis().spanNs();
    QTest::keyClick(&w, Qt::Key_D);
    EXPECT_GT(w.axis().startNs, start);
    EXPECT_EQ(w.axis().spanNs(), span);
    QTest::keyClick(&w, Qt::Key_A);
    EXPECT_NEAR(double(w.axis().startNs), double(start), 2.0);
    QTest::keyClick(&w, Qt::Key_S);
    EXPECT_GT(w.axis().spanNs(), span);
    // F with step 1 selected fits step 1, without a step fits everything.
    ViewState vs;
    w.setViewState(&vs);
    vs.setStep(1);
    const StepSpan* s1 = data->stepSpan(1);
    ASSERT_TRUE(s1);
    EXPECT_LE(w.axis().startNs, s1->startNs - data->minNs);
    EXPECT_GE(w.axis().endNs, s1->endNs - data->minNs);
    EXPECT_LT(w.axis().spanNs(), fullSpan * 2 / 3);
    QTest::keyClick(&w, Qt::Key_W);
    QTest::keyClick(&w, Qt::Key_F);
    EXPECT_LE(w.axis().startNs, s1->startNs - data->minNs);
    EXPECT_LT(w.axis().spanNs(), fullSpan * 2 / 3);
    vs.setStep(-1);
    EXPECT_EQ(w.axis().spanNs(), fullSpan);
    // Wheel up zooms in.
    QWheelEvent wheel(QPointF(600, 100), w.mapToGlobal(QPointF(600, 100)), QPoint(), QPoint(0, 120), Qt::NoButton,
                      Qt::NoModifier, Qt::NoScrollPhase, false);
    QApplication::sendEvent(&w, &wheel);
    EXPECT_LT(w.axis().spanNs(), fullSpan);
}

TEST(TimelineWidget, FindHighlightsAndJumpsToMatches) {
    ensureApp();
    TinyTrace tt;
    auto data = tinyData("findw.sqlite", &tt);
    ASSERT_TRUE(data);
    TimelineWidget w;
    w.resize(1000, 500);
    w.setData(data);
    QSignalSpy results(&w, &TimelineWidget::findResultsChanged);
    QSignalSpy selected(&w, &TimelineWidget::sliceSelected);
    EXPECT_EQ(w.find("all_reduce"), tt.allReduces);  // both ranks
    ASSERT_GE(results.count(), 1);
    EXPECT_EQ(results.last().at(0).toInt(), tt.allReduces);
    ASSERT_GE(selected.count(), 1);
    auto first = selected.last().at(0).value<SliceDetails>();
    EXPECT_EQ(first.name, "all_reduce");
    // The match is in view and wide.
    double x0 = w.xForTime(0, first.startNs), x1 = w.xForTime(0, first.startNs + first.durNs);
    EXPECT_GE(x0, TimelineWidget::kGutterPx);
    EXPECT_LE(x1, w.width());
    EXPECT_GE(x1 - x0, 20);
    w.findNext();
    auto second = selected.last().at(0).value<SliceDetails>();
    EXPECT_EQ(second.name, "all_reduce");
    EXPECT_GE(second.startNs, first.startNs);
    EXPECT_NE(w.currentMatch(), 0);
    EXPECT_EQ(w.find("zzz_nothing"), 0);
}

TEST(TimelineWidget, TwoRunsShareOneAxisAlignedAtAStep) {
    ensureApp();
    auto a = tinyData("ab_a.sqlite");
    // B: the same trace written 3 s later on the clock.
    const std::string pb = tempRunPath("ab_b.sqlite");
    {
        auto store = profiler::TraceStore::create(pb).value();
        profiler::TraceWriter w(*store);
        uint32_t host = w.track({0, 0, trace::TrackKind::HostThread, 0, "rank 0 host"});
        uint32_t comp = w.track({0, 0, trace::TrackKind::Compute, 0, "rank 0 compute"});
        trace::Slice st;
        st.track = host, st.category = trace::Category::Range, st.name = w.intern("step 1"), st.step = 1;
        st.startNs = 8'000'000'000, st.durNs = 500'000;
        w.slice(st);
        trace::Slice g;
        g.track = comp, g.category = trace::Category::Gemm, g.name = w.intern("gemm_b");
        g.startNs = 8'000'100'000, g.durNs = 100'000;
        w.slice(g);
        ASSERT_TRUE(w.finish().isOk());
    }
    auto b = loadTimelineData(pb).value();
    ASSERT_TRUE(a && b);
    TimelineWidget w;
    w.resize(1000, 800);
    w.setRuns({{a, "A", 0}, {b, "B", 0}});
    w.alignRunsAtStep(1);
    // Step 1 starts at the same x in both runs.
    EXPECT_NEAR(w.xForTime(0, a->stepSpan(1)->startNs), w.xForTime(1, b->stepSpan(1)->startNs), 0.5);
    // Both runs' rows are laid out, A's above B's, and B's gemm is painted.
    QRect ra = w.rowRect(0, 0), rb = w.rowRect(1, 1);
    ASSERT_TRUE(ra.isValid() && rb.isValid());
    EXPECT_LT(ra.top(), rb.top());
    QImage img = w.grab().toImage();
    EXPECT_GT(paintedPixels(img, rb), 20);
    // A click on B's gemm reports run B.
    QSignalSpy spy(&w, &TimelineWidget::sliceSelected);
    QTest::mouseClick(&w, Qt::LeftButton, Qt::NoModifier,
                      QPoint(int(w.xForTime(1, 8'000'150'000)), rb.center().y()));
    ASSERT_EQ(spy.count(), 1);
    auto d = spy.at(0).at(0).value<SliceDetails>();
    EXPECT_EQ(d.name, "gemm_b");
    EXPECT_EQ(d.runLabel, "B");
}

TEST(TimelineView, StepSelectorAndLoaderDriveTheWidget) {
    ensureApp();
    const std::string path = tempRunPath("view.sqlite");
    writeTinyPipeline(path);
    TimelineView view;
    view.resize(1200, 600);
    QSignalSpy loaded(&view, &TimelineView::dataLoaded);
    view.openRunFile(QString::fromStdString(path));
    for (int i = 0; i < 200; ++i) {
        if (!view.timeline()->runs().empty() && !view.timeline()->runs()[0].data->overview) break;
        loaded.wait(100);
    }
    ASSERT_EQ(view.timeline()->runs().size(), 1u);
    auto data = view.timeline()->runs()[0].data;
    ASSERT_FALSE(data->overview);
    const int64_t full = view.timeline()->axis().spanNs();
    view.viewState()->setStep(0);
    EXPECT_LT(view.timeline()->axis().spanNs(), full * 2 / 3);
    EXPECT_LE(view.timeline()->axis().startNs, data->stepSpan(0)->startNs - data->minNs);
}
