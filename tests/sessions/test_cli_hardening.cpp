// Issue #12 with the real `trainscope` binary: an agent stopped by SIGTERM/SIGINT/SIGHUP/SIGQUIT
// records its runs and exits, a `trainscope run` killed with SIGKILL does not stay "running",
// and the agent's command line (--generate-token, weak tokens, ports).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "profiler/store.h"
#include "sessions/agent.h"
#include "sessions/node_client.h"
#include "sessions/process.h"
#include "sessions/workspace.h"
#include "session_test_util.h"
#include "tests/sessions/cli_process_util.h"

using namespace ts::sessions;
using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using ts::sessions::testutil::Events;
using ts::sessions::testutil::TempDir;
using ts::sessions::testutil::freePort;
using ts::sessions::testutil::haveBinary;
using ts::sessions::testutil::kBinary;
using ts::sessions::testutil::kMicroYaml;
using ts::sessions::testutil::runCli;

namespace {



// A `run --json` child's stdout up to its first step event (at most a minute, or until EOF).
std::string stdoutUntilFirstStep(ChildProcess& run) {
    std::string out;
    char buf[4096];
    for (auto end = Clock::now() + std::chrono::seconds(60);
         out.find("\"event\":\"step\"") == std::string::npos && Clock::now() < end;) {
        ssize_t n = ::read(run.stdoutFd(), buf, sizeof buf);
        if (n <= 0) break;
        out.append(buf, size_t(n));
    }
    return out;
}

// Waits (bounded) for a child to exit; -1 if it did not.
int waitExit(ChildProcess& c, int timeoutMs) {
    int st = 0;
    for (auto end = Clock::now() + std::chrono::milliseconds(timeoutMs); Clock::now() < end;) {
        if (c.tryWait(&st)) return st;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
}

}  // namespace

// The agent installed no signal handlers: SIGTERM/SIGINT/SIGHUP/SIGQUIT killed it and left its
// runs "running" (they died on their next write). It now shuts down like `shutdown` does.
TEST(CliHardening, AgentStopsCleanlyOnTerminationSignals) {
    if (!haveBinary()) GTEST_SKIP() << kBinary << " not built";
    TempDir d("ts_cli_harden");
    const std::string tokenFile = d.path + "/token";
    ASSERT_EQ(runCli({"agent", "--generate-token", tokenFile}), 0);
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) {
        SCOPED_TRACE(sigabbrev_np(sig));
        const int port = freePort();
        SpawnOptions so;
        so.pipeStdout = false;
        auto agent = ChildProcess::spawn({kBinary, "agent", "--listen", "127.0.0.1:" + std::to_string(port),
                                          "--token-file", tokenFile, "--workspace", d.path + "/ws"},
                                         so);
        ASSERT_TRUE(agent.isOk());
        ConnectOptions co;
        co.tokenFile = tokenFile;
        ts::Result<std::unique_ptr<NodeClient>> c = ts::Status::internal("not tried");
        for (int i = 0; i < 200; ++i) {
            c = NodeClient::connect("tcp://127.0.0.1:" + std::to_string(port), co);
            if (c.isOk()) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        ASSERT_TRUE(c.isOk()) << c.status().toString();
        Events ev;
        (*c)->setNotificationHandler([&](const std::string& m, const json& p) { ev.add(m, p); });
        auto started = (*c)->call("start_run", {{"yaml", kMicroYaml}, {"steps", 1000000}});
        ASSERT_TRUE(started.isOk()) << started.status().toString();
        const std::string id = (*started)["run_id"], path = (*started)["run_file"];
        ASSERT_TRUE(ev.waitFor("progress", id, nullptr, 60000));
        ASSERT_EQ(::kill(agent->pid(), sig), 0);
        json fin;
        EXPECT_TRUE(ev.waitFor("run_finished", id, &fin, 20000)) << "no run_finished";
        int st = waitExit(*agent, 20000);
        ASSERT_NE(st, -1) << "the agent did not exit";
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describeWaitStatus(st);
        auto store = ts::profiler::TraceStore::open(path, true);
        ASSERT_TRUE(store.isOk()) << store.status().toString();
        auto info = (*store)->runInfo();
        ASSERT_TRUE(info.isOk());
        EXPECT_EQ(info->status, "cancelled");
        EXPECT_FALSE(info->finishedAt.empty());
    }
}

// A `trainscope run` killed with SIGKILL stayed "running" forever. It records its pid; the next
// `trainscope runs` (or agent start, or reindex) marks it failed.
TEST(CliHardening, RunKilledWithSigkillIsMarkedFailedByTheNextListing) {
    if (!haveBinary()) GTEST_SKIP() << kBinary << " not built";
    TempDir d("ts_cli_harden");
    const std::string cfg = d.path + "/micro.yaml";
    std::ofstream(cfg) << kMicroYaml;
    const std::string ws = d.path + "/ws";
    SpawnOptions so;
    so.pipeStdout = true;
    so.pipeStderr = false;
    auto run = ChildProcess::spawn({kBinary, "run", cfg, "--json", "--steps", "1000000", "--workspace", ws}, so);
    ASSERT_TRUE(run.isOk());
    const std::string out = stdoutUntilFirstStep(*run);
    ASSERT_NE(out.find("\"event\":\"step\""), std::string::npos) << out;
    ASSERT_EQ(::kill(run->pid(), SIGKILL), 0);
    run->wait();
    std::string listing, err;
    ASSERT_EQ(runCli({"runs", "--json", "--workspace", ws}, &listing, &err), 0) << err;
    json runs = json::parse(listing);
    ASSERT_EQ(runs.size(), 1u) << listing;
    EXPECT_EQ(runs[0]["status"], "failed") << listing;
    EXPECT_EQ(runs[0]["status_reason"], kStaleRunReason) << listing;
    EXPECT_NE(err.find("marked failed"), std::string::npos) << err;
    // Listing again changes nothing.
    ASSERT_EQ(runCli({"runs", "--json", "--workspace", ws}, &listing, &err), 0);
    EXPECT_EQ(err.find("marked failed"), std::string::npos) << err;
}

// A SIGHUP (terminal closed) stopped a `trainscope run` with no record: it is now cancelled
// cleanly with the signal in its reason.
TEST(CliHardening, RunStoppedBySighupIsRecordedCancelled) {
    if (!haveBinary()) GTEST_SKIP() << kBinary << " not built";
    TempDir d("ts_cli_harden");
    const std::string cfg = d.path + "/micro.yaml";
    std::ofstream(cfg) << kMicroYaml;
    const std::string runFile = d.path + "/run.sqlite";
    SpawnOptions so;
    so.pipeStdout = true;
    auto run = ChildProcess::spawn({kBinary, "run", cfg, "--json", "--steps", "1000000", "--run-file", runFile}, so);
    ASSERT_TRUE(run.isOk());
    const std::string out = stdoutUntilFirstStep(*run);
    ASSERT_EQ(::kill(run->pid(), SIGHUP), 0);
    int st = waitExit(*run, 30000);
    ASSERT_NE(st, -1);
    auto store = ts::profiler::TraceStore::open(runFile, true);
    ASSERT_TRUE(store.isOk());
    auto info = (*store)->runInfo();
    ASSERT_TRUE(info.isOk());
    EXPECT_EQ(info->status, "cancelled");
    EXPECT_NE(info->statusReason.find("SIGHUP"), std::string::npos) << info->statusReason;
}

TEST(CliHardening, AgentCommandLineTokensAndPorts) {
    if (!haveBinary()) GTEST_SKIP() << kBinary << " not built";
    TempDir d("ts_cli_harden");
    const std::string tokenFile = d.path + "/token";
    std::string out, err;
    ASSERT_EQ(runCli({"agent", "--generate-token", tokenFile}, &out, &err), 0) << err;
    EXPECT_NE(err.find(tokenFile), std::string::npos) << err;
    struct stat st {};
    ASSERT_EQ(::stat(tokenFile.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_NE(runCli({"agent", "--generate-token", tokenFile}, &out, &err), 0) << "overwrote the token";
    // A weak token is refused with a message that says how to make a good one.
    const std::string weak = d.path + "/weak";
    std::ofstream(weak) << "tok\n";
    fs::permissions(weak, fs::perms::owner_read | fs::perms::owner_write);
    EXPECT_EQ(runCli({"agent", "--listen", "127.0.0.1:0", "--token-file", weak, "--workspace", d.path + "/ws"}, &out, &err), 2);
    EXPECT_NE(err.find("--generate-token"), std::string::npos) << err;
    // Ports outside 1..65535 are refused, not wrapped.
    for (const char* bad : {"127.0.0.1:99999", ":65536", "127.0.0.1:http"}) {
        EXPECT_EQ(runCli({"agent", "--listen", bad, "--token-file", tokenFile, "--workspace", d.path + "/ws"}, &out, &err), 2)
            << bad;
        EXPECT_NE(err.find("port"), std::string::npos) << err;
    }
    const std::string cfg = d.path + "/micro.yaml";
    std::ofstream(cfg) << kMicroYaml;
    EXPECT_NE(runCli({"run", cfg, "--node", "tcp://127.0.0.1:99999", "--token-file", tokenFile}, &out, &err), 0);
    EXPECT_NE(err.find("out of range"), std::string::npos) << err;
    ASSERT_EQ(runCli({"agent", "--help"}, &out), 0);
    for (const char* word : {"--generate-token", "--allow-path", "SIGTERM", "16"})
        EXPECT_NE(out.find(word), std::string::npos) << word << " missing from agent --help:\n" << out;
}
