// The panels under the timeline (QtCharts): Live (charts that grow as steps complete), and the
// analysis of a finished run: step-time breakdown per rank, bubble per pipeline stage next to
// theory, exposed vs overlapped communication per group and kind, memory per rank over time
// stacked by category with the peak marked, kernel and category mix, and MFU with its formula.
// Every chart's tooltip states its definition, taken from the analysis document itself (one
// source with `trainscope analyze` and docs/profiler.md).
#pragma once

#include <QComboBox>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>
#include <QTabWidget>
#include <QTableWidget>
#include <QWidget>

#include <nlohmann/json.hpp>

#include "gui/core/analysis_summary.h"
#include "gui/core/jobs.h"
#include "gui/core/run_controller.h"

class QAbstractBarSeries;
class QChart;
class QChartView;
class QLineSeries;
class QValueAxis;

namespace ts::gui {

class Fp8Panel;
class MoePanel;

// Makes a chart view with the workbench's look (no animation, legend at the bottom).
QChartView* makeChartView(const QString& title, QWidget* parent);
// Sets a value axis to 0..max (a little above) with 3-6 ticks at 1-2-5 steps.
void setNiceRange(QValueAxis* axis, double max);
// Removes a chart's series and axes (charts are rebuilt when their data changes).
void clearChart(QChart* chart);
// Adds a bar series with its category axis (labels) and a value axis 0..max·1.1 titled
// valueTitle; horizontal series put the categories on the left.
void setBarAxes(QChart* chart, QAbstractBarSeries* series, const QStringList& labels, const QString& valueTitle, double max);

class LivePanel : public QWidget {
    Q_OBJECT
public:
    explicit LivePanel(QWidget* parent = nullptr);
    void startRun(const LiveRun& run);
    void addPoint(const StepPoint& p);
    void finish(const QString& status, const QString& reason);
    int pointCount() const { return m_points; }
    QString statusText() const { return m_status->text(); }

signals:
    void stopRequested();

private:
    struct Chart {
        QChartView* view = nullptr;
        QLineSeries* series = nullptr;
        QLineSeries* series2 = nullptr;
        QValueAxis* x = nullptr;
        QValueAxis* y = nullptr;
        QValueAxis* y2 = nullptr;
        double yMax = 0, y2Max = 0, yMin = 0;
    };
    Chart makeChart(const QString& title, const QString& yTitle, const QString& tooltip);
    void append(Chart& c, double x, double y, double y2 = NAN);

    QProgressBar* m_progress;
    QLabel* m_status;
    QPushButton* m_stop;
    Chart m_loss, m_time, m_tokens, m_tflops, m_memory;
    int m_points = 0, m_total = 0;
};

class AnalysisPanels : public QTabWidget {
    Q_OBJECT
public:
    explicit AnalysisPanels(QWidget* parent = nullptr);
    // The run file the panels describe; analysis runs on a worker thread.
    void setRunFile(const QString& runFile);
    void setStep(int step);  // -1: every step after the first
    bool hasAnalysis() const { return !m_doc.is_null(); }
    const AnalysisSummary& summary() const { return m_summary; }
    QString runFile() const { return m_runFile; }
    // The tab pages by name, for the tour ("Breakdown", "Bubbles", "Communication", "Memory",
    // "Kernels", "MFU", "MoE routing", "FP8").
    QWidget* page(const QString& name) const;
    // The MoE and FP8 tabs are shown only for a run whose analysis has those sections.
    bool isPageShown(const QString& name) const;
    MoePanel* moePanel() const { return m_moe; }
    Fp8Panel* fp8Panel() const { return m_fp8; }

signals:
    void analysisReady(const QString& runFile);
    void analysisFailed(const QString& runFile, const QString& message);
    void memoryReady();

private:
    void rebuild();
    void loadMemory(int rank);
    void buildMemoryChart(const nlohmann::json& series);

    QString m_runFile;
    nlohmann::json m_doc;
    AnalysisSummary m_summary;
    int m_step = -1;
    JobGeneration m_analysisJob, m_memoryJob;
    QChartView* m_breakdown;
    QChartView* m_bubbles;
    QChartView* m_comm;
    QChartView* m_memory;
    QComboBox* m_memoryRank;
    QChartView* m_categories;
    QTableWidget* m_kernels;
    QLabel* m_mfu;
    QLabel* m_caution;  // tab bar corner: the run's caveats, when it has any
    QWidget* m_memoryPage;
    QWidget* m_kernelPage;
    MoePanel* m_moe;
    Fp8Panel* m_fp8;
};

}  // namespace ts::gui
