// The workbench's models and pure functions (gui/core), driven without a window. Every item
// model is wrapped in QAbstractItemModelTester.
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>
#include <QTemporaryDir>

#include "engine/config/knobs.h"
#include "engine/parallel/layout.h"
#include "gui/core/analysis_summary.h"
#include "gui/core/jobs.h"
#include "gui/core/timeline_data.h"
#include "gui/core/knob_model.h"
#include "gui/core/layout_grid.h"
#include "gui/core/run_controller.h"
#include "gui/core/runs_model.h"
#include "profiler/store.h"
#include "sessions/knobs_json.h"
#include "tests/gui/gui_test_util.h"

using namespace ts::gui;
using nlohmann::json;

TEST(GuiKnobModel, GeneratedFromTheRegistryGroupedWithDefaultsAndFlags) {
    test::ensureApp();
    KnobModel m;
    QAbstractItemModelTester tester(&m, QAbstractItemModelTester::FailureReportingMode::Fatal);
    const json reg = ts::sessions::knobRegistryJson();
    m.setRegistry(reg);
    ASSERT_EQ(m.rowCount(), int(reg["groups"].size()));
    int knobs = 0;
    for (int g = 0; g < m.rowCount(); ++g) knobs += m.rowCount(m.index(g, 0));
    EXPECT_EQ(knobs, int(reg["knobs"].size()));

    const QModelIndex tp = m.indexOfKnob(QStringLiteral("tensor_model_parallel_size"));
    ASSERT_TRUE(tp.isValid());
    EXPECT_EQ(tp.data().toString(), "1");
    EXPECT_EQ(tp.siblingAtColumn(KnobModel::FlagColumn).data().toString(), "--tensor-model-parallel-size");
    EXPECT_TRUE(tp.data(Qt::ToolTipRole).toString().contains("Megatron-LM"));
    EXPECT_TRUE(m.toYaml().isEmpty()) << "defaults only: nothing to write";

    // Editing through the view's roles: text for numbers, a check box for bools.
    EXPECT_TRUE(m.setData(tp, QStringLiteral("2"), Qt::EditRole));
    EXPECT_FALSE(m.setData(tp, QStringLiteral("2x"), Qt::EditRole)) << "not a whole number";
    EXPECT_EQ(m.value(QStringLiteral("tensor_model_parallel_size")), json(2));
    const QModelIndex sp = m.indexOfKnob(QStringLiteral("sequence_parallel"));
    ASSERT_TRUE(sp.isValid());
    EXPECT_TRUE(sp.flags() & Qt::ItemIsUserCheckable);
    EXPECT_TRUE(m.setData(sp, Qt::Checked, Qt::CheckStateRole));
    EXPECT_EQ(m.value(QStringLiteral("sequence_parallel")), json(true));
    const QString yaml = m.toYaml();
    EXPECT_TRUE(yaml.contains("tensor_model_parallel_size: 2\n")) << yaml.toStdString();
    EXPECT_TRUE(yaml.contains("sequence_parallel: true\n")) << yaml.toStdString();
    // The YAML the editor writes reads back as the same config (engine's own parser).
    const auto loaded = ts::engine::parseConfigYaml(yaml.toStdString());
    EXPECT_TRUE(loaded.ok()) << (loaded.issues.empty() ? "" : loaded.issues[0].toString());
    EXPECT_EQ(loaded.config.tensor_model_parallel_size, 2);
    EXPECT_TRUE(loaded.config.sequence_parallel);

    // Issues from the node land on their knob; file-level ones stay separate.
    m.setIssues({{QStringLiteral("tensor_model_parallel_size"), QStringLiteral("does not divide heads")},
                 {QString(), QStringLiteral("unknown key 'foo'")}});
    EXPECT_EQ(tp.data(KnobModel::IssueRole).toString(), "does not divide heads");
    EXPECT_EQ(m.fileIssues(), QStringList{QStringLiteral("unknown key 'foo'")});
    // Not-executed knobs are marked.
    bool sawNotExecuted = false;
    for (const auto& k : reg["knobs"])
        if (!k["engine_supported"].get<bool>()) {
            const QModelIndex i = m.indexOfKnob(QString::fromStdString(k["name"].get<std::string>()), KnobModel::NameColumn);
            EXPECT_TRUE(i.data().toString().endsWith("(not executed)"));
            sawNotExecuted = true;
        }
    EXPECT_TRUE(sawNotExecuted);
    // A knob the engine executes some values of: marked at the others.
    const QModelIndex graphs = m.indexOfKnob(QStringLiteral("cuda_graph_impl"), KnobModel::NameColumn);
    ASSERT_TRUE(graphs.isValid());
    EXPECT_EQ(graphs.data().toString(), "cuda_graph_impl");
    m.setValues(json{{"cuda_graph_impl", "local"}});
    EXPECT_EQ(graphs.data().toString(), "cuda_graph_impl (not executed)");
    EXPECT_FALSE(graphs.data(KnobModel::ExecutedRole).toBool());
    EXPECT_TRUE(graphs.data(Qt::ToolTipRole).toString().contains("The engine executes: none, full_iteration"));
    m.setValues(json{{"cuda_graph_impl", "full_iteration"}});
    EXPECT_EQ(graphs.data().toString(), "cuda_graph_impl");
    EXPECT_TRUE(graphs.data(KnobModel::ExecutedRole).toBool());
}

TEST(GuiKnobModel, ParseValueChecksTypes) {
    json v;
    QString err;
    EXPECT_TRUE(KnobModel::parseValue("float", "1e-3", &v, &err));
    EXPECT_DOUBLE_EQ(v.get<double>(), 1e-3);
    EXPECT_FALSE(KnobModel::parseValue("bool", "maybe", &v, &err));
    EXPECT_TRUE(err.contains("maybe"));
    EXPECT_TRUE(KnobModel::parseValue("string_list", "core_attn, mlp", &v, &err));
    EXPECT_EQ(v, json::array({"core_attn", "mlp"}));
    // hierarchical_context_parallel_sizes (type int_list, sessions/knobs_json.cpp)
    EXPECT_TRUE(KnobModel::parseValue("int_list", "2, 2", &v, &err));
    EXPECT_EQ(v, json::array({2, 2}));
    EXPECT_FALSE(KnobModel::parseValue("int_list", "2, two", &v, &err));
    EXPECT_TRUE(err.contains("two"));
    // recompute_modules arrives as "list" (engine::knobTypeName)
    EXPECT_TRUE(KnobModel::parseValue("list", "core_attn, mlp", &v, &err));
    EXPECT_EQ(v, json::array({"core_attn", "mlp"}));
    // Megatron's Union[T, List[T]] knobs: one value is the scalar, several a list
    EXPECT_TRUE(KnobModel::parseValue("enum_or_list", "aux_loss", &v, &err));
    EXPECT_EQ(v, json("aux_loss"));
    EXPECT_TRUE(KnobModel::parseValue("enum_or_list", "aux_loss, seq_aux_loss", &v, &err));
    EXPECT_EQ(v, json::array({"aux_loss", "seq_aux_loss"}));
    EXPECT_TRUE(KnobModel::parseValue("float_or_list", "0.01", &v, &err));
    EXPECT_EQ(v, json(0.01));
    EXPECT_TRUE(KnobModel::parseValue("float_or_list", "1e-2, 1e-3", &v, &err));
    EXPECT_EQ(v, json::array({1e-2, 1e-3}));
    EXPECT_FALSE(KnobModel::parseValue("float_or_list", "1e-2, x", &v, &err));
    EXPECT_TRUE(err.contains("x"));
}

TEST(GuiRunsModel, SortsByValueAndSearchesEveryTerm) {
    test::ensureApp();
    RunsModel m;
    RunsFilterModel f;
    f.setSourceModel(&m);
    QAbstractItemModelTester t1(&m, QAbstractItemModelTester::FailureReportingMode::Fatal);
    QAbstractItemModelTester t2(&f, QAbstractItemModelTester::FailureReportingMode::Fatal);
    json runs = json::array();
    runs.push_back({{"id", "a"}, {"name", "baseline"}, {"status", "completed"}, {"layout", "dp2"}, {"step_time_s", 0.9}, {"tags", {"base"}}});
    runs.push_back({{"id", "b"}, {"name", "overlap"}, {"status", "completed"}, {"layout", "dp2"}, {"step_time_s", 0.25}, {"key_knobs", "overlap_grad_reduce"}});
    runs.push_back({{"id", "c"}, {"name", "broken"}, {"status", "failed"}, {"layout", "tp2"}, {"step_time_s", 0.0}, {"status_reason", "oom"}});
    m.setRuns(runs);
    ASSERT_EQ(m.rowCount(), 3);
    f.sort(RunsModel::StepTime, Qt::AscendingOrder);
    EXPECT_EQ(f.index(0, 0).data(RunsModel::RunIdRole).toString(), "c");
    EXPECT_EQ(f.index(1, 0).data(RunsModel::RunIdRole).toString(), "b") << "0.25 s sorts before 0.9 s by value, not by text";
    // A knobs cell too narrow for its text still tells it whole in its tooltip.
    EXPECT_TRUE(m.index(1, RunsModel::Knobs).data(Qt::ToolTipRole).toString().contains("overlap_grad_reduce"));
    f.setSearch(QStringLiteral("dp2 overlap"));
    ASSERT_EQ(f.rowCount(), 1);
    EXPECT_EQ(f.index(0, 0).data(RunsModel::RunIdRole).toString(), "b");
    f.setSearch(QString());
    f.setStatusFilter(QStringLiteral("failed"));
    ASSERT_EQ(f.rowCount(), 1);
    EXPECT_EQ(f.index(0, RunsModel::Status).data().toString(), "failed");
    // A refresh with the same ids keeps rows in place; a new id resets.
    runs[0]["name"] = "renamed";
    m.setRuns(runs);
    EXPECT_EQ(m.index(0, RunsModel::Name).data().toString(), "renamed");
    EXPECT_EQ(m.rowOfId(QStringLiteral("c")), 2);
}

TEST(GuiAnalysisSummary, MeansOverStepsAfterWarmupAndSplitsTheStep) {
    // Two ranks of a pp2 run, three steps; step 0 is warm-up.
    json doc = {{"world_size", 2}, {"pp", 2}, {"definitions", {{"mfu", "def of mfu"}}},
                {"mfu_inputs", {{"device", "cpu"}, {"dtype", "fp32"}, {"peak_tflops_per_device", 0.1}, {"flops_formula", "6*N*T"}}}};
    json steps = json::array();
    for (int s = 0; s < 3; ++s) {
        const double k = s == 0 ? 10 : 1;  // warm-up is 10x slower
        json ranks = json::array();
        for (int r = 0; r < 2; ++r)
            ranks.push_back({{"rank", r}, {"pp_stage", r}, {"step_time_s", 1.0 * k}, {"bubble_s", 0.25 * k * (r + 1)},
                             {"exposed_comm_s", 0.1 * k}, {"comm", json::array({{{"group", "pp"}, {"kind", "send"}, {"comm_s", 0.2 * k},
                                                                                 {"overlapped_comm_s", 0.1 * k}, {"exposed_comm_s", 0.1 * k}, {"bytes", 100}, {"count", 2}}})}});
        steps.push_back({{"step", s}, {"step_time_s", 1.0 * k}, {"model_tflops", 0.04 / k}, {"model_tflops_per_device", 0.02 / k}, {"mfu", 0.2 / k},
                         {"ranks", ranks}, {"stages", json::array({{{"pp_stage", 0}, {"bubble_fraction", 0.25}, {"bubble_fraction_theory", 0.2}},
                                                                   {{"pp_stage", 1}, {"bubble_fraction", 0.5}, {"bubble_fraction_theory", 0.2}}})}});
    }
    doc["steps"] = steps;
    const AnalysisSummary s = summarizeAnalysis(doc);
    EXPECT_EQ(s.steps, (std::vector<int>{1, 2}));
    EXPECT_EQ(s.stepsInTrace, 3);
    EXPECT_NEAR(s.stepTimeS, 1.0, 1e-12);
    ASSERT_EQ(s.ranks.size(), 2u);
    EXPECT_NEAR(s.ranks[1].computeS, 0.5, 1e-12);      // 1.0 - 0.5 bubble
    EXPECT_NEAR(s.ranks[1].exposedCommS, 0.1, 1e-12);
    EXPECT_NEAR(s.ranks[1].idleS, 0.4, 1e-12);         // bubble - exposed
    EXPECT_NEAR(s.ranks[1].computeS + s.ranks[1].exposedCommS + s.ranks[1].idleS, s.ranks[1].stepS, 1e-12);
    ASSERT_EQ(s.stages.size(), 2u);
    EXPECT_NEAR(s.stages[1].fraction, 0.5, 1e-12);
    EXPECT_NEAR(s.stages[1].theory, 0.2, 1e-12);
    ASSERT_EQ(s.comm.size(), 1u);
    EXPECT_NEAR(s.comm[0].exposedS, 0.2, 1e-12) << "two ranks' exposed send time, mean per step";
    EXPECT_NEAR(s.exposedCommByGroup.at("pp"), 0.2, 1e-12);
    EXPECT_NEAR(s.mfu, 0.2, 1e-12);
    EXPECT_EQ(s.definition("mfu"), "def of mfu");
    // One selected step: only it, warm-up included.
    EXPECT_NEAR(summarizeAnalysis(doc, 0).stepTimeS, 10.0, 1e-12);
}

TEST(GuiAnalysisSummary, TopKernelsAreTheFirstRanksAndSayWhichRankThatIs) {
    // An imported trace of one process: its rank is 3, not 0.
    json doc = {{"world_size", 1}, {"steps", json::array()}};
    doc["ranks"] = json::array(
        {{{"rank", 3},
          {"kernels",
           {{"top", json::array({{{"name", "void at::native::vectorized_elementwise_kernel<4>(int)"}, {"category", "elementwise"},
                                  {"total_s", 0.5}, {"count", 7}, {"pct", 50.0}}})},
            {"by_category", json::array({{{"category", "elementwise"}, {"total_s", 0.5}}})}}}},
         {{"rank", 5},
          {"kernels", {{"top", json::array({{{"name", "other"}, {"category", "gemm"}, {"total_s", 1.0}}})}}}}});
    const AnalysisSummary s = summarizeAnalysis(doc);
    EXPECT_EQ(s.topKernelsRank, 3);
    ASSERT_EQ(s.topKernels.size(), 1u);
    EXPECT_EQ(s.topKernels[0].name.toStdString(), "void at::native::vectorized_elementwise_kernel<4>(int)");
}

TEST(GuiAnalysisSummary, CarriesTheRunsCaveats) {
    json doc = {{"world_size", 4}, {"steps", json::array()}, {"ranks", json::array()}};
    EXPECT_TRUE(summarizeAnalysis(doc).caveats.empty());
    doc["caveats"] = json::array({"the ranks shared GPUs", "not yet checked"});
    const AnalysisSummary s = summarizeAnalysis(doc);
    ASSERT_EQ(s.caveats.size(), 2u);
    EXPECT_EQ(s.caveats[0].toStdString(), "the ranks shared GPUs");
    EXPECT_EQ(s.caveats[1].toStdString(), "not yet checked");
}

TEST(GuiLayoutGrid, MatchesMegatronRankOrder) {
    const LayoutGrid g = layoutGridOf({{"tensor_model_parallel_size", 2}, {"pipeline_model_parallel_size", 2}, {"data_parallel_size", 2}});
    ASSERT_TRUE(g.error.isEmpty()) << g.error.toStdString();
    EXPECT_EQ(g.world, 8);
    // Megatron: global = tp + TP*(cp + CP*(dp + DP*pp)).
    for (int p = 0; p < 2; ++p)
        for (int d = 0; d < 2; ++d)
            for (int t = 0; t < 2; ++t) EXPECT_EQ(g.rankAt(p, d, 0, t), t + 2 * (d + 2 * p));
    EXPECT_FALSE(layoutGridOf({{"tensor_model_parallel_size", 3}, {"world_size", 8}}).error.isEmpty());
    EXPECT_FALSE(layoutGridOf({{"world_size", 100000}}).error.isEmpty());
}

TEST(GuiRunController, RunIdsFromANodeAreFileNameSafe) {
    EXPECT_TRUE(isSafeRunId(QStringLiteral("20250131T120000123Z-3f9a2c")));
    EXPECT_FALSE(isSafeRunId(QStringLiteral("../../x/evil")));
    EXPECT_FALSE(isSafeRunId(QStringLiteral(".hidden")));
    EXPECT_FALSE(isSafeRunId(QString()));
    EXPECT_FALSE(isSafeRunId(QString(200, QLatin1Char('a'))));
}

TEST(GuiJobs, MemorySeriesStacksCategoriesAndKeepsThePeak) {
    QTemporaryDir dir;
    const std::string path = (dir.path() + QStringLiteral("/m.sqlite")).toStdString();
    {
        auto store = ts::profiler::TraceStore::create(path);
        ASSERT_TRUE(store) << store.status().message();
        ts::profiler::TraceWriter w(**store);
        w.track({0, 0, ts::trace::TrackKind::HostThread, 0, "rank 0 host"});
        const uint32_t params = w.intern("memory.params"), acts = w.intern("memory.activations");
        w.counter({0, params, 100, 1000});
        w.counter({0, acts, 100, 0});
        w.counter({0, acts, 200, 5000});   // peak 6000 at 200
        w.counter({0, acts, 300, 100});
        w.counter({0, params, 400, 1000});
        ASSERT_TRUE(w.finish().isOk());
    }
    auto r = memorySeries(path, 0, 100);
    ASSERT_TRUE(r) << r.status().message();
    EXPECT_EQ((*r)["categories"], json::array({"params", "activations"}));
    EXPECT_EQ((*r)["ts_ns"], json::array({100, 200, 300, 400}));
    EXPECT_EQ((*r)["bytes"][1], json::array({1000.0, 5000.0}));
    EXPECT_EQ((*r)["peak"]["ts_ns"], 200);
    EXPECT_DOUBLE_EQ((*r)["peak"]["bytes"].get<double>(), 6000.0);
    // Downsampled to 2 buckets, the peak survives.
    auto small = memorySeries(path, 0, 2);
    ASSERT_TRUE(small);
    bool hasPeak = false;
    for (const auto& t : (*small)["ts_ns"]) hasPeak |= t == 200;
    EXPECT_TRUE(hasPeak);
    EXPECT_LE((*small)["ts_ns"].size(), 2u);
}

// An imported Kineto trace has the allocator's views, allocated and reserved: two measures of
// the same memory. The panel and the timeline row show allocated, never their sum.
TEST(GuiJobs, MemoryOfAnImportedTraceIsAllocatedNotAllocatedPlusReserved) {
    QTemporaryDir dir;
    const std::string path = (dir.path() + QStringLiteral("/k.sqlite")).toStdString();
    {
        auto store = ts::profiler::TraceStore::create(path);
        ASSERT_TRUE(store) << store.status().message();
        ts::profiler::TraceWriter w(**store);
        w.track({0, 0, ts::trace::TrackKind::Compute, 0, "gpu 0 stream 7"});
        const uint32_t alloc = w.intern("memory.allocated"), reserved = w.intern("memory.reserved");
        w.counter({0, alloc, 100, 3000});
        w.counter({0, reserved, 100, 8000});
        w.counter({0, alloc, 200, 5000});
        ASSERT_TRUE(w.finish().isOk());
    }
    auto r = memorySeries(path, 0, 100);
    ASSERT_TRUE(r) << r.status().message();
    EXPECT_EQ((*r)["categories"], json::array({"allocated"}));
    EXPECT_DOUBLE_EQ((*r)["peak"]["bytes"].get<double>(), 5000.0);
    EXPECT_NE((*r)["measure"].get<std::string>().find("allocated"), std::string::npos);
    auto data = loadTimelineData(path);
    ASSERT_TRUE(data.isOk()) << data.status().toString();
    bool sawCounter = false;
    for (const auto& row : (*data)->rows)
        if (row.kind == RowKind::Counter) {
            sawCounter = true;
            EXPECT_DOUBLE_EQ(row.counter.maxValue, 5000.0);
        }
    EXPECT_TRUE(sawCounter);
}
