// The workbench's main window (main_window.h).
#include "gui/app/main_window.h"

#include <QApplication>
#include <QCloseEvent>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QMenuBar>
#include <QMessageBox>
#include <QSettings>
#include <QStatusBar>
#include <QVBoxLayout>

#include "gui/app/ab_view.h"
#include "gui/app/config_editor.h"
#include "gui/app/export_dialog.h"
#include "gui/app/node_bar.h"
#include "gui/app/panels.h"
#include "gui/app/runs_browser.h"
#include "gui/app/timeline_host.h"
#include "gui/core/format.h"
#include "sessions/workspace.h"

namespace ts::gui {

using nlohmann::json;

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
    setWindowTitle(QStringLiteral("trainscope"));
    m_runs = new RunController(&m_session, this);
    if (auto ws = sessions::Workspace::open("")) m_runs->setLocalRunsDir(QString::fromStdString(ws->runsDir()));

    auto* central = new QWidget(this);
    auto* outer = new QVBoxLayout(central);
    outer->setContentsMargins(0, 0, 0, 0);
    outer->setSpacing(0);
    m_nodeBar = new NodeBar(&m_session, central);
    outer->addWidget(m_nodeBar);

    m_hsplit = new QSplitter(Qt::Horizontal, central);
    m_left = new QTabWidget(m_hsplit);
    m_browser = new RunsBrowser(&m_session, m_left);
    m_config = new ConfigEditor(&m_session, m_left);
    m_left->addTab(m_browser, QStringLiteral("Runs"));
    m_left->addTab(m_config, QStringLiteral("Config"));

    m_vsplit = new QSplitter(Qt::Vertical, m_hsplit);
    m_timeline = new TimelineHost(m_vsplit);
    m_panels = new AnalysisPanels(m_vsplit);
    m_live = new LivePanel(m_panels);
    m_panels->insertTab(0, m_live, QStringLiteral("Live"));
    m_ab = new AbView(m_panels);
    m_panels->addTab(m_ab, QStringLiteral("A/B"));
    m_panels->setCurrentIndex(0);
    m_abTimeline = new TimelineHost(m_ab);
    m_ab->timelineArea()->addWidget(m_abTimeline);
    m_vsplit->addWidget(m_timeline);
    m_vsplit->addWidget(m_panels);
    m_vsplit->setStretchFactor(0, 3);
    m_vsplit->setStretchFactor(1, 2);
    m_vsplit->setSizes({460, 440});

    m_details = new QTextBrowser(m_hsplit);
    m_details->setObjectName(QStringLiteral("details"));
    m_details->setHtml(QStringLiteral("<p>Select a run or an op to see its details.</p>"));
    m_hsplit->addWidget(m_left);
    m_hsplit->addWidget(m_vsplit);
    m_hsplit->addWidget(m_details);
    m_hsplit->setStretchFactor(0, 2);
    m_hsplit->setStretchFactor(1, 6);
    m_hsplit->setStretchFactor(2, 1);
    m_hsplit->setSizes({420, 1100, 260});
    outer->addWidget(m_hsplit, 1);
    setCentralWidget(central);
    buildMenus();
    statusBar()->showMessage(QStringLiteral("Ready"));

    connect(m_config, &ConfigEditor::runRequested, this, &MainWindow::startRun);
    connect(m_browser, &RunsBrowser::openRequested, this, [this](const json& run) { openRemoteRun(run); });
    connect(m_browser, &RunsBrowser::configRequested, this, [this](const json& run) {
        const QString path = QString::fromStdString(run.value("path", std::string()));
        if (m_session.url() == QLatin1String("local") && QFileInfo::exists(path)) {
            openRunFile(path, QString::fromStdString(run.value("name", std::string())));
            editConfigOfCurrentRun();
        } else {
            openRemoteRun(run);
        }
    });
    connect(m_browser, &RunsBrowser::exportRequested, this, [this](const json& run) {
        openRemoteRun(run);
        showExport();
    });
    connect(m_browser, &RunsBrowser::compareRequested, this, [this](const json& a, const json& b) {
        compareRunFiles(QString::fromStdString(a.value("path", std::string())), QString::fromStdString(b.value("path", std::string())));
    });
    connect(m_browser, &RunsBrowser::message, this, &MainWindow::showMessage);
    connect(m_browser, &RunsBrowser::imported, this, [this](const QString& path) { openRunFile(path); });
    connect(m_live, &LivePanel::stopRequested, this, [this] {
        if (!m_lastRunId.isEmpty()) m_runs->cancel(m_lastRunId);
    });
    connect(m_runs, &RunController::runRejected, this, [this](const QString& message) {
        showMessage(QStringLiteral("the node refused the run: ") + message, true);
        m_live->finish(QStringLiteral("refused"), message);
    });
    connect(m_runs, &RunController::runStarted, this, [this](const QString& id) {
        m_lastRunId = id;
        if (const LiveRun* r = m_runs->run(id)) {
            m_live->startRun(*r);
            for (const StepPoint& p : r->steps) m_live->addPoint(p);
            // A run on this machine: the timeline follows its run file while it writes.
            if (r->node == QLatin1String("local") && !r->runFile.isEmpty()) m_timeline->setRunFile(r->runFile, r->name, true);
        }
        showTab(QStringLiteral("Live"));
        showMessage(QStringLiteral("run %1 started on %2").arg(id, m_session.url()));
    });
    connect(m_runs, &RunController::runProgressed, this, [this](const QString& id, const StepPoint& p) {
        if (id == m_lastRunId) m_live->addPoint(p);
    });
    connect(m_runs, &RunController::runFinished, this, [this](const QString& id, const QString& status, const QString& reason) {
        if (id == m_lastRunId) m_live->finish(status, reason);
        showMessage(QStringLiteral("run %1 %2%3").arg(id, status, reason.isEmpty() ? QString() : QStringLiteral(": ") + reason),
                    status != QLatin1String("completed"));
        m_browser->refresh();
    });
    connect(m_runs, &RunController::runFileReady, this, &MainWindow::onRunFileReady);
    connect(m_timeline, &TimelineHost::sliceSelectedHtml, m_details, &QTextBrowser::setHtml);
    connect(m_abTimeline, &TimelineHost::sliceSelectedHtml, m_details, &QTextBrowser::setHtml);
    connect(m_timeline, &TimelineHost::stepSelected, m_panels, &AnalysisPanels::setStep);
    connect(&m_session, &NodeSession::disconnected, this, [this](const QString& url, const QString& message) {
        showMessage(QStringLiteral("lost %1: %2").arg(url, message), true);
    });

    QSettings settings;
    restoreGeometry(settings.value(QStringLiteral("window/geometry")).toByteArray());
    restoreState(settings.value(QStringLiteral("window/state")).toByteArray());
    m_hsplit->restoreState(settings.value(QStringLiteral("window/hsplit")).toByteArray());
    m_vsplit->restoreState(settings.value(QStringLiteral("window/vsplit")).toByteArray());
    if (!settings.contains(QStringLiteral("window/geometry"))) resize(1600, 980);
}

MainWindow::~MainWindow() = default;

void MainWindow::closeEvent(QCloseEvent* event) {
    QSettings settings;
    settings.setValue(QStringLiteral("window/geometry"), saveGeometry());
    settings.setValue(QStringLiteral("window/state"), saveState());
    settings.setValue(QStringLiteral("window/hsplit"), m_hsplit->saveState());
    settings.setValue(QStringLiteral("window/vsplit"), m_vsplit->saveState());
    QMainWindow::closeEvent(event);
}

void MainWindow::buildMenus() {
    QMenu* file = menuBar()->addMenu(QStringLiteral("&File"));
    file->addAction(QStringLiteral("Open run file…"), QKeySequence::Open, this, [this] {
        const QString f = QFileDialog::getOpenFileName(this, QStringLiteral("Open run file"), QString(),
                                                       QStringLiteral("Run files (*.sqlite);;All files (*)"));
        if (!f.isEmpty()) openRunFile(f);
    });
    file->addAction(QStringLiteral("Open config…"), this, [this] {
        const QString f = QFileDialog::getOpenFileName(this, QStringLiteral("Open config"), QString(), QStringLiteral("YAML (*.yaml *.yml)"));
        if (!f.isEmpty()) openConfigFile(f);
    });
    QMenu* recent = file->addMenu(QStringLiteral("Recent configs"));
    connect(recent, &QMenu::aboutToShow, this, [this, recent] {
        recent->clear();
        for (const QString& f : QSettings().value(QStringLiteral("config/recent")).toStringList())
            recent->addAction(f, this, [this, f] { openConfigFile(f); });
    });
    file->addAction(QStringLiteral("Import traces…"), this, [this] {
        const QStringList files = QFileDialog::getOpenFileNames(this, QStringLiteral("Import traces"), QString(),
                                                                QStringLiteral("Traces (*.sqlite *.json *.json.gz *.gz)"));
        if (!files.isEmpty()) m_browser->importFiles(files);
    });
    file->addAction(QStringLiteral("Export config…"), QKeySequence(QStringLiteral("Ctrl+E")), this, &MainWindow::showExport);
    file->addSeparator();
    file->addAction(QStringLiteral("Quit"), QKeySequence::Quit, this, &QWidget::close);
    QMenu* run = menuBar()->addMenu(QStringLiteral("&Run"));
    run->addAction(QStringLiteral("Run config on node"), QKeySequence(QStringLiteral("Ctrl+R")), this,
                   [this] { startRun(m_config->yaml(), m_config->runName(), m_config->steps()); });
    run->addAction(QStringLiteral("Stop"), this, [this] {
        if (!m_lastRunId.isEmpty()) m_runs->cancel(m_lastRunId);
    });
    run->addAction(QStringLiteral("Edit config of open run (rerun → A/B)"), this, &MainWindow::editConfigOfCurrentRun);
    QMenu* help = menuBar()->addMenu(QStringLiteral("&Help"));
    help->addAction(QStringLiteral("About trainscope"), this, [this] {
        QMessageBox::about(this, QStringLiteral("trainscope"),
                           QStringLiteral("<b>trainscope %1</b><br>A workbench for tuning distributed LLM training.<br>"
                                          "Timeline keys: wheel or W/S zoom at the cursor, drag or A/D pan, F fit, Ctrl+F find.")
                               .arg(QStringLiteral(TS_VERSION)));
    });
}

void MainWindow::showMessage(const QString& text, bool error) {
    statusBar()->showMessage(text, error ? 0 : 8000);
    statusBar()->setStyleSheet(error ? QStringLiteral("color: #b00020") : QString());
}

void MainWindow::showTab(const QString& name) {
    for (int i = 0; i < m_panels->count(); ++i)
        if (m_panels->tabText(i) == name) m_panels->setCurrentIndex(i);
}

ExportDialog* MainWindow::exportDialog() {
    if (!m_export) m_export = new ExportDialog(this);
    return m_export;
}

bool MainWindow::openConfigFile(const QString& file) {
    if (!m_config->openFile(file)) return false;
    m_left->setCurrentWidget(m_config);
    return true;
}

void MainWindow::openRunFile(const QString& path, const QString& name) {
    if (!QFileInfo(path).isFile()) {
        showMessage(QStringLiteral("no run file at %1").arg(path), true);
        return;
    }
    m_currentRunFile = path;
    m_currentRunName = name.isEmpty() ? QFileInfo(path).completeBaseName() : name;
    setWindowTitle(QStringLiteral("trainscope — %1").arg(m_currentRunName));
    m_timeline->setRunFile(path, m_currentRunName);
    m_panels->setRunFile(path);
    const std::string p = path.toStdString();
    runJob<Result<json>>(this, m_detailsJob, [p] { return runFileConfig(p); }, [this](Result<json> r) {
        if (r) setDetailsForRun(*r);
    });
    emit runOpened(path);
}

void MainWindow::setDetailsForRun(const json& info) {
    QString html = QStringLiteral("<h3>%1</h3>").arg(QString::fromStdString(info.value("name", std::string())).toHtmlEscaped());
    html += QStringLiteral("<p>id %1<br>status <b>%2</b>").arg(QString::fromStdString(info.value("id", std::string())),
                                                            QString::fromStdString(info.value("status", std::string())));
    const std::string reason = info.value("status_reason", std::string());
    if (!reason.empty()) html += QStringLiteral("<br><span style='color:#b00020'>%1</span>").arg(QString::fromStdString(reason).toHtmlEscaped());
    html += QStringLiteral("<br>layout %1</p>").arg(QString::fromStdString(info.value("layout", std::string())));
    const json steps = info.value("steps", json::array());
    if (!steps.empty()) {
        const json& last = steps.back();
        html += QStringLiteral("<p>%1 steps; last loss %2<br>last step %3</p>")
                    .arg(steps.size())
                    .arg(last.value("loss", 0.0), 0, 'f', 4)
                    .arg(formatDurationNs(last.value("step_time_s", 0.0) * 1e9));
    }
    m_details->setHtml(html);
}

void MainWindow::openRemoteRun(const json& run) {
    const QString path = QString::fromStdString(run.value("path", std::string()));
    const QString name = QString::fromStdString(run.value("name", std::string()));
    const QString id = QString::fromStdString(run.value("id", std::string()));
    if (m_session.url() == QLatin1String("local")) {
        openRunFile(path, name);
        return;
    }
    if (!isSafeRunId(id)) {
        showMessage(QStringLiteral("the node listed a run id that is not a safe file name: '%1'").arg(id), true);
        return;
    }
    auto ws = sessions::Workspace::open("");
    if (!ws) {
        showMessage(QString::fromStdString(ws.status().message()), true);
        return;
    }
    const QString dest = QDir(QString::fromStdString(ws->runsDir())).filePath(id + QStringLiteral(".sqlite"));
    showMessage(QStringLiteral("fetching run %1 from %2…").arg(id, m_session.url()));
    m_session.fetchRun(id, dest, this, [this, dest, name](const Status& st) {
        if (!st.isOk()) {
            showMessage(QStringLiteral("fetching the run failed: ") + QString::fromStdString(st.message()), true);
            return;
        }
        openRunFile(dest, name);
    });
}

void MainWindow::editConfigOfCurrentRun() {
    if (m_currentRunFile.isEmpty()) {
        showMessage(QStringLiteral("open a run first"), true);
        return;
    }
    const QString path = m_currentRunFile, name = m_currentRunName;
    const std::string p = path.toStdString();
    runJob<Result<json>>(this, m_configJob, [p] { return runFileConfig(p); }, [this, path, name](Result<json> r) {
        if (!r) {
            showMessage(QStringLiteral("cannot read the run's config: ") + QString::fromStdString(r.status().message()), true);
            return;
        }
        m_config->loadConfigJson((*r)["config"], QStringLiteral("config of run %1 — change knobs and Run to compare A/B").arg(name));
        m_config->setRunName(name + QStringLiteral(" (B)"));
        m_editorBaseRunFile = path;
        m_left->setCurrentWidget(m_config);
    });
}

void MainWindow::startRun(const QString& yaml, const QString& name, int steps) {
    if (!m_session.isConnected()) {
        showMessage(QStringLiteral("not connected to a node: connect first (node bar)"), true);
        return;
    }
    const QString base = m_editorBaseRunFile;
    // The start_run answer names the run; until then remember the base by name.
    auto conn = std::make_shared<QMetaObject::Connection>();
    *conn = connect(m_runs, &RunController::runStarted, this, [this, base, conn](const QString& id) {
        QObject::disconnect(*conn);
        if (!base.isEmpty()) m_abBaseOfRun[id] = base;
    });
    m_runs->startRun(yaml, name, steps);
}

void MainWindow::onRunFileReady(const QString& runId, const QString& path) {
    auto base = m_abBaseOfRun.find(runId);
    const LiveRun* run = m_runs->run(runId);
    if (base != m_abBaseOfRun.end()) {
        const QString a = base->second;
        m_abBaseOfRun.erase(base);
        openRunFile(path, run ? run->name : QString());
        compareRunFiles(a, path);
        return;
    }
    if (runId == m_lastRunId) openRunFile(path, run ? run->name : QString());
}

void MainWindow::compareRunFiles(const QString& a, const QString& b) {
    if (!QFileInfo(a).isFile() || !QFileInfo(b).isFile()) {
        showMessage(QStringLiteral("compare needs two run files readable here (remote runs are fetched when opened)"), true);
        return;
    }
    m_ab->compare(a, b);
    m_abTimeline->setRunFiles(a, QStringLiteral("A"), b, QStringLiteral("B"));
    showTab(QStringLiteral("A/B"));
}

void MainWindow::showExport() {
    if (m_currentRunFile.isEmpty()) {
        showMessage(QStringLiteral("open a run to export its config"), true);
        return;
    }
    exportDialog()->setRunFile(m_currentRunFile, m_currentRunName);
    exportDialog()->show();
    exportDialog()->raise();
}

}  // namespace ts::gui
