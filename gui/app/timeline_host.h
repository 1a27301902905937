// Where the main window and the A/B view put a timeline: one run, or two runs stacked on one
// shared time axis aligned at the step start, following a run while it writes. The timeline
// itself (TimelineView, gui/app/timeline_*) does the drawing; this host loads run files and
// forwards the selection as HTML for the details pane.
#pragma once

#include <QLabel>
#include <QWidget>

namespace ts::gui {

class TimelineHost : public QWidget {
    Q_OBJECT
public:
    explicit TimelineHost(QWidget* parent = nullptr);
    ~TimelineHost() override;
    void setRunFile(const QString& path, const QString& label, bool follow = false);
    void setRunFiles(const QString& pathA, const QString& labelA, const QString& pathB, const QString& labelB);
    void setStep(int step);
    // Rows the timeline holds once loaded (rank × stream rows and range rows); 0 before.
    int rowCount() const;
    bool isLoaded() const;

signals:
    void loaded();
    void sliceSelectedHtml(const QString& html);
    void stepSelected(int step);

private:
    QLabel* m_placeholder;
    struct Impl;
    Impl* m = nullptr;
};

}  // namespace ts::gui
