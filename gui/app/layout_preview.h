// The layout preview: the rank grid of a config (TP × CP × DP × PP, global rank numbers in
// Megatron's tp-cp-ep-dp-pp order), one box per pipeline stage.
#pragma once

#include <QWidget>

#include "gui/core/layout_grid.h"

namespace ts::gui {

class LayoutPreview : public QWidget {
    Q_OBJECT
public:
    explicit LayoutPreview(QWidget* parent = nullptr);
    void setGrid(const LayoutGrid& grid);
    const LayoutGrid& grid() const { return m_grid; }
    QSize sizeHint() const override { return {360, 170}; }

protected:
    void paintEvent(QPaintEvent* event) override;

private:
    LayoutGrid m_grid;
};

}  // namespace ts::gui
