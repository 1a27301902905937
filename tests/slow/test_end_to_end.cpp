// End-to-end (issues #4/#5): `trainscope run` of a parallel layout leaves a trace of all ranks
// in the run file, and the analyses explain it: pipeline bubble vs the 1F1B theory, exposed DP
// communication with and without overlap_grad_reduce, trace consistency (tracks, ranges, comm
// groups, memory counters, FLOPs vs Megatron's formula), and run -> analyze --json -> compare ->
// export megatron-args through the CLI entry points. Tiny shapes: each test runs in seconds.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/trainscope/commands.h"
#include "profiler/analysis.h"
#include "profiler/store.h"

using namespace ts;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Scratch folder per test, removed at the end.
class TempDir {
public:
    TempDir() {
        m_path = fs::temp_directory_path() /
                 ("ts_slow_" + std::to_string(::getpid()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(m_path);
        fs::create_directories(m_path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(m_path, ec);
    }
    std::string file(const std::string& name) const { return (m_path / name).string(); }

private:
    fs::path m_path;
};

using Knobs = std::map<std::string, std::string>;

// A small GPT on synthetic data, one GEMM thread per rank. Hidden 128 / seq 64 keeps every
// transformer-layer op in the 0.1-1 ms range so it dominates thread-scheduling noise, while
// vocab 64 keeps the first stage's embedding and the last stage's logits + loss small next to
// a layer (balanced pipeline stages). The bubble test uses hidden 256 / seq 128 so that ops
// are long next to thread hand-offs.
Knobs baseKnobs() {
    return {{"num_layers", "8"},         {"hidden_size", "128"},      {"num_attention_heads", "4"},
            {"seq_length", "64"},        {"vocab_size", "64"},        {"make_vocab_size_divisible_by", "64"},
            {"micro_batch_size", "2"},   {"data_path", "synthetic"},  {"lr", "0.001"},
            {"lr_warmup_iters", "0"},    {"clip_grad", "1.0"},        {"train_iters", "3"},
            {"cpu_threads", "1"},        {"seed", "1234"},
            // Values these tests were written against (Megatron's default is learned_absolute).
            {"position_embedding_type", "rope"}, {"hidden_dropout", "0.0"}, {"attention_dropout", "0.0"}};
}

std::string writeConfig(const TempDir& dir, const std::string& name, const Knobs& k) {
    const std::string path = dir.file(name + ".yaml");
    std::ofstream out(path);
    out << "name: " << name << "\n";
    for (const auto& [key, value] : k) out << key << ": " << value << "\n";
    return path;
}

struct CliResult {
    int code = -1;
    std::string out;  // stdout of the command
};

// Runs a trainscope command in this process with its stdout captured.
CliResult runCli(int (*fn)(const cli::Args&), const std::string& command, std::vector<std::string> args,
                 const TempDir& dir) {
    CliResult r;
    const std::string capture = dir.file("stdout_" + command + ".txt");
    std::fflush(stdout);
    const int saved = ::dup(1);
    FILE* f = std::fopen(capture.c_str(), "w");
    if (!f || saved < 0) return r;
    ::dup2(::fileno(f), 1);
    r.code = fn(cli::Args(command, std::move(args)));
    std::fflush(stdout);
    ::dup2(saved, 1);
    ::close(saved);
    std::fclose(f);
    std::ifstream in(capture);
    std::stringstream ss;
    ss << in.rdbuf();
    r.out = ss.str();
    return r;
}

// `trainscope run CFG --run-file PATH` with the given knobs; returns the run file path.
std::string runToFile(const TempDir& dir, const std::string& name, const Knobs& k) {
    const std::string cfg = writeConfig(dir, name, k);
    const std::string runFile = dir.file(name + ".sqlite");
    const CliResult r = runCli(cli::cmdRun, "run", {cfg, "--run-file", runFile, "--json"}, dir);
    EXPECT_EQ(r.code, 0) << r.out;
    return runFile;
}

json analyze(const std::string& runFile) {
    auto store = profiler::TraceStore::open(runFile);
    EXPECT_TRUE(store.isOk()) << store.status().message();
    if (!store.isOk()) return {};
    profiler::AnalyzeOptions o;
    o.criticalPath = false;
    auto doc = profiler::analyzeRun(**store, o);
    EXPECT_TRUE(doc.isOk()) << doc.status().message();
    return doc.isOk() ? *doc : json();
}

// Steps after the first (step 0 = index 0 includes one-time allocation and warm-up costs).
std::vector<json> measuredSteps(const json& doc) {
    std::vector<json> out;
    for (const auto& s : doc.at("steps"))
        if (s.at("step").get<int>() > 0) out.push_back(s);
    return out;
}

struct Bubble {
    double bubbleS = 0, computeS = 0;  // summed over the measured steps and the stage's ranks
};

// Per pp stage: bubble time and busy (step - bubble) time, summed over measured steps.
std::map<int, Bubble> bubbleByStage(const json& doc) {
    std::map<int, Bubble> out;
    for (const auto& s : measuredSteps(doc))
        for (const auto& r : s.at("ranks")) {
            Bubble& b = out[r.at("pp_stage").get<int>()];
            b.bubbleS += r.at("bubble_s").get<double>();
            b.computeS += r.at("step_time_s").get<double>() - r.at("bubble_s").get<double>();
        }
    return out;
}

}  // namespace

// pp=4, 8 microbatches, 2 layers per stage: the idle time of each rank's compute stream
// inside the step, relative to its busy time, against Megatron's (p-1)/m = 3/8.
//
// Definition note: analyze's bubble_fraction is bubble / step time, which for an ideal 1F1B
// pipeline is (p-1)/(m+p-1) = 3/11, while bubble_fraction_theory is (p-1)/(v*m) = 3/8 (the
// Megatron paper's bubble / ideal compute time). We compare like with like: bubble / (step -
// bubble) against (p-1)/(v*m), and bubble_fraction against (p-1)/(v*m + p-1).
//
// Tolerance: the 4 ranks (plus their p2p threads) share 2 cores with whatever else the
// machine runs, so a rank's compute stream also idles while its thread waits for a core and
// between host launches; that inflates the measured bubble. Measured on the shared 2-core
// machine (load ~10), 5 runs: pp4 m8 0.44-0.65 (theory 0.375), pp4 vpp2 m8 0.38-0.63 (theory
// 0.19). So the plain schedule's bubble/busy must lie within [0.5x, 2.5x] of theory and the
// interleaved one above 0.5x of its theory. "Interleaving lowers the bubble" held in 2 of 5
// runs only under that load (the interleaved run has 2x the p2p hand-offs, each paying the
// oversubscription), so it is printed, not asserted.
TEST(EndToEnd, PipelineBubbleNearTheory) {
    TempDir dir;
    Knobs k = baseKnobs();
    k["hidden_size"] = "256";
    k["seq_length"] = "128";
    k["train_iters"] = "2";
    k["pipeline_model_parallel_size"] = "4";
    k["num_microbatches"] = "8";
    k["global_batch_size"] = "16";
    const json plain = analyze(runToFile(dir, "pp4", k));
    k["virtual_pipeline_model_parallel_size"] = "2";
    const json inter = analyze(runToFile(dir, "pp4_vpp2", k));
    ASSERT_FALSE(plain.is_null());
    ASSERT_FALSE(inter.is_null());

    auto check = [](const json& doc, double p, double v, double m, double hi, const char* what) -> double {
        const std::map<int, Bubble> st = bubbleByStage(doc);
        EXPECT_EQ(st.size(), size_t(p)) << what;
        double ratio = 0;
        for (const auto& [stage, b] : st) {
            EXPECT_GT(b.computeS, 0) << what << " stage " << stage;
            if (b.computeS <= 0) return 0;
            ratio += b.bubbleS / b.computeS / double(st.size());
        }
        const double theory = (p - 1) / (v * m);
        std::printf("[%s] bubble/busy mean over stages %.3f, theory (p-1)/(v*m) %.3f\n", what, ratio, theory);
        EXPECT_GT(ratio, 0.5 * theory) << what;
        EXPECT_LT(ratio, hi * theory) << what;
        for (const auto& s : measuredSteps(doc))
            for (const auto& stage : s.at("stages"))
                EXPECT_NEAR(stage.at("bubble_ratio_theory").get<double>(), theory, 1e-9) << what;
        return ratio;
    };
    const double rPlain = check(plain, 4, 1, 8, 2.5, "pp4 m8");
    const double rInter = check(inter, 4, 2, 8, 1e9, "pp4 vpp2 m8");
    std::printf("interleaving %s the bubble/busy ratio (%.3f -> %.3f)\n", rInter < rPlain ? "lowered" : "did not lower",
                rPlain, rInter);
}

// dp=2 with 4 buckets: with overlap_grad_reduce the bucket all-reduces start during backward,
// without it only after the whole backward. What the test asserts is that order, read from the
// trace of every rank and step (a property of when the reductions are issued): the first "dp"
// collective of a step starts before that step's last backward compute op ends with overlap,
// and not before it without. The exposed share of the DP communication is printed, not
// asserted: on 2 oversubscribed cores a collective slice lasts until the partner rank arrives,
// and the ranks' drift (more than the 3 MB in-process transfer) decides how much of it compute
// covers — a timing, which belongs in a benchmark (bench_parallel_step), not in a test.
namespace {

// Per rank and measured step (from step 1): does the step's first "dp" collective start before
// the end of its last compute op before the optimizer? From the run file.
struct DpOrder {
    int steps = 0, startedDuringBackward = 0;
};
DpOrder dpOrder(const std::string& runFile) {
    DpOrder out;
    auto storeR = profiler::TraceStore::open(runFile);
    EXPECT_TRUE(storeR.isOk()) << storeR.status().message();
    if (!storeR.isOk()) return out;
    profiler::TraceStore& store = **storeR;
    auto tracks = store.tracks();
    auto strings = store.strings();
    if (!tracks.isOk() || !strings.isOk()) return out;
    std::map<uint32_t, profiler::TrackRow> trackById;
    for (const auto& t : *tracks) trackById[t.id] = t;
    auto dpId = store.stringId("dp");
    if (!dpId.isOk()) return out;
    auto stepId = store.stringId("step");
    if (!stepId.isOk()) return out;
    // Step windows from the host track's "step" ranges; ops are assigned to the window they start in
    // (collectives on the DP stream carry no step number).
    std::map<int, std::vector<std::pair<int64_t, int64_t>>> windows;  // rank -> [start, end) of steps >= 1
    struct Op {
        int rank;
        int64_t start, end;
        bool dp, optimizer, compute;
    };
    std::vector<Op> ops;
    EXPECT_TRUE(store
                    .forEachSlice({}, [&](const trace::Slice& sl) {
                        const profiler::TrackRow& t = trackById[sl.track];
                        if (sl.category == trace::Category::Range && sl.name == *stepId && sl.step >= 1)
                            windows[t.rank].push_back({sl.startNs, sl.startNs + sl.durNs});
                        const bool dp = t.kind == trace::TrackKind::Comm && sl.category == trace::Category::Collective &&
                                        sl.group == *dpId;
                        const bool comp = t.kind == trace::TrackKind::Compute;
                        if (dp || comp)
                            ops.push_back({t.rank, sl.startNs, sl.startNs + sl.durNs, dp,
                                           comp && sl.category == trace::Category::Optimizer, comp});
                        return true;
                    })
                    .isOk());
    for (const auto& [rank, ws] : windows) {
        for (const auto& [a, b] : ws) {
            int64_t firstDp = INT64_MAX, firstOpt = INT64_MAX, lastBwdEnd = INT64_MIN;
            for (const Op& o : ops) {
                if (o.rank != rank || o.start < a || o.start >= b) continue;
                if (o.dp) firstDp = std::min(firstDp, o.start);
                if (o.optimizer) firstOpt = std::min(firstOpt, o.start);
            }
            for (const Op& o : ops)
                if (o.rank == rank && o.compute && !o.optimizer && o.start >= a && o.start < firstOpt)
                    lastBwdEnd = std::max(lastBwdEnd, o.end);
            if (firstDp == INT64_MAX || lastBwdEnd == INT64_MIN) continue;
            ++out.steps;
            if (firstDp < lastBwdEnd) ++out.startedDuringBackward;
        }
    }
    return out;
}

}  // namespace

TEST(EndToEnd, OverlapGradReduceStartsBucketReductionsDuringBackward) {
    TempDir dir;
    Knobs k = baseKnobs();
    k["num_layers"] = "4";
    k["data_parallel_size"] = "2";
    k["num_microbatches"] = "2";
    k["global_batch_size"] = "8";
    // ~0.8M params (hidden 128, 4 layers): buckets of 200k elements give ~4 buckets.
    k["bucket_size"] = "200000";
    k["train_iters"] = "4";
    k["overlap_grad_reduce"] = "false";
    const std::string offFile = runToFile(dir, "dp2_off", k);
    k["overlap_grad_reduce"] = "true";
    const std::string onFile = runToFile(dir, "dp2_on", k);

    const DpOrder off = dpOrder(offFile), on = dpOrder(onFile);
    ASSERT_GE(off.steps, 4);  // 2 ranks x (steps 1..3)
    ASSERT_GE(on.steps, 4);
    EXPECT_EQ(off.startedDuringBackward, 0) << "without overlap a reduction started before the backward ended";
    EXPECT_EQ(on.startedDuringBackward, on.steps) << "with overlap some step reduced only after its backward";

    // For information: the exposed share (a timing; see above).
    auto dpComm = [](const json& doc, double* exposed, double* total) {
        *exposed = *total = 0;
        for (const auto& s : measuredSteps(doc))
            for (const auto& r : s.at("ranks"))
                for (const auto& c : r.at("comm"))
                    if (c.at("group") == "dp") {
                        *exposed += c.at("exposed_comm_s").get<double>();
                        *total += c.at("comm_s").get<double>();
                    }
    };
    double exOff = 0, totOff = 0, exOn = 0, totOn = 0;
    dpComm(analyze(offFile), &exOff, &totOff);
    dpComm(analyze(onFile), &exOn, &totOn);
    std::printf("dp exposed: off %.4f s of %.4f s, on %.4f s of %.4f s\n", exOff, totOff, exOn, totOn);
}

// Trace of a dp=2 x pp=2 run (world 4): every rank has host, compute, DP-comm and p2p tracks;
// every step range on a rank's host track contains that rank's microbatch ranges of the same
// step; every collective / p2p slice names its process group; memory counters exist per rank
// for params, grads, optimizer state and activations; the metadata the analyses read is there;
// and the FLOPs the kernels report add up to Megatron's model FLOPs per step.
TEST(EndToEnd, ParallelTraceIsConsistent) {
    TempDir dir;
    Knobs k = baseKnobs();
    k["num_layers"] = "4";
    k["data_parallel_size"] = "2";
    k["pipeline_model_parallel_size"] = "2";
    k["num_microbatches"] = "4";
    k["global_batch_size"] = "16";
    k["train_iters"] = "2";
    const std::string runFile = runToFile(dir, "dp2pp2", k);
    auto storeR = profiler::TraceStore::open(runFile);
    ASSERT_TRUE(storeR.isOk()) << storeR.status().message();
    profiler::TraceStore& store = **storeR;

    auto meta = store.allMetadata();
    ASSERT_TRUE(meta.isOk());
    for (const char* key : {"pp", "vpp", "num_microbatches", "model_flops_per_step", "flops_formula", "config"})
        EXPECT_TRUE(meta->count(key)) << "metadata " << key;
    EXPECT_EQ(meta->at("pp"), "2");
    EXPECT_EQ(meta->at("num_microbatches"), "4");
    const double modelFlops = std::stod(meta->at("model_flops_per_step"));
    auto runInfo = store.runInfo();
    ASSERT_TRUE(runInfo.isOk());
    EXPECT_EQ(runInfo->status, "completed");

    auto tracks = store.tracks();
    ASSERT_TRUE(tracks.isOk());
    std::map<uint32_t, profiler::TrackRow> trackById;
    std::map<int, std::set<trace::TrackKind>> kinds;
    for (const auto& t : *tracks) {
        trackById[t.id] = t;
        kinds[t.rank].insert(t.kind);
    }
    ASSERT_EQ(kinds.size(), 4u);
    for (const auto& [rank, ks] : kinds) {
        EXPECT_TRUE(ks.count(trace::TrackKind::HostThread)) << "rank " << rank;
        EXPECT_TRUE(ks.count(trace::TrackKind::Compute)) << "rank " << rank;
        EXPECT_TRUE(ks.count(trace::TrackKind::Comm)) << "rank " << rank;
        EXPECT_TRUE(ks.count(trace::TrackKind::P2P)) << "rank " << rank;
    }

    auto strings = store.strings();
    ASSERT_TRUE(strings.isOk());
    auto str = [&](uint32_t id) -> std::string {
        return id > 0 && id < strings->size() ? (*strings)[id] : std::string();
    };
    auto idOf = [&](const char* text) -> uint32_t {
        auto r = store.stringId(text);
        return r.isOk() ? *r : 0;
    };
    const uint32_t stepName = idOf("step"), mbName = idOf("microbatch");
    ASSERT_NE(stepName, 0u);
    ASSERT_NE(mbName, 0u);

    // (rank, step) -> step range; microbatch ranges; comm groups; kernel FLOPs per step.
    std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> stepRange;
    std::vector<std::pair<std::pair<int, int>, std::pair<int64_t, int64_t>>> mbRanges;
    std::map<std::string, int> commByGroup;
    int commWithoutGroup = 0;
    std::map<int, double> flopsByStep;
    ASSERT_TRUE(store
                    .forEachSlice({}, [&](const trace::Slice& s) {
                        const profiler::TrackRow& t = trackById[s.track];
                        if (s.category == trace::Category::Range) {
                            if (s.name == stepName) stepRange[{t.rank, s.step}] = {s.startNs, s.startNs + s.durNs};
                            if (s.name == mbName) mbRanges.push_back({{t.rank, s.step}, {s.startNs, s.startNs + s.durNs}});
                            return true;
                        }
                        if (t.kind == trace::TrackKind::HostThread) return true;  // launches
                        if (s.category == trace::Category::Collective || s.category == trace::Category::P2P) {
                            if (s.group == 0) ++commWithoutGroup;
                            else ++commByGroup[str(s.group)];
                        }
                        if (t.kind == trace::TrackKind::Compute && s.category != trace::Category::Optimizer)
                            flopsByStep[s.step] += s.flops;
                        return true;
                    })
                    .isOk());
    EXPECT_EQ(stepRange.size(), 4u * 2u);  // 4 ranks x 2 steps
    // Each rank runs 4 local microbatches per step (fwd + bwd in one range or one each).
    EXPECT_GE(mbRanges.size(), 4u * 2u * 4u);
    for (const auto& [key, iv] : mbRanges) {
        auto it = stepRange.find(key);
        ASSERT_NE(it, stepRange.end()) << "microbatch range of rank " << key.first << " step " << key.second
                                       << " has no step range";
        EXPECT_GE(iv.first, it->second.first);
        EXPECT_LE(iv.second, it->second.second);
    }
    EXPECT_EQ(commWithoutGroup, 0);
    EXPECT_GT(commByGroup["dp"], 0);
    EXPECT_GT(commByGroup["pp"], 0);
    EXPECT_GT(commByGroup["embd"], 0);  // tied embedding between the first and last stage

    for (int rank = 0; rank < 4; ++rank) {
        auto counters = store.counters(rank);
        ASSERT_TRUE(counters.isOk());
        std::set<std::string> names;
        for (const auto& c : *counters) names.insert(str(c.name));
        for (const char* cat : {"memory.params", "memory.grads", "memory.optimizer_state", "memory.activations"})
            EXPECT_TRUE(names.count(cat)) << "rank " << rank << " has no " << cat << " counter";
    }

    // Kernel FLOPs of a whole step (all ranks) vs Megatron's num_floating_point_operations.
    // The kernels also report the FLOPs of norms, softmax, GeLU, bias/residual adds and the
    // loss, which Megatron's formula leaves out (GEMMs + attention only), so the kernel sum is
    // a few percent above (5.9 % for this shape); 10 % catches a missing or doubled GEMM
    // (each layer GEMM is > 10 % of a layer's FLOPs at hidden 128).
    ASSERT_GT(modelFlops, 0);
    for (const auto& [step, flops] : flopsByStep) {
        if (step < 0) continue;
        std::printf("step %d: kernel FLOPs %.4g, model FLOPs %.4g, ratio %.4f\n", step, flops, modelFlops,
                    flops / modelFlops);
        EXPECT_NEAR(flops / modelFlops, 1.0, 0.10) << "step " << step;
    }
}

// The CLI path a user takes: run two dp=2 runs that differ in one knob into a workspace,
// analyze --json (the documented keys of docs/profiler.md), compare them, export Megatron args.
TEST(EndToEnd, RunAnalyzeCompareExport) {
    TempDir dir;
    const std::string ws = dir.file("ws");
    Knobs k = baseKnobs();
    k["num_layers"] = "2";
    k["data_parallel_size"] = "2";
    k["pipeline_model_parallel_size"] = "1";
    k["num_microbatches"] = "1";
    k["global_batch_size"] = "4";
    k["train_iters"] = "2";
    k["overlap_grad_reduce"] = "false";
    const std::string cfgA = writeConfig(dir, "runA", k);
    k["overlap_grad_reduce"] = "true";
    const std::string cfgB = writeConfig(dir, "runB", k);

    std::vector<std::string> runFiles;
    for (const std::string& cfg : {cfgA, cfgB}) {
        const CliResult r = runCli(cli::cmdRun, "run", {cfg, "--workspace", ws, "--json"}, dir);
        ASSERT_EQ(r.code, 0) << r.out;
        std::istringstream lines(r.out);
        std::string line, runFile, endStatus;
        while (std::getline(lines, line)) {
            const json ev = json::parse(line, nullptr, false);
            if (ev.is_discarded()) continue;
            if (ev.value("event", "") == "start") runFile = ev.value("run_file", "");
            if (ev.value("event", "") == "end") endStatus = ev.value("status", "");
        }
        EXPECT_EQ(endStatus, "completed");
        ASSERT_FALSE(runFile.empty()) << r.out;
        runFiles.push_back(runFile);
    }

    const CliResult an = runCli(cli::cmdAnalyze, "analyze", {runFiles[1], "--json"}, dir);
    ASSERT_EQ(an.code, 0) << an.out;
    const json doc = json::parse(an.out, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << an.out;
    ASSERT_EQ(doc.at("ranks").size(), 2u);
    for (const auto& r : doc.at("ranks")) {
        for (const char* key : {"rank", "comm_comp_overlap_pct", "comm_s", "temporal_breakdown", "idle_breakdown",
                                "kernels", "memory", "pp_stage"})
            EXPECT_TRUE(r.contains(key)) << "ranks[] lacks " << key;
        EXPECT_TRUE(r.at("memory").contains("peak_memory_bytes"));
        EXPECT_GT(r.at("memory").at("peak_memory_bytes").get<double>(), 0);
        EXPECT_TRUE(r.at("temporal_breakdown").contains("idle_pct"));
        EXPECT_FALSE(r.at("kernels").at("top").empty());
    }
    ASSERT_EQ(doc.at("steps").size(), 2u);
    for (const auto& s : doc.at("steps")) {
        for (const char* key : {"step_time_s", "ranks", "stages", "model_flops", "model_tflops", "mfu"})
            EXPECT_TRUE(s.contains(key)) << "steps[] lacks " << key;
        EXPECT_TRUE(s.at("mfu").is_number()) << "the run measured a CPU peak, so MFU is defined";
        for (const auto& r : s.at("ranks"))
            for (const char* key : {"bubble_s", "bubble_fraction", "bubble_fraction_theory", "comm_s",
                                    "overlapped_comm_s", "exposed_comm_s", "comm_comp_overlap_pct", "comm"})
                EXPECT_TRUE(r.contains(key)) << "steps[].ranks[] lacks " << key;
    }

    const CliResult cmp = runCli(cli::cmdCompare, "compare", {runFiles[0], runFiles[1], "--json", "--workspace", ws}, dir);
    ASSERT_EQ(cmp.code, 0) << cmp.out;
    const json c = json::parse(cmp.out, nullptr, false);
    ASSERT_FALSE(c.is_discarded()) << cmp.out;
    bool sawKnob = false;
    for (const auto& kd : c.at("knobs")) sawKnob |= kd.at("knob") == "overlap_grad_reduce";
    EXPECT_TRUE(sawKnob) << cmp.out;
    bool sawTraceMetric = false;
    for (const auto& m : c.at("metrics")) sawTraceMetric |= m.at("name").get<std::string>().find("comm") != std::string::npos;
    EXPECT_TRUE(sawTraceMetric) << "compare shows no communication metric: " << cmp.out;

    const CliResult ex =
        runCli(cli::cmdExport, "export", {runFiles[1], "--format", "megatron-args", "--workspace", ws}, dir);
    ASSERT_EQ(ex.code, 0) << ex.out;
    EXPECT_NE(ex.out.find("--overlap-grad-reduce"), std::string::npos) << ex.out;
    EXPECT_NE(ex.out.find("--num-layers 2"), std::string::npos) << ex.out;
}
