// AdamW over the parts of a rank's grad buffers that this rank updates, for the parallel
// engine (REFERENCE.md §3.3):
//   - distributed optimizer (ZeRO-1-like): each DP rank owns a contiguous 1/dp slice of every
//     bucket; Adam's exp_avg / exp_avg_sq exist only for that slice (OptimizerState memory is
//     1/dp of the non-distributed optimizer), the step updates only those main params, and the
//     DP engine all-gathers the result (GradSync::startParamGather). With bf16 the fp32 main
//     params are kept for that slice only too (ParamPlacement::shardMain, set by the
//     trainer before create): the step refreshes the slice's bf16 model copy, and the
//     all-gather is of the model copy in bf16, as Megatron-LM's;
//   - non-distributed: the owned range of a chunk is its whole buffer (every DP replica runs
//     the same step on the same all-reduced grads).
// Gradient clipping uses the norm of the WHOLE model: each rank sums the squares of the grads
// it owns (the shared output-layer copy of a tied embedding on the last pp stage and TP-
// replicated params on tp rank > 0 are left out, so nothing is counted twice), then the sums
// are all-reduced over the group that covers the model once (tp-pp, or world with the
// distributed optimizer). Numerics otherwise match AdamWOptimizer element by element.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/comm/communicator.h"
#include "engine/config/config.h"
#include "engine/model/layers.h"
#include "engine/model/param_buffer.h"
#include "engine/train/optimizer.h"

namespace ts::engine {

using OwnedRange = ElementRange;  // elements of the chunk's buffer

struct OptimizerChunk {
    ParamBuffer* params = nullptr;
    std::vector<OwnedRange> owned;  // disjoint, ascending
    std::vector<char> countInNorm;  // per param index; empty = all
};

class ShardedAdamW {
public:
    // `normComm` (may be null = this rank alone) is used on the compute stream.
    static Result<std::unique_ptr<ShardedAdamW>> create(const Config& c, std::vector<OptimizerChunk> chunks,
                                                        Device& dev, Communicator* normComm);

    // Enqueues on `exec`'s stream: local sum of squares, all-reduce, clipping, AdamW on the
    // owned ranges writing their bf16 model copy in the same pass. A non-finite norm fails the stream with NumericalError.
    void enqueueStep(Exec& exec, double lr, int iteration);
    const OptimizerStepInfo& lastStep() const { return *m_info; }
    int64_t stepCount() const { return m_steps; }
    // Elements with optimizer state on this rank (sum of owned ranges).
    int64_t ownedNumel() const { return m_ownedNumel; }

    // Checkpoint access (engine/parallel/parallel_trainer.cpp gathers/scatters these across DP).
    struct Piece {  // a param's slice inside an owned range
        int chunk = 0, param = 0;
        int64_t begin = 0, end = 0;  // buffer elements
        int64_t state = 0;           // offset into exp_avg / exp_avg_sq
        bool noWeightDecay = false;
        bool inNorm = true;
    };
    const std::vector<Piece>& pieces() const { return m_pieces; }
    float* expAvg() { return m_m->as<float>(); }    // [ownedNumel]
    float* expAvgSq() { return m_v->as<float>(); }  // [ownedNumel]
    void setStepCount(int64_t n) { m_steps = n; }

private:
    ShardedAdamW() = default;
    std::vector<OptimizerChunk> m_chunks;
    std::vector<Piece> m_pieces;
    std::vector<AdamSegment> m_segments;  // m_pieces as pointers (buffers are final after create)
    std::unique_ptr<Buffer> m_m, m_v, m_normBuf;
    Communicator* m_normComm = nullptr;
    int64_t m_ownedNumel = 0;
    AdamHyper m_hp;
    int64_t m_steps = 0;
    std::shared_ptr<OptimizerStepInfo> m_info = std::make_shared<OptimizerStepInfo>();
};

}  // namespace ts::engine
