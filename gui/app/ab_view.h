// The A/B view (issue #13, item 7): the knobs that changed on top, then only the metrics that
// differ with their deltas marked better or worse, then both timelines stacked on one shared
// time axis aligned at the step start, and a chart of where time moved (per kernel category
// and per communication group, A vs B).
#pragma once

#include <QLabel>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QWidget>

#include <nlohmann/json.hpp>

#include "gui/core/analysis_summary.h"
#include "gui/core/jobs.h"

class QChartView;

namespace ts::gui {

class AbView : public QWidget {
    Q_OBJECT
public:
    explicit AbView(QWidget* parent = nullptr);
    void compare(const QString& runFileA, const QString& runFileB);
    const nlohmann::json& comparison() const { return m_comparison; }
    QString runFileA() const { return m_a; }
    QString runFileB() const { return m_b; }
    QTableWidget* knobTable() const { return m_knobs; }
    QTableWidget* metricTable() const { return m_metrics; }
    // Where the stacked timelines go (the main window puts its A/B timeline there).
    QVBoxLayout* timelineArea() const { return m_timelineArea; }
    bool isComplete() const { return m_done == 3; }

signals:
    void comparisonReady();

private:
    void buildMoved();

    QLabel* m_title;
    QTableWidget* m_knobs;
    QTableWidget* m_metrics;
    QVBoxLayout* m_timelineArea;
    QChartView* m_moved;
    QString m_a, m_b;
    nlohmann::json m_comparison;
    AnalysisSummary m_sa, m_sb;
    int m_done = 0;
    JobGeneration m_cmpJob, m_aJob, m_bJob;
};

}  // namespace ts::gui
