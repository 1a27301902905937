// The "MoE routing" and "FP8" tabs of the analysis panels (gui/app/counter_panels.h), offscreen:
// a real micro MoE run made with the CLI next to the tests shows its layers and experts, a dense
// run shows neither tab, and the FP8 table sorts by value with the extreme scales marked.
#include <gtest/gtest.h>

#include <numeric>

#include <QBarSeries>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QFile>
#include <QProcess>

#include "gui/app/counter_panels.h"
#include "gui/app/panels.h"
#include "tests/gui/gui_test_util.h"

using namespace ts::gui;
using nlohmann::json;

namespace {

// One layer of attention + MoE per transformer layer, 2 layers, 4 experts, top-2: on 2 ranks
// with micro-batch 2 × seq 16, each layer routes 2 × 32 × 2 = 128 tokens per step.
const char* kMicro =
    "position_embedding_type: rope\nnum_layers: 2\nhidden_size: 32\nnum_attention_heads: 2\nseq_length: 16\n"
    "vocab_size: 256\nmicro_batch_size: 2\ndata_path: synthetic\ntrain_iters: 3\n";

// `trainscope run` of kMicro + extra on 2 ranks for 2 steps; returns the run file.
QString runCli(const QTemporaryDir& dir, const QString& name, const QString& extra) {
    const QString config = dir.filePath(name + QStringLiteral(".yaml"));
    QFile f(config);
    if (!f.open(QIODevice::WriteOnly)) return {};
    f.write((QStringLiteral("name: %1\n").arg(name) + QString::fromLatin1(kMicro) + extra).toUtf8());
    f.close();
    const QString runFile = dir.filePath(name + QStringLiteral(".sqlite"));
    QProcess p;
    p.setProcessChannelMode(QProcess::MergedChannels);
    p.start(QStringLiteral(TS_BINARY_DIR "/apps/trainscope"),
            {QStringLiteral("run"), config, QStringLiteral("--steps"), QStringLiteral("2"), QStringLiteral("--world-size"), QStringLiteral("2"),
             QStringLiteral("--run-file"), runFile});
    if (!p.waitForFinished(180000) || p.exitCode() != 0) {
        ADD_FAILURE() << "trainscope run failed: " << p.readAll().toStdString();
        return {};
    }
    return runFile;
}

bool analyse(AnalysisPanels& panels, const QString& runFile) {
    bool ready = false;
    auto conn = QObject::connect(&panels, &AnalysisPanels::analysisReady, [&] { ready = true; });
    panels.setRunFile(runFile);
    const bool ok = test::waitUntil([&] { return ready; }, 60000);
    QObject::disconnect(conn);
    return ok;
}

QBarSet* firstBarSet(QChartView* view) {
    for (QAbstractSeries* s : view->chart()->series())
        if (auto* bars = qobject_cast<QBarSeries*>(s)) return bars->barSets().value(0);
    return nullptr;
}

}  // namespace

TEST(CounterPanels, MoeRunShowsEveryLayerAndExpertAndADenseRunNoTab) {
    test::ensureApp();
    QTemporaryDir dir;
    const QString moe = runCli(dir, QStringLiteral("moe"),
                               QStringLiteral("add_bias_linear: false\nnum_moe_experts: 4\nmoe_router_topk: 2\n"
                                              "moe_aux_loss_coeff: 0.01\nmoe_z_loss_coeff: 0.001\n"));
    const QString dense = runCli(dir, QStringLiteral("dense"), QString());
    ASSERT_FALSE(moe.isEmpty());
    ASSERT_FALSE(dense.isEmpty());

    AnalysisPanels panels;
    panels.resize(1200, 500);
    panels.show();
    ASSERT_TRUE(analyse(panels, moe));
    EXPECT_TRUE(panels.isPageShown(QStringLiteral("MoE routing")));
    EXPECT_FALSE(panels.isPageShown(QStringLiteral("FP8"))) << "the MoE run is not FP8";
    MoePanel* p = panels.moePanel();
    ASSERT_EQ(p->view().layers.size(), 2u);
    EXPECT_EQ(p->view().experts, 4);

    // The heat map: a row per layer, a column per expert and then imbalance, aux and z loss.
    QTableWidget* heat = p->heatMap();
    ASSERT_EQ(heat->rowCount(), 2);
    ASSERT_EQ(heat->columnCount(), 4 + 3);
    EXPECT_TRUE(heat->verticalHeaderItem(0)->text().endsWith(QStringLiteral("layer 0")));
    EXPECT_TRUE(heat->verticalHeaderItem(1)->text().endsWith(QStringLiteral("layer 1")));
    EXPECT_EQ(heat->horizontalHeaderItem(3)->text(), QStringLiteral("e3"));
    EXPECT_EQ(heat->horizontalHeaderItem(4)->text(), QStringLiteral("imbalance"));
    for (int row = 0; row < 2; ++row) {
        double sum = 0;
        for (int e = 0; e < 4; ++e) sum += heat->item(row, e)->text().toDouble();
        EXPECT_DOUBLE_EQ(sum, 128.0) << "layer " << row << ": every token goes to 2 experts";
        const MoeLayerRow& l = p->view().layers[size_t(row)];
        ASSERT_GE(l.maxExpert, 0);
        EXPECT_TRUE(heat->item(row, l.maxExpert)->font().bold()) << "the busiest expert of the layer stands out";
        EXPECT_EQ(heat->item(row, 4)->text(), QString::number(l.imbalance, 'f', 2));
        EXPECT_GT(heat->item(row, 5)->text().toDouble(), 0.0) << "aux loss";
        EXPECT_GT(heat->item(row, 6)->text().toDouble(), 0.0) << "z loss";
    }

    // The bars show the most imbalanced layer first, then the row clicked; its busiest expert's
    // bar is the selected (red) one.
    EXPECT_EQ(p->selectedRow(), p->view().mostImbalancedRow(false));
    p->selectRow(0);
    p->selectRow(1);
    EXPECT_EQ(heat->verticalHeaderItem(0)->text().toStdString(), "layer 0");
    EXPECT_EQ(heat->verticalHeaderItem(1)->text().toStdString(), "▸ layer 1") << "the layer the bars show is marked";
    EXPECT_TRUE(p->tokensChart()->chart()->title().contains(QStringLiteral("layer 1"))) << p->tokensChart()->chart()->title().toStdString();
    QBarSet* bars = firstBarSet(p->tokensChart());
    ASSERT_NE(bars, nullptr);
    ASSERT_EQ(bars->count(), 4);
    EXPECT_EQ(bars->selectedBars(), QList<int>{p->view().layers[1].maxExpert});
    QBarSet* imbalance = firstBarSet(p->imbalanceChart());
    ASSERT_NE(imbalance, nullptr);
    EXPECT_EQ(imbalance->count(), 2);
    EXPECT_FALSE(p->lossChart()->toolTip().isEmpty());
    EXPECT_TRUE(p->lossChart()->toolTip().contains(QStringLiteral("imbalance = max/mean"))) << "the document's definition";

    // The last step alone: 128 tokens per layer again, now from step 2 only.
    p->showLastStep(true);
    double sum = 0;
    for (int e = 0; e < 4; ++e) sum += heat->item(0, e)->text().toDouble();
    EXPECT_DOUBLE_EQ(sum, 128.0);
    EXPECT_TRUE(p->headerText().contains(QStringLiteral("step %1 alone").arg(p->view().lastStep))) << p->headerText().toStdString();

    // A dense run: neither tab, and the MoE panel holds nothing of the previous run.
    ASSERT_TRUE(analyse(panels, dense));
    EXPECT_FALSE(panels.isPageShown(QStringLiteral("MoE routing")));
    EXPECT_FALSE(panels.isPageShown(QStringLiteral("FP8")));
    EXPECT_FALSE(p->view().present);
    EXPECT_EQ(heat->rowCount(), 0);
    EXPECT_TRUE(p->headerText().contains(QStringLiteral("no MoE layers")));
}

// Tensors of MoE layers carry the expert (or the shared experts) between layer and linear; the
// Linear column keeps it, the Slot column is the last part.
TEST(CounterPanels, Fp8TableSplitsExpertAndSharedExpertNames) {
    const json doc = {{"fp8",
                       {{"tensor_count", 2},
                        {"tensors", json::array({{{"tensor", "layer1.expert3.linear_fc1.grad"}, {"layer", 1}, {"amax", 1}, {"scale_min", 2}, {"scale_max", 2}, {"ranks", 1}},
                                                 {{"tensor", "layer0.shared_experts.linear_fc2.input"}, {"layer", 0}, {"amax", 1}, {"scale_min", 3}, {"scale_max", 3}, {"ranks", 1}}})}}}};
    const Fp8View v = fp8ViewOf(doc);
    ASSERT_EQ(v.tensors.size(), 2u);
    EXPECT_EQ(v.tensors[0].linear, QStringLiteral("expert3.linear_fc1"));
    EXPECT_EQ(v.tensors[0].slot, QStringLiteral("grad"));
    EXPECT_EQ(v.tensors[1].linear, QStringLiteral("shared_experts.linear_fc2"));
    EXPECT_EQ(v.tensors[1].slot, QStringLiteral("input"));
}

TEST(CounterPanels, Fp8TableSortsByValueAndMarksTheExtremeScales) {
    test::ensureApp();
    const json doc = {
        {"definitions", {{"fp8", "def of fp8"}}},
        {"fp8",
         {{"tensor_count", 3},
          {"smallest_scale", {{"tensor", "layer2.linear_qkv.input"}, {"scale", 9.5}}},
          {"largest_scale", {{"tensor", "layer10.linear_fc1.grad"}, {"scale", 70000}}},
          {"tensors", json::array({{{"tensor", "layer2.linear_qkv.input"}, {"layer", 2}, {"amax", 47}, {"scale_min", 9.5}, {"scale_max", 9.5}, {"ranks", 2}},
                                   {{"tensor", "layer10.linear_fc1.grad"}, {"layer", 10}, {"amax", 0.8}, {"scale_min", 60000}, {"scale_max", 70000}, {"ranks", 2}},
                                   {{"tensor", "layer10.linear_fc1.weight"}, {"layer", 10}, {"amax", 100}, {"scale_min", 100}, {"scale_max", 100}, {"ranks", 2}}})}}}};
    Fp8Panel p;
    p.setView(fp8ViewOf(doc));
    QTableWidget* t = p.table();
    ASSERT_EQ(t->rowCount(), 3);
    EXPECT_TRUE(p.headerText().contains(QStringLiteral("3 tensors"))) << p.headerText().toStdString();
    EXPECT_TRUE(p.headerText().contains(QStringLiteral("layer10.linear_fc1.grad")));
    // The name sorts in the document's order, so layer 10 stays after layer 2.
    EXPECT_EQ(t->item(0, Fp8Panel::Tensor)->text(), QStringLiteral("layer2.linear_qkv.input"));
    // amax by value: 0.8 < 47 < 100 (as text "100" < "47" < "0.8" would not be).
    t->sortByColumn(Fp8Panel::Amax, Qt::AscendingOrder);
    EXPECT_EQ(t->item(0, Fp8Panel::Amax)->text(), QStringLiteral("0.8"));
    EXPECT_EQ(t->item(1, Fp8Panel::Amax)->text(), QStringLiteral("47"));
    EXPECT_EQ(t->item(2, Fp8Panel::Amax)->text(), QStringLiteral("100"));
    t->sortByColumn(Fp8Panel::ScaleMin, Qt::DescendingOrder);
    EXPECT_EQ(t->item(0, Fp8Panel::Tensor)->text(), QStringLiteral("layer10.linear_fc1.grad"));
    EXPECT_EQ(t->item(0, Fp8Panel::ScaleMax)->text(), QStringLiteral("70000"));
    EXPECT_EQ(t->item(0, Fp8Panel::Linear)->text(), QStringLiteral("linear_fc1"));
    EXPECT_EQ(t->item(0, Fp8Panel::Slot)->text(), QStringLiteral("grad"));
    // The extremes are marked wherever sorting moved them; nothing else is.
    const QColor plain = t->item(1, Fp8Panel::ScaleMin)->background().color();
    for (int row = 0; row < 3; ++row) {
        const QString name = t->item(row, Fp8Panel::Tensor)->text();
        EXPECT_EQ(t->item(row, Fp8Panel::ScaleMin)->font().bold(), name == QStringLiteral("layer2.linear_qkv.input")) << name.toStdString();
        EXPECT_EQ(t->item(row, Fp8Panel::ScaleMax)->font().bold(), name == QStringLiteral("layer10.linear_fc1.grad")) << name.toStdString();
        EXPECT_EQ(t->item(row, Fp8Panel::Amax)->font().italic(), name == QStringLiteral("layer10.linear_fc1.grad")) << "scales differ across ranks";
    }
    EXPECT_NE(t->item(2, Fp8Panel::ScaleMin)->background().color(), plain);
    // The header's links find the extreme tensors' rows after the sort moved them.
    EXPECT_TRUE(p.headerText().contains(QStringLiteral("href='tensor:0'"))) << "smallest scale: the document's first tensor";
    ASSERT_EQ(p.rowOfTensor(0), 2);
    p.showTensor(0);
    ASSERT_EQ(t->selectionModel()->selectedRows().size(), 1);
    EXPECT_EQ(t->selectionModel()->selectedRows().front().row(), 2);
    EXPECT_TRUE(t->toolTip().contains(QStringLiteral("def of fp8")));
}
