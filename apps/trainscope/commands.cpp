// Argument parsing and the command table.
#include "apps/trainscope/commands.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "common/text.h"

namespace ts::cli {

bool isSwitchFlag(const std::string& flag) {
    static const char* kSwitches[] = {"--json", "--all", "--stdio", "--follow", "--quiet",
                                      "--no-trace", "--force", "--rebuild", "--verbose",
                                      "--in-process", "--fused", "--unfused", "--markdown",
                                      "--drop-last-step", "--shrink"};
    return std::any_of(std::begin(kSwitches), std::end(kSwitches),
                       [&](const char* s) { return flag == s; });
}

Args::Args(std::string command, std::vector<std::string> raw)
    : m_command(std::move(command)), m_raw(std::move(raw)) {
    for (size_t i = 0; i < m_raw.size(); ++i) {
        const std::string& a = m_raw[i];
        if (a.rfind("--", 0) == 0 && a.size() > 2) {
            auto eq = a.find('=');
            if (eq != std::string::npos) {
                m_flags.emplace_back(a.substr(0, eq), a.substr(eq + 1));
            } else if (isSwitchFlag(a) || i + 1 >= m_raw.size()) {
                m_flags.emplace_back(a, "");
            } else {
                m_flags.emplace_back(a, m_raw[++i]);
            }
        } else {
            m_positional.push_back(a);
        }
    }
}

bool Args::has(const std::string& flag) const {
    return std::any_of(m_flags.begin(), m_flags.end(), [&](auto& f) { return f.first == flag; });
}

std::optional<std::string> Args::value(const std::string& flag) const {
    for (auto it = m_flags.rbegin(); it != m_flags.rend(); ++it)
        if (it->first == flag) return it->second;
    return std::nullopt;
}

std::vector<std::string> Args::values(const std::string& flag) const {
    std::vector<std::string> out;
    for (auto& f : m_flags)
        if (f.first == flag) out.push_back(f.second);
    return out;
}

std::vector<std::string> Args::unknownFlags(const std::vector<std::string>& known) const {
    std::vector<std::string> out;
    for (auto& f : m_flags)
        if (std::find(known.begin(), known.end(), f.first) == known.end()) out.push_back(f.first);
    return out;
}

int fail(int code, const std::string& message) {
    std::fprintf(stderr, "trainscope: error: %s\n", forTerminal(message, /*keepNewlines=*/true).c_str());
    return code;
}

Result<int64_t> parseInteger(const std::string& text, int64_t min, int64_t max, const std::string& what) {
    const std::string range = "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
    size_t i = text.size() > 0 && text[0] == '-' ? 1 : 0;
    bool digits = i < text.size();
    for (size_t k = i; k < text.size(); ++k) digits = digits && text[k] >= '0' && text[k] <= '9';
    if (!digits)
        return Status::invalid(what + " needs a whole number in " + range + ", got '" + forTerminal(text) + "'");
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno == ERANGE || v < min || v > max)
        return Status::invalid(what + " must be in " + range + ", got " + forTerminal(text));
    return int64_t(v);
}

Result<std::optional<int64_t>> intFlag(const Args& a, const std::string& flag, int64_t min, int64_t max) {
    auto v = a.value(flag);
    if (!v) return std::optional<int64_t>();
    TS_ASSIGN_OR_RETURN(int64_t x, parseInteger(*v, min, max, flag));
    return std::optional<int64_t>(x);
}

std::string forTerminal(const std::string& text, bool keepNewlines) {
    if (!keepNewlines) return escapeControlChars(text);
    std::string out;
    size_t from = 0;
    for (;;) {
        const size_t nl = text.find('\n', from);
        out += escapeControlChars(std::string_view(text).substr(from, nl == std::string::npos ? std::string::npos : nl - from));
        if (nl == std::string::npos) return out;
        out += '\n';
        from = nl + 1;
    }
}

int exitCodeOf(const Status& s) {
    switch (s.code()) {
        case ErrorCode::InvalidArgument: return 2;
        case ErrorCode::NotFound: return 3;
        default: return 1;
    }
}

const std::vector<Command>& commands() {
    static const std::vector<Command> kCommands = {
        {"demo", "demo [--steps N]",
         "train the tiny example model on this node and print where the step time goes", cmdDemo},
        {"run", "run CONFIG.yaml [--steps N] [--world-size N] [--set KNOB=VALUE ...] [--json] [--no-trace] [--workspace DIR | --run-file PATH] [--name NAME] [--node ssh://HOST|tcp://HOST:PORT]",
         "train a model with the config's layout and knobs; stores the run in the workspace. Under "
         "`mpirun -np N` or `srun -n N` each process runs one rank and one run file holds every rank. "
         "device_backend: cuda runs one rank per GPU, NCCL between them (several GPUs not yet verified: "
         "TS_CUDA_UNVERIFIED=1; the knob cuda_share_gpus puts several ranks on one GPU to check a layout's "
         "results), and traces the GPUs' kernels with CUPTI", cmdRun},
        {"knobs", "knobs [--json | --markdown] [--group GROUP]",
         "list every tunable knob: type, default, group, Megatron-LM flag, Bridge path, help", cmdKnobs},
        {"validate", "validate CONFIG.yaml [CONFIG.yaml ...]",
         "check configs against the knob registry; one message per problem (exit 2 if any)", cmdValidate},
        {"layout", "layout CONFIG.yaml [--world-size N] [--json]",
         "print which global rank has which tp/cp/ep/dp/pp coordinates and its process groups", cmdLayout},
        {"schedule", "schedule --pp P [--vpp V] --microbatches M [--rank R] [--json]",
         "print the pipeline op order per rank (Megatron-Core 1F1B / interleaved 1F1B)", cmdSchedule},
        {"analyze", "analyze RUN [--json] [--step N] [--top N] [--definitions trainscope|hta] [--workspace DIR]",
         "explain a run's steps: bubbles, exposed communication, overlap, kernels, memory, MFU, and "
         "MoE router losses / tokens per expert and FP8 scales when the run records them "
         "(--definitions hta: HTA's defaults, to check against Holistic Trace Analysis)", cmdAnalyze},
        {"import", "import FILE [FILE ...] [--out RUN.sqlite] [--workspace DIR] [--name NAME] [--drop-last-step] [--json]",
         "import an Nsight Systems SQLite export or PyTorch/Kineto JSON trace as a run", cmdImport},
        {"export-trace", "export-trace RUN --chrome OUT.json [--workspace DIR]",
         "write a run's trace as Chrome/Perfetto trace JSON", cmdExportTrace},
        {"runs", "runs [list|show RUN|name RUN NAME|tag RUN TAG|delete RUN [--force]|reindex] [--workspace DIR] [--json]",
         "list and manage the runs in the workspace", cmdRuns},
        {"compare", "compare RUN_A RUN_B [--all] [--json]",
         "A/B: knobs that differ, then metric deltas with the sign that matters", cmdCompare},
        {"export", "export RUN --format yaml|megatron-args|bridge-overrides [--out FILE]",
         "export a run's config for a headless rerun, Megatron-LM or Megatron-Bridge", cmdExport},
        {"config", "config from-megatron SCRIPT|- | from-bridge YAML|OVERRIDES|- [--shrink] [--out CONFIG.yaml]",
         "import a Megatron-LM launch or a Megatron-Bridge config as a trainscope config", cmdConfig,
         "  SCRIPT is a shell script or a file holding the argument list (- reads stdin): backslash\n"
         "  continuations, quotes, comments, VAR=value and bash arrays VAR=( ... ) set in the script are\n"
         "  expanded; other $VARIABLES are reported. Flags map to knobs through the knob registry (the\n"
         "  same table export uses); every argument that maps to no knob is printed as `unmapped:` and\n"
         "  kept as a comment in the YAML.\n"
         "  from-bridge reads a Bridge YAML (nested sections model:, ddp:, comm_overlap: ...) or lines of\n"
         "  path=value overrides; mixed_precision presets set bf16/fp8, gated_linear_unit with\n"
         "  activation_func=silu sets swiglu, null means off/derived.\n"
         "  --shrink  shrink the model shape (layers to 1-2 per pipeline chunk, heads to whole groups per\n"
         "            TP rank with head dim 16, hidden, ffn, seq 128, vocab 4096) to run on this node,\n"
         "            keeping the parallel layout and every performance knob; each change is printed."},
        {"agent", "agent --stdio | --listen HOST:PORT --token-file FILE [--allow-path DIR ...] [--workspace DIR] "
                  "[--max-runs N] [--node-name NAME] | --generate-token FILE",
         "serve this node over JSON-RPC 2.0 (used by the GUI and by --node)", cmdAgent,
         "  --stdio                 serve one client on stdin/stdout (the GUI's local node, ssh HOST trainscope agent --stdio)\n"
         "  --listen HOST:PORT      serve TCP clients (HOST empty = loopback; PORT 1..65535, 0 = any free port)\n"
         "  --token-file FILE       the secret TCP clients must send first: one line, mode 0600, at least 16\n"
         "                          characters with at least 8 different ones; clients have 5 s to send it,\n"
         "                          failed attempts are logged and slowed down per address\n"
         "  --generate-token FILE   write a new random token (from /dev/urandom) to FILE with mode 0600 and exit\n"
         "  --allow-path DIR        let runs use DIR in path knobs (save, load, data_path); without it they stay in\n"
         "                          the workspace (checkpoints/ and data/); repeatable\n"
         "  --max-runs N            active runs at once (default 4)\n"
         "SIGTERM, SIGINT, SIGHUP and SIGQUIT cancel the active runs, record them and exit (like `shutdown`).\n"
         "Protocol and limits: docs/protocol.md."},
        {"gui", "gui [--node URL] [--token-file FILE] [--config FILE] [--run RUN_FILE] [--tour DIR]",
         "open the workbench window (trainscope-gui) on a node; --tour writes a screenshot per view", cmdGui},
        {"devices", "devices [--json]",
         "list this node's devices: CUDA GPUs (memory, SMs, compute capability, peak TFLOP/s, NVLink/PCIe "
         "topology) when this build and machine have them, else why not, and the CPU", cmdDevices},
        {"version", "version", "print version and build configuration", cmdVersion},
    };
    return kCommands;
}

}  // namespace ts::cli
