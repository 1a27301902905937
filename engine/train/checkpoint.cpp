// Checkpoint directory: checkpoint.json + state.bin (see checkpoint.h).
#include "engine/train/checkpoint.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/json_text.h"
#include "engine/backend/kernels.h"

namespace ts::engine {

namespace fs = std::filesystem;

namespace {
constexpr int kFormatVersion = 1;
// Largest samples_consumed a checkpoint may claim: far beyond any real run, and small enough
// that the data position arithmetic (samples + batch) cannot overflow.
constexpr int64_t kMaxSamplesConsumed = int64_t(1) << 62;

std::string shapeText(const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
}

// checkpoint.json comes from disk: every field is checked for presence, type and range before
// it is used, with a message naming the file and the field.
struct Fields {
    const std::string& file;
    const nlohmann::json& j;

    Status bad(const std::string& field, const std::string& what) const {
        return Status::invalid("checkpoint '" + file + "': field '" + field + "' " + what +
                               " (damaged or hand-edited checkpoint.json?)");
    }
    // Integer field in [lo, hi]; absent -> def when given, else an error.
    Result<int64_t> integer(const nlohmann::json& obj, const std::string& field, int64_t lo, int64_t hi,
                            std::optional<int64_t> def = std::nullopt, const std::string& where = "") const {
        const std::string name = where.empty() ? field : where + "." + field;
        auto it = obj.find(field);
        if (it == obj.end()) {
            if (def) return *def;
            return bad(name, "is missing");
        }
        if (!it->is_number_integer()) return bad(name, "must be an integer, got " + std::string(it->type_name()));
        if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX))
            return bad(name, "is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
        const int64_t v = it->get<int64_t>();
        if (v < lo || v > hi)
            return bad(name, "is " + std::to_string(v) + ", outside [" + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "]");
        return v;
    }
    Result<std::string> text(const nlohmann::json& obj, const std::string& field, const std::string& where = "") const {
        const std::string name = where.empty() ? field : where + "." + field;
        auto it = obj.find(field);
        if (it == obj.end()) return bad(name, "is missing");
        if (!it->is_string()) return bad(name, "must be a string, got " + std::string(it->type_name()));
        return it->get<std::string>();
    }
};

struct StoredParam {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0;
};

// The "params" table, every entry checked: {name: string, shape: [non-negative ints], offset: int >= 0}.
Result<std::vector<StoredParam>> readParamTable(const Fields& f) {
    auto it = f.j.find("params");
    if (it == f.j.end() || !it->is_array()) return f.bad("params", "must be an array of {name, shape, offset}");
    std::vector<StoredParam> out;
    out.reserve(it->size());
    for (size_t i = 0; i < it->size(); ++i) {
        const auto& e = (*it)[i];
        const std::string where = "params[" + std::to_string(i) + "]";
        if (!e.is_object()) return f.bad(where, "must be an object {name, shape, offset}");
        StoredParam p;
        TS_ASSIGN_OR_RETURN(p.name, f.text(e, "name", where));
        auto sh = e.find("shape");
        if (sh == e.end() || !sh->is_array()) return f.bad(where + ".shape", "must be an array of sizes");
        for (const auto& d : *sh) {
            if (!d.is_number_integer() || d.get<int64_t>() < 0)
                return f.bad(where + ".shape", "must hold non-negative integers");
            p.shape.push_back(d.get<int64_t>());
        }
        TS_ASSIGN_OR_RETURN(p.offset, f.integer(e, "offset", 0, INT64_MAX, std::nullopt, where));
        out.push_back(std::move(p));
    }
    return out;
}

// Compares the stored param table with the model's; a message naming the first difference.
Status checkTable(const std::string& dir, const std::vector<StoredParam>& stored, int64_t storedNumel,
                  const std::vector<ParamInfo>& table, int64_t numel) {
    const size_t n = std::min(stored.size(), table.size());
    for (size_t i = 0; i < n; ++i) {
        const ParamInfo& p = table[i];
        const std::string& name = stored[i].name;
        const auto& shape = stored[i].shape;
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
    if (stored.size() != table.size() || storedNumel != numel)
        return Status::invalid("checkpoint '" + dir + "' has a different model (" + std::to_string(stored.size()) +
                               " params vs " + std::to_string(table.size()) + "); check num_layers and the model "
                               "shape knobs");
    // Same names and shapes in the same order: offsets can only differ in a damaged file.
    for (size_t i = 0; i < n; ++i)
        if (stored[i].offset != table[i].offset)
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
    if (!state.fp8.is_null()) j["fp8"] = state.fp8;
    if (!state.expertBias.is_null()) j["moe_router_expert_bias"] = state.expertBias;
    if (!state.qbBeta.is_null()) j["moe_router_qb_beta"] = state.qbBeta;
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
        out << dumpJson(j, 1) << "\n";
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
    std::error_code ec;
    if (!fs::exists(meta, ec)) return Status::notFound("checkpoint '" + meta.string() + "' not found");
    if (!fs::is_regular_file(meta, ec)) return Status::invalid("checkpoint '" + meta.string() + "' is not a regular file");
    // The metadata is a table of a few hundred parameters; anything much larger is not ours.
    constexpr uintmax_t kMaxMetaBytes = uintmax_t(64) << 20;
    if (fs::file_size(meta, ec) > kMaxMetaBytes)
        return Status::invalid("checkpoint '" + meta.string() + "' is larger than 64 MiB; not a trainscope checkpoint");
    std::ifstream in(meta);
    if (!in) return Status::notFound("checkpoint '" + meta.string() + "' cannot be read");
    nlohmann::json j;
    try {
        in >> j;
    } catch (const std::exception& e) {
        return Status::invalid("checkpoint '" + meta.string() + "' is not valid JSON: " + e.what());
    }
    const std::string file = meta.string();
    if (!j.is_object()) return Status::invalid("checkpoint '" + file + "' is not a JSON object");
    const Fields f{file, j};
    auto format = j.find("format");
    auto version = j.find("version");
    if (format == j.end() || !format->is_string() || format->get<std::string>() != "trainscope-checkpoint" ||
        version == j.end() || !version->is_number_integer() || version->get<int64_t>() != kFormatVersion)
        return Status::invalid("'" + file + "' is not a trainscope checkpoint of version " +
                               std::to_string(kFormatVersion));
    // Every field is read and checked before anything is loaded.
    CheckpointState s;
    TS_ASSIGN_OR_RETURN(int64_t iteration, f.integer(j, "iteration", 0, INT32_MAX));
    s.iteration = int(iteration);
    TS_ASSIGN_OR_RETURN(s.samplesConsumed, f.integer(j, "samples_consumed", 0, kMaxSamplesConsumed));
    TS_ASSIGN_OR_RETURN(s.seed, f.integer(j, "seed", INT64_MIN, INT64_MAX));
    TS_ASSIGN_OR_RETURN(s.adamSteps, f.integer(j, "adam_steps", 0, INT64_MAX, int64_t(0)));
    if (auto fp8 = j.find("fp8"); fp8 != j.end()) {
        if (!fp8->is_object()) return Status::invalid("checkpoint '" + file + "': fp8 must be an object");
        s.fp8 = *fp8;  // GptModel::setFp8State checks every entry
    }
    if (auto eb = j.find("moe_router_expert_bias"); eb != j.end()) {
        if (!eb->is_object())
            return Status::invalid("checkpoint '" + file + "': moe_router_expert_bias must be an object");
        s.expertBias = *eb;  // GptModel::setRouterState checks every entry
    }
    if (auto qb = j.find("moe_router_qb_beta"); qb != j.end()) {
        if (!qb->is_object()) return Status::invalid("checkpoint '" + file + "': moe_router_qb_beta must be an object");
        s.qbBeta = *qb;  // GptModel::setQbBetaState checks every entry
    }
    TS_ASSIGN_OR_RETURN(int64_t storedNumel, f.integer(j, "numel", 0, INT64_MAX / 16));
    for (const char* obj : {"config", "layout"}) {
        auto it = j.find(obj);
        if (it != j.end() && !it->is_object() && !it->is_null()) return f.bad(obj, "must be an object");
    }
    if (auto it = j.find("config"); it != j.end() && it->is_object()) s.config = *it;
    else s.config = nlohmann::json::object();
    if (auto it = j.find("layout"); it != j.end() && it->is_object()) s.layout = *it;
    else s.layout = nlohmann::json::object();
    TS_ASSIGN_OR_RETURN(auto stored, readParamTable(f));
    TS_RETURN_IF_ERROR(checkTable(dir, stored, storedNumel, table, numel));

    std::ifstream bf(bin, std::ios::binary);
    if (!bf) return Status::notFound("checkpoint data '" + bin.string() + "' not found");
    const auto bytes = std::streamsize(numel * int64_t(sizeof(float)));
    if (fs::file_size(bin, ec) != uint64_t(bytes) * 3)
        return Status::invalid("checkpoint data '" + bin.string() + "' has the wrong size");
    bf.read(reinterpret_cast<char*>(params), bytes);
    bf.read(reinterpret_cast<char*>(expAvg), bytes);
    bf.read(reinterpret_cast<char*>(expAvgSq), bytes);
    if (!bf) return Status::io("reading '" + bin.string() + "' failed");
    if (state) *state = std::move(s);
    return Status::ok();
}

Status saveCheckpoint(const std::string& dir, Stream& stream, ParamBuffer& params, AdamWOptimizer& opt,
                      const CheckpointState& state) {
    CheckpointState s = state;
    s.adamSteps = opt.stepCount();
    // Host images of the buffers (device memory on a device backend), then the files.
    const int64_t n = params.numel();
    TS_ASSIGN_OR_RETURN(auto p, kern::toHost(stream, params.mainParams(), n));
    TS_ASSIGN_OR_RETURN(auto m, kern::toHost(stream, opt.expAvg(), n));
    TS_ASSIGN_OR_RETURN(auto v, kern::toHost(stream, opt.expAvgSq(), n));
    return writeCheckpointFiles(dir, params.params(), n, p.data(), m.data(), v.data(), s);
}

Status loadCheckpoint(const std::string& dir, Stream& stream, ParamBuffer& params, AdamWOptimizer& opt,
                      CheckpointState* state) {
    // The table check runs before anything is read, so a mismatch leaves the model untouched.
    CheckpointState s;
    const size_t n = size_t(params.numel());
    std::vector<float> p(n), m(n), v(n);
    TS_RETURN_IF_ERROR(readCheckpointFiles(dir, params.params(), params.numel(), p.data(), m.data(), v.data(), &s));
    TS_RETURN_IF_ERROR(kern::copyFromHost(stream, params.mainParams(), p.data(), n * sizeof(float)));
    TS_RETURN_IF_ERROR(kern::copyFromHost(stream, opt.expAvg(), m.data(), n * sizeof(float)));
    TS_RETURN_IF_ERROR(kern::copyFromHost(stream, opt.expAvgSq(), v.data(), n * sizeof(float)));
    TS_RETURN_IF_ERROR(kern::runOp(stream, "sync_model_params", [&params] { params.syncModelParams(); }));
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
