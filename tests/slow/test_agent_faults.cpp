// Fault injection (issue #12): real `trainscope agent` processes and their runs are killed at
// random points — SIGKILL of the agent, of a run, of both, SIGTERM of the agent — seeded and
// bounded in rounds and time. Afterwards a fresh agent starts on the workspace (its start-up
// sweep finalises what dead processes left) and every run that was started must be in a
// readable run file whose status says what happened: completed, or failed/cancelled with a
// reason. Set TS_FAULT_SEED to replay a sequence; TS_FAULT_ROUNDS for more rounds by hand.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "profiler/store.h"
#include "sessions/agent.h"
#include "sessions/node_client.h"
#include "sessions/process.h"
#include "sessions/workspace.h"
#include "tests/sessions/cli_process_util.h"

using namespace ts::sessions;
using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using ts::sessions::testutil::freePort;
using ts::sessions::testutil::kBinary;

namespace {

constexpr const char* kMicroYaml =
    "name: fault\nposition_embedding_type: rope\nnum_layers: 2\nhidden_size: 32\nnum_attention_heads: 2\nseq_length: 16\n"
    "vocab_size: 256\nmicro_batch_size: 2\ndata_path: synthetic\ntrain_iters: 3\n";


// Gone: no such process, or a zombie nobody reaps (an orphan of a killed agent).
bool processGone(int pid) { return writerState(writerProcessOf(pid)) != WriterState::Alive; }

struct StartedRun {
    std::string id, path;
    int pid = 0;
    std::string fault;
};

const char* kFaults[] = {"SIGKILL agent", "SIGKILL one run", "SIGKILL runs then agent", "SIGTERM agent",
                         "SIGKILL agent then one run"};

}  // namespace

TEST(AgentFaults, KilledAgentsAndRunsLeaveEveryRunRecorded) {
    if (::access(kBinary.c_str(), X_OK) != 0) GTEST_SKIP() << kBinary << " not built";
    const unsigned seed = std::getenv("TS_FAULT_SEED") ? unsigned(std::atoll(std::getenv("TS_FAULT_SEED"))) : 20250131u;
    const int rounds = std::getenv("TS_FAULT_ROUNDS") ? std::atoi(std::getenv("TS_FAULT_ROUNDS")) : 10;
    std::printf("fault test: seed %u, %d rounds (TS_FAULT_SEED / TS_FAULT_ROUNDS)\n", seed, rounds);
    std::mt19937 rng(seed);
    const fs::path dir = fs::temp_directory_path() / ("ts_faults_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string ws = (dir / "ws").string();
    const std::string tokenFile = (dir / "token").string();
    ASSERT_TRUE(generateTokenFile(tokenFile).isOk());
    std::vector<StartedRun> started;
    const auto budgetEnd = Clock::now() + std::chrono::seconds(40);  // stop starting rounds after this

    for (int round = 0; round < rounds && Clock::now() < budgetEnd; ++round) {
        // Every kind once, then at random.
        const int fault = round < 5 ? round : int(rng() % 5);
        const int port = freePort();
        SpawnOptions so;
        so.pipeStdout = false;
        auto agent = ChildProcess::spawn({kBinary, "agent", "--listen", "127.0.0.1:" + std::to_string(port),
                                          "--token-file", tokenFile, "--workspace", ws},
                                         so);
        ASSERT_TRUE(agent.isOk());
        ConnectOptions co;
        co.tokenFile = tokenFile;
        ts::Result<std::unique_ptr<NodeClient>> c = ts::Status::internal("not tried");
        for (int i = 0; i < 200 && !c.isOk(); ++i) {
            c = NodeClient::connect("tcp://127.0.0.1:" + std::to_string(port), co);
            if (!c.isOk()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        ASSERT_TRUE(c.isOk()) << c.status().toString();
        std::vector<StartedRun> mine;
        for (int r = 0; r < 2; ++r) {
            // Some runs are short enough to complete before the fault, most are not.
            const int steps = (rng() % 3 == 0) ? 3 : 100000;
            auto s = (*c)->call("start_run", {{"yaml", kMicroYaml}, {"steps", steps}}, 30000);
            ASSERT_TRUE(s.isOk()) << s.status().toString();
            mine.push_back({(*s)["run_id"], (*s)["run_file"], (*s)["pid"], kFaults[fault]});
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 1500));
        const int victim = int(rng() % mine.size());
        switch (fault) {
            case 0: ::kill(agent->pid(), SIGKILL); break;
            case 1: ::kill(mine[size_t(victim)].pid, SIGKILL); break;
            case 2:
                for (auto& m : mine) ::kill(m.pid, SIGKILL);
                ::kill(agent->pid(), SIGKILL);
                break;
            case 3: ::kill(agent->pid(), SIGTERM); break;
            case 4:
                ::kill(agent->pid(), SIGKILL);
                ::kill(mine[size_t(victim)].pid, SIGKILL);
                break;
        }
        (*c)->close();
        int st = 0;
        if (!agent->tryWait(&st)) {
            // Still serving (only a run was killed): stop it the way an operator would.
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            ::kill(agent->pid(), SIGTERM);
        }
        bool exited = false;
        for (auto end = Clock::now() + std::chrono::seconds(30); !exited && Clock::now() < end;) {
            exited = agent->tryWait(&st);
            if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        if (!exited) {
            ADD_FAILURE() << "round " << round << ": agent did not exit after " << kFaults[fault];
            ::kill(agent->pid(), SIGKILL);
            agent->wait();
        }
        // Runs of a killed agent stop by themselves (their output pipe closed): wait for them.
        for (auto& m : mine) {
            for (auto end = Clock::now() + std::chrono::seconds(20); !processGone(m.pid) && Clock::now() < end;)
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            EXPECT_TRUE(processGone(m.pid)) << "run " << m.id << " (pid " << m.pid << ") still running";
            started.push_back(m);
        }
    }
    // A fresh agent on the workspace finalises what the dead processes left.
    {
        AgentOptions o;
        o.workspaceDir = ws;
        o.runnerCommand = {kBinary};
        o.log = [](const std::string& l) { std::printf("  %s\n", l.c_str()); };
        auto a = Agent::create(o);
        ASSERT_TRUE(a.isOk()) << a.status().toString();
    }
    std::map<std::string, std::map<std::string, int>> outcomes;  // fault -> status -> count
    for (const auto& r : started) {
        auto store = ts::profiler::TraceStore::open(r.path, true);
        ASSERT_TRUE(store.isOk()) << r.id << " (" << r.fault << "): " << store.status().toString();
        auto info = (*store)->runInfo();
        ASSERT_TRUE(info.isOk()) << r.id << " (" << r.fault << "): no run info";
        EXPECT_TRUE(info->status == "completed" || info->status == "failed" || info->status == "cancelled")
            << r.id << " (" << r.fault << ") ended '" << info->status << "'";
        if (info->status != "completed") {
            EXPECT_FALSE(info->statusReason.empty()) << r.id << " (" << r.fault << ") " << info->status << " without a reason";
        }
        EXPECT_FALSE(info->finishedAt.empty()) << r.id << " (" << r.fault << ")";
        outcomes[r.fault][info->status + (info->statusReason.empty() ? "" : ": " + info->statusReason.substr(0, 60))]++;
    }
    auto wsr = Workspace::open(ws);
    ASSERT_TRUE(wsr.isOk());
    auto list = wsr->listRuns();
    ASSERT_TRUE(list.isOk());
    for (const auto& s : *list) EXPECT_NE(s.status, "running") << s.id;
    std::printf("fault test: %zu runs\n", started.size());
    for (const auto& [fault, byStatus] : outcomes)
        for (const auto& [status, n] : byStatus) std::printf("  %-28s %2d x %s\n", fault.c_str(), n, status.c_str());
    if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}
