// Shared by the CLI tests: run the `trainscope` binary built next to the tests the way a user's
// shell does, and collect its exit code and output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace ts::cli_test {

struct Output {
    int code = -1;
    std::string text;  // stdout + stderr
};

inline const std::string& trainscopeBinary() {
    static const std::string bin = std::string(TS_BINARY_DIR) + "/apps/trainscope";
    return bin;
}

// Runs a shell command line in which `$TS` is the binary; stdout and stderr together.
inline Output sh(const std::string& line) {
    const std::string cmd = "TS='" + trainscopeBinary() + "'; " + line + " 2>&1";
    Output out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return out;
    std::array<char, 4096> buf{};
    size_t n = 0;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.text.append(buf.data(), n);
    const int status = pclose(p);
    out.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

// `trainscope ARGS` (ARGS as a shell would split them).
inline Output run(const std::string& args) { return sh("\"$TS\" " + args); }

}  // namespace ts::cli_test
