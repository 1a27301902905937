// Helpers for the engine tests: the PyTorch golden files (tests/golden/make_golden.py), the
// integer weight formula both sides use, and a small harness that owns a CPU device, a
// compute stream, a model and an optimizer and runs explicit training steps.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/model/gpt.h"
#include "engine/train/data.h"
#include "engine/train/optimizer.h"
#include "tests/test_baseline_config.h"

namespace ts::engine::testutil {

// Same formula as init_values() in make_golden.py: exact integer arithmetic, then one division.
inline void initValues(float* out, int64_t n, int pIndex, double scale, double offset) {
    const uint64_t add = (uint64_t(pIndex + 1) * 40503ULL * 65537ULL + 12345ULL);
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t x = (uint64_t(i) * 2654435761ULL + add) % (1ULL << 32);
        const double u = double((x >> 8) & 0xFFFFFFULL) / double(1 << 24) - 0.5;
        out[i] = float(offset + scale * u);
    }
}

inline void goldenInit(GptModel& m) {
    ParamBuffer& p = m.params();
    for (int i = 0; i < p.count(); ++i) {
        const std::string& n = p.info(i).name;
        double scale = 0.2, offset = 0.0;
        if (n.size() >= 16 && n.compare(n.size() - 16, 16, "layernorm.weight") == 0) offset = 1.0;
        else if (n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0) scale = 0.1;
        initValues(p.mainParam(i), p.info(i).numel, i, scale, offset);
    }
    p.syncModelParams();
}

struct Golden {
    nlohmann::json meta;
    std::vector<char> blob;

    static Golden load(const std::string& name) {
        Golden g;
        const std::string base = std::string(TS_SOURCE_DIR) + "/tests/data/golden/" + name;
        std::ifstream j(base + ".json");
        EXPECT_TRUE(bool(j)) << "missing " << base << ".json";
        if (j) j >> g.meta;
        std::ifstream b(base + ".bin", std::ios::binary);
        g.blob.assign(std::istreambuf_iterator<char>(b), std::istreambuf_iterator<char>());
        return g;
    }
    const nlohmann::json& entry(const std::string& key) const { return meta["arrays"][key]; }
    const float* f32(const std::string& key) const {
        return reinterpret_cast<const float*>(blob.data()) + entry(key)["offset"].get<int64_t>();
    }
    const int32_t* i32(const std::string& key) const {
        return reinterpret_cast<const int32_t*>(blob.data()) + entry(key)["offset"].get<int64_t>();
    }
    int64_t numel(const std::string& key) const {
        int64_t n = 1;
        for (auto d : entry(key)["shape"]) n *= d.get<int64_t>();
        return n;
    }
    Config config() const {
        const auto& c = meta["config"];
        Config k = ts::testing::testBaselineConfig();
        // The golden files were written with RoPE unless their config names the position
        // embedding (the learned_absolute variant).
        k.position_embedding_type = c.value("position_embedding_type", std::string("rope"));
        k.num_layers = c["num_layers"];
        k.hidden_size = c["hidden_size"];
        k.num_attention_heads = c["num_attention_heads"];
        k.num_query_groups = c["num_query_groups"];
        k.ffn_hidden_size = c["ffn_hidden_size"];
        k.seq_length = c["seq_length"];
        k.micro_batch_size = c["micro_batch_size"];
        k.num_microbatches = c["num_microbatches"];
        k.global_batch_size = k.micro_batch_size * k.num_microbatches;
        k.vocab_size = c["vocab_size"];
        k.make_vocab_size_divisible_by = c["make_vocab_size_divisible_by"];
        k.norm_epsilon = c["norm_epsilon"];
        k.rotary_base = c["rotary_base"];
        k.swiglu = c["swiglu"];
        k.normalization = c["normalization"];
        k.add_bias_linear = c["add_bias_linear"];
        k.untie_embeddings_and_output_weights = !c["tied"].get<bool>();
        k.lr = c["lr"];
        k.adam_beta1 = c["adam_beta1"];
        k.adam_beta2 = c["adam_beta2"];
        k.adam_eps = c["adam_eps"];
        k.weight_decay = c["weight_decay"];
        k.clip_grad = c["clip_grad"];
        k.hidden_dropout = 0;
        k.attention_dropout = 0;
        k.train_iters = c["steps"];
        return k;
    }
    // Microbatch `mb` of step `step`, converted from [b, s+1] sample-major to sequence-first.
    std::shared_ptr<Microbatch> microbatch(int step, int mb) const {
        const auto& c = meta["config"];
        const int s = c["seq_length"], b = c["micro_batch_size"], m = c["num_microbatches"];
        const int32_t* d = i32("data") + (int64_t(step) * m + mb) * b * (s + 1);
        auto out = std::make_shared<Microbatch>();
        out->tokens.resize(size_t(s) * b);
        out->labels.resize(size_t(s) * b);
        for (int j = 0; j < b; ++j)
            for (int i = 0; i < s; ++i) {
                out->tokens[size_t(i) * b + j] = d[j * (s + 1) + i];
                out->labels[size_t(i) * b + j] = d[j * (s + 1) + i + 1];
            }
        return out;
    }
};

// max |a - b| / max |ref|: the error relative to the tensor's scale (per-element relative error
// is meaningless for entries that are ~0).
inline double relMaxError(const float* a, const float* ref, int64_t n) {
    double maxErr = 0, maxRef = 0;
    for (int64_t i = 0; i < n; ++i) {
        maxErr = std::max(maxErr, std::fabs(double(a[i]) - double(ref[i])));
        maxRef = std::max(maxRef, std::fabs(double(ref[i])));
    }
    return maxErr / std::max(maxRef, 1e-30);
}

// Device + stream + model + optimizer for explicit steps.
struct Harness {
    std::unique_ptr<Backend> backend = makeCpuBackend(1);
    Device& dev = backend->device(0);
    std::unique_ptr<Stream> stream = dev.createStream(trace::TrackKind::Compute, "compute");
    std::unique_ptr<GptModel> model;
    std::unique_ptr<AdamWOptimizer> opt;
    Config cfg;
    int numMicrobatches = 1;

    Status build(const Config& c) {
        cfg = c;
        numMicrobatches = deriveSizes(c).num_microbatches;
        auto m = GptModel::create(c, dev, *stream);
        if (!m) return m.status();
        model = std::move(m).value();
        auto o = AdamWOptimizer::create(c, model->params(), dev);
        if (!o) return o.status();
        opt = std::move(o).value();
        return Status::ok();
    }
    ~Harness() {
        if (model) (void)model->exec().synchronize();
    }
    // Forward+backward of all microbatches of one iteration; returns the mean loss. Grads stay
    // in the main-grad buffer (not clipped) until optimizerStep().
    Result<double> forwardBackward(int step, const std::vector<std::shared_ptr<Microbatch>>& mbs) {
        model->params().zeroGrads();
        model->clearCaptured();
        model->beginStep(step, int(mbs.size()));
        for (int i = 0; i < int(mbs.size()); ++i) {
            TS_RETURN_IF_ERROR(model->forward(i, mbs[size_t(i)]));
            TS_RETURN_IF_ERROR(model->backward(i));
        }
        TS_RETURN_IF_ERROR(model->exec().synchronize());
        double loss = 0;
        for (int i = 0; i < int(mbs.size()); ++i) loss += model->microbatchLoss(i);
        return loss / double(mbs.size());
    }
    Status optimizerStep(int step) {
        opt->enqueueStep(model->exec(), LrSchedule::fromConfig(cfg).lrAt(step), step + 1);
        return model->exec().synchronize();
    }
};

// A small GPT for the fused/unfused and recompute path tests: 4 layers, hidden 64, 4 heads in
// 2 query groups, seq 64, micro-batch 4, 2 microbatches, vocab 256, hidden dropout 0.1.
inline Config smallConfig() {
    Config c = ts::testing::testBaselineConfig();
    c.num_layers = 4;
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.num_query_groups = 2;
    c.seq_length = 64;
    c.micro_batch_size = 4;
    c.num_microbatches = 2;
    c.vocab_size = 256;
    c.make_vocab_size_divisible_by = 128;
    c.hidden_dropout = 0.1;
    c.lr = 1e-3;
    c.seed = 42;
    c.train_iters = 10;
    return c;
}

// The microbatches of iteration `step` from the config's data source (synthetic or corpus).
inline std::vector<std::shared_ptr<Microbatch>> batches(const Config& c, int step) {
    auto ds = DataSource::open(c);
    EXPECT_TRUE(ds.isOk()) << ds.status().toString();
    std::vector<std::shared_ptr<Microbatch>> out;
    if (!ds) return out;
    const int m = deriveSizes(c).num_microbatches;
    for (int i = 0; i < m; ++i)
        out.push_back((*ds)->microbatch(int64_t(step * m + i) * c.micro_batch_size, c.micro_batch_size));
    return out;
}

struct StepsResult {
    std::vector<double> losses;
    std::vector<float> grads;    // grads of the last step (before clipping)
    std::vector<float> params;   // params after all steps
    int64_t peakActivations = 0;
};

// `steps` training iterations of `c` on one device through the Harness.
inline StepsResult runSteps(const Config& c, int steps) {
    Harness h;
    StepsResult r;
    const Status st = h.build(c);
    EXPECT_TRUE(st.isOk()) << st.toString();
    if (!st) return r;
    for (int s = 0; s < steps; ++s) {
        h.dev.resetPeak();
        auto loss = h.forwardBackward(s, batches(c, s));
        EXPECT_TRUE(loss.isOk()) << loss.status().toString();
        if (!loss) return r;
        r.losses.push_back(*loss);
        r.peakActivations = std::max(r.peakActivations, h.dev.memoryStats().peak[size_t(MemCategory::Activations)]);
        r.grads.assign(h.model->params().mainGrads(), h.model->params().mainGrads() + h.model->params().numel());
        EXPECT_TRUE(h.optimizerStep(s).isOk());
    }
    r.params.assign(h.model->params().mainParams(), h.model->params().mainParams() + h.model->params().numel());
    return r;
}

// The activation bytes one microbatch keeps from its forward to its backward: what is live once
// the stream has run the forward. Exact, unlike the live peak, which also counts the buffers
// whose last op the stream has not run yet: the host runs up to a layer ahead, so the peak
// varies between runs by up to a layer's transients.
inline int64_t savedActivations(const Config& c) {
    Harness h;
    const Status st = h.build(c);
    EXPECT_TRUE(st.isOk()) << st.toString();
    if (!st) return -1;
    const auto act = [&] { return h.dev.memoryStats().current[size_t(MemCategory::Activations)]; };
    EXPECT_TRUE(h.model->exec().synchronize().isOk());
    const int64_t before = act();
    h.model->params().zeroGrads();
    h.model->beginStep(0, 1);
    EXPECT_TRUE(h.model->forward(0, batches(c, 0)[0]).isOk());
    EXPECT_TRUE(h.model->exec().synchronize().isOk());
    const int64_t saved = act() - before;
    EXPECT_TRUE(h.model->backward(0).isOk());
    EXPECT_TRUE(h.model->exec().synchronize().isOk());
    EXPECT_EQ(act(), before) << "the backward frees what the forward kept";
    return saved;
}

}  // namespace ts::engine::testutil
