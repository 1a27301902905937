// What the step benchmarks share: the tiny/small model shapes and list parsing.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/config/config.h"
#include "engine/train/trainer.h"
#include "kernels/cpu/ops.h"

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

// `warmup + steps` steps of `c` on one CPU device with `threads` GEMM threads: the median step
// time of the timed steps and the last loss.
struct TimedRun {
    double medianS = 0, loss = 0;
};
inline Result<TimedRun> timeSteps(engine::Config c, int steps, int warmup, int threads) {
    c.cpu_threads = threads;
    std::unique_ptr<engine::Backend> backend = engine::makeCpuBackend(1);
    engine::Device& dev = backend->device(0);
    std::unique_ptr<engine::Stream> compute = dev.createStream(trace::TrackKind::Compute, "compute");
    TS_ASSIGN_OR_RETURN(auto t, engine::Trainer::create(c, &dev, compute.get(), nullptr));
    kernels::cpu::setNumThreads(threads);
    std::vector<double> times;
    TimedRun out;
    for (int s = 0; s < warmup + steps; ++s) {
        engine::StepProgress p;
        TS_RETURN_IF_ERROR(t->step(&p));
        if (s >= warmup) times.push_back(p.stepTimeS);
        out.loss = p.loss;
    }
    std::sort(times.begin(), times.end());
    out.medianS = times[times.size() / 2];
    return out;
}

}  // namespace ts::bench
