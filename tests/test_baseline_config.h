// The values the engine, trainer and parallel tests were written against, where the registry's
// defaults (Megatron-LM's: learned_absolute, dropout 0.1, linear decay, Adam beta2 0.999,
// unfused cross-entropy, p2p overlap on) differ: RoPE, no dropout, constant LR, beta2 0.95,
// fused cross-entropy, no p2p overlap. A test that wants one of Megatron's defaults sets it
// after taking this config.
#pragma once

#include "engine/config/config.h"

namespace ts::testing {

inline engine::Config testBaselineConfig() {
    engine::Config c;
    c.position_embedding_type = "rope";
    c.hidden_dropout = 0;
    c.attention_dropout = 0;
    c.lr_decay_style = "constant";
    c.adam_beta2 = 0.95;
    c.cross_entropy_loss_fusion = true;
    c.overlap_p2p_comm = false;
    return c;
}

}  // namespace ts::testing
