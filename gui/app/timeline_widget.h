// TimelineWidget: the custom-painted all-ranks timeline (never a chart). A left gutter with
// row labels, a time ruler, per rank the ranges above the ops, pipeline bubbles shaded on the
// compute streams, memory counters as small area rows. Several runs can share one time axis
// (the A/B view): each run is shifted by its own offset so chosen steps line up.
//
// Painting follows Tracy: per visible row, binary-search the visible slices and fold what is
// narrower than a few pixels (timeline_lod.h); counters are drawn as per-pixel min/max. Only
// rows inside the viewport are visited. All data is immutable and already in memory: nothing
// here touches a file.
//
// Keys (Perfetto's): W/S zoom in/out at the cursor, A/D pan, F fits the selected step (or
// everything), Ctrl+F asks the owner to open its find box (findRequested). Wheel zooms at the
// cursor (Shift+wheel scrolls rows), drag pans, click selects.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <QPointer>
#include <QStaticText>
#include <QWidget>

#include <unordered_map>

#include "gui/core/timeline_axis.h"
#include "gui/core/timeline_data.h"
#include "gui/core/view_state.h"

namespace ts::gui {

struct TimelineRun {
    std::shared_ptr<const TimelineData> data;
    QString label;             // "A", "B", or the run name
    int64_t alignOffsetNs = 0; // trace time - alignOffsetNs = axis time
};

class TimelineWidget : public QWidget {
    Q_OBJECT
public:
    static constexpr int kGutterPx = 190;
    static constexpr int kRulerPx = 24;

    explicit TimelineWidget(QWidget* parent = nullptr);

    // One run; its first event is axis time 0. Keeps the current zoom when the same file is
    // set again (follow mode), otherwise fits everything.
    void setData(std::shared_ptr<const TimelineData> data);
    // Several runs stacked on one axis (A/B). Fits everything.
    void setRuns(std::vector<TimelineRun> runs);
    const std::vector<TimelineRun>& runs() const { return m_runs; }
    // Offsets so that `step` starts at axis time 0 in every run that has it.
    void alignRunsAtStep(int step);

    void setViewState(ViewState* state);
    ViewState* viewState() const { return m_viewState; }

    const TimeAxis& axis() const { return m_axis; }
    // Visible time range in axis time.
    void setVisibleRange(int64_t fromAxisNs, int64_t toAxisNs);
    void fitAll();
    void fitStep(int step);
    void fitSelection();  // F: the selected step, else everything
    void zoomAtX(double xInCanvas, double factor);
    void panPixels(double dx);

    // Find by name (case-insensitive substring) over every run; jumps to the first match.
    int find(const QString& text);
    void findNext();
    void findPrevious();
    int matchCount() const { return int(m_matches.size()); }
    int currentMatch() const { return m_currentMatch; }

    // Geometry (tests, the tour): the widget rectangle of a row, the x of a trace time.
    QRect rowRect(int run, int row) const;
    double xForTime(int run, int64_t traceNs) const;
    // The slice under a widget position, if any.
    std::optional<SliceRef> sliceAt(QPoint pos) const;
    SliceDetails detailsOf(const SliceRef& ref) const;
    SliceRef selectedSlice() const { return m_selected; }

    int contentHeight() const { return m_contentHeight; }
    int verticalOffset() const { return m_scrollY; }
    void setVerticalOffset(int y);

    QSize sizeHint() const override { return {1200, 700}; }

signals:
    void sliceSelected(const ts::gui::SliceDetails& details);
    void visibleRangeChanged(int64_t fromAxisNs, int64_t toAxisNs);
    void contentHeightChanged(int height);
    void verticalOffsetChanged(int y);
    void findResultsChanged(int count, int current);
    void findRequested();

protected:
    void paintEvent(QPaintEvent* e) override;
    void resizeEvent(QResizeEvent* e) override;
    void wheelEvent(QWheelEvent* e) override;
    void mousePressEvent(QMouseEvent* e) override;
    void mouseMoveEvent(QMouseEvent* e) override;
    void mouseReleaseEvent(QMouseEvent* e) override;
    void keyPressEvent(QKeyEvent* e) override;
    bool event(QEvent* e) override;

private:
    struct Line {
        int run = 0;
        int row = -1;  // -1: the run's header band
        int y = 0, h = 0;
    };
    void syncWidth();
    void rebuildLayout();
    void updateLimits();
    void axisChanged();
    int canvasWidth() const;
    const Line* lineAt(int y) const;
    void selectRef(const SliceRef& ref);
    void showMatch();
    void paintRuler(QPainter& p, const QRect& r);
    void paintRow(QPainter& p, const Line& line, const QRect& r);
    void paintCounter(QPainter& p, const TimelineRun& run, const TimelineRow& row, const QRect& r, const QColor& background);
    bool isMatch(int run, int row, size_t first, size_t count) const;

    std::vector<TimelineRun> m_runs;
    std::vector<Line> m_lines;
    int m_contentHeight = 0;
    int m_scrollY = 0;
    TimeAxis m_axis;
    QPointer<ViewState> m_viewState;
    SliceRef m_selected;
    // Find: matches (run, row, index) by time; per (run,row) sorted indices for highlighting.
    struct Match {
        int run, row;
        size_t index;
        int64_t axisNs;
    };
    std::vector<Match> m_matches;
    std::vector<std::vector<std::vector<size_t>>> m_matchIndex;  // [run][row] -> sorted indices
    int m_currentMatch = -1;
    // Drag state
    bool m_dragging = false, m_dragMoved = false;
    QPoint m_dragLast, m_pressPos;
    mutable std::vector<LodBox> m_boxes;  // scratch, reused every row
    // Per run, filled lazily while painting (no string work per box per frame): colour of
    // (category, group), colour of a range by name id, pixel width of a name id's text.
    // Text is laid out once (QStaticText) and then only blitted: shaping a string costs more
    // than filling a row of boxes, so nothing is shaped per frame that was shaped before.
    struct PaintCache {
        std::vector<QRgb> sliceColor;  // [category * groups + group]
        std::vector<QRgb> rangeColor;  // by name id; 0 = not computed yet
        std::vector<int> textWidth;    // by name id; -1 = not measured yet
        std::unordered_map<uint32_t, QStaticText> nameText;  // by name id, unelided
        std::vector<QStaticText> rowLabel;                    // by row: the elided gutter label
        std::vector<QStaticText> rowPeak;                     // by row: counter rows' "peak ..." line
    };
    std::vector<PaintCache> m_cache;
    // Texts that vary per box ("1234 ops", "step 7", elided names), keyed by the string; cleared
    // when it grows past a few thousand entries.
    std::unordered_map<QString, QStaticText> m_textCache;
    const QStaticText& staticText(const QString& s);
    void resetCache();
};

}  // namespace ts::gui
