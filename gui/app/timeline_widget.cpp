// TimelineWidget painting and interaction (see timeline_widget.h).
#include "gui/app/timeline_widget.h"

#include <algorithm>
#include <cmath>

#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QStaticText>
#include <QToolTip>
#include <QWheelEvent>

#include "gui/core/format.h"

namespace ts::gui {

namespace {
constexpr int kHeaderH = 20, kRangeH = 15, kHostH = 16, kStreamH = 20, kCounterH = 30, kRankGap = 4;
const QColor kBackground(0xff, 0xff, 0xff);
const QColor kBackgroundAlt(0xf4, 0xf6, 0xf9);
const QColor kGutter(0xec, 0xef, 0xf3);
const QColor kGrid(0xe2, 0xe6, 0xeb);
const QColor kText(0x22, 0x28, 0x30);
const QColor kBubble(0xe5, 0x4b, 0x4b, 70);
const QColor kMatch(0xff, 0xc8, 0x00);

int rowHeight(RowKind k) {
    switch (k) {
    case RowKind::Range: return kRangeH;
    case RowKind::Host: return kHostH;
    case RowKind::Stream: return kStreamH;
    case RowKind::Counter: return kCounterH;
    }
    return kStreamH;
}

// 1-2-5 steps so ticks are at least minPx apart.
double niceTick(double nsPerPx, double minPx) {
    double raw = nsPerPx * minPx;
    double p = std::pow(10.0, std::floor(std::log10(std::max(raw, 1.0))));
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (p * m >= raw) return p * m;
    return p * 10;
}

// Ruler label of t (ns since the axis origin) with as many decimals of a second as the tick
// spacing needs, so neighbouring labels never read the same ("4.335 s", "4.340 s").
QString tickLabel(double t, double tick) {
    if (t == 0) return QStringLiteral("0");
    const double s = t * 1e-9;
    int decimals = int(std::ceil(-std::log10(tick * 1e-9) - 1e-9));
    decimals = std::clamp(decimals, 0, 9);
    if (std::fabs(s) < 1 && tick < 1e6) {
        // Below a second with sub-ms ticks: ms or µs read better than 0.000123 s.
        if (tick >= 1e3) return QString::number(t * 1e-6, 'f', std::clamp(int(std::ceil(-std::log10(tick * 1e-6) - 1e-9)), 0, 6)) + " ms";
        return QString::number(t * 1e-3, 'f', std::clamp(int(std::ceil(-std::log10(tick * 1e-3) - 1e-9)), 0, 3)) + QString::fromUtf8(" µs");
    }
    return QString::number(s, 'f', decimals) + " s";
}

// Display text of a range: engine ranges are named "step", "microbatch", "layer" with the
// number in the slice's fields; show it.
QString rangeText(const TimelineData& data, const TimelineRow& row, size_t i) {
    QString n = data.sliceName(row, i);
    if (n == QLatin1String("step") && row.step[i] >= 0) return n + ' ' + QString::number(row.step[i]);
    if (n == QLatin1String("microbatch") && row.microbatch[i] >= 0) return n + ' ' + QString::number(row.microbatch[i]);
    if (n == QLatin1String("layer") && row.layer[i] >= 0) return n + ' ' + QString::number(row.layer[i]);
    return n;
}

QColor textOn(const QColor& c) { return c.lightness() > 150 ? QColor(0x1a, 0x1a, 0x1a) : QColor(0xff, 0xff, 0xff); }
}  // namespace

TimelineWidget::TimelineWidget(QWidget* parent) : QWidget(parent) {
    setMouseTracking(true);
    setFocusPolicy(Qt::StrongFocus);
    setAttribute(Qt::WA_OpaquePaintEvent);
    setMinimumSize(400, 120);
    m_axis.setWidth(std::max(1, canvasWidth()));
}

int TimelineWidget::canvasWidth() const { return std::max(1, width() - kGutterPx); }

void TimelineWidget::setData(std::shared_ptr<const TimelineData> data) {
    const bool sameRun = m_runs.size() == 1 && data && m_runs[0].data && m_runs[0].data->path == data->path;
    if (!sameRun) {
        std::vector<TimelineRun> runs;
        if (data) runs.push_back({data, data->runName, data->minNs});
        setRuns(std::move(runs));
        return;
    }
    // Follow mode: same file grown; keep the view where the user left it.
    syncWidth();
    TimeAxis keep = m_axis;
    m_runs[0].data = std::move(data);
    resetCache();
    m_matches.clear();
    m_matchIndex.clear();
    m_currentMatch = -1;
    if (m_selected.valid() && (size_t(m_selected.row) >= m_runs[0].data->rows.size() ||
                               size_t(m_selected.index) >= m_runs[0].data->rows[size_t(m_selected.row)].size()))
        m_selected = {};
    rebuildLayout();
    updateLimits();
    m_axis.startNs = keep.startNs;
    m_axis.endNs = keep.endNs;
    m_axis.clamp();
    axisChanged();
}

void TimelineWidget::syncWidth() {
    // A hidden widget gets its resize event only when shown: follow the geometry here too.
    if (m_axis.widthPx != double(canvasWidth())) m_axis.setWidth(canvasWidth());
}

void TimelineWidget::resetCache() {
    m_cache.assign(m_runs.size(), {});
    for (size_t i = 0; i < m_runs.size(); ++i) {
        const TimelineData& d = *m_runs[i].data;
        PaintCache& c = m_cache[i];
        const size_t ng = d.groups.size();
        c.sliceColor.resize(size_t(trace::Category::Other) * ng + ng + ng);
        for (size_t cat = 0; cat <= size_t(trace::Category::Other); ++cat)
            for (size_t g = 0; g < ng; ++g) c.sliceColor[cat * ng + g] = sliceColor(trace::Category(cat), d.groups[g]).rgb();
        c.rangeColor.assign(d.strings.size(), 0);
        c.textWidth.assign(d.strings.size(), -1);
        c.rowLabel.assign(d.rows.size(), QStaticText());
        c.rowPeak.assign(d.rows.size(), QStaticText());
    }
}

void TimelineWidget::setRuns(std::vector<TimelineRun> runs) {
    syncWidth();
    m_runs.clear();
    for (auto& r : runs)
        if (r.data) m_runs.push_back(std::move(r));
    resetCache();
    m_selected = {};
    m_matches.clear();
    m_matchIndex.clear();
    m_currentMatch = -1;
    rebuildLayout();
    updateLimits();
    fitAll();
}

void TimelineWidget::alignRunsAtStep(int step) {
    for (auto& r : m_runs) {
        const StepSpan* s = r.data->stepSpan(step);
        r.alignOffsetNs = s ? s->startNs : r.data->minNs;
    }
    updateLimits();
    fitStep(step);
}

void TimelineWidget::setViewState(ViewState* state) {
    if (m_viewState) disconnect(m_viewState, nullptr, this, nullptr);
    m_viewState = state;
    if (!state) return;
    connect(state, &ViewState::stepChanged, this, [this](int step) { step >= 0 ? fitStep(step) : fitAll(); });
    connect(state, &ViewState::timeRangeChanged, this, [this](std::optional<TimeRange> r) {
        if (r && !m_runs.empty()) setVisibleRange(r->fromNs - m_runs[0].alignOffsetNs, r->toNs - m_runs[0].alignOffsetNs);
    });
    connect(state, &ViewState::sliceSelected, this, [this](const SliceRef& ref) {
        if (ref == m_selected) return;
        m_selected = ref;
        update();
    });
}

void TimelineWidget::rebuildLayout() {
    m_lines.clear();
    int y = 0;
    for (size_t ri = 0; ri < m_runs.size(); ++ri) {
        if (m_runs.size() > 1) {
            m_lines.push_back({int(ri), -1, y, kHeaderH});
            y += kHeaderH;
        }
        const auto& rows = m_runs[ri].data->rows;
        int lastRank = rows.empty() ? 0 : rows.front().rank;
        for (size_t k = 0; k < rows.size(); ++k) {
            if (rows[k].rank != lastRank) {
                y += kRankGap;
                lastRank = rows[k].rank;
            }
            int h = rowHeight(rows[k].kind);
            m_lines.push_back({int(ri), int(k), y, h});
            y += h;
        }
        y += kRankGap * 2;
    }
    m_contentHeight = y;
    emit contentHeightChanged(m_contentHeight);
    setVerticalOffset(m_scrollY);
}

void TimelineWidget::updateLimits() {
    if (m_runs.empty()) {
        m_axis.hasLimits = false;
        return;
    }
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (auto& r : m_runs) {
        lo = std::min(lo, r.data->minNs - r.alignOffsetNs);
        hi = std::max(hi, r.data->maxNs - r.alignOffsetNs);
    }
    if (hi <= lo) hi = lo + TimeAxis::kMinSpanNs;
    m_axis.setLimits(lo, hi);
}

void TimelineWidget::axisChanged() {
    emit visibleRangeChanged(m_axis.startNs, m_axis.endNs);
    update();
}

void TimelineWidget::setVisibleRange(int64_t from, int64_t to) {
    syncWidth();
    m_axis.fit(from, to);
    axisChanged();
}

void TimelineWidget::fitAll() {
    syncWidth();
    if (m_axis.hasLimits) {
        int64_t span = m_axis.limitToNs - m_axis.limitFromNs;
        m_axis.fit(m_axis.limitFromNs - span / 100, m_axis.limitToNs + span / 100);
    }
    axisChanged();
}

void TimelineWidget::fitStep(int step) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (auto& r : m_runs)
        if (const StepSpan* s = r.data->stepSpan(step)) {
            lo = std::min(lo, s->startNs - r.alignOffsetNs);
            hi = std::max(hi, s->endNs - r.alignOffsetNs);
        }
    if (lo >= hi) return fitAll();
    syncWidth();
    int64_t pad = (hi - lo) / 50;
    m_axis.fit(lo - pad, hi + pad);
    axisChanged();
}

void TimelineWidget::fitSelection() {
    int step = m_viewState ? m_viewState->step() : -1;
    step >= 0 ? fitStep(step) : fitAll();
}

void TimelineWidget::zoomAtX(double x, double factor) {
    syncWidth();
    m_axis.zoomAt(x, factor);
    axisChanged();
}

void TimelineWidget::panPixels(double dx) {
    syncWidth();
    m_axis.pan(dx);
    axisChanged();
}

void TimelineWidget::setVerticalOffset(int y) {
    int maxY = std::max(0, m_contentHeight - (height() - kRulerPx));
    y = std::clamp(y, 0, maxY);
    if (y == m_scrollY) return;
    m_scrollY = y;
    emit verticalOffsetChanged(y);
    update();
}

QRect TimelineWidget::rowRect(int run, int row) const {
    for (const Line& l : m_lines)
        if (l.run == run && l.row == row) return QRect(0, kRulerPx + l.y - m_scrollY, width(), l.h);
    return {};
}

double TimelineWidget::xForTime(int run, int64_t traceNs) const {
    if (run < 0 || size_t(run) >= m_runs.size()) return -1;
    return kGutterPx + m_axis.mapTimeToX(traceNs - m_runs[size_t(run)].alignOffsetNs);
}

const TimelineWidget::Line* TimelineWidget::lineAt(int y) const {
    int cy = y - kRulerPx + m_scrollY;
    auto it = std::upper_bound(m_lines.begin(), m_lines.end(), cy, [](int v, const Line& l) { return v < l.y; });
    if (it == m_lines.begin()) return nullptr;
    --it;
    return cy < it->y + it->h ? &*it : nullptr;
}

std::optional<SliceRef> TimelineWidget::sliceAt(QPoint pos) const {
    if (pos.x() < kGutterPx || pos.y() < kRulerPx) return std::nullopt;
    const Line* l = lineAt(pos.y());
    if (!l || l->row < 0) return std::nullopt;
    const TimelineRun& run = m_runs[size_t(l->run)];
    const TimelineRow& row = run.data->rows[size_t(l->row)];
    if (row.kind == RowKind::Counter || row.size() == 0) return std::nullopt;
    const double x = pos.x() - kGutterPx;
    const int64_t t = m_axis.mapXToTime(x) + run.alignOffsetNs;
    const int64_t tol = std::max<int64_t>(1, int64_t(std::ceil(m_axis.pxToNs(2.0))));
    const RowSpan span = row.span();
    auto [a, b] = visibleRange(span, t - tol, t + tol + 1);
    size_t best = SIZE_MAX;
    int64_t bestDist = INT64_MAX, bestDur = INT64_MAX;
    auto consider = [&](size_t i) {
        int64_t s = row.start[i], e = row.end[i];
        int64_t dist = t < s ? s - t : (t >= e ? t - e + (e == s ? 0 : 1) : 0);
        if (dist > tol) return;
        int64_t dur = e - s;
        // Prefer containing, then nearest, then shortest (innermost of overlapping ranges).
        if (dist < bestDist || (dist == bestDist && dur < bestDur)) {
            best = i, bestDist = dist, bestDur = dur;
        }
    };
    if (b - a <= 512) {
        for (size_t i = a; i < b; ++i) consider(i);
    } else {
        // Many slices under the cursor (zoomed out): the ones around t by start.
        size_t k = size_t(std::upper_bound(row.start.begin(), row.start.end(), t) - row.start.begin());
        for (size_t i = k > 8 ? k - 8 : 0; i < std::min(row.size(), k + 8); ++i) consider(i);
    }
    if (best == SIZE_MAX) return std::nullopt;
    return SliceRef{l->run, l->row, int64_t(best)};
}

SliceDetails TimelineWidget::detailsOf(const SliceRef& ref) const {
    if (!ref.valid() || size_t(ref.run) >= m_runs.size()) return {};
    SliceDetails d = m_runs[size_t(ref.run)].data->details(ref.row, size_t(ref.index));
    d.runLabel = m_runs[size_t(ref.run)].label;
    return d;
}

void TimelineWidget::selectRef(const SliceRef& ref) {
    m_selected = ref;
    if (m_viewState) m_viewState->selectSlice(ref);
    emit sliceSelected(detailsOf(ref));
    update();
}

// ---- find ----------------------------------------------------------------------------------

int TimelineWidget::find(const QString& text) {
    syncWidth();
    m_matches.clear();
    m_matchIndex.assign(m_runs.size(), {});
    m_currentMatch = -1;
    for (size_t ri = 0; ri < m_runs.size(); ++ri) {
        const auto& data = *m_runs[ri].data;
        m_matchIndex[ri].assign(data.rows.size(), {});
        for (const FindMatch& m : data.findByName(text)) {
            m_matches.push_back({int(ri), m.row, m.index, m.startNs - m_runs[ri].alignOffsetNs});
            m_matchIndex[ri][size_t(m.row)].push_back(m.index);
        }
        for (auto& v : m_matchIndex[ri]) std::sort(v.begin(), v.end());
    }
    std::stable_sort(m_matches.begin(), m_matches.end(), [](const Match& a, const Match& b) { return a.axisNs < b.axisNs; });
    if (!m_matches.empty()) {
        // First match at or after the view's start, so "find" continues from where one looks.
        auto it = std::lower_bound(m_matches.begin(), m_matches.end(), m_axis.startNs,
                                   [](const Match& m, int64_t t) { return m.axisNs < t; });
        m_currentMatch = it == m_matches.end() ? 0 : int(it - m_matches.begin());
        showMatch();
    }
    emit findResultsChanged(matchCount(), m_currentMatch);
    update();
    return matchCount();
}

void TimelineWidget::findNext() {
    if (m_matches.empty()) return;
    m_currentMatch = (m_currentMatch + 1) % int(m_matches.size());
    showMatch();
    emit findResultsChanged(matchCount(), m_currentMatch);
}

void TimelineWidget::findPrevious() {
    if (m_matches.empty()) return;
    m_currentMatch = (m_currentMatch - 1 + int(m_matches.size())) % int(m_matches.size());
    showMatch();
    emit findResultsChanged(matchCount(), m_currentMatch);
}

void TimelineWidget::showMatch() {
    const Match& m = m_matches[size_t(m_currentMatch)];
    const TimelineRow& row = m_runs[size_t(m.run)].data->rows[size_t(m.row)];
    const int64_t dur = row.end[m.index] - row.start[m.index];
    // Centre the match; zoom in so it is at least ~40 px wide unless it already is.
    int64_t span = m_axis.spanNs();
    if (double(dur) < m_axis.pxToNs(40)) span = std::max<int64_t>(TimeAxis::kMinSpanNs, std::max<int64_t>(dur * 25, 2000));
    m_axis.fit(m.axisNs + dur / 2 - span / 2, m.axisNs + dur / 2 + span - span / 2);
    QRect r = rowRect(m.run, m.row);
    if (r.isValid() && (r.top() < kRulerPx || r.bottom() > height())) setVerticalOffset(m_scrollY + r.top() - kRulerPx - height() / 3);
    selectRef(SliceRef{m.run, m.row, int64_t(m.index)});
    axisChanged();
}

bool TimelineWidget::isMatch(int run, int row, size_t first, size_t count) const {
    if (size_t(run) >= m_matchIndex.size() || size_t(row) >= m_matchIndex[size_t(run)].size()) return false;
    const auto& v = m_matchIndex[size_t(run)][size_t(row)];
    auto it = std::lower_bound(v.begin(), v.end(), first);
    return it != v.end() && *it < first + count;
}

// ---- painting ------------------------------------------------------------------------------

const QStaticText& TimelineWidget::staticText(const QString& s) {
    auto it = m_textCache.find(s);
    if (it != m_textCache.end()) return it->second;
    if (m_textCache.size() > 4096) m_textCache.clear();
    QStaticText t(s);
    t.setTextFormat(Qt::PlainText);
    t.setPerformanceHint(QStaticText::AggressiveCaching);
    return m_textCache.emplace(s, std::move(t)).first->second;
}

namespace {
// Top-left of a one-line text vertically centred in `r`, `pad` px from its left.
QPointF textOrigin(const QRectF& r, const QFontMetrics& fm, double pad = 3) {
    return {r.left() + pad, r.top() + (r.height() - fm.height()) / 2.0};
}
}  // namespace

void TimelineWidget::paintEvent(QPaintEvent*) {
    syncWidth();
    QPainter p(this);
    if (m_runs.empty()) {
        p.fillRect(rect(), kBackground);
        p.setPen(kText);
        p.drawText(rect(), Qt::AlignCenter, tr("No run loaded"));
        return;
    }
    const int top = kRulerPx;
    // Visible lines only: binary search the first line under the ruler. Rows paint their own
    // background; only the gaps between ranks and the space below the last row are filled
    // here (each pixel is filled once, not once per layer).
    int cy0 = m_scrollY, cy1 = m_scrollY + height() - top;
    auto it = std::upper_bound(m_lines.begin(), m_lines.end(), cy0, [](int v, const Line& l) { return v < l.y; });
    if (it != m_lines.begin()) --it;
    p.setClipRect(QRect(0, top, width(), height() - top));
    int filledTo = top;  // widget y up to which the background is painted
    for (; it != m_lines.end() && it->y < cy1; ++it) {
        QRect r(0, top + it->y - m_scrollY, width(), it->h);
        if (r.top() > filledTo) p.fillRect(QRect(0, filledTo, width(), r.top() - filledTo), kBackground);
        paintRow(p, *it, r);
        filledTo = std::max(filledTo, r.bottom() + 1);
    }
    if (filledTo < height()) p.fillRect(QRect(0, filledTo, width(), height() - filledTo), kBackground);
    p.setClipping(false);
    paintRuler(p, QRect(0, 0, width(), kRulerPx));
    // Gutter separator.
    p.setPen(QColor(0xc8, 0xce, 0xd6));
    p.drawLine(kGutterPx - 1, 0, kGutterPx - 1, height());
}

void TimelineWidget::paintRuler(QPainter& p, const QRect& r) {
    p.fillRect(r, kGutter);
    p.setPen(QColor(0xc8, 0xce, 0xd6));
    p.drawLine(r.left(), r.bottom(), r.right(), r.bottom());
    p.setPen(kText);
    QFont f = font();
    f.setPointSizeF(f.pointSizeF() * 0.85);
    p.setFont(f);
    const QFontMetrics fm(f);
    p.drawStaticText(textOrigin(QRectF(6, r.top(), kGutterPx - 10, r.height()), fm, 0),
                     staticText(formatDurationNs(double(m_axis.spanNs())) + tr(" visible")));
    const double tick = niceTick(m_axis.nsPerPx(), 90);
    const double first = std::ceil(double(m_axis.startNs) / tick) * tick;
    p.setClipRect(QRect(kGutterPx, r.top(), r.width() - kGutterPx, r.height()));
    QVector<QLineF> ticks;
    for (double t = first; t < double(m_axis.endNs); t += tick) {
        double x = kGutterPx + m_axis.mapTimeToX(int64_t(std::llround(t)));
        ticks << QLineF(x, r.bottom() - 6, x, r.bottom());
        p.drawStaticText(textOrigin(QRectF(x, r.top(), 140, r.height() - 4), fm), staticText(tickLabel(t, tick)));
    }
    p.setPen(QColor(0x9a, 0xa3, 0xad));
    p.drawLines(ticks);
    p.setClipping(false);
}

void TimelineWidget::paintRow(QPainter& p, const Line& line, const QRect& r) {
    const TimelineRun& run = m_runs[size_t(line.run)];
    const TimelineData& data = *run.data;
    const int cw = canvasWidth();
    if (line.row < 0) {
        // Run header band (A/B).
        p.fillRect(r, QColor(0x33, 0x3d, 0x4a));
        p.setPen(Qt::white);
        QFont f = font();
        f.setBold(true);
        p.setFont(f);
        p.drawText(r.adjusted(8, 0, -8, 0), Qt::AlignVCenter | Qt::AlignLeft,
                   run.label + (data.runName.isEmpty() || data.runName == run.label ? QString() : "  ·  " + data.runName) +
                       (data.layout.isEmpty() ? QString() : "  ·  " + data.layout));
        p.setFont(font());
        return;
    }
    const TimelineRow& row = data.rows[size_t(line.row)];
    const int rankIdx = data.rankIndex(row.rank);
    const QRect canvas(kGutterPx, r.top(), cw, r.height());
    const QColor canvasColor = (rankIdx % 2) ? kBackgroundAlt : kBackground;
    p.fillRect(canvas, canvasColor);
    PaintCache& cache = m_cache[size_t(line.run)];

    // Gutter label, laid out once per row (the gutter's width never changes).
    p.fillRect(QRect(0, r.top(), kGutterPx - 1, r.height()), kGutter);
    QFont lf = font();
    lf.setPointSizeF(lf.pointSizeF() * (row.kind == RowKind::Range ? 0.8 : 0.88));
    p.setFont(lf);
    const QFontMetrics lfm(lf);
    p.setPen(row.kind == RowKind::Range ? QColor(0x55, 0x5f, 0x6b) : kText);
    const int indent = row.kind == RowKind::Range ? 14 : 8;
    QStaticText& label = cache.rowLabel[size_t(line.row)];
    if (label.text().isEmpty() && !row.label.isEmpty()) {
        label.setText(lfm.elidedText(row.label, Qt::ElideRight, kGutterPx - indent - 6));
        label.setTextFormat(Qt::PlainText);
    }
    if (row.kind == RowKind::Counter && row.counter.maxValue > 0) {
        // Two lines: the label, and the peak the row's height is scaled to.
        p.drawStaticText(QPointF(indent, r.top() + 1 + r.height() / 2 - lfm.height()), label);
        QFont sf = lf;
        sf.setPointSizeF(lf.pointSizeF() * 0.85);
        p.setFont(sf);
        p.setPen(QColor(0x55, 0x5f, 0x6b));
        QStaticText& peak = cache.rowPeak[size_t(line.row)];
        if (peak.text().isEmpty()) {
            peak.setText(tr("peak %1").arg(formatBytes(row.counter.maxValue)));
            peak.setTextFormat(Qt::PlainText);
        }
        p.drawStaticText(QPointF(indent, r.top() + r.height() / 2), peak);
    } else {
        p.drawStaticText(textOrigin(r, lfm, indent), label);
    }

    p.save();
    p.setClipRect(canvas);
    p.translate(kGutterPx, 0);
    if (row.kind == RowKind::Counter) {
        paintCounter(p, run, row, QRect(0, r.top(), cw, r.height()), canvasColor);
        p.restore();
        return;
    }
    const int y0 = r.top() + 1, h = r.height() - 2;

    // Bubbles: the rank's step windows on its compute rows, shaded first; the boxes drawn on
    // top cover the busy parts, so what stays shaded are the gaps (at this level of detail).
    if (row.kind == RowKind::Stream && row.trackKind == trace::TrackKind::Compute && rankIdx >= 0) {
        for (const StepSpan& w : data.stepWindows[size_t(rankIdx)]) {
            double x0 = m_axis.mapTimeToX(w.startNs - run.alignOffsetNs), x1 = m_axis.mapTimeToX(w.endNs - run.alignOffsetNs);
            if (x1 < 0 || x0 > cw) continue;
            QRectF br(std::max(-1.0, x0), y0, std::min(double(cw) + 1, x1) - std::max(-1.0, x0), h);
            p.fillRect(br, kBubble);
            p.fillRect(br, QBrush(QColor(0xd0, 0x40, 0x40, 90), Qt::BDiagPattern));
        }
    }

    foldRow(row.span(run.alignOffsetNs), m_axis, m_boxes);
    QFont bf = font();
    bf.setPointSizeF(bf.pointSizeF() * 0.8);
    p.setFont(bf);
    const QFontMetrics fm(bf);
    const bool isRange = row.kind == RowKind::Range;
    const size_t ng = data.groups.size();
    // Outlines of wide unfolded boxes are collected and stroked per colour run at the end of
    // the row, not one pen change and drawRect per box.
    for (const LodBox& b : m_boxes) {
        const size_t i = b.first;
        const uint32_t nameId = row.name[i];
        QColor c;
        if (isRange) {
            QRgb& rgb = cache.rangeColor[nameId < cache.rangeColor.size() ? nameId : 0];
            if (!rgb) rgb = rangeColor(data.sliceName(row, i), row.depth).rgb();
            c = QColor::fromRgb(rgb);
        } else {
            size_t k = size_t(row.category[i]) * ng + std::min<size_t>(row.group[i], ng - 1);
            c = QColor::fromRgb(k < cache.sliceColor.size() ? cache.sliceColor[k] : 0xff959595);
        }
        QRectF br(b.x0, y0, b.x1 - b.x0, h);
        const bool folded = b.folded();
        if (folded) {
            // Hatched: "many ops here", lighter so the eye reads it as a summary.
            p.fillRect(br, c.lighter(125));
            if (br.width() >= 6) p.fillRect(br, QBrush(c.darker(135), Qt::BDiagPattern));
        } else {
            p.fillRect(br, c);
            if (br.width() >= 6) {
                p.setPen(c.darker(130));
                p.drawRect(br.adjusted(0, 0, -1, -1));
            }
        }
        if (!m_matchIndex.empty() && isMatch(line.run, line.row, b.first, b.count)) {
            p.setPen(QPen(kMatch, 2));
            p.drawRect(br.adjusted(0.5, 0.5, -0.5, -0.5));
        }
        if (m_selected.valid() && m_selected.run == line.run && m_selected.row == line.row &&
            size_t(m_selected.index) >= b.first && size_t(m_selected.index) < b.first + b.count) {
            p.setPen(QPen(Qt::black, 2));
            p.drawRect(br.adjusted(0.5, 0.5, -0.5, -0.5));
        }
        if (br.width() < 36) continue;
        const int room = int(br.width()) - 6;
        if (folded) {
            const QStaticText& t = staticText(isRange ? tr("%1 ranges").arg(b.ops) : tr("%1 ops").arg(b.ops));
            if (t.size().width() > room) continue;
            p.setPen(kText);
            p.drawStaticText(textOrigin(br, fm), t);
            continue;
        }
        // Skip the text when not even a few characters fit (measured once per name).
        int& tw = cache.textWidth[nameId < cache.textWidth.size() ? nameId : 0];
        if (tw < 0) tw = fm.horizontalAdvance(data.sliceName(row, i));
        if (room < 24 && tw > room) continue;
        p.setPen(textOn(c));
        if (!isRange && tw <= room) {
            auto it = cache.nameText.find(nameId);
            if (it == cache.nameText.end()) {
                QStaticText t(data.sliceName(row, i));
                t.setTextFormat(Qt::PlainText);
                it = cache.nameText.emplace(nameId, std::move(t)).first;
            }
            p.drawStaticText(textOrigin(br, fm), it->second);
            continue;
        }
        // Ranges ("step 3") and names that do not fit: elided to the room there is. The room
        // is rounded down to 8 px so that a pan (same widths) finds its texts in the cache.
        const QString text = isRange ? rangeText(data, row, i) : data.sliceName(row, i);
        const int roomKey = room >= int(tw) ? room : room / 8 * 8;
        QString el = roomKey >= fm.horizontalAdvance(text) ? text : fm.elidedText(text, Qt::ElideRight, roomKey);
        if (el.isEmpty() || el == QStringLiteral("…")) continue;
        p.drawStaticText(textOrigin(br, fm), staticText(el));
    }
    p.restore();
}

void TimelineWidget::paintCounter(QPainter& p, const TimelineRun& run, const TimelineRow& row, const QRect& r,
                                  const QColor& background) {
    const CounterSeries& s = row.counter;
    if (s.ts.empty() || s.maxValue <= 0) return;
    const int cw = r.width();
    const double top = r.top() + 3, h = r.height() - 5, base = top + h;
    // The area is drawn opaque, its colour blended with the row's background once here: an
    // opaque column is a plain fill, a translucent polygon is a scan-converted blend.
    const QColor tint(0x6b, 0x8e, 0xc9);
    const double a = 110.0 / 255.0;
    const QColor fill(int(tint.red() * a + background.red() * (1 - a)), int(tint.green() * a + background.green() * (1 - a)),
                      int(tint.blue() * a + background.blue() * (1 - a)));
    const QColor line(0x3b, 0x5e, 0x99);
    auto yOf = [&](double v) { return base - h * (v / s.maxValue); };
    // One column per pixel: the span of values in force during the pixel (per-pixel min/max).
    // The area is one fill per run of equal columns; the outline one polyline and one batch
    // of min..max strokes, so a frame issues a few paint calls per counter row.
    QPolygonF outline;
    QVector<QLineF> bands;
    outline.reserve(2 * cw + 2);
    int64_t prevT = m_axis.mapXToTime(0) + run.alignOffsetNs;
    int runX = -1, runTop = 0;  // the current run of columns with the same integer top
    auto flushRun = [&](int endX) {
        if (runX >= 0 && endX > runX && runTop < int(base)) p.fillRect(QRect(runX, runTop, endX - runX, int(base) - runTop), fill);
        runX = -1;
    };
    for (int x = 0; x < cw; ++x) {
        int64_t t1 = m_axis.mapXToTime(x + 1) + run.alignOffsetNs;
        int64_t ia = s.indexAt(prevT);  // in force at the pixel start
        size_t b = size_t(std::lower_bound(s.ts.begin(), s.ts.end(), t1) - s.ts.begin());
        prevT = t1;
        if (b == 0) continue;  // before the first sample
        size_t from = size_t(std::max<int64_t>(ia, 0));
        if (from >= b) from = b - 1;
        auto [mn, mx] = s.minMax(from, b);
        const double yTop = yOf(mx);
        const int iy = int(std::lround(yTop));
        if (runX < 0 || iy != runTop) {
            flushRun(x);
            runX = x, runTop = iy;
        }
        outline << QPointF(x, yTop) << QPointF(x + 1, yTop);
        if (yOf(mn) - yTop >= 1) bands << QLineF(x + 0.5, yTop, x + 0.5, yOf(mn));
    }
    flushRun(runX >= 0 ? int(outline.isEmpty() ? runX : outline.back().x()) : 0);
    if (outline.isEmpty()) return;
    p.setPen(QPen(line, 1));
    p.drawPolyline(outline);
    if (!bands.isEmpty()) p.drawLines(bands);
}

// ---- interaction ---------------------------------------------------------------------------

void TimelineWidget::resizeEvent(QResizeEvent*) {
    m_axis.setWidth(canvasWidth());
    setVerticalOffset(m_scrollY);
    emit contentHeightChanged(m_contentHeight);  // the page size changed
    emit visibleRangeChanged(m_axis.startNs, m_axis.endNs);
}

void TimelineWidget::wheelEvent(QWheelEvent* e) {
    const QPoint d = e->angleDelta();
    if (e->modifiers() & Qt::ShiftModifier) {
        setVerticalOffset(m_scrollY - (d.y() ? d.y() : d.x()) / 2);
    } else if (d.y() != 0) {
        // 120 units = one notch = 1.25x.
        zoomAtX(e->position().x() - kGutterPx, std::pow(1.25, d.y() / 120.0));
    } else if (d.x() != 0) {
        panPixels(d.x() / 2.0);
    }
    e->accept();
}

void TimelineWidget::mousePressEvent(QMouseEvent* e) {
    if (e->button() != Qt::LeftButton) return;
    m_dragging = true;
    m_dragMoved = false;
    m_dragLast = m_pressPos = e->position().toPoint();
}

void TimelineWidget::mouseMoveEvent(QMouseEvent* e) {
    if (!m_dragging) return;
    QPoint pos = e->position().toPoint();
    if (!m_dragMoved && (pos - m_pressPos).manhattanLength() < 4) return;
    if (!m_dragMoved) setCursor(Qt::ClosedHandCursor);
    m_dragMoved = true;
    QPoint d = pos - m_dragLast;
    m_dragLast = pos;
    if (d.x()) panPixels(d.x());
    if (d.y()) setVerticalOffset(m_scrollY - d.y());
}

void TimelineWidget::mouseReleaseEvent(QMouseEvent* e) {
    if (e->button() != Qt::LeftButton || !m_dragging) return;
    m_dragging = false;
    unsetCursor();
    if (m_dragMoved) return;
    auto ref = sliceAt(e->position().toPoint());
    selectRef(ref ? *ref : SliceRef{});
}

void TimelineWidget::keyPressEvent(QKeyEvent* e) {
    const QPoint cursor = mapFromGlobal(QCursor::pos());
    const double x = rect().contains(cursor) && cursor.x() >= kGutterPx ? cursor.x() - kGutterPx : canvasWidth() / 2.0;
    if (e->matches(QKeySequence::Find)) {
        emit findRequested();
        return;
    }
    switch (e->key()) {
    case Qt::Key_W: zoomAtX(x, 1.3); break;
    case Qt::Key_S: zoomAtX(x, 1 / 1.3); break;
    case Qt::Key_A: panPixels(canvasWidth() * 0.1); break;
    case Qt::Key_D: panPixels(-canvasWidth() * 0.1); break;
    case Qt::Key_F: fitSelection(); break;
    case Qt::Key_Escape: selectRef({}); break;
    default: QWidget::keyPressEvent(e); return;
    }
    e->accept();
}

bool TimelineWidget::event(QEvent* e) {
    if (e->type() == QEvent::ToolTip) {
        auto* he = static_cast<QHelpEvent*>(e);
        auto ref = sliceAt(he->pos());
        if (!ref) {
            QToolTip::hideText();
            e->ignore();
            return true;
        }
        SliceDetails d = detailsOf(*ref);
        QString cat = d.category + (d.group.isEmpty() ? QString() : " · " + d.group);
        QString tip = QString("<b>%1</b><br>%2 · %3").arg(d.name.toHtmlEscaped(), formatDurationNs(double(d.durNs)), cat);
        if (d.bytes) tip += "<br>" + formatBytes(double(d.bytes));
        if (d.flops > 0) tip += "<br>" + formatFlopRate(d.flopRate);
        QToolTip::showText(he->globalPos(), tip, this);
        return true;
    }
    return QWidget::event(e);
}

}  // namespace ts::gui
