// NodeSession (node_session.h): the workbench's connection to one node.
#include "gui/core/node_session.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QPointer>
#include <QStandardPaths>

#include "gui/core/format.h"
#include "sessions/node_client.h"

namespace ts::gui {

using nlohmann::json;

QString NodeInfo::summary() const {
    QStringList parts;
    parts << (host.isEmpty() ? url : host);
    if (!backend.isEmpty()) parts << backend;
    QStringList devs;
    for (const auto& d : devices) {
        if (!d.is_object()) continue;
        QString name = QString::fromStdString(d.value("name", std::string("device")));
        const double mem = d.value("memory_total_bytes", 0.0);
        devs << (mem > 0 ? QStringLiteral("%1 (%2)").arg(name, formatBytes(mem)) : name);
    }
    if (!devs.isEmpty()) {
        // Identical devices are listed once with a count: "8× H100 (79.6 GiB)".
        devs.removeDuplicates();
        const int n = int(devices.size());
        parts << (devs.size() == 1 && n > 1 ? QStringLiteral("%1× %2").arg(n).arg(devs.front()) : devs.join(QStringLiteral(", ")));
    }
    if (!agentVersion.isEmpty()) parts << QStringLiteral("agent %1").arg(agentVersion);
    return parts.join(QStringLiteral(" · "));
}

QString NodeInfo::details() const {
    auto str = [](const json& j, const char* k) {
        return j.contains(k) && j[k].is_string() ? QString::fromStdString(j[k].get<std::string>()) : QString();
    };
    auto num = [](const json& j, const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0; };
    QStringList lines;
    const json& backends = deviceReport.contains("backends") && deviceReport["backends"].is_array()
                               ? deviceReport["backends"]
                               : json::array();
    for (const json& b : backends) {
        if (!b.is_object()) continue;
        const QString kind = str(b, "backend");
        const int count = int(num(b, "count"));
        lines << QStringLiteral("%1: %2 device%3").arg(kind).arg(count).arg(count == 1 ? "" : "s");
        if (b.contains("devices") && b["devices"].is_array())
            for (const json& d : b["devices"]) {
                if (!d.is_object()) continue;
                QString line = QStringLiteral("  [%1] %2, %3").arg(int(num(d, "index"))).arg(str(d, "name"),
                                                                                       formatBytes(num(d, "memory_total_bytes")));
                if (kind == QLatin1String("cuda")) {
                    line += QStringLiteral(", %1 SMs, compute capability %2").arg(int(num(d, "sm_count"))).arg(str(d, "compute_capability"));
                    const double bf16 = num(d, "peak_tflops_bf16");
                    line += bf16 > 0 ? QStringLiteral(", %1 bf16 TFLOP/s peak").arg(bf16, 0, 'f', 0)
                                     : QStringLiteral(", peak unknown (not in peak_flops.json)");
                } else if (d.contains("cores")) {
                    line += QStringLiteral(", %1 cores").arg(int(num(d, "cores")));
                }
                lines << line;
            }
        if (b.contains("topology") && b["topology"].is_object() && count > 1)
            lines << QStringLiteral("  topology:") << str(b["topology"], "text").trimmed();
        if (!str(b, "status").isEmpty()) lines << QStringLiteral("  note: ") + str(b, "status");
    }
    if (!str(deviceReport, "cuda").isEmpty()) lines << QStringLiteral("cuda: none (%1)").arg(str(deviceReport, "cuda"));
    return lines.join(QLatin1Char('\n'));
}

QString localAgentExecutable() {
    const QByteArray env = qgetenv("TRAINSCOPE_EXE");
    if (!env.isEmpty()) return QString::fromLocal8Bit(env);
    const QString dir = QCoreApplication::applicationDirPath();
    for (const QString& candidate : {dir + QStringLiteral("/trainscope"), dir + QStringLiteral("/../apps/trainscope"),
                                     dir + QStringLiteral("/../../apps/trainscope")}) {
        QFileInfo fi(candidate);
        if (fi.isFile() && fi.isExecutable()) return fi.canonicalFilePath();
    }
    const QString onPath = QStandardPaths::findExecutable(QStringLiteral("trainscope"));
    return onPath.isEmpty() ? QStringLiteral("trainscope") : onPath;
}

NodeSession::NodeSession(QObject* parent) : QObject(parent) {
    qRegisterMetaType<nlohmann::json>();
    qRegisterMetaType<ts::gui::NodeInfo>();
    // Calls block on the network; a fetch can take a while. Enough threads that a slow call
    // never holds up a cancel.
    m_pool.setMaxThreadCount(6);
    m_aliveTimer.setInterval(300);
    connect(&m_aliveTimer, &QTimer::timeout, this, &NodeSession::checkAlive);
}

NodeSession::~NodeSession() {
    ++*m_generation;
    if (m_client) m_client->close();
    m_pool.waitForDone();
    m_client.reset();
}

void NodeSession::connectTo(const QString& url, const QString& tokenFile) {
    disconnectFromNode();
    const uint64_t gen = ++*m_generation;
    m_state = State::Connecting;
    m_url = url;
    m_tokenFile = tokenFile;
    emit connecting(url);
    sessions::ConnectOptions options;
    options.clientName = "trainscope-gui";
    options.tokenFile = tokenFile.toStdString();
    if (url == QStringLiteral("local")) options.agentExe = localAgentExecutable().toStdString();
    auto generation = m_generation;
    QPointer<NodeSession> self(this);
    m_pool.start([this, self, gen, generation, options, url] {
        auto connected = sessions::NodeClient::connect(url.toStdString(), options);
        std::shared_ptr<sessions::NodeClient> client;
        NodeInfo info;
        QString error;
        if (!connected) {
            error = QString::fromStdString(connected.status().message());
        } else {
            client = std::shared_ptr<sessions::NodeClient>(std::move(connected).value());
            const json& hello = client->helloResult();
            info.url = url;
            info.host = QString::fromStdString(hello.value("host", std::string()));
            info.node = QString::fromStdString(hello.value("node", std::string()));
            info.agentVersion = QString::fromStdString(hello.value("version", std::string()));
            info.workspace = QString::fromStdString(hello.value("workspace", std::string()));
            info.agentPid = hello.value("pid", qint64(0));
            if (auto devices = client->call("devices", json::object(), 30000)) {
                info.backend = QString::fromStdString(devices->value("backend", std::string()));
                if (devices->is_object()) info.deviceReport = *devices;
                if (devices->contains("devices") && (*devices)["devices"].is_array()) info.devices = (*devices)["devices"];
            } else {
                error = QStringLiteral("devices: ") + QString::fromStdString(devices.status().message());
            }
            if (error.isEmpty()) {
                if (auto knobs = client->call("knobs", json::object(), 30000)) {
                    info.knobs = *knobs;
                } else {
                    error = QStringLiteral("the node's agent does not describe its knobs (%1); update trainscope on the node")
                                .arg(QString::fromStdString(knobs.status().message()));
                }
            }
            if (!error.isEmpty()) client->close();
        }
        if (generation->load() != gen) {
            if (client) client->close();
            return;
        }
        QMetaObject::invokeMethod(this, [self, gen, generation, client, info, error, url] {
            if (!self || generation->load() != gen) {
                if (client) client->close();
                return;
            }
            if (!error.isEmpty()) {
                self->m_state = State::Idle;
                emit self->connectionFailed(url, error);
                return;
            }
            self->m_client = client;
            self->m_info = info;
            self->m_state = State::Connected;
            // The handler runs on the client's reader thread: hop to the UI thread, and drop
            // what arrives for a connection that has been replaced.
            client->setNotificationHandler([self, gen, generation](const std::string& method, const json& params) {
                if (generation->load() != gen) return;
                QMetaObject::invokeMethod(self.data(), [self, gen, generation, m = QString::fromStdString(method), params] {
                    if (self && generation->load() == gen) emit self->notification(m, params);
                }, Qt::QueuedConnection);
            });
            self->m_aliveTimer.start();
            emit self->connected(self->m_info);
        }, Qt::QueuedConnection);
    });
}

void NodeSession::disconnectFromNode() {
    ++*m_generation;
    m_aliveTimer.stop();
    if (m_client) {
        auto client = m_client;
        m_client.reset();
        // close() joins the reader thread; keep it off the UI thread.
        m_pool.start([client] { client->close(); });
    }
    m_state = State::Idle;
}

void NodeSession::checkAlive() {
    if (m_state != State::Connected || !m_client || m_client->connected()) return;
    m_aliveTimer.stop();
    ++*m_generation;
    auto client = m_client;
    m_client.reset();
    m_state = State::Idle;
    m_pool.start([client] { client->close(); });
    emit disconnected(m_url, QStringLiteral("the node closed the connection (agent stopped, ssh dropped or network "
                                            "lost); runs it was doing go on and are listed after a reconnect"));
}

void NodeSession::request(const QString& method, json params, QObject* context, Callback done, int timeoutMs) {
    QPointer<QObject> ctx(context);
    if (!m_client) {
        Result<json> r = Status::comm("not connected to a node");
        QMetaObject::invokeMethod(this, [ctx, done, r] { if (ctx && done) done(r); }, Qt::QueuedConnection);
        return;
    }
    auto client = m_client;
    const uint64_t gen = m_generation->load();
    auto generation = m_generation;
    QPointer<NodeSession> self(this);
    m_pool.start([this, self, client, gen, generation, ctx, done, m = method.toStdString(), params = std::move(params), timeoutMs] {
        Result<json> r = client->call(m, params, timeoutMs);
        QMetaObject::invokeMethod(this, [self, ctx, done, r, gen, generation] {
            if (!self || !ctx || generation->load() != gen || !done) return;
            done(r);
        }, Qt::QueuedConnection);
    });
}

void NodeSession::fetchRun(const QString& runId, const QString& destPath, QObject* context,
                           std::function<void(const Status&)> done) {
    QPointer<QObject> ctx(context);
    if (!m_client) {
        QMetaObject::invokeMethod(this, [ctx, done] { if (ctx && done) done(Status::comm("not connected to a node")); },
                                  Qt::QueuedConnection);
        return;
    }
    auto client = m_client;
    QPointer<NodeSession> self(this);
    m_pool.start([this, self, client, ctx, done, id = runId.toStdString(), dest = destPath.toStdString()] {
        QDir().mkpath(QFileInfo(QString::fromStdString(dest)).absolutePath());
        Status st = client->fetchRun(id, dest);
        QMetaObject::invokeMethod(this, [self, ctx, done, st] {
            if (self && ctx && done) done(st);
        }, Qt::QueuedConnection);
    });
}

}  // namespace ts::gui
