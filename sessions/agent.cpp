// The node agent (see agent.h and docs/protocol.md): connection loops with per-connection
// outgoing queues, authentication (deadline, throttle), method dispatch with typed params,
// runs as child processes, finalisation of run files after a child ends.
#include "sessions/agent.h"

#include <arpa/inet.h>
#include <fcntl.h>
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
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "engine/config/knobs.h"
#include "engine/train/trainer.h"
#include "profiler/store.h"
#include "sessions/knobs_json.h"
#include "sessions/process.h"
#include "sessions/workspace.h"

namespace ts::sessions {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

const std::vector<std::string>& methodNames() {
    static const std::vector<std::string> kMethods = {"hello",     "authenticate", "devices",    "knobs",
                                                      "validate",  "start_run",    "cancel",     "watch",
                                                      "list_runs", "update_run",   "delete_run", "fetch_run",
                                                      "shutdown"};
    return kMethods;
}

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

// A string field of a JSON object, "" when absent or not a string (for lines from a child and
// other input whose shape is not guaranteed: json::value() would throw on a wrong type).
std::string strField(const json& obj, const char* key) {
    if (!obj.is_object()) return "";
    auto it = obj.find(key);
    return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// ---- typed params ----------------------------------------------------------------------------
// Every method reads its params through Fields: a field of the wrong type is a -32602 that
// names the field and the type it must have, never a nlohmann exception.

const char* typeName(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return "a boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned: return "an integer";
        case json::value_t::number_float: return "a fractional number";
        case json::value_t::string: return "a string";
        case json::value_t::array: return "an array";
        case json::value_t::object: return "an object";
        default: return "something else";
    }
}

Reply badParam(const std::string& field, const std::string& expected, const json* got) {
    std::string msg = "params." + field + " must be " + expected;
    msg += got ? std::string(", not ") + typeName(*got) : std::string(" and is required");
    return Reply::err(rpc::kInvalidParams, msg, json{{"field", field}, {"expected", expected}});
}

struct Fields {
    const json& p;  // an object
    std::optional<Reply> error;

    const json* get(const char* key) const {
        auto it = p.find(key);
        return it == p.end() ? nullptr : &*it;
    }
    bool fail(Reply r) {
        if (!error) error = std::move(r);
        return false;
    }
    // Absent leaves *out as it is (unless required).
    bool str(const char* key, std::string* out, bool required = false, size_t maxBytes = size_t(1) << 20) {
        const json* v = get(key);
        if (!v) return required ? fail(badParam(key, "a string", nullptr)) : true;
        if (!v->is_string()) return fail(badParam(key, "a string", v));
        if (v->get_ref<const std::string&>().size() > maxBytes)
            return fail(badParam(key, "a string of at most " + std::to_string(maxBytes) + " bytes", v));
        *out = v->get<std::string>();
        return true;
    }
    bool integer(const char* key, int64_t* out, int64_t lo, int64_t hi) {
        const json* v = get(key);
        if (!v) return true;
        const std::string expected = "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
        if (v->is_number_unsigned()) {
            if (v->get<uint64_t>() > uint64_t(hi)) return fail(badParam(key, expected, v));
            *out = int64_t(v->get<uint64_t>());
        } else if (v->is_number_integer()) {
            *out = v->get<int64_t>();
        } else {
            return fail(badParam(key, expected, v));
        }
        if (*out < lo || *out > hi) return fail(Reply::err(rpc::kInvalidParams, "params." + std::string(key) +
                                                               " must be " + expected + ", not " + std::to_string(*out),
                                                           json{{"field", key}, {"expected", expected}}));
        return true;
    }
    bool runId(std::string* out) {
        const char* expected = "a run id (1..128 characters of A-Z a-z 0-9 . _ -, not starting with . or -)";
        const json* v = get("run_id");
        if (!v || !v->is_string()) return fail(badParam("run_id", expected, v));
        if (!isValidRunId(v->get_ref<const std::string&>()))
            return fail(Reply::err(rpc::kInvalidParams, std::string("params.run_id must be ") + expected,
                                   json{{"field", "run_id"}, {"expected", expected}}));
        *out = v->get<std::string>();
        return true;
    }
};

// ---- configs from params, and where their paths may point --------------------------------------

struct ParsedConfig {
    engine::Config config;
    std::vector<engine::ConfigIssue> issues;
};

// Reads the config from params: "config" (object in configToJson form, or YAML text) or "yaml"
// (text), then "set" overrides ["key=value", ...]. Shape errors go to f.error.
std::optional<ParsedConfig> configFromParams(Fields& f) {
    ParsedConfig out;
    const json* cfg = f.get("config");
    const json* yaml = f.get("yaml");
    if (cfg && !cfg->is_object() && !cfg->is_string()) {
        f.fail(badParam("config", "an object of knob: value, or YAML text", cfg));
        return std::nullopt;
    }
    if (yaml && !yaml->is_string()) {
        f.fail(badParam("yaml", "a string (YAML text)", yaml));
        return std::nullopt;
    }
    if (!cfg && !yaml) {
        f.fail(Reply::err(rpc::kInvalidParams,
                          "params need \"config\" (an object of knob: value, or YAML text) or \"yaml\" (text)",
                          json{{"field", "config"}, {"expected", "an object of knob: value, or YAML text"}}));
        return std::nullopt;
    }
    std::vector<std::string> overrides;
    if (const json* set = f.get("set")) {
        if (!set->is_array()) {
            f.fail(badParam("set", "an array of \"key=value\" strings", set));
            return std::nullopt;
        }
        for (size_t i = 0; i < set->size(); ++i) {
            if (!(*set)[i].is_string()) {
                f.fail(badParam("set[" + std::to_string(i) + "]", "a \"key=value\" string", &(*set)[i]));
                return std::nullopt;
            }
            overrides.push_back((*set)[i].get<std::string>());
        }
    }
    if (cfg && cfg->is_object()) {
        auto c = engine::configFromJson(*cfg);
        if (!c) {
            out.issues.push_back({"", 0, "", c.status().message()});
            return out;
        }
        out.config = *c;
    } else {
        const std::string& text = cfg ? cfg->get_ref<const std::string&>() : yaml->get_ref<const std::string&>();
        auto loaded = engine::parseConfigYaml(text, "config");
        out.config = loaded.config;
        out.issues = loaded.issues;
        if (!out.issues.empty()) return out;
    }
    for (const auto& kv : overrides) {
        Status s = engine::applyOverride(out.config, kv);
        if (!s) out.issues.push_back({"", 0, "", s.message()});
    }
    if (out.issues.empty()) out.issues = engine::validateConfig(out.config);
    return out;
}

// Absolute, normalised, with symlinks of the parts that exist resolved (so a link inside the
// workspace cannot point a run outside it).
std::string resolvePath(const fs::path& base, const std::string& value) {
    fs::path p(value);
    if (p.is_relative()) p = base / p;
    std::error_code ec;
    fs::path c = fs::weakly_canonical(p, ec);
    if (ec) c = p.lexically_normal();
    std::string s = c.string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
}

bool isInside(const std::string& path, const std::string& dir) {
    return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

// The path knobs a client may set: where the run writes checkpoints (save), reads them (load)
// and reads data (data_path). Each is rewritten to an absolute path — relative ones are taken
// from the knob's folder in the workspace — and must stay inside that folder or a folder the
// node's owner allowed (`agent --allow-path DIR`); anything else is a config issue.
std::vector<engine::ConfigIssue> applyPathPolicy(engine::Config& c, const std::string& workspace,
                                                 const std::vector<std::string>& allowed) {
    struct PathKnob {
        const char* knob;
        std::string* value;
        const char* folder;
    };
    const PathKnob knobs[] = {{"save", &c.save, "checkpoints"},
                              {"load", &c.load, "checkpoints"},
                              {"data_path", &c.data_path, "data"}};
    std::vector<engine::ConfigIssue> issues;
    for (const auto& k : knobs) {
        if (k.value->empty()) continue;
        if (std::string(k.knob) == "data_path" && *k.value == "synthetic") continue;
        const std::string folder = resolvePath(workspace, k.folder);
        const std::string resolved = resolvePath(folder, *k.value);
        bool ok = isInside(resolved, folder);
        for (const auto& a : allowed) ok = ok || isInside(resolved, a);
        if (!ok) {
            engine::ConfigIssue issue;
            issue.knob = k.knob;
            issue.message = std::string(k.knob) + "=" + *k.value + " is outside this node's " + folder +
                            " (relative paths are taken from there); the node's owner can allow a folder with "
                            "`trainscope agent --allow-path DIR`";
            issues.push_back(issue);
            continue;
        }
        *k.value = resolved;
    }
    return issues;
}

// ---- failed authentication throttle ---------------------------------------------------------

class AuthThrottle {
public:
    AuthThrottle(int baseMs, int maxMs, int perSecond) : m_baseMs(baseMs), m_maxMs(maxMs), m_perSecond(perSecond) {}

    // 0 when a token from peer may be compared now, else the milliseconds to wait.
    int64_t admit(const std::string& peer) {
        std::lock_guard lock(m_mu);
        const auto now = Clock::now();
        prune(now);
        auto it = m_peers.find(peer);
        int64_t wait = 0;
        if (it != m_peers.end() && it->second.failures > 0) {
            auto until = it->second.last + std::chrono::milliseconds(delayMs(it->second.failures));
            if (until > now) wait = msBetween(now, until);
        }
        if (int(m_recent.size()) >= m_perSecond) {
            auto until = m_recent.front() + std::chrono::seconds(1);
            if (until > now) wait = std::max(wait, msBetween(now, until));
        }
        return wait;
    }
    // Records a failure; returns (failures from this peer, ms its next attempt must wait).
    std::pair<int, int64_t> fail(const std::string& peer) {
        std::lock_guard lock(m_mu);
        const auto now = Clock::now();
        auto& p = m_peers[peer];
        p.failures = std::min(p.failures + 1, 1 << 20);
        p.last = now;
        m_recent.push_back(now);
        while (int(m_recent.size()) > m_perSecond) m_recent.pop_front();
        return {p.failures, delayMs(p.failures)};
    }
    void succeed(const std::string& peer) {
        std::lock_guard lock(m_mu);
        m_peers.erase(peer);
    }
    // Throttled refusals are logged at most once a second per peer; returns how many were not.
    bool shouldLogRefusal(const std::string& peer, int* suppressed) {
        std::lock_guard lock(m_mu);
        auto& p = m_peers[peer];
        const auto now = Clock::now();
        if (now - p.lastLog < std::chrono::seconds(1)) {
            ++p.suppressed;
            return false;
        }
        *suppressed = p.suppressed;
        p.suppressed = 0;
        p.lastLog = now;
        return true;
    }

private:
    struct Peer {
        int failures = 0;
        Clock::time_point last{}, lastLog{};
        int suppressed = 0;
    };
    static int64_t msBetween(Clock::time_point a, Clock::time_point b) {
        return std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count());
    }
    int64_t delayMs(int failures) const {
        int64_t d = m_baseMs;
        for (int i = 1; i < failures && d < m_maxMs; ++i) d *= 2;
        return std::min<int64_t>(d, m_maxMs);
    }
    void prune(Clock::time_point now) {
        while (!m_recent.empty() && now - m_recent.front() > std::chrono::seconds(1)) m_recent.pop_front();
        // Forget addresses quiet for 10 minutes; keep the table bounded under a scan.
        if (m_peers.size() < 4096) return;
        for (auto it = m_peers.begin(); it != m_peers.end();)
            it = now - it->second.last > std::chrono::minutes(10) ? m_peers.erase(it) : std::next(it);
        while (m_peers.size() >= 4096) m_peers.erase(m_peers.begin());
    }

    std::mutex m_mu;
    std::map<std::string, Peer> m_peers;
    std::deque<Clock::time_point> m_recent;  // failures in the last second, all peers
    int m_baseMs, m_maxMs, m_perSecond;
};

// ---- signals ----------------------------------------------------------------------------------

int g_signalPipe[2] = {-1, -1};

extern "C" void onAgentSignal(int sig) {
    const int saved = errno;
    const unsigned char b = static_cast<unsigned char>(sig);
    if (g_signalPipe[1] >= 0) {
        ssize_t w = ::write(g_signalPipe[1], &b, 1);  // async-signal-safe; a full pipe drops it
        (void)w;
    }
    errno = saved;
}

constexpr int kShutdownSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};

}  // namespace

// ---- connections: a reader (the serving thread) and a writer with a bounded queue --------------

struct Connection {
    int in = -1, out = -1;
    bool requireAuth = false;
    std::string peer;
    bool countedPending = false;  // a TCP connection counted in Impl::pendingTcp until it authenticates
    std::atomic<bool> authed{false};
    std::atomic<bool> alive{true};
    std::function<void(const std::string&)> log;

    size_t maxQueued = size_t(8) << 20;
    int stallMs = 30000;
    std::mutex qmu;
    std::condition_variable qcv;
    std::deque<std::string> queue;
    size_t queued = 0;       // bytes in queue plus the frame being written
    bool closing = false;    // no more frames; the writer drains what is queued and stops
    std::thread writer;
    bool isSocket = true;

    void start() {
        struct stat st {};
        isSocket = ::fstat(out, &st) == 0 && S_ISSOCK(st.st_mode);
        if (!isSocket) {
            // A pipe (stdio agent): non-blocking so the writer can give up on a stalled reader.
            int flags = ::fcntl(out, F_GETFL);
            if (flags >= 0) ::fcntl(out, F_SETFL, flags | O_NONBLOCK);
        }
        writer = std::thread([this] { writeLoop(); });
    }

    void drop(const std::string& why) {
        bool was = alive.exchange(false);
        qcv.notify_all();
        if (was && log) log("trainscope agent: dropped client " + peer + ": " + why);
    }

    // Queues one frame. A frame always fits an empty queue; otherwise the queue may not grow
    // past maxQueued: a client that does not read is dropped instead of holding memory.
    // Lossy frames (a run's output lines) are skipped while the queue is over a quarter full,
    // so a burst of output never drops a client that reads; the client is told how many
    // lines it missed (noteFor(count) makes that frame) once there is room again.
    size_t skipped = 0;
    bool enqueue(std::string frame, bool lossy = false,
                 const std::function<std::string(size_t)>& noteFor = nullptr) {
        std::unique_lock lock(qmu);
        if (!alive || closing) return false;
        if (lossy) {
            if (queued > maxQueued / 4) {
                ++skipped;
                return true;
            }
            if (skipped > 0 && noteFor) {
                std::string note = noteFor(skipped);
                queued += note.size();
                queue.push_back(std::move(note));
            }
            skipped = 0;
        }
        if (queued > 0 && queued + frame.size() > maxQueued) {
            lock.unlock();
            drop("it stopped reading (" + std::to_string(queued) + " bytes queued)");
            return false;
        }
        queued += frame.size();
        queue.push_back(std::move(frame));
        qcv.notify_all();
        return true;
    }
    bool send(const json& message) { return enqueue(rpc::encodeFrame(message)); }

    // fetch_run: waits for room instead of dropping (the client is reading, just slower than
    // the disk). Gives up when nothing drains for stallMs.
    bool enqueueWait(std::string frame) {
        std::unique_lock lock(qmu);
        size_t lastQueued = queued;
        auto lastProgress = Clock::now();
        while (alive && !closing && queued > 0 && queued + frame.size() > maxQueued) {
            qcv.wait_for(lock, std::chrono::milliseconds(200));
            if (queued != lastQueued) {
                lastQueued = queued;
                lastProgress = Clock::now();
            } else if (Clock::now() - lastProgress > std::chrono::milliseconds(stallMs)) {
                lock.unlock();
                drop("it took nothing for " + std::to_string(stallMs / 1000) + " s");
                return false;
            }
        }
        if (!alive || closing) return false;
        queued += frame.size();
        queue.push_back(std::move(frame));
        qcv.notify_all();
        return true;
    }

    // Stops accepting frames, lets the writer drain (at most drainMs without progress), joins it.
    void finish(int drainMs) {
        {
            std::lock_guard lock(qmu);
            closing = true;
            stallMs = std::min(stallMs, drainMs);
            qcv.notify_all();
        }
        if (writer.joinable()) writer.join();
    }

    ssize_t writeSome(const char* p, size_t n) {
        if (isSocket) return ::send(out, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        return ::write(out, p, n);
    }

    void writeLoop() {
        for (;;) {
            std::string frame;
            {
                std::unique_lock lock(qmu);
                qcv.wait(lock, [&] { return !queue.empty() || !alive || closing; });
                if (!alive || queue.empty()) break;  // dropped, or closing with nothing left
                frame = std::move(queue.front());
                queue.pop_front();
            }
            size_t off = 0;
            auto lastProgress = Clock::now();
            while (off < frame.size() && alive) {
                ssize_t n = writeSome(frame.data() + off, frame.size() - off);
                if (n > 0) {
                    off += size_t(n);
                    lastProgress = Clock::now();
                    continue;
                }
                if (n < 0 && errno == EINTR) continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                    int limit;
                    {
                        std::lock_guard lock(qmu);
                        limit = stallMs;
                    }
                    if (Clock::now() - lastProgress > std::chrono::milliseconds(limit)) {
                        drop("it took nothing for " + std::to_string(limit) + " ms");
                        break;
                    }
                    pollfd p{out, POLLOUT, 0};
                    ::poll(&p, 1, 100);
                    continue;
                }
                alive = false;  // the client went away (EPIPE, ECONNRESET)
                qcv.notify_all();
                break;
            }
            std::lock_guard lock(qmu);
            queued -= frame.size();
            qcv.notify_all();
        }
        std::lock_guard lock(qmu);
        queue.clear();
        queued = 0;
        qcv.notify_all();
    }
};

struct RunState {
    std::string id, path, configPath, sidecarPath, name, createdAt;
    json configJson;
    std::mutex mu;          // guards child signalling vs reaping, and the fields below
    ChildProcess child;
    bool killed = false;
    std::atomic<bool> cancel{false};
    std::atomic<bool> finished{false};
    bool ended = false;  // under mu of the run: status final (set before run_finished is sent; finished after)
    Clock::time_point cancelAt;
    std::vector<std::weak_ptr<Connection>> subscribers;
    json lastProgress;
    std::string status = "running", reason;
    std::thread reader;
};

struct Agent::Impl {
    Agent* self = nullptr;
    std::unique_ptr<Workspace> ws;
    std::string wsCanonical;
    std::vector<std::string> allowed;  // canonical --allow-path folders
    mutable std::mutex mu;
    std::condition_variable runsCv;
    std::map<std::string, std::shared_ptr<RunState>> runs;  // active and finished (id -> state)
    struct ConnThread {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    std::vector<ConnThread> connThreads;
    std::atomic<int> pendingTcp{0};  // accepted, not yet authenticated
    std::atomic<int> authedTcp{0};
    std::unique_ptr<AuthThrottle> throttle;

    void log(const std::string& line) const {
        const auto& o = self->m_options;
        if (o.log) {
            o.log(line);
        } else {
            std::fprintf(stderr, "%s\n", line.c_str());
            std::fflush(stderr);
        }
    }

    Status serveConnection(int inFd, int outFd, bool requireAuth, const std::string& peer, bool countedPending);
    Reply preAuth(Connection& conn, const std::shared_ptr<Connection>& self, const std::string& body, json* id);
    Reply dispatch(Connection& conn, const std::shared_ptr<Connection>& self, const rpc::Message& m);
    Reply hello(Connection& conn, Fields& f);
    Reply authenticate(Connection& conn, Fields& f);
    Reply devices();
    Reply validate(Fields& f);
    Reply startRun(const std::shared_ptr<Connection>& conn, Fields& f);
    Reply cancel(Fields& f);
    Reply watch(const std::shared_ptr<Connection>& conn, Fields& f);
    Reply listRuns();
    Reply updateRun(Fields& f);
    Reply deleteRun(Fields& f);
    Reply fetchRun(Connection& conn, Fields& f);
    Reply shutdown();

    void notify(RunState& run, const std::string& method, const json& params);
    void runLoop(std::shared_ptr<RunState> run);
    void finalize(RunState& run, int waitStatus, const std::string& endStatus,
                  const std::string& endReason, const std::deque<std::string>& stderrTail);
    Result<std::string> workspaceRunPath(const std::string& id);
    void cancelAll();
    void finalizeOrphans();
};

namespace {

// The agent's note of a run it started, tmp/<id>.run.json, removed once the run is finalised:
// if the agent dies first, the next agent on this workspace finalises the run from it (even
// when the child died before writing its run file).
json processJson(const WriterProcess& w) {
    return {{"pid", w.pid}, {"start", w.startTime}, {"boot_id", w.bootId}, {"host", w.host}};
}

WriterProcess processFromJson(const json& j) {
    WriterProcess w;
    if (!j.is_object()) return w;
    auto pid = j.find("pid");
    if (pid != j.end() && pid->is_number_integer()) w.pid = pid->get<int64_t>();
    w.startTime = strField(j, "start");
    w.bootId = strField(j, "boot_id");
    w.host = strField(j, "host");
    return w;
}

}  // namespace

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
    std::vector<std::string> allowed;
    for (const auto& a : options.allowedPaths) {
        std::error_code ec;
        if (a.empty() || !fs::is_directory(a, ec))
            return Status::invalid("--allow-path " + a + ": not a folder (create it first)");
        allowed.push_back(resolvePath(fs::current_path(ec), a));
        if (allowed.back() == "/") return Status::invalid("--allow-path /: refusing to allow the whole file system");
    }
    std::unique_ptr<Agent> a(new Agent());
    a->m_options = std::move(options);
    a->m = std::make_unique<Impl>();
    a->m->self = a.get();
    a->m->ws = std::make_unique<Workspace>(std::move(ws));
    a->m->wsCanonical = resolvePath(a->m->ws->dir(), ".");
    a->m->allowed = std::move(allowed);
    a->m->throttle = std::make_unique<AuthThrottle>(a->m_options.authRetryBaseMs, a->m_options.authRetryMaxMs,
                                                    std::max(1, a->m_options.authFailuresPerSecond));
    // Runs left "running" by an agent or a `trainscope run` that died without finishing.
    a->m->finalizeOrphans();
    auto stale = finalizeStaleRuns(*a->m->ws);
    if (stale && !stale->empty())
        for (const auto& id : *stale)
            a->m->log("trainscope agent: run " + id + " was left running by a process that is gone; marked failed (" +
                      kStaleRunReason + ")");
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
        std::vector<Impl::ConnThread> threads;
        {
            std::lock_guard lock(m->mu);
            threads.swap(m->connThreads);
        }
        for (auto& c : threads)
            if (c.thread.joinable()) c.thread.join();
    }
    if (m_signalThread.joinable()) {
        m_signalThread.join();
        for (int sig : kShutdownSignals) ::signal(sig, SIG_DFL);
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

Status Agent::installSignalHandlers() {
    if (m_signalThread.joinable()) return Status::ok();
    if (g_signalPipe[0] < 0 && ::pipe2(g_signalPipe, O_CLOEXEC | O_NONBLOCK) != 0)
        return Status::io(std::string("pipe: ") + std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = onAgentSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : kShutdownSignals)
        if (::sigaction(sig, &sa, nullptr) != 0) return Status::io(std::string("sigaction: ") + std::strerror(errno));
    m_signalThread = std::thread([this] {
        while (!m_shutdown) {
            pollfd p{g_signalPipe[0], POLLIN, 0};
            if (::poll(&p, 1, 200) <= 0) continue;
            unsigned char sig = 0;
            if (::read(g_signalPipe[0], &sig, 1) != 1) continue;
            const char* abbrev = sigabbrev_np(sig);
            m->log("trainscope agent: received SIG" + std::string(abbrev ? abbrev : "?") + "; cancelling " +
                   std::to_string(activeRuns()) + " active run(s), finalising them and shutting down");
            requestShutdown();
        }
    });
    return Status::ok();
}

// ---- connection loop ---------------------------------------------------------------------

Status Agent::serve(int inFd, int outFd, bool requireAuth, const std::string& peer) {
    return m->serveConnection(inFd, outFd, requireAuth, peer, /*countedPending=*/false);
}

Status Agent::Impl::serveConnection(int inFd, int outFd, bool requireAuth, const std::string& peer,
                                    bool countedPending) {
    const AgentOptions& o = self->m_options;
    auto conn = std::make_shared<Connection>();
    conn->in = inFd;
    conn->out = outFd;
    conn->requireAuth = requireAuth;
    conn->peer = peer;
    conn->countedPending = countedPending;
    conn->maxQueued = o.maxQueuedBytes;
    conn->stallMs = o.writeStallMs;
    conn->log = [this](const std::string& l) { log(l); };
    conn->start();

    // Before authentication only one small hello/authenticate is read.
    rpc::FrameReader reader(requireAuth ? std::min(o.maxPreAuthMessageBytes, o.maxMessageBytes) : o.maxMessageBytes);
    std::vector<char> buf(64 * 1024);
    bool closing = false;
    Status result;
    const auto started = Clock::now();
    std::optional<Clock::time_point> frameBegan;
    auto refuse = [&](const json& id, const std::string& message) {
        conn->send(rpc::makeError(id, rpc::kUnauthorized, message));
        closing = true;
    };
    while (!closing && conn->alive) {
        // Shutting down: clients stay connected until the runs are finalised, so they receive
        // each run_finished (docs/protocol.md, shutdown).
        if (self->m_shutdown && (!conn->authed && requireAuth ? true : self->activeRuns() == 0)) break;
        const auto now = Clock::now();
        if (requireAuth && !conn->authed && now - started > std::chrono::milliseconds(o.authTimeoutMs)) {
            log("trainscope agent: closed connection from " + peer + ": no authentication within " +
                std::to_string(o.authTimeoutMs) + " ms");
            refuse(nullptr, "not authenticated within " + std::to_string(o.authTimeoutMs) + " ms; closing");
            break;
        }
        if (frameBegan && now - *frameBegan > std::chrono::milliseconds(o.frameTimeoutMs)) {
            log("trainscope agent: closed connection from " + peer + ": a message took longer than " +
                std::to_string(o.frameTimeoutMs) + " ms to arrive");
            conn->send(rpc::makeError(nullptr, rpc::kParseError,
                                      "message incomplete after " + std::to_string(o.frameTimeoutMs) + " ms; closing"));
            break;
        }
        pollfd p{inFd, POLLIN, 0};
        int pr = ::poll(&p, 1, 100);  // wake up regularly for deadlines and shutdown
        if (pr < 0 && errno != EINTR) {
            result = Status::io(std::string("poll: ") + std::strerror(errno));
            break;
        }
        if (pr <= 0) continue;
        ssize_t n = ::read(inFd, buf.data(), buf.size());
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) break;  // EOF or error: the client went away
        reader.feed(buf.data(), size_t(n));
        while (!closing) {
            rpc::FrameEvent ev = reader.next();
            if (ev.kind == rpc::FrameEvent::Kind::None) break;
            const bool authed = !requireAuth || conn->authed;
            if (ev.kind == rpc::FrameEvent::Kind::Error) {
                conn->send(rpc::makeError(nullptr, ev.errorCode, ev.error));
                // Before authentication, garbage is not given a second chance.
                if (!authed) {
                    log("trainscope agent: closed connection from " + peer + " before authentication: " + ev.error);
                    closing = true;
                }
                continue;
            }
            if (!authed) {
                json id = nullptr;
                Reply r = preAuth(*conn, conn, ev.body, &id);
                if (r.code == 0) conn->send(rpc::makeResult(id, std::move(r.result)));
                else conn->send(rpc::makeError(id, r.code, r.message, r.data));
                if (r.closeAfter) closing = true;
                if (conn->authed) reader.setMaxMessageBytes(o.maxMessageBytes);  // frames after this one
                continue;
            }
            bool batch = false;
            std::vector<rpc::Message> msgs = rpc::parseMessages(ev.body, &batch);
            json responses = json::array();
            for (const auto& msg : msgs) {
                if (msg.kind == rpc::Message::Kind::Response) continue;  // we never send requests
                if (msg.kind == rpc::Message::Kind::Invalid) {
                    responses.push_back(rpc::makeError(msg.id, msg.errorCode, msg.errorMessage));
                    continue;
                }
                Reply r;
                try {
                    r = dispatch(*conn, conn, msg);
                } catch (const std::exception& e) {
                    // Every handler checks its input; reaching this is a bug, not a client error.
                    log(std::string("trainscope agent: internal error in ") + msg.method + ": " + e.what());
                    r = Reply::err(rpc::kInternalError, std::string("internal error: ") + e.what());
                }
                if (msg.kind == rpc::Message::Kind::Request) {
                    responses.push_back(r.code == 0 ? rpc::makeResult(msg.id, std::move(r.result))
                                                    : rpc::makeError(msg.id, r.code, r.message, r.data));
                }
                if (r.closeAfter) {
                    closing = true;
                    break;
                }
            }
            if (!responses.empty()) conn->send(batch ? responses : responses[0]);
        }
        if (reader.midFrame()) {
            if (!frameBegan) frameBegan = Clock::now();
        } else {
            frameBegan.reset();
        }
    }
    conn->finish(/*drainMs=*/2000);
    conn->alive = false;
    if (conn->isSocket && inFd == outFd) {
        // Lingering close: send FIN after what was queued, then discard what the client still
        // sends for a moment. Closing with unread input would send a RST, and a RST can make
        // the client lose the last answer (e.g. the error saying why it was closed).
        ::shutdown(outFd, SHUT_WR);
        char sink[16384];
        for (auto until = Clock::now() + std::chrono::milliseconds(300); Clock::now() < until;) {
            pollfd p{inFd, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            if (::read(inFd, sink, sizeof sink) <= 0) break;
        }
    }
    if (conn->countedPending && !conn->authed) --pendingTcp;
    if (requireAuth && conn->authed) --authedTcp;
    return result;
}

// The first message on a connection that must authenticate: only a hello or authenticate
// request is read; anything else (a batch, a notification, another method, invalid JSON) gets
// one -32001 and the connection is closed.
Reply Agent::Impl::preAuth(Connection& conn, const std::shared_ptr<Connection>& self, const std::string& body,
                           json* id) {
    auto refuse = [&](const std::string& why) {
        log("trainscope agent: refused connection from " + conn.peer + " before authentication: " + why);
        Reply r = Reply::err(rpc::kUnauthorized,
                             "not authenticated: the first request must be hello or authenticate with params.token (" +
                                 why + ")");
        r.closeAfter = true;
        return r;
    };
    std::string error;
    json v = rpc::parseStrictJson(body, &error);
    if (v.is_discarded()) return refuse(error);
    if (v.is_array()) return refuse("a batch before authentication");
    rpc::Message m = rpc::classify(std::move(v));
    if (m.kind == rpc::Message::Kind::Request || m.kind == rpc::Message::Kind::Invalid) *id = m.id;
    if (m.kind != rpc::Message::Kind::Request) return refuse(m.kind == rpc::Message::Kind::Invalid ? m.errorMessage
                                                                                                   : "not a request");
    if (m.method != "hello" && m.method != "authenticate") return refuse("got '" + m.method.substr(0, 64) + "'");
    Reply r = dispatch(conn, self, m);
    if (!conn.authed) {
        if (r.code != rpc::kBusy) r.code = rpc::kUnauthorized;
        r.closeAfter = true;
    }
    return r;
}

Reply Agent::Impl::dispatch(Connection& conn, const std::shared_ptr<Connection>& self, const rpc::Message& m) {
    static const json kEmpty = json::object();
    if (!m.params.is_null() && !m.params.is_object())
        return Reply::err(rpc::kInvalidParams, "params must be an object (named parameters), not " +
                                                   std::string(typeName(m.params)));
    Fields f{m.params.is_null() ? kEmpty : m.params, std::nullopt};
    if (conn.requireAuth && !conn.authed && m.method != "hello" && m.method != "authenticate") {
        Reply r = Reply::err(rpc::kUnauthorized,
                             "not authenticated: the first request must be hello or authenticate with params.token");
        r.closeAfter = true;
        return r;
    }
    if (m.method == "hello") return hello(conn, f);
    if (m.method == "authenticate") return authenticate(conn, f);
    if (m.method == "devices") return devices();
    if (m.method == "validate") return validate(f);
    if (m.method == "start_run") return startRun(self, f);
    if (m.method == "cancel") return cancel(f);
    if (m.method == "watch") return watch(self, f);
    if (m.method == "list_runs") return listRuns();
    if (m.method == "knobs") return Reply::ok(knobRegistryJson());
    if (m.method == "update_run") return updateRun(f);
    if (m.method == "delete_run") return deleteRun(f);
    if (m.method == "fetch_run") return fetchRun(conn, f);
    if (m.method == "shutdown") return shutdown();
    return Reply::err(rpc::kMethodNotFound, "method '" + m.method.substr(0, 64) + "' not found",
                      json{{"methods", methodNames()}});
}

// ---- methods -----------------------------------------------------------------------------

Reply Agent::Impl::authenticate(Connection& conn, Fields& f) {
    const AgentOptions& o = self->m_options;
    std::string token;
    if (!f.str("token", &token, /*required=*/conn.requireAuth && !conn.authed, 4096)) {
        Reply r = *f.error;
        if (conn.requireAuth && !conn.authed) {
            r.code = rpc::kUnauthorized;
            r.closeAfter = true;
            log("trainscope agent: failed authentication from " + conn.peer + ": " + r.message);
        }
        return r;
    }
    if (!conn.requireAuth || conn.authed) return Reply::ok({{"authenticated", true}});
    auto closeWith = [](std::string message) {
        Reply r = Reply::err(rpc::kUnauthorized, std::move(message));
        r.closeAfter = true;
        return r;
    };
    // Throttle before comparing: a peer that failed waits longer after each failure, and all
    // peers together fail at most authFailuresPerSecond times a second.
    if (int64_t wait = throttle->admit(conn.peer); wait > 0) {
        int suppressed = 0;
        if (throttle->shouldLogRefusal(conn.peer, &suppressed))
            log("trainscope agent: refused authentication from " + conn.peer + " without checking: too many failed "
                "attempts (retry in " + std::to_string(wait) + " ms)" +
                (suppressed ? "; " + std::to_string(suppressed) + " more refused in the last second" : ""));
        Reply r = closeWith("too many failed authentication attempts; retry in " + std::to_string(wait) + " ms");
        r.data = json{{"retry_after_ms", wait}};
        return r;
    }
    if (!rpc::constantTimeEquals(token, o.token)) {
        auto [failures, next] = throttle->fail(conn.peer);
        log("trainscope agent: failed authentication from " + conn.peer + ": wrong token (failure " +
            std::to_string(failures) + " from this address; its next attempt waits " + std::to_string(next) + " ms)");
        return closeWith("wrong token");
    }
    throttle->succeed(conn.peer);
    if (++authedTcp > o.maxConnections) {
        --authedTcp;
        Reply r = Reply::err(rpc::kBusy, "too many connections (limit " + std::to_string(o.maxConnections) +
                                             "); try again later");
        r.closeAfter = true;
        return r;
    }
    conn.authed = true;
    if (conn.countedPending) --pendingTcp;
    return Reply::ok({{"authenticated", true}});
}

Reply Agent::Impl::hello(Connection& conn, Fields& f) {
    std::string client;
    int64_t version = 0;
    if (!f.str("client", &client, false, 256) || !f.integer("protocol_version", &version, 0, 1 << 30)) {
        Reply r = *f.error;
        if (conn.requireAuth && !conn.authed) {
            r.code = rpc::kUnauthorized;
            r.closeAfter = true;
        }
        return r;
    }
    if (conn.requireAuth && !conn.authed) {
        Reply a = authenticate(conn, f);
        if (a.code != 0) return a;
    } else if (f.get("token") && !f.get("token")->is_string()) {
        return badParam("token", "a string", f.get("token"));
    }
    const AgentOptions& o = self->m_options;
    json caps = {
        {"methods", methodNames()},
        {"notifications", {"run_started", "progress", "run_log", "run_finished", "run_chunk"}},
        {"max_message_bytes", o.maxMessageBytes},
        {"max_active_runs", o.maxActiveRuns},
        {"batch", true},
        {"max_batch_requests", rpc::kMaxBatchRequests},
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

Reply Agent::Impl::validate(Fields& f) {
    auto pc = configFromParams(f);
    if (!pc) return *f.error;
    for (auto& i : applyPathPolicy(pc->config, wsCanonical, allowed)) pc->issues.push_back(std::move(i));
    json out = {{"ok", pc->issues.empty()}, {"issues", issuesToJson(pc->issues)}};
    if (pc->issues.empty()) {
        out["unsupported"] = engine::unsupportedKnobs(pc->config);
        out["warnings"] = engine::configWarnings(pc->config);
        // A valid config this node cannot run (its devices): said now, not when a run fails.
        out["node_issues"] = engine::nodeRunIssues(pc->config);
    }
    // Also with issues: the config as far as it was read (knobs with problems keep their
    // defaults), so an editor can show the file while it lists what is wrong.
    out["config"] = engine::configToJson(pc->config);
    return Reply::ok(out);
}

Reply Agent::Impl::startRun(const std::shared_ptr<Connection>& conn, Fields& f) {
    const AgentOptions& o = self->m_options;
    if (self->m_shutdown) return Reply::err(rpc::kBusy, "the agent is shutting down");
    int64_t steps = 0;
    std::string name;
    if (!f.integer("steps", &steps, 1, 1000000000) || !f.str("name", &name, false, 256)) return *f.error;
    auto pc = configFromParams(f);
    if (!pc) return *f.error;
    for (auto& i : applyPathPolicy(pc->config, wsCanonical, allowed)) pc->issues.push_back(std::move(i));
    if (!pc->issues.empty()) {
        std::string first = pc->issues.front().toString();
        return Reply::err(rpc::kInvalidConfig, "invalid config: " + first +
                          (pc->issues.size() > 1 ? " (and " + std::to_string(pc->issues.size() - 1) + " more)" : ""),
                          json{{"issues", issuesToJson(pc->issues)}});
    }
    if (name.empty()) name = pc->config.name;
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
    run->configJson = engine::configToJson(pc->config);
    run->configPath = ws->tmpDir() + "/" + run->id + ".yaml";
    run->sidecarPath = ws->tmpDir() + "/" + run->id + ".run.json";
    {
        std::ofstream f(run->configPath);
        f << engine::configToYaml(pc->config, /*onlyNonDefault=*/false);
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
        // Who runs it, for the next agent should this one die before finalising it.
        json note = {{"run_id", run->id}, {"run_file", run->path}, {"name", run->name},
                     {"created_at", run->createdAt}, {"agent", processJson(currentWriterProcess())},
                     {"child", processJson(writerProcessOf(pid))}};
        std::ofstream(run->sidecarPath) << note.dump() << "\n";
    }
    {
        std::lock_guard lock(mu);
        runs[run->id] = run;
    }
    run->reader = std::thread([this, run] { runLoop(run); });
    return Reply::ok({{"run_id", run->id}, {"run_file", run->path}, {"pid", int(pid)}, {"name", name}});
}

Reply Agent::Impl::cancel(Fields& f) {
    std::string id;
    if (!f.runId(&id)) return *f.error;
    std::shared_ptr<RunState> run;
    {
        std::lock_guard lock(mu);
        auto it = runs.find(id);
        if (it != runs.end()) run = it->second;
    }
    if (!run) return Reply::err(rpc::kRunNotFound, "no run '" + id + "' was started by this agent");
    std::lock_guard rl(run->mu);
    // `ended`: the status is final and run_finished may already be on its way to the client.
    if (run->finished || run->ended)
        return Reply::ok({{"run_id", id}, {"status", run->status}, {"already_finished", true}});
    if (!run->cancel.exchange(true)) {
        run->cancelAt = Clock::now();
        run->child.signal(SIGTERM);
    }
    return Reply::ok({{"run_id", id}, {"status", "cancelling"}});
}

Reply Agent::Impl::watch(const std::shared_ptr<Connection>& conn, Fields& f) {
    std::string id;
    if (!f.runId(&id)) return *f.error;
    std::lock_guard lock(mu);
    auto it = runs.find(id);
    if (it == runs.end()) return Reply::err(rpc::kRunNotFound, "no run '" + id + "' was started by this agent");
    std::lock_guard rl(it->second->mu);
    if (!it->second->finished) it->second->subscribers.push_back(conn);
    return Reply::ok({{"run_id", id}, {"status", it->second->status}, {"progress", it->second->lastProgress}});
}

// Runs are named by their exact id only (workspaceRunPath): a peer never names a path here.
Reply Agent::Impl::updateRun(Fields& f) {
    std::string id, name;
    if (!f.runId(&id) || !f.str("name", &name, false, 256)) return *f.error;
    std::vector<std::string> tags[2];
    const char* keys[2] = {"add_tags", "remove_tags"};
    for (int k = 0; k < 2; ++k) {
        const json* v = f.get(keys[k]);
        if (!v) continue;
        if (!v->is_array()) return badParam(keys[k], "an array of non-empty strings", v);
        for (size_t i = 0; i < v->size(); ++i) {
            const json& t = (*v)[i];
            if (!t.is_string() || t.get_ref<const std::string&>().empty() || t.get_ref<const std::string&>().size() > 256)
                return badParam(std::string(keys[k]) + "[" + std::to_string(i) + "]", "a non-empty string", &t);
            tags[k].push_back(t.get<std::string>());
        }
    }
    auto path = workspaceRunPath(id);
    if (!path) return Reply::err(path.status().code() == ErrorCode::NotFound ? rpc::kRunNotFound : rpc::kInternalError,
                                 path.status().message());
    if (f.get("name"))
        if (Status st = ws->rename(*path, name); !st.isOk()) return Reply::err(rpc::kInternalError, st.message());
    for (const auto& t : tags[0])
        if (Status st = ws->tag(*path, t); !st.isOk()) return Reply::err(rpc::kInternalError, st.message());
    for (const auto& t : tags[1])
        if (Status st = ws->untag(*path, t); !st.isOk()) return Reply::err(rpc::kInternalError, st.message());
    auto after = ws->findRun(*path);
    if (!after) return Reply::err(rpc::kInternalError, after.status().message());
    return Reply::ok(after->toJson());
}

Reply Agent::Impl::deleteRun(Fields& f) {
    std::string id;
    if (!f.runId(&id)) return *f.error;
    auto path = workspaceRunPath(id);
    if (!path) return Reply::err(path.status().code() == ErrorCode::NotFound ? rpc::kRunNotFound : rpc::kInternalError,
                                 path.status().message());
    {
        std::lock_guard lock(mu);
        for (auto& [rid, r] : runs) {
            if (r->finished || r->path != *path) continue;
            return Reply::err(rpc::kBusy, "run '" + id + "' is still running; cancel it first, then delete it");
        }
    }
    if (Status st = ws->remove(*path); !st.isOk()) return Reply::err(rpc::kInternalError, st.message());
    return Reply::ok({{"run_id", id}, {"deleted", true}});
}

Reply Agent::Impl::listRuns() {
    auto list = ws->listRuns();  // a read: nothing is written
    if (!list) return Reply::err(rpc::kInternalError, list.status().message());
    json out = json::array();
    std::lock_guard lock(mu);
    std::set<std::string> seen;
    // A run counts as running until its outcome is recorded (run.status leaves "running"
    // before run_finished is sent, so a client that lists runs on that notification sees it).
    auto stillRunning = [](RunState& r) {
        if (r.finished) return false;
        std::lock_guard rl(r.mu);
        return r.status == "running";
    };
    std::map<std::string, RunState*> byPath;
    for (auto& [id, r] : runs)
        if (stillRunning(*r)) byPath[r->path] = r.get();
    for (const auto& s : *list) {
        json j = s.toJson();
        if (auto it = byPath.find(s.path); it != byPath.end()) {
            RunState* r = it->second;
            std::lock_guard rl(r->mu);
            j["status"] = "running";
            j["progress"] = r->lastProgress;
            j["id"] = r->id;
        }
        seen.insert(s.path);
        out.push_back(std::move(j));
    }
    for (auto& [path, r] : byPath) {
        if (seen.count(path)) continue;
        std::lock_guard rl(r->mu);
        out.push_back({{"id", r->id}, {"name", r->name}, {"status", "running"}, {"path", r->path},
                       {"created_at", r->createdAt}, {"progress", r->lastProgress}});
    }
    json result = json::object();
    result["runs"] = std::move(out);
    return Reply::ok(std::move(result));
}

// A run of this agent's workspace by its exact id (no names, prefixes or paths: a client must
// not be able to name, or probe for, any other file on the node).
Result<std::string> Agent::Impl::workspaceRunPath(const std::string& id) {
    const Status notFound = Status::notFound("no run '" + id + "' in this node's workspace");
    if (!isValidRunId(id)) return notFound;
    std::string path;
    {
        std::lock_guard lock(mu);
        auto it = runs.find(id);
        if (it != runs.end()) path = it->second->path;
    }
    if (path.empty()) {
        auto list = ws->listRuns();
        if (!list) return list.status();
        for (const auto& s : *list)
            if (s.id == id) {
                path = s.path;
                break;
            }
    }
    if (path.empty() || !isInside(resolvePath(ws->runsDir(), path), resolvePath(ws->runsDir(), "."))) return notFound;
    return path;
}

Reply Agent::Impl::fetchRun(Connection& conn, Fields& f) {
    std::string id;
    int64_t chunkParam = 1 << 20;
    if (!f.runId(&id) || !f.integer("chunk_bytes", &chunkParam, 1, int64_t(1) << 40)) return *f.error;
    // base64 grows 4/3 and the envelope needs room: keep a chunk under 1/2 of the message limit.
    const size_t chunk = std::clamp<size_t>(size_t(chunkParam), 1024, self->m_options.maxMessageBytes / 2);
    auto path = workspaceRunPath(id);
    if (!path) return Reply::err(path.status().code() == ErrorCode::NotFound ? rpc::kRunNotFound : rpc::kInternalError,
                                 path.status().message());
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
            return Reply::err(rpc::kInternalError, "cannot snapshot run " + id + ": " + err);
        }
    }
    std::ifstream in(snap, std::ios::binary);
    uint64_t hash = rpc::kFnv1a64Offset;
    int64_t offset = 0;
    int chunks = 0;
    std::string buf(chunk, '\0');
    while (in && conn.alive) {
        in.read(buf.data(), std::streamsize(chunk));
        std::streamsize got = in.gcount();
        if (got <= 0) break;
        std::string_view piece(buf.data(), size_t(got));
        hash = rpc::fnv1a64(piece, hash);
        // Waits for the client to take earlier chunks: memory stays bounded by the queue.
        if (!conn.enqueueWait(rpc::encodeFrame(rpc::makeNotification(
                "run_chunk", {{"run_id", id}, {"offset", offset}, {"data", rpc::base64Encode(piece.data(), piece.size())}}))))
            break;
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
    if (targets.empty()) return;
    // Queued, never written here: a subscriber that stopped reading cannot stall this run.
    const std::string frame = rpc::encodeFrame(rpc::makeNotification(method, params));
    const bool lossy = method == "run_log";
    auto note = [&](size_t n) {
        return rpc::encodeFrame(rpc::makeNotification(
            "run_log", {{"run_id", run.id}, {"stream", "agent"},
                        {"text", std::to_string(n) + " lines of the run's output were not sent to this client: it "
                                                     "read slower than the run wrote them (the run file has them)"}}));
    };
    for (auto& c : targets) c->enqueue(frame, lossy, note);
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
        const std::string kind = strField(ev, "event");
        if (kind.empty()) {
            notify(*run, "run_log", {{"run_id", run->id}, {"stream", "stdout"}, {"text", line}});
            return;
        }
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
            endStatus = strField(ev, "status");
            endReason = strField(ev, "reason");
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
    if (cleanExit && endStatus == "completed") {
        // The run did every step and said so before a cancel could stop it (a cancel that
        // arrives after the last step, or one the run never saw): it completed.
        status = "completed";
        reason = endReason;
    } else if (run.cancel) {
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
    fs::remove(run.sidecarPath, ec);
    {
        std::lock_guard rl(run.mu);
        run.status = status;
        run.reason = reason;
        run.ended = true;  // a cancel from here on is answered "already finished"
    }
    notify(run, "run_finished", {{"run_id", run.id}, {"status", status}, {"reason", reason},
                                 {"run_file", run.path}, {"exit", describeWaitStatus(waitStatus)}});
    {
        std::lock_guard lock(mu);
        run.finished = true;
    }
    runsCv.notify_all();
}

// Runs an earlier agent on this workspace started and never finalised (it was killed): their
// tmp/<id>.run.json notes say which. A run whose agent and child are both gone gets a run file
// that says it failed; one whose child still runs is left to end by itself (it stops when its
// output pipe closes) and is picked up by the next sweep.
void Agent::Impl::finalizeOrphans() {
    std::error_code ec;
    const WriterProcess me = currentWriterProcess();
    for (const auto& e : fs::directory_iterator(ws->tmpDir(), ec)) {
        const std::string file = e.path().filename().string();
        if (!file.ends_with(".run.json")) continue;
        std::ifstream in(e.path());
        std::stringstream ss;
        ss << in.rdbuf();
        std::string err;
        json note = rpc::parseStrictJson(ss.str(), &err);
        const std::string id = strField(note, "run_id");
        if (!isValidRunId(id) || file != id + ".run.json") continue;
        const WriterProcess agent = processFromJson(note.value("agent", json()));
        const WriterProcess child = processFromJson(note.value("child", json()));
        if (agent.pid == me.pid && agent.startTime == me.startTime) continue;  // ours
        if (writerState(agent) == WriterState::Alive || writerState(child) != WriterState::Gone) continue;
        const std::string path = ws->runsDir() + "/" + id + ".sqlite";
        auto store = fs::exists(path, ec) ? profiler::TraceStore::open(path, false) : profiler::TraceStore::create(path);
        if (store) {
            auto info = (*store)->runInfo();
            if (!info || info->status == "running" || info->status.empty()) {
                profiler::RunInfo r = info ? *info : profiler::RunInfo{};
                if (!info) {
                    r.id = id;
                    r.name = strField(note, "name");
                    r.createdAt = strField(note, "created_at");
                    r.node = self->m_options.nodeName;
                    r.host = hostName();
                }
                r.status = "failed";
                r.statusReason = kStaleRunReason;
                if (r.finishedAt.empty()) r.finishedAt = isoTimeUtcNow();
                (void)(*store)->setRunInfo(r);
                (void)(*store)->appendLog("error", std::string("agent: ") + kStaleRunReason + " (its agent, process " +
                                                       std::to_string(agent.pid) + ", ended first)");
                log("trainscope agent: run " + id + " was left running by an agent that is gone; marked failed (" +
                    kStaleRunReason + ")");
            }
            store->reset();
            (void)ws->indexRun(path);
        }
        fs::remove(e.path(), ec);
        fs::remove(ws->tmpDir() + "/" + id + ".yaml", ec);
    }
}

// ---- TCP ---------------------------------------------------------------------------------

Status parseHostPort(const std::string& hostPort, bool allowZero, std::string* host, int* port) {
    std::string h, p;
    if (!hostPort.empty() && hostPort.front() == '[') {
        auto close = hostPort.find(']');
        if (close == std::string::npos || close + 1 >= hostPort.size() || hostPort[close + 1] != ':')
            return Status::invalid("bad address '" + hostPort + "'; expected [IPv6]:PORT");
        h = hostPort.substr(1, close - 1);
        p = hostPort.substr(close + 2);
    } else {
        auto colon = hostPort.rfind(':');
        if (colon == std::string::npos) {
            p = hostPort;
        } else {
            h = hostPort.substr(0, colon);
            p = hostPort.substr(colon + 1);
        }
    }
    const std::string range = allowZero ? "0..65535 (0 = any free port)" : "1..65535";
    if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos)
        return Status::invalid("bad port in '" + hostPort + "'; expected HOST:PORT with PORT a number in " + range);
    const int v = std::stoi(p);
    if (v > 65535 || (v == 0 && !allowZero))
        return Status::invalid("port " + p + " in '" + hostPort + "' is out of range; use " + range);
    *host = h;
    *port = v;
    return Status::ok();
}

Status Agent::listen(const std::string& hostPort) {
    if (m_options.token.empty())
        return Status::invalid("a TCP agent needs a token (--token-file FILE); refusing to listen without one");
    TS_RETURN_IF_ERROR(checkTokenStrength(m_options.token));
    std::string host;
    int portNum = 0;
    TS_RETURN_IF_ERROR(parseHostPort(hostPort, /*allowZero=*/true, &host, &portNum));
    if (host.empty()) host = "127.0.0.1";  // loopback unless told otherwise
    const std::string port = std::to_string(portNum);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0)
        return Status::invalid("cannot resolve '" + host + "': " + gai_strerror(rc));
    std::string lastErr = "no address";
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
        int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        // The backlog holds connections while the pending (unauthenticated) slots are full.
        if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
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

namespace {

std::string peerName(const sockaddr_storage& ss) {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
    else if (ss.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof buf);
    return buf;
}

}  // namespace

Status Agent::serveTcp() {
    if (m_listenFd < 0) return Status::invalid("serveTcp() before listen()");
    while (!m_shutdown) {
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
        // Unauthenticated connections have their own few slots: while they are all taken, new
        // connections wait in the listen backlog (each pending one authenticates or is closed
        // within authTimeoutMs), so idle sockets cannot lock authenticated clients out.
        if (m->pendingTcp.load() >= m_options.maxPendingConnections) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            continue;
        }
        pollfd p{m_listenFd, POLLIN, 0};
        int pr = ::poll(&p, 1, 200);
        if (pr <= 0) continue;
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        int fd = ::accept4(m_listenFd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
        if (fd < 0) continue;
        const std::string peer = peerName(ss);
        if (m->authedTcp.load() >= m_options.maxConnections) {
            std::string f = rpc::encodeFrame(rpc::makeError(nullptr, rpc::kBusy, "too many connections"));
            (void)::send(fd, f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
            ::close(fd);
            continue;
        }
        ++m->pendingTcp;
        auto done = std::make_shared<std::atomic<bool>>(false);
        std::lock_guard lock(m->mu);
        m->connThreads.push_back({std::thread([this, fd, done, peer] {
                                      (void)m->serveConnection(fd, fd, /*requireAuth=*/true, peer, /*countedPending=*/true);
                                      ::shutdown(fd, SHUT_RDWR);
                                      ::close(fd);
                                      *done = true;
                                  }),
                                  done});
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

Status checkTokenStrength(const std::string& token) {
    const std::string hint = "; make one with `trainscope agent --generate-token FILE`";
    if (token.size() < 16)
        return Status::invalid("the token is too short (" + std::to_string(token.size()) +
                               " characters; at least 16 with at least 8 different ones)" + hint);
    std::set<char> distinct;
    for (char c : token) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
            return Status::invalid("the token holds a control character; use printable characters" + hint);
        distinct.insert(c);
    }
    if (distinct.size() < 8)
        return Status::invalid("the token is too predictable (" + std::to_string(distinct.size()) +
                               " different characters; at least 8)" + hint);
    return Status::ok();
}

Status generateTokenFile(const std::string& path) {
    unsigned char bytes[32];
    int rnd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (rnd < 0) return Status::io(std::string("cannot open /dev/urandom: ") + std::strerror(errno));
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t n = ::read(rnd, bytes + got, sizeof bytes - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ::close(rnd);
            return Status::io("cannot read /dev/urandom");
        }
        got += size_t(n);
    }
    ::close(rnd);
    std::string token;
    for (unsigned char b : bytes) token += hex64(b).substr(14);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST) return Status::invalid("token file " + path + " already exists; not overwriting it");
        return Status::io("cannot create token file " + path + ": " + std::strerror(errno));
    }
    (void)::fchmod(fd, 0600);  // whatever the umask
    token += "\n";
    Status s = writeAll(fd, token.data(), token.size());
    if (s && ::fsync(fd) != 0) s = Status::io("cannot write token file " + path + ": " + std::strerror(errno));
    ::close(fd);
    if (!s) {
        ::unlink(path.c_str());
        return s.withContext("writing token file " + path);
    }
    return Status::ok();
}

}  // namespace ts::sessions
