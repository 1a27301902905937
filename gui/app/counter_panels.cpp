// MoePanel and Fp8Panel (counter_panels.h).
#include "gui/app/counter_panels.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLineSeries>
#include <QScrollBar>
#include <QSplitter>
#include <QValueAxis>
#include <QVBoxLayout>

#include "gui/app/panels.h"

namespace ts::gui {

namespace {

const QColor kOver(229, 57, 53);     // an expert above its fair share
const QColor kUnder(30, 136, 229);   // below it
const QColor kAux(171, 71, 188);
const QColor kZ(0, 137, 123);

QColor mix(const QColor& a, const QColor& b, double t) {
    t = std::clamp(t, 0.0, 1.0);
    return QColor::fromRgbF(float(a.redF() + (b.redF() - a.redF()) * t), float(a.greenF() + (b.greenF() - a.greenF()) * t),
                            float(a.blueF() + (b.blueF() - a.blueF()) * t));
}

// White at the fair share, red up to twice it, blue down to no tokens. The blue side stays
// paler: an idle expert matters less at a glance than the one every token queues for. Neither
// end gets dark enough to make black text hard to read.
QColor loadColor(double load) {
    if (load >= 1) return mix(Qt::white, kOver, 0.8 * std::min(1.0, load - 1));
    return mix(Qt::white, kUnder, 0.55 * (1 - std::max(0.0, load)));
}

// Token counts are means over steps, so they can have a fraction; whole ones print whole.
QString tokensText(double v) {
    return std::fabs(v - std::round(v)) < 1e-9 ? QString::number(v, 'f', 0) : QString::number(v, 'f', 1);
}

// Losses, amax and scales span orders of magnitude: four significant digits, in exponent form
// only where plain digits would be long ("1e-06", "179.2", "57344", "1.5e+07"). Sorting uses the
// exact value, never this text.
QString sig(double v) {
    const double a = std::fabs(v);
    if (a >= 1e3 && a < 1e6) return QString::number(v, 'f', 0);
    return QString::number(v, 'g', 4);
}

// A table cell that sorts by a number (or any key), not by its text.
class SortItem : public QTableWidgetItem {
public:
    SortItem(const QString& text, double key) : QTableWidgetItem(text) { setData(Qt::UserRole, key); }
    bool operator<(const QTableWidgetItem& other) const override {
        return data(Qt::UserRole).toDouble() < other.data(Qt::UserRole).toDouble();
    }
};

QTableWidgetItem* numberItem(const QString& text, double key) {
    auto* item = new SortItem(text, key);
    item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    return item;
}

}  // namespace

// ---- MoE routing ----------------------------------------------------------------------------

MoePanel::MoePanel(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    auto* top = new QHBoxLayout;
    m_header = new QLabel(this);
    m_header->setObjectName(QStringLiteral("moeHeader"));
    m_header->setWordWrap(true);
    m_header->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_which = new QComboBox(this);
    m_which->setObjectName(QStringLiteral("moeWhich"));
    m_which->addItem(QStringLiteral("mean over steps"));
    m_which->addItem(QStringLiteral("last step"));
    top->addWidget(m_header, 1);
    top->addWidget(m_which);
    layout->addLayout(top);

    m_heat = new QTableWidget(this);
    m_heat->setObjectName(QStringLiteral("moeHeatMap"));
    m_heat->setEditTriggers(QAbstractItemView::NoEditTriggers);
    // No selection highlight: it would paint over the load colours of the row a user is looking
    // at. The layer the bars show is marked in the row header instead.
    m_heat->setSelectionMode(QAbstractItemView::NoSelection);
    m_heat->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_heat->horizontalHeader()->setMinimumSectionSize(44);
    m_heat->verticalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_tokens = makeChartView(QStringLiteral("Tokens per expert"), this);
    m_imbalance = makeChartView(QStringLiteral("Imbalance per layer"), this);
    m_losses = makeChartView(QStringLiteral("Router losses per layer"), this);
    // The heat map across the whole width (experts are columns, there can be many), the charts
    // under it; the splitter lets a model with many layers give the map more height.
    m_split = new QSplitter(Qt::Vertical, this);
    m_split->setChildrenCollapsible(false);
    auto* charts = new QWidget(m_split);
    auto* row = new QHBoxLayout(charts);
    row->setContentsMargins(0, 0, 0, 0);
    row->addWidget(m_tokens, 4);
    row->addWidget(m_imbalance, 3);
    row->addWidget(m_losses, 4);
    m_split->addWidget(m_heat);
    m_split->addWidget(charts);
    m_split->setStretchFactor(0, 0);
    m_split->setStretchFactor(1, 1);
    layout->addWidget(m_split, 1);

    connect(m_which, &QComboBox::activated, this, [this](int i) { showLastStep(i == 1); });
    connect(m_heat, &QTableWidget::currentCellChanged, this, [this](int r, int, int, int) { selectRow(r); });
    rebuild();
}

void MoePanel::setView(MoeView view) {
    m_view = std::move(view);
    m_row = -1;  // the most imbalanced layer of the new run
    m_fitPending = true;
    rebuild();
}

void MoePanel::showEvent(QShowEvent* event) {
    QWidget::showEvent(event);
    fitHeatMap();
}

// The map as tall as its rows (a few layers need little), at most half the tab; the rest goes to
// the charts. Once per run, when shown: what a user dragged the splitter to stays.
void MoePanel::fitHeatMap() {
    if (!m_fitPending || !isVisible()) return;
    m_fitPending = false;
    const QAbstractItemView* view = m_heat;  // QTableView hides its sizeHintForRow
    int rows = 0;
    for (int i = 0; i < m_heat->rowCount(); ++i) rows += std::max(m_heat->verticalHeader()->sectionSizeHint(i), view->sizeHintForRow(i));
    const int want = m_heat->horizontalHeader()->sizeHint().height() + 2 * m_heat->frameWidth() + rows +
                     m_heat->horizontalScrollBar()->sizeHint().height();
    const int total = m_split->height();
    const int heat = std::clamp(want, 60, std::max(60, total / 2));
    m_split->setSizes({heat, std::max(0, total - heat)});
}

void MoePanel::showLastStep(bool last) {
    m_last = last;
    m_which->setCurrentIndex(last ? 1 : 0);
    rebuild();
}

void MoePanel::selectRow(int row) {
    if (row < 0 || row >= m_heat->rowCount() || row == m_row) return;
    m_row = row;
    markRow();
    buildTokensChart();
}

void MoePanel::markRow() {
    for (int i = 0; i < std::min(m_heat->rowCount(), int(m_view.layers.size())); ++i) {
        QTableWidgetItem* h = m_heat->verticalHeaderItem(i);
        if (!h) continue;
        const QString name = QStringLiteral("layer %1").arg(m_view.layers[size_t(i)].layer);
        h->setText(i == m_row ? QStringLiteral("▸ ") + name : name);
        QFont f = h->font();
        f.setBold(i == m_row);
        h->setFont(f);
    }
}

void MoePanel::rebuild() {
    const MoeView& v = m_view;
    const bool last = m_last;
    m_which->setItemText(1, v.lastStep >= 0 ? QStringLiteral("last step (%1)").arg(v.lastStep) : QStringLiteral("last step"));
    const QString def = v.definition.toHtmlEscaped();

    // Header: what is shown, and the worst expert of the run, the first thing a user tuning the
    // router looks for.
    QString html;
    if (!v.present) {
        html = QStringLiteral("This run has no MoE layers (no router counters were recorded).");
    } else if (v.layers.empty()) {
        html = QStringLiteral("This run recorded router counters, but none inside a step: no layer to show.");
    } else {
        html = QStringLiteral("<b>%1 MoE layer%2 × %3 experts</b>, tokens routed per step summed over ranks, %4.")
                   .arg(v.layers.size())
                   .arg(v.layers.size() == 1 ? QString() : QStringLiteral("s"))
                   .arg(v.experts)
                   .arg(last ? QStringLiteral("step %1 alone").arg(v.lastStep) : QStringLiteral("mean over steps"));
        const int worst = v.mostImbalancedRow(last);
        const MoeLayerRow& w = v.layers[size_t(worst)];
        if (w.maxExpertOf(last) >= 0)
            html += QStringLiteral(" Most loaded: <b>layer %1, expert %2</b> with %3× its fair share.")
                        .arg(w.layer)
                        .arg(w.maxExpertOf(last))
                        .arg(QString::number(w.imbalanceOf(last), 'f', 2));
    }
    if (v.samplesOutsideSteps > 0)
        html += QStringLiteral(" <span style='color:#b00020'>%1 router samples fell outside every step and are not counted.</span>")
                    .arg(v.samplesOutsideSteps);
    m_header->setText(html);
    m_header->setToolTip(def);

    // Heat map: layers × experts, then the layer's imbalance and losses.
    QStringList columns;
    for (int e = 0; e < v.experts; ++e) columns << QStringLiteral("e%1").arg(e);
    columns << QStringLiteral("imbalance") << QStringLiteral("aux loss") << QStringLiteral("z loss");
    // Quiet while rows come and go: the current cell moving is not a click on a layer.
    const QSignalBlocker quiet(m_heat);
    m_heat->clear();
    m_heat->setColumnCount(int(columns.size()));
    m_heat->setHorizontalHeaderLabels(columns);
    for (int e = 0; e < v.experts; ++e) m_heat->horizontalHeaderItem(e)->setToolTip(QStringLiteral("expert %1").arg(e));
    m_heat->setRowCount(int(v.layers.size()));
    QStringList rowLabels;
    for (int i = 0; i < int(v.layers.size()); ++i) {
        const MoeLayerRow& l = v.layers[size_t(i)];
        rowLabels << QStringLiteral("layer %1").arg(l.layer);
        const std::vector<double>& t = l.tokensOf(last);
        const double mean = t.empty() ? 0 : std::accumulate(t.begin(), t.end(), 0.0) / double(t.size());
        for (int e = 0; e < v.experts; ++e) {
            auto* item = new QTableWidgetItem;
            item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
            if (e < int(t.size())) {
                const double load = l.loadOf(e, last);
                item->setText(tokensText(t[size_t(e)]));
                item->setBackground(loadColor(load));
                item->setForeground(QColor(Qt::black));
                item->setToolTip(QStringLiteral("layer %1, expert %2: %3 tokens per step, %4× the fair share (%5 = the layer's mean)")
                                     .arg(l.layer)
                                     .arg(e)
                                     .arg(tokensText(t[size_t(e)]), QString::number(load, 'f', 2), tokensText(mean)));
                if (e == l.maxExpertOf(last)) {
                    QFont f = item->font();
                    f.setBold(true);
                    item->setFont(f);
                }
            }
            m_heat->setItem(i, e, item);
        }
        m_heat->setItem(i, v.experts, numberItem(QString::number(l.imbalanceOf(last), 'f', 2), l.imbalanceOf(last)));
        m_heat->setItem(i, v.experts + 1, numberItem(sig(l.auxLossOf(last)), l.auxLossOf(last)));
        m_heat->setItem(i, v.experts + 2, numberItem(sig(l.zLossOf(last)), l.zLossOf(last)));
    }
    for (int i = 0; i < int(v.layers.size()); ++i) {
        const MoeLayerRow& l = v.layers[size_t(i)];
        auto* h = new QTableWidgetItem(rowLabels[i]);
        h->setToolTip(QStringLiteral("layer %1: %2 steps with samples, last step %3").arg(l.layer).arg(l.steps).arg(l.lastStep));
        m_heat->setVerticalHeaderItem(i, h);
    }
    m_heat->setToolTip(QStringLiteral("<b>tokens per expert</b>, coloured by load = tokens / the layer's mean: white = fair share, "
                                      "red = up to 2× it, blue = fewer; the busiest expert of a layer in bold. Click a layer for its bars (▸)."
                                      "<br><b>moe</b>: %1")
                           .arg(def));

    // Imbalance per layer.
    {
        QChart* chart = m_imbalance->chart();
        clearChart(chart);
        chart->setTitle(QStringLiteral("Imbalance per layer (1 = balanced)"));
        auto* series = new QBarSeries;
        auto* set = new QBarSet(QStringLiteral("imbalance"));
        set->setColor(kOver);
        QStringList labels;
        double max = 1;
        for (const MoeLayerRow& l : v.layers) {
            *set << l.imbalanceOf(last);
            labels << QString::number(l.layer);
            max = std::max(max, l.imbalanceOf(last));
        }
        series->append(set);
        setBarAxes(chart, series, labels, QStringLiteral("max / mean"), max);
        chart->axes(Qt::Horizontal).front()->setTitleText(QStringLiteral("layer"));
        chart->legend()->setVisible(false);
        m_imbalance->setToolTip(QStringLiteral("<b>imbalance</b> = max / mean of the layer's tokens per expert (1 = balanced; "
                                               "top-k of E experts can reach E / k)<br><b>moe</b>: %1")
                                    .arg(def));
    }
    // Router losses per layer: aux and z differ by their coefficients (often 10×), so each has
    // its own axis.
    {
        QChart* chart = m_losses->chart();
        clearChart(chart);
        chart->setTitle(QStringLiteral("Router losses per layer"));
        auto* x = new QBarCategoryAxis;
        auto* aux = new QLineSeries;
        auto* z = new QLineSeries;
        aux->setName(QStringLiteral("aux loss"));
        z->setName(QStringLiteral("z loss"));
        aux->setColor(kAux);
        z->setColor(kZ);
        double auxMax = 0, zMax = 0;
        for (int i = 0; i < int(v.layers.size()); ++i) {
            const MoeLayerRow& l = v.layers[size_t(i)];
            x->append(QString::number(l.layer));
            aux->append(i, l.auxLossOf(last));
            z->append(i, l.zLossOf(last));
            auxMax = std::max(auxMax, l.auxLossOf(last));
            zMax = std::max(zMax, l.zLossOf(last));
        }
        for (QLineSeries* s : {aux, z}) {
            s->setPointsVisible(true);
            QPen pen = s->pen();
            pen.setWidth(2);
            s->setPen(pen);
            chart->addSeries(s);
        }
        x->setTitleText(QStringLiteral("layer"));
        auto* yAux = new QValueAxis;
        auto* yZ = new QValueAxis;
        yAux->setTitleText(QStringLiteral("aux loss"));
        yZ->setTitleText(QStringLiteral("z loss"));
        yAux->setTitleBrush(kAux);
        yZ->setTitleBrush(kZ);
        yAux->setLabelsColor(kAux.darker(120));
        yZ->setLabelsColor(kZ.darker(120));
        setNiceRange(yAux, auxMax);
        setNiceRange(yZ, zMax);
        chart->addAxis(x, Qt::AlignBottom);
        chart->addAxis(yAux, Qt::AlignLeft);
        chart->addAxis(yZ, Qt::AlignRight);
        aux->attachAxis(x);
        aux->attachAxis(yAux);
        z->attachAxis(x);
        z->attachAxis(yZ);
        m_losses->setToolTip(QStringLiteral("<b>aux loss</b>: the load-balancing loss, <b>z loss</b>: the router z-loss, "
                                            "as the model adds them (coefficients included)<br><b>moe</b>: %1")
                                 .arg(def));
    }
    fitHeatMap();
    if (m_row < 0 || m_row >= int(v.layers.size())) m_row = v.mostImbalancedRow(last);
    markRow();
    buildTokensChart();
}

void MoePanel::buildTokensChart() {
    QChart* chart = m_tokens->chart();
    clearChart(chart);
    const bool last = m_last;
    if (m_row < 0 || m_row >= int(m_view.layers.size())) {
        chart->setTitle(QStringLiteral("Tokens per expert"));
        return;
    }
    const MoeLayerRow& l = m_view.layers[size_t(m_row)];
    const std::vector<double>& t = l.tokensOf(last);
    chart->setTitle(QStringLiteral("Tokens per expert, layer %1 (%2)")
                        .arg(l.layer)
                        .arg(last ? QStringLiteral("step %1").arg(l.lastStep) : QStringLiteral("mean over %1 steps").arg(l.steps)));
    auto* series = new QBarSeries;
    auto* set = new QBarSet(QStringLiteral("tokens per step"));
    set->setColor(QColor(66, 133, 244));
    // The busiest expert in the heat map's red: QBarSet colours one bar through its selection.
    set->setSelectedColor(kOver);
    QStringList labels;
    double max = 0;
    for (int e = 0; e < int(t.size()); ++e) {
        *set << t[size_t(e)];
        labels << QString::number(e);
        max = std::max(max, t[size_t(e)]);
    }
    if (l.maxExpertOf(last) >= 0) set->selectBar(l.maxExpertOf(last));
    series->append(set);
    setBarAxes(chart, series, labels, QStringLiteral("tokens"), max);
    chart->axes(Qt::Horizontal).front()->setTitleText(QStringLiteral("expert"));
    // The fair share across the whole category axis (categories sit at 0..n-1).
    if (!t.empty()) {
        const double mean = std::accumulate(t.begin(), t.end(), 0.0) / double(t.size());
        auto* fair = new QLineSeries;
        fair->setName(QStringLiteral("fair share (mean) %1").arg(tokensText(mean)));
        fair->append(-0.5, mean);
        fair->append(double(t.size()) - 0.5, mean);
        QPen pen(QColor(97, 97, 97));
        pen.setStyle(Qt::DashLine);
        pen.setWidth(2);
        fair->setPen(pen);
        chart->addSeries(fair);
        for (QAbstractAxis* a : chart->axes()) fair->attachAxis(a);
    }
    m_tokens->setToolTip(QStringLiteral("<b>tokens per expert</b> of one layer (click a row of the heat map), the busiest in red, "
                                        "the dashed line its fair share (the mean)<br><b>moe</b>: %1")
                             .arg(m_view.definition.toHtmlEscaped()));
}

// ---- FP8 --------------------------------------------------------------------------------------

Fp8Panel::Fp8Panel(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    m_header = new QLabel(this);
    m_header->setObjectName(QStringLiteral("fp8Header"));
    m_header->setWordWrap(true);
    m_header->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_table = new QTableWidget(this);
    m_table->setObjectName(QStringLiteral("fp8Table"));
    m_table->setColumnCount(ColumnCount);
    m_table->setHorizontalHeaderLabels({QStringLiteral("Tensor"), QStringLiteral("Layer"), QStringLiteral("Linear"), QStringLiteral("Slot"),
                                        QStringLiteral("amax (max over ranks)"), QStringLiteral("scale min"), QStringLiteral("scale max"),
                                        QStringLiteral("Ranks")});
    m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    m_table->horizontalHeader()->setSectionResizeMode(Tensor, QHeaderView::Stretch);
    m_table->verticalHeader()->hide();
    // One line per tensor: a model has 12 per layer, and more of them on screen beats padding.
    m_table->verticalHeader()->setDefaultSectionSize(m_table->fontMetrics().height() + 6);
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    layout->addWidget(m_header);
    layout->addWidget(m_table, 1);
    // The header names the extreme tensors as links to their rows, wherever sorting put them.
    connect(m_header, &QLabel::linkActivated, this, [this](const QString& link) {
        if (link.startsWith(QLatin1String("tensor:"))) showTensor(link.mid(7).toInt());
    });
    setView({});
}

void Fp8Panel::setView(Fp8View view) {
    m_view = std::move(view);
    const Fp8View& v = m_view;
    const QColor smallest(255, 224, 178), largest(187, 222, 251);
    auto swatch = [](const QColor& c) {
        return QStringLiteral("<span style='background-color:%1'>&nbsp;&nbsp;&nbsp;&nbsp;</span>").arg(c.name());
    };
    if (!v.present) {
        m_header->setText(QStringLiteral("This run has no FP8 tensors (it did not train with fp8)."));
    } else {
        QString html = QStringLiteral("<b>FP8 scaling: %1 tensor%2</b>, the last amax and scale each rank recorded. ")
                           .arg(v.tensorCount)
                           .arg(v.tensorCount == 1 ? QString() : QStringLiteral("s"));
        html += QStringLiteral("%1 smallest scale %2 (<a href='tensor:%3'>%4</a>) &nbsp; %5 largest scale %6 (<a href='tensor:%7'>%8</a>)")
                    .arg(swatch(smallest), sig(v.smallestScale), QString::number(v.smallestRow), v.smallestTensor.toHtmlEscaped(),
                         swatch(largest), sig(v.largestScale), QString::number(v.largestRow), v.largestTensor.toHtmlEscaped());
        // Agreement across ranks is only news when there are several ranks.
        const bool severalRanks = std::any_of(v.tensors.begin(), v.tensors.end(), [](const Fp8TensorRow& t) { return t.ranks > 1; });
        if (v.disagreeing)
            html += QStringLiteral(". <b>%1</b> tensor%2 with different scales across ranks (italic).")
                        .arg(v.disagreeing)
                        .arg(v.disagreeing == 1 ? QString() : QStringLiteral("s"));
        else
            html += severalRanks ? QStringLiteral(". Every rank holds the same scales.") : QStringLiteral(".");
        m_header->setText(html);
    }
    const QString def = v.definition.toHtmlEscaped();
    m_header->setToolTip(def);
    m_table->setToolTip(QStringLiteral("<b>fp8</b>: %1<br>Click a header to sort.").arg(def));

    // Sorting stays off while the rows are filled, or every setItem would move rows under us.
    m_table->setSortingEnabled(false);
    m_table->clearContents();
    m_table->setRowCount(int(v.tensors.size()));
    for (int i = 0; i < int(v.tensors.size()); ++i) {
        const Fp8TensorRow& t = v.tensors[size_t(i)];
        // The name sorts in the document's order (by layer, then name): "layer10" after "layer9".
        auto* name = new SortItem(t.tensor, i);
        auto* linear = new QTableWidgetItem(t.linear);
        auto* slot = new QTableWidgetItem(t.slot);
        QTableWidgetItem* cells[] = {name,
                                     numberItem(QString::number(t.layer), t.layer),
                                     linear,
                                     slot,
                                     numberItem(sig(t.amax), t.amax),
                                     numberItem(sig(t.scaleMin), t.scaleMin),
                                     numberItem(sig(t.scaleMax), t.scaleMax),
                                     numberItem(QString::number(t.ranks), t.ranks)};
        for (int c = 0; c < ColumnCount; ++c) {
            if (t.ranksDisagree()) {
                QFont f = cells[c]->font();
                f.setItalic(true);
                cells[c]->setFont(f);
            }
            m_table->setItem(i, c, cells[c]);
        }
        auto mark = [](QTableWidgetItem* item, const QColor& color, const QString& why) {
            item->setBackground(color);
            item->setForeground(QColor(Qt::black));
            QFont f = item->font();
            f.setBold(true);
            item->setFont(f);
            item->setToolTip(why);
        };
        if (i == v.smallestRow) {
            mark(cells[ScaleMin], smallest, QStringLiteral("the smallest scale of the run"));
            mark(cells[Tensor], smallest, QStringLiteral("the smallest scale of the run"));
        }
        if (i == v.largestRow) {
            mark(cells[ScaleMax], largest, QStringLiteral("the largest scale of the run"));
            mark(cells[Tensor], largest, QStringLiteral("the largest scale of the run"));
        }
    }
    m_table->setSortingEnabled(true);
    m_table->sortByColumn(Tensor, Qt::AscendingOrder);
}

int Fp8Panel::rowOfTensor(int index) const {
    for (int r = 0; r < m_table->rowCount(); ++r)
        if (QTableWidgetItem* item = m_table->item(r, Tensor); item && item->data(Qt::UserRole).toInt() == index) return r;
    return -1;
}

void Fp8Panel::showTensor(int index) {
    const int row = rowOfTensor(index);
    if (row < 0) return;
    m_table->selectRow(row);
    m_table->scrollToItem(m_table->item(row, Tensor), QAbstractItemView::PositionAtCenter);
}

}  // namespace ts::gui
