// Issue #12, the agent and protocol half: hostile input, hostile peers and load. Each test here
// failed on the code before the fix (typed params, duplicate keys, run ids from peers, fetch_run
// of arbitrary paths, connection slots, pre-auth limits, tokens, throttling, slow readers, a
// late cancel, listing that wrote, 50 clients, the FNV-1a basis, ports, path knobs, stale runs).
// Runs use a stand-in runner (a shell script speaking `trainscope run --json`).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "profiler/store.h"
#include "sessions/agent.h"
#include "sessions/jsonrpc.h"
#include "sessions/node_client.h"
#include "sessions/process.h"
#include "sessions/workspace.h"
#include "session_test_util.h"

using namespace ts::sessions;
using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using ts::sessions::testutil::Events;
using ts::sessions::testutil::TempDir;

namespace {

constexpr const char* kToken = "hardening-test-token-7f3a9c";

// `trainscope run CFG --json --run-file PATH [--steps N]` stand-in. $1 = mode:
//   ok       3 quick steps, completed
//   slow     steps every 0.2 s
//   chatty   a burst of 2000 stderr lines of 1 KiB, then slow steps
//   trapterm ignores SIGTERM, 3 steps of 0.2 s, completed (a cancel the run never sees)
constexpr const char* kRunner = R"SH(#!/bin/sh
mode=$1; shift
shift; cfg=$1; shift
steps=3
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2;;
    --json) shift;;
    *) shift 2;;
  esac
done
delay=0.02
[ "$mode" = slow ] && delay=0.2
[ "$mode" = chatty ] && delay=0.2
[ "$mode" = trapterm ] && { trap '' TERM; delay=0.2; }
echo '{"event":"start"}'
if [ "$mode" = chatty ]; then
  line=$(printf '%01024d' 0)
  i=0; while [ $i -lt 2000 ]; do echo "$line" >&2; i=$((i + 1)); done
fi
i=1
while [ $i -le $steps ]; do
  sleep $delay
  echo "{\"event\":\"step\",\"step\":$i,\"loss\":1.5,\"step_time_s\":$delay,\"tokens_per_s\":1000,\"model_tflops\":0.5,\"peak_memory_bytes\":1000}"
  i=$((i + 1))
done
echo '{"event":"end","status":"completed"}'
)SH";

constexpr const char* kTinyYaml = "position_embedding_type: rope\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 2\nseq_length: 32\n";

std::unique_ptr<Agent> makeAgent(const TempDir& dir, const std::string& mode,
                                 const std::function<void(AgentOptions&)>& tweak = {}) {
    const std::string runner = dir.path + "/runner.sh";
    std::ofstream(runner) << kRunner;
    fs::permissions(runner, fs::perms::owner_all);
    AgentOptions o;
    o.workspaceDir = dir.path + "/ws";
    o.runnerCommand = {"/bin/sh", runner, mode};
    o.token = kToken;
    o.cancelGraceMs = 1000;
    o.nodeName = "testnode";
    if (tweak) tweak(o);
    auto a = Agent::create(o);
    EXPECT_TRUE(a.isOk()) << a.status().toString();
    return a.isOk() ? std::move(*a) : nullptr;
}

struct TcpAgent {
    std::unique_ptr<Agent> agent;
    std::thread loop;
    std::string url;
    int port = 0;
    TcpAgent(const TempDir& dir, const std::string& mode, const std::function<void(AgentOptions&)>& tweak = {}) {
        agent = makeAgent(dir, mode, tweak);
        ts::Status s = agent->listen("127.0.0.1:0");
        EXPECT_TRUE(s.isOk()) << s.toString();
        port = agent->boundPort();
        url = "tcp://127.0.0.1:" + std::to_string(port);
        loop = std::thread([this] { (void)agent->serveTcp(); });
    }
    ~TcpAgent() {
        agent->requestShutdown();
        loop.join();
    }
    std::unique_ptr<NodeClient> client(Events* ev = nullptr) {
        ConnectOptions co;
        co.token = kToken;
        auto c = NodeClient::connect(url, co);
        EXPECT_TRUE(c.isOk()) << c.status().toString();
        if (!c.isOk()) return nullptr;
        if (ev) (*c)->setNotificationHandler([ev](const std::string& m, const json& p) { ev->add(m, p); });
        return std::move(*c);
    }
};

// A raw connection to an agent on a socketpair (no authentication) or to a TCP port.
struct Raw {
    int fd = -1;
    std::thread server;
    rpc::FrameReader reader{size_t(64) << 20};
    size_t bytesIn = 0;
    Raw(Agent& agent) {
        int sv[2];
        EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        fd = sv[0];
        int theirs = sv[1];
        server = std::thread([&agent, theirs] {
            (void)agent.serve(theirs, theirs, false);
            ::shutdown(theirs, SHUT_RDWR);
            ::close(theirs);
        });
    }
    explicit Raw(int port, int rcvbuf = 0) {
        fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(uint16_t(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    }
    ~Raw() {
        ::shutdown(fd, SHUT_RDWR);
        if (server.joinable()) server.join();
        ::close(fd);
    }
    bool sendRaw(const std::string& bytes) { return writeAll(fd, bytes.data(), bytes.size()).isOk(); }
    bool send(const json& j) { return sendRaw(rpc::encodeFrame(j)); }
    // Next response (notifications skipped); null on EOF or timeout. *eof set on EOF.
    json next(int timeoutMs = 10000, bool* eof = nullptr) {
        auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
        char buf[65536];
        for (;;) {
            for (auto ev = reader.next(); ev.kind != rpc::FrameEvent::Kind::None; ev = reader.next()) {
                if (ev.kind != rpc::FrameEvent::Kind::Message) continue;
                json j = json::parse(ev.body, nullptr, false);
                if (j.is_object() && j.contains("method")) continue;
                return j;
            }
            if (Clock::now() > deadline) return nullptr;
            timeval tv{0, 100000};
            ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            ssize_t n = ::read(fd, buf, sizeof buf);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                if (eof) *eof = true;
                return nullptr;
            }
            if (n > 0) {
                bytesIn += size_t(n);
                reader.feed(buf, size_t(n));
            }
        }
    }
    json call(int id, const std::string& method, const json& params = json::object()) {
        send(rpc::makeRequest(id, method, params));
        return next();
    }
    // True when the peer closed the connection within timeoutMs (reads and discards data).
    bool closedWithin(int timeoutMs) {
        auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
        char buf[65536];
        while (Clock::now() < deadline) {
            timeval tv{0, 100000};
            ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            ssize_t n = ::read(fd, buf, sizeof buf);
            if (n == 0) return true;
            if (n < 0 && errno != EAGAIN && errno != EINTR) return true;
            if (n > 0) bytesIn += size_t(n);
        }
        return false;
    }
};

int64_t vmHwmKb() {
    std::ifstream f("/proc/self/status");
    for (std::string line; std::getline(f, line);)
        if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6);
    return 0;
}

// A complete run file written without the agent.
void writeRunFile(const std::string& path, const std::string& id, const std::string& status,
                  const std::vector<std::pair<std::string, std::string>>& meta = {}) {
    auto store = ts::profiler::TraceStore::create(path);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    ts::profiler::RunInfo info;
    info.id = id;
    info.name = id;
    info.status = status;
    info.createdAt = "2025-01-31T12:00:00Z";
    ASSERT_TRUE((*store)->setRunInfo(info).isOk());
    for (const auto& [k, v] : meta) ASSERT_TRUE((*store)->setMetadata(k, v).isOk());
}

std::string statusOf(const std::string& path, std::string* reason = nullptr) {
    auto store = ts::profiler::TraceStore::open(path, true);
    if (!store) return "(unreadable)";
    auto info = (*store)->runInfo();
    if (!info) return "(no run info)";
    if (reason) *reason = info->statusReason;
    return info->status;
}

}  // namespace

// start_run with a name that is not a string aborted the agent (a nlohmann type_error).
// Every field of every method now gets -32602 naming the field and the type it must have.
TEST(AgentHardening, EveryParamOfEveryMethodIsTypeChecked) {
    TempDir dir("ts_harden");
    auto agent = makeAgent(dir, "ok");
    Raw c(*agent);
    const json wrongs[] = {nullptr, true, 7, -1, 2.5, "a/../b", json::array({1}), json{{"a", 1}}};
    struct Field {
        const char* method;
        const char* field;
        std::vector<std::string> okTypes;  // typeName()s that are not wrong
        json base;                         // the other params
    };
    const json cfg = {{"yaml", kTinyYaml}};
    const std::vector<Field> fields = {
        {"hello", "client", {"string"}, json::object()},
        {"hello", "protocol_version", {"int"}, json::object()},
        {"hello", "token", {"string"}, json::object()},
        {"authenticate", "token", {"string"}, json::object()},
        {"validate", "config", {"string", "object"}, json::object()},
        {"validate", "yaml", {"string"}, json::object()},
        {"validate", "set", {"array"}, cfg},
        {"start_run", "config", {"string", "object"}, json::object()},
        {"start_run", "yaml", {"string"}, json::object()},
        {"start_run", "set", {"array"}, cfg},
        {"start_run", "steps", {"posint"}, cfg},
        {"start_run", "name", {"string"}, cfg},
        {"cancel", "run_id", {}, json::object()},
        {"watch", "run_id", {}, json::object()},
        {"fetch_run", "run_id", {}, json::object()},
        {"fetch_run", "chunk_bytes", {"posint"}, json{{"run_id", "20250131T120000123Z-3f9a2c"}}},
        {"update_run", "run_id", {}, json::object()},
        {"update_run", "name", {"string"}, json{{"run_id", "20250131T120000123Z-3f9a2c"}}},
        {"update_run", "add_tags", {}, json{{"run_id", "20250131T120000123Z-3f9a2c"}}},
        {"update_run", "remove_tags", {}, json{{"run_id", "20250131T120000123Z-3f9a2c"}}},
        {"delete_run", "run_id", {}, json::object()},
    };
    auto kind = [](const json& v) -> std::string {
        if (v.is_string()) return "string";
        if (v.is_object()) return "object";
        if (v.is_array()) return "array";
        if (v.is_number_integer()) return v.get<int64_t>() > 0 ? "posint" : "int";
        return "other";
    };
    int id = 0;
    for (const auto& f : fields) {
        for (const json& w : wrongs) {
            std::string k = kind(w);
            bool ok = std::find(f.okTypes.begin(), f.okTypes.end(), k) != f.okTypes.end() ||
                      (k == "posint" && std::find(f.okTypes.begin(), f.okTypes.end(), "int") != f.okTypes.end());
            if (ok) continue;
            json params = f.base;
            params[f.field] = w;
            json r = c.call(++id, f.method, params);
            ASSERT_TRUE(r.is_object()) << f.method << "." << f.field << "=" << w.dump() << ": no answer (agent died?)";
            ASSERT_TRUE(r.contains("error")) << f.method << "." << f.field << "=" << w.dump() << ": " << r.dump();
            EXPECT_EQ(r["error"]["code"], rpc::kInvalidParams) << f.method << "." << f.field << "=" << w.dump() << ": " << r.dump();
            EXPECT_NE(r["error"]["message"].get<std::string>().find(f.field), std::string::npos) << r.dump();
        }
    }
    // set elements, params that are not an object, and a missing config.
    json r = c.call(++id, "start_run", {{"yaml", kTinyYaml}, {"set", {"a=1", 5}}});
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidParams) << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find("set[1]"), std::string::npos) << r.dump();
    for (const char* m : {"devices", "list_runs", "validate", "start_run", "cancel", "shutdown"}) {
        r = c.call(++id, m, json::array({1, 2}));
        EXPECT_EQ(r["error"]["code"], rpc::kInvalidParams) << m << ": " << r.dump();
    }
    r = c.call(++id, "start_run", {{"name", "x"}});
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidParams) << r.dump();
    // Still alive and not shut down.
    r = c.call(++id, "hello");
    EXPECT_EQ(r["result"]["agent"], "trainscope") << r.dump();
    EXPECT_FALSE(agent->shutdownRequested());
}

// {"method":"hello","method":"shutdown"} shut the agent down (the last key won).
TEST(AgentHardening, DuplicateKeysAreRejectedAtAnyDepth) {
    TempDir dir("ts_harden");
    auto agent = makeAgent(dir, "ok");
    Raw c(*agent);
    c.sendRaw(rpc::encodeFrameBody(R"({"jsonrpc":"2.0","id":1,"method":"hello","method":"shutdown"})"));
    json r = c.next();
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidRequest) << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find("duplicate key \"method\""), std::string::npos) << r.dump();
    EXPECT_FALSE(agent->shutdownRequested());
    c.sendRaw(rpc::encodeFrameBody(
        R"({"jsonrpc":"2.0","id":2,"method":"validate","params":{"config":{"num_layers":2,"num_layers":3}}})"));
    r = c.next();
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidRequest) << r.dump();
    c.sendRaw(rpc::encodeFrameBody(R"([{"jsonrpc":"2.0","id":3,"method":"hello","params":{"a":[{"b":1,"b":2}]}}])"));
    r = c.next();
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidRequest) << r.dump();
    // The same key in two different objects is fine.
    c.sendRaw(rpc::encodeFrameBody(R"({"jsonrpc":"2.0","id":4,"method":"hello","params":{"client":"x","p":{"client":"y"}}})"));
    r = c.next();
    EXPECT_EQ(r["result"]["agent"], "trainscope") << r.dump();
    EXPECT_FALSE(agent->shutdownRequested());
}

// fetch_run took any path as run_id and streamed any SQLite file; its errors told which paths
// existed. Only runs of the workspace, by id, may be named; cancel and watch check ids too.
TEST(AgentHardening, FetchRunNamesOnlyWorkspaceRunsById) {
    TempDir dir("ts_harden");
    TcpAgent tcp(dir, "ok");
    const std::string secret = dir.path + "/secret.sqlite";
    writeRunFile(secret, "secret-run", "completed");
    auto client = tcp.client();
    ASSERT_TRUE(client);
    for (const std::string& id : {secret, std::string("../secret"), std::string("../../secret.sqlite"),
                                  std::string(".hidden"), std::string("latest"), std::string(300, 'a')}) {
        auto r = client->call("fetch_run", {{"run_id", id}});
        ASSERT_FALSE(r.isOk()) << id << " was fetched";
        const std::string m = r.status().message();
        EXPECT_TRUE(m.find("-32602") != std::string::npos || m.find("-32003") != std::string::npos) << m;
        EXPECT_EQ(m.find(dir.path), std::string::npos) << "the error names a path: " << m;
    }
    // A missing file and an existing one outside the workspace read the same.
    auto a = client->call("fetch_run", {{"run_id", "no-such-run"}});
    auto b = client->call("fetch_run", {{"run_id", "secret"}});
    ASSERT_FALSE(a.isOk());
    ASSERT_FALSE(b.isOk());
    for (const char* m : {"cancel", "watch"}) {
        auto r = client->call(m, {{"run_id", secret}});
        ASSERT_FALSE(r.isOk());
        EXPECT_NE(r.status().message().find("-32602"), std::string::npos) << r.status().message();
    }
    // A real run of the workspace is fetched by its id.
    Events ev;
    client->setNotificationHandler([&](const std::string& m, const json& p) { ev.add(m, p); });
    auto started = client->call("start_run", {{"yaml", kTinyYaml}});
    ASSERT_TRUE(started.isOk()) << started.status().toString();
    const std::string id = (*started)["run_id"];
    ASSERT_TRUE(ev.waitFor("run_finished", id, nullptr));
    ts::Status s = client->fetchRun(id, dir.path + "/fetched.sqlite");
    EXPECT_TRUE(s.isOk()) << s.toString();
}

// The FNV-1a offset basis was 1469598103934665603 (a digit short), not 14695981039346656037.
TEST(AgentHardening, FetchChecksumIsStandardFnv1a) {
    TempDir dir("ts_harden");
    TcpAgent tcp(dir, "ok");
    Raw c(tcp.port);
    json r = c.call(1, "hello", {{"token", kToken}});
    ASSERT_TRUE(r.contains("result")) << r.dump();
    Events ev;
    auto client = tcp.client(&ev);
    ASSERT_TRUE(client);
    auto started = client->call("start_run", {{"yaml", kTinyYaml}});
    ASSERT_TRUE(started.isOk());
    const std::string id = (*started)["run_id"];
    ASSERT_TRUE(ev.waitFor("run_finished", id, nullptr));
    c.send(rpc::makeRequest(2, "fetch_run", {{"run_id", id}, {"chunk_bytes", 4096}}));
    std::string bytes;
    json done;
    char buf[65536];
    for (auto deadline = Clock::now() + std::chrono::seconds(20); done.is_null() && Clock::now() < deadline;) {
        for (auto e = c.reader.next(); e.kind != rpc::FrameEvent::Kind::None; e = c.reader.next()) {
            json j = json::parse(e.body);
            if (j.value("method", "") == "run_chunk") {
                std::string piece;
                ASSERT_TRUE(rpc::base64Decode(j["params"]["data"].get<std::string>(), &piece));
                bytes += piece;
            } else if (j.contains("id")) {
                done = j;
            }
        }
        ssize_t n = ::read(c.fd, buf, sizeof buf);
        if (n > 0) c.reader.feed(buf, size_t(n));
    }
    ASSERT_TRUE(done.contains("result")) << done.dump();
    uint64_t h = 14695981039346656037ull;  // FNV-1a 64 offset basis
    for (unsigned char ch : bytes) {
        h ^= ch;
        h *= 1099511628211ull;
    }
    char hex[20];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    EXPECT_EQ(done["result"]["fnv1a64"], hex);
    EXPECT_EQ(done["result"]["size"], int64_t(bytes.size()));
}

// `run --node` built the local file name from the node's run_id: a node answering
// "../../x/evil" wrote outside the workspace.
TEST(AgentHardening, RunOnNodeRefusesAHostileRunId) {
    TempDir dir("ts_harden");
    // A fake node on TCP: answers hello, start_run with a hostile id, finishes it, serves a chunk.
    int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(lfd, 4), 0);
    socklen_t len = sizeof a;
    ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
    const int port = ntohs(a.sin_port);
    const std::string evil = "../../evil";
    std::atomic<bool> stop{false};
    std::thread node([&] {
        int fd = ::accept(lfd, nullptr, nullptr);
        if (fd < 0) return;
        rpc::FrameReader fr;
        char buf[65536];
        auto reply = [&](const json& j) {
            std::string f = rpc::encodeFrame(j);
            (void)writeAll(fd, f.data(), f.size());
        };
        while (!stop) {
            timeval tv{0, 100000};
            ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            ssize_t n = ::read(fd, buf, sizeof buf);
            if (n == 0) break;
            if (n < 0) continue;
            fr.feed(buf, size_t(n));
            for (auto e = fr.next(); e.kind != rpc::FrameEvent::Kind::None; e = fr.next()) {
                json q = json::parse(e.body, nullptr, false);
                const std::string m = q.value("method", "");
                if (m == "hello") {
                    reply(rpc::makeResult(q["id"], {{"agent", "trainscope"}, {"protocol_version", kProtocolVersion},
                                                    {"workspace", "/elsewhere"}}));
                } else if (m == "start_run") {
                    reply(rpc::makeResult(q["id"], {{"run_id", evil}, {"run_file", "/x"}, {"pid", 1}}));
                    reply(rpc::makeNotification("run_finished", {{"run_id", evil}, {"status", "completed"}}));
                } else if (m == "fetch_run") {
                    const std::string data = "SQLite format 3";
                    reply(rpc::makeNotification("run_chunk", {{"run_id", evil}, {"offset", 0},
                                                              {"data", rpc::base64Encode(data.data(), data.size())}}));
                    reply(rpc::makeResult(q["id"], {{"size", 15}, {"fnv1a64", "0"}}));
                }
            }
        }
        ::close(fd);
    });
    NodeRunRequest req;
    req.nodeUrl = "tcp://127.0.0.1:" + std::to_string(port);
    req.configYaml = kTinyYaml;
    req.workspaceDir = dir.path + "/a/b/ws";
    req.connect.token = kToken;
    auto r = runOnNode(req);
    stop = true;
    node.join();
    ::close(lfd);
    ASSERT_FALSE(r.isOk()) << "a hostile run id was accepted";
    EXPECT_NE(r.status().message().find("invalid run id"), std::string::npos) << r.status().toString();
    std::error_code ec;
    for (const char* p : {"/a/b/evil.sqlite", "/a/b/evil.sqlite.part"})
        EXPECT_FALSE(fs::exists(dir.path + p, ec)) << p << " was written outside the workspace";
}

// Sixteen idle TCP connections without a token locked every client out; slow senders did the
// same. Unauthenticated connections get a deadline and their own slots.
TEST(AgentHardening, IdleAndSlowConnectionsDoNotLockClientsOut) {
    TempDir dir("ts_harden");
    TcpAgent tcp(dir, "ok", [](AgentOptions& o) {
        o.authTimeoutMs = 1500;
        o.frameTimeoutMs = 1500;
    });
    std::vector<std::unique_ptr<Raw>> idle;
    for (int i = 0; i < 40; ++i) idle.push_back(std::make_unique<Raw>(tcp.port));
    // Slow senders: a header trickling in, one byte at a time.
    std::vector<std::unique_ptr<Raw>> slow;
    for (int i = 0; i < 4; ++i) slow.push_back(std::make_unique<Raw>(tcp.port));
    std::atomic<bool> stop{false};
    std::thread trickle([&] {
        const std::string header = "Content-Length: 100000\r\n\r\n{\"jsonrpc\":";
        for (size_t i = 0; i < header.size() * 10 && !stop; ++i) {
            for (auto& s : slow) (void)::send(s->fd, &header[i % header.size()], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t0 = Clock::now();
    ConnectOptions co;
    co.token = kToken;
    auto c = NodeClient::connect(tcp.url, co);
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(9));
    auto list = (*c)->call("list_runs");
    EXPECT_TRUE(list.isOk()) << list.status().toString();
    // Every idle connection is closed by the agent (deadline, or evicted to make room).
    int closed = 0;
    for (auto& r : idle) closed += r->closedWithin(8000) ? 1 : 0;
    EXPECT_EQ(closed, 40);
    // An authenticated connection that starts a message and stalls is closed after the frame timeout.
    Raw authed(tcp.port);
    json h = authed.call(1, "hello", {{"token", kToken}});
    ASSERT_TRUE(h.contains("result")) << h.dump();
    authed.sendRaw("Content-Length: 50\r\n\r\n{\"jsonrpc\"");
    EXPECT_TRUE(authed.closedWithin(6000));
    stop = true;
    trickle.join();
}

// A 16 MB batch of invalid requests before authentication made the agent allocate ~290 MB and
// send back 230,000 errors. Only hello/authenticate are read before the token is checked.
TEST(AgentHardening, BeforeAuthenticationOnlyOneSmallHelloIsRead) {
    TempDir dir("ts_harden");
    TcpAgent tcp(dir, "ok");
    std::string batch = "[";
    while (batch.size() < (size_t(16) << 20)) batch += R"({"jsonrpc":"2.0","id":1,"method":"x"},)";
    batch.back() = ']';
    const std::string frame = rpc::encodeFrameBody(batch);
    batch.clear();
    const int64_t before = vmHwmKb();
    {
        Raw c(tcp.port);
        std::thread writer([&] { (void)::send(c.fd, frame.data(), frame.size(), MSG_NOSIGNAL); });
        bool eof = false;
        json r = c.next(10000, &eof);
        ASSERT_TRUE(r.is_object()) << "no answer";
        EXPECT_TRUE(r["error"]["code"] == rpc::kMessageTooLarge || r["error"]["code"] == rpc::kUnauthorized) << r.dump();
        EXPECT_TRUE(c.closedWithin(5000));
        EXPECT_LT(c.bytesIn, size_t(4096)) << "one error, not one per request";
        ::shutdown(c.fd, SHUT_RDWR);
        writer.join();
    }
    EXPECT_LT(vmHwmKb() - before, 100 * 1024) << "the agent buffered the batch";
    // A small batch, another method, or a notification first: one -32001, then closed.
    const std::vector<std::string> firsts = {
        rpc::encodeFrameBody(R"([{"jsonrpc":"2.0","id":1,"method":"hello","params":{"token":")" + std::string(kToken) +
                             R"("}},{"jsonrpc":"2.0","id":2,"method":"list_runs"}])"),
        rpc::encodeFrame(rpc::makeRequest(1, "list_runs")),
        rpc::encodeFrame(rpc::makeNotification("hello", {{"token", kToken}})),
        rpc::encodeFrameBody("{not json"),
    };
    for (const auto& f : firsts) {
        Raw c(tcp.port);
        c.sendRaw(f);
        bool eof = false;
        json r = c.next(5000, &eof);
        ASSERT_TRUE(r.is_object()) << f;
        EXPECT_EQ(r["error"]["code"], rpc::kUnauthorized) << f << " -> " << r.dump();
        EXPECT_TRUE(eof || c.closedWithin(3000)) << f;
    }
    // After authenticating, the full message limit applies again.
    Raw c(tcp.port);
    json r = c.call(1, "hello", {{"token", kToken}});
    ASSERT_TRUE(r.contains("result")) << r.dump();
    r = c.call(2, "validate", {{"yaml", std::string(200000, '#') + "\n" + kTinyYaml}});
    EXPECT_TRUE(r.contains("result")) << r.dump().substr(0, 300);
}

// A one-character token was accepted.
TEST(AgentHardening, WeakTokensAreRefusedAndGeneratedOnesAreStrong) {
    TempDir dir("ts_harden");
    for (const std::string& weak : {std::string("t"), std::string("tok"), std::string("s3cret-token"),
                                    std::string(40, 'a'), std::string("abababababababababab")}) {
        auto agent = makeAgent(dir, "ok", [&](AgentOptions& o) { o.token = weak; });
        ts::Status s = agent->listen("127.0.0.1:0");
        EXPECT_FALSE(s.isOk()) << "token '" << weak << "' was accepted";
        EXPECT_NE(s.message().find("--generate-token"), std::string::npos) << s.message();
    }
    const std::string file = dir.path + "/token";
    ASSERT_TRUE(generateTokenFile(file).isOk());
    struct stat st {};
    ASSERT_EQ(::stat(file.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    auto token = readTokenFile(file);
    ASSERT_TRUE(token.isOk()) << token.status().toString();
    EXPECT_EQ(token->size(), 64u);
    EXPECT_TRUE(checkTokenStrength(*token).isOk());
    EXPECT_FALSE(generateTokenFile(file).isOk()) << "overwrote an existing token file";
    const std::string file2 = dir.path + "/token2";
    ASSERT_TRUE(generateTokenFile(file2).isOk());
    EXPECT_NE(*readTokenFile(file2), *token);
}

// ~1,500 guesses a second met no throttling and left no log line.
TEST(AgentHardening, FailedAuthenticationIsThrottledAndLogged) {
    TempDir dir("ts_harden");
    std::mutex logMu;
    std::vector<std::string> logs;
    TcpAgent tcp(dir, "ok", [&](AgentOptions& o) {
        o.authRetryMaxMs = 800;
        o.log = [&](const std::string& l) {
            std::lock_guard lock(logMu);
            logs.push_back(l);
        };
    });
    int compared = 0, refused = 0, attempts = 0;
    for (auto end = Clock::now() + std::chrono::milliseconds(1500); Clock::now() < end && attempts < 400; ++attempts) {
        Raw c(tcp.port);
        json r = c.call(1, "hello", {{"token", "wrong-token-guess-" + std::to_string(attempts)}});
        ASSERT_TRUE(r.is_object());
        ASSERT_EQ(r["error"]["code"], rpc::kUnauthorized) << r.dump();
        const std::string m = r["error"]["message"];
        if (m == "wrong token") ++compared;
        else if (m.find("too many failed") != std::string::npos) ++refused;
    }
    EXPECT_LE(compared, 6) << "guesses checked in 1.5 s: " << compared << " of " << attempts;
    EXPECT_GT(refused, 0);
    {
        std::lock_guard lock(logMu);
        int failedLines = 0;
        for (const auto& l : logs) failedLines += l.find("failed authentication from 127.0.0.1") != std::string::npos;
        EXPECT_EQ(failedLines, compared);
    }
    // The right token still gets in once the wait is over.
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    auto c = tcp.client();
    EXPECT_TRUE(c);
}

// A client that stopped reading stalled every other client's progress and cancel.
TEST(AgentHardening, ASlowReaderDoesNotStallOthersAndIsDropped) {
    TempDir dir("ts_harden");
    std::mutex logMu;
    std::vector<std::string> logs;
    TcpAgent tcp(dir, "chatty", [&](AgentOptions& o) {
        o.maxQueuedBytes = 256 << 10;
        o.writeStallMs = 2000;
        o.log = [&](const std::string& l) {
            std::lock_guard lock(logMu);
            logs.push_back(l);
        };
    });
    Raw stuck(tcp.port, /*rcvbuf=*/4096);
    json h = stuck.call(1, "hello", {{"token", kToken}});
    ASSERT_TRUE(h.contains("result"));
    stuck.send(rpc::makeRequest(2, "start_run", {{"yaml", kTinyYaml}, {"steps", 1000}}));
    json started = stuck.next();
    ASSERT_TRUE(started.contains("result")) << started.dump();
    const std::string id = started["result"]["run_id"];
    // From here on `stuck` reads nothing, and asks for more than its queue and the socket hold.
    std::thread flood([&] {
        std::string many;
        for (int i = 0; i < 5000; ++i) many += rpc::encodeFrame(rpc::makeRequest(100 + i, "hello"));
        (void)::send(stuck.fd, many.data(), many.size(), MSG_NOSIGNAL);
    });
    // Another client watches the run and must keep seeing it.
    Events ev;
    auto other = tcp.client(&ev);
    ASSERT_TRUE(other);
    auto w = other->call("watch", {{"run_id", id}});
    ASSERT_TRUE(w.isOk()) << w.status().toString();
    const auto t0 = Clock::now();
    bool progressed = false;
    while (!progressed && Clock::now() - t0 < std::chrono::seconds(10)) {
        progressed = ev.count("progress", id) >= 3;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(progressed) << "a client that stopped reading stalled the run's notifications";
    auto c = other->call("cancel", {{"run_id", id}}, 5000);
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    json fin;
    ASSERT_TRUE(ev.waitFor("run_finished", id, &fin, 8000)) << "cancel stalled";
    EXPECT_EQ(fin["status"], "cancelled");
    // The reader that stopped is dropped (its queue overflowed, or nothing could be written to
    // it for writeStallMs); the one that reads is not, although the burst of output was bigger
    // than its queue.
    EXPECT_TRUE(other->connected());
    bool dropped = false;
    for (auto end = Clock::now() + std::chrono::seconds(5); !dropped && Clock::now() < end;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::lock_guard lock(logMu);
        for (const auto& l : logs) dropped = dropped || l.find("dropped client") != std::string::npos;
    }
    EXPECT_TRUE(dropped);
    ::shutdown(stuck.fd, SHUT_RDWR);
    flood.join();
}

// A run that completed was recorded cancelled when the cancel came after its last step.
TEST(AgentHardening, ARunThatCompletedIsNotRecordedCancelled) {
    TempDir dir("ts_harden");
    TcpAgent tcp(dir, "trapterm", [](AgentOptions& o) { o.cancelGraceMs = 10000; });
    Events ev;
    auto client = tcp.client(&ev);
    ASSERT_TRUE(client);
    auto started = client->call("start_run", {{"yaml", kTinyYaml}});
    ASSERT_TRUE(started.isOk());
    const std::string id = (*started)["run_id"];
    ASSERT_TRUE(ev.waitFor("progress", id, nullptr));
    ASSERT_TRUE(client->call("cancel", {{"run_id", id}}).isOk());
    json fin;
    ASSERT_TRUE(ev.waitFor("run_finished", id, &fin, 20000));
    EXPECT_EQ(fin["status"], "completed") << fin.dump();
    EXPECT_EQ(statusOf((*started)["run_file"]), "completed");
}

// One listing made 76 fdatasync calls: listing now writes nothing (index and run files untouched).
TEST(AgentHardening, ListingRunsWritesNothing) {
    TempDir dir("ts_harden");
    auto ws = Workspace::open(dir.path + "/ws");
    ASSERT_TRUE(ws.isOk());
    const std::string indexed = ws->runsDir() + "/20250131T120000000Z-aaaaaa.sqlite";
    const std::string changed = ws->runsDir() + "/20250131T120001000Z-bbbbbb.sqlite";
    const std::string fresh = ws->runsDir() + "/20250131T120002000Z-cccccc.sqlite";
    writeRunFile(indexed, "20250131T120000000Z-aaaaaa", "completed");
    writeRunFile(changed, "20250131T120001000Z-bbbbbb", "completed");
    ASSERT_TRUE(ws->indexRun(indexed).isOk());
    ASSERT_TRUE(ws->indexRun(changed).isOk());
    {
        auto s = ts::profiler::TraceStore::open(changed, false);
        ASSERT_TRUE(s.isOk());
        auto info = (*s)->runInfo();
        info->name = "renamed-behind-the-index";
        ASSERT_TRUE((*s)->setRunInfo(*info).isOk());
    }
    writeRunFile(fresh, "20250131T120002000Z-cccccc", "completed");
    // A run still being written: its WAL holds the rows, a writer connection stays open.
    const std::string live = ws->runsDir() + "/20250131T120003000Z-dddddd.sqlite";
    writeRunFile(live, "20250131T120003000Z-dddddd", "running");
    auto writer = ts::profiler::TraceStore::open(live, false);
    ASSERT_TRUE(writer.isOk());
    ASSERT_TRUE((*writer)->appendLog("info", "still going").isOk());

    auto snapshot = [&] {
        std::map<std::string, std::pair<int64_t, int64_t>> out;
        for (const auto& e : fs::recursive_directory_iterator(ws->dir())) {
            // -shm is SQLite's shared memory between connections (readers take read marks
            // there); it holds nothing durable.
            if (e.path().string().ends_with("-shm")) continue;
            struct stat st {};
            if (::stat(e.path().c_str(), &st) == 0 && S_ISREG(st.st_mode))
                out[e.path().string()] = {int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, st.st_size};
        }
        return out;
    };
    const auto before = snapshot();
    auto list = ws->listRuns();
    ASSERT_TRUE(list.isOk()) << list.status().toString();
    ASSERT_EQ(list->size(), 4u);
    bool sawRename = false;
    for (const auto& r : *list) sawRename = sawRename || r.name == "renamed-behind-the-index";
    EXPECT_TRUE(sawRename) << "the listing must show what the run file says";
    {
        auto agent = makeAgent(dir, "ok");
        Raw c(*agent);
        for (int i = 0; i < 3; ++i) {
            json r = c.call(i + 1, "list_runs");
            ASSERT_EQ(r["result"]["runs"].size(), 4u) << r.dump();
        }
    }
    const auto after = snapshot();
    for (const auto& [path, st] : before) {
        auto it = after.find(path);
        ASSERT_NE(it, after.end()) << path << " disappeared";
        EXPECT_EQ(it->second, st) << path << " was written by a listing";
    }
    // Reading a WAL-mode run file makes SQLite open (and so create) an empty -wal beside it:
    // no data, no fsync. Anything else new is a write.
    for (const auto& [path, st] : after)
        if (!before.count(path)) {
            EXPECT_TRUE(path.ends_with("-wal") && st.second == 0) << path << " was created by a listing";
        }
}

// Under 50 concurrent clients most connections were refused as busy.
TEST(AgentHardening, FiftyClientsAreServedAtOnce) {
    TempDir dir("ts_harden");
    TcpAgent tcp(dir, "ok");
    std::atomic<int> ok{0}, failed{0};
    std::mutex errMu;
    std::string firstError;
    std::vector<std::thread> threads;
    for (int i = 0; i < 50; ++i) {
        threads.emplace_back([&] {
            ConnectOptions co;
            co.token = kToken;
            auto c = NodeClient::connect(tcp.url, co);
            bool good = c.isOk();
            for (int k = 0; good && k < 3; ++k) {
                auto l = (*c)->call("list_runs", json::object(), 20000);
                good = l.isOk();
                if (!good) {
                    std::lock_guard lock(errMu);
                    if (firstError.empty()) firstError = l.status().toString();
                }
            }
            if (!c.isOk()) {
                std::lock_guard lock(errMu);
                if (firstError.empty()) firstError = c.status().toString();
            }
            (good ? ok : failed)++;
            if (c.isOk()) std::this_thread::sleep_for(std::chrono::milliseconds(500));  // stay connected a while
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 50) << failed.load() << " clients failed, e.g. " << firstError;
}

// Port 99999 silently became another port (99999 mod 65536).
TEST(AgentHardening, PortsOutsideOneTo65535AreRefused) {
    TempDir dir("ts_harden");
    auto agent = makeAgent(dir, "ok");
    for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:65536", ":-1", "127.0.0.1:7x", "127.0.0.1:"}) {
        ts::Status s = agent->listen(bad);
        EXPECT_FALSE(s.isOk()) << bad;
    }
    for (const char* bad : {"tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://127.0.0.1:65536", "tcp://[::1]:70000"}) {
        ConnectOptions co;
        co.token = kToken;
        auto c = NodeClient::connect(bad, co);
        ASSERT_FALSE(c.isOk()) << bad;
        EXPECT_NE(c.status().message().find("out of range"), std::string::npos) << bad << ": " << c.status().toString();
    }
}

// An authenticated client could make the node write checkpoints anywhere (save:).
TEST(AgentHardening, PathKnobsStayInTheWorkspaceUnlessAllowed) {
    TempDir dir("ts_harden");
    const std::string outside = dir.path + "/outside";
    fs::create_directories(outside);
    {
        auto agent = makeAgent(dir, "ok");
        Raw c(*agent);
        int id = 0;
        for (const auto& [knob, value] : std::vector<std::pair<std::string, std::string>>{
                 {"save", outside + "/ckpt"}, {"save", "../../outside"}, {"save", "/etc"},
                 {"load", outside + "/ckpt"}, {"data_path", "/etc/passwd"}, {"data_path", "../../../etc/x"}}) {
            json cfg = {{"num_layers", 2}, {"hidden_size", 64}, {"num_attention_heads", 2}, {"seq_length", 32}};
            cfg[knob] = value;
            json r = c.call(++id, "start_run", {{"config", cfg}});
            ASSERT_TRUE(r.contains("error")) << knob << "=" << value << " was accepted: " << r.dump();
            EXPECT_EQ(r["error"]["code"], rpc::kInvalidConfig) << r.dump();
            EXPECT_NE(r.dump().find("--allow-path"), std::string::npos) << r.dump();
            r = c.call(++id, "validate", {{"config", cfg}});
            EXPECT_EQ(r["result"]["ok"], false) << r.dump();
        }
        // Relative paths land in the workspace's checkpoints/ and data/ folders.
        json r = c.call(++id, "validate", {{"yaml", std::string(kTinyYaml) + "save: my-ckpt\nload: my-ckpt\n"}});
        ASSERT_EQ(r["result"]["ok"], true) << r.dump();
        const std::string ws = fs::weakly_canonical(dir.path + "/ws").string();
        EXPECT_EQ(r["result"]["config"]["save"], ws + "/checkpoints/my-ckpt");
        EXPECT_EQ(r["result"]["config"]["load"], ws + "/checkpoints/my-ckpt");
        r = c.call(++id, "validate", {{"yaml", std::string(kTinyYaml) + "data_path: synthetic\n"}});
        EXPECT_EQ(r["result"]["ok"], true) << r.dump();
    }
    // The node's owner allows a folder.
    auto agent = makeAgent(dir, "ok", [&](AgentOptions& o) { o.allowedPaths = {outside}; });
    Raw c(*agent);
    json r = c.call(1, "validate", {{"yaml", std::string(kTinyYaml) + "save: " + outside + "/ckpt\n"}});
    EXPECT_EQ(r["result"]["ok"], true) << r.dump();
    r = c.call(2, "validate", {{"yaml", std::string(kTinyYaml) + "save: " + outside + "/../elsewhere\n"}});
    EXPECT_EQ(r["result"]["ok"], false) << r.dump();
}

// A run left "running" by a process that died stayed running forever.
TEST(AgentHardening, RunsOfProcessesThatAreGoneAreMarkedFailed) {
    TempDir dir("ts_harden");
    auto ws = Workspace::open(dir.path + "/ws");
    ASSERT_TRUE(ws.isOk());
    // A pid that is gone: a child that already exited and was reaped.
    auto child = ChildProcess::spawn({"/bin/true"}, SpawnOptions{});
    ASSERT_TRUE(child.isOk());
    const int64_t deadPid = child->pid();
    child->wait();
    WriterProcess me = currentWriterProcess();
    const std::string stale = ws->runsDir() + "/20250131T120000000Z-aaaaaa.sqlite";
    const std::string reused = ws->runsDir() + "/20250131T120001000Z-bbbbbb.sqlite";
    const std::string alive = ws->runsDir() + "/20250131T120002000Z-cccccc.sqlite";
    const std::string unknown = ws->runsDir() + "/20250131T120003000Z-dddddd.sqlite";
    writeRunFile(stale, "20250131T120000000Z-aaaaaa", "running",
                 {{"writer_pid", std::to_string(deadPid)}, {"writer_host", me.host}, {"writer_boot_id", me.bootId}});
    // Our own pid, but another process start time: the pid was reused.
    writeRunFile(reused, "20250131T120001000Z-bbbbbb", "running",
                 {{"writer_pid", std::to_string(me.pid)}, {"writer_start", "1"}, {"writer_host", me.host}});
    writeRunFile(alive, "20250131T120002000Z-cccccc", "running", writerProcessMetadata());
    writeRunFile(unknown, "20250131T120003000Z-dddddd", "running");  // nothing recorded: left alone
    auto agent = makeAgent(dir, "ok");  // the agent sweeps on start
    std::string reason;
    EXPECT_EQ(statusOf(stale, &reason), "failed");
    EXPECT_EQ(reason, kStaleRunReason);
    EXPECT_EQ(statusOf(reused), "failed");
    EXPECT_EQ(statusOf(alive), "running");
    EXPECT_EQ(statusOf(unknown), "running");
    auto list = ws->findRun("20250131T120000000Z-aaaaaa");
    ASSERT_TRUE(list.isOk());
    EXPECT_EQ(list->status, "failed");
    // An agent killed before finalising a run whose child died before writing anything: its
    // note in tmp/ makes the next agent write a failed run file.
    agent.reset();
    const std::string orphanId = "20250131T120004000Z-eeeeee";
    json note = {{"run_id", orphanId}, {"name", "orphan"}, {"created_at", "2025-01-31T12:00:04Z"},
                 {"agent", {{"pid", deadPid}, {"host", me.host}}}, {"child", {{"pid", deadPid}, {"host", me.host}}}};
    std::ofstream(ws->tmpDir() + "/" + orphanId + ".run.json") << note.dump();
    agent = makeAgent(dir, "ok");
    EXPECT_EQ(statusOf(ws->runsDir() + "/" + orphanId + ".sqlite", &reason), "failed");
    EXPECT_EQ(reason, kStaleRunReason);
    EXPECT_FALSE(fs::exists(ws->tmpDir() + "/" + orphanId + ".run.json"));
}
