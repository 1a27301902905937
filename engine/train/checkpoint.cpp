// Checkpoint directory: checkpoint.json + state.bin (see checkpoint.h).
#include "engine/train/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace ts::engine {

namespace fs = std::filesystem;

namespace {
constexpr int kFormatVersion = 1;

std::string shapeText(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

// Compares the stored param table with the model's; a message naming the first difference.
Status checkTable(const std::string& dir, const nlohmann::json& j, const std::vector<ParamInfo>& table,
                  int64_t numel) {
    const auto& stored = j["params"];
    if (!stored.is_array())
        return Status::invalid("checkpoint '" + dir + "' has no parameter table");
    const size_t n = std::min(stored.size(), table.size());
    for (size_t i = 0; i < n; ++i) {
        const ParamInfo& p = table[i];
        const auto& e = stored[i];
        const std::string name = e.value("name", "");
        const auto shape = e.value("shape", std::vector<int64_t>{});
        if (name != p.name)
            return Status::invalid("checkpoint '" + dir + "' has a different model: parameter " + std::to_string(i) +
                                   " is '" + name + "', the model expects '" + p.name +
                                   "'; check num_layers and the model shape knobs");
        if (shape != p.shape) {
            std::string hint = "; check the model shape knobs (hidden_size, ffn_hidden_size, heads, groups)";
            const bool vocabOnly = shape.size() == p.shape.size() && !shape.empty() && shape[0] != p.shape[0] &&
                                   std::equal(shape.begin() + 1, shape.end(), p.shape.begin() + 1);
            if (vocabOnly && (p.name.find("word_embeddings") != std::string::npos ||
                              p.name.find("output_layer") != std::string::npos))
                hint = "; the padded vocab differs: Megatron pads vocab_size to a multiple of "
                       "make_vocab_size_divisible_by * tensor_model_parallel_size, set make_vocab_size_divisible_by "
                       "so both runs pad to the same size";
            return Status::invalid("checkpoint '" + dir + "' has a different model: '" + p.name + "' is " +
                                   shapeText(shape) + " in the checkpoint and " + shapeText(p.shape) +
                                   " in this model" + hint);
        }
    }
    if (stored.size() != table.size() || j.value("numel", int64_t(-1)) != numel)
        return Status::invalid("checkpoint '" + dir + "' has a different model (" + std::to_string(stored.size()) +
                               " params vs " + std::to_string(table.size()) + "); check num_layers and the model "
                               "shape knobs");
    // Same names and shapes in the same order: offsets can only differ in a damaged file.
    for (size_t i = 0; i < n; ++i)
        if (stored[i].value("offset", int64_t(-1)) != table[i].offset)
            return Status::invalid("checkpoint '" + dir + "': parameter '" + table[i].name +
                                   "' is stored at another offset (damaged checkpoint.json?)");
    return Status::ok();
}

}  // namespace

Status writeCheckpointFiles(const std::string& dir, const std::vector<ParamInfo>& table, int64_t numel,
                            const float* params, const float* expAvg, const float* expAvgSq,
                            const CheckpointState& state) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return Status::io("cannot create checkpoint directory '" + dir + "': " + ec.message());
    nlohmann::json j;
    j["format"] = "trainscope-checkpoint";
    j["version"] = kFormatVersion;
    j["iteration"] = state.iteration;
    j["samples_consumed"] = state.samplesConsumed;
    j["seed"] = state.seed;
    j["adam_steps"] = state.adamSteps;
    j["numel"] = numel;
    j["config"] = state.config;
    j["layout"] = state.layout.is_null() ? nlohmann::json::object() : state.layout;
    auto& t = j["params"];
    t = nlohmann::json::array();
    for (const auto& p : table) t.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
    // Write to temporaries then rename, so an interrupted save never leaves a torn checkpoint.
    const fs::path bin = fs::path(dir) / "state.bin", meta = fs::path(dir) / "checkpoint.json";
    {
        std::ofstream out(bin.string() + ".tmp", std::ios::binary);
        const auto bytes = std::streamsize(numel * int64_t(sizeof(float)));
        out.write(reinterpret_cast<const char*>(params), bytes);
        out.write(reinterpret_cast<const char*>(expAvg), bytes);
        out.write(reinterpret_cast<const char*>(expAvgSq), bytes);
        if (!out) return Status::io("writing '" + bin.string() + "' failed");
    }
    {
        std::ofstream out(meta.string() + ".tmp");
        out << j.dump(1) << "\n";
        if (!out) return Status::io("writing '" + meta.string() + "' failed");
    }
    fs::rename(bin.string() + ".tmp", bin, ec);
    if (!ec) fs::rename(meta.string() + ".tmp", meta, ec);
    if (ec) return Status::io("finishing checkpoint '" + dir + "': " + ec.message());
    return Status::ok();
}

Status readCheckpointFiles(const std::string& dir, const std::vector<ParamInfo>& table, int64_t numel,
                           float* params, float* expAvg, float* expAvgSq, CheckpointState* state) {
    const fs::path bin = fs::path(dir) / "state.bin", meta = fs::path(dir) / "checkpoint.json";
    std::ifstream in(meta);
    if (!in) return Status::notFound("checkpoint '" + meta.string() + "' not found");
    nlohmann::json j;
    try {
        in >> j;
    } catch (const std::exception& e) {
        return Status::invalid("checkpoint '" + meta.string() + "' is not valid JSON: " + e.what());
    }
    if (j.value("format", "") != "trainscope-checkpoint" || j.value("version", 0) != kFormatVersion)
        return Status::invalid("'" + meta.string() + "' is not a trainscope checkpoint of version " +
                               std::to_string(kFormatVersion));
    TS_RETURN_IF_ERROR(checkTable(dir, j, table, numel));
    std::ifstream bf(bin, std::ios::binary);
    if (!bf) return Status::notFound("checkpoint data '" + bin.string() + "' not found");
    const auto bytes = std::streamsize(numel * int64_t(sizeof(float)));
    std::error_code ec;
    if (fs::file_size(bin, ec) != uint64_t(bytes) * 3)
        return Status::invalid("checkpoint data '" + bin.string() + "' has the wrong size");
    bf.read(reinterpret_cast<char*>(params), bytes);
    bf.read(reinterpret_cast<char*>(expAvg), bytes);
    bf.read(reinterpret_cast<char*>(expAvgSq), bytes);
    if (!bf) return Status::io("reading '" + bin.string() + "' failed");
    if (state) {
        state->iteration = j.value("iteration", 0);
        state->samplesConsumed = j.value("samples_consumed", int64_t(0));
        state->seed = j.value("seed", int64_t(0));
        state->adamSteps = j.value("adam_steps", int64_t(0));
        state->config = j.value("config", nlohmann::json::object());
        state->layout = j.value("layout", nlohmann::json::object());
    }
    return Status::ok();
}

Status saveCheckpoint(const std::string& dir, ParamBuffer& params, AdamWOptimizer& opt,
                      const CheckpointState& state) {
    CheckpointState s = state;
    s.adamSteps = opt.stepCount();
    return writeCheckpointFiles(dir, params.params(), params.numel(), params.mainParams(), opt.expAvg(),
                                opt.expAvgSq(), s);
}

Status loadCheckpoint(const std::string& dir, ParamBuffer& params, AdamWOptimizer& opt,
                      CheckpointState* state) {
    // The table check runs before anything is read, so a mismatch leaves the model untouched.
    CheckpointState s;
    TS_RETURN_IF_ERROR(readCheckpointFiles(dir, params.params(), params.numel(), params.mainParams(), opt.expAvg(),
                                           opt.expAvgSq(), &s));
    params.syncModelParams();
    opt.setStepCount(s.adamSteps);
    if (state) *state = std::move(s);
    return Status::ok();
}

void forEachTpShardRun(const ParamInfo& p, int tp, int tpRank,
                       const std::function<void(int64_t shardElem, int64_t fullElem, int64_t len)>& fn) {
    int64_t full = 1;
    for (int64_t d : p.fullShape) full *= d;
    if (tp <= 1 || p.shard == ShardKind::Replicated) {
        fn(0, 0, full);
        return;
    }
    const int64_t R = p.fullShape[0];
    const int64_t C = p.fullShape.size() > 1 ? p.fullShape[1] : 1;
    if (p.shard == ShardKind::RowParallel) {
        const int64_t cl = C / tp;
        for (int64_t row = 0; row < R; ++row) fn(row * cl, row * C + tpRank * cl, cl);
        return;
    }
    // Column / vocab parallel: row blocks; stride 2 -> [gate_r ; up_r].
    const int stride = std::max(1, p.partitionStride);
    const int64_t half = R / stride, rl = half / tp;
    for (int s = 0; s < stride; ++s) fn(s * rl * C, (s * half + tpRank * rl) * C, rl * C);
}

void copyFullToShard(const ParamInfo& p, int tp, int tpRank, const float* full, float* shard) {
    forEachTpShardRun(p, tp, tpRank,
                      [&](int64_t s, int64_t f, int64_t n) { std::copy(full + f, full + f + n, shard + s); });
}

void copyShardToFull(const ParamInfo& p, int tp, int tpRank, const float* shard, float* full) {
    forEachTpShardRun(p, tp, tpRank,
                      [&](int64_t s, int64_t f, int64_t n) { std::copy(shard + s, shard + s + n, full + f); });
}

}  // namespace ts::engine
