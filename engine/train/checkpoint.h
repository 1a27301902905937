// Checkpoint save/load: weights (fp32 main params), Adam state, iteration, data position and
// RNG identity. All randomness in the engine is counter-based on (seed, iteration,
// microbatch, layer), so (seed, iteration, samples consumed) is the whole RNG state and a
// resumed run is bit-exact.
//
// Layout of DIR: checkpoint.json (metadata, param table, config) + state.bin (float32 main
// params, exp_avg, exp_avg_sq; each numel long, in the SINGLE-DEVICE main-buffer order).
// The format is layout-independent: a parallel run (engine/parallel/parallel_trainer.h) gathers its
// TP/PP/DP shards into exactly this table and records the layout it was saved from under
// "layout" (informational), so any layout loads any checkpoint of the same model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/model/param_buffer.h"
#include "engine/train/optimizer.h"

namespace ts::engine {

struct CheckpointState {
    int iteration = 0;          // completed iterations
    int64_t samplesConsumed = 0;
    int64_t seed = 0;
    int64_t adamSteps = 0;      // only used by the table-level API below
    nlohmann::json config;      // informational
    nlohmann::json layout;      // saved-from layout (tp, pp, vpp, dp, ...); informational
    // FP8 scaling state (amax history and scale of every FP8 tensor, GptModel::fp8State of every
    // layer); null when the run had none. Restored so a resumed FP8 run scales as if it had not
    // stopped (Transformer Engine keeps it in the module's extra state).
    nlohmann::json fp8;
    // The MoE routers' aux-loss-free expert bias (moe_router_enable_expert_bias; Megatron keeps it
    // in the router's state dict): {"<global layer>": [E floats]}, GptModel::routerState of every
    // chunk merged; null without it. The same on every layout.
    nlohmann::json expertBias;
    // Quantile balancing's per-expert bias (moe_router_load_balancing_type=quantile_balancing;
    // Megatron's persistent router buffer qb_beta), as expertBias: GptModel::qbBetaState merged.
    nlohmann::json qbBeta;
};

Status saveCheckpoint(const std::string& dir, Stream& stream, ParamBuffer& params, AdamWOptimizer& opt,
                      const CheckpointState& state);
// Checks the parameter table (names, shapes, order) matches before touching anything.
Status loadCheckpoint(const std::string& dir, Stream& stream, ParamBuffer& params, AdamWOptimizer& opt,
                      CheckpointState* state);

// Table-level API (what the two above are built on). `table`: the single-device param table
// (name, shape = full shape, offset into arrays of `numel` elements); params/expAvg/expAvgSq
// are such arrays. Load validates the table first and writes nothing on a mismatch.
Status writeCheckpointFiles(const std::string& dir, const std::vector<ParamInfo>& table, int64_t numel,
                            const float* params, const float* expAvg, const float* expAvgSq,
                            const CheckpointState& state);
Status readCheckpointFiles(const std::string& dir, const std::vector<ParamInfo>& table, int64_t numel,
                           float* params, float* expAvg, float* expAvgSq, CheckpointState* state);

// The tensor-parallel split of a full tensor (the one GptModel::initWeights applies): calls
// fn(shardElem, fullElem, len) for each contiguous run of TP rank `tpRank`'s shard of `p`
// (p.fullShape, p.shard, p.partitionStride) among `tp` ranks. Column/vocab parallel: row
// blocks ([gate_r ; up_r] with partitionStride 2); row parallel: column blocks of every row;
// replicated (or tp = 1): the whole tensor.
void forEachTpShardRun(const ParamInfo& p, int tp, int tpRank,
                       const std::function<void(int64_t shardElem, int64_t fullElem, int64_t len)>& fn);
// full -> shard and shard -> full with that split.
void copyFullToShard(const ParamInfo& p, int tp, int tpRank, const float* full, float* shard);
void copyShardToFull(const ParamInfo& p, int tp, int tpRank, const float* shard, float* full);

}  // namespace ts::engine
