// LivePanel and AnalysisPanels (panels.h).
#include "gui/app/panels.h"

#include <algorithm>
#include <cmath>

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QAreaSeries>
#include <QChart>
#include <QChartView>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QHorizontalBarSeries>
#include <QHorizontalStackedBarSeries>
#include <QBarSeries>
#include <QLineSeries>
#include <QScatterSeries>
#include <QSplitter>
#include <QStackedBarSeries>
#include <QValueAxis>
#include <QVBoxLayout>

#include "gui/app/counter_panels.h"
#include "gui/core/format.h"
#include "profiler/import/kernel_names.h"

namespace ts::gui {

using nlohmann::json;

namespace {

QColor categoryColor(const QString& category) {
    static const std::map<QString, QColor> colors = {
        {"Gemm", QColor(66, 133, 244)},       {"Attention", QColor(0, 172, 193)}, {"Norm", QColor(124, 179, 66)},
        {"Elementwise", QColor(251, 188, 5)}, {"Softmax", QColor(255, 112, 67)},  {"Embedding", QColor(171, 71, 188)},
        {"Loss", QColor(141, 110, 99)},       {"Optimizer", QColor(120, 144, 156)}, {"Collective", QColor(234, 67, 53)},
        {"P2P", QColor(233, 30, 99)},         {"Memcpy", QColor(158, 158, 158)}, {"Memset", QColor(189, 189, 189)}};
    auto it = colors.find(category);
    return it == colors.end() ? QColor(97, 97, 97) : it->second;
}

// A step axis lo..hi with ticks on whole steps only ("1 2 3 4", never "1 1 2 3 4").
void setStepRange(QValueAxis* a, int lo, int hi) {
    hi = std::max(hi, lo + 1);
    a->setRange(lo, hi);
    a->setLabelFormat(QStringLiteral("%d"));
    if (hi - lo <= 10) {
        a->setTickType(QValueAxis::TicksFixed);
        a->setTickCount(hi - lo + 1);
    } else {
        const int raw = (hi - lo + 9) / 10;
        int step = 1;  // the first of 1 2 5 10 20 50 ... at least `raw`
        for (int p = 1; step < raw; p *= 10)
            for (int m : {1, 2, 5})
                if (step < raw) step = m * p;
        a->setTickType(QValueAxis::TicksDynamic);
        a->setTickAnchor(0);
        a->setTickInterval(step);
    }
}

QValueAxis* valueAxis(const QString& title, double max, const QString& format = QString()) {
    auto* a = new QValueAxis;
    a->setTitleText(title);
    if (format.isEmpty()) {
        setNiceRange(a, max);
    } else {
        a->setRange(0, max > 0 ? max * 1.1 : 1);
        a->setLabelFormat(format);
    }
    return a;
}

}  // namespace

// Ticks at 1-2-5 steps with labels of as many decimals as the step needs ("0 400 800 1200",
// "0 0.05 0.1"), never printf's %g ("1.48e+03").
void setNiceRange(QValueAxis* a, double max) {
    const double top = max > 0 ? max * 1.05 : 1;
    const double raw = top / 4;
    const double p = std::pow(10.0, std::floor(std::log10(raw)));
    double step = 10 * p;
    for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
        if (m * p >= raw) {
            step = m * p;
            break;
        }
    const int n = std::max(1, int(std::ceil(top / step - 1e-9)));
    a->setRange(0, n * step);
    a->setTickCount(n + 1);
    const int decimals = std::clamp(int(std::ceil(-std::log10(step) - 1e-9)) + (std::fmod(step / p, 1.0) > 0 ? 1 : 0), 0, 6);
    a->setLabelFormat(QStringLiteral("%.%1f").arg(decimals));
}

void clearChart(QChart* chart) {
    chart->removeAllSeries();
    for (auto* a : chart->axes()) chart->removeAxis(a);
}

void setBarAxes(QChart* chart, QAbstractBarSeries* series, const QStringList& labels, const QString& valueTitle, double max) {
    chart->addSeries(series);
    const bool horizontal = qobject_cast<QHorizontalBarSeries*>(series) || qobject_cast<QHorizontalStackedBarSeries*>(series);
    auto* categories = new QBarCategoryAxis;
    categories->append(labels);
    chart->addAxis(categories, horizontal ? Qt::AlignLeft : Qt::AlignBottom);
    series->attachAxis(categories);
    auto* values = valueAxis(valueTitle, max);
    chart->addAxis(values, horizontal ? Qt::AlignBottom : Qt::AlignLeft);
    series->attachAxis(values);
}

QChartView* makeChartView(const QString& title, QWidget* parent) {
    auto* chart = new QChart;
    chart->setTitle(title);
    chart->setAnimationOptions(QChart::NoAnimation);
    chart->legend()->setAlignment(Qt::AlignBottom);
    chart->setMargins(QMargins(4, 4, 4, 4));
    auto* view = new QChartView(chart, parent);
    view->setRenderHint(QPainter::Antialiasing);
    view->setMinimumHeight(160);
    return view;
}

// ---- Live ---------------------------------------------------------------------------------

LivePanel::LivePanel(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    auto* top = new QHBoxLayout;
    m_progress = new QProgressBar(this);
    m_progress->setObjectName(QStringLiteral("liveProgress"));
    m_progress->setFormat(QStringLiteral("step %v of %m"));
    m_status = new QLabel(QStringLiteral("No run yet: pick a config and press Run."), this);
    m_status->setObjectName(QStringLiteral("liveStatus"));
    m_status->setWordWrap(true);
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_stop = new QPushButton(QStringLiteral("Stop"), this);
    m_stop->setObjectName(QStringLiteral("stopButton"));
    m_stop->setEnabled(false);
    top->addWidget(m_progress, 1);
    top->addWidget(m_stop);
    layout->addLayout(top);
    layout->addWidget(m_status);
    auto* grid = new QGridLayout;
    m_loss = makeChart(QStringLiteral("Loss"), QStringLiteral("loss"), QStringLiteral("Training loss of each step (lm cross entropy)."));
    m_time = makeChart(QStringLiteral("Step time"), QStringLiteral("s"), QStringLiteral("Wall time of each iteration, forward + backward + optimizer, all microbatches."));
    m_tokens = makeChart(QStringLiteral("Tokens/s"), QStringLiteral("tokens/s"), QStringLiteral("global batch tokens / step time."));
    m_tflops = makeChart(QStringLiteral("Model TFLOP/s per device and MFU"), QStringLiteral("TFLOP/s"),
                         QStringLiteral("model TFLOP/s per device = model FLOPs per step / step time / world size / 1e12 "
                                        "(Megatron's 'TFLOP/s/GPU'); MFU = that / the device's peak TFLOP/s."));
    m_memory = makeChart(QStringLiteral("Peak memory"), QStringLiteral("GiB"), QStringLiteral("Peak bytes held by the tracked allocator, max over ranks, at each step."));
    grid->addWidget(m_loss.view, 0, 0);
    grid->addWidget(m_time.view, 0, 1);
    grid->addWidget(m_tokens.view, 0, 2);
    grid->addWidget(m_tflops.view, 1, 0, 1, 2);
    grid->addWidget(m_memory.view, 1, 2);
    layout->addLayout(grid, 1);
    // MFU on a second axis of the TFLOP/s chart.
    m_tflops.series2 = new QLineSeries;
    m_tflops.series2->setName(QStringLiteral("MFU"));
    m_tflops.view->chart()->addSeries(m_tflops.series2);
    m_tflops.y2 = valueAxis(QStringLiteral("MFU %"), 1);
    m_tflops.view->chart()->addAxis(m_tflops.y2, Qt::AlignRight);
    m_tflops.series2->attachAxis(m_tflops.x);
    m_tflops.series2->attachAxis(m_tflops.y2);
    m_tflops.series->setName(QStringLiteral("TFLOP/s per device"));
    connect(m_stop, &QPushButton::clicked, this, &LivePanel::stopRequested);
}

LivePanel::Chart LivePanel::makeChart(const QString& title, const QString& yTitle, const QString& tooltip) {
    Chart c;
    c.view = makeChartView(title, this);
    c.view->setToolTip(tooltip);
    c.series = new QLineSeries;
    c.series->setPointsVisible(true);
    c.view->chart()->addSeries(c.series);
    c.view->chart()->legend()->setVisible(false);
    c.x = valueAxis(QStringLiteral("step"), 1, QStringLiteral("%d"));
    setStepRange(c.x, 1, 2);
    c.y = valueAxis(yTitle, 1);
    c.view->chart()->addAxis(c.x, Qt::AlignBottom);
    c.view->chart()->addAxis(c.y, Qt::AlignLeft);
    c.series->attachAxis(c.x);
    c.series->attachAxis(c.y);
    return c;
}

void LivePanel::append(Chart& c, double x, double y, double y2) {
    if (std::isfinite(y)) {
        c.series->append(x, y);
        c.yMax = std::max(c.yMax, y);
        setNiceRange(c.y, c.yMax);
    }
    setStepRange(c.x, int(std::min(1.0, x)), int(std::max(x, double(std::max(m_total, 2)))));
    if (c.series2 && std::isfinite(y2)) {
        c.series2->append(x, y2);
        c.y2Max = std::max(c.y2Max, y2);
        setNiceRange(c.y2, c.y2Max);
    }
}

void LivePanel::startRun(const LiveRun& run) {
    m_points = 0;
    m_total = run.totalSteps;
    for (Chart* c : {&m_loss, &m_time, &m_tokens, &m_tflops, &m_memory}) {
        c->series->clear();
        if (c->series2) c->series2->clear();
        c->yMax = c->y2Max = 0;
    }
    m_progress->setRange(0, std::max(1, run.totalSteps));
    m_progress->setValue(0);
    m_status->setText(QStringLiteral("<b>%1</b> running on %2 (run %3)").arg(run.name.toHtmlEscaped(), run.node.toHtmlEscaped(), run.id));
    m_status->setStyleSheet(QString());
    m_stop->setEnabled(true);
}

void LivePanel::addPoint(const StepPoint& p) {
    ++m_points;
    if (p.step > m_total) {
        m_total = p.step;
        m_progress->setRange(0, m_total);
    }
    m_progress->setValue(p.step);
    append(m_loss, p.step, p.loss);
    append(m_time, p.step, p.stepTimeS);
    append(m_tokens, p.step, p.tokensPerS);
    append(m_tflops, p.step, p.modelTflops, p.mfu > 0 ? p.mfu * 100 : NAN);
    append(m_memory, p.step, p.peakMemoryBytes / double(1 << 30));
}

void LivePanel::finish(const QString& status, const QString& reason) {
    m_stop->setEnabled(false);
    const bool bad = status != QLatin1String("completed");
    m_status->setText(QStringLiteral("%1 — <b>%2</b>%3").arg(m_status->text().section(QStringLiteral(" — "), 0, 0), status.toHtmlEscaped(),
                                                            reason.isEmpty() ? QString() : QStringLiteral(": ") + reason.toHtmlEscaped()));
    m_status->setStyleSheet(bad ? QStringLiteral("color: #b00020") : QString());
}

// ---- analysis panels ------------------------------------------------------------------------

AnalysisPanels::AnalysisPanels(QWidget* parent) : QTabWidget(parent) {
    m_breakdown = makeChartView(QStringLiteral("Step time per rank"), this);
    m_bubbles = makeChartView(QStringLiteral("Pipeline bubble per stage"), this);
    m_comm = makeChartView(QStringLiteral("Communication: exposed vs overlapped"), this);
    m_memoryPage = new QWidget(this);
    auto* memLayout = new QVBoxLayout(m_memoryPage);
    auto* memTop = new QHBoxLayout;
    m_memoryRank = new QComboBox(m_memoryPage);
    memTop->addWidget(new QLabel(QStringLiteral("Rank"), m_memoryPage));
    memTop->addWidget(m_memoryRank);
    memTop->addStretch(1);
    memLayout->addLayout(memTop);
    m_memory = makeChartView(QStringLiteral("Memory over time"), m_memoryPage);
    memLayout->addWidget(m_memory, 1);
    m_kernelPage = new QWidget(this);
    auto* kLayout = new QHBoxLayout(m_kernelPage);
    m_categories = makeChartView(QStringLiteral("Kernel time by category (all ranks)"), m_kernelPage);
    m_kernels = new QTableWidget(m_kernelPage);
    m_kernels->setColumnCount(6);
    m_kernels->setHorizontalHeaderLabels({QStringLiteral("Kernel (rank 0)"), QStringLiteral("Category"), QStringLiteral("Count"),
                                          QStringLiteral("Total"), QStringLiteral("% time"), QStringLiteral("Achieved")});
    m_kernels->horizontalHeaderItem(4)->setToolTip(QStringLiteral("Share of this rank's kernel time"));
    m_kernels->horizontalHeaderItem(5)->setToolTip(QStringLiteral("Achieved FLOP/s, where the kernel's FLOPs are known"));
    // The name gets what the numbers leave: one line each, cut at the end (the full name is the
    // tooltip); the numeric columns fit their contents.
    m_kernels->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_kernels->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
    m_kernels->setWordWrap(false);
    m_kernels->setTextElideMode(Qt::ElideRight);
    m_kernels->verticalHeader()->hide();
    m_kernels->setEditTriggers(QAbstractItemView::NoEditTriggers);
    kLayout->addWidget(m_categories, 2);
    kLayout->addWidget(m_kernels, 3);
    m_mfu = new QLabel(this);
    m_mfu->setObjectName(QStringLiteral("mfuText"));
    m_mfu->setWordWrap(true);
    m_mfu->setAlignment(Qt::AlignTop | Qt::AlignLeft);
    m_mfu->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_mfu->setMargin(10);
    addTab(m_breakdown, QStringLiteral("Breakdown"));
    addTab(m_bubbles, QStringLiteral("Bubbles"));
    addTab(m_comm, QStringLiteral("Communication"));
    addTab(m_memoryPage, QStringLiteral("Memory"));
    addTab(m_kernelPage, QStringLiteral("Kernels"));
    addTab(m_mfu, QStringLiteral("MFU"));
    // The model counters' tabs exist for every run but show only for one that recorded them:
    // most runs are dense and not FP8, and two tabs that always say "nothing here" are noise.
    m_moe = new MoePanel(this);
    m_fp8 = new Fp8Panel(this);
    setTabVisible(addTab(m_moe, QStringLiteral("MoE routing")), false);
    setTabVisible(addTab(m_fp8, QStringLiteral("FP8")), false);
    connect(m_memoryRank, &QComboBox::activated, this, [this](int) { loadMemory(m_memoryRank->currentData().toInt()); });
    // What the run's numbers are not (ranks that shared GPUs, collectives held by the host): on
    // every tab, in the tab bar's corner, the sentences in its tooltip and on the MFU tab.
    m_caution = new QLabel(this);
    m_caution->setObjectName(QStringLiteral("runCaution"));
    m_caution->setStyleSheet(QStringLiteral("QLabel { color: #8a4b00; font-weight: bold; padding: 0 8px; }"));
    m_caution->hide();
    setCornerWidget(m_caution, Qt::TopRightCorner);
}

QWidget* AnalysisPanels::page(const QString& name) const {
    for (int i = 0; i < count(); ++i)
        if (tabText(i) == name) return widget(i);
    return nullptr;
}

bool AnalysisPanels::isPageShown(const QString& name) const {
    QWidget* w = page(name);
    return w && isTabVisible(indexOf(w));
}

void AnalysisPanels::setRunFile(const QString& runFile) {
    m_runFile = runFile;
    m_doc = json();
    const std::string path = runFile.toStdString();
    runJob<Result<json>>(this, m_analysisJob, [path] { return analyzeRunFile(path); }, [this, runFile](Result<json> r) {
        if (!r) {
            m_mfu->setText(QStringLiteral("<span style='color:#b00020'>analysis of %1 failed: %2</span>")
                               .arg(runFile.toHtmlEscaped(), QString::fromStdString(r.status().message()).toHtmlEscaped()));
            setTabVisible(indexOf(m_moe), false);
            setTabVisible(indexOf(m_fp8), false);
            emit analysisFailed(runFile, QString::fromStdString(r.status().message()));
            return;
        }
        m_doc = std::move(r).value();
        rebuild();
        // Not in rebuild(): the sections are the whole run's, a selected step does not change them.
        m_moe->setView(moeViewOf(m_doc));
        m_fp8->setView(fp8ViewOf(m_doc));
        setTabVisible(indexOf(m_moe), m_moe->view().present);
        setTabVisible(indexOf(m_fp8), m_fp8->view().present);
        m_memoryRank->clear();
        for (const auto& rk : m_doc.value("ranks", json::array()))
            m_memoryRank->addItem(QStringLiteral("rank %1").arg(rk.value("rank", 0)), rk.value("rank", 0));
        loadMemory(m_memoryRank->count() ? m_memoryRank->itemData(0).toInt() : 0);
        emit analysisReady(runFile);
    });
}

void AnalysisPanels::setStep(int step) {
    m_step = step;
    if (!m_doc.is_null()) rebuild();
}

void AnalysisPanels::rebuild() {
    m_summary = summarizeAnalysis(m_doc, m_step);
    const AnalysisSummary& s = m_summary;
    QStringList cautions;
    for (const QString& c : s.caveats) cautions << c;
    m_caution->setText(cautions.isEmpty() ? QString()
                       : cautions.size() == 1 ? QStringLiteral("\u26A0 Caution (hover; MFU tab)")
                                              : QStringLiteral("\u26A0 %1 cautions (hover; MFU tab)").arg(cautions.size()));
    m_caution->setToolTip(cautions.join(QStringLiteral("\n\n")));
    m_caution->setVisible(!cautions.isEmpty());
    const QString stepsText = s.steps.empty() ? QStringLiteral("no steps")
                              : m_step >= 0 ? QStringLiteral("step %1").arg(m_step)
                                            : QStringLiteral("mean of steps %1–%2").arg(s.steps.front()).arg(s.steps.back());

    // Step time per rank: compute | exposed comm | other idle (stacked, ms).
    {
        QChart* chart = m_breakdown->chart();
        clearChart(chart);
        chart->setTitle(QStringLiteral("Step time per rank (%1)").arg(stepsText));
        auto* series = new QStackedBarSeries;
        auto* compute = new QBarSet(QStringLiteral("compute stream busy"));
        auto* exposed = new QBarSet(QStringLiteral("exposed communication"));
        auto* idle = new QBarSet(QStringLiteral("other idle (pipeline wait, host)"));
        compute->setColor(QColor(66, 133, 244));
        exposed->setColor(QColor(234, 67, 53));
        idle->setColor(QColor(189, 189, 189));
        QStringList labels;
        double maxMs = 0;
        for (const auto& r : s.ranks) {
            *compute << r.computeS * 1e3;
            *exposed << r.exposedCommS * 1e3;
            *idle << r.idleS * 1e3;
            labels << QStringLiteral("r%1 (pp%2)").arg(r.rank).arg(r.stage);
            maxMs = std::max(maxMs, r.stepS * 1e3);
        }
        series->append(compute);
        series->append(exposed);
        series->append(idle);
        setBarAxes(chart, series, labels, QStringLiteral("ms"), maxMs);
        m_breakdown->setToolTip(QStringLiteral("<b>compute stream busy</b> = step_time − bubble<br><b>bubble</b>: %1<br>"
                                               "<b>exposed communication</b>: %2<br><b>other idle</b> = bubble − exposed communication")
                                    .arg(s.definition(QStringLiteral("bubble_s")).toHtmlEscaped(),
                                         s.definition(QStringLiteral("exposed_comm_s")).toHtmlEscaped()));
    }
    // Bubble per stage: measured next to theory.
    {
        QChart* chart = m_bubbles->chart();
        clearChart(chart);
        chart->setTitle(QStringLiteral("Pipeline bubble per stage (%1)").arg(stepsText));
        auto* series = new QBarSeries;
        auto* measured = new QBarSet(QStringLiteral("measured bubble fraction"));
        auto* theory = new QBarSet(QStringLiteral("theory (p−1)/(v·m + p−1)"));
        measured->setColor(QColor(234, 67, 53));
        theory->setColor(QColor(158, 158, 158));
        QStringList labels;
        double maxPct = 0;
        for (const auto& b : s.stages) {
            *measured << b.fraction * 100;
            *theory << b.theory * 100;
            labels << QStringLiteral("stage %1").arg(b.stage);
            maxPct = std::max({maxPct, b.fraction * 100, b.theory * 100});
        }
        series->append(measured);
        series->append(theory);
        setBarAxes(chart, series, labels, QStringLiteral("% of step"), std::max(maxPct, 1.0));
        m_bubbles->setToolTip(QStringLiteral("<b>bubble</b>: %1<br><b>fraction</b>: %2<br><b>theory</b>: %3")
                                  .arg(s.definition(QStringLiteral("bubble_s")).toHtmlEscaped(),
                                       s.definition(QStringLiteral("bubble_fraction")).toHtmlEscaped(),
                                       s.definition(QStringLiteral("bubble_fraction_theory")).toHtmlEscaped()));
    }
    // Communication per group and kind: exposed vs overlapped (sum over ranks, per step).
    {
        QChart* chart = m_comm->chart();
        clearChart(chart);
        chart->setTitle(QStringLiteral("Communication per group and kind, summed over ranks (%1)").arg(stepsText));
        auto* series = new QHorizontalStackedBarSeries;
        auto* exposed = new QBarSet(QStringLiteral("exposed"));
        auto* overlapped = new QBarSet(QStringLiteral("overlapped by compute"));
        exposed->setColor(QColor(234, 67, 53));
        overlapped->setColor(QColor(129, 199, 132));
        QStringList labels;
        double maxMs = 0;
        const size_t shown = std::min<size_t>(s.comm.size(), 12);
        for (size_t i = shown; i-- > 0;) {  // largest at the top
            const CommRow& c = s.comm[i];
            *exposed << c.exposedS * 1e3;
            *overlapped << c.overlappedS * 1e3;
            labels << QStringLiteral("%1 %2").arg(c.group.isEmpty() ? QStringLiteral("?") : c.group, c.kind);
            maxMs = std::max(maxMs, (c.exposedS + c.overlappedS) * 1e3);
        }
        series->append(exposed);
        series->append(overlapped);
        setBarAxes(chart, series, labels, QStringLiteral("ms per step"), maxMs);
        if (s.comm.empty()) chart->setTitle(chart->title() + QStringLiteral(": none (a single rank moves no data)"));
        m_comm->setToolTip(QStringLiteral("<b>communication</b>: %1<br><b>overlapped</b>: %2<br><b>exposed</b>: %3")
                               .arg(s.definition(QStringLiteral("comm_s")).toHtmlEscaped(),
                                    s.definition(QStringLiteral("overlapped_comm_s")).toHtmlEscaped(),
                                    s.definition(QStringLiteral("exposed_comm_s")).toHtmlEscaped()));
    }
    // Kernel time by category and the top kernels of rank 0.
    {
        QChart* chart = m_categories->chart();
        clearChart(chart);
        auto* series = new QHorizontalBarSeries;
        auto* set = new QBarSet(QStringLiteral("kernel time"));
        set->setColor(QColor(66, 133, 244));
        QStringList labels;
        double maxMs = 0;
        for (size_t i = std::min<size_t>(s.categories.size(), 14); i-- > 0;) {
            *set << s.categories[i].totalS * 1e3;
            labels << s.categories[i].category;
            maxMs = std::max(maxMs, s.categories[i].totalS * 1e3);
        }
        series->append(set);
        setBarAxes(chart, series, labels, QStringLiteral("ms (whole trace)"), maxMs);
        chart->legend()->setVisible(false);
        m_categories->setToolTip(QStringLiteral("Device-stream kernel time by category, summed over ranks and the whole trace."));
        m_kernels->horizontalHeaderItem(0)->setText(QStringLiteral("Kernel (rank %1)").arg(s.topKernelsRank));
        m_kernels->setRowCount(int(s.topKernels.size()));
        for (int i = 0; i < int(s.topKernels.size()); ++i) {
            const KernelRow& k = s.topKernels[size_t(i)];
            auto item = [](const QString& t) { return new QTableWidgetItem(t); };
            m_kernels->setItem(i, 0, item(QString::fromStdString(profiler::import::kernelShortName(k.name.toStdString()))));
            m_kernels->item(i, 0)->setToolTip(k.name);
            m_kernels->setItem(i, 1, item(k.category));
            m_kernels->setItem(i, 2, item(QString::number(int64_t(k.count))));
            m_kernels->setItem(i, 3, item(formatDurationNs(k.totalS * 1e9)));
            m_kernels->setItem(i, 4, item(QString::number(k.pct, 'f', 1)));
            m_kernels->setItem(i, 5, item(k.flops > 0 && k.totalS > 0 ? formatFlopRate(k.flops / k.totalS) : QString()));
            m_kernels->item(i, 0)->setForeground(categoryColor(k.category).darker(130));
        }
    }
    // MFU with its formula.
    {
        QString html;
        for (const QString& c : s.caveats)
            html += QStringLiteral("<p style='color:#8a4b00'><b>Caution:</b> %1</p>").arg(c.toHtmlEscaped());
        html += QStringLiteral("<h3>MFU %1</h3>").arg(std::isnan(s.mfu) ? QStringLiteral("unknown (no peak for this device)") : formatPercent(s.mfu));
        html += QStringLiteral("<p>%1, %2</p>").arg(stepsText, s.steps.empty() ? QString() : QStringLiteral("step time %1").arg(formatDurationNs(s.stepTimeS * 1e9)));
        html += QStringLiteral("<table cellspacing=4>");
        auto row = [&html](const QString& k, const QString& v) { html += QStringLiteral("<tr><td><b>%1</b></td><td>%2</td></tr>").arg(k, v); };
        row(QStringLiteral("model TFLOP/s (job)"), QString::number(s.modelTflops, 'f', 3));
        row(QStringLiteral("model TFLOP/s per device"), QString::number(s.modelTflopsPerDevice, 'f', 3));
        row(QStringLiteral("peak TFLOP/s per device"), std::isnan(s.peakTflopsPerDevice) ? QStringLiteral("unknown") : QString::number(s.peakTflopsPerDevice, 'f', 3));
        row(QStringLiteral("peak from"), s.peakSource.toHtmlEscaped());
        row(QStringLiteral("device · dtype"), (s.device + QStringLiteral(" · ") + s.dtype).toHtmlEscaped());
        row(QStringLiteral("world size"), QString::number(s.worldSize));
        html += QStringLiteral("</table>");
        html += QStringLiteral("<p><b>MFU</b> = %1</p>").arg(s.definition(QStringLiteral("mfu")).toHtmlEscaped());
        html += QStringLiteral("<p><b>model TFLOP/s</b> = %1</p>").arg(s.definition(QStringLiteral("model_tflops")).toHtmlEscaped());
        html += QStringLiteral("<p><b>Model FLOPs per step</b> (%1):<br><code>%2</code></p>")
                    .arg(s.flopsSource.toHtmlEscaped(), s.flopsFormula.toHtmlEscaped().replace(QLatin1Char('\n'), QStringLiteral("<br>")));
        m_mfu->setText(html);
    }
}

void AnalysisPanels::loadMemory(int rank) {
    const std::string path = m_runFile.toStdString();
    runJob<Result<json>>(this, m_memoryJob, [path, rank] { return memorySeries(path, rank); }, [this](Result<json> r) {
        if (!r) {
            m_memory->chart()->setTitle(QStringLiteral("Memory: %1").arg(QString::fromStdString(r.status().message())));
            return;
        }
        buildMemoryChart(*r);
        emit memoryReady();
    });
}

void AnalysisPanels::buildMemoryChart(const json& m) {
    QChart* chart = m_memory->chart();
    clearChart(chart);
    const json cats = m.value("categories", json::array());
    const json ts = m.value("ts_ns", json::array());
    const json bytes = m.value("bytes", json::array());
    const int rank = m.value("rank", 0);
    if (ts.empty()) {
        chart->setTitle(QStringLiteral("Memory of rank %1: no memory counters in this trace").arg(rank));
        return;
    }
    const double t0 = ts.front().get<double>();
    static const QColor colors[] = {QColor(66, 133, 244), QColor(251, 188, 5), QColor(171, 71, 188), QColor(52, 168, 83),
                                    QColor(255, 112, 67), QColor(0, 172, 193), QColor(120, 144, 156)};
    auto* x = valueAxis(QStringLiteral("ms since the first sample"), (ts.back().get<double>() - t0) / 1e6);
    double maxGiB = 0;
    std::vector<double> below(ts.size(), 0.0);
    QLineSeries* lower = nullptr;
    for (size_t c = 0; c < cats.size(); ++c) {
        auto* upper = new QLineSeries;
        auto* low = new QLineSeries;
        for (size_t i = 0; i < ts.size(); ++i) {
            const double tms = (ts[i].get<double>() - t0) / 1e6;
            const double v = bytes[i].size() > c ? bytes[i][c].get<double>() / double(1 << 30) : 0.0;
            low->append(tms, below[i]);
            below[i] += v;
            upper->append(tms, below[i]);
            maxGiB = std::max(maxGiB, below[i]);
        }
        auto* area = new QAreaSeries(upper, low);
        area->setName(QString::fromStdString(cats[c].get<std::string>()));
        area->setColor(colors[c % 7]);
        area->setBorderColor(colors[c % 7].darker(120));
        chart->addSeries(area);
        lower = low;
    }
    (void)lower;
    const json peak = m.value("peak", json::object());
    auto* marker = new QScatterSeries;
    const double peakGiB = peak.value("bytes", 0.0) / double(1 << 30);
    marker->setName(QStringLiteral("peak %1").arg(formatBytes(peak.value("bytes", 0.0))));
    marker->append((peak.value("ts_ns", 0.0) - t0) / 1e6, peakGiB);
    marker->setMarkerSize(11);
    marker->setColor(QColor(176, 0, 32));
    chart->addSeries(marker);
    auto* y = valueAxis(QStringLiteral("GiB"), maxGiB);
    chart->addAxis(x, Qt::AlignBottom);
    chart->addAxis(y, Qt::AlignLeft);
    for (auto* s : chart->series()) {
        s->attachAxis(x);
        s->attachAxis(y);
    }
    // What the total is: the engine's categories stacked, or the one allocator view of an
    // imported trace (its reserved memory is a different measure, never stacked on top).
    const QString measure = QString::fromStdString(m.value("measure", std::string()));
    if (cats.size() > 1 || measure.isEmpty() || measure.startsWith(QLatin1String("sum")))
        chart->setTitle(QStringLiteral("Memory of rank %1 over time, stacked by category (peak %2)").arg(rank).arg(formatBytes(peak.value("bytes", 0.0))));
    else
        chart->setTitle(QStringLiteral("Memory of rank %1 over time: %2 (peak %3)").arg(rank).arg(measure).arg(formatBytes(peak.value("bytes", 0.0))));
    m_memory->setToolTip(m_summary.definition(QStringLiteral("peak_memory_bytes")));
}

}  // namespace ts::gui
