// The analysis tabs of the engine's model counters (the "moe" and "fp8" sections of the
// analysis document; the data comes from gui/core/model_counters.h):
//  - MoePanel ("MoE routing"): a heat map of tokens per expert with layers as rows, coloured by
//    each expert's load relative to its layer's mean so that the overloaded expert of each layer
//    stands out, next to the imbalance per layer, the router's aux and z losses per layer, and
//    the tokens per expert of one layer as bars (the row clicked in the heat map).
//  - Fp8Panel ("FP8"): a sortable table of the FP8 tensors with amax and the scale over ranks,
//    the run's smallest and largest scale highlighted.
// The MoE tab shows the mean over the run's steps or its last step (the document has both);
// the FP8 tab the last amax and scale each rank recorded.
#pragma once

#include <QComboBox>
#include <QLabel>
#include <QTableWidget>
#include <QWidget>

#include "gui/core/model_counters.h"

class QChartView;
class QSplitter;

namespace ts::gui {

class MoePanel : public QWidget {
    Q_OBJECT
public:
    explicit MoePanel(QWidget* parent = nullptr);
    void setView(MoeView view);
    const MoeView& view() const { return m_view; }
    // false: means over steps; true: the last step alone.
    void showLastStep(bool last);
    // The layer (row of the heat map) whose tokens per expert the bar chart shows.
    void selectRow(int row);
    int selectedRow() const { return m_row; }

    QTableWidget* heatMap() const { return m_heat; }
    QChartView* tokensChart() const { return m_tokens; }
    QChartView* imbalanceChart() const { return m_imbalance; }
    QChartView* lossChart() const { return m_losses; }
    QString headerText() const { return m_header->text(); }

private:
    void rebuild();
    void markRow();  // the row header of the layer the bars show
    void fitHeatMap();
    void showEvent(QShowEvent* event) override;
    void buildTokensChart();

    MoeView m_view;
    bool m_last = false;
    int m_row = -1;
    bool m_fitPending = true;
    QLabel* m_header;
    QComboBox* m_which;
    QTableWidget* m_heat;
    QChartView* m_tokens;
    QChartView* m_imbalance;
    QChartView* m_losses;
    QSplitter* m_split;
};

class Fp8Panel : public QWidget {
    Q_OBJECT
public:
    explicit Fp8Panel(QWidget* parent = nullptr);
    void setView(Fp8View view);
    const Fp8View& view() const { return m_view; }

    enum Column { Tensor, Layer, Linear, Slot, Amax, ScaleMin, ScaleMax, Ranks, ColumnCount };
    // The table row (after sorting) of view().tensors[index]; -1 if none.
    int rowOfTensor(int index) const;
    // Selects that tensor's row and scrolls to it (the header's links do this).
    void showTensor(int index);
    QTableWidget* table() const { return m_table; }
    QString headerText() const { return m_header->text(); }

private:
    Fp8View m_view;
    QLabel* m_header;
    QTableWidget* m_table;
};

}  // namespace ts::gui
