// RunController (run_controller.h).
#include "gui/core/run_controller.h"

#include <QDir>
#include <QRegularExpression>

namespace ts::gui {

using nlohmann::json;

namespace {
QString jstr(const json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_string() ? QString::fromStdString(j[key].get<std::string>()) : QString();
}
double jnum(const json& j, const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}
}  // namespace

bool isSafeRunId(const QString& id) {
    static const QRegularExpression re(QStringLiteral("^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"));
    return re.match(id).hasMatch();
}

RunController::RunController(NodeSession* session, QObject* parent) : QObject(parent), m_session(session) {
    qRegisterMetaType<ts::gui::StepPoint>();
    connect(session, &NodeSession::notification, this, &RunController::onNotification);
    connect(session, &NodeSession::disconnected, this, &RunController::onDisconnected);
}

void RunController::startRun(const QString& configYaml, const QString& name, int steps) {
    json params = {{"config", configYaml.toStdString()}};
    if (!name.isEmpty()) params["name"] = name.toStdString();
    if (steps > 0) params["steps"] = steps;
    const QString node = m_session->url();
    m_session->request(QStringLiteral("start_run"), params, this, [this, configYaml, name, node](const Result<json>& r) {
        if (!r) {
            emit runRejected(QString::fromStdString(r.status().message()));
            return;
        }
        const QString id = jstr(*r, "run_id");
        if (!isSafeRunId(id)) {
            emit runRejected(QStringLiteral("the node answered with a run id that is not a file-name-safe token: '%1'").arg(id));
            return;
        }
        LiveRun& run = m_runs[id];
        run.id = id;
        run.node = node;
        run.name = jstr(*r, "name").isEmpty() ? name : jstr(*r, "name");
        run.runFile = jstr(*r, "run_file");
        run.configYaml = configYaml;
        if (run.status.isEmpty()) run.status = QStringLiteral("running");
        emit runStarted(id);
        auto early = m_early.find(id);
        if (early != m_early.end()) {
            auto pending = std::move(early->second);
            m_early.erase(early);
            for (const auto& [method, params] : pending) onNotification(method, params);
        }
    });
}

void RunController::cancel(const QString& runId) {
    m_session->request(QStringLiteral("cancel"), {{"run_id", runId.toStdString()}}, this, [this, runId](const Result<json>& r) {
        if (!r) emit runLog(runId, QStringLiteral("cancel failed: %1").arg(QString::fromStdString(r.status().message())));
    });
}

void RunController::watch(const QString& runId) {
    m_session->request(QStringLiteral("watch"), {{"run_id", runId.toStdString()}}, this, [this, runId](const Result<json>& r) {
        if (!r) return;
        LiveRun& run = m_runs[runId];
        run.id = runId;
        run.node = m_session->url();
        run.status = jstr(*r, "status");
    });
}

const LiveRun* RunController::run(const QString& id) const {
    auto it = m_runs.find(id);
    return it == m_runs.end() ? nullptr : &it->second;
}

QStringList RunController::runIds() const {
    QStringList out;
    for (const auto& [id, r] : m_runs) out << id;
    return out;
}

void RunController::onNotification(const QString& method, const json& params) {
    const QString id = jstr(params, "run_id");
    if (id.isEmpty()) return;
    auto it = m_runs.find(id);
    if (it == m_runs.end()) {
        // Before the start_run response: keep it (bounded) until the id is known.
        auto& q = m_early[id];
        if (q.size() < 4096) q.emplace_back(method, params);
        return;
    }
    apply(it->second, method, params);
}

void RunController::apply(LiveRun& run, const QString& method, const json& params) {
    if (method == QLatin1String("run_started")) {
        run.totalSteps = int(jnum(params, "steps"));
        run.peakTflopsPerDevice = jnum(params, "peak_tflops_per_device");
        run.flopsFormula = jstr(params, "flops_formula");
        if (run.runFile.isEmpty()) run.runFile = jstr(params, "run_file");
        run.status = QStringLiteral("running");
    } else if (method == QLatin1String("progress")) {
        StepPoint p;
        p.step = int(jnum(params, "step"));
        p.loss = jnum(params, "loss");
        p.stepTimeS = jnum(params, "step_time_s");
        p.tokensPerS = jnum(params, "tokens_per_s");
        p.modelTflops = jnum(params, "model_tflops");
        p.peakMemoryBytes = jnum(params, "peak_memory_bytes");
        // model_tflops is per device (F / (t * 1e12 * world)), as is the peak.
        p.mfu = run.peakTflopsPerDevice > 0 ? p.modelTflops / run.peakTflopsPerDevice : 0;
        run.steps.push_back(p);
        emit runProgressed(run.id, p);
    } else if (method == QLatin1String("run_log")) {
        const QString line = jstr(params, "text");
        run.logTail << line;
        while (run.logTail.size() > 200) run.logTail.removeFirst();
        emit runLog(run.id, line);
    } else if (method == QLatin1String("run_finished")) {
        run.status = jstr(params, "status");
        run.reason = jstr(params, "reason");
        if (!jstr(params, "run_file").isEmpty()) run.runFile = jstr(params, "run_file");
        const QString id = run.id;
        emit runFinished(id, run.status, run.reason);
        if (run.node == QLatin1String("local")) {
            run.localRunFile = run.runFile;
            emit runFileReady(id, run.localRunFile);
        } else if (!m_localRunsDir.isEmpty()) {
            const QString dest = QDir(m_localRunsDir).filePath(id + QStringLiteral(".sqlite"));
            m_session->fetchRun(id, dest, this, [this, id, dest](const Status& st) {
                auto it = m_runs.find(id);
                if (it == m_runs.end()) return;
                if (!st.isOk()) {
                    it->second.logTail << QStringLiteral("fetching the run file failed: %1").arg(QString::fromStdString(st.message()));
                    emit runLog(id, it->second.logTail.back());
                    return;
                }
                it->second.localRunFile = dest;
                emit runFileReady(id, dest);
            });
        }
    }
}

void RunController::onDisconnected(const QString& url, const QString& message) {
    for (auto& [id, run] : m_runs) {
        if (run.finished() || run.node != url) continue;
        // The run may well go on on the node; say what we know, not more.
        run.status = QStringLiteral("unknown");
        run.reason = QStringLiteral("lost contact with the node: %1").arg(message);
        emit runLog(id, run.reason);
        emit runFinished(id, QStringLiteral("unknown"), run.reason);
    }
}

}  // namespace ts::gui
