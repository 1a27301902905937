// Runs the workbench starts on its node, and what it knows of them while they go: the node's
// notifications (run_started, progress, run_log, run_finished; docs/protocol.md) become one
// LiveRun per run id, with the step series the live charts draw. Progress may arrive before
// the start_run response; it is kept until the id is known. A run on a remote node is fetched
// into the local workspace when it ends, so the timeline and panels read it like a local one.
#pragma once

#include <map>
#include <vector>

#include <QObject>
#include <QString>
#include <QStringList>

#include <nlohmann/json.hpp>

#include "gui/core/node_session.h"

namespace ts::gui {

struct StepPoint {
    int step = 0;
    double loss = 0, stepTimeS = 0, tokensPerS = 0, modelTflops = 0, mfu = 0;
    double peakMemoryBytes = 0;
};

struct LiveRun {
    QString id, name, node;
    QString status;               // starting | running | completed | failed | cancelled
    QString reason;
    QString runFile;              // path on the node
    QString localRunFile;         // readable here ("" until a remote run has been fetched)
    int totalSteps = 0;
    double peakTflopsPerDevice = 0;  // for MFU (the run's own measured or table peak)
    QString flopsFormula;
    QString configYaml;           // what was sent
    std::vector<StepPoint> steps;
    QStringList logTail;          // last lines the run printed
    bool finished() const { return status == QLatin1String("completed") || status == QLatin1String("failed") || status == QLatin1String("cancelled"); }
};

class RunController : public QObject {
    Q_OBJECT
public:
    explicit RunController(NodeSession* session, QObject* parent = nullptr);

    // Starts a run of configYaml on the session's node. The id comes with runStarted(); errors
    // (invalid config, node busy, not connected) with runRejected().
    void startRun(const QString& configYaml, const QString& name, int steps);
    void cancel(const QString& runId);
    // Follows a run this client did not start (e.g. after a reconnect).
    void watch(const QString& runId);

    const LiveRun* run(const QString& id) const;
    QStringList runIds() const;
    // Where fetched remote runs go: the local workspace's runs folder.
    void setLocalRunsDir(const QString& dir) { m_localRunsDir = dir; }

signals:
    void runRejected(const QString& message);
    void runStarted(const QString& runId);
    void runProgressed(const QString& runId, const ts::gui::StepPoint& point);
    void runLog(const QString& runId, const QString& line);
    void runFinished(const QString& runId, const QString& status, const QString& reason);
    // The run file can be read here (local node: at once; remote: after fetch_run).
    void runFileReady(const QString& runId, const QString& localPath);

private:
    void onNotification(const QString& method, const nlohmann::json& params);
    void apply(LiveRun& run, const QString& method, const nlohmann::json& params);
    void onDisconnected(const QString& url, const QString& message);

    NodeSession* m_session;
    std::map<QString, LiveRun> m_runs;
    std::map<QString, std::vector<std::pair<QString, nlohmann::json>>> m_early;  // before the id is known
    QString m_localRunsDir;
};

// A run id is a file-name-safe token: [A-Za-z0-9._-], no leading dot, at most 128 characters.
// Ids from a node are checked with it before they name anything local.
bool isSafeRunId(const QString& id);

}  // namespace ts::gui

Q_DECLARE_METATYPE(ts::gui::StepPoint)
