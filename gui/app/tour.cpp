// runTour (tour.h).
#include "gui/app/tour.h"

#include <cmath>

#include <QAbstractItemModel>
#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QPixmap>
#include <QTableWidget>
#include <QThread>

#include "gui/app/ab_view.h"
#include "gui/app/config_editor.h"
#include "gui/app/counter_panels.h"
#include "gui/app/export_dialog.h"
#include "gui/app/main_window.h"
#include "gui/app/node_bar.h"
#include "gui/app/panels.h"
#include "gui/app/runs_browser.h"
#include "gui/app/timeline_host.h"

namespace ts::gui {

using nlohmann::json;

namespace {

bool waitFor(const std::function<bool()>& done, int timeoutMs) {
    QElapsedTimer t;
    t.start();
    while (!done()) {
        if (t.elapsed() > timeoutMs) return false;
        QCoreApplication::processEvents(QEventLoop::AllEvents, 50);
        QThread::msleep(10);
    }
    return true;
}

// Lets the window lay out and paint what just changed.
void settle(int ms = 300) {
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < ms) {
        QCoreApplication::processEvents(QEventLoop::AllEvents, 50);
        QThread::msleep(10);
    }
}

QString examplePath(const QString& name) {
    for (const QString& p : ConfigEditor::examplePaths())
        if (QFileInfo(p).fileName() == name) return p;
    return {};
}

}  // namespace

TourResult runTour(MainWindow& w, const TourOptions& o) {
    TourResult res;
    QDir().mkpath(o.outDir);
    json& rep = res.report;
    auto shot = [&](QWidget* widget, const QString& name) {
        settle();
        const QString file = QDir(o.outDir).filePath(name + QStringLiteral(".png"));
        if (widget->grab().save(file)) res.screenshots << file;
    };
    auto fail = [&](const QString& why) {
        res.error = why;
        rep["error"] = why.toStdString();
        QFile f(QDir(o.outDir).filePath(QStringLiteral("tour.json")));
        if (f.open(QIODevice::WriteOnly)) f.write(QByteArray::fromStdString(rep.dump(2)));
        return res;
    };
    // A run the tour started has finished, its run file is open and analysed.
    auto runAndWait = [&](const QString& what) -> QString {
        const QString before = w.lastRunId();
        w.startRun(w.configEditor()->yaml(), w.configEditor()->runName(), w.configEditor()->steps());
        if (!waitFor([&] { return w.lastRunId() != before && !w.lastRunId().isEmpty(); }, o.timeoutMs))
            return QStringLiteral("%1: the node did not start the run (%2)").arg(what, w.livePanel()->statusText());
        const QString id = w.lastRunId();
        if (!waitFor([&] { const LiveRun* r = w.runs()->run(id); return r && r->finished(); }, o.timeoutMs))
            return QStringLiteral("%1: run %2 did not finish in time").arg(what, id);
        const LiveRun* r = w.runs()->run(id);
        if (r->status != QLatin1String("completed"))
            return QStringLiteral("%1: run %2 ended %3: %4").arg(what, id, r->status, r->reason);
        if (!waitFor([&] { return !r->localRunFile.isEmpty() && w.panels()->hasAnalysis() && w.panels()->runFile() == r->localRunFile; },
                     o.timeoutMs))
            return QStringLiteral("%1: the run file was not opened and analysed").arg(what);
        waitFor([&] { return w.timeline()->isLoaded(); }, o.timeoutMs);
        return {};
    };

    // Opens an example in the editor and waits for the node to validate its values.
    auto openExample = [&](const QString& name) -> QString {
        const QString path = examplePath(name);
        if (path.isEmpty() || !w.configEditor()->openFile(path)) return QStringLiteral("cannot open %1").arg(name);
        if (!waitFor([&] { return w.configEditor()->isValid() && w.configEditor()->source() == name; }, o.timeoutMs))
            return QStringLiteral("%1 did not validate: %2").arg(name, w.configEditor()->issuesText());
        return {};
    };

    // 1. Connect to the local node.
    w.nodeBar()->openNode(QStringLiteral("local"));
    if (!waitFor([&] { return w.session()->isConnected(); }, o.timeoutMs))
        return fail(QStringLiteral("connect: %1").arg(w.nodeBar()->statusText()));
    rep["node"] = {{"summary", w.session()->info().summary().toStdString()},
                   {"details", w.session()->info().details().toStdString()},  // the node bar's tooltip
                   {"knobs", w.session()->info().knobs.value("knobs", json::array()).size()}};
    shot(&w, QStringLiteral("01-node"));

    // 2. Open tiny.yaml in the config editor.
    if (QString e = openExample(QStringLiteral("tiny.yaml")); !e.isEmpty()) return fail(e);
    w.leftTabs()->setCurrentWidget(w.configEditor());
    w.configEditor()->setSteps(o.stepsTiny);
    w.configEditor()->setRunName(QStringLiteral("tour-tiny"));
    rep["config"] = {{"source", w.configEditor()->source().toStdString()}, {"yaml", w.configEditor()->yaml().toStdString()}};
    shot(&w, QStringLiteral("02-config"));

    // 3. Run it; the live charts grow.
    if (QString e = runAndWait(QStringLiteral("tiny")); !e.isEmpty()) return fail(e);
    w.showTab(QStringLiteral("Live"));
    rep["tiny"] = {{"run_id", w.lastRunId().toStdString()}, {"live_points", w.livePanel()->pointCount()},
                   {"run_file", w.currentRunFile().toStdString()}};
    shot(&w, QStringLiteral("03-live"));
    // 4. Its timeline.
    rep["tiny"]["timeline_rows"] = w.timeline()->rowCount();
    shot(&w, QStringLiteral("04-timeline"));

    // 5. The analysis panels, on a pipeline-parallel run (bubbles and p2p need pp > 1).
    if (QString e = openExample(QStringLiteral("pp2_1f1b.yaml")); !e.isEmpty()) return fail(e);
    w.configEditor()->setSteps(o.stepsPipeline);
    w.configEditor()->setRunName(QStringLiteral("tour-pp2"));
    if (QString e = runAndWait(QStringLiteral("pp2")); !e.isEmpty()) return fail(e);
    const AnalysisSummary& s = w.panels()->summary();
    rep["pp2"] = {{"run_file", w.currentRunFile().toStdString()}, {"ranks", s.ranks.size()}, {"stages", s.stages.size()},
                  {"comm_rows", s.comm.size()}, {"timeline_rows", w.timeline()->rowCount()}, {"mfu", std::isnan(s.mfu) ? -1.0 : s.mfu}};
    int index = 5;
    for (const char* tab : {"Breakdown", "Bubbles", "Communication", "Memory", "Kernels", "MFU"}) {
        w.showTab(QString::fromLatin1(tab));
        if (QString::fromLatin1(tab) == QLatin1String("Memory")) settle(600);
        shot(&w, QStringLiteral("%1-%2").arg(index++, 2, 10, QLatin1Char('0')).arg(QString::fromLatin1(tab).toLower()));
    }

    // 6. Toggle a knob on a dp2 config and rerun: the A/B view opens when B ends.
    if (QString e = openExample(QStringLiteral("dp2_overlap.yaml")); !e.isEmpty()) return fail(e);
    w.configEditor()->setSteps(o.stepsDp);
    w.configEditor()->setRunName(QStringLiteral("tour-dp2-A"));
    if (QString e = runAndWait(QStringLiteral("dp2 A")); !e.isEmpty()) return fail(e);
    const QString runA = w.currentRunFile();
    w.editConfigOfCurrentRun();
    if (!waitFor([&] { return w.configEditor()->source().startsWith(QLatin1String("config of run")); }, o.timeoutMs))
        return fail(QStringLiteral("the run's config did not load into the editor"));
    const json before = w.configEditor()->model()->value(o.knobToToggle);
    if (!before.is_boolean()) return fail(QStringLiteral("knob %1 is not a bool on this node").arg(o.knobToToggle));
    w.configEditor()->model()->setValue(o.knobToToggle, !before.get<bool>());
    if (!waitFor([&] { return w.configEditor()->isValid(); }, o.timeoutMs))
        return fail(QStringLiteral("the toggled config did not validate: %1").arg(w.configEditor()->issuesText()));
    settle(400);
    w.configEditor()->setSteps(o.stepsDp);
    w.leftTabs()->setCurrentWidget(w.configEditor());
    shot(&w, QStringLiteral("11-toggle"));
    if (QString e = runAndWait(QStringLiteral("dp2 B")); !e.isEmpty()) return fail(e);
    if (!waitFor([&] { return w.abView()->isComplete() && w.abView()->runFileA() == runA; }, o.timeoutMs))
        return fail(QStringLiteral("the A/B view did not open after the rerun"));
    waitFor([&] { return w.abTimeline()->isLoaded(); }, o.timeoutMs);
    json knobs = json::array();
    for (int i = 0; i < w.abView()->knobTable()->rowCount(); ++i)
        knobs.push_back(w.abView()->knobTable()->item(i, 0)->text().toStdString());
    rep["ab"] = {{"a", runA.toStdString()}, {"b", w.abView()->runFileB().toStdString()}, {"changed_knobs", knobs},
                 {"metrics_shown", w.abView()->metricTable()->rowCount()}, {"timeline_rows", w.abTimeline()->rowCount()}};
    w.showTab(QStringLiteral("A/B"));
    shot(&w, QStringLiteral("12-ab"));

    // 7. The export dialog.
    w.showExport();
    bool exported = false;
    auto conn = QObject::connect(w.exportDialog(), &ExportDialog::loaded, [&] { exported = true; });
    if (!waitFor([&] { return exported; }, o.timeoutMs)) return fail(QStringLiteral("the export dialog did not load"));
    QObject::disconnect(conn);
    w.exportDialog()->showFormat(QStringLiteral("megatron_args"));
    rep["export"] = {{"yaml", w.exportDialog()->text(QStringLiteral("yaml")).toStdString()},
                     {"megatron_args", w.exportDialog()->text(QStringLiteral("megatron_args")).toStdString()},
                     {"bridge_overrides", w.exportDialog()->text(QStringLiteral("bridge_overrides")).toStdString()}};
    shot(w.exportDialog(), QStringLiteral("13-export"));
    w.exportDialog()->hide();

    // 8. The runs browser.
    w.runsBrowser()->refresh();
    w.leftTabs()->setCurrentWidget(w.runsBrowser());
    waitFor([&] { return w.runsBrowser()->model()->rowCount() >= 4; }, 10000);
    rep["runs"] = w.runsBrowser()->model()->rowCount();
    shot(&w, QStringLiteral("14-runs"));

    // 9. The model counters: an MoE run's routing, an FP8 run's scales (the engine does not run
    // FP8 experts, so they are two runs). 15 is not the tour's: docs/screenshots/15-mpi-hybrid-run.png
    // (docs/parallel.md) is an mpirun run's view.
    if (QString e = openExample(QStringLiteral("moe_tiny.yaml")); !e.isEmpty()) return fail(e);
    w.configEditor()->setSteps(o.stepsModelCounters);
    w.configEditor()->setRunName(QStringLiteral("tour-moe"));
    if (QString e = runAndWait(QStringLiteral("moe")); !e.isEmpty()) return fail(e);
    if (!w.panels()->isPageShown(QStringLiteral("MoE routing"))) return fail(QStringLiteral("the MoE run shows no MoE routing tab"));
    const MoeView& moe = w.panels()->moePanel()->view();
    rep["moe"] = {{"run_file", w.currentRunFile().toStdString()}, {"layers", moe.layers.size()}, {"experts", moe.experts},
                  {"heat_rows", w.panels()->moePanel()->heatMap()->rowCount()}, {"fp8_tab", w.panels()->isPageShown(QStringLiteral("FP8"))}};
    w.leftTabs()->setCurrentWidget(w.configEditor());
    w.showTab(QStringLiteral("MoE routing"));
    shot(&w, QStringLiteral("16-moe-routing"));
    if (QString e = openExample(QStringLiteral("fp8_hybrid.yaml")); !e.isEmpty()) return fail(e);
    w.configEditor()->setSteps(o.stepsModelCounters);
    w.configEditor()->setRunName(QStringLiteral("tour-fp8"));
    if (QString e = runAndWait(QStringLiteral("fp8")); !e.isEmpty()) return fail(e);
    if (!w.panels()->isPageShown(QStringLiteral("FP8"))) return fail(QStringLiteral("the FP8 run shows no FP8 tab"));
    rep["fp8"] = {{"run_file", w.currentRunFile().toStdString()}, {"tensors", w.panels()->fp8Panel()->view().tensorCount},
                  {"table_rows", w.panels()->fp8Panel()->table()->rowCount()},
                  {"moe_tab", w.panels()->isPageShown(QStringLiteral("MoE routing"))}};
    w.showTab(QStringLiteral("FP8"));
    // Sorted by scale min, so that the run's smallest scale (highlighted) is the first row and
    // the picture shows a sort.
    w.panels()->fp8Panel()->table()->sortByColumn(Fp8Panel::ScaleMin, Qt::AscendingOrder);
    shot(&w, QStringLiteral("17-fp8"));

    res.ok = true;
    rep["screenshots"] = json::array();
    for (const QString& s2 : res.screenshots) rep["screenshots"].push_back(QFileInfo(s2).fileName().toStdString());
    QFile f(QDir(o.outDir).filePath(QStringLiteral("tour.json")));
    if (f.open(QIODevice::WriteOnly)) f.write(QByteArray::fromStdString(rep.dump(2)));
    return res;
}

}  // namespace ts::gui
