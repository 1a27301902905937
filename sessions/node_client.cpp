// NodeClient: JSON-RPC client over a child's pipes (local / ssh) or a TCP socket, and
// runOnNode() built on it (see node_client.h).
#include "sessions/node_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "profiler/store.h"
#include "sessions/agent.h"
#include "sessions/jsonrpc.h"
#include "sessions/process.h"

namespace ts::sessions {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string envOr(const char* name, const std::string& fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::string(v) : fallback;
}

// What a node sends is input like any other: fields are read by type, never with json::value()
// (which throws when a field has another type than the fallback).
std::string strField(const json& j, const char* key) {
    if (!j.is_object()) return "";
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

int64_t intField(const json& j, const char* key, int64_t fallback) {
    if (!j.is_object()) return fallback;
    auto it = j.find(key);
    if (it == j.end()) return fallback;
    if (it->is_number_integer()) return it->get<int64_t>();
    return fallback;
}

Result<int> connectTcp(const std::string& hostPort, int timeoutMs) {
    if (hostPort.find(':') == std::string::npos)
        return Status::invalid("tcp://" + hostPort + " needs a port: tcp://HOST:PORT");
    std::string host;
    int portNum = 0;
    Status parsed = parseHostPort(hostPort, /*allowZero=*/false, &host, &portNum);
    if (!parsed) return Status::invalid("tcp://" + hostPort + ": " + parsed.message());
    if (host.empty()) host = "127.0.0.1";
    const std::string port = std::to_string(portNum);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
        return Status::notFound("cannot resolve '" + host + "': " + gai_strerror(rc));
    std::string lastErr = "no address";
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (fd < 0) continue;
        int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            pollfd p{fd, POLLOUT, 0};
            if (::poll(&p, 1, timeoutMs) == 1) {
                int err = 0;
                socklen_t len = sizeof err;
                ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                rc = err == 0 ? 0 : -1;
                errno = err;
            } else {
                errno = ETIMEDOUT;
            }
        }
        if (rc == 0) {
            int flags = ::fcntl(fd, F_GETFL);
            ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
            ::freeaddrinfo(res);
            return fd;
        }
        lastErr = std::strerror(errno);
        ::close(fd);
    }
    ::freeaddrinfo(res);
    return Status::comm("cannot connect to " + hostPort + ": " + lastErr +
                        " (is `trainscope agent --listen` running there?)");
}

}  // namespace

struct NodeClient::Impl {
    ChildProcess child;
    bool isChild = false;
    int inFd = -1, outFd = -1;  // we read inFd, write outFd (same socket for TCP)
    std::mutex writeMu;
    std::mutex mu;
    std::condition_variable cv;
    int64_t nextId = 0;
    std::map<int64_t, std::optional<json>> pending;
    bool closed = false;
    std::string closeReason;
    std::atomic<bool> stop{false};
    std::thread reader;
    NotificationHandler handler;
    json lastErrorData;  // error.data of the last error response (guarded by mu)

    // fetch_run sink (one fetch at a time per client)
    struct Sink {
        std::string runId;
        std::ofstream* out = nullptr;
        int64_t bytes = 0;
        uint64_t hash = rpc::kFnv1a64Offset;
        std::string error;
    };
    std::optional<Sink> sink;

    void readLoop() {
        rpc::FrameReader fr(size_t(256) << 20);
        std::vector<char> buf(64 * 1024);
        std::string why = "the node closed the connection";
        while (!stop) {
            pollfd p{inFd, POLLIN, 0};
            int pr = ::poll(&p, 1, 200);
            if (pr < 0 && errno != EINTR) break;
            if (pr <= 0) continue;
            ssize_t n = ::read(inFd, buf.data(), buf.size());
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (n <= 0) break;
            fr.feed(buf.data(), size_t(n));
            for (;;) {
                rpc::FrameEvent ev = fr.next();
                if (ev.kind == rpc::FrameEvent::Kind::None) break;
                if (ev.kind == rpc::FrameEvent::Kind::Error) continue;
                for (auto& m : rpc::parseMessages(ev.body)) deliver(std::move(m));
            }
        }
        std::lock_guard lock(mu);
        closed = true;
        closeReason = why;
        cv.notify_all();
    }

    void deliver(rpc::Message m) {
        if (m.kind == rpc::Message::Kind::Response) {
            json r = json::object();
            r["result"] = std::move(m.result);
            r["error"] = std::move(m.error);
            std::lock_guard lock(mu);
            if (m.id.is_null()) {
                // An error with a null id: the agent could not read our request or refused the
                // connection. Fail every pending call with it.
                for (auto& [id, slot] : pending)
                    if (!slot) slot = r;
            } else if (m.id.is_number_integer()) {
                auto it = pending.find(m.id.get<int64_t>());
                if (it != pending.end()) it->second = std::move(r);
            }
            cv.notify_all();
            return;
        }
        if (m.kind != rpc::Message::Kind::Notification) return;
        if (m.method == "run_chunk" && m.params.is_object()) {
            std::lock_guard lock(mu);
            if (sink && strField(m.params, "run_id") == sink->runId) {
                std::string data;
                if (!rpc::base64Decode(strField(m.params, "data"), &data)) {
                    sink->error = "bad chunk data";
                } else if (intField(m.params, "offset", -1) != sink->bytes) {
                    sink->error = "chunk out of order";
                } else {
                    sink->out->write(data.data(), std::streamsize(data.size()));
                    sink->bytes += int64_t(data.size());
                    sink->hash = rpc::fnv1a64(data, sink->hash);
                }
                return;
            }
        }
        NotificationHandler h;
        {
            std::lock_guard lock(mu);
            h = handler;
        }
        if (h) h(m.method, m.params);
    }
};

NodeClient::NodeClient() : m(std::make_unique<Impl>()) {}

NodeClient::~NodeClient() { close(); }

bool NodeClient::connected() const {
    std::lock_guard lock(m->mu);
    return !m->closed;
}

void NodeClient::setNotificationHandler(NotificationHandler handler) {
    std::lock_guard lock(m->mu);
    m->handler = std::move(handler);
}

void NodeClient::close() {
    if (!m || m->stop.exchange(true)) return;
    if (m->isChild) {
        m->child.closeStdin();  // the agent sees EOF and exits once its runs are finalised
    } else if (m->inFd >= 0) {
        ::shutdown(m->inFd, SHUT_RDWR);
    }
    if (m->reader.joinable()) m->reader.join();
    if (m->isChild) {
        // Reap the agent if it exits promptly; an agent still finishing a run is left to finish.
        for (int i = 0; i < 20 && !m->child.tryWait(nullptr); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } else if (m->inFd >= 0) {
        ::close(m->inFd);
    }
    m->inFd = m->outFd = -1;
    std::lock_guard lock(m->mu);
    m->closed = true;
    m->cv.notify_all();
}

Result<json> NodeClient::call(const std::string& method, const json& params, int timeoutMs) {
    int64_t id;
    {
        std::lock_guard lock(m->mu);
        if (m->closed) return Status::comm("not connected to " + m_url + ": " + m->closeReason);
        id = ++m->nextId;
        m->pending[id] = std::nullopt;
    }
    std::string frame = rpc::encodeFrame(rpc::makeRequest(id, method, params));
    {
        std::lock_guard lock(m->writeMu);
        Status s = writeAll(m->outFd, frame.data(), frame.size());
        if (!s) {
            std::lock_guard l2(m->mu);
            m->pending.erase(id);
            return Status::comm("sending " + method + " to " + m_url + ": " + s.message());
        }
    }
    std::unique_lock lock(m->mu);
    auto ready = [&] { return m->pending[id].has_value() || m->closed; };
    if (timeoutMs < 0) {
        m->cv.wait(lock, ready);
    } else if (!m->cv.wait_for(lock, std::chrono::milliseconds(timeoutMs), ready)) {
        m->pending.erase(id);
        return Status::timeout(method + " to " + m_url + " got no answer within " + std::to_string(timeoutMs) + " ms");
    }
    std::optional<json> resp = std::move(m->pending[id]);
    m->pending.erase(id);
    if (!resp) return Status::comm(method + ": connection to " + m_url + " closed (" + m->closeReason + ")");
    if (resp->contains("error") && !(*resp)["error"].is_null()) {
        const json& e = (*resp)["error"];
        m->lastErrorData = e.is_object() && e.contains("data") ? e["data"] : json();
        int code = int(std::clamp<int64_t>(intField(e, "code", 0), INT32_MIN, INT32_MAX));
        std::string msg = strField(e, "message");
        if (msg.empty()) msg = "error";
        ErrorCode ec = code == rpc::kUnauthorized ? ErrorCode::InvalidArgument
                       : code == rpc::kRunNotFound ? ErrorCode::NotFound
                       : code == rpc::kInvalidConfig || code == rpc::kInvalidParams ? ErrorCode::InvalidArgument
                       : ErrorCode::CommError;
        return Status(ec, method + " on " + m_url + ": " + msg + " (JSON-RPC error " + std::to_string(code) + ")");
    }
    if (auto it = resp->find("result"); it != resp->end()) return std::move(*it);
    return json();
}

Result<std::unique_ptr<NodeClient>> NodeClient::connect(const std::string& url, const ConnectOptions& o) {
    // A TCP agent that throttles failed authentications from this address says how long to
    // wait (error.data.retry_after_ms); wait and try again within the connect timeout.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.connectTimeoutMs);
    for (int attempt = 0;; ++attempt) {
        int64_t retryAfterMs = 0;
        auto c = connectOnce(url, o, &retryAfterMs);
        if (c || retryAfterMs <= 0 || attempt >= 5 ||
            std::chrono::steady_clock::now() + std::chrono::milliseconds(retryAfterMs) > deadline)
            return c;
        std::this_thread::sleep_for(std::chrono::milliseconds(retryAfterMs));
    }
}

Result<std::unique_ptr<NodeClient>> NodeClient::connectOnce(const std::string& url, const ConnectOptions& o,
                                                             int64_t* retryAfterMs) {
    std::unique_ptr<NodeClient> c(new NodeClient());
    c->m_url = url.empty() ? "local" : url;
    std::string token;
    if (url.empty() || url == "local" || url.rfind("ssh://", 0) == 0) {
        std::vector<std::string> argv;
        if (url.rfind("ssh://", 0) == 0) {
            std::string host = url.substr(6);
            while (!host.empty() && host.back() == '/') host.pop_back();
            if (host.empty()) return Status::invalid("ssh:// needs a host: ssh://HOST");
            argv = splitCommand(o.sshCommand.empty() ? envOr("TRAINSCOPE_SSH", "ssh") : o.sshCommand);
            argv.push_back(host);
            argv.push_back(o.remoteCommand.empty() ? envOr("TRAINSCOPE_REMOTE_AGENT", "trainscope agent --stdio")
                                                   : o.remoteCommand);
        } else {
            std::string exe = o.agentExe.empty() ? selfExePath() : o.agentExe;
            argv = {exe, "agent", "--stdio"};
            argv.insert(argv.end(), o.localAgentArgs.begin(), o.localAgentArgs.end());
        }
        SpawnOptions so;
        so.pipeStdin = true;
        so.pipeStdout = true;
        so.pipeStderr = false;       // the agent's diagnostics go to our stderr
        so.newProcessGroup = true;   // Ctrl-C in our terminal must not kill the node's runs
        auto child = ChildProcess::spawn(argv, so);
        if (!child) return child.status().withContext("starting the agent for " + c->m_url);
        c->m->child = std::move(*child);
        c->m->isChild = true;
        c->m->inFd = c->m->child.stdoutFd();
        c->m->outFd = c->m->child.stdinFd();
    } else if (url.rfind("tcp://", 0) == 0) {
        TS_ASSIGN_OR_RETURN(int fd, connectTcp(url.substr(6), o.connectTimeoutMs));
        c->m->inFd = c->m->outFd = fd;
        token = o.token.empty() ? envOr("TRAINSCOPE_TOKEN", "") : o.token;
        if (token.empty()) {
            std::string file = o.tokenFile.empty() ? envOr("TRAINSCOPE_TOKEN_FILE", "") : o.tokenFile;
            if (file.empty()) {
                ::close(fd);
                return Status::invalid("tcp:// nodes need a token: --token-file FILE or $TRAINSCOPE_TOKEN_FILE");
            }
            auto t = readTokenFile(file);
            if (!t) {
                ::close(fd);
                return t.status();
            }
            token = *t;
        }
    } else {
        return Status::invalid("unknown node '" + url + "'; use local, ssh://HOST or tcp://HOST:PORT");
    }
    c->m->reader = std::thread([impl = c->m.get()] { impl->readLoop(); });
    json params = {{"client", o.clientName}, {"protocol_version", kProtocolVersion}};
    if (!token.empty()) params["token"] = token;
    auto hello = c->call("hello", params, o.connectTimeoutMs);
    if (!hello) {
        std::lock_guard lock(c->m->mu);
        *retryAfterMs = intField(c->m->lastErrorData, "retry_after_ms", 0);
        return hello.status().withContext("connecting to " + c->m_url);
    }
    if (intField(*hello, "protocol_version", 0) != kProtocolVersion)
        return Status::unsupported("node " + c->m_url + " speaks protocol version " +
                                   std::to_string(intField(*hello, "protocol_version", 0)) + ", this client " +
                                   std::to_string(kProtocolVersion) + "; install the same trainscope version there");
    c->m_hello = *hello;
    return c;
}

Status NodeClient::fetchRun(const std::string& runId, const std::string& destPath) {
    const std::string part = destPath + ".part";
    std::ofstream out(part, std::ios::binary | std::ios::trunc);
    if (!out) return Status::io("cannot write " + part);
    {
        std::lock_guard lock(m->mu);
        if (m->sink) return Status::invalid("another fetch_run is in progress on this connection");
        m->sink = Impl::Sink{runId, &out};
    }
    auto r = call("fetch_run", {{"run_id", runId}});
    Impl::Sink sink;
    {
        std::lock_guard lock(m->mu);
        sink = *m->sink;
        m->sink.reset();
    }
    out.close();
    std::error_code ec;
    auto fail = [&](Status s) {
        fs::remove(part, ec);
        return s;
    };
    if (!r) return fail(r.status());
    if (!sink.error.empty()) return fail(Status::comm("fetching run " + runId + ": " + sink.error));
    char hex[20];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(sink.hash));
    if (intField(*r, "size", -1) != sink.bytes || strField(*r, "fnv1a64") != hex)
        return fail(Status::comm("fetching run " + runId + ": received " + std::to_string(sink.bytes) +
                                 " bytes that do not match the node's size/checksum; try again"));
    fs::rename(part, destPath, ec);
    if (ec) return fail(Status::io("cannot move " + part + " to " + destPath + ": " + ec.message()));
    return Status::ok();
}

Result<NodeRunResult> runOnNode(const NodeRunRequest& req,
                                const std::function<void(const std::string&, const json&)>& onEvent) {
    TS_ASSIGN_OR_RETURN(Workspace ws, Workspace::open(req.workspaceDir));
    TS_ASSIGN_OR_RETURN(auto client, NodeClient::connect(req.nodeUrl, req.connect));

    // Notifications may arrive before start_run's response tells us the run id: buffer them.
    struct Shared {
        std::mutex mu;
        std::condition_variable cv;
        std::string runId;
        std::vector<std::pair<std::string, json>> early;
        bool finished = false;
        json finishedParams;
    } sh;
    auto handle = [&](const std::string& method, const json& p) {
        if (onEvent) onEvent(method, p);
        if (method == "run_finished") {
            sh.finished = true;
            sh.finishedParams = p;
            sh.cv.notify_all();
        }
    };
    client->setNotificationHandler([&](const std::string& method, const json& p) {
        std::unique_lock lock(sh.mu);
        if (sh.runId.empty()) {
            sh.early.emplace_back(method, p);
            return;
        }
        if (strField(p, "run_id") == sh.runId) handle(method, p);
    });
    json params = {{"yaml", req.configYaml}};
    if (!req.overrides.empty()) params["set"] = req.overrides;
    if (req.steps > 0) params["steps"] = req.steps;
    if (!req.name.empty()) params["name"] = req.name;
    auto started = client->call("start_run", params);
    if (!started) return started.status();
    const std::string runId = strField(*started, "run_id");
    // The id names a file here: only the grammar this project generates is accepted.
    if (!isValidRunId(runId))
        return Status::comm("node " + client->url() + " answered start_run with an invalid run id " +
                            json(runId.substr(0, 64)).dump(-1, ' ', false, json::error_handler_t::replace) +
                            "; expected 1..128 characters of A-Z a-z 0-9 . _ - (not starting with . or -)");
    {
        std::unique_lock lock(sh.mu);
        sh.runId = runId;
        for (auto& [method, p] : sh.early)
            if (strField(p, "run_id") == runId) handle(method, p);
        sh.early.clear();
        while (!sh.finished && client->connected()) sh.cv.wait_for(lock, std::chrono::milliseconds(200));
        if (!sh.finished)
            return Status::comm("lost the connection to " + client->url() + " while run " + runId +
                                " was running; the node keeps it: list it with list_runs and fetch it later");
    }
    NodeRunResult out;
    out.remoteRunId = runId;
    out.status = strField(sh.finishedParams, "status");
    out.reason = strField(sh.finishedParams, "reason");
    std::string dest = ws.runsDir() + "/" + runId + ".sqlite";
    std::error_code ec;
    if (strField(client->helloResult(), "workspace") == ws.dir() && strField(*started, "run_file") == dest) {
        // The node shares our workspace (a local agent started with it): the run is already here.
        client->close();
        TS_RETURN_IF_ERROR(ws.indexRun(dest));
        TS_ASSIGN_OR_RETURN(out.run, ws.findRun(dest));
        return out;
    }
    if (fs::exists(dest, ec)) {
        TS_ASSIGN_OR_RETURN(dest, ws.newRunFile(req.name));
    }
    TS_RETURN_IF_ERROR(client->fetchRun(runId, dest));
    client->close();
    if (req.nodeUrl != "local" && !req.nodeUrl.empty()) {
        // Record where the run ran, as the user named the node.
        auto store = profiler::TraceStore::open(dest, /*readOnly=*/false);
        if (store) {
            auto info = (*store)->runInfo();
            if (info) {
                info->node = req.nodeUrl;
                (void)(*store)->setRunInfo(*info);
            }
        }
    }
    TS_RETURN_IF_ERROR(ws.indexRun(dest));
    TS_ASSIGN_OR_RETURN(out.run, ws.findRun(dest));
    return out;
}

}  // namespace ts::sessions
