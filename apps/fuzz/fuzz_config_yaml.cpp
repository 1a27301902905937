// Fuzz target for the YAML config loader (engine/config/config_yaml.cpp): parseConfigYaml and
// applyOverride must survive any bytes without crashing, hanging or allocating without bound
// (alias expansion, size and nesting are bounded), and everything they return must be
// writable as JSON (text from the file is made valid UTF-8).
//
// Two builds of this one file (see apps/fuzz/CMakeLists.txt and docs/engine.md):
//   libFuzzer (clang): fuzz_config_yaml -max_total_time=600 apps/fuzz/corpus/config_yaml
//   replay (any compiler, built by default): fuzz_config_yaml_replay --seconds 3 apps/fuzz/corpus/config_yaml
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/fuzz/replay_main.h"
#include "common/text.h"
#include "engine/config/knobs.h"

using ts::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    ts::engine::LoadedConfig loaded = ts::engine::parseConfigYaml(text, "fuzz.yaml");
    for (const auto& issue : loaded.issues) check(ts::isValidUtf8(issue.toString()), "issue text is UTF-8");
    // Whatever was applied (even with issues) must serialise: strict dump, no replacement.
    const nlohmann::json j = ts::engine::configToJson(loaded.config);
    try {
        (void)j.dump();
    } catch (const std::exception&) {
        check(false, "the loaded config dumps as JSON");
    }
    if (loaded.ok()) {
        // A valid config exports to YAML that loads back to the same config.
        auto back = ts::engine::parseConfigYaml(ts::engine::configToYaml(loaded.config, true), "export.yaml");
        check(back.ok(), "exported YAML loads");
        check(ts::engine::configToJson(back.config) == j, "export round trip keeps the config");
    }
    // The same bytes as a --set override: "knob=value" from the first line.
    const size_t nl = text.find('\n');
    ts::engine::Config c;
    ts::Status s = ts::engine::applyOverride(c, text.substr(0, nl));
    check(ts::isValidUtf8(s.message()), "override message is UTF-8");
    return 0;
}

#ifndef TS_LIBFUZZER
int main(int argc, char** argv) {
    return ts::fuzz::replayMain(argc, argv, "fuzz_config_yaml",
                                {"num_layers: ", "&a ", "*a", "[", "]", "{", "}", ": ", "\n", "- ", "parallel:\n  ",
                                 "tensor_model_parallel_size: 2\n", "name: \"", "!!str ", "<<: *a\n", "\"\\xff\"",
                                 "recompute_modules: [core_attn, mlp]\n", "lr: 1.0e-4\n", "? ", "|\n  ", "---\n"});
}
#endif
