// Data parallelism over one model chunk's contiguous grad buffer (Megatron-Core
// DistributedDataParallel + ParamAndGradBuffer, REFERENCE.md §3.1-3.2):
//   - the bucket layout: params in reverse registration order, buckets closed once they hold
//     bucket_size elements; with the distributed optimizer every param start is padded to 64
//     elements, every bucket end to lcm(dp, 128), and the tied embedding gets its own bucket;
//   - GradSync: launches each bucket's reduction (all-reduce, or reduce-scatter into this
//     rank's shard with the distributed optimizer) on the DP comm stream, either as soon as
//     the last microbatch's backward has produced every grad of the bucket (overlap_grad_reduce;
//     an event recorded on the compute stream at that point orders the reduction after those
//     kernels and before nothing else, so the rest of backward overlaps it) or all at the end;
//     and the distributed optimizer's param all-gather (lazily waited per bucket by the next
//     forward with overlap_param_gather).
// Scaling: grads are pre-scaled by 1/dp and summed, or AVG in the collective with
// average_in_collective. grad_reduce_in_fp32=false rounds the bucket through bf16 and reduces
// in bf16 (fp32 accumulation in the collective, one rounding), as Megatron's bf16 grad buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/backend/backend.h"
#include "engine/comm/communicator.h"
#include "engine/config/config.h"
#include "engine/model/param_buffer.h"

namespace ts::engine {

struct GradBucket {
    int64_t offset = 0;        // first element in the buffer
    int64_t numel = 0;         // padded size (a multiple of dp with the distributed optimizer)
    std::vector<int> params;   // registration indices, in buffer order
    int group = 0;             // reduction group (GradSyncOptions::expert for 1: expert params)
};

struct GradBufferLayout {
    std::vector<int64_t> paramOffset;  // per registration index
    std::vector<GradBucket> buckets;   // bucket 0 starts at offset 0 (last layers)
    int64_t numel = 0;                 // padded buffer size
};

struct GradLayoutOptions {
    int64_t bucketSize = 0;  // elements; 0 = one bucket (no bucketing)
    int dp = 1;
    bool distributedOptimizer = false;
    // Expert parallelism (Megatron's separate expert_parallel_buffers): params with
    // expert[i] != 0 get buckets of their own after the dense ones (group 1), padded for
    // `expertDp` (the expert-data-parallel size) instead of dp.
    std::vector<char> expert;  // per registration index; empty = none
    int expertDp = 1;
};

// Megatron's _compute_default_per_buffer_param_layout / the distributed optimizer's padded
// layout, for params given in registration order.
Result<GradBufferLayout> computeGradBufferLayout(const std::vector<ParamInfo>& params,
                                                 const GradLayoutOptions& opts);

// Bucket size Megatron uses for (pp rank, model chunk): bucket_size or max(40M, 1M*dp) with
// overlap_grad_reduce, 0 (single bucket) without it and on pp rank > 0 / chunk > 0.
int64_t effectiveBucketSize(const Config& c, int dp, int ppRank, int chunk);

// The range of bucket `b` this DP rank owns with the distributed optimizer: [begin, end)
// (dp, dpRank: of the bucket's group).
inline std::pair<int64_t, int64_t> shardOf(const GradBucket& b, int dp, int dpRank) {
    const int64_t n = b.numel / dp;
    return {b.offset + dpRank * n, b.offset + (dpRank + 1) * n};
}

struct GradSyncOptions {
    int dp = 1;
    int dpRank = 0;
    // Buckets of group 1 (expert params): reduced over the expert-data-parallel group
    // (`expertComm`, `expertDp` ranks) but scaled by 1/dp like every grad (Megatron pre-scales
    // expert grads by edp/dp_cp and averages over edp: the same 1/dp_cp).
    int expertDp = 1;
    int expertDpRank = 0;
    Communicator* expertComm = nullptr;  // used only on the DP stream; null when expertDp == 1
    bool overlapGradReduce = false;
    bool distributedOptimizer = false;
    bool overlapParamGather = false;
    bool averageInCollective = false;
    bool gradReduceInFp32 = true;
};

// One model chunk's DP synchronisation. All calls come from the rank's host thread.
class GradSync {
public:
    // `dpComm` must be used only on `dpStream` (may be null when dp == 1).
    GradSync(ParamBuffer& params, GradBufferLayout layout, const GradSyncOptions& opts, Device& dev,
             Stream& compute, Stream& dpStream, Communicator* dpComm);

    const GradBufferLayout& layout() const { return m_layout; }
    const GradSyncOptions& options() const { return m_opts; }

    // Start of an iteration: nothing is ready, nothing launched.
    void beginStep(int step);
    // Whether grad-ready reports count (Megatron: only the last microbatch's backward; the
    // others run under no_sync()).
    void setLastMicrobatch(bool on) { m_armed = on; }
    // GptModel grad-ready hook: with overlap_grad_reduce, launches every bucket that became
    // complete.
    void onGradsReady(const std::vector<int>& params);
    // End of backward: launches the buckets not launched yet (all of them without overlap).
    void finishGradSync();
    int bucketsLaunchedEarly() const { return m_launchedEarly; }

    // Distributed optimizer, after the optimizer step was enqueued on the compute stream:
    // all-gathers the updated params of every bucket on the DP stream (last bucket first, i.e.
    // first layers first): the fp32 main params, or with sharded main params (bf16) the model
    // copy's bf16 bits. Without overlap_param_gather the compute stream waits for all of
    // them now; with it, onForwardPre() makes the compute stream wait per bucket just before
    // the forward first reads it.
    void startParamGather();
    void onForwardPre(const std::vector<int>& params);
    // Makes the compute stream wait for every outstanding param all-gather.
    void finishParamGather();

private:
    void launchBucket(int b);
    void enqueueReduction(int b);
    // The group a bucket is reduced (and, distributed optimizer, sharded) over.
    struct Group {
        int size = 1, rank = 0;
        Communicator* comm = nullptr;
    };
    Group groupOf(const GradBucket& b) const;

    ParamBuffer& m_params;
    GradBufferLayout m_layout;
    GradSyncOptions m_opts;
    Device& m_dev;
    Stream& m_compute;
    Stream& m_dpStream;
    Communicator* m_comm;
    std::vector<int> m_bucketOf;             // param -> bucket
    std::vector<int> m_remaining;            // per bucket: params not ready yet
    std::vector<char> m_paramReady;
    std::vector<char> m_launched;
    std::vector<std::unique_ptr<Event>> m_gatherDone;  // per bucket; null = nothing pending
    std::unique_ptr<Buffer> m_bf16Scratch;   // grad_reduce_in_fp32 = false
    bool m_armed = false;
    int m_step = 0;
    int m_launchedEarly = 0;
};

}  // namespace ts::engine
