// One connection to a node (docs/protocol.md) for the workbench: the local node is
// `trainscope agent --stdio` as a child process, remote nodes are ssh:// or tcp:// with a token
// file. Every blocking call runs on this session's own thread pool; results come back to the
// UI thread as values through queued calls, and results for a connection that has since been
// replaced are dropped (a generation counter, as hotspot does for stale jobs).
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include <QObject>
#include <QString>
#include <QThreadPool>
#include <QTimer>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "gui/core/json_meta.h"

namespace ts::sessions {
class NodeClient;
}

namespace ts::gui {

// What the node bar shows; filled after hello, devices and knobs answered.
struct NodeInfo {
    QString url;          // "local", "ssh://host", "tcp://host:port"
    QString host, node, agentVersion, workspace;
    QString backend;      // first backend: "cpu" or "cuda"
    qint64 agentPid = 0;  // the agent's process id on its host
    nlohmann::json devices = nlohmann::json::array();  // [{index, name, memory_total_bytes, ...}]
    nlohmann::json knobs;  // the node's knob registry (sessions/knobs_json.h)
    nlohmann::json deviceReport = nlohmann::json::object();  // the whole `devices` answer (docs/protocol.md)
    // "host · cpu · 1× Intel Xeon (23.4 GiB) · agent 0.1.0"
    QString summary() const;
    // Every backend's devices, one line each (memory; GPUs: SMs, compute capability, peak
    // TFLOP/s), the GPU topology matrix, and what the node says of its CUDA backend (why there
    // is none, or its status): the node bar's tooltip.
    QString details() const;
};

// The trainscope binary that serves the local node: $TRAINSCOPE_EXE, else `trainscope` next to
// this program, else the build tree's apps/trainscope beside gui/, else PATH.
QString localAgentExecutable();

class NodeSession : public QObject {
    Q_OBJECT
public:
    using Callback = std::function<void(const Result<nlohmann::json>&)>;

    explicit NodeSession(QObject* parent = nullptr);
    ~NodeSession() override;

    // Connects (asynchronously) and loads the node's info; emits connected() or
    // connectionFailed(). A previous connection is closed first.
    void connectTo(const QString& url, const QString& tokenFile = {});
    void disconnectFromNode();
    bool isConnected() const { return m_state == State::Connected; }
    bool isConnecting() const { return m_state == State::Connecting; }
    const NodeInfo& info() const { return m_info; }
    QString url() const { return m_url; }
    QString tokenFile() const { return m_tokenFile; }

    // One request; `done` runs on the UI thread (dropped when `context` is gone or this session
    // has reconnected since). timeoutMs < 0: no limit.
    void request(const QString& method, nlohmann::json params, QObject* context, Callback done,
                 int timeoutMs = 60000);
    // fetch_run into destPath (remote runs), checked by size and checksum.
    void fetchRun(const QString& runId, const QString& destPath, QObject* context,
                  std::function<void(const Status&)> done);

signals:
    void connecting(const QString& url);
    void connected(const ts::gui::NodeInfo& info);
    void connectionFailed(const QString& url, const QString& message);
    // The node went away (agent killed, ssh dropped, network): the message says why.
    void disconnected(const QString& url, const QString& message);
    // Every agent notification (progress, run_started, run_log, run_finished).
    void notification(const QString& method, const nlohmann::json& params);

private:
    enum class State { Idle, Connecting, Connected };
    void checkAlive();
    std::shared_ptr<sessions::NodeClient> client() const { return m_client; }

    QThreadPool m_pool;
    QTimer m_aliveTimer;
    std::shared_ptr<sessions::NodeClient> m_client;
    std::shared_ptr<std::atomic<uint64_t>> m_generation = std::make_shared<std::atomic<uint64_t>>(0);
    State m_state = State::Idle;
    QString m_url, m_tokenFile;
    NodeInfo m_info;
};

}  // namespace ts::gui

Q_DECLARE_METATYPE(ts::gui::NodeInfo)
