// Checkpoint save/load: weights (fp32 main params), Adam state, iteration, data position and
// RNG identity. All randomness in the engine is counter-based on (seed, iteration,
// microbatch, layer), so (seed, iteration, samples consumed) is the whole RNG state and a
// resumed run is bit-exact.
//
// Layout of DIR: checkpoint.json (metadata, param table, config) + state.bin (float32 main
// params, exp_avg, exp_avg_sq; each params.numel() long, in main-buffer order).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "engine/optimizer.h"
#include "engine/param_buffer.h"

namespace ts::engine {

struct CheckpointState {
    int iteration = 0;          // completed iterations
    int64_t samplesConsumed = 0;
    int64_t seed = 0;
    nlohmann::json config;      // informational
};

Status saveCheckpoint(const std::string& dir, ParamBuffer& params, AdamWOptimizer& opt,
                      const CheckpointState& state);
// Checks the parameter table (names, shapes, order) matches before touching anything.
Status loadCheckpoint(const std::string& dir, ParamBuffer& params, AdamWOptimizer& opt,
                      CheckpointState* state);

}  // namespace ts::engine
