// Multi-rank training loop (see parallel_trainer.h).
#include "engine/parallel/parallel_trainer.h"

#include <cmath>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <thread>

#include "common/clock.h"
#include "engine/backend/backend_trace.h"
#include "engine/config/knobs.h"
#include "engine/model/flops.h"
#include "engine/parallel/context_parallel.h"
#include "engine/parallel/dist_optimizer.h"
#include "engine/parallel/pipeline_executor.h"
#include "engine/parallel/schedule.h"
#include "engine/train/checkpoint.h"
#include "engine/backend/kernels.h"
#ifdef TS_HAVE_NCCL
#include "engine/comm/nccl/nccl_communicator.h"
#endif
#include "kernels/cpu/ops.h"

namespace ts::engine {

namespace {

// One long-lived host thread per rank: jobs run in order on it.
class RankWorker {
public:
    RankWorker() : m_thread([this] { loop(); }) {}
    ~RankWorker() {
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_stop = true;
        }
        m_cv.notify_all();
        m_thread.join();
    }
    std::future<Status> post(std::function<Status()> fn) {
        std::packaged_task<Status()> task(std::move(fn));
        auto f = task.get_future();
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_jobs.push_back(std::move(task));
        }
        m_cv.notify_all();
        return f;
    }

private:
    void loop() {
        for (;;) {
            std::packaged_task<Status()> job;
            {
                std::unique_lock<std::mutex> lock(m_mutex);
                m_cv.wait(lock, [&] { return m_stop || !m_jobs.empty(); });
                if (m_jobs.empty()) return;
                job = std::move(m_jobs.front());
                m_jobs.pop_front();
            }
            job();
        }
    }
    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::deque<std::packaged_task<Status()>> m_jobs;
    bool m_stop = false;
    std::thread m_thread;
};

std::string coordText(const RankCoords& c) {
    return "rank " + std::to_string(c.global) + " (tp " + std::to_string(c.tp) + ", pp " + std::to_string(c.pp) +
           ", dp " + std::to_string(c.dp) + ")";
}

}  // namespace

// Declaration order = construction order; members are destroyed in reverse, so the worker
// thread stops first, then models/optimizer (which drain the streams), then the
// communicators, then the streams.
struct ParallelTrainer::RankState {
    int rank = 0;
    RankCoords coords;
    Device* dev = nullptr;
    std::unique_ptr<Stream> compute, dpStream, p2p;
    std::unique_ptr<Stream> tpStream;  // tp_comm_overlap: the SP collectives of the TP linears
    std::unique_ptr<Stream> cpStream;  // cp_comm_type=p2p (a2a+p2p): the ring attention's KV/dKV blocks
    std::unique_ptr<Stream> sharedStream;  // moe_shared_expert_overlap: the MoE shared experts
    std::unique_ptr<Communicator> tpComm, ppComm, dpComm, embdComm, normComm;
    std::unique_ptr<Communicator> tpOverlapComm;  // a second "tp" communicator, used on tpStream only
    std::unique_ptr<Communicator> amaxComm;       // FP8 delayed scaling: "tp-dp-cp", compute stream
    std::unique_ptr<Communicator> cpComm;         // context parallel attention ("cp"), compute stream
    std::unique_ptr<Communicator> epComm;         // expert parallel token all-to-all ("ep"), compute stream
    std::unique_ptr<Communicator> edpComm;        // expert grads ("edp"), DP stream
    std::unique_ptr<Communicator> etpComm;        // expert TP rows' all-gather / reduce-scatter ("etp"), compute stream
    std::unique_ptr<Communicator> etpEpComm;      // expert TP x EP ("etp-ep"): token counts, allgather dispatcher
    std::unique_ptr<Communicator> cpRingComm;     // cp_comm_type=p2p: a second "cp", used on cpStream only
                                                  // (a2a+p2p: "hcp-p2p")
    std::unique_ptr<Communicator> hcpA2aComm;     // cp_comm_type=a2a+p2p: "hcp-a2a", compute stream
    std::unique_ptr<Communicator> sharedTpComm;   // moe_shared_expert_overlap: a "tp" used on sharedStream only
    std::vector<std::unique_ptr<GptModel>> models;
    std::vector<std::unique_ptr<GradSync>> syncs;
    std::unique_ptr<ShardedAdamW> opt;
    std::unique_ptr<PipelineExecutor> pipe;
    int embdChunk = -1, embdParam = -1;  // tied embedding / output copy synced over "embd"
    std::vector<double> losses;          // last stage: per local microbatch
    std::unique_ptr<RankWorker> worker;

    ~RankState() {
        worker.reset();
        release();
    }
    // Everything but the worker, in dependency order: drain the streams, then the models and
    // optimizer, the communicators, the streams. ~ParallelTrainer runs it on the rank's own
    // thread (NCCL may wait for the group's other members while a communicator is destroyed).
    void release() {
        for (Stream* s : {compute.get(), dpStream.get(), p2p.get(), tpStream.get(), cpStream.get(), sharedStream.get()})
            if (s) (void)s->synchronize();
        pipe.reset();
        opt.reset();
        syncs.clear();
        models.clear();
        for (auto* c : {&tpComm, &ppComm, &dpComm, &embdComm, &normComm, &tpOverlapComm, &amaxComm, &cpComm, &epComm,
                        &edpComm, &etpComm, &etpEpComm, &cpRingComm, &hcpA2aComm, &sharedTpComm})
            c->reset();
        for (auto* s : {&compute, &dpStream, &p2p, &tpStream, &cpStream, &sharedStream}) s->reset();
    }
};

Result<std::unique_ptr<ParallelTrainer>> ParallelTrainer::create(const Config& c, trace::Recorder* rec,
                                                                 const ParallelTrainerOptions& opts) {
    TS_RETURN_IF_ERROR(issuesToStatus(validateConfig(c)));
    TS_RETURN_IF_ERROR(checkDeviceBackend(c, opts.allowUnverifiedCuda));
    if (c.train_iters < 0) return Status::invalid("train_iters must be >= 0");
    if (c.cuda_graph_impl != "none")
        return Status::unsupported("cuda_graph_impl: " + c.cuda_graph_impl +
                                   " runs on the single-device trainer (engine::Trainer) so far, not on the parallel "
                                   "engine; use cuda_graph_impl: none here");
    const DerivedSizes ds = deriveSizes(c);
    ParallelSizes sizes;
    sizes.tp = ds.tp;
    sizes.cp = ds.cp;
    sizes.pp = ds.pp;
    sizes.dp = ds.dp;
    sizes.ep = ds.ep;
    sizes.etp = ds.etp;
    sizes.world = ds.world;
    // Megatron builds the hierarchical CP groups whenever the sizes are given (parallel_state.py).
    const std::vector<int>& hcp = c.hierarchical_context_parallel_sizes;
    if (hcp.size() == 2) sizes.hcpA2a = hcp[0];
    TS_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::create(sizes));
    if (ds.global_batch_size != c.micro_batch_size * ds.dp * ds.num_microbatches)
        return Status::invalid("global_batch_size=" + std::to_string(ds.global_batch_size) +
                               " must equal micro_batch_size * data_parallel_size * num_microbatches (" +
                               std::to_string(c.micro_batch_size) + " * " + std::to_string(ds.dp) + " * " +
                               std::to_string(ds.num_microbatches) + ")");
    TS_ASSIGN_OR_RETURN(ModelDims dims, modelDimsFromConfig(c));
    if (dims.layers % (ds.pp * ds.vpp) != 0)
        return Status::invalid("num_layers=" + std::to_string(dims.layers) +
                               " must be divisible by pipeline_model_parallel_size x "
                               "virtual_pipeline_model_parallel_size = " + std::to_string(ds.pp * ds.vpp));

    std::unique_ptr<ParallelTrainer> t(new ParallelTrainer());
    t->m_cfg = c;
    t->m_layout = layout;
    t->m_rec = rec;
    const int world = layout.worldSize();
    // Ranks of this process (all of them unless several processes share the world).
    t->m_opts = opts;
    std::vector<int>& local = t->m_opts.localRanks;
    if (local.empty())
        for (int r = 0; r < world; ++r) local.push_back(r);
    for (size_t i = 0; i < local.size(); ++i)
        if (local[i] < 0 || local[i] >= world || (i > 0 && local[i] <= local[i - 1]))
            return Status::invalid("local ranks must be increasing global ranks below world_size=" +
                                   std::to_string(world));
    if (int(local.size()) != world && (!opts.makeGroup || !opts.gatherHost))
        return Status::invalid("a process running " + std::to_string(local.size()) + " of " + std::to_string(world) +
                               " ranks needs a group factory and a host gather (several processes)");
    // Devices: one per local rank. CUDA: local rank i on GPU cudaDevices[i] (default GPU i), one
    // GPU each (NCCL refuses two members of a group on one GPU), unless the ranks share the GPUs.
    const bool cuda = c.device_backend == "cuda";
    // cuda_share_gpus: the local ranks share the visible GPUs, rank i on GPU i % count
    // (makeSharedCudaBackend), and their groups are the in-process communicator, host-synchronized,
    // instead of NCCL. Needs allowUnverifiedCuda for world size > 1, as any CUDA layout.
    // One rank has nothing to share: the knob changes nothing then.
    const bool sharedGpus = cuda && c.cuda_share_gpus && world > 1;
    std::vector<int> deviceOf;  // local index -> device index of m_backend
    if (sharedGpus) {
        if (opts.makeGroup || int(local.size()) != world)
            return Status::unsupported(
                "cuda_share_gpus runs every rank as a thread of one process (their collectives go through its "
                "memory), so it does not run under mpirun/srun; start `trainscope run` without a launcher, or drop "
                "cuda_share_gpus to run one rank per GPU and process");
        if (!opts.cudaDevices.empty())
            return Status::invalid("ranks sharing the GPUs (cuda_share_gpus) are placed round-robin; give no "
                                   "cudaDevices with it");
        TS_ASSIGN_OR_RETURN(t->m_backend, makeSharedCudaBackend(int(local.size())));
        for (size_t i = 0; i < local.size(); ++i) deviceOf.push_back(int(i));
        int gpus = 0;  // devices are placed round-robin: the GPUs used are 0 .. the largest index
        for (int i = 0; i < t->m_backend->deviceCount(); ++i) gpus = std::max(gpus, t->m_backend->device(i).info().index + 1);
        t->m_warnings.push_back(std::to_string(local.size()) + " ranks on " + std::to_string(gpus) +
                                " GPU(s) (cuda_share_gpus): their collectives go through host memory instead of NCCL; "
                                "the losses and memory are the layout's, the step times and communication are not");
    } else if (cuda) {
        TS_ASSIGN_OR_RETURN(t->m_backend, makeCudaBackend());
        const int n = t->m_backend->deviceCount();
        deviceOf = opts.cudaDevices;
        if (deviceOf.empty())
            for (size_t i = 0; i < local.size(); ++i) deviceOf.push_back(int(i));
        if (deviceOf.size() != local.size())
            return Status::invalid("cudaDevices names " + std::to_string(deviceOf.size()) + " GPUs for " +
                                   std::to_string(local.size()) + " local ranks; give one per rank");
        for (size_t i = 0; i < deviceOf.size(); ++i) {
            if (deviceOf[i] < 0 || deviceOf[i] >= n)
                return Status::unsupported(
                    "device_backend: cuda: this process runs " + std::to_string(local.size()) +
                    " rank(s) (world_size " + std::to_string(world) + " = tp x cp x pp x dp), one GPU each, but " +
                    std::to_string(n) + " GPU(s) are visible (GPU " + std::to_string(deviceOf[i]) +
                    " needed); make the parallel sizes multiply to at most " + std::to_string(n) +
                    ", or run several processes (mpirun -np <world_size>, one GPU each); to check the layout's "
                    "results on these GPUs, set cuda_share_gpus: true (ranks share GPUs, timings are not the "
                    "layout's)");
            for (size_t j = 0; j < i; ++j)
                if (deviceOf[j] == deviceOf[i])
                    return Status::invalid("local ranks " + std::to_string(local[j]) + " and " +
                                           std::to_string(local[i]) + " are both on GPU " +
                                           std::to_string(deviceOf[i]) +
                                           "; NCCL needs one GPU per rank (cuda_share_gpus: true lets ranks share "
                                           "GPUs, without NCCL, to check a layout's results)");
        }
        // TP groups of this process's ranks, as GPUs: each should be inside one NVLink domain.
        if (ds.tp > 1)
            if (auto topo = probeGpuTopology()) {
                std::vector<std::vector<int>> groups;
                for (size_t i = 0; i < local.size(); ++i) {
                    const std::vector<int> members = layout.groupRanks("tp", local[i]);
                    if (members.empty() || members.front() != local[i]) continue;  // once per group, from its first rank
                    std::vector<int> gpus;
                    for (int m : members)
                        for (size_t k = 0; k < local.size(); ++k)
                            if (local[k] == m) gpus.push_back(t->m_backend->device(deviceOf[k]).info().index);
                    groups.push_back(gpus);
                }
                t->m_warnings = tpTopologyWarnings(*topo, groups);
            }
    } else {
        t->m_backend = opts.emulateDevice ? makeEmulatedDeviceBackend(int(local.size()))
                                          : makeCpuBackend(int(local.size()));
        for (size_t i = 0; i < local.size(); ++i) deviceOf.push_back(int(i));
    }
    // OpenBLAS threads are process-global: with several rank threads, one GEMM thread each.
    kernels::cpu::setNumThreads(world > 1 ? 1 : std::max(1, c.cpu_threads));
    TS_ASSIGN_OR_RETURN(t->m_data, DataSource::open(c));
    CommOptions copts;
    copts.timeout = opts.commTimeout;
    // An emulated device stands for a GPU: its groups join as NCCL's do (every member at once).
    copts.blockingJoins = opts.emulateDevice;
    // Groups: NCCL between the GPUs of this process; else (CPU, emulated devices, and as the
    // abort flag of a run whose groups come from opts.makeGroup) the in-process CommWorld.
    if (cuda && !sharedGpus && !opts.makeGroup && world > 1) {
#ifdef TS_HAVE_NCCL
        std::vector<int> gpuOfRank(size_t(world), 0);
        for (size_t i = 0; i < local.size(); ++i)
            gpuOfRank[size_t(local[i])] = t->m_backend->device(deviceOf[i]).info().index;
        t->m_world = std::make_unique<NcclWorld>(world, std::move(gpuOfRank));
#else
        return Status::unsupported("device_backend: cuda with world_size " + std::to_string(world) +
                                   " needs NCCL between the GPUs, and this build has none; install NCCL "
                                   "(libnccl-dev) and rebuild, or run one rank (all parallel sizes 1)");
#endif
    } else {
        t->m_world = std::make_unique<CommWorld>(world, copts);
    }
    // Ranks sharing a GPU reach each other's managed memory from the host (hostSynchronized).
    const bool hostSync = opts.hostSyncCollectives || sharedGpus;
    t->m_opts.hostSyncCollectives = hostSync;
    t->m_lr = LrSchedule::fromConfig(c);
    t->m_numMicrobatches = ds.num_microbatches;
    t->m_globalBatch = ds.global_batch_size;
    t->m_flops = megatronFlopsPerIteration(FlopsInputs::fromConfig(c));

    const bool dist = c.use_distributed_optimizer;
    const bool tied = !c.untie_embeddings_and_output_weights;
    const int v = ds.vpp;
    // Gradients and the distributed optimizer span Megatron's data-parallel group with CP.
    const int dpc = ds.dp * ds.cp;
    // Expert parallel: expert weights live on one rank of each "ep" group; their grads are
    // reduced (and, distributed optimizer, sharded) over the expert-data-parallel group.
    const bool expertParallel = c.num_moe_experts > 0 && ds.ep > 1;
    // Every MoE model keeps its expert weights in the expert buckets, reduced over edp: without
    // EP and TP that is the dp-cp group, with TP (experts not split over it, ETP 1) it holds the
    // TP ranks too, whose tokens the experts saw.
    const bool expertGrads = c.num_moe_experts > 0;
    // Expert tensor parallel: each expert split over the "etp" group (expert_tensor_parallel_size,
    // Megatron's default tensor_model_parallel_size).
    const bool expertTp = c.num_moe_experts > 0 && ds.etp > 1;
    const int edp = layout.expertDataParallelSize();
    // Each rank is built on its own thread, all at once: a join may block until every member of
    // the group has joined (NCCL's), and the models of different ranks initialize in parallel.
    auto setupRank = [&](RankState* R, size_t li) -> Status {
        const int r = local[li];
        const int dpcRank = R->coords.cp + ds.cp * R->coords.dp;  // rank in "dp-cp" (cp varies fastest)
        const int edpRank = R->coords.edp;
        R->dev = &t->m_backend->device(deviceOf[li]);
        if (rec) R->dev->setTrace(rec, r);
        R->compute = R->dev->createStream(trace::TrackKind::Compute, "compute");
        R->dpStream = R->dev->createStream(trace::TrackKind::Comm, "dp_comm");
        R->p2p = R->dev->createStream(trace::TrackKind::P2P, "p2p");
        const bool tpOverlap = c.tp_comm_overlap && c.sequence_parallel && ds.tp > 1;
        if (tpOverlap) R->tpStream = R->dev->createStream(trace::TrackKind::Comm, "tp_comm");
        // a2a+p2p (TE's cp_group=[a2a, p2p]): the all-to-all over "hcp-a2a" on the compute stream,
        // the ring over "hcp-p2p" on the CP comm stream; a group of one rank is left out.
        const bool hier = ds.cp > 1 && c.cp_comm_type == "a2a+p2p" && hcp.size() == 2;
        const bool cpRing = (ds.cp > 1 && c.cp_comm_type == "p2p") || (hier && hcp[1] > 1);
        if (cpRing) R->cpStream = R->dev->createStream(trace::TrackKind::Comm, "cp_comm");
        // Megatron's SharedExpertMLP.stream: a second compute stream for the shared experts.
        const bool sharedOverlap =
            c.num_moe_experts > 0 && c.moe_shared_expert_intermediate_size > 0 && c.moe_shared_expert_overlap;
        if (sharedOverlap) R->sharedStream = R->dev->createStream(trace::TrackKind::Compute, "shared_experts");
        auto join = [&](const std::string& name, std::unique_ptr<Communicator>& out) -> Status {
            const std::vector<int> members = layout.groupRanks(name, r);
            if (members.size() < 2) return Status::ok();
            if (opts.makeGroup) {
                TS_ASSIGN_OR_RETURN(out, opts.makeGroup(name, members, r));
            } else {
                TS_ASSIGN_OR_RETURN(out, t->m_world->join(name, members, r));
            }
            if (hostSync) out = hostSynchronized(std::move(out));
            return Status::ok();
        };
        TS_RETURN_IF_ERROR(join("tp", R->tpComm));
        if (tpOverlap) TS_RETURN_IF_ERROR(join("tp", R->tpOverlapComm));
        TS_RETURN_IF_ERROR(join("pp", R->ppComm));
        // Context parallel: the CP group for attention; gradients are reduced (and the distributed
        // optimizer sharded) over Megatron's data-parallel group with CP, "dp-cp".
        if (ds.cp > 1) TS_RETURN_IF_ERROR(join("cp", R->cpComm));
        if (cpRing) TS_RETURN_IF_ERROR(join(hier ? "hcp-p2p" : "cp", R->cpRingComm));
        if (hier) TS_RETURN_IF_ERROR(join("hcp-a2a", R->hcpA2aComm));
        if (sharedOverlap) TS_RETURN_IF_ERROR(join("tp", R->sharedTpComm));
        TS_RETURN_IF_ERROR(join(ds.cp > 1 ? "dp-cp" : "dp", R->dpComm));
        if (expertParallel) TS_RETURN_IF_ERROR(join("ep", R->epComm));
        if (expertGrads) TS_RETURN_IF_ERROR(join("edp", R->edpComm));
        if (expertTp) {
            TS_RETURN_IF_ERROR(join("etp", R->etpComm));
            TS_RETURN_IF_ERROR(join("etp-ep", R->etpEpComm));
        }
        // FP8 delayed scaling: amaxes reduced with MAX over Megatron's amax group (TP x DP x CP),
        // on the compute stream, at the start of each iteration.
        // The MoE router's global_aux_loss counts, expert-bias update and quantile-balancing update
        // use the same group.
        if ((!c.fp8.empty() && c.fp8_recipe == "delayed") ||
            (c.num_moe_experts > 0 &&
             (c.moe_router_enable_expert_bias || c.moe_router_load_balancing_type.contains("global_aux_loss") ||
              c.moe_router_load_balancing_type == "quantile_balancing")))
            TS_RETURN_IF_ERROR(join("tp-dp-cp", R->amaxComm));
        if (tied && ds.pp > 1) TS_RETURN_IF_ERROR(join("embd", R->embdComm));
        // Grad-norm group: each param counted once. Without the distributed optimizer every DP
        // replica holds the same grads (tp-pp covers the model); with it, DP ranks own
        // disjoint shards (the whole world).
        // With experts spread over "ep" (and no distributed optimizer) the model is covered once
        // by the expert group "etp-ep-pp" (tp = 1 with experts): dense params counted on ep rank 0.
        // With experts the world covers it (each rank counts what it alone holds: see countInNorm).
        TS_RETURN_IF_ERROR(join(dist || expertGrads ? "world" : "tp-pp", R->normComm));

        const int ppRank = R->coords.pp;
        // Distributed optimizer: the ranges of a chunk's buffer this rank owns, its shard of every
        // bucket (over dp-cp, expert buckets over edp). Its fp32 main params with bf16, its Adam state.
        auto ownedShards = [&](const GradBufferLayout& L) {
            std::vector<ElementRange> owned;
            for (const GradBucket& b : L.buckets) {
                auto [lo, hi] = b.group == 1 ? shardOf(b, edp, edpRank) : shardOf(b, dpc, dpcRank);
                owned.push_back({lo, hi});
            }
            return owned;
        };
        for (int ch = 0; ch < v; ++ch) {
            ParallelContext ctx;
            ctx.tpRank = R->coords.tp;
            ctx.tpSize = ds.tp;
            ctx.ppRank = ppRank;
            ctx.ppSize = ds.pp;
            ctx.vppChunk = ch;
            ctx.vppSize = v;
            ctx.dpRank = R->coords.dp;
            ctx.dpSize = ds.dp;
            ctx.cpRank = R->coords.cp;
            ctx.cpSize = ds.cp;
            ctx.cp = R->cpComm.get();
            if (hier) {
                ctx.hcpA2aSize = hcp[0];
                ctx.hcpA2aRank = R->coords.cp % hcp[0];
                ctx.hcpA2a = R->hcpA2aComm.get();
            }
            ctx.epRank = expertParallel ? R->coords.ep : 0;
            ctx.epSize = expertParallel ? ds.ep : 1;
            ctx.ep = R->epComm.get();
            ctx.etpRank = expertTp ? R->coords.etp : 0;
            ctx.etpSize = expertTp ? ds.etp : 1;
            ctx.etp = R->etpComm.get();
            ctx.etpEp = expertTp ? R->etpEpComm.get() : R->epComm.get();
            ctx.sequenceParallel = c.sequence_parallel;
            ctx.tp = R->tpComm.get();
            ctx.pp = R->ppComm.get();
            ctx.dp = R->dpComm.get();
            ctx.amax = R->amaxComm.get();
            ctx.tpDpCp = R->amaxComm.get();
            TS_ASSIGN_OR_RETURN(ctx.layerBegin, layerOffset(dims.layers, ds.pp, v, ppRank, ch));
            ctx.layerEnd = ctx.layerBegin + dims.layers / (ds.pp * v);
            ctx.firstStage = ppRank == 0 && ch == 0;
            ctx.lastStage = ppRank == ds.pp - 1 && ch == v - 1;
            // The params go straight into the DP engine's layout (Megatron's buckets, padded with
            // the distributed optimizer), which the model's registered params decide; with bf16 and
            // the distributed optimizer only this rank's shard of the fp32 main params is allocated.
            GradBufferLayout gl;
            auto place = [&](const std::vector<ParamInfo>& registered) -> Result<ParamPlacement> {
                GradLayoutOptions lo;
                lo.bucketSize = effectiveBucketSize(c, dpc, ppRank, ch);
                lo.dp = dpc;
                lo.distributedOptimizer = dist;
                if (expertGrads) {
                    for (const ParamInfo& pi : registered) lo.expert.push_back(pi.expert ? 1 : 0);
                    lo.expertDp = edp;
                }
                // Megatron marks the tied weight shared_embedding on BOTH ends of the pipeline (its
                // own bucket, so the "embd" all-reduce after a reduce-scatter adds matching shards);
                // GptModel flags the first stage's embedding only when it also holds the output.
                std::vector<ParamInfo> infos = registered;
                if (tied && ctx.firstStage)
                    for (ParamInfo& pi : infos)
                        if (pi.name == "embedding.word_embeddings.weight") pi.sharedEmbedding = true;
                TS_ASSIGN_OR_RETURN(gl, computeGradBufferLayout(infos, lo));
                ParamPlacement pl;
                pl.offsets = gl.paramOffset;
                pl.numel = gl.numel;
                pl.shardMain = dist && c.bf16;
                if (pl.shardMain) pl.mainRanges = ownedShards(gl);
                return pl;
            };
            auto model = GptModel::create(c, *R->dev, *R->compute, ctx, place);
            if (!model) return model.status().withContext("chunk " + std::to_string(ch));
            GptModel& m = *model.value();
            if (R->tpStream && R->tpOverlapComm) m.setTpCommOverlap(*R->tpStream, *R->tpOverlapComm);
            if (R->cpStream && R->cpRingComm) m.setCpRing(*R->cpStream, *R->cpRingComm);
            if (R->sharedStream) m.setSharedExpertStream(*R->sharedStream, R->sharedTpComm.get());
            GradSyncOptions so;
            so.dp = dpc;
            so.dpRank = dpcRank;
            so.overlapGradReduce = c.overlap_grad_reduce;
            so.distributedOptimizer = dist;
            so.overlapParamGather = c.overlap_param_gather;
            so.averageInCollective = c.average_in_collective;
            so.gradReduceInFp32 = c.grad_reduce_in_fp32;
            so.expertDp = expertGrads ? edp : 1;
            so.expertDpRank = expertGrads ? edpRank : 0;
            so.expertComm = R->edpComm.get();
            auto sync = std::make_unique<GradSync>(m.params(), std::move(gl), so, *R->dev, *R->compute, *R->dpStream,
                                                   R->dpComm.get());
            GradSync* sp = sync.get();
            if (c.overlap_grad_reduce) m.setGradReadyHook([sp](const std::vector<int>& ps) { sp->onGradsReady(ps); });
            if (dist && c.overlap_param_gather)
                m.setForwardPreHook([sp](const std::vector<int>& ps) { sp->onForwardPre(ps); });
            if (R->embdComm) {
                if (ctx.firstStage && m.params().find("embedding.word_embeddings.weight") >= 0) {
                    R->embdChunk = ch;
                    R->embdParam = m.params().find("embedding.word_embeddings.weight");
                } else if (ctx.lastStage && m.params().find("output_layer.weight") >= 0) {
                    R->embdChunk = ch;
                    R->embdParam = m.params().find("output_layer.weight");
                }
            }
            R->models.push_back(std::move(model).value());
            R->syncs.push_back(std::move(sync));
        }
        if (R->embdComm && R->embdParam < 0)
            return Status::internal("in the embedding group but holds no tied weight");

        std::vector<OptimizerChunk> oc;
        for (int ch = 0; ch < v; ++ch) {
            OptimizerChunk o;
            ParamBuffer& pb = R->models[size_t(ch)]->params();
            o.params = &pb;
            if (dist) o.owned = ownedShards(R->syncs[size_t(ch)]->layout());
            else o.owned.push_back({0, pb.numel()});
            o.countInNorm.assign(size_t(pb.count()), 1);
            for (int i = 0; i < pb.count(); ++i) {
                const ParamInfo& info = pb.info(i);
                // The last stage's copy of the tied embedding duplicates the first stage's.
                if (info.sharedEmbedding && info.name == "output_layer.weight") o.countInNorm[size_t(i)] = 0;
                // Experts (norm group: the world): each expert's grads once, from the distributed
                // optimizer's edp shards or, without it, from the edp rank 0 holding it. With ETP
                // every etp rank holds a different shard of the expert: all of them count.
                if (info.expert) {
                    if (!dist && R->coords.edp != 0) o.countInNorm[size_t(i)] = 0;
                    continue;
                }
                // TP-replicated params: identical on every tp rank, counted on tp rank 0.
                if (info.shard == ShardKind::Replicated && R->coords.tp != 0) o.countInNorm[size_t(i)] = 0;
                // MoE models without the distributed optimizer norm over the world: dense params
                // from one dp-cp replica.
                if (expertGrads && !dist && (R->coords.dp != 0 || R->coords.cp != 0)) o.countInNorm[size_t(i)] = 0;
            }
            oc.push_back(std::move(o));
        }
        TS_ASSIGN_OR_RETURN(R->opt, ShardedAdamW::create(c, std::move(oc), *R->dev, R->normComm.get()));

        ScheduleParams sp;
        sp.pp = ds.pp;
        sp.vpp = v;
        sp.microbatches = ds.num_microbatches;
        sp.rank = ppRank;
        // Megatron-LM (validate_args) turns overlap_p2p_comm off without interleaving, and
        // derives batch_p2p_comm = not overlap_p2p_comm.
        const bool overlapP2P = c.overlap_p2p_comm && v > 1;
        sp.overlapP2PComm = overlapP2P;
        TS_ASSIGN_OR_RETURN(PipelineSchedule sched, buildSchedule(sp));
        std::vector<PipelineExecutor::Chunk> chunks;
        for (int ch = 0; ch < v; ++ch) chunks.push_back({R->models[size_t(ch)].get(), R->syncs[size_t(ch)].get()});
        PipelineExecutorOptions po;
        po.pp = ds.pp;
        po.ppRank = ppRank;
        po.batchP2P = c.batch_p2p_comm && !overlapP2P;
        po.overlapP2P = overlapP2P;
        R->pipe = std::make_unique<PipelineExecutor>(std::move(sched), std::move(chunks), *R->dev, *R->compute, *R->p2p,
                                                     R->ppComm.get(), po);
        return Status::ok();
    };
    for (size_t li = 0; li < local.size(); ++li) {
        auto R = std::make_unique<RankState>();
        R->rank = local[li];
        R->coords = layout.coordsOf(local[li]);
        R->worker = std::make_unique<RankWorker>();
        t->m_ranks.push_back(std::move(R));
    }
    {
        // The first rank to fail is the cause: it aborts the world so the others' joins fail
        // instead of waiting for it.
        std::mutex failMutex;
        Status cause;
        std::vector<std::future<Status>> built;
        for (size_t li = 0; li < local.size(); ++li)
            built.push_back(t->m_ranks[li]->worker->post([&, li]() -> Status {
                Status st = setupRank(t->m_ranks[li].get(), li);
                if (!st.isOk()) {
                    st = st.withContext(coordText(t->m_ranks[li]->coords));
                    std::lock_guard<std::mutex> lock(failMutex);
                    if (cause.isOk()) {
                        cause = st;
                        t->m_world->abort(Status::comm("the ranks could not be built: " + st.message()));
                    }
                }
                return st;
            }));
        for (auto& f : built) (void)f.get();
        if (!cause.isOk()) return cause;
    }
    if (!c.load.empty()) TS_RETURN_IF_ERROR(t->load(c.load));
    if (rec) {
        const nlohmann::json meta = t->runMetadata();
        for (auto it = meta.begin(); it != meta.end(); ++it)
            rec->metadata(it.key(), it->is_string() ? it->get<std::string>() : it->dump());
    }
    return t;
}

ParallelTrainer::~ParallelTrainer() {
    // Every rank takes itself down on its own thread, all at once; then the ranks go, before the
    // world (communicators must not outlive it).
    std::vector<std::future<Status>> done;
    for (auto& R : m_ranks)
        if (R->worker) done.push_back(R->worker->post([r = R.get()] {
            r->release();
            return Status::ok();
        }));
    for (auto& f : done) f.wait();
    m_ranks.clear();
}

std::vector<std::pair<int, const Device*>> ParallelTrainer::localDevices() const {
    std::vector<std::pair<int, const Device*>> out;
    for (const auto& R : m_ranks) out.emplace_back(R->rank, R->dev);
    return out;
}

nlohmann::json ParallelTrainer::runMetadata() const {
    const DerivedSizes ds = deriveSizes(m_cfg);
    nlohmann::json j = baseRunMetadata(m_cfg, m_flops, m_peakTflops, m_data.get());
    j["world"] = ds.world;
    // Several GPUs run only behind ParallelTrainerOptions::allowUnverifiedCuda (checkDeviceBackend).
    if (m_cfg.device_backend == "cuda" && ds.world > 1) j["cuda_unverified"] = true;
    if (m_cfg.device_backend == "cuda" && m_cfg.cuda_share_gpus && ds.world > 1) j["cuda_shared_gpus"] = true;
    if (m_opts.hostSyncCollectives) j["host_sync_collectives"] = true;
    j["tp"] = ds.tp;
    j["dp"] = ds.dp;
    // The unsharded count: every element once, from the rank the checkpoint takes it from (dense
    // params from data-parallel rank 0 with their TP shards, experts from expert-data-parallel
    // rank 0 with their ETP shards; a param a whole TP / ETP group holds from its rank 0).
    int64_t params = 0;
    for (const auto& R : m_ranks) {
        const RankCoords& rc = R->coords;
        for (const auto& m : R->models)
            for (const ParamInfo& p : m->params().params()) {
                if (p.sharedEmbedding && p.name == "output_layer.weight") continue;
                if (p.expert ? rc.edp != 0 : rc.dp != 0 || rc.cp != 0) continue;
                if (p.shard == ShardKind::Replicated && (p.expert ? rc.etp : rc.tp) != 0) continue;
                params += p.numel;
            }
    }
    j["num_parameters"] = params;
    return j;
}

void ParallelTrainer::failRank(int local, const Status& st) {
    Status first;
    {
        std::lock_guard<std::mutex> lock(m_errorMutex);
        if (!m_firstError.isOk()) return;
        first = m_firstError = st.withContext(coordText(m_ranks[size_t(local)]->coords));
        abortAfterFailure(local, st);
    }
    if (m_opts.onFailure) m_opts.onFailure(first);
}

void ParallelTrainer::abortAfterFailure(int local, const Status& st) {
    const Status why(st.code() == ErrorCode::Cancelled ? ErrorCode::Cancelled : ErrorCode::CommError,
                     coordText(m_ranks[size_t(local)]->coords) + " stopped: " + st.message());
    m_world->abort(why);
    // Factory-made (e.g. MPI) communicators are not part of m_world: abort this process's side;
    // the other processes learn it from opts.onFailure (or fail by their deadlock guard).
    if (m_opts.makeGroup)
        for (auto& R : m_ranks)
            for (Communicator* c : {R->tpComm.get(), R->tpOverlapComm.get(), R->ppComm.get(), R->dpComm.get(),
                                    R->embdComm.get(), R->normComm.get(), R->amaxComm.get(), R->cpComm.get(),
                                    R->cpRingComm.get(), R->hcpA2aComm.get(), R->epComm.get(), R->edpComm.get(),
                                    R->etpComm.get(), R->etpEpComm.get(), R->sharedTpComm.get()})
                if (c) c->abort(why);
}

void ParallelTrainer::abort(const Status& why) {
    {
        std::lock_guard<std::mutex> lock(m_errorMutex);
        if (!m_firstError.isOk()) return;
        m_firstError = why;
    }
    m_world->abort(why);
    for (auto& R : m_ranks)
        for (Communicator* c : {R->tpComm.get(), R->tpOverlapComm.get(), R->ppComm.get(), R->dpComm.get(),
                                R->embdComm.get(), R->normComm.get(), R->amaxComm.get(), R->cpComm.get(),
                                R->cpRingComm.get(), R->hcpA2aComm.get(), R->epComm.get(), R->edpComm.get(),
                                R->etpComm.get(), R->etpEpComm.get(), R->sharedTpComm.get()})
            if (c) c->abort(why);
}

void ParallelTrainer::injectFailure(int rank, int step, std::string opName) {
    m_injectRank = rank;
    m_injectStep = step;
    m_injectOp = std::move(opName);
}

Status ParallelTrainer::rankStep(int local, int it, const std::atomic<bool>* cancel) {
    RankState& R = *m_ranks[size_t(local)];
    const DerivedSizes ds = deriveSizes(m_cfg);
    const int m = m_numMicrobatches;
    const int dp = ds.dp, dpRank = R.coords.dp;
    Exec& ex0 = R.models[0]->exec();
    Status st;
    {
        RangeScope stepRange(*R.dev, range::kStep, {it, -1, -1, -1});
        for (size_t ch = 0; ch < R.models.size(); ++ch) {
            GptModel& model = *R.models[ch];
            model.clearCaptured();
            model.beginStep(it, m);
            model.exec().setCancelFlag(cancel);
            model.exec().setMicrobatch(-1);
            model.exec().setLayer(-1);
            ParamBuffer* pb = &model.params();
            model.exec().op("zero_grad", trace::Category::Memset, 0, uint64_t(pb->numel()) * 4,
                            [pb] { pb->zeroGrads(); });
            R.syncs[ch]->beginStep(it);
        }
        if (R.rank == m_injectRank && it == m_injectStep) {
            OpDesc d;
            d.name = m_injectOp.c_str();
            d.step = it;
            const std::string name = m_injectOp;
            R.compute->submit(d, [name] { return Status::internal("injected failure in '" + name + "'"); });
        }
        auto stop = [&]() -> Status {
            if (cancel && cancel->load()) return Status::cancelled("cancelled at iteration " + std::to_string(it + 1));
            Status a = m_world->abortStatus();
            if (!a.isOk()) return a;
            return Status::ok();
        };
        const int dataIndex = dpRank * ds.cp + R.coords.cp;  // this rank's CP shard of its DP replica's data
        auto data = [&](int j) -> std::shared_ptr<const Microbatch> { return m_stepData[size_t(dataIndex)][size_t(j)]; };
        auto id = [&](int j) { return j * dp + dpRank; };
        st = R.pipe->run(it, data, id, stop);
        if (st.isOk()) {
            for (auto& s : R.syncs) s->finishGradSync();
            // finalize_model_grads: tied embedding grads summed between first and last stage,
            // after the DP reduction (same DP stream, so in order after the buckets).
            if (R.embdComm) {
                auto e = R.dev->createEvent();
                R.compute->record(*e);
                R.dpStream->wait(*e);
                ParamBuffer& pb = R.models[size_t(R.embdChunk)]->params();
                float* g = pb.mainGrad(R.embdParam);
                R.embdComm->allReduce(*R.dpStream, g, g, size_t(pb.info(R.embdParam).numel), DType::F32, ReduceOp::Sum);
            }
            auto gradsDone = R.dev->createEvent();
            R.dpStream->record(*gradsDone);
            R.compute->wait(*gradsDone);
            {
                RangeScope optRange(*R.dev, range::kOptimizer, {it, -1, -1, -1});
                R.opt->enqueueStep(ex0, m_lr.lrAt(it), it + 1);
                for (auto& s : R.syncs) s->startParamGather();
            }
        }
        Status sc = R.compute->synchronize();
        Status sp = R.p2p->synchronize();
        // With overlap_param_gather the all-gathers keep running into the next forward.
        Status sd = m_cfg.overlap_param_gather ? Status::ok() : R.dpStream->synchronize();
        if (st.isOk()) st = sc;
        if (st.isOk()) st = sp;
        if (st.isOk()) st = sd;
        for (auto& model : R.models) model->exec().clearThrottle();
        R.pipe->endStep();
        // Inside the step's range: the read-back of the losses (an op and a wait) is the step's.
        R.losses.clear();
        GptModel& lastChunk = *R.models.back();
        if (st.isOk() && lastChunk.context().lastStage)
            for (int j = 0; j < m; ++j) R.losses.push_back(lastChunk.microbatchLoss(j * dp + dpRank));
    }
    if (!st.isOk()) {
        failRank(local, st);
        return st;
    }
    return Status::ok();
}

Status ParallelTrainer::step(StepProgress* out) {
    {
        std::lock_guard<std::mutex> lock(m_errorMutex);
        if (!m_firstError.isOk())
            return m_firstError.withContext("the parallel run already failed; create a new trainer");
    }
    const int it = m_iteration;
    const int64_t t0 = monotonicNs();
    const DerivedSizes ds = deriveSizes(m_cfg);
    const int b = m_cfg.micro_batch_size, dp = ds.dp, m = m_numMicrobatches;
    // Data on the calling thread (DataSource is not thread-safe); see the header for the map.
    // [dp rank * cp + cp rank]: with context parallel every CP rank gets its chunks of the sequence.
    const int cp = ds.cp;
    m_stepData.assign(size_t(dp) * size_t(cp), {});
    for (int d = 0; d < dp; ++d)
        for (int j = 0; j < m; ++j) {
            std::shared_ptr<Microbatch> full = m_data->microbatch(m_samples + (int64_t(j) * dp + d) * b, b);
            if (cp == 1) {
                m_stepData[size_t(d)].push_back(full);
                continue;
            }
            for (int r = 0; r < cp; ++r)
                m_stepData[size_t(d) * size_t(cp) + size_t(r)].push_back(
                    std::make_shared<Microbatch>(cpShard(*full, m_cfg.seq_length, b, cp, r)));
        }
    for (auto& R : m_ranks) R->dev->resetPeak();
    std::vector<std::future<Status>> futures;
    for (size_t li = 0; li < m_ranks.size(); ++li)
        futures.push_back(m_ranks[li]->worker->post([this, li, it, cancel = m_cancel] { return rankStep(int(li), it, cancel); }));
    for (auto& f : futures) (void)f.get();
    // Per-rank host record: [failed, #losses, losses (m slots), peak total, peak per category].
    // With several processes the records are exchanged (even after a failure, so that no
    // process waits for one that already gave up); in one process they are just read.
    const int nCat = int(MemCategory::Count);
    const int recSize = 3 + m + nCat;
    bool localFailed = false;
    {
        std::lock_guard<std::mutex> lock(m_errorMutex);
        localFailed = !m_firstError.isOk();
        if (localFailed && !m_opts.gatherHost) return m_firstError;
    }
    std::vector<double> mine, all;
    for (auto& R : m_ranks) {
        const MemoryStats ms = R->dev->memoryStats();
        mine.push_back(localFailed ? 1.0 : 0.0);
        mine.push_back(double(R->losses.size()));
        for (int j = 0; j < m; ++j) mine.push_back(size_t(j) < R->losses.size() ? R->losses[size_t(j)] : 0.0);
        mine.push_back(double(ms.peakTotal));
        for (int cat = 0; cat < nCat; ++cat) mine.push_back(double(ms.peak[size_t(cat)]));
    }
    if (m_opts.gatherHost) {
        Status g = m_opts.gatherHost(mine, recSize, all);
        if (g.isOk() && all.size() != size_t(worldSize()) * size_t(recSize))
            g = Status::internal("host gather returned " + std::to_string(all.size()) + " values, expected " +
                                 std::to_string(size_t(worldSize()) * size_t(recSize)));
        std::lock_guard<std::mutex> lock(m_errorMutex);
        if (!m_firstError.isOk()) return m_firstError;
        if (!g.isOk()) return m_firstError = g.withContext("exchanging step results between processes");
        for (int r = 0; r < worldSize(); ++r)
            if (all[size_t(r) * size_t(recSize)] != 0.0)
                return m_firstError = Status::comm("rank " + std::to_string(r) + " failed at iteration " +
                                                   std::to_string(it + 1) + " (see its process's output)");
    } else {
        all = std::move(mine);  // every rank is local, in global rank order
    }
    double loss = 0;
    int count = 0;
    for (int r = 0; r < worldSize(); ++r) {
        if (m_layout.coordsOf(r).tp != 0) continue;
        const double* rec = all.data() + size_t(r) * size_t(recSize);
        for (int j = 0; j < int(rec[1]); ++j) {
            loss += rec[2 + j];
            ++count;
        }
    }
    // With context parallel every CP rank reports its share of a microbatch's mean loss.
    if (count != dp * m * cp)
        return Status::internal("collected " + std::to_string(count) + " microbatch losses, expected " +
                                std::to_string(dp * m * cp));
    loss /= dp * m;
    if (!std::isfinite(loss)) {
        const Status st = Status::numerical("loss is " + std::to_string(loss) + " at iteration " + std::to_string(it + 1) +
                                            "; lower lr or enable clip_grad");
        std::lock_guard<std::mutex> lock(m_errorMutex);
        m_firstError = st;
        return st;
    }
    const double dt = double(monotonicNs() - t0) * 1e-9;
    ++m_iteration;
    m_samples += m_globalBatch;
    if (out) {
        out->step = m_iteration;
        out->loss = loss;
        out->stepTimeS = dt;
        out->tokensPerS = double(m_globalBatch) * m_cfg.seq_length / std::max(dt, 1e-12);
        out->modelTflops = m_flops / (std::max(dt, 1e-12) * 1e12 * double(worldSize()));
        out->gradNorm = m_ranks[0]->opt->lastStep().gradNorm;
        out->lr = m_ranks[0]->opt->lastStep().lr;
        out->peakMemoryBytes = 0;
        for (size_t cat = 0; cat < size_t(MemCategory::Count); ++cat) out->peakMemoryByCategory[cat] = 0;
        // Most-loaded rank, as Megatron's memory report.
        for (int r = 0; r < worldSize(); ++r) {
            const double* rec = all.data() + size_t(r) * size_t(recSize);
            out->peakMemoryBytes = std::max(out->peakMemoryBytes, int64_t(rec[2 + m]));
            for (size_t cat = 0; cat < size_t(nCat); ++cat)
                out->peakMemoryByCategory[cat] =
                    std::max(out->peakMemoryByCategory[cat], int64_t(rec[3 + m + int(cat)]));
        }
    }
    return Status::ok();
}

Status ParallelTrainer::train(int steps, const TrainerCallbacks& cb, const std::atomic<bool>* cancel) {
    m_cancel = cancel;
    const int target = steps < 0 ? m_cfg.train_iters : m_iteration + steps;
    while (m_iteration < target) {
        if (cancel && cancel->load()) return Status::cancelled("cancelled at iteration " + std::to_string(m_iteration + 1));
        StepProgress p;
        TS_RETURN_IF_ERROR(step(&p));
        if (cb.onStep) cb.onStep(p);
        TS_RETURN_IF_ERROR(saveCheckpointIfDue(m_cfg, m_iteration, false, [this](const std::string& d) { return save(d); }, cb));
    }
    TS_RETURN_IF_ERROR(synchronize());
    return saveCheckpointIfDue(m_cfg, m_iteration, true, [this](const std::string& d) { return save(d); }, cb);
}

Status ParallelTrainer::synchronize() {
    Status first;
    for (auto& R : m_ranks) {
        for (Stream* s : {R->compute.get(), R->dpStream.get(), R->p2p.get(), R->tpStream.get(), R->cpStream.get(),
                          R->sharedStream.get()}) {
            if (!s) continue;
            Status st = s->synchronize();
            if (first.isOk() && !st.isOk()) first = st.withContext(coordText(R->coords));
        }
    }
    std::lock_guard<std::mutex> lock(m_errorMutex);
    return m_firstError.isOk() ? first : m_firstError;
}

Result<std::map<std::string, std::vector<float>>> ParallelTrainer::gatherParams(int dpRank) {
    TS_RETURN_IF_ERROR(synchronize());
    if (int(m_ranks.size()) != worldSize())
        return Status::unsupported("gatherParams needs every rank in this process (this one runs " +
                                   std::to_string(m_ranks.size()) + " of " + std::to_string(worldSize()) + ")");
    const DerivedSizes ds = deriveSizes(m_cfg);
    if (dpRank < 0 || dpRank >= ds.dp) return Status::invalid("dp rank " + std::to_string(dpRank) + " out of range");
    std::map<std::string, std::vector<float>> out;
    // Dense params from the ranks of data-parallel rank dpRank (cp 0), each TP shard from its tp
    // rank; expert weights from the ranks of expert-data-parallel rank dpRank % edp, each ETP
    // shard from its etp rank (the ep coordinate tells which experts a rank holds: by name).
    // With sharded main params (bf16, distributed optimizer) every rank of the replica's group
    // holds the fp32 values of its own shard only: each element comes from the rank that keeps
    // it, and there is no replica to choose.
    for (const auto& R : m_ranks)
        for (const auto& m : R->models)
            if (m->params().mainSharded() && dpRank != 0)
                return Status::invalid("bf16 with the distributed optimizer keeps each fp32 main param on one rank of "
                                       "its data-parallel group: there is only gatherParams(0)");
    const int edp = m_layout.expertDataParallelSize();
    std::vector<float> keptFull, valueFull;
    for (const auto& R : m_ranks) {
        const RankCoords& rc = R->coords;
        for (const auto& m : R->models) {
            ParamBuffer& pb = m->params();
            const bool sharded = pb.mainSharded();
            std::vector<char> kept;
            TS_ASSIGN_OR_RETURN(const auto host, pb.mainParamsToHost(m->exec().stream(), &kept));
            std::vector<float> keptF(kept.begin(), kept.end());
            for (int i = 0; i < pb.count(); ++i) {
                const ParamInfo& info = pb.info(i);
                if (!sharded && (info.expert ? rc.edp != dpRank % edp : (rc.dp != dpRank || rc.cp != 0))) continue;
                const int n = info.expert ? ds.etp : ds.tp, shard = info.expert ? rc.etp : rc.tp;
                if (info.shard == ShardKind::Replicated && shard != 0) continue;
                std::string name = info.name;
                if (info.sharedEmbedding && name == "output_layer.weight") name += "[tied copy]";
                int64_t full = 1;
                for (int64_t d : info.fullShape) full *= d;
                std::vector<float>& v = out[name];
                if (v.empty()) v.assign(static_cast<size_t>(full), 0.f);
                const int parts = info.shard == ShardKind::Replicated ? 1 : n;
                if (!sharded) {
                    copyShardToFull(info, parts, shard, host.data() + info.offset, v.data());
                    continue;
                }
                keptFull.assign(size_t(full), 0.f);
                valueFull.assign(size_t(full), 0.f);
                copyShardToFull(info, parts, shard, keptF.data() + info.offset, keptFull.data());
                copyShardToFull(info, parts, shard, host.data() + info.offset, valueFull.data());
                for (int64_t k = 0; k < full; ++k)
                    if (keptFull[size_t(k)] != 0.f) v[size_t(k)] = valueFull[size_t(k)];
            }
        }
    }
    return out;
}

namespace {

bool isTiedCopy(const ParamInfo& p) { return p.sharedEmbedding && p.name == "output_layer.weight"; }

}  // namespace

// The single-device checkpoint of this run, as arrays to fill (save) or read into (load).
struct CheckpointImage {
    std::vector<ParamInfo> table;  // single-device param table (full shapes, offsets)
    int64_t numel = 0;
    std::vector<float> params, expAvg, expAvgSq;  // [numel] each
};

// The single-device param table: registration order is the virtual stages in layer order
// (chunk-major: stage s = chunk * pp + pp rank, REFERENCE.md §1.3) and GptModel's add order
// inside each; the last stage's copy of a tied embedding is not a param of the single-device
// model. Offsets in reverse registration order, as ParamBuffer::finalize lays them out.
// Expert parallel (epN > 1): each ep coordinate's ranks register the same list except for
// which experts a run of expert entries names (router, then its E/ep local experts, in every
// MoE layer); the single device registers experts 0..E-1 there, which is the runs of ep
// coordinates 0, 1, ... one after the other.
// With several processes, a (stage, ep coordinate) none of this process's ranks holds gets
// its entries from a process that does (opts.gatherText: every process sends those it holds).
static Result<CheckpointImage> checkpointImage(const std::vector<std::unique_ptr<ParallelTrainer::RankState>>& ranks,
                                               const ParallelLayout& layout, const DerivedSizes& ds, int epN,
                                               const ParallelTrainerOptions& opts, const char* what,
                                               ParallelTrainer::RankState* (*holderOf)(
                                                   const std::vector<std::unique_ptr<ParallelTrainer::RankState>>&,
                                                   int pp, int ep)) {
    const bool allLocal = int(ranks.size()) == layout.worldSize();
    if (!allLocal && !opts.gatherText)
        return Status::unsupported(std::string(what) + ": this run's ranks are in several processes and no exchange "
                                                       "between them was given");
    const int stages = ds.pp * ds.vpp;
    // perStage[s * epN + e]: stage s's param list on the ranks of ep coordinate e.
    const int slots = stages * epN;
    std::vector<std::vector<ParamInfo>> perStage(static_cast<size_t>(slots));
    std::vector<bool> have(size_t(slots), false);
    for (int slot = 0; slot < slots; ++slot) {
        const int s = slot / epN, e = slot % epN;
        const int ch = s / ds.pp, pp = s % ds.pp;
        ParallelTrainer::RankState* R = holderOf(ranks, pp, epN > 1 ? e : -1);
        if (!R) continue;
        perStage[size_t(slot)] = R->models[size_t(ch)]->params().params();
        have[size_t(slot)] = true;
    }
    if (!allLocal) {
        nlohmann::json mine = nlohmann::json::object();
        for (int slot = 0; slot < slots; ++slot) {
            if (!have[size_t(slot)]) continue;
            nlohmann::json list = nlohmann::json::array();
            for (const ParamInfo& p : perStage[size_t(slot)])
                list.push_back({{"name", p.name}, {"full", p.fullShape}, {"shape", p.shape}, {"shard", int(p.shard)},
                                {"nwd", p.noWeightDecay}, {"sp", p.sequenceParallel}, {"tied", p.sharedEmbedding},
                                {"expert", p.expert}, {"stride", p.partitionStride}, {"numel", p.numel}});
            mine[std::to_string(slot)] = std::move(list);
        }
        std::vector<std::string> all;
        TS_RETURN_IF_ERROR(opts.gatherText(mine.dump(), all).withContext(std::string(what) + ": exchanging the parameter table"));
        for (const std::string& text : all) {
            const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
            if (!doc.is_object()) return Status::internal(std::string(what) + ": a process sent an unreadable table");
            for (auto it = doc.begin(); it != doc.end(); ++it) {
                const int s = std::stoi(it.key());  // a slot: stage * epN + ep coordinate
                if (s < 0 || s >= slots || have[size_t(s)]) continue;
                for (const auto& e : *it) {
                    ParamInfo p;
                    p.name = e.at("name").get<std::string>();
                    p.fullShape = e.at("full").get<std::vector<int64_t>>();
                    p.shape = e.at("shape").get<std::vector<int64_t>>();
                    p.shard = ShardKind(e.at("shard").get<int>());
                    p.noWeightDecay = e.at("nwd").get<bool>();
                    p.sequenceParallel = e.at("sp").get<bool>();
                    p.sharedEmbedding = e.at("tied").get<bool>();
                    p.expert = e.at("expert").get<bool>();
                    p.partitionStride = e.at("stride").get<int>();
                    p.numel = e.at("numel").get<int64_t>();
                    perStage[size_t(s)].push_back(std::move(p));
                }
                have[size_t(s)] = true;
            }
        }
        for (int slot = 0; slot < slots; ++slot)
            if (!have[size_t(slot)])
                return Status::internal(std::string(what) + ": no process holds pipeline stage " +
                                        std::to_string(slot / epN) +
                                        (epN > 1 ? " for ep rank " + std::to_string(slot % epN) : std::string()));
    }
    CheckpointImage img;
    auto addEntry = [&](const ParamInfo& p) {
        ParamInfo full = p;
        full.shape = full.fullShape;
        full.numel = 1;
        for (int64_t d : full.shape) full.numel *= d;
        img.table.push_back(std::move(full));
    };
    for (int s = 0; s < stages; ++s) {
        const std::vector<ParamInfo>& list = perStage[size_t(s) * size_t(epN)];
        for (int e = 1; e < epN; ++e)
            if (perStage[size_t(s) * size_t(epN) + size_t(e)].size() != list.size())
                return Status::internal(std::string(what) + ": ep ranks 0 and " + std::to_string(e) +
                                        " hold different numbers of params on stage " + std::to_string(s));
        for (int i = 0; i < int(list.size());) {
            if (epN == 1 || !list[size_t(i)].expert) {
                if (!isTiedCopy(list[size_t(i)])) addEntry(list[size_t(i)]);
                ++i;
                continue;
            }
            int end = i;
            while (end < int(list.size()) && list[size_t(end)].expert) ++end;
            for (int e = 0; e < epN; ++e) {
                const std::vector<ParamInfo>& mine = perStage[size_t(s) * size_t(epN) + size_t(e)];
                for (int k = i; k < end; ++k) {
                    if (!mine[size_t(k)].expert)
                        return Status::internal(std::string(what) + ": ep rank " + std::to_string(e) +
                                                " has no expert weight at '" + list[size_t(k)].name + "'");
                    addEntry(mine[size_t(k)]);
                }
            }
            i = end;
        }
    }
    for (size_t i = img.table.size(); i-- > 0;) {
        img.table[i].offset = img.numel;
        img.numel += img.table[i].numel;
    }
    const size_t total = static_cast<size_t>(img.numel);
    img.params.assign(total, 0.f);
    img.expAvg.assign(total, 0.f);
    img.expAvgSq.assign(total, 0.f);
    return img;
}

ParallelTrainer::RankState* ParallelTrainer::localRankState(int globalRank) const {
    for (const auto& R : m_ranks)
        if (R->rank == globalRank) return R.get();
    return nullptr;
}

// A rank of this process on pipeline stage pp (any tp/cp/dp) with ep coordinate ep (any when
// ep < 0), or null.
static ParallelTrainer::RankState* stageHolder(const std::vector<std::unique_ptr<ParallelTrainer::RankState>>& ranks,
                                               int pp, int ep) {
    for (const auto& R : ranks)
        if (R->coords.pp == pp && (ep < 0 || R->coords.ep == ep)) return R.get();
    return nullptr;
}

// dst |= src, word by word: merges images whose every element one of them holds (zero bits in
// the others) into the held bits exactly.
static void orWords(float* dst, const float* src, int64_t n) {
    for (int64_t k = 0; k < n; ++k) {
        uint32_t a, b;
        std::memcpy(&a, dst + k, 4);
        std::memcpy(&b, src + k, 4);
        a |= b;
        std::memcpy(dst + k, &a, 4);
    }
}

Status ParallelTrainer::save(const std::string& dir) {
    TS_RETURN_IF_ERROR(synchronize());
    const DerivedSizes ds = deriveSizes(m_cfg);
    const bool expertParallel = m_cfg.num_moe_experts > 0 && ds.ep > 1;
    const int epN = expertParallel ? ds.ep : 1;
    TS_ASSIGN_OR_RETURN(CheckpointImage img,
                        checkpointImage(m_ranks, m_layout, ds, epN, m_opts, "save", &stageHolder));
    float *P = img.params.data(), *M = img.expAvg.data(), *V = img.expAvgSq.data();
    std::map<std::string, int64_t> fullOffset;  // name -> offset in P/M/V
    for (const ParamInfo& p : img.table) fullOffset[p.name] = p.offset;
    // Every element of the image comes from exactly one rank, so the images of the ranks and of
    // several processes (each filling what its ranks hold, zero bits elsewhere) merge into the
    // whole by OR-ing their words: the bits of the one rank that holds an element, -0.0
    // included (a float sum would make it +0.0). The elements come from:
    //   values: dense params from data-parallel rank 0 (cp 0), expert weights from
    //     expert-data-parallel rank 0; each TP shard from its tp rank (ETP shard from its etp
    //     rank for experts), a param every rank of that group holds whole from its rank 0;
    //   Adam state: without the distributed optimizer from the same rank; with it from every
    //     rank, each adding the pieces it owns (dense buckets are sharded over dp-cp, expert
    //     buckets over edp), except the copies of a TP-replicated dense param on tp ranks > 0;
    //     bf16 main params under the distributed optimizer likewise (each rank keeps its shard).
    // Expert parallel: the ep coordinate only tells which experts a rank holds (by name).
    const bool dist = m_cfg.use_distributed_optimizer;
    const int etpN = m_cfg.num_moe_experts > 0 ? ds.etp : 1;
    std::vector<float> tmp;
    for (const auto& Rp : m_ranks) {
        const RankState& R = *Rp;
        const RankCoords& rc = R.coords;
        // This rank's Adam state in chunk-buffer order (zeros where it owns nothing).
        std::vector<std::vector<float>> localM(R.models.size()), localV(R.models.size());
        for (size_t ch = 0; ch < R.models.size(); ++ch) {
            localM[ch].assign(size_t(R.models[ch]->params().numel()), 0.f);
            localV[ch].assign(size_t(R.models[ch]->params().numel()), 0.f);
        }
        // Host images of the rank's buffers (device memory on a device backend).
        Stream& rs = R.models[0]->exec().stream();
        TS_ASSIGN_OR_RETURN(const auto mHost, kern::toHost(rs, R.opt->expAvg(), R.opt->ownedNumel()));
        TS_ASSIGN_OR_RETURN(const auto vHost, kern::toHost(rs, R.opt->expAvgSq(), R.opt->ownedNumel()));
        const float* m = mHost.data();
        const float* v = vHost.data();
        for (const ShardedAdamW::Piece& pc : R.opt->pieces()) {
            std::copy(m + pc.state, m + pc.state + (pc.end - pc.begin), localM[size_t(pc.chunk)].begin() + pc.begin);
            std::copy(v + pc.state, v + pc.state + (pc.end - pc.begin), localV[size_t(pc.chunk)].begin() + pc.begin);
        }
        for (size_t ch = 0; ch < R.models.size(); ++ch) {
            ParamBuffer& pb = R.models[ch]->params();
            // Sharded main params (bf16, distributed optimizer) are merged like the Adam state:
            // each rank's image holds the values it keeps, zero bits elsewhere.
            const bool sharded = pb.mainSharded();
            std::vector<char> kept;
            TS_ASSIGN_OR_RETURN(auto pHost, pb.mainParamsToHost(rs, &kept));
            if (sharded)
                for (size_t k = 0; k < pHost.size(); ++k)
                    if (!kept[k]) pHost[k] = 0.f;
            for (int i = 0; i < pb.count(); ++i) {
                const ParamInfo& info = pb.info(i);
                if (isTiedCopy(info)) continue;
                const auto it = fullOffset.find(info.name);
                if (it == fullOffset.end())
                    return Status::internal("save: checkpoint table has no '" + info.name + "' for " + coordText(rc));
                const int64_t off = it->second;
                const int n = info.expert ? etpN : ds.tp, shard = info.expert ? rc.etp : rc.tp;
                if (info.shard == ShardKind::Replicated && shard != 0) continue;
                const bool holder = info.expert ? rc.edp == 0 : rc.dp == 0 && rc.cp == 0;
                if (holder && !sharded) copyShardToFull(info, n, shard, pHost.data() + info.offset, P + off);
                if (!dist && !holder) continue;
                int64_t fullNumel = 1;
                for (int64_t d : info.fullShape) fullNumel *= d;
                std::vector<std::pair<const std::vector<float>*, float*>> summed = {{&localM[ch], M}, {&localV[ch], V}};
                if (sharded) summed.push_back({&pHost, P});
                for (auto [local, full] : summed) {
                    tmp.assign(size_t(fullNumel), 0.f);
                    copyShardToFull(info, n, shard, local->data() + info.offset, tmp.data());
                    orWords(full + off, tmp.data(), fullNumel);
                }
            }
        }
    }
    CheckpointState st;
    // FP8 scaling state: the ranks of a stage agree on scales and history except the newest
    // amax (history[0]), which each observed locally and the next step reduces with MAX over
    // tp-dp-cp: merged element-wise with max, that is the state the next step would start from.
    // With several processes each sends what its ranks hold.
    nlohmann::json fp8 = nlohmann::json::object();
    bool anyFp8 = false;
    auto merge = [&fp8](const nlohmann::json& s) {
        for (auto it = s.begin(); it != s.end(); ++it) {
            auto have = fp8.find(it.key());
            if (have == fp8.end() || !(*have)["history"].is_array() || !(*it)["history"].is_array() ||
                (*have)["history"].size() != (*it)["history"].size()) {
                fp8[it.key()] = *it;
                continue;
            }
            nlohmann::json& h = (*have)["history"];
            for (size_t i = 0; i < h.size(); ++i)
                h[i] = std::max(h[i].get<double>(), (*it)["history"][i].get<double>());
        }
    };
    for (const auto& R : m_ranks)
        for (const auto& m : R->models)
            if (nlohmann::json s = m->fp8State(); s.is_object()) {
                anyFp8 = true;
                merge(s);
            }
    if (int(m_ranks.size()) != worldSize() && !m_cfg.fp8.empty()) {
        if (!m_opts.gatherText)
            return Status::unsupported("save: this run's ranks are in several processes and no exchange between them was given");
        std::vector<std::string> all;
        TS_RETURN_IF_ERROR(m_opts.gatherText(fp8.dump(), all).withContext("save: exchanging the FP8 state"));
        for (const std::string& text : all) {
            const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
            if (!doc.is_object()) return Status::internal("save: a process sent an unreadable FP8 state");
            merge(doc);
            anyFp8 = anyFp8 || !doc.empty();
        }
    }
    if (anyFp8) st.fp8 = std::move(fp8);
    // The routers' expert bias and qb_beta: the same on every rank holding a layer; each chunk gives
    // its layers.
    auto routerLayers = [&](auto state, const char* what, nlohmann::json* out) -> Status {
        nlohmann::json merged = nlohmann::json::object();
        for (const auto& R : m_ranks)
            for (const auto& m : R->models)
                if (nlohmann::json s = ((*m).*state)(); s.is_object()) merged.update(s);
        if (int(m_ranks.size()) != worldSize()) {
            if (!m_opts.gatherText)
                return Status::unsupported("save: this run's ranks are in several processes and no exchange between them was given");
            std::vector<std::string> all;
            TS_RETURN_IF_ERROR(m_opts.gatherText(merged.dump(), all).withContext(std::string("save: exchanging the ") + what));
            for (const std::string& text : all) {
                const nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
                if (!doc.is_object()) return Status::internal(std::string("save: a process sent an unreadable ") + what);
                merged.update(doc);
            }
        }
        *out = std::move(merged);
        return Status::ok();
    };
    if (m_cfg.num_moe_experts > 0 && m_cfg.moe_router_enable_expert_bias)
        TS_RETURN_IF_ERROR(routerLayers(&GptModel::routerState, "expert bias", &st.expertBias));
    if (m_cfg.num_moe_experts > 0 && m_cfg.moe_router_load_balancing_type == "quantile_balancing")
        TS_RETURN_IF_ERROR(routerLayers(&GptModel::qbBetaState, "qb_beta", &st.qbBeta));
    st.iteration = m_iteration;
    st.samplesConsumed = m_samples;
    st.seed = m_cfg.seed;
    st.adamSteps = m_ranks[0]->opt->stepCount();
    st.config = configToJson(m_cfg);
    st.layout = {{"world", ds.world},
                 {"tensor_model_parallel_size", ds.tp},
                 {"pipeline_model_parallel_size", ds.pp},
                 {"virtual_pipeline_model_parallel_size", ds.vpp},
                 {"data_parallel_size", ds.dp},
                 {"expert_model_parallel_size", epN},
                 {"expert_tensor_parallel_size", etpN},
                 {"sequence_parallel", m_cfg.sequence_parallel},
                 {"use_distributed_optimizer", m_cfg.use_distributed_optimizer}};
    if (int(m_ranks.size()) == worldSize()) return writeCheckpointFiles(dir, img.table, img.numel, P, M, V, st);
    // Several processes: the merges, then the process of global rank 0 writes; every process
    // learns whether that worked (the last merge doubles as the barrier after the write).
    if (!m_opts.mergeHost)
        return Status::unsupported("save: this run's ranks are in several processes and no exchange between them was given");
    static_assert(sizeof(float) == sizeof(uint32_t));
    for (std::vector<float>* v : {&img.params, &img.expAvg, &img.expAvgSq})
        TS_RETURN_IF_ERROR(m_opts.mergeHost(reinterpret_cast<uint32_t*>(v->data()), v->size())
                               .withContext("save: gathering the checkpoint"));
    Status wrote;
    if (localRankState(0)) wrote = writeCheckpointFiles(dir, img.table, img.numel, P, M, V, st);
    uint32_t failed = wrote.isOk() ? 0 : 1;
    TS_RETURN_IF_ERROR(m_opts.mergeHost(&failed, 1).withContext("save: waiting for the checkpoint to be written"));
    if (!wrote.isOk()) return wrote;
    if (failed != 0)
        return Status::io("save: the process of rank 0 could not write checkpoint '" + dir + "' (see its log)");
    return Status::ok();
}

Status ParallelTrainer::load(const std::string& dir) {
    TS_RETURN_IF_ERROR(synchronize());
    for (const auto& R : m_ranks)
        for (const auto& m : R->models) m->weightsReplaced();  // even if the load fails part way
    const DerivedSizes ds = deriveSizes(m_cfg);
    const int epN = m_cfg.num_moe_experts > 0 && ds.ep > 1 ? ds.ep : 1;
    // Every process reads the files (a shared or copied checkpoint directory) and takes its
    // ranks' shards (by name: an expert-parallel rank finds its experts among all of them).
    TS_ASSIGN_OR_RETURN(CheckpointImage img,
                        checkpointImage(m_ranks, m_layout, ds, epN, m_opts, "load", &stageHolder));
    const float *P = img.params.data(), *M = img.expAvg.data(), *V = img.expAvgSq.data();
    const int etpN = m_cfg.num_moe_experts > 0 ? ds.etp : 1;
    CheckpointState st;
    TS_RETURN_IF_ERROR(readCheckpointFiles(dir, img.table, img.numel, img.params.data(), img.expAvg.data(),
                                           img.expAvgSq.data(), &st));
    if (st.seed != m_cfg.seed)
        return Status::invalid("checkpoint '" + dir + "' was trained with seed " + std::to_string(st.seed) +
                               ", the config has seed " + std::to_string(m_cfg.seed) + "; resume would not be exact");
    std::map<std::string, int64_t> fullOffset;  // name -> offset in P/M/V
    for (const ParamInfo& p : img.table) fullOffset[p.name] = p.offset;
    const int64_t embOffset = fullOffset.count("embedding.word_embeddings.weight")
                                  ? fullOffset["embedding.word_embeddings.weight"]
                                  : -1;
    // Every rank (all DP replicas) gets its TP shard of every param it holds; its optimizer
    // gets the pieces it owns. The tied copy on the last stage is the embedding.
    for (auto& Rp : m_ranks) {
        RankState& R = *Rp;
        std::vector<std::vector<float>> localM(R.models.size()), localV(R.models.size());
        Stream& rs = R.models[0]->exec().stream();
        for (size_t ch = 0; ch < R.models.size(); ++ch) {
            ParamBuffer& pb = R.models[ch]->params();
            localM[ch].assign(size_t(pb.numel()), 0.f);
            localV[ch].assign(size_t(pb.numel()), 0.f);
            // The chunk's params as a host image (padding kept), filled below, then uploaded.
            TS_ASSIGN_OR_RETURN(auto pHost, pb.mainParamsToHost(rs));
            for (int i = 0; i < pb.count(); ++i) {
                const ParamInfo& info = pb.info(i);
                const auto it = fullOffset.find(info.name);
                const int64_t off = isTiedCopy(info) ? embOffset : (it == fullOffset.end() ? -1 : it->second);
                if (off < 0)
                    return Status::internal("checkpoint table has no '" + info.name + "' for " + coordText(R.coords));
                // Experts are split over "etp", the rest over "tp".
                const int n = info.expert ? etpN : ds.tp, t = info.expert ? R.coords.etp : R.coords.tp;
                copyFullToShard(info, n, t, P + off, pHost.data() + info.offset);
                copyFullToShard(info, n, t, M + off, localM[ch].data() + info.offset);
                copyFullToShard(info, n, t, V + off, localV[ch].data() + info.offset);
            }
            TS_RETURN_IF_ERROR(pb.mainParamsFromHost(rs, pHost));
        }
        TS_ASSIGN_OR_RETURN(auto mHost, kern::toHost(rs, R.opt->expAvg(), R.opt->ownedNumel()));
        TS_ASSIGN_OR_RETURN(auto vHost, kern::toHost(rs, R.opt->expAvgSq(), R.opt->ownedNumel()));
        for (const ShardedAdamW::Piece& pc : R.opt->pieces()) {
            const auto& lm = localM[size_t(pc.chunk)];
            const auto& lv = localV[size_t(pc.chunk)];
            std::copy(lm.begin() + pc.begin, lm.begin() + pc.end, mHost.begin() + pc.state);
            std::copy(lv.begin() + pc.begin, lv.begin() + pc.end, vHost.begin() + pc.state);
        }
        TS_RETURN_IF_ERROR(kern::copyFromHost(rs, R.opt->expAvg(), mHost.data(), mHost.size() * sizeof(float)));
        TS_RETURN_IF_ERROR(kern::copyFromHost(rs, R.opt->expAvgSq(), vHost.data(), vHost.size() * sizeof(float)));
        R.opt->setStepCount(st.adamSteps);
    }
    for (const auto& R : m_ranks)
        for (const auto& m : R->models) {
            TS_RETURN_IF_ERROR(m->setFp8State(st.fp8).withContext("checkpoint '" + dir + "'"));
            TS_RETURN_IF_ERROR(m->setRouterState(st.expertBias).withContext("checkpoint '" + dir + "'"));
            TS_RETURN_IF_ERROR(m->setQbBetaState(st.qbBeta).withContext("checkpoint '" + dir + "'"));
        }
    m_iteration = st.iteration;
    m_samples = st.samplesConsumed;
    return Status::ok();
}

const GradSync& ParallelTrainer::gradSync(int rank, int chunk) const {
    return *m_ranks.at(size_t(rank))->syncs.at(size_t(chunk));
}

GptModel& ParallelTrainer::rankModel(int rank, int chunk) { return *m_ranks.at(size_t(rank))->models.at(size_t(chunk)); }

int ParallelTrainer::numChunks() const { return m_ranks.empty() ? 0 : int(m_ranks[0]->models.size()); }

int64_t ParallelTrainer::optimizerOwnedNumel(int rank) const { return m_ranks.at(size_t(rank))->opt->ownedNumel(); }

int ParallelTrainer::bucketsLaunchedEarly() const {
    int n = 0;
    for (const auto& R : m_ranks)
        for (const auto& s : R->syncs) n += s->bucketsLaunchedEarly();
    return n;
}

MemoryStats ParallelTrainer::memoryStats(int rank) const { return m_ranks.at(size_t(rank))->dev->memoryStats(); }

}  // namespace ts::engine
