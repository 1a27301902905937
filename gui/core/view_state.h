// ViewState: the one zoom/selection object every view of the workbench follows (hotspot's
// filter-and-zoom). The timeline, the analysis panels and the details pane read it and write
// it; each setter emits only when the value really changed, so views that both listen and set
// do not loop.
#pragma once

#include <cstdint>
#include <optional>

#include <QObject>

namespace ts::gui {

// A selected slice, by where it lives in the loaded timeline data (run index in a stacked
// A/B view, row, index of the slice in that row). Invalid when row < 0.
struct SliceRef {
    int run = 0;
    int row = -1;
    int64_t index = -1;
    bool valid() const { return row >= 0 && index >= 0; }
    bool operator==(const SliceRef& o) const { return run == o.run && row == o.row && index == o.index; }
};

// Half-open [fromNs, toNs) in trace time (the run's own clock).
struct TimeRange {
    int64_t fromNs = 0, toNs = 0;
    bool operator==(const TimeRange& o) const { return fromNs == o.fromNs && toNs == o.toNs; }
};

class ViewState : public QObject {
    Q_OBJECT
public:
    explicit ViewState(QObject* parent = nullptr);

    int step() const { return m_step; }  // -1 = all steps
    std::optional<TimeRange> timeRange() const { return m_range; }
    SliceRef selectedSlice() const { return m_slice; }

public slots:
    void setStep(int step);
    void setTimeRange(int64_t fromNs, int64_t toNs);
    void clearTimeRange();
    void selectSlice(const ts::gui::SliceRef& ref);
    void clearSelection();

signals:
    void stepChanged(int step);
    // range is empty (std::nullopt) when the time selection was cleared.
    void timeRangeChanged(std::optional<ts::gui::TimeRange> range);
    void sliceSelected(const ts::gui::SliceRef& ref);

private:
    int m_step = -1;
    std::optional<TimeRange> m_range;
    SliceRef m_slice;
};

}  // namespace ts::gui

Q_DECLARE_METATYPE(ts::gui::SliceRef)
Q_DECLARE_METATYPE(std::optional<ts::gui::TimeRange>)
