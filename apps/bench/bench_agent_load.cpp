// bench_agent_load: the node agent under many clients on loopback (issue #12).
// An agent (this process, TCP on 127.0.0.1) serves a workspace holding --seed-runs finished run
// files while --runs real runs (`trainscope run`, micro model) keep going; --clients clients
// connect at once, watch a running run and list the runs in a loop for --seconds. Bounded:
// every client stops after the time or --max-calls listings.
// Reports connect and list_runs latency percentiles (p50/p95/p99/max), refused or failed
// connections, errors and notifications received, then one JSON line.
// Usage: bench_agent_load [--clients N] [--seconds S] [--runs R] [--seed-runs K] [--max-calls M]
//                         [--trainscope PATH] [--dir DIR]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "apps/bench/bench_args.h"
#include "profiler/store.h"
#include "sessions/agent.h"
#include "sessions/node_client.h"
#include "sessions/process.h"
#include "sessions/workspace.h"

using namespace ts;
using namespace ts::sessions;
using nlohmann::json;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kUsage =
    "usage: bench_agent_load [--clients N] [--seconds S] [--runs R] [--seed-runs K] [--max-calls M]\n"
    "                        [--trainscope PATH] [--dir DIR]";

constexpr const char* kMicroYaml =
    "name: load\nposition_embedding_type: rope\nnum_layers: 2\nhidden_size: 32\nnum_attention_heads: 2\nseq_length: 16\n"
    "vocab_size: 256\nmicro_batch_size: 2\ndata_path: synthetic\ntrain_iters: 3\n";

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t i = size_t(p / 100.0 * double(v.size() - 1) + 0.5);
    return v[std::min(i, v.size() - 1)];
}

// A finished run with a few steps, as the workspace holds after a day of tuning.
void seedRun(const std::string& path, const std::string& id, int k) {
    auto store = profiler::TraceStore::create(path);
    if (!store) return;
    profiler::RunInfo info;
    info.id = id;
    info.name = "seed-" + std::to_string(k);
    info.status = "completed";
    info.createdAt = "2025-01-31T12:00:00Z";
    info.finishedAt = "2025-01-31T12:01:00Z";
    info.layout = "tp1 pp1 dp1";
    (void)(*store)->setRunInfo(info);
    for (int s = 1; s <= 20; ++s) {
        profiler::StepMetrics m;
        m.step = s;
        m.loss = 5.0 - 0.1 * s;
        m.stepTimeS = 0.01;
        m.tokensPerS = 1000;
        (void)(*store)->appendStepMetrics(m);
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (int rc = bench::checkArgs(argc, argv, kUsage); rc >= 0) return rc;
    int clients = 50, seconds = 10, runs = 2, seedRuns = 30, maxCalls = 100000;
    std::string trainscope = fs::path(selfExePath()).parent_path().string() + "/trainscope";
    std::string dir;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--clients") clients = std::max(1, std::atoi(v.c_str()));
        else if (a == "--seconds") seconds = std::clamp(std::atoi(v.c_str()), 1, 600);
        else if (a == "--runs") runs = std::clamp(std::atoi(v.c_str()), 0, 4);
        else if (a == "--seed-runs") seedRuns = std::clamp(std::atoi(v.c_str()), 0, 10000);
        else if (a == "--max-calls") maxCalls = std::max(1, std::atoi(v.c_str()));
        else if (a == "--trainscope") trainscope = v;
        else if (a == "--dir") dir = v;
        else {
            std::fprintf(stderr, "unknown option %s\n%s\n", a.c_str(), kUsage);
            return 2;
        }
    }
    const bool ownDir = dir.empty();
    if (ownDir) dir = (fs::temp_directory_path() / ("bench_agent_load_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir);
    auto wsR = Workspace::open(dir + "/ws");
    if (!wsR) {
        std::fprintf(stderr, "bench_agent_load: %s\n", wsR.status().toString().c_str());
        return 1;
    }
    for (int k = 0; k < seedRuns; ++k) {
        const std::string id = makeRunId("seed");
        seedRun(wsR->runsDir() + "/" + id + ".sqlite", id, k);
        if (k % 2 == 0) (void)wsR->indexRun(wsR->runsDir() + "/" + id + ".sqlite");  // half indexed, half not
    }
    if (runs > 0 && ::access(trainscope.c_str(), X_OK) != 0) {
        std::fprintf(stderr, "bench_agent_load: %s not found (--trainscope PATH, or --runs 0)\n", trainscope.c_str());
        return 1;
    }

    std::string token(32, 'x');
    for (size_t i = 0; i < token.size(); ++i) token[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[(i * 7 + 3) % 36];
    AgentOptions o;
    o.workspaceDir = dir + "/ws";
    o.runnerCommand = {trainscope};
    o.token = token;
    o.log = [](const std::string&) {};
    auto agentR = Agent::create(o);
    if (!agentR) {
        std::fprintf(stderr, "bench_agent_load: %s\n", agentR.status().toString().c_str());
        return 1;
    }
    auto& agent = **agentR;
    if (Status s = agent.listen("127.0.0.1:0"); !s) {
        std::fprintf(stderr, "bench_agent_load: %s\n", s.toString().c_str());
        return 1;
    }
    const std::string url = "tcp://127.0.0.1:" + std::to_string(agent.boundPort());
    std::thread server([&] { (void)agent.serveTcp(); });
    ConnectOptions co;
    co.token = token;
    co.connectTimeoutMs = 30000;

    // The runs that go while clients list: restarted as they finish, until the end.
    std::atomic<bool> stop{false};
    std::mutex idsMu;
    std::vector<std::string> runningIds;
    std::atomic<int> runsStarted{0};
    std::thread driver([&] {
        if (runs == 0) return;
        auto c = NodeClient::connect(url, co);
        if (!c) return;
        std::mutex fmu;
        std::vector<std::string> finished;
        (*c)->setNotificationHandler([&](const std::string& m, const json& p) {
            if (m != "run_finished" || !p.contains("run_id") || !p["run_id"].is_string()) return;
            std::lock_guard lock(fmu);
            finished.push_back(p["run_id"]);
        });
        int active = 0;
        while (!stop) {
            {
                std::lock_guard lock(fmu);
                for (const auto& id : finished) {
                    std::lock_guard l2(idsMu);
                    runningIds.erase(std::remove(runningIds.begin(), runningIds.end(), id), runningIds.end());
                    --active;
                }
                finished.clear();
            }
            while (active < runs && !stop) {
                auto s = (*c)->call("start_run", {{"yaml", kMicroYaml}, {"steps", 300}}, 30000);
                if (!s) break;
                ++active;
                ++runsStarted;
                std::lock_guard lock(idsMu);
                runningIds.push_back((*s)["run_id"]);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the runs start

    struct ClientStats {
        double connectMs = -1;
        std::vector<double> listMs;
        int errors = 0;
        bool refused = false;
        std::string error;
    };
    std::vector<ClientStats> stats(static_cast<size_t>(clients));
    std::atomic<int64_t> notifications{0};
    const auto end = Clock::now() + std::chrono::seconds(seconds);
    std::vector<std::thread> threads;
    for (int i = 0; i < clients; ++i) {
        threads.emplace_back([&, i] {
            ClientStats& st = stats[size_t(i)];
            const auto t0 = Clock::now();
            auto c = NodeClient::connect(url, co);
            if (!c) {
                st.refused = true;
                st.error = c.status().message();
                return;
            }
            st.connectMs = ms(Clock::now() - t0);
            (*c)->setNotificationHandler([&](const std::string&, const json&) { ++notifications; });
            std::string watchId;
            {
                std::lock_guard lock(idsMu);
                if (!runningIds.empty()) watchId = runningIds[size_t(i) % runningIds.size()];
            }
            if (!watchId.empty() && !(*c)->call("watch", {{"run_id", watchId}}, 30000)) ++st.errors;
            std::mt19937 rng{static_cast<unsigned>(i)};
            for (int k = 0; k < maxCalls && Clock::now() < end; ++k) {
                const auto t = Clock::now();
                auto l = (*c)->call("list_runs", json::object(), 30000);
                if (!l) {
                    ++st.errors;
                    if (st.error.empty()) st.error = l.status().message();
                    if (!(*c)->connected()) break;
                    continue;
                }
                st.listMs.push_back(ms(Clock::now() - t));
                std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 100));  // a GUI polls, it does not spin
            }
        });
    }
    for (auto& t : threads) t.join();
    stop = true;
    driver.join();
    agent.requestShutdown();
    server.join();
    agent.waitForRuns();

    std::vector<double> connects, lists;
    int refused = 0, errors = 0;
    std::string firstError;
    for (const auto& s : stats) {
        if (s.refused) ++refused;
        if (s.connectMs >= 0) connects.push_back(s.connectMs);
        lists.insert(lists.end(), s.listMs.begin(), s.listMs.end());
        errors += s.errors;
        if (firstError.empty() && !s.error.empty()) firstError = s.error;
    }
    const double listRate = double(lists.size()) / double(seconds);
    std::printf("bench_agent_load: %d clients, %d s, %d runs going (%d started), %d seeded run files\n", clients,
                seconds, runs, runsStarted.load(), seedRuns);
    std::printf("  connect+hello     p50 %8.1f ms  p95 %8.1f ms  p99 %8.1f ms  max %8.1f ms\n", percentile(connects, 50),
                percentile(connects, 95), percentile(connects, 99), percentile(connects, 100));
    std::printf("  list_runs         p50 %8.1f ms  p95 %8.1f ms  p99 %8.1f ms  max %8.1f ms  (%zu calls, %.0f/s)\n",
                percentile(lists, 50), percentile(lists, 95), percentile(lists, 99), percentile(lists, 100),
                lists.size(), listRate);
    std::printf("  refused connections %d of %d, errors %d, notifications received %lld\n", refused, clients, errors,
                (long long)notifications.load());
    if (!firstError.empty()) std::printf("  first error: %s\n", firstError.c_str());
    json j = {{"bench", "agent_load"},
              {"clients", clients},
              {"seconds", seconds},
              {"runs", runs},
              {"runs_started", runsStarted.load()},
              {"seed_runs", seedRuns},
              {"connect_ms", {{"p50", percentile(connects, 50)}, {"p95", percentile(connects, 95)},
                              {"p99", percentile(connects, 99)}, {"max", percentile(connects, 100)}}},
              {"list_runs_ms", {{"p50", percentile(lists, 50)}, {"p95", percentile(lists, 95)},
                                {"p99", percentile(lists, 99)}, {"max", percentile(lists, 100)}}},
              {"list_calls", lists.size()},
              {"list_per_s", listRate},
              {"refused", refused},
              {"errors", errors},
              {"notifications", notifications.load()}};
    std::printf("%s\n", j.dump().c_str());
    if (ownDir) {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    return refused == 0 && errors == 0 ? 0 : 1;
}
