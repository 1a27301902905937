// Context parallel sharding (REFERENCE.md §4.1, Megatron's get_batch_on_this_cp_rank): the
// sequence is split into 2c equal chunks and CP rank r keeps chunks r and 2c-1-r, in that order,
// so every rank gets the same share of causal attention work.
#pragma once

#include <vector>

#include "engine/model/gpt.h"

namespace ts::engine {

// cpLocalPositions (the global positions of a rank's rows) is in engine/model/model.h.
// The rank's part of a sequence-first microbatch [s, b] (tokens, labels, loss mask); its
// tokensTotal is the whole microbatch's loss-mask sum.
Microbatch cpShard(const Microbatch& full, int seq, int b, int cp, int rank);

}  // namespace ts::engine
