// End to end (label gui): the real workbench window against a real local node
// (`trainscope agent --stdio` as a child process), offscreen. The tour drives the user's story
// and the test asserts on what the models hold at each step, not only that nothing crashed.
#include <gtest/gtest.h>

#include <csignal>

#include <QSettings>
#include <QTimer>

#include "engine/config/knobs.h"
#include "gui/app/ab_view.h"
#include "gui/app/config_editor.h"
#include "gui/app/main_window.h"
#include "gui/app/node_bar.h"
#include "gui/app/panels.h"
#include "gui/app/tour.h"
#include "tests/gui/gui_test_util.h"

using namespace ts::gui;
using nlohmann::json;

namespace {

// A fresh workspace and settings per test; runs use the trainscope built next to the tests.
struct Sandbox {
    QTemporaryDir dir;
    Sandbox() {
        test::ensureApp();
        qputenv("TRAINSCOPE_EXE", QByteArray(TS_BINARY_DIR "/apps/trainscope"));
        qputenv("TRAINSCOPE_WORKSPACE", (dir.path() + QStringLiteral("/workspace")).toLocal8Bit());
        QSettings::setDefaultFormat(QSettings::IniFormat);
        QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, dir.path() + QStringLiteral("/settings"));
    }
};

}  // namespace

TEST(Workbench, TourRunsTheWholeStoryOnTheLocalNode) {
    Sandbox box;
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    TourOptions o;
    o.outDir = box.dir.path() + QStringLiteral("/tour");
    o.stepsTiny = 3;
    o.stepsPipeline = 3;
    o.stepsDp = 3;
    o.stepsModelCounters = 2;
    const TourResult r = runTour(w, o);
    ASSERT_TRUE(r.ok) << r.error.toStdString();
    const json& rep = r.report;

    // Connected to the local node, whose registry generated the editor.
    EXPECT_GT(rep["node"]["knobs"].get<int>(), 50);
    // tiny: one live point per step, the run file open.
    EXPECT_EQ(rep["tiny"]["live_points"].get<int>(), o.stepsTiny);
    EXPECT_TRUE(QFileInfo::exists(QString::fromStdString(rep["tiny"]["run_file"].get<std::string>())));
    // Its timeline: the host track's ranges and the compute stream at least.
    EXPECT_GE(rep["tiny"]["timeline_rows"].get<int>(), 2);
    // pp2: two stages, both ranks, p2p communication in the panels; each rank has its rows.
    EXPECT_GT(rep["pp2"]["timeline_rows"].get<int>(), rep["tiny"]["timeline_rows"].get<int>());
    EXPECT_EQ(rep["pp2"]["stages"].get<int>(), 2);
    EXPECT_EQ(rep["pp2"]["ranks"].get<int>(), 2);
    EXPECT_GT(rep["pp2"]["comm_rows"].get<int>(), 0);
    // A/B lists exactly the toggled knob.
    EXPECT_EQ(rep["ab"]["changed_knobs"], json::array({o.knobToToggle.toStdString()}));
    EXPECT_NE(rep["ab"]["a"], rep["ab"]["b"]);
    // Both runs' timelines stacked on one axis: more rows than one dp2 rank has.
    EXPECT_GT(rep["ab"]["timeline_rows"].get<int>(), rep["tiny"]["timeline_rows"].get<int>());
    // The exported YAML parses back to the config of run B (the knob toggled off).
    const auto loaded = ts::engine::parseConfigYaml(rep["export"]["yaml"].get<std::string>());
    EXPECT_TRUE(loaded.ok()) << (loaded.issues.empty() ? "" : loaded.issues[0].toString());
    EXPECT_FALSE(loaded.config.overlap_grad_reduce);
    EXPECT_EQ(loaded.config.data_parallel_size, 2);
    EXPECT_NE(rep["export"]["megatron_args"].get<std::string>().find("--num-layers 4"), std::string::npos);
    EXPECT_GE(rep["runs"].get<int>(), 4);
    // moe_tiny.yaml: its 4 layers x 8 experts in the MoE tab, no FP8 tab; fp8_hybrid.yaml: 4 layers
    // x 4 linears x (input, weight, grad) in the FP8 table, no MoE tab.
    EXPECT_EQ(rep["moe"]["layers"], 4);
    EXPECT_EQ(rep["moe"]["experts"], 8);
    EXPECT_EQ(rep["moe"]["heat_rows"], 4);
    EXPECT_EQ(rep["moe"]["fp8_tab"], false);
    EXPECT_EQ(rep["fp8"]["tensors"], 48);
    EXPECT_EQ(rep["fp8"]["table_rows"], 48);
    EXPECT_EQ(rep["fp8"]["moe_tab"], false);
    EXPECT_EQ(r.screenshots.size(), 16);
    // No label with a long text (a path, an error) ever widened the window during the tour,
    // and with every view filled it still fits a 1366x768 laptop screen.
    EXPECT_EQ(w.width(), 1400);
    EXPECT_LE(w.minimumSizeHint().width(), 1366);
    EXPECT_LE(w.minimumSizeHint().height(), 768);
    EXPECT_LE(w.minimumSize().width(), 1366);
    for (const QString& f : r.screenshots) EXPECT_GT(QFileInfo(f).size(), 10000) << f.toStdString();
}

TEST(Workbench, NodeThatDiesMidRunLeavesTheGuiResponsiveWithAnError) {
    Sandbox box;
    MainWindow w;
    w.show();
    w.nodeBar()->openNode(QStringLiteral("local"));
    ASSERT_TRUE(test::waitUntil([&] { return w.session()->isConnected(); }, 60000)) << w.nodeBar()->statusText().toStdString();
    const qint64 agentPid = w.session()->info().agentPid;
    ASSERT_GT(agentPid, 0);
    ASSERT_TRUE(w.configEditor()->openFile(QStringLiteral(TS_SOURCE_DIR "/resources/examples/tiny.yaml")));
    ASSERT_TRUE(test::waitUntil([&] { return w.configEditor()->isValid(); }, 60000));
    w.startRun(w.configEditor()->yaml(), QStringLiteral("doomed"), 500);
    ASSERT_TRUE(test::waitUntil([&] { return w.livePanel()->pointCount() >= 1; }, 120000));

    ::kill(pid_t(agentPid), SIGKILL);
    ASSERT_TRUE(test::waitUntil([&] { return !w.session()->isConnected(); }, 20000));
    EXPECT_TRUE(w.nodeBar()->statusText().contains(QStringLiteral("disconnected"))) << w.nodeBar()->statusText().toStdString();
    const LiveRun* run = w.runs()->run(w.lastRunId());
    ASSERT_NE(run, nullptr);
    EXPECT_EQ(run->status, QStringLiteral("unknown"));
    EXPECT_TRUE(run->reason.contains(QStringLiteral("lost contact"))) << run->reason.toStdString();
    // Still responsive: a timer fires, a click-through to another tab works.
    bool fired = false;
    QTimer::singleShot(50, [&] { fired = true; });
    EXPECT_TRUE(test::waitUntil([&] { return fired; }, 2000));
    w.showTab(QStringLiteral("Memory"));
    EXPECT_EQ(w.panels()->tabText(w.panels()->currentIndex()), QStringLiteral("Memory"));
    // And it reconnects to a fresh agent.
    w.nodeBar()->openNode(QStringLiteral("local"));
    EXPECT_TRUE(test::waitUntil([&] { return w.session()->isConnected(); }, 60000));
}
