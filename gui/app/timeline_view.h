// TimelineView: the timeline pane of the workbench: a toolbar (step selector, fit, find box
// with match count, load/follow status), the TimelineWidget and its vertical scroll bar.
// It owns a TimelineLoader, so opening or following a run file never blocks the UI thread.
#pragma once

#include <memory>
#include <vector>

#include <QWidget>

#include "gui/app/timeline_widget.h"
#include "gui/core/timeline_loader.h"
#include "gui/core/view_state.h"

class QComboBox;
class QLabel;
class QLineEdit;
class QScrollBar;
class QToolButton;

namespace ts::gui {

class TimelineView : public QWidget {
    Q_OBJECT
public:
    explicit TimelineView(QWidget* parent = nullptr);

    TimelineWidget* timeline() const { return m_timeline; }
    TimelineLoader* loader() const { return m_loader; }
    // The shared zoom/selection; the view makes its own until one is set.
    void setViewState(ViewState* state);
    ViewState* viewState() const { return m_state; }

    // Loads a run file on a worker thread and shows it.
    void openRunFile(const QString& path);
    // Shows the run file and reloads it every intervalMs while its status is "running".
    void followRunFile(const QString& path, int intervalMs = 1000);
    void stopFollowing();
    // Already loaded data (one run), or several runs on one axis (A/B; see TimelineWidget).
    void setData(std::shared_ptr<const TimelineData> data);
    void setRuns(std::vector<TimelineRun> runs);

    // Opens the find box (Ctrl+F) with the focus in it.
    void showFind();

signals:
    void sliceSelected(const ts::gui::SliceDetails& details);
    void dataLoaded(std::shared_ptr<const ts::gui::TimelineData> data);
    void loadFailed(const QString& message);

private:
    void refreshSteps();
    void updateStatus();
    void onStepChosen(int comboIndex);

    ViewState* m_state = nullptr;
    TimelineWidget* m_timeline = nullptr;
    TimelineLoader* m_loader = nullptr;
    QComboBox* m_steps = nullptr;
    QLineEdit* m_find = nullptr;
    QLabel* m_findCount = nullptr;
    QLabel* m_status = nullptr;
    QScrollBar* m_vscroll = nullptr;
    QString m_lastFind;
    QString m_loadMessage;
};

}  // namespace ts::gui
