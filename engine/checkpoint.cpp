// Checkpoint directory: checkpoint.json + state.bin.
#include "engine/checkpoint.h"

#include <filesystem>
#include <fstream>

namespace ts::engine {

namespace fs = std::filesystem;

namespace {
constexpr int kFormatVersion = 1;
}

Status saveCheckpoint(const std::string& dir, ParamBuffer& params, AdamWOptimizer& opt,
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
    j["adam_steps"] = opt.stepCount();
    j["numel"] = params.numel();
    j["config"] = state.config;
    auto& table = j["params"];
    table = nlohmann::json::array();
    for (const auto& p : params.params())
        table.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}});
    // Write to temporaries then rename, so an interrupted save never leaves a torn checkpoint.
    const fs::path bin = fs::path(dir) / "state.bin", meta = fs::path(dir) / "checkpoint.json";
    {
        std::ofstream out(bin.string() + ".tmp", std::ios::binary);
        const auto bytes = std::streamsize(params.numel() * int64_t(sizeof(float)));
        out.write(reinterpret_cast<const char*>(params.mainParams()), bytes);
        out.write(reinterpret_cast<const char*>(opt.expAvg()), bytes);
        out.write(reinterpret_cast<const char*>(opt.expAvgSq()), bytes);
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

Status loadCheckpoint(const std::string& dir, ParamBuffer& params, AdamWOptimizer& opt,
                      CheckpointState* state) {
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
    const auto& table = j["params"];
    if (!table.is_array() || int(table.size()) != params.count() || j.value("numel", int64_t(-1)) != params.numel())
        return Status::invalid("checkpoint '" + dir + "' has a different model (" + std::to_string(table.size()) +
                               " params vs " + std::to_string(params.count()) + "); check the model shape knobs");
    for (int i = 0; i < params.count(); ++i) {
        const auto& p = params.info(i);
        const auto& e = table[size_t(i)];
        if (e.value("name", "") != p.name || e["shape"].get<std::vector<int64_t>>() != p.shape ||
            e.value("offset", int64_t(-1)) != p.offset)
            return Status::invalid("checkpoint '" + dir + "': parameter " + std::to_string(i) + " is '" +
                                   e.value("name", "") + "', the model expects '" + p.name + "' with another shape");
    }
    std::ifstream bf(bin, std::ios::binary);
    if (!bf) return Status::notFound("checkpoint data '" + bin.string() + "' not found");
    const auto bytes = std::streamsize(params.numel() * int64_t(sizeof(float)));
    std::error_code ec;
    if (fs::file_size(bin, ec) != uint64_t(bytes) * 3)
        return Status::invalid("checkpoint data '" + bin.string() + "' has the wrong size");
    bf.read(reinterpret_cast<char*>(params.mainParams()), bytes);
    bf.read(reinterpret_cast<char*>(opt.expAvg()), bytes);
    bf.read(reinterpret_cast<char*>(opt.expAvgSq()), bytes);
    if (!bf) return Status::io("reading '" + bin.string() + "' failed");
    params.syncModelParams();
    opt.setStepCount(j.value("adam_steps", int64_t(0)));
    if (state) {
        state->iteration = j.value("iteration", 0);
        state->samplesConsumed = j.value("samples_consumed", int64_t(0));
        state->seed = j.value("seed", int64_t(0));
        state->config = j.value("config", nlohmann::json::object());
    }
    return Status::ok();
}

}  // namespace ts::engine
