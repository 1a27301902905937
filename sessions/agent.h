// The node agent: serves one node over JSON-RPC 2.0 (docs/protocol.md) on stdio (the GUI's
// local node, `ssh host trainscope agent --stdio`) or TCP with a token.
//
// Every run executes as a CHILD PROCESS (`<runner> run CFG.yaml --json --run-file PATH ...`),
// so a crashing, killed or out-of-memory run never takes the agent down. The agent reads the
// child's JSON lines and forwards them as notifications; when the child ends it makes sure the
// run file says how it ended (failed + reason if the child died) and indexes it.
//
// Threads: per connection a reader (parses and answers its requests in order) and a writer
// that drains the connection's bounded outgoing queue; one per active run (reads the child's
// output); one accept loop for TCP; one signal watcher when installed. Nothing writes to a
// socket while holding shared state: notifications and responses are queued, so a client that
// stops reading only fills its own queue (and is dropped when it overflows or stalls).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
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
    std::string token;                        // TCP: required, and at least checkTokenStrength()
    int maxActiveRuns = 4;
    int maxConnections = 64;                  // TCP connections that have authenticated
    int maxPendingConnections = 16;           // TCP connections still to authenticate
    int authTimeoutMs = 5000;                 // TCP: authenticate within this or be closed
    int frameTimeoutMs = 30000;               // a message begun must arrive whole within this
    size_t maxPreAuthMessageBytes = rpc::kPreAuthMaxMessageBytes;
    size_t maxQueuedBytes = size_t(8) << 20;  // per connection, waiting to be written
    int writeStallMs = 30000;                 // a client that takes no byte for this long is dropped
    // Failed authentication: per address, attempt n+1 waits authRetryBaseMs * 2^(n-1) (at most
    // authRetryMaxMs) after failure n; across all addresses at most authFailuresPerSecond.
    int authRetryBaseMs = 100;
    int authRetryMaxMs = 5000;
    int authFailuresPerSecond = 20;
    int cancelGraceMs = 5000;                 // SIGTERM, then SIGKILL after this
    // Directories outside the workspace that runs may name in path knobs (save, load,
    // data_path); `agent --allow-path DIR`. Without them every path stays in the workspace.
    std::vector<std::string> allowedPaths;
    std::string nodeName;                     // reported in hello and stored in run files; "" = hostname
    std::string version = "0.1.0";
    // devices method; null = built-in probe (CPU from /proc and sysconf).
    std::function<nlohmann::json()> devicesProvider;
    // Operator log (failed authentications, dropped clients, signals); null = stderr.
    std::function<void(const std::string&)> log;
};

class Agent {
public:
    // Opens the workspace and finalises runs left "running" by processes that are gone
    // (finalizeStaleRuns, and runs of an agent that died before finalising them).
    static Result<std::unique_ptr<Agent>> create(AgentOptions options);
    ~Agent();  // cancels active runs, waits for them to be finalised, joins every thread

    // Serves one connection until EOF, a fatal write error, or shutdown. Blocking. With
    // requireAuth the first request must carry the token (hello {token} or authenticate)
    // and arrive within authTimeoutMs. peer names the other end in log lines.
    Status serve(int inFd, int outFd, bool requireAuth, const std::string& peer = "local");

    // TCP: binds HOST:PORT (port 0 = any free port; see boundPort()). Refuses to start
    // without a token or with a weak one. Then serveTcp() accepts until shutdown.
    Status listen(const std::string& hostPort);
    int boundPort() const { return m_port; }
    Status serveTcp();

    // SIGTERM, SIGINT, SIGHUP and SIGQUIT shut the agent down like the shutdown method
    // (cancel active runs, finalise them, stop serving). Process-wide: call it from the program
    // that owns the agent (`trainscope agent`), once.
    Status installSignalHandlers();

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
    std::thread m_signalThread;
};

// Default device probe: {"backend":"cpu","count":1,"devices":[{name, memory_total_bytes,
// memory_free_bytes, cores}]}.
nlohmann::json probeCpuDevices();

// Reads a token file: the first line, surrounding whitespace trimmed. Refuses empty tokens
// and files readable by group/others (the token is a password).
Result<std::string> readTokenFile(const std::string& path);
// A TCP agent's token must be at least 16 characters with at least 8 different ones, all
// printable. The message says how to make a good one (`agent --generate-token FILE`).
Status checkTokenStrength(const std::string& token);
// Writes a new random token (32 bytes from /dev/urandom as 64 hex digits) to a new file with
// mode 0600. Refuses to overwrite an existing file.
Status generateTokenFile(const std::string& path);

// Parses "HOST:PORT", "[IPv6]:PORT" or ":PORT"/"PORT" (host ""); the port must be a decimal
// number in 1..65535 (0 too when allowZero: "any free port").
Status parseHostPort(const std::string& hostPort, bool allowZero, std::string* host, int* port);

}  // namespace ts::sessions
