// The node agent: serves one node over JSON-RPC 2.0 (docs/protocol.md) on stdio (the GUI's
// local node, `ssh host trainscope agent --stdio`) or TCP with a token.
//
// Every run executes as a CHILD PROCESS (`<runner> run CFG.yaml --json --run-file PATH ...`),
// so a crashing, killed or out-of-memory run never takes the agent down. The agent reads the
// child's JSON lines and forwards them as notifications; when the child ends it makes sure the
// run file says how it ended (failed + reason if the child died) and indexes it.
//
// Threads: one per connection, one per active run (reads the child's output), one accept
// loop for TCP. All shared state is behind Agent's mutex; each connection serialises its
// writes with its own mutex, so notifications never interleave with responses.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "sessions/jsonrpc.h"

namespace ts::sessions {

inline constexpr int kProtocolVersion = 1;

struct AgentOptions {
    std::string workspaceDir;                 // "" = Workspace::defaultDir()
    // How a run is started: runnerCommand + {"run", CFG, "--json", "--run-file", PATH, ...}.
    // Empty = {selfExePath()} (this trainscope). Tests may put a stand-in here.
    std::vector<std::string> runnerCommand;
    size_t maxMessageBytes = rpc::kDefaultMaxMessageBytes;
    std::string token;                        // TCP: required when non-empty
    int maxActiveRuns = 4;
    int maxConnections = 16;
    int cancelGraceMs = 5000;                 // SIGTERM, then SIGKILL after this
    std::string nodeName;                     // reported in hello and stored in run files; "" = hostname
    std::string version = "0.1.0";
    // devices method; null = built-in probe (CPU from /proc and sysconf).
    std::function<nlohmann::json()> devicesProvider;
};

class Agent {
public:
    static Result<std::unique_ptr<Agent>> create(AgentOptions options);
    ~Agent();  // cancels active runs, waits for them to be finalised, joins every thread

    // Serves one connection until EOF, a fatal write error, or shutdown. Blocking. With
    // requireAuth the first request must carry the token (hello {token} or authenticate).
    Status serve(int inFd, int outFd, bool requireAuth);

    // TCP: binds HOST:PORT (port 0 = any free port; see boundPort()). Refuses to start
    // without a token. Then serveTcp() accepts until shutdown.
    Status listen(const std::string& hostPort);
    int boundPort() const { return m_port; }
    Status serveTcp();

    void requestShutdown();
    bool shutdownRequested() const { return m_shutdown.load(); }
    // Blocks until no run is active (each one finalised and indexed).
    void waitForRuns();
    int activeRuns() const;
    const AgentOptions& options() const { return m_options; }

    struct Impl;

private:
    Agent() = default;
    AgentOptions m_options;
    std::unique_ptr<Impl> m;
    std::atomic<bool> m_shutdown{false};
    int m_listenFd = -1;
    int m_port = 0;
};

// Default device probe: {"backend":"cpu","count":1,"devices":[{name, memory_total_bytes,
// memory_free_bytes, cores}]}.
nlohmann::json probeCpuDevices();

// Reads a token file: the first line, surrounding whitespace trimmed. Refuses empty tokens
// and files readable by group/others (the token is a password).
Result<std::string> readTokenFile(const std::string& path);

}  // namespace ts::sessions
