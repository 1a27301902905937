// Sharded AdamW with whole-model gradient clipping (see dist_optimizer.h).
#include "engine/parallel/dist_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/backend/kernels.h"

namespace ts::engine {

namespace k = ts::engine::kern;

Result<std::unique_ptr<ShardedAdamW>> ShardedAdamW::create(const Config& c, std::vector<OptimizerChunk> chunks,
                                                           Device& dev, Communicator* normComm) {
    TS_RETURN_IF_ERROR(validateAdamConfig(c));
    std::unique_ptr<ShardedAdamW> o(new ShardedAdamW());
    o->m_hp = AdamHyper::fromConfig(c);
    o->m_normComm = normComm;
    int64_t state = 0;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
        const OptimizerChunk& ch = chunks[ci];
        if (!ch.params) return Status::internal("optimizer chunk without params");
        for (const OwnedRange& r : ch.owned) {
            for (int p = 0; p < ch.params->count(); ++p) {
                const ParamInfo& info = ch.params->info(p);
                const int64_t lo = std::max(r.begin, info.offset), hi = std::min(r.end, info.offset + info.numel);
                if (lo >= hi) continue;
                Piece pc;
                pc.chunk = int(ci);
                pc.param = p;
                pc.begin = lo;
                pc.end = hi;
                pc.state = state;
                pc.noWeightDecay = info.noWeightDecay;
                pc.inNorm = ch.countInNorm.empty() || ch.countInNorm[size_t(p)];
                state += hi - lo;
                o->m_pieces.push_back(pc);
            }
        }
    }
    // Param order inside the buffer does not matter for AdamW (element-wise); keep buffer order.
    o->m_ownedNumel = state;
    const size_t bytes = size_t(std::max<int64_t>(state, 1)) * sizeof(float);
    auto m = dev.allocate(bytes, MemCategory::OptimizerState);
    if (!m) return m.status().withContext("allocating Adam exp_avg");
    auto v = dev.allocate(bytes, MemCategory::OptimizerState);
    if (!v) return v.status().withContext("allocating Adam exp_avg_sq");
    // The local sum of squares (double) and its float for the all-reduce over the norm group.
    auto nb = dev.allocate(sizeof(double) + sizeof(float), MemCategory::Workspace);
    if (!nb) return nb.status();
    o->m_m = std::move(m).value();
    o->m_v = std::move(v).value();
    o->m_normBuf = std::move(nb).value();
    // allocate() zero-fills exp_avg and exp_avg_sq on every backend.
    for (const Piece& p : o->m_pieces) {
        ParamBuffer* pb = chunks[size_t(p.chunk)].params;
        float* main = pb->mainParamsAt(p.begin, p.end);
        if (!main)
            return Status::internal("optimizer piece of '" + pb->info(p.param).name +
                                    "' outside the main params this rank keeps");
        // bf16: the step writes the piece's model bits in its pass (the bits are indexed as the
        // whole buffer, as syncModelParams(begin, end) writes them)
        uint16_t* bits = pb->modelBits();
        o->m_segments.push_back({main, pb->mainGrads() + p.begin, o->m_m->as<float>() + p.state,
                                 o->m_v->as<float>() + p.state, p.end - p.begin, p.noWeightDecay,
                                 bits ? bits + p.begin : nullptr});
    }
    o->m_chunks = std::move(chunks);
    return o;
}

void ShardedAdamW::enqueueStep(Exec& exec, double lr, int iteration) {
    ++m_steps;
    exec.setLayer(-1);
    exec.setMicrobatch(-1);
    // Shared with the ops: pieces and chunk pointers are immutable after create().
    const std::vector<Piece>* pieces = &m_pieces;
    const std::vector<OptimizerChunk>* chunks = &m_chunks;
    double* localSq = m_normBuf->as<double>();
    float* normBuf = reinterpret_cast<float*>(localSq + 1);
    const bool reduce = m_normComm && m_normComm->size() > 1;
    // Summed piece by piece (in double, in order) where the grads are; read back once, by the clip.
    exec.op("optimizer.grad_norm_local", trace::Category::Optimizer, 2.0 * double(m_ownedNumel),
            uint64_t(m_ownedNumel) * 4, [=] {
                k::setBytes(localSq, 0, sizeof(double) + sizeof(float));
                for (const Piece& p : *pieces)
                    if (p.inNorm)
                        k::sumSquaresAccumulate((*chunks)[size_t(p.chunk)].params->mainGrads() + p.begin,
                                                p.end - p.begin, localSq, reduce ? normBuf : nullptr);
            });
    if (reduce) m_normComm->allReduce(exec.stream(), normBuf, normBuf, 1, DType::F32, ReduceOp::Sum);
    auto info = m_info;
    const AdamHyper hp = m_hp;
    const std::vector<AdamSegment>* segs = &m_segments;
    exec.opStatus("optimizer.clip", trace::Category::Optimizer, 0.0, 0,  // scalar: the update applies the coefficient
                  [=]() -> Status {
                      double sq = 0;
                      if (reduce) {
                          float reduced = 0;
                          k::download(&reduced, normBuf, sizeof reduced);
                          sq = reduced;
                      } else {
                          k::download(&sq, localSq, sizeof sq);
                      }
                      return clipSegmentGrads(sq, hp, lr, iteration, info.get());
                  });
    const int64_t step = m_steps;
    exec.op("optimizer.adamw", trace::Category::Optimizer, 12.0 * double(m_ownedNumel), uint64_t(m_ownedNumel) * 20,
            // the owned pieces' model bits come with the update (AdamSegment::bits); without the
            // distributed optimizer a rank owns every param whole
            [=] { adamwSegments(*segs, hp, lr, step, info->clipCoef); });
}

}  // namespace ts::engine
