// The workbench's main window (DESIGN.md "The workbench window"): node bar on top; runs browser
// and config editor on the left; the timeline with the panels (Live, analysis, A/B) under it in
// the middle; the details of the selected op or run on the right.
#pragma once

#include <QLabel>
#include <QMainWindow>
#include <QSplitter>
#include <QTabWidget>
#include <QTextBrowser>

#include <nlohmann/json.hpp>

#include "gui/core/jobs.h"
#include "gui/core/node_session.h"
#include "gui/core/run_controller.h"

namespace ts::gui {

class AbView;
class AnalysisPanels;
class ConfigEditor;
class ExportDialog;
class LivePanel;
class NodeBar;
class RunsBrowser;
class TimelineHost;

class MainWindow : public QMainWindow {
    Q_OBJECT
public:
    explicit MainWindow(QWidget* parent = nullptr);
    ~MainWindow() override;

    NodeSession* session() { return &m_session; }
    RunController* runs() { return m_runs; }
    NodeBar* nodeBar() { return m_nodeBar; }
    ConfigEditor* configEditor() { return m_config; }
    // Opens a YAML config in the editor and shows the Config tab (false: it could not be read).
    bool openConfigFile(const QString& file);
    RunsBrowser* runsBrowser() { return m_browser; }
    LivePanel* livePanel() { return m_live; }
    AnalysisPanels* panels() { return m_panels; }
    AbView* abView() { return m_ab; }
    ExportDialog* exportDialog();
    TimelineHost* timeline() { return m_timeline; }
    TimelineHost* abTimeline() { return m_abTimeline; }
    QTabWidget* leftTabs() { return m_left; }
    QTextBrowser* details() { return m_details; }

    // Opens a run file (local path): timeline, panels and details follow it.
    void openRunFile(const QString& path, const QString& name = {});
    QString currentRunFile() const { return m_currentRunFile; }
    // Starts the editor's config on the node. With a base run, the A/B view opens when it ends.
    void startRun(const QString& yaml, const QString& name, int steps);
    // Loads the open run's config into the editor; Run then reruns it and opens the A/B view.
    void editConfigOfCurrentRun();
    void compareRunFiles(const QString& a, const QString& b);
    void showExport();
    void showTab(const QString& name);  // a panel tab ("Live", "Bubbles", ..., "A/B")
    QString lastRunId() const { return m_lastRunId; }
    void showMessage(const QString& text, bool error = false);

signals:
    void runOpened(const QString& path);

protected:
    void closeEvent(QCloseEvent* event) override;

private:
    void buildMenus();
    void openRemoteRun(const nlohmann::json& run);
    void onRunFileReady(const QString& runId, const QString& path);
    void setDetailsForRun(const nlohmann::json& info);

    NodeSession m_session;
    RunController* m_runs;
    NodeBar* m_nodeBar;
    QTabWidget* m_left;
    ConfigEditor* m_config;
    RunsBrowser* m_browser;
    TimelineHost* m_timeline;
    TimelineHost* m_abTimeline;
    AnalysisPanels* m_panels;
    LivePanel* m_live;
    AbView* m_ab;
    ExportDialog* m_export = nullptr;
    QTextBrowser* m_details;
    QSplitter* m_hsplit;
    QSplitter* m_vsplit;
    QString m_currentRunFile, m_currentRunName;
    QString m_editorBaseRunFile;              // the run whose config is in the editor
    std::map<QString, QString> m_abBaseOfRun;  // new run id -> run file it is compared with
    QString m_lastRunId;
    JobGeneration m_configJob, m_detailsJob;
};

}  // namespace ts::gui
