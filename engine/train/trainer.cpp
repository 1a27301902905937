// Single-device training loop.
#include "engine/train/trainer.h"

#include <cmath>

#include "common/clock.h"
#include "engine/backend/backend_trace.h"
#include "engine/config/knobs.h"
#include "engine/model/flops.h"
#include "engine/train/checkpoint.h"
#include "kernels/cpu/ops.h"

namespace ts::engine {

Trainer::~Trainer() {
    if (m_model) (void)m_model->exec().synchronize();
    m_model.reset();
}

Status checkDeviceBackend(const Config& c, bool unverifiedOk, int* cudaDevices) {
    if (c.device_backend == "cpu") return Status::ok();
    if (c.device_backend != "cuda")
        return Status::invalid("device_backend: " + c.device_backend + " is not a backend (cpu or cuda)");
    auto cuda = makeCudaBackend();
    if (!cuda) return Status::unsupported("device_backend: cuda: " + cuda.status().message());
    const int n = (*cuda)->deviceCount();
    if (cudaDevices) *cudaDevices = n;
    // One GPU is checked: the single-device trainer matched the CPU backend on an H200 (the gpu
    // test CudaTrainer.EveryStepMatchesTheCpuBackend). Several are not yet.
    const int world = deriveSizes(c).world;
    if (world == 1 || unverifiedOk) return Status::ok();
    return Status::unsupported(
        "device_backend: cuda with world size " + std::to_string(world) + ": " + std::to_string(n) +
        " GPU(s) visible (" + (*cuda)->device(0).info().name +
        "); one GPU is checked against the CPU backend, but layouts over several GPUs (NCCL between the ranks) "
        "have not yet run on a machine with several GPUs (docs/cuda_port.md); run one rank on the GPU "
        "(every parallel size 1), use device_backend: cpu for the layout, or set TS_CUDA_UNVERIFIED=1 to "
        "train on the GPUs anyway (its results are not yet checked against the CPU backend there)");
}

std::vector<std::string> cudaGraphIssues(const Config& c) {
    std::vector<std::string> out;
    if (c.cuda_graph_impl == "none") return out;
    const std::string knob = "cuda_graph_impl: " + c.cuda_graph_impl;
    if (c.cuda_graph_impl != "full_iteration") {
        out.push_back(knob + " (per-layer graphs) is not executed by the engine yet; cuda_graph_impl: full_iteration "
                             "captures the whole forward and backward of a step, or use none");
        return out;
    }
    if (c.cuda_graph_warmup_steps < 1)
        out.push_back(knob + " with cuda_graph_warmup_steps: " + std::to_string(c.cuda_graph_warmup_steps) +
                      ": the engine captures after at least one eager step, which makes the backend's library handles, "
                      "tables and caches outside the graph; set cuda_graph_warmup_steps: 1 or more");
    if (deriveSizes(c).world > 1)
        out.push_back(knob + " runs on the single-device trainer (every parallel size 1) so far: the parallel engine's "
                             "collectives and streams are not captured yet; set the parallel sizes to 1 or "
                             "cuda_graph_impl: none");
    if (c.num_moe_experts > 0) {
        if (!(c.moe_expert_capacity_factor > 0 && c.moe_pad_expert_input_to_capacity))
            out.push_back(knob + " with dropless MoE layers: the dispatcher reads the tokens per expert back to the "
                                 "host to size the expert GEMMs, a host wait no graph can hold; set "
                                 "moe_expert_capacity_factor (e.g. 1.0) and moe_pad_expert_input_to_capacity: true "
                                 "(every expert then has capacity rows, known without the wait), or "
                                 "cuda_graph_impl: none");
        if (c.moe_router_enable_expert_bias)
            out.push_back(knob + " with moe_router_enable_expert_bias: the router reads the expert bias from host "
                                 "memory that the step's end updates; set it to false or cuda_graph_impl: none");
        if (c.moe_router_load_balancing_type == "quantile_balancing")
            out.push_back(knob + " with moe_router_load_balancing_type: quantile_balancing: its dual variables are "
                                 "host state uploaded each microbatch; use aux_loss, seq_aux_loss, sinkhorn or none, "
                                 "or cuda_graph_impl: none");
    }
    return out;
}

std::vector<std::string> nodeRunIssues(const Config& c) {
    if (c.device_backend != "cuda") return {};
    // What the machine lacks first, then what the engine does not run of the config.
    std::vector<std::string> out;
    int gpus = 0;
    const int world = deriveSizes(c).world;
    if (Status s = checkDeviceBackend(c, unverifiedCudaRequested(), &gpus); !s) {
        out.push_back(s.message());
    } else if (world > gpus && !c.cuda_share_gpus) {
        out.push_back("device_backend: cuda: the layout has " + std::to_string(world) +
                      " ranks (tp x cp x pp x dp), one GPU each, and this node has " + std::to_string(gpus) +
                      " GPU(s); set cuda_share_gpus: true to check its results with the ranks sharing the GPUs "
                      "(timings are not the layout's), or make the parallel sizes multiply to at most " +
                      std::to_string(gpus));
    }
    for (std::string& g : cudaGraphIssues(c)) out.push_back(std::move(g));
    return out;
}

Result<std::unique_ptr<Trainer>> Trainer::create(const Config& c, Device* dev, Stream* compute,
                                                 trace::Recorder* rec, const TrainerOptions& opts) {
    const DerivedSizes ds = deriveSizes(c);
    if (ds.world > 1)
        return Status::unsupported("world size " + std::to_string(ds.world) +
                                   " (tp/pp/cp/dp > 1) runs through the parallel engine; the single-device "
                                   "trainer needs every parallel size = 1");
    TS_RETURN_IF_ERROR(checkDeviceBackend(c, opts.allowUnverifiedCuda));
    if (c.train_iters < 0) return Status::invalid("train_iters must be >= 0");
    if (auto g = cudaGraphIssues(c); !g.empty()) return Status::unsupported(g.front());
    std::unique_ptr<Trainer> t(new Trainer());
    t->m_cfg = c;
    t->m_rec = rec;
    if (dev && (c.device_backend == "cuda") != (dev->info().backend == BackendKind::Cuda))
        return Status::invalid("device_backend: " + c.device_backend + ", but the trainer was given device " +
                               dev->info().name + "; create the device on the backend the config names");
    if (!dev) {
        if (c.device_backend == "cuda") {
            TS_ASSIGN_OR_RETURN(t->m_ownBackend, makeCudaBackend());
        } else {
            t->m_ownBackend = opts.emulateDevice ? makeEmulatedDeviceBackend(1) : makeCpuBackend(1);
        }
        dev = &t->m_ownBackend->device(0);
    }
    if (!compute) {
        t->m_ownStream = dev->createStream(trace::TrackKind::Compute, "compute");
        compute = t->m_ownStream.get();
    }
    t->m_dev = dev;
    t->m_stream = compute;
    if (c.cuda_graph_impl != "none" && !dynamic_cast<CapturableStream*>(compute))
        return Status::unsupported("cuda_graph_impl: " + c.cuda_graph_impl + " records a device stream's kernels, and " +
                                   dev->info().name + " is a CPU backend device; use device_backend: cuda (or the "
                                   "emulated device, TS_EMULATE_DEVICE=1, to check the run without a GPU), or "
                                   "cuda_graph_impl: none");
    if (c.cpu_threads > 0) kernels::cpu::setNumThreads(c.cpu_threads);
    TS_ASSIGN_OR_RETURN(t->m_data, DataSource::open(c));
    TS_ASSIGN_OR_RETURN(t->m_model, GptModel::create(c, *dev, *compute));
    TS_ASSIGN_OR_RETURN(t->m_opt, AdamWOptimizer::create(c, t->m_model->params(), *dev));
    t->m_lr = LrSchedule::fromConfig(c);
    t->m_numMicrobatches = ds.num_microbatches;
    t->m_globalBatch = ds.global_batch_size;
    if (t->m_globalBatch != c.micro_batch_size * ds.num_microbatches)
        return Status::invalid("global_batch_size=" + std::to_string(t->m_globalBatch) +
                               " must equal micro_batch_size * num_microbatches on one device (" +
                               std::to_string(c.micro_batch_size) + " * " + std::to_string(ds.num_microbatches) + ")");
    t->m_flops = megatronFlopsPerIteration(FlopsInputs::fromConfig(c));
    if (!c.load.empty()) TS_RETURN_IF_ERROR(t->load(c.load));
    if (rec) {
        const nlohmann::json meta = t->runMetadata();
        for (auto it = meta.begin(); it != meta.end(); ++it)
            rec->metadata(it.key(), it->is_string() ? it->get<std::string>() : it->dump());
    }
    return t;
}

nlohmann::json baseRunMetadata(const Config& c, double modelFlopsPerStep, double peakTflops,
                               const DataSource* data) {
    const DerivedSizes ds = deriveSizes(c);
    nlohmann::json j;
    j["model_flops_per_step"] = modelFlopsPerStep;
    j["flops_formula"] = flopsFormulaText(FlopsInputs::fromConfig(c));
    j["pp"] = ds.pp;
    j["vpp"] = ds.vpp;
    j["num_microbatches"] = ds.num_microbatches;
    j["config"] = configToJson(c).dump();
    j["peak_tflops"] = peakTflops;
    j["data"] = data ? data->description() : std::string();
    // Where bf16 values are kept in fp32 words (docs/engine.md "Precision"): `analyze` says what
    // that does to the memory numbers.
    // "bf16": the model copy and the saved activations in bf16 bits; "params_bf16": the saved
    // activations in fp32 words (TS_BF16_SAVED_FP32=1). Earlier versions wrote "saved_bf16" and
    // "fp32" (the model copy in fp32 words too): profiler/report.cpp reads both.
    if (c.bf16) j["bf16_storage"] = bf16SavedInFp32Words() ? "params_bf16" : "bf16";
    return j;
}

nlohmann::json Trainer::runMetadata() const {
    nlohmann::json j = baseRunMetadata(m_cfg, m_flops, m_peakTflops, m_data.get());
    j["num_parameters"] = m_model ? m_model->params().numel() : 0;
    return j;
}

Status Trainer::step(StepProgress* out) {
    GptModel& model = *m_model;
    Exec& ex = model.exec();
    ex.setCancelFlag(m_cancel);
    const int it = m_iteration;  // 0-based index of this iteration
    const int64_t t0 = monotonicNs();
    m_dev->resetPeak();
    RangeScope stepRange(*m_dev, range::kStep, {it, -1, -1, -1});
    model.clearCaptured();
    model.beginStep(it, m_numMicrobatches);
    ParamBuffer* params = &model.params();
    const int b = m_cfg.micro_batch_size;
    const bool graphs = m_cfg.cuda_graph_impl == "full_iteration";
    std::vector<std::shared_ptr<const Microbatch>> mbs(static_cast<size_t>(m_numMicrobatches));
    for (int mb = 0; mb < m_numMicrobatches; ++mb) {
        mbs[size_t(mb)] = m_data->microbatch(m_samples + int64_t(mb) * b, b);
        // A graph reads each step's data from buffers that keep their addresses (every step, so
        // the eager warm-up steps run the same ops as the captured one).
        if (graphs) TS_RETURN_IF_ERROR(model.stageInputs(mb, mbs[size_t(mb)]));
    }
    ex.setMicrobatch(-1);
    ex.setLayer(-1);
    if (graphs && m_eagerSteps >= m_cfg.cuda_graph_warmup_steps) {
        if (!m_graph) TS_RETURN_IF_ERROR(captureStep(mbs));
        if (m_cancel && m_cancel->load()) {
            (void)ex.synchronize();
            return Status::cancelled("cancelled at iteration " + std::to_string(it + 1));
        }
        TS_RETURN_IF_ERROR(m_graph->launch(ex.stream(), it));
        TS_RETURN_IF_ERROR(model.graphLaunched());  // the captured step's host-side work, for this launch
    } else {
        ex.op("zero_grad", trace::Category::Memset, 0, uint64_t(params->numel()) * 4, [params] { params->zeroGrads(); });
        for (int mb = 0; mb < m_numMicrobatches; ++mb) {
            if (m_cancel && m_cancel->load()) {
                (void)ex.synchronize();
                return Status::cancelled("cancelled at iteration " + std::to_string(it + 1));
            }
            RangeScope mbRange(*m_dev, range::kMicrobatch, {it, mb, -1, -1});
            TS_RETURN_IF_ERROR(model.forward(mb, mbs[size_t(mb)]));
            TS_RETURN_IF_ERROR(model.backward(mb));
        }
        ++m_eagerSteps;
    }
    Status st = ex.synchronize();
    if (st.code() == ErrorCode::Cancelled) return Status::cancelled("cancelled at iteration " + std::to_string(it + 1));
    if (!st) return st;
    double loss = 0;
    for (int mb = 0; mb < m_numMicrobatches; ++mb) loss += model.microbatchLoss(mb);
    loss /= m_numMicrobatches;
    if (!std::isfinite(loss))
        return Status::numerical("loss is " + std::to_string(loss) + " at iteration " + std::to_string(it + 1) +
                                 "; lower lr or enable clip_grad");
    const double lr = m_lr.lrAt(it);
    {
        RangeScope optRange(*m_dev, range::kOptimizer, {it, -1, -1, -1});
        m_opt->enqueueStep(ex, lr, it + 1);
        st = ex.synchronize();
    }
    if (!st) return st;
    const double dt = double(monotonicNs() - t0) * 1e-9;
    ++m_iteration;
    m_samples += m_globalBatch;
    if (out) {
        out->step = m_iteration;
        out->loss = loss;
        out->stepTimeS = dt;
        out->tokensPerS = double(m_globalBatch) * m_cfg.seq_length / std::max(dt, 1e-12);
        out->modelTflops = m_flops / (std::max(dt, 1e-12) * 1e12 * 1);
        out->gradNorm = m_opt->lastStep().gradNorm;
        out->lr = lr;
        const MemoryStats ms = m_dev->memoryStats();
        out->peakMemoryBytes = ms.peakTotal;
        for (size_t c = 0; c < size_t(MemCategory::Count); ++c) out->peakMemoryByCategory[c] = ms.peak[c];
    }
    return Status::ok();
}

Status Trainer::captureStep(const std::vector<std::shared_ptr<const Microbatch>>& mbs) {
    GptModel& model = *m_model;
    Exec& ex = model.exec();
    ParamBuffer* params = &model.params();
    const int it = m_iteration;
    TS_RETURN_IF_ERROR(beginCapture(ex.stream()));
    // The host code of the step runs once, now; its kernels (and the zero fills of what it
    // allocates) are recorded, not run.
    Status st = [&]() -> Status {
        ex.op("zero_grad", trace::Category::Memset, 0, uint64_t(params->numel()) * 4, [params] { params->zeroGrads(); });
        for (int mb = 0; mb < m_numMicrobatches; ++mb) {
            RangeScope mbRange(*m_dev, range::kMicrobatch, {it, mb, -1, -1});
            TS_RETURN_IF_ERROR(model.forward(mb, mbs[size_t(mb)]));
            TS_RETURN_IF_ERROR(model.backward(mb));
        }
        return Status::ok();
    }();
    auto graph = endCapture(ex.stream());
    const std::string where = "capturing iteration " + std::to_string(it + 1) + " into a graph (cuda_graph_impl: " +
                              m_cfg.cuda_graph_impl + ")";
    // The capture's own error first: once a capture is broken, later ops fail for that reason.
    if (!graph) return graph.status().withContext(where);
    if (!st) return st.withContext(where);
    m_graph = std::move(graph).value();
    model.graphCaptured();
    return Status::ok();
}

Status Trainer::train(int steps, const TrainerCallbacks& cb, const std::atomic<bool>* cancel) {
    m_cancel = cancel;
    const int target = steps < 0 ? m_cfg.train_iters : m_iteration + steps;
    while (m_iteration < target) {
        if (cancel && cancel->load()) return Status::cancelled("cancelled at iteration " + std::to_string(m_iteration + 1));
        StepProgress p;
        TS_RETURN_IF_ERROR(step(&p));
        if (cb.onStep) cb.onStep(p);
        TS_RETURN_IF_ERROR(saveCheckpointIfDue(m_cfg, m_iteration, false, [this](const std::string& d) { return save(d); }, cb));
    }
    return saveCheckpointIfDue(m_cfg, m_iteration, true, [this](const std::string& d) { return save(d); }, cb);
}

Status saveCheckpointIfDue(const Config& c, int iteration, bool endOfTrain,
                           const std::function<Status(const std::string&)>& save, const TrainerCallbacks& cb) {
    if (c.save.empty()) return Status::ok();
    const bool onInterval = c.save_interval > 0 && iteration % c.save_interval == 0;
    if (endOfTrain == onInterval) return Status::ok();
    TS_RETURN_IF_ERROR(save(c.save));
    if (cb.onLog) cb.onLog("saved checkpoint at iteration " + std::to_string(iteration) + " to " + c.save);
    return Status::ok();
}

Status Trainer::save(const std::string& dir) {
    TS_RETURN_IF_ERROR(m_model->exec().synchronize());
    CheckpointState s;
    s.iteration = m_iteration;
    s.samplesConsumed = m_samples;
    s.seed = m_cfg.seed;
    s.config = configToJson(m_cfg);
    s.fp8 = m_model->fp8State();
    s.expertBias = m_model->routerState();
    s.qbBeta = m_model->qbBetaState();
    return saveCheckpoint(dir, m_model->exec().stream(), m_model->params(), *m_opt, s);
}

Status Trainer::load(const std::string& dir) {
    TS_RETURN_IF_ERROR(m_model->exec().synchronize());
    CheckpointState s;
    m_graph.reset();  // captured over the old state: captured again after the warm-up
    m_model->graphReleased();
    m_eagerSteps = 0;
    m_model->weightsReplaced();  // even if the load fails part way
    TS_RETURN_IF_ERROR(loadCheckpoint(dir, m_model->exec().stream(), m_model->params(), *m_opt, &s));
    if (s.seed != m_cfg.seed)
        return Status::invalid("checkpoint '" + dir + "' was trained with seed " + std::to_string(s.seed) +
                               ", the config has seed " + std::to_string(m_cfg.seed) + "; resume would not be exact");
    TS_RETURN_IF_ERROR(m_model->setFp8State(s.fp8).withContext("checkpoint '" + dir + "'"));
    TS_RETURN_IF_ERROR(m_model->setRouterState(s.expertBias).withContext("checkpoint '" + dir + "'"));
    TS_RETURN_IF_ERROR(m_model->setQbBetaState(s.qbBeta).withContext("checkpoint '" + dir + "'"));
    m_iteration = s.iteration;
    m_samples = s.samplesConsumed;
    return Status::ok();
}

}  // namespace ts::engine
