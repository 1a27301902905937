// trainscope: command-line entry point. Dispatches to the command table (commands.h).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "apps/trainscope/commands.h"

namespace {

void printHelp() {
    std::printf(
        "trainscope - a workbench for tuning distributed LLM training\n"
        "\n"
        "Usage: trainscope COMMAND [ARGS...]\n"
        "       trainscope COMMAND --help\n"
        "\n"
        "Commands:\n");
    for (const auto& c : ts::cli::commands()) std::printf("  %-14s %s\n", c.name, c.summary);
    std::printf(
        "\n"
        "Configs are YAML files whose keys are Megatron-LM knob names (see `trainscope knobs`);\n"
        "examples live in resources/examples/ (at most 1 MiB, 100,000 values, 64 levels deep).\n"
        "RUN is a run id, a unique id prefix, a run name (its newest run), `latest`, or the path\n"
        "of a run file. Numeric options take whole numbers only (`--steps 1x` is an error).\n"
        "Exit codes: 0 ok, 1 run failed (also when its run file could not be written), 2 bad\n"
        "usage or invalid config, 3 not found, 130 cancelled.\n"
        "A node over TCP: `trainscope agent --generate-token FILE`, then\n"
        "`trainscope agent --listen :7070 --token-file FILE` (see `trainscope agent --help`).\n");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
        !std::strcmp(argv[1], "help")) {
        printHelp();
        return argc < 2 ? 2 : 0;
    }
    if (!std::strcmp(argv[1], "--version")) argv[1] = const_cast<char*>("version");
    const std::string name = argv[1];
    for (const auto& c : ts::cli::commands()) {
        if (name != c.name) continue;
        std::vector<std::string> rest(argv + 2, argv + argc);
        for (const auto& a : rest) {
            if (a == "--help" || a == "-h") {
                std::printf("Usage: trainscope %s\n\n%s\n", c.usage, c.summary);
                if (c.details) std::printf("\n%s", c.details);
                return 0;
            }
        }
        return c.fn(ts::cli::Args(name, rest));
    }
    std::fprintf(stderr, "trainscope: error: unknown command '%s'; run `trainscope --help`\n",
                 name.c_str());
    return 2;
}
