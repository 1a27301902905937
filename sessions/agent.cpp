// The node agent (see agent.h and docs/protocol.md): connection loops, method dispatch, runs
// as child processes, finalisation of run files after a child ends.
#include "sessions/agent.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "engine/config/knobs.h"
#include "profiler/store.h"
#include "sessions/knobs_json.h"
#include "sessions/process.h"
#include "sessions/workspace.h"

namespace ts::sessions {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// A method's outcome: a result, or a JSON-RPC error.
struct Reply {
    json result;
    int code = 0;
    std::string message;
    json data;
    bool closeAfter = false;  // close the connection after sending (auth failure, shutdown)

    static Reply ok(json r) { Reply x; x.result = std::move(r); return x; }
    static Reply err(int code, std::string m, json d = nullptr) {
        Reply x;
        x.code = code;
        x.message = std::move(m);
        x.data = std::move(d);
        return x;
    }
};

std::string hostName() {
    char buf[256] = {0};
    if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
    return buf;
}

// FNV-1a 64: a cheap end-to-end check for fetched run files (not a security measure).
uint64_t fnv1a(const std::string& data, uint64_t h = 1469598103934665603ull) {
    for (unsigned char c : data) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

std::string hex64(uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

json issuesToJson(const std::vector<engine::ConfigIssue>& issues) {
    json out = json::array();
    for (const auto& i : issues)
        out.push_back({{"knob", i.knob}, {"line", i.line}, {"message", i.message}, {"text", i.toString()}});
    return out;
}

// Reads the config from request params: "config" (object in configToJson form, or YAML text)
// or "yaml" (text), then "set" overrides ["key=value", ...].
struct ParsedConfig {
    engine::Config config;
    std::vector<engine::ConfigIssue> issues;
    std::string error;  // params shape error (-> invalid params)
};

ParsedConfig configFromParams(const json& params) {
    ParsedConfig out;
    if (!params.is_object()) {
        out.error = "params must be an object with \"config\" (object) or \"yaml\" (text)";
        return out;
    }
    const json* cfg = params.contains("config") ? &params["config"] : nullptr;
    const json* yaml = params.contains("yaml") ? &params["yaml"] : nullptr;
    if (cfg && cfg->is_object()) {
        auto c = engine::configFromJson(*cfg);
        if (!c) {
            out.issues.push_back({"", 0, "", c.status().message()});
            return out;
        }
        out.config = *c;
    } else if ((cfg && cfg->is_string()) || (yaml && yaml->is_string())) {
        const std::string text = cfg && cfg->is_string() ? cfg->get<std::string>() : yaml->get<std::string>();
        auto loaded = engine::parseConfigYaml(text, "config");
        out.config = loaded.config;
        out.issues = loaded.issues;
        if (!out.issues.empty()) return out;
    } else {
        out.error = "params need \"config\" (an object of knob: value, or YAML text) or \"yaml\" (text)";
        return out;
    }
    if (params.contains("set")) {
        if (!params["set"].is_array()) {
            out.error = "\"set\" must be an array of \"key=value\" strings";
            return out;
        }
        for (const auto& kv : params["set"]) {
            if (!kv.is_string()) {
                out.error = "\"set\" must be an array of \"key=value\" strings";
                return out;
            }
            Status s = engine::applyOverride(out.config, kv.get<std::string>());
            if (!s) out.issues.push_back({"", 0, "", s.message()});
        }
    }
    if (out.issues.empty()) out.issues = engine::validateConfig(out.config);
    return out;
}

}  // namespace

// ---- shared state ------------------------------------------------------------------------

struct Connection {
    int in = -1, out = -1;
    bool requireAuth = false;
    bool authed = false;
    std::mutex writeMu;
    std::atomic<bool> alive{true};

    void send(const json& message) {
        if (!alive) return;
        std::string frame = rpc::encodeFrame(message);
        std::lock_guard lock(writeMu);
        if (!writeAll(out, frame.data(), frame.size())) alive = false;
    }
};

struct RunState {
    std::string id, path, configPath, name, createdAt;
    json configJson;
    std::mutex mu;          // guards child signalling vs reaping, and the fields below
    ChildProcess child;
    bool killed = false;
    std::atomic<bool> cancel{false};
    std::atomic<bool> finished{false};
    Clock::time_point cancelAt;
    std::vector<std::weak_ptr<Connection>> subscribers;
    json lastProgress;
    std::string status = "running", reason;
    std::thread reader;
};

struct Agent::Impl {
    Agent* self = nullptr;
    std::unique_ptr<Workspace> ws;
    mutable std::mutex mu;
    std::condition_variable runsCv;
    std::map<std::string, std::shared_ptr<RunState>> runs;  // active and finished (id -> state)
    struct ConnThread {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
        std::shared_ptr<Connection> conn;
    };
    std::vector<ConnThread> connThreads;
    std::vector<std::weak_ptr<Connection>> conns;

    Reply dispatch(Connection& conn, const std::shared_ptr<Connection>& self, const rpc::Message& m);
    Reply hello(Connection& conn, const json& params);
    Reply authenticate(Connection& conn, const json& params);
    Reply devices();
    Reply validate(const json& params);
    Reply startRun(const std::shared_ptr<Connection>& conn, const json& params);
    Reply cancel(const json& params);
    Reply watch(const std::shared_ptr<Connection>& conn, const json& params);
    Reply listRuns();
    Reply updateRun(const json& p);
    Reply deleteRun(const json& p);
    Reply fetchRun(Connection& conn, const json& params);
    Reply shutdown();

    void notify(RunState& run, const std::string& method, const json& params);
    void runLoop(std::shared_ptr<RunState> run);
    void finalize(RunState& run, int waitStatus, const std::string& endStatus,
                  const std::string& endReason, const std::deque<std::string>& stderrTail);
    Result<std::string> runPath(const std::string& key);
    void cancelAll();
};

// ---- creation, lifetime ------------------------------------------------------------------

Result<std::unique_ptr<Agent>> Agent::create(AgentOptions options) {
    // A client that goes away must not kill the agent with SIGPIPE (pipes; sockets use
    // MSG_NOSIGNAL). Process-wide on purpose: the agent is the program.
    ::signal(SIGPIPE, SIG_IGN);
    TS_ASSIGN_OR_RETURN(Workspace ws, Workspace::open(options.workspaceDir));
    if (options.runnerCommand.empty()) {
        std::string exe = selfExePath();
        if (exe.empty()) return Status::internal("cannot find this program's path (/proc/self/exe)");
        options.runnerCommand = {exe};
    }
    if (options.nodeName.empty()) options.nodeName = hostName();
    std::unique_ptr<Agent> a(new Agent());
    a->m_options = std::move(options);
    a->m = std::make_unique<Impl>();
    a->m->self = a.get();
    a->m->ws = std::make_unique<Workspace>(std::move(ws));
    return a;
}

Agent::~Agent() {
    m_shutdown = true;
    if (m) {
        m->cancelAll();
        waitForRuns();
        std::vector<std::shared_ptr<RunState>> runs;
        {
            std::lock_guard lock(m->mu);
            for (auto& [id, r] : m->runs) runs.push_back(r);
        }
        for (auto& r : runs)
            if (r->reader.joinable()) r->reader.join();
        for (auto& c : m->connThreads)
            if (c.thread.joinable()) c.thread.join();
    }
    if (m_listenFd >= 0) ::close(m_listenFd);
}

void Agent::requestShutdown() {
    m_shutdown = true;
    m->cancelAll();
}

int Agent::activeRuns() const {
    std::lock_guard lock(m->mu);
    int n = 0;
    for (auto& [id, r] : m->runs) n += r->finished ? 0 : 1;
    return n;
}

void Agent::waitForRuns() {
    std::unique_lock lock(m->mu);
    m->runsCv.wait(lock, [&] {
        for (auto& [id, r] : m->runs)
            if (!r->finished) return false;
        return true;
    });
}

void Agent::Impl::cancelAll() {
    std::lock_guard lock(mu);
    for (auto& [id, r] : runs) {
        if (r->finished) continue;
        std::lock_guard rl(r->mu);
        if (!r->cancel.exchange(true)) {
            r->cancelAt = Clock::now();
            r->child.signal(SIGTERM);
        }
    }
}

// ---- connection loop ---------------------------------------------------------------------

Status Agent::serve(int inFd, int outFd, bool requireAuth) {
    auto conn = std::make_shared<Connection>();
    conn->in = inFd;
    conn->out = outFd;
    conn->requireAuth = requireAuth;
    {
        std::lock_guard lock(m->mu);
        m->conns.push_back(conn);
    }
    rpc::FrameReader reader(m_options.maxMessageBytes);
    std::vector<char> buf(64 * 1024);
    bool closing = false;
    Status result;
    while (!closing && !m_shutdown && conn->alive) {
        pollfd p{inFd, POLLIN, 0};
        int pr = ::poll(&p, 1, 200);  // wake up regularly to notice shutdown
        if (pr < 0 && errno != EINTR) {
            result = Status::io(std::string("poll: ") + std::strerror(errno));
            break;
        }
        if (pr <= 0) continue;
        ssize_t n = ::read(inFd, buf.data(), buf.size());
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) break;  // EOF or error: the client went away
        reader.feed(buf.data(), size_t(n));
        for (;;) {
            rpc::FrameEvent ev = reader.next();
            if (ev.kind == rpc::FrameEvent::Kind::None) break;
            if (ev.kind == rpc::FrameEvent::Kind::Error) {
                conn->send(rpc::makeError(nullptr, ev.errorCode, ev.error));
                // Before authentication, garbage is not given a second chance.
                if (conn->requireAuth && !conn->authed) closing = true;
                continue;
            }
            bool batch = false;
            std::vector<rpc::Message> msgs = rpc::parseMessages(ev.body, &batch);
            json responses = json::array();
            for (const auto& msg : msgs) {
                if (msg.kind == rpc::Message::Kind::Response) continue;  // we never send requests
                if (msg.kind == rpc::Message::Kind::Invalid) {
                    responses.push_back(rpc::makeError(msg.id, msg.errorCode, msg.errorMessage));
                    if (conn->requireAuth && !conn->authed) closing = true;
                    continue;
                }
                Reply r = m->dispatch(*conn, conn, msg);
                if (msg.kind == rpc::Message::Kind::Request) {
                    responses.push_back(r.code == 0 ? rpc::makeResult(msg.id, r.result)
                                                    : rpc::makeError(msg.id, r.code, r.message, r.data));
                }
                if (r.closeAfter) {
                    closing = true;
                    break;
                }
            }
            if (!responses.empty()) conn->send(batch ? responses : responses[0]);
            if (closing) break;
        }
    }
    conn->alive = false;
    return result;
}

Reply Agent::Impl::dispatch(Connection& conn, const std::shared_ptr<Connection>& self, const rpc::Message& m) {
    const json& p = m.params;
    if (conn.requireAuth && !conn.authed && m.method != "hello" && m.method != "authenticate") {
        Reply r = Reply::err(rpc::kUnauthorized,
                             "not authenticated: the first request must be hello or authenticate with params.token");
        r.closeAfter = true;
        return r;
    }
    if (m.method == "hello") return hello(conn, p);
    if (m.method == "authenticate") return authenticate(conn, p);
    if (m.method == "devices") return devices();
    if (m.method == "validate") return validate(p);
    if (m.method == "start_run") return startRun(self, p);
    if (m.method == "cancel") return cancel(p);
    if (m.method == "watch") return watch(self, p);
    if (m.method == "list_runs") return listRuns();
    if (m.method == "knobs") return Reply::ok(knobRegistryJson());
    if (m.method == "update_run") return updateRun(p);
    if (m.method == "delete_run") return deleteRun(p);
    if (m.method == "fetch_run") return fetchRun(conn, p);
    if (m.method == "shutdown") return shutdown();
    return Reply::err(rpc::kMethodNotFound, "method '" + m.method + "' not found",
                      json{{"methods", {"hello", "authenticate", "devices", "knobs", "validate", "start_run", "cancel",
                                        "watch", "list_runs", "update_run", "delete_run", "fetch_run", "shutdown"}}});
}

// ---- methods -----------------------------------------------------------------------------

Reply Agent::Impl::authenticate(Connection& conn, const json& p) {
    const AgentOptions& o = self->m_options;
    if (!conn.requireAuth) {
        conn.authed = true;
        return Reply::ok({{"authenticated", true}});
    }
    const bool has = p.is_object() && p.contains("token") && p["token"].is_string();
    if (!has || !rpc::constantTimeEquals(p["token"].get<std::string>(), o.token)) {
        Reply r = Reply::err(rpc::kUnauthorized, has ? "wrong token" : "params.token is required on this connection");
        r.closeAfter = true;
        return r;
    }
    conn.authed = true;
    return Reply::ok({{"authenticated", true}});
}

Reply Agent::Impl::hello(Connection& conn, const json& p) {
    if (conn.requireAuth && !conn.authed) {
        Reply a = authenticate(conn, p);
        if (a.code != 0) return a;
    }
    const AgentOptions& o = self->m_options;
    json caps = {
        {"methods", {"hello", "authenticate", "devices", "knobs", "validate", "start_run", "cancel", "watch",
                     "list_runs", "update_run", "delete_run", "fetch_run", "shutdown"}},
        {"notifications", {"progress", "run_log", "run_finished", "run_chunk"}},
        {"max_message_bytes", o.maxMessageBytes},
        {"max_active_runs", o.maxActiveRuns},
        {"batch", true},
    };
    return Reply::ok({{"agent", "trainscope"}, {"version", o.version}, {"protocol_version", kProtocolVersion},
                      {"node", o.nodeName}, {"host", hostName()}, {"pid", int(::getpid())},
                      {"workspace", ws->dir()}, {"capabilities", caps}});
}

Reply Agent::Impl::devices() {
    const AgentOptions& o = self->m_options;
    try {
        return Reply::ok(o.devicesProvider ? o.devicesProvider() : probeCpuDevices());
    } catch (const std::exception& e) {
        return Reply::err(rpc::kInternalError, std::string("device probe failed: ") + e.what());
    }
}

Reply Agent::Impl::validate(const json& params) {
    ParsedConfig pc = configFromParams(params);
    if (!pc.error.empty()) return Reply::err(rpc::kInvalidParams, pc.error);
    json out = {{"ok", pc.issues.empty()}, {"issues", issuesToJson(pc.issues)}};
    if (pc.issues.empty()) out["unsupported"] = engine::unsupportedKnobs(pc.config);
    // Also with issues: the config as far as it was read (knobs with problems keep their
    // defaults), so an editor can show the file while it lists what is wrong.
    out["config"] = engine::configToJson(pc.config);
    return Reply::ok(out);
}

Reply Agent::Impl::startRun(const std::shared_ptr<Connection>& conn, const json& params) {
    const AgentOptions& o = self->m_options;
    if (self->m_shutdown) return Reply::err(rpc::kBusy, "the agent is shutting down");
    ParsedConfig pc = configFromParams(params);
    if (!pc.error.empty()) return Reply::err(rpc::kInvalidParams, pc.error);
    if (!pc.issues.empty()) {
        std::string first = pc.issues.front().toString();
        return Reply::err(rpc::kInvalidConfig, "invalid config: " + first +
                          (pc.issues.size() > 1 ? " (and " + std::to_string(pc.issues.size() - 1) + " more)" : ""),
                          json{{"issues", issuesToJson(pc.issues)}});
    }
    int steps = 0;
    if (params.contains("steps")) {
        if (!params["steps"].is_number_integer() || params["steps"].get<int64_t>() <= 0 ||
            params["steps"].get<int64_t>() > 1000000000)
            return Reply::err(rpc::kInvalidParams, "\"steps\" must be a positive integer");
        steps = params["steps"].get<int>();
    }
    std::string name = params.value("name", std::string());
    if (name.empty()) name = pc.config.name;
    {
        std::lock_guard lock(mu);
        int active = 0;
        for (auto& [id, r] : runs) active += r->finished ? 0 : 1;
        if (active >= o.maxActiveRuns)
            return Reply::err(rpc::kBusy, "this node already has " + std::to_string(active) +
                              " active runs (limit " + std::to_string(o.maxActiveRuns) + "); cancel one or wait");
    }
    auto pathR = ws->newRunFile(name);
    if (!pathR) return Reply::err(rpc::kRunFailedToStart, pathR.status().message());
    auto run = std::make_shared<RunState>();
    run->path = *pathR;
    run->id = fs::path(run->path).stem().string();
    run->name = name;
    run->createdAt = isoTimeUtcNow();
    run->configJson = engine::configToJson(pc.config);
    run->configPath = ws->tmpDir() + "/" + run->id + ".yaml";
    {
        std::ofstream f(run->configPath);
        f << engine::configToYaml(pc.config, /*onlyNonDefault=*/false);
        if (!f) return Reply::err(rpc::kRunFailedToStart, "cannot write " + run->configPath);
    }
    std::vector<std::string> argv = o.runnerCommand;
    argv.push_back("run");
    argv.push_back(run->configPath);
    argv.push_back("--json");
    argv.push_back("--run-file");
    argv.push_back(run->path);
    if (steps > 0) {
        argv.push_back("--steps");
        argv.push_back(std::to_string(steps));
    }
    if (!name.empty()) {
        argv.push_back("--name");
        argv.push_back(name);
    }
    SpawnOptions so;
    so.pipeStdout = true;
    so.pipeStderr = true;
    so.extraEnv.push_back("TRAINSCOPE_NODE=" + o.nodeName);
    auto child = ChildProcess::spawn(argv, so);
    if (!child) {
        std::error_code ec;
        fs::remove(run->configPath, ec);
        return Reply::err(rpc::kRunFailedToStart, child.status().message());
    }
    run->child = std::move(*child);
    if (conn) run->subscribers.push_back(conn);
    const pid_t pid = run->child.pid();
    {
        std::lock_guard lock(mu);
        runs[run->id] = run;
    }
    run->reader = std::thread([this, run] { runLoop(run); });
    return Reply::ok({{"run_id", run->id}, {"run_file", run->path}, {"pid", int(pid)}, {"name", name}});
}

Reply Agent::Impl::cancel(const json& params) {
    if (!params.is_object() || !params.contains("run_id") || !params["run_id"].is_string())
        return Reply::err(rpc::kInvalidParams, "params.run_id (string) is required");
    std::string id = params["run_id"];
    std::shared_ptr<RunState> run;
    {
        std::lock_guard lock(mu);
        auto it = runs.find(id);
        if (it != runs.end()) run = it->second;
    }
    if (!run) return Reply::err(rpc::kRunNotFound, "no run '" + id + "' was started by this agent");
    std::lock_guard rl(run->mu);
    if (run->finished) return Reply::ok({{"run_id", id}, {"status", run->status}, {"already_finished", true}});
    if (!run->cancel.exchange(true)) {
        run->cancelAt = Clock::now();
        run->child.signal(SIGTERM);
    }
    return Reply::ok({{"run_id", id}, {"status", "cancelling"}});
}

Reply Agent::Impl::watch(const std::shared_ptr<Connection>& conn, const json& params) {
    if (!params.is_object() || !params.contains("run_id") || !params["run_id"].is_string())
        return Reply::err(rpc::kInvalidParams, "params.run_id (string) is required");
    std::string id = params["run_id"];
    std::lock_guard lock(mu);
    auto it = runs.find(id);
    if (it == runs.end()) return Reply::err(rpc::kRunNotFound, "no run '" + id + "' was started by this agent");
    std::lock_guard rl(it->second->mu);
    if (!it->second->finished) it->second->subscribers.push_back(conn);
    return Reply::ok({{"run_id", id}, {"status", it->second->status}, {"progress", it->second->lastProgress}});
}

// Runs are named by id only: a peer never gets to name a path on this node.
namespace {
std::string runIdParam(const json& p, std::string* error) {
    if (!p.is_object() || !p.contains("run_id") || !p["run_id"].is_string()) {
        *error = "params.run_id (string) is required";
        return {};
    }
    std::string id = p["run_id"].get<std::string>();
    if (id.empty() || id.find('/') != std::string::npos || id.find('\\') != std::string::npos || id[0] == '.') {
        *error = "params.run_id '" + id + "' is not a run id";
        return {};
    }
    return id;
}
}  // namespace

Reply Agent::Impl::updateRun(const json& p) {
    std::string error;
    const std::string id = runIdParam(p, &error);
    if (!error.empty()) return Reply::err(rpc::kInvalidParams, error);
    if (p.contains("name") && !p["name"].is_string())
        return Reply::err(rpc::kInvalidParams, "params.name must be a string");
    for (const char* key : {"add_tags", "remove_tags"}) {
        if (!p.contains(key)) continue;
        if (!p[key].is_array()) return Reply::err(rpc::kInvalidParams, std::string("params.") + key + " must be an array of strings");
        for (const auto& t : p[key])
            if (!t.is_string() || t.get<std::string>().empty())
                return Reply::err(rpc::kInvalidParams, std::string("params.") + key + " must hold non-empty strings");
    }
    auto found = ws->findRun(id);
    if (!found || found->id != id) return Reply::err(rpc::kRunNotFound, "no run with id '" + id + "' in this node's workspace");
    if (p.contains("name")) {
        if (Status st = ws->rename(found->path, p["name"].get<std::string>()); !st.isOk())
            return Reply::err(rpc::kInternalError, st.message());
    }
    if (p.contains("add_tags"))
        for (const auto& t : p["add_tags"])
            if (Status st = ws->tag(found->path, t.get<std::string>()); !st.isOk())
                return Reply::err(rpc::kInternalError, st.message());
    if (p.contains("remove_tags"))
        for (const auto& t : p["remove_tags"])
            if (Status st = ws->untag(found->path, t.get<std::string>()); !st.isOk())
                return Reply::err(rpc::kInternalError, st.message());
    auto after = ws->findRun(found->path);
    if (!after) return Reply::err(rpc::kInternalError, after.status().message());
    return Reply::ok(after->toJson());
}

Reply Agent::Impl::deleteRun(const json& p) {
    std::string error;
    const std::string id = runIdParam(p, &error);
    if (!error.empty()) return Reply::err(rpc::kInvalidParams, error);
    auto found = ws->findRun(id);
    if (!found || found->id != id) return Reply::err(rpc::kRunNotFound, "no run with id '" + id + "' in this node's workspace");
    {
        std::lock_guard lock(mu);
        for (auto& [rid, r] : runs) {
            if (r->finished || r->path != found->path) continue;
            return Reply::err(rpc::kBusy, "run '" + id + "' is still running; cancel it first, then delete it");
        }
    }
    if (Status st = ws->remove(found->path); !st.isOk()) return Reply::err(rpc::kInternalError, st.message());
    return Reply::ok({{"run_id", id}, {"deleted", true}});
}

Reply Agent::Impl::listRuns() {
    auto list = ws->listRuns();
    if (!list) return Reply::err(rpc::kInternalError, list.status().message());
    json out = json::array();
    std::lock_guard lock(mu);
    std::vector<std::string> seen;
    // A run counts as running until its outcome is recorded (run.status leaves "running"
    // before run_finished is sent, so a client that lists runs on that notification sees it).
    auto stillRunning = [](RunState& r) {
        if (r.finished) return false;
        std::lock_guard rl(r.mu);
        return r.status == "running";
    };
    for (const auto& s : *list) {
        json j = s.toJson();
        for (auto& [id, r] : runs) {
            if (r->path != s.path || !stillRunning(*r)) continue;
            std::lock_guard rl(r->mu);
            j["status"] = "running";
            j["progress"] = r->lastProgress;
            j["id"] = r->id;
        }
        seen.push_back(s.path);
        out.push_back(std::move(j));
    }
    for (auto& [id, r] : runs) {
        if (!stillRunning(*r) || std::find(seen.begin(), seen.end(), r->path) != seen.end()) continue;
        std::lock_guard rl(r->mu);
        out.push_back({{"id", r->id}, {"name", r->name}, {"status", "running"}, {"path", r->path},
                       {"created_at", r->createdAt}, {"progress", r->lastProgress}});
    }
    return Reply::ok({{"runs", out}});
}

Result<std::string> Agent::Impl::runPath(const std::string& key) {
    {
        std::lock_guard lock(mu);
        auto it = runs.find(key);
        if (it != runs.end()) return it->second->path;
    }
    return ws->resolveRun(key);
}

Reply Agent::Impl::fetchRun(Connection& conn, const json& params) {
    if (!params.is_object() || !params.contains("run_id") || !params["run_id"].is_string())
        return Reply::err(rpc::kInvalidParams, "params.run_id (string) is required");
    const std::string id = params["run_id"];
    size_t chunk = 1u << 20;
    if (params.contains("chunk_bytes")) {
        if (!params["chunk_bytes"].is_number_integer() || params["chunk_bytes"].get<int64_t>() <= 0)
            return Reply::err(rpc::kInvalidParams, "\"chunk_bytes\" must be a positive integer");
        chunk = size_t(params["chunk_bytes"].get<int64_t>());
    }
    // base64 grows 4/3 and the envelope needs room: keep a chunk under 1/2 of the message limit.
    chunk = std::clamp<size_t>(chunk, 1024, self->m_options.maxMessageBytes / 2);
    auto path = runPath(id);
    if (!path) return Reply::err(rpc::kRunNotFound, path.status().message());
    // Consistent snapshot through SQLite's online backup (the run may still be writing).
    std::string snap = ws->tmpDir() + "/" + makeRunId("fetch") + ".sqlite";
    {
        sqlite3* src = nullptr;
        sqlite3* dst = nullptr;
        int rc = sqlite3_open_v2(path->c_str(), &src, SQLITE_OPEN_READONLY, nullptr);
        if (rc == SQLITE_OK) rc = sqlite3_open_v2(snap.c_str(), &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
        std::string err;
        if (rc == SQLITE_OK) {
            sqlite3_busy_timeout(src, 10000);
            sqlite3_backup* b = sqlite3_backup_init(dst, "main", src, "main");
            if (!b) {
                err = sqlite3_errmsg(dst);
            } else {
                rc = sqlite3_backup_step(b, -1);
                sqlite3_backup_finish(b);
                if (rc != SQLITE_DONE) err = sqlite3_errstr(rc);
            }
        } else {
            err = src ? sqlite3_errmsg(src) : "cannot open";
        }
        if (dst) {
            // The copy carries the WAL flag of its source; make it a self-contained file.
            sqlite3_exec(dst, "PRAGMA journal_mode=DELETE", nullptr, nullptr, nullptr);
            sqlite3_close(dst);
        }
        if (src) sqlite3_close(src);
        if (!err.empty()) {
            std::error_code ec;
            fs::remove(snap, ec);
            return Reply::err(rpc::kInternalError, "cannot snapshot run file " + *path + ": " + err);
        }
    }
    std::ifstream in(snap, std::ios::binary);
    uint64_t hash = 1469598103934665603ull;
    int64_t offset = 0;
    int chunks = 0;
    std::string buf(chunk, '\0');
    while (in && conn.alive) {
        in.read(buf.data(), std::streamsize(chunk));
        std::streamsize got = in.gcount();
        if (got <= 0) break;
        std::string piece(buf.data(), size_t(got));
        hash = fnv1a(piece, hash);
        conn.send(rpc::makeNotification("run_chunk", {{"run_id", id}, {"offset", offset},
                                                      {"data", rpc::base64Encode(piece.data(), piece.size())}}));
        offset += got;
        ++chunks;
    }
    in.close();
    std::error_code ec;
    fs::remove(snap, ec);
    return Reply::ok({{"run_id", id}, {"size", offset}, {"chunks", chunks}, {"fnv1a64", hex64(hash)}});
}

Reply Agent::Impl::shutdown() {
    self->requestShutdown();
    Reply r = Reply::ok({{"shutting_down", true}});
    r.closeAfter = true;
    return r;
}

// ---- runs --------------------------------------------------------------------------------

void Agent::Impl::notify(RunState& run, const std::string& method, const json& params) {
    std::vector<std::shared_ptr<Connection>> targets;
    {
        std::lock_guard rl(run.mu);
        for (auto& w : run.subscribers)
            if (auto c = w.lock(); c && c->alive) targets.push_back(c);
    }
    json msg = rpc::makeNotification(method, params);
    for (auto& c : targets) c->send(msg);
}

void Agent::Impl::runLoop(std::shared_ptr<RunState> run) {
    const AgentOptions& o = self->m_options;
    int outFd = run->child.stdoutFd(), errFd = run->child.stderrFd();
    std::string outBuf, errBuf;
    std::deque<std::string> stderrTail;
    std::string endStatus, endReason;
    std::unique_ptr<profiler::TraceStore> reader;  // read-only view for trace row counts
    Clock::time_point lastRowCount{};
    int waitStatus = -1;
    bool exited = false;
    Clock::time_point exitedAt{};

    auto handleOutLine = [&](const std::string& line) {
        if (line.empty()) return;
        json ev = json::parse(line, nullptr, false);
        if (!ev.is_object() || !ev.contains("event")) {
            notify(*run, "run_log", {{"run_id", run->id}, {"stream", "stdout"}, {"text", line}});
            return;
        }
        const std::string kind = ev.value("event", "");
        if (kind == "step") {
            json p = {{"run_id", run->id}};
            for (const char* k : {"step", "loss", "step_time_s", "tokens_per_s", "model_tflops",
                                  "peak_memory_bytes", "trace_rows", "grad_norm", "lr"})
                if (ev.contains(k)) p[k] = ev[k];
            if (!p.contains("trace_rows") && Clock::now() - lastRowCount > std::chrono::seconds(1)) {
                // The child does not report it: count rows in the run file (WAL: readers see
                // committed batches while the child writes).
                lastRowCount = Clock::now();
                if (!reader) {
                    auto r = profiler::TraceStore::open(run->path, true);
                    if (r) reader = std::move(*r);
                }
                if (reader) {
                    auto n = reader->sliceCount();
                    if (n) p["trace_rows"] = *n;
                }
            }
            {
                std::lock_guard rl(run->mu);
                run->lastProgress = p;
            }
            notify(*run, "progress", p);
        } else if (kind == "end") {
            endStatus = ev.value("status", "");
            if (ev.contains("reason") && ev["reason"].is_string()) endReason = ev["reason"];
        } else if (kind == "start") {
            json p = ev;
            p.erase("event");
            p["run_id"] = run->id;
            notify(*run, "run_started", p);
        }
    };
    auto drainLines = [&](std::string& buf, bool isErr) {
        size_t nl;
        while ((nl = buf.find('\n')) != std::string::npos) {
            std::string line = buf.substr(0, nl);
            buf.erase(0, nl + 1);
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (isErr) {
                stderrTail.push_back(line);
                if (stderrTail.size() > 20) stderrTail.pop_front();
                notify(*run, "run_log", {{"run_id", run->id}, {"stream", "stderr"}, {"text", line}});
            } else {
                handleOutLine(line);
            }
        }
        // A line longer than 1 MiB is not a protocol line; keep memory bounded.
        if (buf.size() > (1u << 20)) buf.clear();
    };

    char tmp[16384];
    while (outFd >= 0 || errFd >= 0) {
        pollfd fds[2];
        nfds_t n = 0;
        if (outFd >= 0) fds[n++] = {outFd, POLLIN, 0};
        if (errFd >= 0) fds[n++] = {errFd, POLLIN, 0};
        int pr = ::poll(fds, n, 200);
        if (pr > 0) {
            for (nfds_t i = 0; i < n; ++i) {
                if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                ssize_t r = ::read(fds[i].fd, tmp, sizeof tmp);
                const bool isErr = fds[i].fd == errFd;
                if (r > 0) {
                    (isErr ? errBuf : outBuf).append(tmp, size_t(r));
                    drainLines(isErr ? errBuf : outBuf, isErr);
                } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
                    (isErr ? errFd : outFd) = -1;  // EOF; ChildProcess owns and closes the fd
                }
            }
        }
        {
            std::lock_guard rl(run->mu);
            if (!exited && run->child.tryWait(&waitStatus)) {
                exited = true;
                exitedAt = Clock::now();
            }
            if (!exited && run->cancel && !run->killed &&
                Clock::now() - run->cancelAt > std::chrono::milliseconds(o.cancelGraceMs)) {
                run->child.signal(SIGKILL);
                run->killed = true;
            }
        }
        // The child is gone but something it started still holds the pipes: stop waiting.
        if (exited && Clock::now() - exitedAt > std::chrono::seconds(2)) break;
    }
    if (!outBuf.empty()) handleOutLine(outBuf);
    if (!exited) {
        std::lock_guard rl(run->mu);
        waitStatus = run->child.wait();
    }
    reader.reset();
    finalize(*run, waitStatus, endStatus, endReason, stderrTail);
}

void Agent::Impl::finalize(RunState& run, int waitStatus, const std::string& endStatus,
                           const std::string& endReason, const std::deque<std::string>& stderrTail) {
    const AgentOptions& o = self->m_options;
    std::string status, reason;
    const bool cleanExit = WIFEXITED(waitStatus) && WEXITSTATUS(waitStatus) == 0;
    std::string lastErr;
    for (auto it = stderrTail.rbegin(); it != stderrTail.rend(); ++it)
        if (!it->empty()) { lastErr = *it; break; }
    if (run.cancel) {
        status = "cancelled";
        reason = endStatus == "cancelled" && !endReason.empty() ? endReason : "cancelled by a client";
    } else if (cleanExit && !endStatus.empty()) {
        status = endStatus;
        reason = endReason;
    } else if (WIFSIGNALED(waitStatus)) {
        status = "failed";
        reason = "run process " + describeWaitStatus(waitStatus);
        if (WTERMSIG(waitStatus) == SIGKILL)
            reason += "; if nobody killed it, the kernel's out-of-memory killer is the usual cause "
                      "(see `dmesg`)";
        if (!lastErr.empty()) reason += "; last error output: " + lastErr;
    } else if (!cleanExit) {
        status = "failed";
        reason = !endReason.empty() ? endReason : "run process " + describeWaitStatus(waitStatus);
        if (endReason.empty() && !lastErr.empty()) reason += ": " + lastErr;
    } else {
        status = "failed";
        reason = "run process exited without reporting how the run ended";
    }
    if (status != "completed" && status != "failed" && status != "cancelled") {
        reason = "run process reported status '" + status + "'" + (reason.empty() ? "" : ": " + reason);
        status = "failed";
    }

    // Make the run file say how the run ended. A killed writer leaves a WAL that SQLite
    // recovers on open; a file that cannot be opened is moved aside and a fresh one records
    // the failure, so the workspace always has a readable run file for every run.
    std::error_code ec;
    auto store = fs::exists(run.path, ec) ? profiler::TraceStore::open(run.path, /*readOnly=*/false)
                                          : Result<std::unique_ptr<profiler::TraceStore>>(Status::notFound(""));
    if (!store && fs::exists(run.path, ec)) {
        fs::rename(run.path, run.path + ".broken", ec);
        fs::remove(run.path + "-wal", ec);
        fs::remove(run.path + "-shm", ec);
        reason += " (the original run file could not be opened and was kept as " +
                  fs::path(run.path).filename().string() + ".broken)";
    }
    if (!store) store = profiler::TraceStore::create(run.path);
    if (store) {
        auto& s = **store;
        profiler::RunInfo info;
        auto cur = s.runInfo();
        if (cur) {
            info = *cur;
        } else {
            info.id = run.id;
            info.name = run.name;
            info.createdAt = run.createdAt;
            info.node = o.nodeName;
            info.host = hostName();
            if (const char* u = std::getenv("USER")) info.user = u;
            info.configJson = run.configJson.dump();
        }
        // The run only knows it ran "local"ly; from the workspace's view it ran on this node.
        const bool fixNode = info.node.empty() || info.node == "local";
        if (fixNode) info.node = o.nodeName;
        if (fixNode || info.status != status || info.statusReason != reason || info.finishedAt.empty()) {
            // Keep the child's own reason when it agrees on the outcome.
            if (info.status == status && !info.statusReason.empty() && status != "cancelled") reason = info.statusReason;
            info.status = status;
            info.statusReason = reason;
            if (info.finishedAt.empty()) info.finishedAt = isoTimeUtcNow();
            (void)s.setRunInfo(info);
        }
        if (status == "failed") {
            (void)s.appendLog("error", "agent: " + reason);
            for (const auto& l : stderrTail) (void)s.appendLog("stderr", l);
        }
        (void)s.checkpoint();
    }
    if (store) store->reset();  // close before indexing
    (void)ws->indexRun(run.path);
    fs::remove(run.configPath, ec);
    {
        std::lock_guard rl(run.mu);
        run.status = status;
        run.reason = reason;
    }
    notify(run, "run_finished", {{"run_id", run.id}, {"status", status}, {"reason", reason},
                                 {"run_file", run.path}, {"exit", describeWaitStatus(waitStatus)}});
    {
        std::lock_guard lock(mu);
        run.finished = true;
    }
    runsCv.notify_all();
}

// ---- TCP ---------------------------------------------------------------------------------

Status Agent::listen(const std::string& hostPort) {
    if (m_options.token.empty())
        return Status::invalid("a TCP agent needs a token (--token-file FILE); refusing to listen without one");
    std::string host, port;
    if (!hostPort.empty() && hostPort.front() == '[') {
        auto close = hostPort.find(']');
        if (close == std::string::npos || close + 1 >= hostPort.size() || hostPort[close + 1] != ':')
            return Status::invalid("bad address '" + hostPort + "'; expected [IPv6]:PORT");
        host = hostPort.substr(1, close - 1);
        port = hostPort.substr(close + 2);
    } else {
        auto colon = hostPort.rfind(':');
        if (colon == std::string::npos) {
            port = hostPort;
        } else {
            host = hostPort.substr(0, colon);
            port = hostPort.substr(colon + 1);
        }
    }
    if (host.empty()) host = "127.0.0.1";  // loopback unless told otherwise
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos)
        return Status::invalid("bad port in '" + hostPort + "'; expected HOST:PORT");
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
        return Status::invalid("cannot resolve '" + host + "': " + gai_strerror(rc));
    std::string lastErr = "no address";
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
            sockaddr_storage ss{};
            socklen_t len = sizeof ss;
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
            m_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
            m_listenFd = fd;
            ::freeaddrinfo(res);
            return Status::ok();
        }
        lastErr = std::strerror(errno);
        ::close(fd);
    }
    ::freeaddrinfo(res);
    return Status::io("cannot listen on " + hostPort + ": " + lastErr);
}

Status Agent::serveTcp() {
    if (m_listenFd < 0) return Status::invalid("serveTcp() before listen()");
    while (!m_shutdown) {
        pollfd p{m_listenFd, POLLIN, 0};
        int pr = ::poll(&p, 1, 200);
        // Reap finished connection threads.
        {
            std::lock_guard lock(m->mu);
            for (auto it = m->connThreads.begin(); it != m->connThreads.end();) {
                if (*it->done) {
                    it->thread.join();
                    it = m->connThreads.erase(it);
                } else {
                    ++it;
                }
            }
        }
        if (pr <= 0) continue;
        int fd = ::accept4(m_listenFd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) continue;
        size_t live;
        {
            std::lock_guard lock(m->mu);
            live = m->connThreads.size();
        }
        if (int(live) >= m_options.maxConnections) {
            std::string f = rpc::encodeFrame(rpc::makeError(nullptr, rpc::kBusy, "too many connections"));
            (void)writeAll(fd, f.data(), f.size());
            ::close(fd);
            continue;
        }
        auto done = std::make_shared<std::atomic<bool>>(false);
        std::lock_guard lock(m->mu);
        m->connThreads.push_back({std::thread([this, fd, done] {
                                      (void)serve(fd, fd, /*requireAuth=*/true);
                                      ::shutdown(fd, SHUT_RDWR);
                                      ::close(fd);
                                      *done = true;
                                  }),
                                  done, nullptr});
    }
    ::close(m_listenFd);
    m_listenFd = -1;
    std::vector<Impl::ConnThread> threads;
    {
        std::lock_guard lock(m->mu);
        threads.swap(m->connThreads);
    }
    for (auto& t : threads) t.thread.join();
    return Status::ok();
}

// ---- helpers -----------------------------------------------------------------------------

json probeCpuDevices() {
    std::string model = "cpu";
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        if (line.rfind("model name", 0) == 0) {
            auto c = line.find(':');
            if (c != std::string::npos) model = line.substr(c + 2);
            break;
        }
    }
    const long pages = ::sysconf(_SC_PHYS_PAGES), avail = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    json dev = {{"index", 0}, {"name", model}, {"memory_total_bytes", int64_t(pages) * page},
                {"memory_free_bytes", int64_t(avail) * page}, {"cores", cores}};
    return {{"backend", "cpu"}, {"count", 1}, {"devices", json::array({dev})},
            {"backends", json::array({{{"backend", "cpu"}, {"count", 1}, {"devices", json::array({dev})}}})}};
}

Result<std::string> readTokenFile(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Status::notFound("token file " + path + " does not exist");
    if (st.st_mode & (S_IRWXG | S_IRWXO))
        return Status::invalid("token file " + path + " is accessible by group/others; run `chmod 600 " + path + "`");
    std::ifstream f(path);
    std::string line;
    std::getline(f, line);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t b = 0;
    while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
    line = line.substr(b);
    if (line.empty()) return Status::invalid("token file " + path + " is empty");
    return line;
}

}  // namespace ts::sessions
