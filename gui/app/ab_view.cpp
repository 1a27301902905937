// AbView (ab_view.h).
#include "gui/app/ab_view.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QHeaderView>
#include <QHorizontalBarSeries>
#include <QSplitter>
#include <QValueAxis>

#include "gui/app/panels.h"
#include "gui/core/format.h"

namespace ts::gui {

using nlohmann::json;

namespace {
QString metricValue(const json& m, double v) {
    const std::string unit = m.value("unit", std::string());
    if (unit == "s") return formatDurationNs(v * 1e9);
    if (unit == "bytes") return formatBytes(v);
    if (m.value("name", std::string()).find("fraction") != std::string::npos || m.value("name", std::string()) == "mfu") return formatPercent(v);
    return QString::number(v, 'g', 4) + (unit.empty() ? QString() : QStringLiteral(" ") + QString::fromStdString(unit));
}
}  // namespace

AbView::AbView(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    m_title = new QLabel(QStringLiteral("Rerun a run with changed knobs, or select two runs and press Compare."), this);
    m_title->setWordWrap(true);
    layout->addWidget(m_title);
    // Top left: what changed, then what differs; top right: where time moved; below: both
    // timelines on one axis.
    auto* split = new QSplitter(Qt::Vertical, this);
    auto* top = new QSplitter(Qt::Horizontal, split);
    auto* tables = new QSplitter(Qt::Vertical, top);
    m_knobs = new QTableWidget(tables);
    m_knobs->setObjectName(QStringLiteral("abKnobs"));
    m_knobs->setColumnCount(3);
    m_knobs->setHorizontalHeaderLabels({QStringLiteral("Changed knob"), QStringLiteral("A"), QStringLiteral("B")});
    m_knobs->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_knobs->horizontalHeader()->setStretchLastSection(true);
    m_knobs->verticalHeader()->hide();
    m_knobs->verticalHeader()->setDefaultSectionSize(m_knobs->fontMetrics().height() + 6);
    m_knobs->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_metrics = new QTableWidget(tables);
    m_metrics->setObjectName(QStringLiteral("abMetrics"));
    m_metrics->setColumnCount(6);
    m_metrics->setHorizontalHeaderLabels({QStringLiteral("Metric"), QStringLiteral("Scope"), QStringLiteral("A"), QStringLiteral("B"),
                                          QStringLiteral("Δ"), QStringLiteral("Better")});
    m_metrics->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_metrics->horizontalHeader()->setStretchLastSection(true);
    m_metrics->verticalHeader()->hide();
    m_metrics->verticalHeader()->setDefaultSectionSize(m_metrics->fontMetrics().height() + 6);
    m_metrics->setEditTriggers(QAbstractItemView::NoEditTriggers);
    tables->addWidget(m_knobs);
    tables->addWidget(m_metrics);
    tables->setStretchFactor(0, 1);
    tables->setStretchFactor(1, 3);
    m_moved = makeChartView(QStringLiteral("Where time moved, ms per step"), top);
    m_moved->setMinimumWidth(300);
    // The legend sits at the right: below, it would take the rows' height.
    m_moved->chart()->legend()->setAlignment(Qt::AlignRight);
    top->addWidget(tables);
    top->addWidget(m_moved);
    top->setStretchFactor(0, 3);
    top->setStretchFactor(1, 2);
    auto* timelines = new QWidget(split);
    m_timelineArea = new QVBoxLayout(timelines);
    m_timelineArea->setContentsMargins(0, 0, 0, 0);
    split->addWidget(top);
    split->addWidget(timelines);
    split->setStretchFactor(0, 1);
    split->setStretchFactor(1, 1);
    layout->addWidget(split, 1);
}

void AbView::compare(const QString& runFileA, const QString& runFileB) {
    m_a = runFileA;
    m_b = runFileB;
    m_done = 0;
    m_comparison = json();
    m_title->setText(QStringLiteral("Comparing…"));
    const std::string a = runFileA.toStdString(), b = runFileB.toStdString();
    runJob<Result<json>>(this, m_cmpJob, [a, b] { return compareRunFiles(a, b); }, [this](Result<json> r) {
        ++m_done;
        if (!r) {
            m_title->setText(QStringLiteral("<span style='color:#b00020'>compare failed: %1</span>").arg(QString::fromStdString(r.status().message()).toHtmlEscaped()));
            if (m_done == 3) emit comparisonReady();
            return;
        }
        m_comparison = *r;
        const json& ja = m_comparison["a"];
        const json& jb = m_comparison["b"];
        m_title->setText(QStringLiteral("<b>A</b> %1 <small>(%2)</small> &nbsp; vs &nbsp; <b>B</b> %3 <small>(%4)</small>")
                             .arg(QString::fromStdString(ja.value("name", std::string())).toHtmlEscaped(), QString::fromStdString(ja.value("id", std::string())),
                                  QString::fromStdString(jb.value("name", std::string())).toHtmlEscaped(), QString::fromStdString(jb.value("id", std::string()))));
        const json knobs = m_comparison.value("knobs", json::array());
        m_knobs->setRowCount(int(knobs.size()));
        for (int i = 0; i < int(knobs.size()); ++i) {
            m_knobs->setItem(i, 0, new QTableWidgetItem(QString::fromStdString(knobs[size_t(i)].value("knob", std::string()))));
            m_knobs->setItem(i, 1, new QTableWidgetItem(QString::fromStdString(knobs[size_t(i)].value("a", std::string()))));
            m_knobs->setItem(i, 2, new QTableWidgetItem(QString::fromStdString(knobs[size_t(i)].value("b", std::string()))));
        }
        // Only what differs: metrics within the noise threshold ("=") are left out.
        std::vector<json> shown;
        for (const auto& m : m_comparison.value("metrics", json::array()))
            if (m.value("better", std::string()) != "=") shown.push_back(m);
        m_metrics->setRowCount(int(shown.size()));
        for (int i = 0; i < int(shown.size()); ++i) {
            const json& m = shown[size_t(i)];
            const double a = m.value("a", 0.0), b = m.value("b", 0.0), rel = m.value("relative", 0.0);
            const std::string better = m.value("better", std::string());
            m_metrics->setItem(i, 0, new QTableWidgetItem(QString::fromStdString(m.value("name", std::string()))));
            m_metrics->setItem(i, 1, new QTableWidgetItem(QString::fromStdString(m.value("scope", std::string()))));
            m_metrics->setItem(i, 2, new QTableWidgetItem(metricValue(m, a)));
            m_metrics->setItem(i, 3, new QTableWidgetItem(metricValue(m, b)));
            auto* delta = new QTableWidgetItem(QStringLiteral("%1%2%").arg(rel >= 0 ? QStringLiteral("+") : QString()).arg(rel * 100, 0, 'f', 1));
            auto* verdict = new QTableWidgetItem(better == "B" ? QStringLiteral("B better") : QStringLiteral("B worse"));
            const QColor c = better == "B" ? QColor(27, 127, 59) : QColor(176, 0, 32);
            delta->setForeground(c);
            verdict->setForeground(c);
            m_metrics->setItem(i, 4, delta);
            m_metrics->setItem(i, 5, verdict);
        }
        if (m_done == 3) {
            buildMoved();
            emit comparisonReady();
        }
    });
    auto analyze = [this](JobGeneration& gen, const std::string& path, bool isA) {
        runJob<Result<json>>(this, gen, [path] { return analyzeRunFile(path); }, [this, isA](Result<json> r) {
            ++m_done;
            AnalysisSummary s = r ? summarizeAnalysis(*r) : AnalysisSummary{};
            (isA ? m_sa : m_sb) = std::move(s);
            if (m_done == 3) {
                buildMoved();
                emit comparisonReady();
            }
        });
    };
    analyze(m_aJob, a, true);
    analyze(m_bJob, b, false);
}

void AbView::buildMoved() {
    QChart* chart = m_moved->chart();
    clearChart(chart);
    // Kernel categories (whole trace, divided by the number of steps) and exposed comm per group.
    auto perStep = [](const AnalysisSummary& s, double total) {
        return total / std::max(1, s.stepsInTrace);
    };
    std::set<QString> cats;
    for (const auto& c : m_sa.categories) cats.insert(c.category);
    for (const auto& c : m_sb.categories) cats.insert(c.category);
    std::set<QString> groups;
    for (const auto& [g, v] : m_sa.exposedCommByGroup) groups.insert(g);
    for (const auto& [g, v] : m_sb.exposedCommByGroup) groups.insert(g);
    auto* setA = new QBarSet(QStringLiteral("A"));
    auto* setB = new QBarSet(QStringLiteral("B"));
    setA->setColor(QColor(120, 144, 156));
    setB->setColor(QColor(66, 133, 244));
    QStringList labels;
    double maxMs = 0;
    auto catOf = [](const AnalysisSummary& s, const QString& c) {
        for (const auto& x : s.categories)
            if (x.category == c) return x.totalS;
        return 0.0;
    };
    for (const QString& g : groups) {
        const double a = m_sa.exposedCommByGroup.count(g) ? m_sa.exposedCommByGroup.at(g) * 1e3 : 0.0;
        const double b = m_sb.exposedCommByGroup.count(g) ? m_sb.exposedCommByGroup.at(g) * 1e3 : 0.0;
        *setA << a;
        *setB << b;
        labels << QStringLiteral("exposed comm %1").arg(g);
        maxMs = std::max({maxMs, a, b});
    }
    // The categories whose time moved most (a readable chart in a panel's height).
    std::vector<std::tuple<double, QString, double, double>> moved;
    for (const QString& c : cats) {
        const double a = perStep(m_sa, catOf(m_sa, c)) * 1e3, b = perStep(m_sb, catOf(m_sb, c)) * 1e3;
        moved.emplace_back(std::fabs(b - a), c, a, b);
    }
    std::sort(moved.begin(), moved.end(), [](const auto& x, const auto& y) { return std::get<0>(x) > std::get<0>(y); });
    // Rows stay readable in the panel's height (QtCharts hides category labels that do not
    // fit): at most 7 rows in all.
    const size_t room = groups.size() >= 7 ? 0 : 7 - groups.size();
    if (moved.size() > std::min<size_t>(room, 5)) moved.resize(std::min<size_t>(room, 5));
    for (const auto& [d, c, a, b] : moved) {
        *setA << a;
        *setB << b;
        labels << c;
        maxMs = std::max({maxMs, a, b});
    }
    auto* series = new QHorizontalBarSeries;
    series->append(setA);
    series->append(setB);
    setBarAxes(chart, series, labels, QString(), maxMs);
    for (auto* axis : chart->axes()) {
        QFont f = axis->labelsFont();
        f.setPointSizeF(f.pointSizeF() * 0.85);
        axis->setLabelsFont(f);
    }
    m_moved->setToolTip(QStringLiteral("Kernel time per category: summed over ranks, whole trace divided by the number of steps.\n"
                                       "Exposed communication per group: %1, summed over ranks, mean per step (after warm-up).")
                            .arg(m_sa.definition(QStringLiteral("exposed_comm_s"))));
}

}  // namespace ts::gui
