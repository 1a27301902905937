// analyzeRun: the `trainscope analyze` document (JSON keys name metric and unit; list in
// docs/profiler.md) and its text rendering. Loads each rank once, then computes every per-step
// metric from memory.
#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "profiler/analysis.h"
#include "profiler/analysis_internal.h"
#include "profiler/import/kernel_names.h"

namespace ts::profiler {

using nlohmann::json;
using namespace detail;

namespace {

// One line per metric, printed once in the text report and stored under "definitions".
const std::pair<const char*, const char*> kDefinitions[] = {
    {"step_time_s", "duration of the rank's 'step N' range on its host track"},
    {"bubble_s", "time inside the step not covered by any slice on the rank's compute stream"},
    {"bubble_fraction", "bubble_s / step_time_s"},
    {"bubble_fraction_theory", "(p-1)/(v*m + p-1): the step share a perfect (interleaved) 1F1B pipeline idles"},
    {"bubble_ratio", "bubble_s / (step_time_s - bubble_s): Narayanan et al.'s t_pb/t_id"},
    {"bubble_ratio_theory", "(p-1)/(v*m) from run metadata pp, vpp, num_microbatches"},
    {"comm_s", "union of the rank's communication kernels (Collective|P2P) inside the step"},
    {"overlapped_comm_s", "communication time covered by compute kernels on any stream of the same rank"},
    {"exposed_comm_s", "comm_s - overlapped_comm_s (communication no compute hid)"},
    {"comm_comp_overlap_pct", "HTA: |compute ∩ comm| / |comm| * 100, kernels merged across the rank's streams"},
    {"idle_pct/compute_pct/non_compute_pct",
     "HTA temporal breakdown over [first, last] device kernel of the rank; non-compute = comm + memcpy/memset not under compute"},
    {"host_wait_s/kernel_wait_s/other_wait_s",
     "HTA idle breakdown of gaps between kernels on a stream: launch came after the gap began / gap < 30 us / other"},
    {"model_tflops", "model FLOPs per step / step time (max over ranks) / 1e12, whole job"},
    {"mfu", "model_tflops / world size / peak TFLOP/s of one device"},
    {"peak_memory_bytes",
     "max over time of the sum of the rank's memory.<category> counters; for allocator counters of imported traces "
     "(allocated/reserved) the peak of allocated memory, never allocated + reserved (see peak_memory_measure)"},
    {"definitions_set",
     "trainscope (default): ns timestamps, our kernel classes, last-step cut-off at the last host ProfilerStep; "
     "hta: HTA 0.5 defaults (inward us rounding, HTA's name patterns, GPU-side step copies, host ops with a stream "
     "as GPU time, negative idle gaps summed). docs/profiler.md"},
    {"critical_path", "longest chain of kernels (stream order, cross-stream waits, matched collectives and send->recv) in the step"},
};

double num(const std::map<std::string, std::string>& meta, const std::string& key, double def) {
    auto it = meta.find(key);
    if (it == meta.end()) return def;
    try {
        return std::stod(it->second);
    } catch (...) {
        return def;
    }
}

// Rounds to 1e-9: seconds keep ns resolution, fractions and percentages 9 decimals (short JSON).
double rnd(double v) { return std::round(v * 1e9) / 1e9; }
double sec(double ns) { return ns * 1e-9; }

// "moe" and "fp8" (analysis.h, moeSummary / fp8Summary), only for runs that record them, with
// their definitions. Losses, amax and scales are not rounded: z-losses and scales span many
// orders of magnitude.
Status addModelCounters(TraceStore& store, const std::vector<StepWindow>& windows, int step, json& doc) {
    TS_ASSIGN_OR_RETURN(MoeSummary moe, moeSummary(store, windows, step));
    if (!moe.layers.empty() || moe.samplesOutsideSteps > 0) {
        json layers = json::array();
        for (const auto& l : moe.layers) {
            layers.push_back({{"layer", l.layer}, {"steps", l.steps}, {"aux_loss_mean", l.auxLossMean},
                              {"z_loss_mean", l.zLossMean}, {"tokens_per_expert", l.tokensPerExpert},
                              {"imbalance", l.imbalance}, {"max_expert", l.maxExpert < 0 ? json(nullptr) : json(l.maxExpert)},
                              {"last_step", l.lastStep}, {"aux_loss_last", l.auxLossLast}, {"z_loss_last", l.zLossLast},
                              {"tokens_per_expert_last", l.tokensPerExpertLast}, {"imbalance_last", l.imbalanceLast}});
            if (l.hasDropped) {
                layers.back()["dropped_tokens_mean"] = l.droppedMean;
                layers.back()["dropped_tokens_last"] = l.droppedLast;
            }
        }
        doc["moe"] = {{"layers", layers}, {"samples_outside_steps", moe.samplesOutsideSteps}};
        doc["definitions"]["moe"] =
            "per layer: aux/z loss of a step = mean of its samples (ranks x forwards), *_mean = mean over steps; "
            "tokens_per_expert = tokens routed to each expert in a step summed over ranks and forwards, mean over "
            "steps; imbalance = max/mean of tokens_per_expert (the routing, before any dropping); "
            "dropped_tokens_mean/_last (with an expert capacity) = token copies dropped in a step, summed over ranks "
            "and forwards";
    }
    TS_ASSIGN_OR_RETURN(Fp8Summary fp8, fp8Summary(store, windows, step));
    if (!fp8.tensors.empty()) {
        json tensors = json::array();
        for (const auto& t : fp8.tensors)
            tensors.push_back({{"tensor", t.tensor}, {"layer", t.layer}, {"amax", t.amax}, {"scale_min", t.scaleMin},
                               {"scale_max", t.scaleMax}, {"ranks", t.ranks}});
        const Fp8TensorStats* lo = fp8.smallestScale();
        const Fp8TensorStats* hi = fp8.largestScale();
        doc["fp8"] = {{"tensor_count", fp8.tensors.size()},
                      {"smallest_scale", {{"tensor", lo->tensor}, {"scale", lo->scaleMin}}},
                      {"largest_scale", {{"tensor", hi->tensor}, {"scale", hi->scaleMax}}},
                      {"tensors", tensors}};
        doc["definitions"]["fp8"] =
            "per FP8 tensor the last amax and scale each rank recorded (recorded at the start of every step: the "
            "scales that step uses); amax = max over ranks, scale_min/scale_max over ranks";
    }
    return Status::ok();
}

}  // namespace

// ---- analyzeRun ----------------------------------------------------------------------------

Result<json> analyzeRun(TraceStore& store, const AnalyzeOptions& opt) {
    TS_ASSIGN_OR_RETURN(auto strings, store.strings());
    TS_ASSIGN_OR_RETURN(auto meta, store.allMetadata());
    TS_ASSIGN_OR_RETURN(auto rankIds, store.ranks());
    TS_ASSIGN_OR_RETURN(HtaContext htaCtx, htaContext(store));
    TS_ASSIGN_OR_RETURN(NameClasses classes, nameClassesFor(store, strings, opt.definitions));
    if (rankIds.empty()) return Status::notFound("run file '" + store.path() + "' holds no trace (no tracks)");

    json doc;
    doc["schema"] = "trainscope.analyze/1";
    if (auto ri = store.runInfo()) {
        doc["run"] = {{"id", ri->id}, {"name", ri->name}, {"status", ri->status}, {"layout", ri->layout},
                      {"source", ri->source}};
    } else {
        doc["run"] = json::object();
    }
    doc["run"]["file"] = store.path();
    // What the run's numbers are not, from its metadata (the text and the workbench show these
    // before the numbers).
    json caveats = json::array();
    auto flag = [&](const char* key) {
        auto it = meta.find(key);
        return it != meta.end() && (it->second == "true" || it->second == "1");
    };
    if (flag("cuda_shared_gpus"))
        caveats.push_back("the ranks shared GPUs (cuda_share_gpus: threads of one process on the visible GPUs, "
                          "collectives through host memory instead of NCCL): the losses and memory are the layout's, "
                          "the step times and communication are not");
    else if (flag("host_sync_collectives"))
        caveats.push_back("every collective held its rank's host until done (TS_HOST_SYNC_COLLECTIVES=1): nothing "
                          "overlapped communication, so step times are longer than the layout's");
    const std::string stillFp32 =
        "some saved tensors stay fp32 (4 bytes): the probabilities the unfused attention keeps, FP8 linears' inputs "
        "(1 byte in Megatron-LM), SwiGLU's fc1 with its bias, the final norm and the logits";
    const std::string workingWeights =
        "the part of the model being run (a layer, the embedding, the output layer) reads its weights from an fp32 "
        "working copy of them (Workspace memory; Megatron-LM's GEMMs read the bf16 params)";
    if (auto it = meta.find("bf16_storage"); it != meta.end() && it->second == "bf16")
        caveats.push_back("bf16 run: the bf16 params and the layers' saved activations are bf16 (2 bytes, as "
                          "Megatron-LM keeps them), but " + workingWeights +
                          ", the working tensors of the layer being run are fp32 words holding bf16 values, and " +
                          stillFp32 + "; fp32 main params, grads and optimizer state are as Megatron's");
    else if (it != meta.end() && it->second == "params_bf16")
        caveats.push_back("bf16 run whose activations are fp32 words holding bf16 values (TS_BF16_SAVED_FP32=1): "
                          "their memory is about twice what Megatron-LM keeps for them; the bf16 params are 2 bytes, "
                          "but " + workingWeights + "; fp32 main params, grads and optimizer state are as Megatron's");
    // Run files of earlier versions, whose bf16 model copy was fp32 words.
    else if (it != meta.end() && it->second == "fp32")
        caveats.push_back("bf16 run whose activations and bf16 model copy are fp32 words holding bf16 values "
                          "(emulated bf16 storage): their memory is about twice what Megatron-LM keeps for them; "
                          "fp32 main params, grads and optimizer state are as Megatron's");
    else if (it != meta.end() && it->second == "saved_bf16")
        caveats.push_back("bf16 run: the layers' saved activations are bf16 (2 bytes, as Megatron-LM keeps them), but "
                          "the bf16 model copy and the working tensors of the layer being run are fp32 words holding "
                          "bf16 values (twice Megatron-LM's bytes), and some saved tensors stay fp32 (4 bytes): the "
                          "probabilities the unfused attention keeps, FP8 linears' inputs (1 byte in Megatron-LM), "
                          "SwiGLU's fc1 with its bias, the final norm and the logits; fp32 main params, grads and "
                          "optimizer state are as Megatron's");
    if (flag("cuda_unverified"))
        caveats.push_back("a CUDA layout over several ranks (TS_CUDA_UNVERIFIED=1): not yet checked against the CPU "
                          "backend on a machine with several GPUs (docs/cuda_port.md)");
    doc["caveats"] = caveats;
    json defs = json::object();
    for (auto& [k, v] : kDefinitions) defs[k] = v;
    doc["definitions"] = defs;

    const int world = int(rankIds.size());
    const double deviceMemory = num(meta, "device_memory_bytes", 0);  // from the trace, when it says
    doc["definitions_set"] = opt.definitions.name();
    const int pp = std::max(1, int(num(meta, "pp", 1)));
    const int perStage = world % pp == 0 ? world / pp : world;
    const double theory = bubbleTheory(meta);  // (p-1)/(v*m), the ratio form
    const double fractionTheory = theory > 0 ? theory / (1 + theory) : 0;
    // Stage of a rank: its position among the trace's ranks / ranks per stage (Megatron order
    // tp-cp-ep-dp-pp puts pp outermost). Positions, not ids: an imported single rank 3 is stage 0.
    auto stageOf = [&](int rank) {
        int pos = int(std::lower_bound(rankIds.begin(), rankIds.end(), rank) - rankIds.begin());
        return pos / perStage;
    };

    std::vector<RankData> data;
    data.reserve(rankIds.size());
    json ranksJ = json::array();
    std::map<int, std::vector<StepWindow>> windowsByStep;
    std::vector<StepWindow> allWindows;  // every step of every rank: the model counters' steps
    // Reading rows out of SQLite is most of the cost: a file-backed store is read by several
    // threads, each with its own read-only connection (WAL readers never block each other).
    std::vector<std::optional<Result<RankData>>> loaded(rankIds.size());
    if (store.path() != ":memory:" && !store.path().empty() && rankIds.size() > 1) {
        unsigned nThreads = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), unsigned(rankIds.size()));
        std::atomic<size_t> next{0};
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < nThreads; ++t)
            pool.emplace_back([&] {
                auto conn = TraceStore::open(store.path(), true);
                for (size_t i; (i = next.fetch_add(1)) < rankIds.size();)
                    loaded[i] = conn ? loadRank(**conn, rankIds[i], classes) : Result<RankData>(conn.status());
            });
        for (auto& th : pool) th.join();
    }
    for (size_t ri = 0; ri < rankIds.size(); ++ri) {
        const int r = rankIds[ri];
        if (!loaded[ri]) loaded[ri] = loadRank(store, r, classes);
        if (!loaded[ri]->isOk()) return loaded[ri]->status();
        RankData d = std::move(**loaded[ri]);
        loaded[ri].reset();
        indexRank(d);
        OverlapResult ov;
        TemporalBreakdown tb;
        IdleBreakdown idle;
        int64_t from = INT64_MIN, to = INT64_MAX;
        auto windows = stepsOf(d, strings);
        if (opt.step >= 0) {
            auto w = std::find_if(windows.begin(), windows.end(), [&](const StepWindow& x) { return x.step == opt.step; });
            if (w != windows.end()) {
                from = w->startNs;
                to = w->endNs;
            }
        }
        KernelBreakdown kb;
        {
            // References, not copies: a native trace keeps every kernel (no HTA filter). Every
            // per-rank analysis reads the same kernels (the kernel breakdown included).
            std::vector<Kernel> storage;
            const std::vector<Kernel>& hta = htaKernelsRef(d, classes, htaCtx, /*timeOrder=*/true, storage);
            ov = overlapOf(hta);
            tb = temporalOf(hta);
            const std::vector<Kernel>& byTrack = htaKernelsRef(d, classes, htaCtx, /*timeOrder=*/false, storage);
            kb = kernelsOf(byTrack, strings, opt.topKernels, from, to);
            idle = idleOf(d, htaKernelsRef(d, classes, htaCtx, /*timeOrder=*/false, storage, /*forIdle=*/true), INT64_MIN,
                          INT64_MAX, opt.definitions);
        }
        json rj;
        rj["rank"] = r;
        rj["pp_stage"] = stageOf(r);
        // A share of no communication is not 0 %: unknown, with the reason.
        rj["comm_comp_overlap_pct"] = ov.commNs > 0 ? json(rnd(ov.pct)) : json(nullptr);
        if (ov.commNs <= 0) rj["comm_comp_overlap_unknown_reason"] = "no communication kernels on this rank";
        rj["comm_s"] = rnd(sec(ov.commNs));
        rj["temporal_breakdown"] = {{"kernel_time_s", rnd(sec(tb.kernelTimeNs))}, {"idle_s", rnd(sec(tb.idleNs))},
                                    {"compute_s", rnd(sec(tb.computeNs))}, {"non_compute_s", rnd(sec(tb.nonComputeNs))},
                                    {"idle_pct", rnd(tb.idlePct)}, {"compute_pct", rnd(tb.computePct)},
                                    {"non_compute_pct", rnd(tb.nonComputePct)}};
        rj["idle_breakdown"] = {{"host_wait_s", rnd(sec(idle.hostWaitNs))}, {"kernel_wait_s", rnd(sec(idle.kernelWaitNs))},
                                {"other_wait_s", rnd(sec(idle.otherNs))}};
        json top = json::array(), cats = json::array();
        for (auto& k : kb.topKernels)
            top.push_back({{"name", k.name}, {"category", k.category}, {"count", k.count}, {"total_s", rnd(sec(k.totalNs))},
                           {"max_s", rnd(sec(k.maxNs))}, {"pct", kb.totalNs > 0 ? rnd(100 * k.totalNs / kb.totalNs) : 0.0},
                           {"flops", k.flops}});
        for (auto& k : kb.byCategory)
            cats.push_back({{"category", k.name}, {"count", k.count}, {"total_s", rnd(sec(k.totalNs))},
                            {"pct", kb.totalNs > 0 ? rnd(100 * k.totalNs / kb.totalNs) : 0.0}});
        json classes = json::array();
        for (auto& k : kb.byClass)
            classes.push_back({{"class", k.name}, {"count", k.count}, {"total_s", rnd(sec(k.totalNs))},
                               {"pct", kb.totalNs > 0 ? rnd(100 * k.totalNs / kb.totalNs) : 0.0}});
        rj["kernels"] = {{"total_s", rnd(sec(kb.totalNs))}, {"top", top}, {"by_category", cats}, {"by_class", classes}};
        TS_ASSIGN_OR_RETURN(MemorySummary mem, memorySummary(store, r, opt.memoryPoints));
        json series = json::array();
        for (auto& p : mem.series) series.push_back({p.tsNs, p.totalBytes});
        auto optJ = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
        rj["memory"] = {{"peak_memory_bytes", mem.measure.empty() ? json(nullptr) : json(mem.peakTotalBytes)},
                        {"peak_memory_measure", mem.measure.empty() ? json(nullptr) : json(mem.measure)},
                        {"peak_allocated_bytes", optJ(mem.peakAllocatedBytes)},
                        {"peak_reserved_bytes", optJ(mem.peakReservedBytes)},
                        {"device_memory_bytes", deviceMemory > 0 ? json(deviceMemory) : json(nullptr)},
                        {"peak_bytes_by_category", mem.peakBytesByCategory},
                        {"series_ts_ns_bytes", series}};
        if (mem.measure.empty()) rj["memory"]["unknown_reason"] = "the trace has no memory counters";
        ranksJ.push_back(rj);
        for (auto& w : windows)
            if (opt.step < 0 || w.step == opt.step) windowsByStep[w.step].push_back(w);
        allWindows.insert(allWindows.end(), windows.begin(), windows.end());
        // The per-step metrics below read only the indexed views (byStart, merged sets): drop
        // the (track, ts)-ordered copies now, which halves the peak memory of a large trace.
        d.kernels = {};
        d.computeStreamBusy = {};
        data.push_back(std::move(d));
    }
    doc["ranks"] = ranksJ;
    doc["world_size"] = world;
    doc["pp"] = pp;

    // MFU inputs.
    std::string device = !opt.deviceName.empty() ? opt.deviceName : (meta.count("device_name") ? meta["device_name"] : "cpu");
    std::string dtype = !opt.dtype.empty() ? opt.dtype : (meta.count("dtype") ? meta["dtype"] : "fp32");
    std::optional<double> peak;
    std::string peakSource;
    std::string tablePath = opt.peakFlopsTable.empty() ? defaultPeakFlopsTablePath() : opt.peakFlopsTable;
    if (!tablePath.empty()) {
        auto table = loadPeakFlopsTable(tablePath);
        if (!table && !opt.peakFlopsTable.empty()) return table.status();
        if (table) {
            peak = table->lookup(device, dtype);
            if (peak) peakSource = tablePath;
        }
    }
    if (!peak && meta.count("peak_tflops")) {
        double v = num(meta, "peak_tflops", 0);
        if (v > 0) {
            peak = v;
            peakSource = "metadata peak_tflops (measured by the engine)";
        }
    }
    double modelFlops = num(meta, "model_flops_per_step", 0);
    doc["mfu_inputs"] = {{"device", device}, {"dtype", dtype},
                         {"peak_tflops_per_device", peak ? json(*peak) : json(nullptr)},
                         {"peak_source", peakSource},
                         {"model_flops_per_step", modelFlops > 0 ? json(modelFlops) : json(nullptr)},
                         {"flops_formula", meta.count("flops_formula") ? meta["flops_formula"] : std::string()},
                         {"flops_source", modelFlops > 0 ? "metadata model_flops_per_step" : "sum of slice flops in the step"}};

    std::map<int, const RankData*> byRank;
    for (auto& d : data) byRank[d.rank] = &d;
    // Critical paths of the steps are independent: computed up front on a few threads (the
    // per-step JSON below is cheap), in the steps' order.
    std::vector<CriticalPath> paths(windowsByStep.size());
    if (opt.criticalPath && !windowsByStep.empty()) {
        std::vector<const std::vector<StepWindow>*> stepWindowsList;
        for (auto& [step, windows] : windowsByStep) stepWindowsList.push_back(&windows);
        std::vector<const RankData*> ptrs;
        for (auto& d : data) ptrs.push_back(&d);
        std::atomic<size_t> next{0};
        auto work = [&] {
            for (size_t i; (i = next.fetch_add(1)) < stepWindowsList.size();)
                paths[i] = criticalPathOf(ptrs, strings, *stepWindowsList[i], 32);
        };
        unsigned nThreads = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()),
                                               unsigned(stepWindowsList.size()));
        std::vector<std::thread> pool;
        for (unsigned t = 1; t < nThreads; ++t) pool.emplace_back(work);
        work();
        for (auto& th : pool) th.join();
    }
    json stepsJ = json::array();
    size_t stepIndex = 0;
    for (auto& [step, windows] : windowsByStep) {
        json sj;
        sj["step"] = step;
        double stepNs = 0, sliceFlops = 0;
        json rs = json::array();
        std::map<int, std::pair<double, double>> stage;  // stage -> (sum bubble_s, sum fraction)
        std::map<int, int> stageCount;
        std::map<int, double> stageRatio;
        for (auto& w : windows) {
            const RankData& d = *byRank[w.rank];
            stepNs = std::max(stepNs, w.durNs());
            BubbleResult b = bubbleOf(d, w, theory);
            IntervalSet comp = clipSet(d.computeSet, w.startNs, w.endNs);
            IntervalSet comm = clipSet(d.commSet, w.startNs, w.endNs);
            OverlapResult ov;  // HTA overlap inside the window (same as overlapOf on clipped kernels)
            ov.commNs = double(totalLength(comm));
            ov.overlappedNs = double(totalLength(intersectSets(comp, comm)));
            ov.pct = ov.commNs > 0 ? 100.0 * ov.overlappedNs / ov.commNs : 0.0;
            double exposed = double(totalLength(subtractSets(comm, comp)));
            auto [kb, ke] = kernelsNear(d, w.startNs, w.endNs);
            for (const Kernel* k = kb; k != ke; ++k)
                if (k->start >= w.startNs && k->start < w.endNs) sliceFlops += k->flops;
            json cj = json::array();
            for (auto& c : commOf(d, strings, w.startNs, w.endNs))
                cj.push_back({{"group", c.group}, {"kind", c.kind}, {"count", c.count}, {"bytes", c.bytes},
                              {"comm_s", rnd(sec(c.totalNs))}, {"overlapped_comm_s", rnd(sec(c.overlappedNs))},
                              {"exposed_comm_s", rnd(sec(c.exposedNs))}});
            int st = stageOf(w.rank);
            stage[st].first += sec(b.bubbleNs);
            stage[st].second += b.fraction;
            stageRatio[st] += b.ratio;
            stageCount[st] += 1;
            rs.push_back({{"rank", w.rank}, {"pp_stage", st}, {"step_time_s", rnd(sec(b.stepNs))},
                          {"bubble_s", rnd(sec(b.bubbleNs))}, {"bubble_fraction", rnd(b.fraction)},
                          {"bubble_fraction_theory", rnd(fractionTheory)}, {"bubble_ratio", rnd(b.ratio)},
                          {"bubble_ratio_theory", rnd(theory)}, {"comm_s", rnd(sec(ov.commNs))},
                          {"overlapped_comm_s", rnd(sec(ov.overlappedNs))}, {"exposed_comm_s", rnd(sec(exposed))},
                          {"comm_comp_overlap_pct", ov.commNs > 0 ? json(rnd(ov.pct)) : json(nullptr)}, {"comm", cj}});
        }
        sj["step_time_s"] = rnd(sec(stepNs));
        sj["ranks"] = rs;
        json stagesJ = json::array();
        for (auto& [st, v] : stage)
            stagesJ.push_back({{"pp_stage", st}, {"ranks", stageCount[st]}, {"bubble_s", rnd(v.first / stageCount[st])},
                               {"bubble_fraction", rnd(v.second / stageCount[st])},
                               {"bubble_fraction_theory", rnd(fractionTheory)},
                               {"bubble_ratio", rnd(stageRatio[st] / stageCount[st])},
                               {"bubble_ratio_theory", rnd(theory)}});
        sj["stages"] = stagesJ;
        double flops = modelFlops > 0 ? modelFlops : sliceFlops;
        double tflops = stepNs > 0 ? flops / sec(stepNs) / 1e12 : 0;
        // Without FLOPs (no model_flops_per_step, no FLOPs on the kernels: every imported
        // trace) throughput and MFU are unknown, never a 0 that reads like a measurement.
        const bool haveFlops = flops > 0 && stepNs > 0;
        sj["model_flops"] = flops > 0 ? json(flops) : json(nullptr);
        sj["model_tflops"] = haveFlops ? json(rnd(tflops)) : json(nullptr);
        sj["model_tflops_per_device"] = haveFlops ? json(rnd(tflops / world)) : json(nullptr);
        sj["mfu"] = haveFlops && peak && *peak > 0 ? json(rnd(tflops / world / *peak)) : json(nullptr);
        if (!haveFlops)
            sj["mfu_unknown_reason"] = stepNs > 0 ? "no FLOPs: the run has no model_flops_per_step metadata and no "
                                                    "kernel carries FLOPs (imported traces do not record them)"
                                                  : "the step has no duration";
        else if (!peak || *peak <= 0)
            sj["mfu_unknown_reason"] = "no peak FLOP/s for device '" + device + "' and dtype '" + dtype +
                                       "' (add a row to the peak table, or pass --device / --dtype / --peak-flops)";
        if (opt.criticalPath) {
            const CriticalPath& cp = paths[stepIndex];
            json path = json::array();
            for (auto& e : cp.path)
                path.push_back({{"rank", e.rank}, {"track", e.track}, {"name", e.name}, {"category", e.category},
                                {"start_ns", e.startNs}, {"dur_s", rnd(sec(double(e.durNs)))}});
            json byCat = json::object();
            for (auto& [c, v] : cp.nsByCategory) byCat[c] = rnd(sec(v));
            sj["critical_path"] = {{"length_s", rnd(sec(cp.lengthNs))},
                                   {"fraction_of_step", stepNs > 0 ? rnd(cp.lengthNs / stepNs) : 0.0},
                                   {"by_category_s", byCat}, {"path", path}};
        }
        stepsJ.push_back(sj);
        ++stepIndex;
    }
    if (opt.step >= 0 && stepsJ.empty())
        return Status::notFound("step " + std::to_string(opt.step) + " is not in the trace of '" + store.path() + "'");
    doc["steps"] = stepsJ;
    TS_RETURN_IF_ERROR(addModelCounters(store, allWindows, opt.step, doc));
    if (auto st = store.stats()) doc["stats"] = *st;
    return doc;
}

// ---- text rendering -------------------------------------------------------------------------

namespace {
std::string fmt(const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}
std::string ms(const json& v) { return v.is_number() ? fmt("%.3f", v.get<double>() * 1e3) : "-"; }
std::string pct(const json& v) { return v.is_number() ? fmt("%.2f", v.get<double>()) : "-"; }
std::string bytesStr(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        ++u;
    }
    return fmt("%.1f ", b) + units[u];
}
}  // namespace

std::string formatAnalysisText(const json& doc) {
    std::ostringstream o;
    const json run = doc.value("run", json::object());
    o << "run " << run.value("name", std::string()) << " (" << run.value("file", std::string()) << ")";
    if (doc.value("definitions_set", std::string()) == "hta") o << "  definitions: HTA's defaults";
    if (!run.value("layout", std::string()).empty()) o << "  layout " << run.value("layout", std::string());
    o << "  world " << doc.value("world_size", 0) << "\n";
    for (const auto& c : doc.value("caveats", json::array())) o << "caution: " << c.get<std::string>() << "\n";
    o << "\n";

    const json steps = doc.value("steps", json::array());
    for (const auto& s : steps) {
        o << "step " << s["step"].get<int>() << ": step time " << ms(s["step_time_s"]) << " ms";
        o << ", model " << (s["model_tflops"].is_number() ? fmt("%.3f", s["model_tflops"].get<double>()) + " TFLOP/s"
                                                             : std::string("TFLOP/s unknown"));
        o << ", MFU "
          << (s["mfu"].is_number() ? fmt("%.2f %%", s["mfu"].get<double>() * 100)
                                   : "unknown (" + s.value("mfu_unknown_reason", std::string("no value")) + ")")
          << "\n";
        char line[256];
        std::snprintf(line, sizeof line, "  %4s %5s %10s %10s %8s %8s %10s %10s %10s %8s\n", "rank", "stage", "step ms",
                      "bubble ms", "bubble", "theory", "comm ms", "overlap ms", "exposed ms", "overlap%");
        o << line;
        for (const auto& r : s["ranks"]) {
            std::snprintf(line, sizeof line, "  %4d %5d %10s %10s %8s %8s %10s %10s %10s %8s\n", r["rank"].get<int>(),
                          r["pp_stage"].get<int>(), ms(r["step_time_s"]).c_str(), ms(r["bubble_s"]).c_str(),
                          pct(json(r["bubble_fraction"].get<double>() * 100)).c_str(),
                          pct(json(r["bubble_fraction_theory"].get<double>() * 100)).c_str(), ms(r["comm_s"]).c_str(),
                          ms(r["overlapped_comm_s"]).c_str(), ms(r["exposed_comm_s"]).c_str(),
                          pct(r["comm_comp_overlap_pct"]).c_str());
            o << line;
        }
        bool anyComm = false;
        for (const auto& r : s["ranks"])
            for (const auto& c : r["comm"]) {
                if (!anyComm) {
                    std::snprintf(line, sizeof line, "  %4s %-8s %-22s %6s %12s %10s %10s %10s\n", "rank", "group",
                                  "kind", "count", "bytes", "comm ms", "overlap ms", "exposed ms");
                    o << "  communication per group and kind:\n" << line;
                    anyComm = true;
                }
                std::snprintf(line, sizeof line, "  %4d %-8s %-22s %6lld %12s %10s %10s %10s\n", r["rank"].get<int>(),
                              c["group"].get<std::string>().c_str(), c["kind"].get<std::string>().substr(0, 22).c_str(),
                              (long long)c["count"].get<int64_t>(), bytesStr(c["bytes"].get<double>()).c_str(),
                              ms(c["comm_s"]).c_str(), ms(c["overlapped_comm_s"]).c_str(), ms(c["exposed_comm_s"]).c_str());
                o << line;
            }
        if (s.contains("critical_path")) {
            const json& cp = s["critical_path"];
            o << "  critical path " << ms(cp["length_s"]) << " ms (" << pct(json(cp["fraction_of_step"].get<double>() * 100))
              << " % of step):";
            for (auto& [c, v] : cp["by_category_s"].items()) o << " " << c << " " << ms(v);
            o << "\n";
        }
        o << "\n";
    }

    o << "per rank (whole trace):\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %4s %9s %7s %9s %12s %10s %10s %10s %12s\n", "rank", "overlap%", "idle%", "compute%",
                  "non-compute%", "host wait", "kern wait", "other wait", "peak mem");
    o << line;
    const json ranks = doc.value("ranks", json::array());
    for (const auto& r : ranks) {
        const json& tb = r["temporal_breakdown"];
        const json& ib = r["idle_breakdown"];
        std::snprintf(line, sizeof line, "  %4d %9s %7s %9s %12s %10s %10s %10s %12s\n", r["rank"].get<int>(),
                      pct(r["comm_comp_overlap_pct"]).c_str(), pct(tb["idle_pct"]).c_str(), pct(tb["compute_pct"]).c_str(),
                      pct(tb["non_compute_pct"]).c_str(), (ms(ib["host_wait_s"]) + "ms").c_str(),
                      (ms(ib["kernel_wait_s"]) + "ms").c_str(), (ms(ib["other_wait_s"]) + "ms").c_str(),
                      (r["memory"]["peak_memory_bytes"].is_number() ? bytesStr(r["memory"]["peak_memory_bytes"].get<double>())
                                                                      : std::string("unknown")).c_str());
        o << line;
    }
    for (const auto& r : ranks) {
        const json& m = r["memory"];
        if (!m["peak_memory_measure"].is_string()) continue;
        auto b = [](const json& v) { return v.is_number() ? bytesStr(v.get<double>()) : std::string("unknown"); };
        o << "  rank " << r["rank"].get<int>() << " memory: peak " << b(m["peak_memory_bytes"]) << " ("
          << m["peak_memory_measure"].get<std::string>() << "); allocated " << b(m["peak_allocated_bytes"])
          << ", reserved " << b(m["peak_reserved_bytes"]) << ", device " << b(m["device_memory_bytes"]) << "\n";
    }
    if (doc.contains("moe")) {
        const json& moe = doc["moe"];
        o << "\nMoE router (mean over steps; tokens per expert summed over ranks per step):\n";
        for (const auto& l : moe["layers"]) {
            o << "  layer " << l["layer"].get<int>() << ": aux " << fmt("%.4g", l["aux_loss_mean"].get<double>()) << " z "
              << fmt("%.4g", l["z_loss_mean"].get<double>()) << ", tokens/expert imbalance "
              << fmt("%.2f", l["imbalance"].get<double>());
            if (l["max_expert"].is_number()) o << " (max expert " << l["max_expert"].get<int>() << ")";
            o << "; last step " << l["last_step"].get<int>() << ": aux " << fmt("%.4g", l["aux_loss_last"].get<double>())
              << " z " << fmt("%.4g", l["z_loss_last"].get<double>()) << ", imbalance "
              << fmt("%.2f", l["imbalance_last"].get<double>());
            if (l.contains("dropped_tokens_mean"))
                o << "; dropped " << fmt("%.1f", l["dropped_tokens_mean"].get<double>()) << " token copies/step";
            o << "\n";
        }
        if (moe.value("samples_outside_steps", int64_t(0)) > 0)
            o << "  (" << moe["samples_outside_steps"].get<int64_t>() << " samples outside every step not counted)\n";
    }
    if (doc.contains("fp8")) {
        const json& f = doc["fp8"];
        int differ = 0;
        for (const auto& t : f["tensors"])
            if (t["scale_min"].get<double>() != t["scale_max"].get<double>()) ++differ;
        o << "\nFP8 (last amax and scale): " << f["tensor_count"].get<int64_t>() << " tensors, smallest scale "
          << fmt("%.4g", f["smallest_scale"]["scale"].get<double>()) << " ("
          << f["smallest_scale"]["tensor"].get<std::string>() << "), largest "
          << fmt("%.4g", f["largest_scale"]["scale"].get<double>()) << " ("
          << f["largest_scale"]["tensor"].get<std::string>() << ")";
        if (differ) o << "; " << differ << " with different scales across ranks";
        o << "\n";
    }
    o << "\nkernels (rank " << (doc["ranks"].empty() ? 0 : doc["ranks"][0]["rank"].get<int>()) << ", top by total time):\n";
    if (!doc["ranks"].empty()) {
        for (const auto& k : doc["ranks"][0]["kernels"]["top"]) {
            std::snprintf(line, sizeof line, "  %-40s %-12s %8lld %10s ms %6s %%\n", import::kernelShortName(k["name"].get<std::string>()).substr(0, 40).c_str(),
                          k["category"].get<std::string>().c_str(), (long long)k["count"].get<int64_t>(),
                          ms(k["total_s"]).c_str(), pct(k["pct"]).c_str());
            o << line;
        }
        o << "  by category:";
        for (const auto& c : doc["ranks"][0]["kernels"]["by_category"])
            o << " " << c["category"].get<std::string>() << " " << pct(c["pct"]) << "%";
        o << "\n  by class:";
        for (const auto& c : doc["ranks"][0]["kernels"].value("by_class", json::array()))
            o << " " << c["class"].get<std::string>() << " " << pct(c["pct"]) << "%";
        o << "\n";
    }
    const json mi = doc.value("mfu_inputs", json::object());
    o << "\nMFU inputs: device " << mi.value("device", std::string()) << ", dtype " << mi.value("dtype", std::string())
      << ", peak " << (mi["peak_tflops_per_device"].is_number() ? fmt("%.2f", mi["peak_tflops_per_device"].get<double>()) : "-")
      << " TFLOP/s (" << (mi.value("peak_source", std::string()).empty() ? std::string("no table row for the device, no metadata peak_tflops") : mi.value("peak_source", std::string())) << "), FLOPs from "
      << mi.value("flops_source", std::string()) << "\n";
    if (!mi.value("flops_formula", std::string()).empty()) o << "  formula: " << mi["flops_formula"].get<std::string>() << "\n";

    o << "\ndefinitions:\n";
    const json defs = doc.value("definitions", json::object());
    for (auto& [k, v] : defs.items()) o << "  " << k << ": " << v.get<std::string>() << "\n";
    return o.str();
}

}  // namespace ts::profiler
