// What the step benchmarks share: the tiny/small model shapes and list parsing.
#pragma once

#include <string>
#include <vector>

#include "engine/config/config.h"

namespace ts::bench {

// tiny: vocab 4096, seq 128, hidden 256, heads 4, layers 4; small: vocab 8192, seq 256,
// hidden 512, heads 8, layers 6. Both fp32, tied embedding, GeLU 4h, AdamW, micro-batch 8,
// synthetic tokens.
inline engine::Config benchConfig(const std::string& name) {
    engine::Config c;
    if (name == "tiny") {
        c.vocab_size = 4096;
        c.seq_length = 128;
        c.hidden_size = 256;
        c.num_attention_heads = 4;
        c.num_layers = 4;
    } else {
        c.vocab_size = 8192;
        c.seq_length = 256;
        c.hidden_size = 512;
        c.num_attention_heads = 8;
        c.num_layers = 6;
    }
    c.micro_batch_size = 8;
    c.data_path = "synthetic";
    c.swiglu = false;
    c.untie_embeddings_and_output_weights = false;
    c.lr = 1e-4;
    c.train_iters = 1000000;
    return c;
}

// "a,b,c" -> {"a","b","c"}
inline std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= s.size()) {
        const size_t e = s.find(',', start);
        out.push_back(s.substr(start, e == std::string::npos ? std::string::npos : e - start));
        if (e == std::string::npos) break;
        start = e + 1;
    }
    return out;
}

}  // namespace ts::bench
