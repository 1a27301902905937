// LayoutPreview (layout_preview.h).
#include "gui/app/layout_preview.h"

#include <algorithm>

#include <QPainter>

namespace ts::gui {

LayoutPreview::LayoutPreview(QWidget* parent) : QWidget(parent) {
    setMinimumHeight(120);
    setToolTip(QStringLiteral("Global ranks in Megatron-Core order tp-cp-ep-dp-pp: TP varies fastest, PP slowest.\n"
                              "One box per pipeline stage; rows are data-parallel replicas, columns CP × TP."));
}

void LayoutPreview::setGrid(const LayoutGrid& grid) {
    m_grid = grid;
    update();
}

void LayoutPreview::paintEvent(QPaintEvent*) {
    QPainter p(this);
    p.setRenderHint(QPainter::Antialiasing);
    p.fillRect(rect(), palette().base());
    const int titleH = fontMetrics().height() + 6;
    p.setPen(palette().text().color());
    if (!m_grid.error.isEmpty()) {
        p.setPen(QColor(176, 0, 32));
        p.drawText(rect().adjusted(6, 4, -6, -4), Qt::TextWordWrap, QStringLiteral("No layout: ") + m_grid.error);
        return;
    }
    if (m_grid.ranks.empty()) return;
    p.drawText(QRect(6, 2, width() - 12, titleH), Qt::AlignLeft | Qt::AlignVCenter, m_grid.title());
    const QRectF area(6, titleH + 2, width() - 12, height() - titleH - 8);
    const int stages = m_grid.pp;
    const int cols = m_grid.cp * m_grid.tp;
    const int rows = m_grid.dp;
    const double gap = 8;
    const double stageW = (area.width() - gap * (stages - 1)) / stages;
    const double labelH = fontMetrics().height() + 2;
    const double cellW = std::max(4.0, (stageW - 4) / cols);
    const double cellH = std::max(4.0, std::min(28.0, (area.height() - labelH - 4) / rows));
    static const QColor tpColors[] = {QColor(66, 133, 244), QColor(52, 168, 83), QColor(251, 188, 5), QColor(234, 67, 53),
                                      QColor(171, 71, 188), QColor(0, 172, 193), QColor(255, 112, 67), QColor(124, 179, 66)};
    QFont small = font();
    small.setPointSizeF(std::max(6.0, std::min(font().pointSizeF(), cellH * 0.45)));
    for (int s = 0; s < stages; ++s) {
        const QRectF box(area.left() + s * (stageW + gap), area.top(), stageW, labelH + rows * cellH + 4);
        p.setPen(QPen(palette().mid().color(), 1));
        p.setBrush(Qt::NoBrush);
        p.drawRoundedRect(box, 4, 4);
        p.setPen(palette().text().color());
        p.setFont(font());
        p.drawText(QRectF(box.left(), box.top(), box.width(), labelH), Qt::AlignCenter, QStringLiteral("PP stage %1").arg(s));
        p.setFont(small);
        for (int d = 0; d < rows; ++d)
            for (int c = 0; c < m_grid.cp; ++c)
                for (int t = 0; t < m_grid.tp; ++t) {
                    const int col = c * m_grid.tp + t;
                    const QRectF cell(box.left() + 2 + col * cellW, box.top() + labelH + 2 + d * cellH, cellW - 1, cellH - 1);
                    QColor fill = tpColors[d % 8].lighter(c % 2 ? 150 : 120);
                    p.fillRect(cell, fill);
                    if (cellW > 14 && cellH > 10) {
                        p.setPen(Qt::black);
                        p.drawText(cell, Qt::AlignCenter, QString::number(m_grid.rankAt(s, d, c, t)));
                    }
                }
    }
}

}  // namespace ts::gui
