// The trainscope command table. Each command group lives in its own file (cmd_*.cpp) and
// exposes `int cmdX(const Args&)`; main.cpp only dispatches. Exit codes: 0 ok, 1 run failed,
// 2 bad usage / invalid config, 3 not found.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace ts::cli {

// Minimal argument view: positional args and --flags (--key value / --key=value / --switch).
class Args {
public:
    Args(std::string command, std::vector<std::string> raw);
    const std::string& command() const { return m_command; }
    const std::vector<std::string>& positional() const { return m_positional; }
    bool has(const std::string& flag) const;                        // "--json"
    std::optional<std::string> value(const std::string& flag) const;  // "--steps" -> "10"
    std::vector<std::string> values(const std::string& flag) const; // repeated flags
    // Flags that no command lookup asked about (for "unknown option" errors).
    std::vector<std::string> unknownFlags(const std::vector<std::string>& known) const;
    const std::vector<std::string>& raw() const { return m_raw; }

private:
    std::string m_command;
    std::vector<std::string> m_raw;
    std::vector<std::string> m_positional;
    std::vector<std::pair<std::string, std::string>> m_flags;  // name -> value ("" for switch)
};

// Switch flags (take no value); every other --flag consumes the next argument as its value.
bool isSwitchFlag(const std::string& flag);

struct Command {
    const char* name;
    const char* usage;    // "run CONFIG.yaml [--steps N] [--json]"
    const char* summary;  // one line for `trainscope --help`
    int (*fn)(const Args&);
    const char* details = nullptr;  // more lines for `trainscope COMMAND --help`
};
const std::vector<Command>& commands();

// Prints "trainscope: error: ..." to stderr, returns code. Control characters in the message
// (from a run name, a path) are escaped.
int fail(int code, const std::string& message);

// Every numeric flag goes through these. The whole text must be a base-10 integer (an
// optional '-' and digits: "1x", "", " 1", "1e3", "0x10" are refused) within [min, max];
// InvalidArgument names the flag and the range.
Result<int64_t> parseInteger(const std::string& text, int64_t min, int64_t max, const std::string& what);
// --flag's value through parseInteger; nullopt when the flag is absent.
Result<std::optional<int64_t>> intFlag(const Args& a, const std::string& flag, int64_t min, int64_t max);

// Text from outside (run names, paths, kernel names) made safe for a terminal: control
// characters become visible escapes (\x1b, \t), invalid UTF-8 becomes U+FFFD. keepNewlines
// leaves '\n' alone for multi-line reports.
std::string forTerminal(const std::string& text, bool keepNewlines = false);

// Upper bounds of the common numeric flags (far above any real run; they keep the numbers
// in the int range the engine uses).
inline constexpr int64_t kMaxSteps = 1000000000;     // --steps (the agent's bound too)
inline constexpr int64_t kMaxWorldSize = 1 << 20;    // --world-size

// Exit code of a Status: 2 invalid argument, 3 not found, 1 otherwise.
int exitCodeOf(const Status& s);

// Command groups.
int cmdKnobs(const Args&);
int cmdValidate(const Args&);
int cmdVersion(const Args&);
int cmdRun(const Args&);
int cmdDemo(const Args&);
int cmdLayout(const Args&);
int cmdSchedule(const Args&);
int cmdAnalyze(const Args&);
int cmdImport(const Args&);
int cmdExportTrace(const Args&);
int cmdRuns(const Args&);
int cmdAgent(const Args&);
int cmdCompare(const Args&);
int cmdExport(const Args&);
int cmdConfig(const Args&);
int cmdGui(const Args&);
int cmdDevices(const Args&);
// `run CONFIG --node URL`: runs through the agent on that node and stores the run in the local
// workspace (cmd_sessions.cpp). cmdRun calls it when --node is given.
int cmdRunOnNode(const Args&);

}  // namespace ts::cli
