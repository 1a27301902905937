// Client side of the node protocol (docs/protocol.md): what the GUI and `trainscope run
// --node URL` use to talk to an agent.
//
// Node URLs:
//   local            spawn `<this trainscope> agent --stdio` (a child process)
//   ssh://HOST       spawn `ssh HOST trainscope agent --stdio`; $TRAINSCOPE_SSH replaces "ssh"
//                    (a command prefix, split on spaces) and $TRAINSCOPE_REMOTE_AGENT replaces
//                    "trainscope agent --stdio" (the remote command, passed as one argument)
//   tcp://HOST:PORT  connect; the token comes from ConnectOptions / $TRAINSCOPE_TOKEN(_FILE)
//
// Threads: a reader thread delivers responses to waiting call()s and notifications to the
// handler (called on the reader thread; keep it short). call() may be used from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "sessions/workspace.h"

namespace ts::sessions {

struct ConnectOptions {
    std::string token;              // TCP; "" = $TRAINSCOPE_TOKEN, else the file below
    std::string tokenFile;          // TCP; "" = $TRAINSCOPE_TOKEN_FILE
    std::string agentExe;           // local: "" = this program
    std::vector<std::string> localAgentArgs;  // local: extra args after "agent --stdio"
    std::string sshCommand;         // "" = $TRAINSCOPE_SSH or "ssh"
    std::string remoteCommand;      // "" = $TRAINSCOPE_REMOTE_AGENT or "trainscope agent --stdio"
    int connectTimeoutMs = 10000;
    std::string clientName = "trainscope";
};

class NodeClient {
public:
    using NotificationHandler = std::function<void(const std::string& method, const nlohmann::json& params)>;

    // Connects and performs hello (authenticating on TCP). Fails with a message that says
    // what to check (agent not found, wrong token, protocol mismatch).
    static Result<std::unique_ptr<NodeClient>> connect(const std::string& url, const ConnectOptions& options = {});
    ~NodeClient();

    const std::string& url() const { return m_url; }
    const nlohmann::json& helloResult() const { return m_hello; }
    bool connected() const;

    void setNotificationHandler(NotificationHandler handler);
    // One request; waits for its response (timeoutMs < 0: no limit). A JSON-RPC error becomes
    // a Status whose message carries the agent's message and code.
    Result<nlohmann::json> call(const std::string& method, const nlohmann::json& params = nlohmann::json::object(),
                                int timeoutMs = -1);
    // Downloads a run file (fetch_run) to destPath, verifying size and checksum.
    Status fetchRun(const std::string& runId, const std::string& destPath);
    void close();

    struct Impl;

private:
    NodeClient();
    static Result<std::unique_ptr<NodeClient>> connectOnce(const std::string& url, const ConnectOptions& options,
                                                           int64_t* retryAfterMs);
    std::string m_url;
    nlohmann::json m_hello;
    std::unique_ptr<Impl> m;
};

// Runs a config on a node and stores the finished run in the local workspace:
// connect -> start_run -> forward progress -> wait for run_finished -> fetch_run -> index.
// This is what `trainscope run CFG --node URL` calls.
struct NodeRunRequest {
    std::string nodeUrl;                 // "local", "ssh://host", "tcp://host:port"
    std::string configYaml;              // the config text (the agent validates it too)
    std::vector<std::string> overrides;  // "key=value"
    int steps = 0;                       // 0 = the config's train_iters
    std::string name;
    std::string workspaceDir;            // local workspace ("" = default)
    ConnectOptions connect;
};
struct NodeRunResult {
    RunSummary run;                      // the run as stored locally
    std::string remoteRunId;
    std::string status, reason;
};
// onEvent receives every notification for the run ("progress", "run_log", "run_finished", ...)
// with its params; may be null.
Result<NodeRunResult> runOnNode(const NodeRunRequest& request,
                                const std::function<void(const std::string&, const nlohmann::json&)>& onEvent = {});

}  // namespace ts::sessions
