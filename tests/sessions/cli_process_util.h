// Shared by the tests that run the real `trainscope` binary as a child process (the CLI agent
// tests and the slow agent-fault tests): where the binary is, a micro config, a run of the
// binary with its output collected, and a free loopback port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "sessions/process.h"

namespace ts::sessions::testutil {

inline const std::string kBinary = std::string(TS_BINARY_DIR) + "/apps/trainscope";

// Small enough that a step takes milliseconds on a loaded 2-core machine.
inline constexpr const char* kMicroYaml =
    "name: micro\nposition_embedding_type: rope\nnum_layers: 2\nhidden_size: 32\nnum_attention_heads: 2\nseq_length: 16\n"
    "vocab_size: 256\nmicro_batch_size: 2\ndata_path: synthetic\ntrain_iters: 3\n";

inline bool haveBinary() { return ::access(kBinary.c_str(), X_OK) == 0; }

// Runs the binary; its exit code (128 + signal when killed), stdout and stderr.
inline int runCli(const std::vector<std::string>& args, std::string* out = nullptr, std::string* err = nullptr) {
    std::vector<std::string> argv = {kBinary};
    argv.insert(argv.end(), args.begin(), args.end());
    SpawnOptions so;
    so.pipeStdout = true;
    so.pipeStderr = true;
    auto child = ChildProcess::spawn(argv, so);
    if (!child) return -1;
    std::string o, e;
    std::thread errReader([&] {
        char buf[4096];
        ssize_t n;
        while ((n = ::read(child->stderrFd(), buf, sizeof buf)) > 0) e.append(buf, size_t(n));
    });
    char buf[4096];
    ssize_t n;
    while ((n = ::read(child->stdoutFd(), buf, sizeof buf)) > 0) o.append(buf, size_t(n));
    errReader.join();
    int st = child->wait();
    if (out) *out = o;
    if (err) *err = e;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// A loopback port that was free a moment ago.
inline int freePort() {
    int probe = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(probe);
    return ntohs(a.sin_port);
}

}  // namespace ts::sessions::testutil
