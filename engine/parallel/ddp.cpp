// Grad buckets and their reductions (see ddp.h).
#include "engine/parallel/ddp.h"

#include <algorithm>
#include <numeric>

#include "engine/backend/kernels.h"

namespace ts::engine {

namespace k = ts::engine::kern;

namespace {

int64_t padUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace

Result<GradBufferLayout> computeGradBufferLayout(const std::vector<ParamInfo>& params,
                                                 const GradLayoutOptions& opts) {
    if (opts.dp < 1 || opts.expertDp < 1) return Status::invalid("data-parallel size must be >= 1");
    if (opts.bucketSize < 0) return Status::invalid("bucket_size must be >= 0");
    if (!opts.expert.empty() && opts.expert.size() != params.size())
        return Status::internal("expert flags do not match the parameter count");
    const bool dist = opts.distributedOptimizer;
    GradBufferLayout L;
    L.paramOffset.assign(params.size(), 0);
    int64_t bucketStart = 0;
    // One pass per group: the dense params, then the expert params (their own buffer in
    // Megatron; here the tail of the same one).
    for (int group : {0, 1}) {
        const int dp = group == 0 ? opts.dp : opts.expertDp;
        // Megatron pads bucket ends to lcm(dp, 128) so every shard is a whole number of
        // elements and a multiple of 128/dp-aligned sizes for NCCL; param starts to 64 elements.
        const int64_t bucketDivisor = dist ? std::lcm<int64_t>(dp, 128) : 1;
        int64_t paramStart = bucketStart, paramEnd = bucketStart;
        std::vector<int> current;
        auto closeBucket = [&](int64_t end) {
            end = padUp(end, bucketDivisor);
            L.buckets.push_back({bucketStart, end - bucketStart, current, group});
            bucketStart = end;
            current.clear();
            return end;
        };
        // Reverse registration order = backprop order: bucket 0 holds the last layers.
        for (size_t i = params.size(); i-- > 0;) {
            const bool isExpert = !opts.expert.empty() && opts.expert[i];
            if (isExpert != (group == 1)) continue;
            const ParamInfo& p = params[i];
            if (dist) paramStart = padUp(paramStart, 64);
            // The tied embedding/output weight gets a bucket of its own (distributed optimizer):
            // its grad is all-reduced between the first and last pp stage over the whole tensor.
            const bool ownBucket = dist && p.sharedEmbedding;
            if (ownBucket && !current.empty()) paramStart = closeBucket(paramStart);
            paramEnd = paramStart + p.numel;
            L.paramOffset[i] = paramStart;
            current.push_back(int(i));
            if ((opts.bucketSize > 0 && paramEnd - bucketStart >= opts.bucketSize) || ownBucket)
                paramStart = closeBucket(paramEnd);
            else
                paramStart = paramEnd;
        }
        if (!current.empty()) closeBucket(paramEnd);
    }
    L.numel = bucketStart;
    if (dist)
        for (const GradBucket& b : L.buckets)
            if (b.numel % (b.group == 0 ? opts.dp : opts.expertDp) != 0)
                return Status::internal("grad bucket of " + std::to_string(b.numel) +
                                        " elements is not divisible by its data-parallel size");
    return L;
}

int64_t effectiveBucketSize(const Config& c, int dp, int ppRank, int chunk) {
    if (!c.overlap_grad_reduce) return 0;
    // Megatron disables bucketing off the critical path: pp rank > 0 and model chunks > 0.
    if (ppRank > 0 || chunk > 0) return 0;
    if (c.bucket_size > 0) return c.bucket_size;
    return std::max<int64_t>(40'000'000, int64_t(1'000'000) * dp);
}

GradSync::GradSync(ParamBuffer& params, GradBufferLayout layout, const GradSyncOptions& opts, Device& dev,
                   Stream& compute, Stream& dpStream, Communicator* dpComm)
    : m_params(params), m_layout(std::move(layout)), m_opts(opts), m_dev(dev), m_compute(compute),
      m_dpStream(dpStream), m_comm(dpComm) {
    m_bucketOf.assign(size_t(params.count()), -1);
    for (size_t b = 0; b < m_layout.buckets.size(); ++b)
        for (int p : m_layout.buckets[b].params) m_bucketOf[size_t(p)] = int(b);
    m_gatherDone.resize(m_layout.buckets.size());
    beginStep(0);
}

void GradSync::beginStep(int step) {
    m_step = step;
    m_paramReady.assign(m_bucketOf.size(), 0);
    m_remaining.clear();
    for (const GradBucket& b : m_layout.buckets) m_remaining.push_back(int(b.params.size()));
    m_launched.assign(m_layout.buckets.size(), 0);
    m_launchedEarly = 0;
    m_armed = false;
}

void GradSync::onGradsReady(const std::vector<int>& params) {
    if (!m_armed || !m_opts.overlapGradReduce) return;
    for (int p : params) {
        if (p < 0 || size_t(p) >= m_bucketOf.size() || m_paramReady[size_t(p)]) continue;
        m_paramReady[size_t(p)] = 1;
        const int b = m_bucketOf[size_t(p)];
        if (b >= 0 && --m_remaining[size_t(b)] == 0 && !m_launched[size_t(b)]) {
            launchBucket(b);
            ++m_launchedEarly;
        }
    }
}

void GradSync::launchBucket(int b) {
    // The event orders the reduction after every kernel enqueued so far on the compute stream
    // (the ones that produced this bucket's grads) and nothing later.
    auto e = m_dev.createEvent();
    m_compute.record(*e);
    m_dpStream.wait(*e);
    enqueueReduction(b);
    m_launched[size_t(b)] = 1;
}

void GradSync::finishGradSync() {
    bool any = false;
    for (char l : m_launched) any |= !l;
    if (!any) return;
    auto e = m_dev.createEvent();
    m_compute.record(*e);
    m_dpStream.wait(*e);
    for (size_t b = 0; b < m_layout.buckets.size(); ++b) {
        if (m_launched[b]) continue;
        enqueueReduction(int(b));
        m_launched[b] = 1;
    }
}

GradSync::Group GradSync::groupOf(const GradBucket& b) const {
    if (b.group == 1) return {m_opts.expertDp, m_opts.expertDpRank, m_opts.expertComm};
    return {m_opts.dp, m_opts.dpRank, m_comm};
}

void GradSync::enqueueReduction(int b) {
    const GradBucket& bucket = m_layout.buckets[size_t(b)];
    const Group g = groupOf(bucket);
    const int dp = g.size;
    const int64_t n = bucket.numel;
    if (n == 0) return;
    float* base = m_params.mainGrads() + bucket.offset;
    OpDesc d;
    d.step = m_step;
    d.category = trace::Category::Elementwise;
    if (dp <= 1 || !g.comm) {
        // Nothing to reduce with (expert params with expertDp == 1 still get the 1/dp every
        // grad gets: their tokens came from all dp ranks).
        if (m_opts.dp > 1 && dp != m_opts.dp) {
            const float scale = 1.f / float(m_opts.dp);
            d.name = "grad_prescale";
            d.bytes = uint64_t(n) * 8;
            m_dpStream.submit(d, [=] { k::scale(base, scale, n); return Status::ok(); });
        }
        return;
    }
    const bool avg = m_opts.averageInCollective;
    // Sum: pre-scale by 1/dp (the dense dp, for the expert group too); Avg over a group of
    // `dp` ranks: pre-scale by dp/dense-dp (1 for the dense group).
    const float scale = avg ? float(dp) / float(m_opts.dp) : 1.f / float(m_opts.dp);
    const ReduceOp op = avg ? ReduceOp::Avg : ReduceOp::Sum;
    const bool dist = m_opts.distributedOptimizer;
    const int64_t shard = n / dp, mine = int64_t(g.rank) * shard;
    Communicator* comm = g.comm;
    if (m_opts.gradReduceInFp32) {
        if (scale != 1.f) {
            d.name = "grad_prescale";
            d.bytes = uint64_t(n) * 8;
            m_dpStream.submit(d, [=] { k::scale(base, scale, n); return Status::ok(); });
        }
        if (dist) comm->reduceScatter(m_dpStream, base, base + mine, size_t(shard), DType::F32, op);
        else comm->allReduce(m_dpStream, base, base, size_t(n), DType::F32, op);
        return;
    }
    // bf16 reduction: the bucket goes through a bf16 comm buffer (one per GradSync, reused
    // bucket after bucket because the DP stream runs them in order).
    if (!m_bf16Scratch) {
        int64_t maxNumel = 1;
        for (const GradBucket& gb : m_layout.buckets) maxNumel = std::max(maxNumel, gb.numel);
        auto r = m_dev.allocate(size_t(maxNumel) * 2, MemCategory::CommBuffers);
        if (!r) {
            const Status st = r.status().withContext("allocating the bf16 grad-reduction buffer");
            d.name = "grad_to_bf16";
            m_dpStream.submit(d, [st] { return st; });
            return;
        }
        m_bf16Scratch = std::move(r).value();
    }
    uint16_t* bf = m_bf16Scratch->as<uint16_t>();
    d.name = "grad_to_bf16";
    d.bytes = uint64_t(n) * 6;
    m_dpStream.submit(d, [=] {
        if (scale != 1.f) k::scale(base, scale, n);
        k::floatToBf16(base, bf, n);
        return Status::ok();
    });
    if (dist) comm->reduceScatter(m_dpStream, bf, bf + mine, size_t(shard), DType::BF16, op);
    else comm->allReduce(m_dpStream, bf, bf, size_t(n), DType::BF16, op);
    d.name = "grad_from_bf16";
    const int64_t lo = dist ? mine : 0, len = dist ? shard : n;
    d.bytes = uint64_t(len) * 6;
    m_dpStream.submit(d, [=] {
        k::bf16ToFloat(bf + lo, base + lo, len);
        return Status::ok();
    });
}

void GradSync::startParamGather() {
    if (!m_opts.distributedOptimizer) return;
    auto e = m_dev.createEvent();
    m_compute.record(*e);
    m_dpStream.wait(*e);
    ParamBuffer* pb = &m_params;
    // Last bucket first: it holds the first layers, which the next forward needs first.
    for (size_t b = m_layout.buckets.size(); b-- > 0;) {
        const GradBucket& bucket = m_layout.buckets[b];
        const Group g = groupOf(bucket);
        if (bucket.numel == 0 || g.size <= 1 || !g.comm) continue;
        const int64_t shard = bucket.numel / g.size, mine = int64_t(g.rank) * shard;
        const int64_t lo = bucket.offset, hi = bucket.offset + bucket.numel;
        OpDesc d;
        d.category = trace::Category::Optimizer;
        d.step = m_step;
        if (!m_params.mainSharded()) {
            // fp32 main params everywhere: gather them, then round the bucket's model copy.
            float* base = m_params.mainParams() + bucket.offset;
            g.comm->allGather(m_dpStream, base + mine, base, size_t(shard), DType::F32);
            if (m_params.bf16()) {
                d.name = "param_copy_bf16";
                d.bytes = uint64_t(bucket.numel) * 8;
                m_dpStream.submit(d, [pb, lo, hi] {
                    pb->syncModelParams(lo, hi);
                    return Status::ok();
                });
            }
        } else {
            // bf16 with sharded main params (Megatron's param_data all-gather): the step wrote
            // this rank's shard of the model copy's bf16 bits; they go round the group in place.
            uint16_t* bits = m_params.modelBits() + lo;
            g.comm->allGather(m_dpStream, bits + mine, bits, size_t(shard), DType::BF16);
        }
        m_gatherDone[b] = m_dev.createEvent();
        m_dpStream.record(*m_gatherDone[b]);
    }
    if (!m_opts.overlapParamGather) finishParamGather();
}

void GradSync::onForwardPre(const std::vector<int>& params) {
    for (int p : params) {
        if (p < 0 || size_t(p) >= m_bucketOf.size()) continue;
        const int b = m_bucketOf[size_t(p)];
        if (b < 0 || !m_gatherDone[size_t(b)]) continue;
        m_compute.wait(*m_gatherDone[size_t(b)]);
        m_gatherDone[size_t(b)].reset();
    }
}

void GradSync::finishParamGather() {
    for (auto& e : m_gatherDone) {
        if (!e) continue;
        m_compute.wait(*e);
        e.reset();
    }
}

}  // namespace ts::engine
