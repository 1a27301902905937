// Commands of the foundation group: knobs, validate, version.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "apps/trainscope/commands.h"
#include "common/json_text.h"
#include "engine/config/knobs.h"
#include "sessions/knobs_json.h"
#include "ts_build_info.h"

namespace ts::cli {

using engine::KnobDef;
using nlohmann::json;

namespace {

std::string megatronFlagText(const KnobDef& k) {
    if (k.type != engine::KnobType::Bool) return k.megatronFlag.empty() ? "-" : k.megatronFlag + " V";
    std::string out;
    if (!k.megatronFlag.empty()) out = k.megatronFlag;
    if (!k.megatronFalseFlag.empty()) out += (out.empty() ? "" : " / ") + k.megatronFalseFlag;
    return out.empty() ? "-" : out;
}

std::string typeText(const KnobDef& k) {
    if (k.type != engine::KnobType::Enum && k.type != engine::KnobType::EnumOrList) return engine::knobTypeName(k.type);
    std::string out;
    for (const auto& a : k.allowed) out += (out.empty() ? "" : "|") + (a.empty() ? std::string("\"\"") : a);
    return k.type == engine::KnobType::EnumOrList ? out + " or [list]" : out;
}

}  // namespace

int cmdKnobs(const Args& a) {
    if (auto bad = a.unknownFlags({"--json", "--group", "--markdown"}); !bad.empty())
        return fail(2, "unknown option " + bad[0] + " for `knobs`; see `trainscope knobs --help`");
    if (a.has("--markdown")) {
        std::printf("%s", engine::knobsMarkdown().c_str());
        return 0;
    }
    const auto group = a.value("--group");
    const auto& reg = engine::knobRegistry();
    if (a.has("--json")) {
        json arr = json::array();
        for (const auto& k : reg) {
            if (group && k.group != *group) continue;
            arr.push_back(sessions::knobDefJson(k));
        }
        std::printf("%s\n", arr.dump(2).c_str());
        return 0;
    }
    std::string current;
    int shown = 0;
    for (const auto& k : reg) {
        if (group && k.group != *group) continue;
        if (k.group != current) {
            current = k.group;
            std::printf("%s[%s]\n", shown ? "\n" : "", current.c_str());
            std::printf("  %-40s %-22s %-14s %-46s %s\n", "knob", "type", "default", "Megatron-LM flag",
                        "Megatron-Bridge path");
        }
        std::string def = engine::knobDefaultText(k);
        if (def.empty()) def = "\"\"";
        std::printf("  %-40s %-22s %-14s %-46s %s%s\n", k.name.c_str(), typeText(k).c_str(), def.c_str(),
                    megatronFlagText(k).c_str(), k.bridgeNegate ? "!" : "",
                    k.bridgePath.empty() ? "-" : k.bridgePath.c_str());
        const std::string notRun = engine::knobNotExecutedText(k);
        std::printf("      %s%s%s\n", k.help.c_str(), k.rules.empty() ? "" : (" Rule: " + k.rules + ".").c_str(),
                    notRun.empty() ? "" : (" [accepted and exported; " + notRun + "]").c_str());
        ++shown;
    }
    if (group && shown == 0) return fail(2, "no knob group '" + *group + "'");
    std::printf("\n%d knobs. Bridge paths marked ! are the negation of the knob.\n", shown);
    return 0;
}

int cmdValidate(const Args& a) {
    if (a.positional().empty()) return fail(2, "usage: trainscope validate CONFIG.yaml [CONFIG.yaml ...]");
    if (auto bad = a.unknownFlags({"--json"}); !bad.empty())
        return fail(2, "unknown option " + bad[0] + " for `validate`");
    int bad = 0;
    json report = json::array();
    for (const auto& path : a.positional()) {
        const auto loaded = engine::loadConfigFile(path);
        json issues = json::array();
        for (const auto& i : loaded.issues) {
            issues.push_back({{"file", i.file}, {"line", i.line}, {"knob", i.knob}, {"message", i.message}});
            if (!a.has("--json")) std::fprintf(stderr, "%s\n", forTerminal(i.toString(), true).c_str());
        }
        const auto unsupported = loaded.ok() ? engine::unsupportedKnobs(loaded.config) : std::vector<std::string>{};
        const auto warnings = loaded.ok() ? engine::configWarnings(loaded.config) : std::vector<std::string>{};
        if (!a.has("--json")) {
            if (loaded.ok()) {
                const auto d = engine::deriveSizes(loaded.config);
                std::printf("%s: ok (world %d = tp %d x cp %d x pp %d x dp %d; %d microbatches of %d; vocab padded to %d)\n",
                            forTerminal(path).c_str(), d.world, d.tp, d.cp, d.pp, d.dp, d.num_microbatches,
                            loaded.config.micro_batch_size, d.padded_vocab_size);
                for (const auto& u : unsupported)
                    std::printf("  note: %s is valid but not executed by the engine yet\n", u.c_str());
                for (const auto& w : warnings) std::printf("  warning: %s\n", forTerminal(w).c_str());
            } else {
                std::fprintf(stderr, "%s: %zu problem%s\n", forTerminal(path).c_str(), loaded.issues.size(),
                             loaded.issues.size() == 1 ? "" : "s");
            }
        }
        report.push_back({{"file", path}, {"ok", loaded.ok()}, {"issues", issues}, {"not_executed", unsupported}, {"warnings", warnings}});
        if (!loaded.ok()) ++bad;
    }
    if (a.has("--json")) std::printf("%s\n", dumpJson(report, 2).c_str());
    return bad ? 2 : 0;
}

int cmdVersion(const Args&) {
    std::printf("trainscope %s (%s, %s)\n", TS_BUILD_VERSION, TS_BUILD_TYPE, TS_BUILD_COMPILER);
    std::printf("  CUDA backend: %s  CUPTI: %s  NCCL: %s  MPI: %s  GUI: %s\n", TS_BUILD_CUDA, TS_BUILD_CUPTI,
                TS_BUILD_NCCL, TS_BUILD_MPI, TS_BUILD_GUI);
    return 0;
}

}  // namespace ts::cli
