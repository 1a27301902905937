// The screenshot tour (`trainscope-gui --tour DIR`, issue #13): drives the real application
// through the user's story on the local node — connect, open tiny.yaml, run it, the timeline,
// each analysis panel (on a pipeline-parallel run), toggle a knob on a dp2 config and rerun,
// the A/B view, the export dialog, the runs browser, an MoE run's routing and an FP8 run's
// scales — and writes one PNG per view into DIR, plus tour.json with what the models held at
// each step. The end-to-end test runs the same tour and asserts on those models.
#pragma once

#include <functional>

#include <QString>
#include <QStringList>

#include <nlohmann/json.hpp>

namespace ts::gui {

class MainWindow;

struct TourOptions {
    QString outDir;
    int stepsTiny = 6;
    int stepsPipeline = 4;
    int stepsDp = 4;
    int stepsModelCounters = 3;  // moe_tiny.yaml and fp8_hybrid.yaml
    int timeoutMs = 180000;   // per wait
    QString knobToToggle = QStringLiteral("overlap_grad_reduce");
};

struct TourResult {
    bool ok = false;
    QString error;               // the first step that failed and why
    QStringList screenshots;     // files written
    nlohmann::json report;       // what the models held (also DIR/tour.json)
};

// Runs the tour on an open window (it must be shown). Blocks, processing events.
TourResult runTour(MainWindow& window, const TourOptions& options);

}  // namespace ts::gui
