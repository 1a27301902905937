// End to end with the real `trainscope` binary: runs as child processes of the agent, a real
// run killed with SIGKILL, the stdio agent as a local node and behind an "ssh" command, the TCP
// agent process and its token, and the runs/export/compare commands on the stored runs.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "engine/config/knobs.h"
#include "profiler/store.h"
#include "session_test_util.h"
#include "tests/sessions/cli_process_util.h"
#include "sessions/agent.h"
#include "sessions/export.h"
#include "sessions/node_client.h"
#include "sessions/process.h"
#include "sessions/workspace.h"

using namespace ts::sessions;
using nlohmann::json;
namespace fs = std::filesystem;
using ts::sessions::testutil::TempDir;
using ts::sessions::testutil::Events;
using ts::sessions::testutil::haveBinary;
using ts::sessions::testutil::kBinary;
using ts::sessions::testutil::kMicroYaml;
using ts::sessions::testutil::runCli;

namespace {


std::vector<double> lossesOf(const std::string& runFile) {
    std::vector<double> out;
    auto store = ts::profiler::TraceStore::open(runFile, true);
    if (!store) return out;
    auto steps = (*store)->stepMetrics();
    if (steps)
        for (const auto& m : *steps) out.push_back(m.loss);
    return out;
}

}  // namespace

TEST(CliAgent, LocalStdioNodeRunsRealTrainingAndStoresTheRunLocally) {
    if (!haveBinary()) GTEST_SKIP() << kBinary << " not built";
    TempDir d("ts_cli_agent");
    NodeRunRequest req;
    req.nodeUrl = "local";
    req.configYaml = kMicroYaml;
    req.name = "via-agent";
    req.workspaceDir = d.path + "/local";
    req.connect.agentExe = kBinary;
    req.connect.localAgentArgs = {"--workspace", d.path + "/node"};  // the node keeps its own copy
    std::vector<json> progress;
    auto r = runOnNode(req, [&](const std::string& m, const json& p) {
        if (m == "progress") progress.push_back(p);
    });
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(r->status, "completed") << r->reason;
    ASSERT_EQ(progress.size(), 3u);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(progress[size_t(i)]["step"], i + 1);
        EXPECT_TRUE(progress[size_t(i)].contains("loss"));
        EXPECT_TRUE(progress[size_t(i)].contains("trace_rows") || i > 0);
    }
    // Stored locally, readable, and equal to what the node streamed.
    EXPECT_EQ(fs::path(r->run.path).parent_path(), fs::path(d.path + "/local/runs"));
    EXPECT_EQ(r->run.status, "completed");
    EXPECT_EQ(r->run.steps, 3);
    auto losses = lossesOf(r->run.path);
    ASSERT_EQ(losses.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(losses[size_t(i)], progress[size_t(i)]["loss"].get<double>());

    // Export yaml from the stored run, rerun it headless: same config, same losses (seeded).
    const std::string exported = d.path + "/exported.yaml";
    ASSERT_EQ(runCli({"export", r->run.id, "--format", "yaml", "--workspace", req.workspaceDir, "--out", exported}), 0);
    auto loaded = ts::engine::loadConfigFile(exported);
    ASSERT_TRUE(loaded.ok());
    auto original = configOfRunFile(r->run.path);
    ASSERT_TRUE(original.isOk());
    EXPECT_EQ(ts::engine::configToJson(loaded.config), ts::engine::configToJson(*original));
    const std::string rerun = d.path + "/local/runs/rerun.sqlite";
    ASSERT_EQ(runCli({"run", exported, "--json", "--run-file", rerun}), 0);
    EXPECT_EQ(lossesOf(rerun), losses);
    auto rerunCfg = configOfRunFile(rerun);
    ASSERT_TRUE(rerunCfg.isOk());
    EXPECT_EQ(ts::engine::configToJson(*rerunCfg), ts::engine::configToJson(*original));

    // runs / compare / export on the CLI.
    std::string out;
    ASSERT_EQ(runCli({"runs", "list", "--workspace", req.workspaceDir, "--json"}, &out), 0);
    json list = json::parse(out);
    ASSERT_EQ(list.size(), 2u) << out;
    ASSERT_EQ(runCli({"compare", r->run.id, "rerun", "--workspace", req.workspaceDir, "--json"}, &out), 0);
    json cmp = json::parse(out);
    EXPECT_TRUE(cmp["knobs"].empty()) << out;  // same config
    ASSERT_EQ(runCli({"export", "via-agent", "--format", "megatron-args", "--workspace", req.workspaceDir}, &out), 0);
    EXPECT_NE(out.find("--num-layers 2 --hidden-size 32"), std::string::npos) << out;
    EXPECT_NE(out.find("--mock-data"), std::string::npos) << out;
    EXPECT_EQ(runCli({"runs", "tag", r->run.id, "baseline", "--workspace", req.workspaceDir}), 0);
    EXPECT_EQ(runCli({"runs", "show", "no-such-run", "--workspace", req.workspaceDir}), 3);
    EXPECT_EQ(runCli({"runs", "delete", "rerun", "--workspace", req.workspaceDir}), 0);
    ASSERT_EQ(runCli({"runs", "--workspace", req.workspaceDir, "--json"}, &out), 0);
    list = json::parse(out);
    ASSERT_EQ(list.size(), 1u);
    EXPECT_EQ(list[0]["tags"], json::array({"baseline"}));
}

TEST(CliAgent, RealRunKilledWithSigkillIsMarkedFailedAndAgentSurvives) {
    if (!haveBinary()) GTEST_SKIP() << kBinary << " not built";
    TempDir d("ts_cli_agent");
    AgentOptions o;
    o.workspaceDir = d.path + "/ws";
    o.runnerCommand = {kBinary};
    o.nodeName = "killtest";
    auto agent = Agent::create(o);
    ASSERT_TRUE(agent.isOk());
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    std::thread server([&] {
        (void)(*agent)->serve(sv[1], sv[1], false);
        ::close(sv[1]);
    });
    // Drive it through the protocol by hand (a NodeClient needs a process or TCP).
    rpc::FrameReader fr(size_t(64) << 20);
    Events ev;
    std::mutex respMu;
    std::condition_variable respCv;
    std::map<int, json> responses;
    std::atomic<bool> stop{false};
    std::thread reader([&] {
        char buf[65536];
        while (!stop) {
            ssize_t n = ::read(sv[0], buf, sizeof buf);
            if (n <= 0) break;
            fr.feed(buf, size_t(n));
            for (auto e = fr.next(); e.kind != rpc::FrameEvent::Kind::None; e = fr.next()) {
                json j = json::parse(e.body);
                if (j.contains("method")) {
                    ev.add(j["method"], j["params"]);
                } else {
                    std::lock_guard l(respMu);
                    responses[j["id"].get<int>()] = j;
                    respCv.notify_all();
                }
            }
        }
    });
    auto call = [&](int id, const std::string& method, const json& params) {
        std::string f = rpc::encodeFrame(rpc::makeRequest(id, method, params));
        EXPECT_TRUE(writeAll(sv[0], f.data(), f.size()));
        std::unique_lock l(respMu);
        respCv.wait_for(l, std::chrono::seconds(30), [&] { return responses.count(id) > 0; });
        return responses[id];
    };
    json started = call(1, "start_run", {{"yaml", kMicroYaml}, {"steps", 100000}});
    ASSERT_TRUE(started.contains("result")) << started.dump();
    const std::string id = started["result"]["run_id"];
    const std::string path = started["result"]["run_file"];
    const int pid = started["result"]["pid"];
    ASSERT_TRUE(ev.waitFor("progress", id, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it write some trace
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    json fin;
    ASSERT_TRUE(ev.waitFor("run_finished", id, &fin));
    EXPECT_EQ(fin["status"], "failed");
    EXPECT_NE(fin["reason"].get<std::string>().find("SIGKILL"), std::string::npos) << fin.dump();

    // The run file is readable, marked failed with the reason, and keeps the steps it recorded.
    auto store = ts::profiler::TraceStore::open(path, true);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto info = (*store)->runInfo();
    ASSERT_TRUE(info.isOk());
    EXPECT_EQ(info->status, "failed");
    EXPECT_EQ(info->statusReason, fin["reason"].get<std::string>());
    EXPECT_EQ(info->node, "killtest");
    auto steps = (*store)->stepMetrics();
    ASSERT_TRUE(steps.isOk());
    EXPECT_GE(steps->size(), 1u);
    auto slices = (*store)->sliceCount();
    ASSERT_TRUE(slices.isOk());
    EXPECT_GT(*slices, 0);

    // The agent still works: a second run completes.
    json again = call(2, "start_run", {{"yaml", kMicroYaml}});
    ASSERT_TRUE(again.contains("result")) << again.dump();
    ASSERT_TRUE(ev.waitFor("run_finished", again["result"]["run_id"], &fin));
    EXPECT_EQ(fin["status"], "completed") << fin.dump();
    json list = call(3, "list_runs", json::object());
    EXPECT_EQ(list["result"]["runs"].size(), 2u);

    stop = true;
    ::shutdown(sv[0], SHUT_RDWR);
    reader.join();
    server.join();
    ::close(sv[0]);
}

TEST(CliAgent, SshLikeNodeAndTcpAgentProcessWithToken) {
    if (!haveBinary()) GTEST_SKIP() << kBinary << " not built";
    TempDir d("ts_cli_agent");
    // "ssh HOST COMMAND" stand-in: runs COMMAND locally with sh.
    const std::string fakeSsh = d.path + "/fake_ssh.sh";
    std::ofstream(fakeSsh) << "#!/bin/sh\nhost=$1; shift\nexec sh -c \"$*\"\n";
    fs::permissions(fakeSsh, fs::perms::owner_all);
    ConnectOptions co;
    co.sshCommand = "/bin/sh " + fakeSsh;
    co.remoteCommand = kBinary + " agent --stdio --workspace " + d.path + "/remote";
    auto ssh = NodeClient::connect("ssh://gpu-node-1", co);
    ASSERT_TRUE(ssh.isOk()) << ssh.status().toString();
    EXPECT_EQ((*ssh)->helloResult()["protocol_version"], kProtocolVersion);
    auto dev = (*ssh)->call("devices");
    ASSERT_TRUE(dev.isOk()) << dev.status().toString();
    EXPECT_GE((*dev)["count"].get<int>(), 1);
    auto val = (*ssh)->call("validate", {{"yaml", "num_attention_heads: 3\n"}});
    ASSERT_TRUE(val.isOk());
    EXPECT_EQ((*val)["ok"], false);
    (*ssh)->close();

    // TCP agent process: token file must be private.
    const std::string tokenFile = d.path + "/token";
    std::ofstream(tokenFile) << "correct-horse-battery\n";
    fs::permissions(tokenFile, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
    EXPECT_EQ(runCli({"agent", "--listen", "127.0.0.1:0", "--token-file", tokenFile}), 2);
    fs::permissions(tokenFile, fs::perms::owner_read | fs::perms::owner_write);
    // Pick a free port (bind 0, read it, release it).
    int probe = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    ::getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len);
    const int port = ntohs(a.sin_port);
    ::close(probe);
    SpawnOptions so;
    so.pipeStdout = false;
    auto agentProc = ChildProcess::spawn({kBinary, "agent", "--listen", "127.0.0.1:" + std::to_string(port),
                                          "--token-file", tokenFile, "--workspace", d.path + "/tcpws"},
                                         so);
    ASSERT_TRUE(agentProc.isOk());
    const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
    ts::Result<std::unique_ptr<NodeClient>> good = ts::Status::internal("not tried");
    for (int i = 0; i < 100; ++i) {  // wait for it to listen
        ConnectOptions wrong;
        wrong.token = "correct-horse-battery-staple";
        auto w = NodeClient::connect(url, wrong);
        if (!w.isOk() && w.status().message().find("cannot connect") != std::string::npos) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            continue;
        }
        ASSERT_FALSE(w.isOk());
        EXPECT_NE(w.status().message().find("wrong token"), std::string::npos) << w.status().toString();
        ConnectOptions right;
        right.tokenFile = tokenFile;
        good = NodeClient::connect(url, right);
        break;
    }
    ASSERT_TRUE(good.isOk()) << good.status().toString();
    auto bye = (*good)->call("shutdown");
    EXPECT_TRUE(bye.isOk());
    int st = agentProc->wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describeWaitStatus(st);
}

// ---- the same concurrency cases as test_agent.cpp, with real runs ---------------------------

namespace {

struct RealTcpAgent {
    std::unique_ptr<Agent> agent;
    std::thread loop;
    std::string url;
    explicit RealTcpAgent(const std::string& dir) {
        AgentOptions o;
        o.workspaceDir = dir + "/ws";
        o.runnerCommand = {kBinary};
        o.token = "agent-test-token-0123456789";
        o.cancelGraceMs = 2000;
        auto a = Agent::create(o);
        EXPECT_TRUE(a.isOk());
        agent = std::move(*a);
        EXPECT_TRUE(agent->listen("127.0.0.1:0").isOk());
        url = "tcp://127.0.0.1:" + std::to_string(agent->boundPort());
        loop = std::thread([this] { (void)agent->serveTcp(); });
    }
    ~RealTcpAgent() {
        agent->requestShutdown();
        loop.join();
    }
    std::unique_ptr<NodeClient> client(Events& ev) {
        ConnectOptions co;
        co.token = "agent-test-token-0123456789";
        auto c = NodeClient::connect(url, co);
        EXPECT_TRUE(c.isOk()) << c.status().toString();
        if (!c.isOk()) return nullptr;
        (*c)->setNotificationHandler([&ev](const std::string& m, const json& p) { ev.add(m, p); });
        return std::move(*c);
    }
};

}  // namespace

TEST(CliAgent, RealRunsTwoClientsCancelAndDisconnect) {
    if (!haveBinary()) GTEST_SKIP() << kBinary << " not built";
    TempDir d("ts_cli_agent");
    RealTcpAgent tcp(d.path);
    Events ea, eb;
    auto a = tcp.client(ea);
    auto b = tcp.client(eb);
    ASSERT_TRUE(a && b);

    // Two clients at once, each gets only its own run's notifications.
    auto ra = a->call("start_run", {{"yaml", kMicroYaml}, {"steps", 4}});
    auto rb = b->call("start_run", {{"yaml", kMicroYaml}, {"steps", 3}});
    ASSERT_TRUE(ra.isOk() && rb.isOk());
    const std::string ida = (*ra)["run_id"], idb = (*rb)["run_id"];
    json fa, fb;
    ASSERT_TRUE(ea.waitFor("run_finished", ida, &fa));
    ASSERT_TRUE(eb.waitFor("run_finished", idb, &fb));
    EXPECT_EQ(fa["status"], "completed") << fa.dump();
    EXPECT_EQ(fb["status"], "completed") << fb.dump();
    EXPECT_EQ(lossesOf((*ra)["run_file"]).size(), 4u);
    EXPECT_EQ(lossesOf((*rb)["run_file"]).size(), 3u);
    EXPECT_FALSE(ea.waitFor("progress", idb, nullptr, 10));
    EXPECT_FALSE(eb.waitFor("progress", ida, nullptr, 10));

    // Cancel during a long run.
    auto rc = a->call("start_run", {{"yaml", kMicroYaml}, {"steps", 1000000}});
    ASSERT_TRUE(rc.isOk());
    const std::string idc = (*rc)["run_id"];
    ASSERT_TRUE(ea.waitFor("progress", idc, nullptr));
    ASSERT_TRUE(a->call("cancel", {{"run_id", idc}}).isOk());
    json fc;
    ASSERT_TRUE(ea.waitFor("run_finished", idc, &fc, 20000));
    EXPECT_EQ(fc["status"], "cancelled") << fc.dump();
    auto store = ts::profiler::TraceStore::open((*rc)["run_file"], true);
    ASSERT_TRUE(store.isOk());
    auto info = (*store)->runInfo();
    ASSERT_TRUE(info.isOk());
    EXPECT_EQ(info->status, "cancelled");

    // Client disconnects mid-run: the run completes and the other client sees it listed.
    auto rd = a->call("start_run", {{"yaml", kMicroYaml}, {"steps", 200}});
    ASSERT_TRUE(rd.isOk());
    const std::string idd = (*rd)["run_id"];
    ASSERT_TRUE(ea.waitFor("progress", idd, nullptr));
    a->close();
    std::string status;
    for (int i = 0; i < 300 && status != "completed"; ++i) {
        auto list = b->call("list_runs");
        ASSERT_TRUE(list.isOk());
        for (auto& r : (*list)["runs"])
            if (r["id"] == idd) status = r["status"];
        if (status != "completed") std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(status, "completed");
    EXPECT_EQ(lossesOf((*rd)["run_file"]).size(), 200u);
}
