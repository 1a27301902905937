// Node agent reliability: spec error codes, message size limit, TCP token, runs that complete,
// crash (SIGKILL mid-run), get cancelled, two clients at once, a client that disconnects.
// Runs use a stand-in runner (a shell script speaking `trainscope run --json`) so these tests
// are fast and deterministic; tests/sessions/test_cli_agent.cpp drives the real binary.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "engine/backend/backend.h"
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
using ts::sessions::testutil::TempDir;
using ts::sessions::testutil::Events;

namespace {

// Speaks the `trainscope run CFG --json --run-file PATH [--steps N]` line protocol.
// $1 = mode (ok | crash | fail | slow), then the arguments the agent passes.
constexpr const char* kFakeRunner = R"SH(#!/bin/sh
mode=$1; shift
[ "$1" = run ] || { echo "expected 'run'" >&2; exit 2; }
shift; cfg=$1; shift
runfile=""; steps=3
while [ $# -gt 0 ]; do
  case $1 in
    --run-file) runfile=$2; shift 2;;
    --steps) steps=$2; shift 2;;
    --json) shift;;
    *) shift 2;;
  esac
done
[ -f "$cfg" ] || { echo "config $cfg missing" >&2; exit 2; }
delay=0.02
[ "$mode" = slow ] && delay=0.2
echo "{\"event\":\"start\",\"run_file\":\"$runfile\"}"
i=1
while [ $i -le $steps ]; do
  sleep $delay
  echo "{\"event\":\"step\",\"step\":$i,\"loss\":$((10 - i)).5,\"step_time_s\":$delay,\"tokens_per_s\":1000,\"model_tflops\":0.5,\"peak_memory_bytes\":$((1000 * i))}"
  if [ "$mode" = crash ] && [ $i -eq 2 ]; then echo "simulated fatal error" >&2; kill -9 $$; fi
  i=$((i + 1))
done
if [ "$mode" = fail ]; then echo "{\"event\":\"end\",\"status\":\"failed\",\"reason\":\"loss is NaN at step 3\"}"; exit 1; fi
echo "{\"event\":\"end\",\"status\":\"completed\"}"
)SH";

std::string writeFakeRunner(const std::string& dir) {
    std::string p = dir + "/fake_run.sh";
    std::ofstream(p) << kFakeRunner;
    fs::permissions(p, fs::perms::owner_all);
    return p;
}

constexpr const char* kTinyYaml = "position_embedding_type: rope\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 2\nseq_length: 32\n";

// A raw connection over a socketpair to an agent served on another thread.
struct RawConn {
    int fd = -1;
    std::thread server;
    rpc::FrameReader reader{size_t(64) << 20};
    RawConn(Agent& agent, bool requireAuth) {
        int sv[2];
        EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        fd = sv[0];
        int theirs = sv[1];
        server = std::thread([&agent, theirs, requireAuth] {
            (void)agent.serve(theirs, theirs, requireAuth);
            ::shutdown(theirs, SHUT_RDWR);
            ::close(theirs);
        });
    }
    ~RawConn() {
        ::shutdown(fd, SHUT_RDWR);
        server.join();
        ::close(fd);
    }
    void sendRaw(const std::string& bytes) { ASSERT_TRUE(writeAll(fd, bytes.data(), bytes.size())); }
    void send(const json& j) { sendRaw(rpc::encodeFrame(j)); }
    // Next message (skipping notifications unless wanted); null on EOF/timeout.
    json next(bool skipNotifications = true, int timeoutMs = 10000) {
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
        char buf[65536];
        for (;;) {
            for (;;) {
                auto ev = reader.next();
                if (ev.kind == rpc::FrameEvent::Kind::None) break;
                json j = json::parse(ev.body);
                if (skipNotifications && j.contains("method")) continue;
                return j;
            }
            if (std::chrono::steady_clock::now() > deadline) return nullptr;
            timeval tv{0, 100000};
            ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            ssize_t n = ::read(fd, buf, sizeof buf);
            if (n == 0) return nullptr;
            if (n > 0) reader.feed(buf, size_t(n));
        }
    }
    json call(int id, const std::string& method, const json& params = json::object()) {
        send(rpc::makeRequest(id, method, params));
        return next();
    }
};

std::unique_ptr<Agent> makeAgent(const TempDir& dir, const std::string& mode, std::string token = "",
                                 size_t maxBytes = rpc::kDefaultMaxMessageBytes) {
    AgentOptions o;
    o.workspaceDir = dir.path + "/ws";
    o.runnerCommand = {"/bin/sh", writeFakeRunner(dir.path), mode};
    o.token = std::move(token);
    o.maxMessageBytes = maxBytes;
    o.cancelGraceMs = 1000;
    o.nodeName = "testnode";
    auto a = Agent::create(o);
    EXPECT_TRUE(a.isOk()) << a.status().toString();
    return std::move(*a);
}

struct TcpAgent {
    std::unique_ptr<Agent> agent;
    std::thread loop;
    std::string url;
    TcpAgent(const TempDir& dir, const std::string& mode, const std::string& token) {
        agent = makeAgent(dir, mode, token);
        ts::Status s = agent->listen("127.0.0.1:0");
        EXPECT_TRUE(s.isOk()) << s.toString();
        url = "tcp://127.0.0.1:" + std::to_string(agent->boundPort());
        loop = std::thread([this] { (void)agent->serveTcp(); });
    }
    ~TcpAgent() {
        agent->requestShutdown();
        loop.join();
    }
};

ConnectOptions withToken(const std::string& t) {
    ConnectOptions o;
    o.token = t;
    return o;
}

}  // namespace

TEST(Agent, MalformedRequestsGetSpecErrorCodesAndAgentSurvives) {
    TempDir dir("ts_agent_test");
    auto agent = makeAgent(dir, "ok");
    RawConn c(*agent, /*requireAuth=*/false);

    c.sendRaw(rpc::encodeFrameBody("{not json"));
    json r = c.next();
    EXPECT_EQ(r["error"]["code"], rpc::kParseError);
    EXPECT_TRUE(r["id"].is_null());

    c.sendRaw(rpc::encodeFrameBody(R"({"jsonrpc":"2.0","method":1,"id":4})"));
    r = c.next();
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidRequest);
    EXPECT_EQ(r["id"], 4);

    r = c.call(5, "no_such_method");
    EXPECT_EQ(r["error"]["code"], rpc::kMethodNotFound);
    EXPECT_EQ(r["id"], 5);

    r = c.call(6, "cancel", json::object());
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidParams);
    r = c.call(7, "start_run", json::array({1, 2}));
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidParams);
    r = c.call(8, "fetch_run", {{"run_id", 3}});
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidParams);

    // A config with a mistake is an invalid-config error that lists the problem.
    r = c.call(9, "start_run", {{"yaml", "num_layers: 2\nnot_a_knob: 1\n"}});
    EXPECT_EQ(r["error"]["code"], rpc::kInvalidConfig);
    EXPECT_NE(r["error"]["data"]["issues"].dump().find("not_a_knob"), std::string::npos);

    // Batch: one response per request, none for the notification.
    c.sendRaw(rpc::encodeFrameBody(
        R"([{"jsonrpc":"2.0","method":"hello","id":"a"},{"jsonrpc":"2.0","method":"hello"},{"x":1}])"));
    r = c.next();
    ASSERT_TRUE(r.is_array());
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0]["id"], "a");
    EXPECT_EQ(r[0]["result"]["protocol_version"], kProtocolVersion);
    EXPECT_EQ(r[1]["error"]["code"], rpc::kInvalidRequest);

    // Still alive and answering.
    r = c.call(10, "hello");
    EXPECT_EQ(r["result"]["agent"], "trainscope");
    r = c.call(11, "devices");
    EXPECT_GE(r["result"]["count"].get<int>(), 1);
    EXPECT_GT(r["result"]["devices"][0]["memory_total_bytes"].get<int64_t>(), 0);
}

TEST(Agent, OversizeMessageIsRejectedAndConnectionContinues) {
    TempDir dir("ts_agent_test");
    auto agent = makeAgent(dir, "ok", "", /*maxBytes=*/4096);
    RawConn c(*agent, false);
    json big = rpc::makeRequest(1, "validate", {{"yaml", std::string(100000, '#')}});
    c.send(big);
    json r = c.next();
    EXPECT_EQ(r["error"]["code"], rpc::kMessageTooLarge);
    r = c.call(2, "hello");
    EXPECT_EQ(r["id"], 2);
    EXPECT_EQ(r["result"]["agent"], "trainscope");
}

TEST(Agent, ValidateReportsIssues) {
    TempDir dir("ts_agent_test");
    auto agent = makeAgent(dir, "ok");
    RawConn c(*agent, false);
    json r = c.call(1, "validate", {{"yaml", kTinyYaml}});
    EXPECT_EQ(r["result"]["ok"], true) << r.dump();
    r = c.call(2, "validate", {{"yaml", "num_attention_heads: 3\nhidden_size: 64\n"}});
    EXPECT_EQ(r["result"]["ok"], false);
    EXPECT_FALSE(r["result"]["issues"].empty());
}

// A valid config this node cannot run says so in validate's node_issues (the workbench keeps Run
// off): device_backend: cuda where the CUDA backend is unusable names why (no build, no driver,
// no GPU); where there is one, a layout with more ranks than GPUs is named. The CPU runs anything.
TEST(Agent, ValidateSaysWhatThisNodeCannotRun) {
    TempDir dir("ts_agent_test");
    auto agent = makeAgent(dir, "ok");
    RawConn c(*agent, false);
    json r = c.call(1, "validate", {{"yaml", kTinyYaml}});
    ASSERT_EQ(r["result"]["ok"], true) << r.dump();
    EXPECT_TRUE(r["result"]["node_issues"].empty()) << r.dump();
    auto cuda = ts::engine::makeCudaBackend();
    const int gpus = cuda ? (*cuda)->deviceCount() : 0;
    const std::string yaml = std::string(kTinyYaml) + "device_backend: cuda\ntensor_model_parallel_size: 2\n" +
                             "data_parallel_size: " + std::to_string(gpus + 1) + "\n";
    r = c.call(2, "validate", {{"yaml", yaml}});
    ASSERT_EQ(r["result"]["ok"], true) << r.dump();  // the config itself is fine
    const json& issues = r["result"]["node_issues"];
    ASSERT_EQ(issues.size(), 1u) << r.dump();
    const std::string why = issues[0].get<std::string>();
    EXPECT_NE(why.find("device_backend: cuda"), std::string::npos) << why;
    if (!cuda) {
        EXPECT_NE(why.find(cuda.status().message()), std::string::npos) << why;
    } else if (std::getenv("TS_CUDA_UNVERIFIED")) {
        EXPECT_NE(why.find("cuda_share_gpus: true"), std::string::npos) << why;
    } else {
        EXPECT_NE(why.find("TS_CUDA_UNVERIFIED=1"), std::string::npos) << why;
    }
}

TEST(Agent, TcpRefusesMissingOrWrongTokenAndAcceptsTheRightOne) {
    TempDir dir("ts_agent_test");
    {
        auto noToken = makeAgent(dir, "ok", "");
        EXPECT_FALSE(noToken->listen("127.0.0.1:0").isOk());  // never listen without a token
    }
    TcpAgent tcp(dir, "ok", "s3cret-token-for-tests-01");

    // Raw client that skips authentication: refused and disconnected.
    {
        auto fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(uint16_t(tcp.agent->boundPort()));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
        std::string f = rpc::encodeFrame(rpc::makeRequest(1, "list_runs"));
        ASSERT_TRUE(writeAll(fd, f.data(), f.size()));
        rpc::FrameReader fr;
        char buf[4096];
        json reply;
        bool eof = false;
        for (int i = 0; i < 100 && !eof; ++i) {
            ssize_t n = ::read(fd, buf, sizeof buf);
            if (n <= 0) { eof = true; break; }
            fr.feed(buf, size_t(n));
            auto ev = fr.next();
            if (ev.kind == rpc::FrameEvent::Kind::Message) reply = json::parse(ev.body);
        }
        EXPECT_EQ(reply["error"]["code"], rpc::kUnauthorized);
        EXPECT_TRUE(eof) << "connection must be closed after an unauthenticated request";
        ::close(fd);
    }
    auto wrong = NodeClient::connect(tcp.url, withToken("s3cret-token-for-tests-0X"));
    ASSERT_FALSE(wrong.isOk());
    EXPECT_NE(wrong.status().message().find("wrong token"), std::string::npos) << wrong.status().toString();

    auto ok = NodeClient::connect(tcp.url, withToken("s3cret-token-for-tests-01"));
    ASSERT_TRUE(ok.isOk()) << ok.status().toString();
    auto devices = (*ok)->call("devices");
    ASSERT_TRUE(devices.isOk()) << devices.status().toString();
    EXPECT_EQ((*devices)["backend"], "cpu");
}

TEST(Agent, RunCompletesStreamsProgressAndCanBeFetched) {
    TempDir dir("ts_agent_test");
    TcpAgent tcp(dir, "ok", "agent-test-token-0123456789");
    auto client = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
    ASSERT_TRUE(client.isOk()) << client.status().toString();
    Events ev;
    (*client)->setNotificationHandler([&](const std::string& m, const json& p) { ev.add(m, p); });
    auto started = (*client)->call("start_run", {{"yaml", kTinyYaml}, {"steps", 4}, {"name", "fake-ok"}});
    ASSERT_TRUE(started.isOk()) << started.status().toString();
    std::string id = (*started)["run_id"];
    json fin;
    ASSERT_TRUE(ev.waitFor("run_finished", id, &fin));
    EXPECT_EQ(fin["status"], "completed") << fin.dump();
    EXPECT_EQ(ev.count("progress", id), 4);

    auto list = (*client)->call("list_runs");
    ASSERT_TRUE(list.isOk());
    bool found = false;
    for (auto& r : (*list)["runs"])
        if (r["id"] == id) {
            found = true;
            EXPECT_EQ(r["status"], "completed");
            EXPECT_EQ(r["name"], "fake-ok");
        }
    EXPECT_TRUE(found) << list->dump();

    std::string dest = dir.path + "/fetched.sqlite";
    ts::Status s = (*client)->fetchRun(id, dest);
    ASSERT_TRUE(s.isOk()) << s.toString();
    auto store = ts::profiler::TraceStore::open(dest, true);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto info = (*store)->runInfo();
    ASSERT_TRUE(info.isOk());
    EXPECT_EQ(info->status, "completed");
    EXPECT_EQ(info->id, id);

    // A run the agent does not know.
    auto missing = (*client)->call("fetch_run", {{"run_id", "nope"}});
    EXPECT_FALSE(missing.isOk());
}

TEST(Agent, ChildKilledMidRunLeavesReadableRunFileMarkedFailed) {
    TempDir dir("ts_agent_test");
    TcpAgent tcp(dir, "crash", "agent-test-token-0123456789");
    auto client = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
    ASSERT_TRUE(client.isOk());
    Events ev;
    (*client)->setNotificationHandler([&](const std::string& m, const json& p) { ev.add(m, p); });
    auto started = (*client)->call("start_run", {{"yaml", kTinyYaml}, {"steps", 5}});
    ASSERT_TRUE(started.isOk()) << started.status().toString();
    std::string id = (*started)["run_id"];
    std::string path = (*started)["run_file"];
    json fin;
    ASSERT_TRUE(ev.waitFor("run_finished", id, &fin));
    EXPECT_EQ(fin["status"], "failed");
    const std::string reason = fin["reason"];
    EXPECT_NE(reason.find("SIGKILL"), std::string::npos) << reason;
    EXPECT_NE(reason.find("simulated fatal error"), std::string::npos) << reason;

    auto store = ts::profiler::TraceStore::open(path, true);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto info = (*store)->runInfo();
    ASSERT_TRUE(info.isOk());
    EXPECT_EQ(info->status, "failed");
    EXPECT_EQ(info->statusReason, reason);
    EXPECT_FALSE(info->finishedAt.empty());

    // The agent is unharmed and the workspace lists the failed run.
    auto hello = (*client)->call("hello");
    EXPECT_TRUE(hello.isOk());
    auto ws = Workspace::open(dir.path + "/ws");
    ASSERT_TRUE(ws.isOk());
    auto s = ws->findRun(id);
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    EXPECT_EQ(s->status, "failed");
}

TEST(Agent, RunReportingFailureKeepsItsReason) {
    TempDir dir("ts_agent_test");
    TcpAgent tcp(dir, "fail", "agent-test-token-0123456789");
    auto client = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
    ASSERT_TRUE(client.isOk());
    Events ev;
    (*client)->setNotificationHandler([&](const std::string& m, const json& p) { ev.add(m, p); });
    auto started = (*client)->call("start_run", {{"yaml", kTinyYaml}});
    ASSERT_TRUE(started.isOk());
    json fin;
    ASSERT_TRUE(ev.waitFor("run_finished", (*started)["run_id"], &fin));
    EXPECT_EQ(fin["status"], "failed");
    EXPECT_EQ(fin["reason"], "loss is NaN at step 3");
}

TEST(Agent, CancelDuringRun) {
    TempDir dir("ts_agent_test");
    TcpAgent tcp(dir, "slow", "agent-test-token-0123456789");
    auto client = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
    ASSERT_TRUE(client.isOk());
    Events ev;
    (*client)->setNotificationHandler([&](const std::string& m, const json& p) { ev.add(m, p); });
    auto started = (*client)->call("start_run", {{"yaml", kTinyYaml}, {"steps", 1000}});
    ASSERT_TRUE(started.isOk());
    std::string id = (*started)["run_id"];
    ASSERT_TRUE(ev.waitFor("progress", id, nullptr));
    auto t0 = std::chrono::steady_clock::now();
    auto c = (*client)->call("cancel", {{"run_id", id}});
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    json fin;
    ASSERT_TRUE(ev.waitFor("run_finished", id, &fin));
    EXPECT_EQ(fin["status"], "cancelled");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_LT(ev.count("progress", id), 1000);
    auto ws = Workspace::open(dir.path + "/ws");
    auto s = ws->findRun(id);
    ASSERT_TRUE(s.isOk());
    EXPECT_EQ(s->status, "cancelled");
    // Cancelling again says it is over.
    c = (*client)->call("cancel", {{"run_id", id}});
    ASSERT_TRUE(c.isOk());
    EXPECT_EQ((*c)["already_finished"], true);
}

TEST(Agent, TwoClientsAtOnceEachSeeOnlyTheirRun) {
    TempDir dir("ts_agent_test");
    TcpAgent tcp(dir, "ok", "agent-test-token-0123456789");
    auto a = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
    auto b = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
    ASSERT_TRUE(a.isOk());
    ASSERT_TRUE(b.isOk());
    Events ea, eb;
    (*a)->setNotificationHandler([&](const std::string& m, const json& p) { ea.add(m, p); });
    (*b)->setNotificationHandler([&](const std::string& m, const json& p) { eb.add(m, p); });
    auto ra = (*a)->call("start_run", {{"yaml", kTinyYaml}, {"steps", 5}});
    auto rb = (*b)->call("start_run", {{"yaml", kTinyYaml}, {"steps", 3}});
    ASSERT_TRUE(ra.isOk());
    ASSERT_TRUE(rb.isOk());
    std::string ida = (*ra)["run_id"], idb = (*rb)["run_id"];
    EXPECT_NE(ida, idb);
    json fa, fb;
    ASSERT_TRUE(ea.waitFor("run_finished", ida, &fa));
    ASSERT_TRUE(eb.waitFor("run_finished", idb, &fb));
    EXPECT_EQ(fa["status"], "completed");
    EXPECT_EQ(fb["status"], "completed");
    EXPECT_EQ(ea.count("progress", ida), 5);
    EXPECT_EQ(eb.count("progress", idb), 3);
    EXPECT_EQ(ea.count("progress", idb), 0);
    EXPECT_EQ(eb.count("progress", ida), 0);
}

TEST(Agent, ClientDisconnectMidRunRunFinishesAndIsListed) {
    TempDir dir("ts_agent_test");
    TcpAgent tcp(dir, "slow", "agent-test-token-0123456789");
    std::string id;
    {
        auto a = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
        ASSERT_TRUE(a.isOk());
        Events ev;
        (*a)->setNotificationHandler([&](const std::string& m, const json& p) { ev.add(m, p); });
        auto r = (*a)->call("start_run", {{"yaml", kTinyYaml}, {"steps", 6}});
        ASSERT_TRUE(r.isOk());
        id = (*r)["run_id"];
        ASSERT_TRUE(ev.waitFor("progress", id, nullptr));
        (*a)->close();  // gone mid-run
    }
    auto b = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
    ASSERT_TRUE(b.isOk());
    std::string status;
    for (int i = 0; i < 100; ++i) {
        auto list = (*b)->call("list_runs");
        ASSERT_TRUE(list.isOk());
        for (auto& r : (*list)["runs"])
            if (r["id"] == id) status = r["status"];
        if (status == "completed") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(status, "completed");
}

TEST(Agent, ShutdownCancelsRunsAndStopsServing) {
    TempDir dir("ts_agent_test");
    TcpAgent tcp(dir, "slow", "agent-test-token-0123456789");
    auto a = NodeClient::connect(tcp.url, withToken("agent-test-token-0123456789"));
    ASSERT_TRUE(a.isOk());
    auto r = (*a)->call("start_run", {{"yaml", kTinyYaml}, {"steps", 1000}});
    ASSERT_TRUE(r.isOk());
    auto s = (*a)->call("shutdown");
    ASSERT_TRUE(s.isOk()) << s.status().toString();
    tcp.agent->waitForRuns();
    EXPECT_EQ(tcp.agent->activeRuns(), 0);
    auto ws = Workspace::open(dir.path + "/ws");
    auto run = ws->findRun((*r)["run_id"]);
    ASSERT_TRUE(run.isOk());
    EXPECT_EQ(run->status, "cancelled");
}
