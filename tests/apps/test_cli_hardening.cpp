// The command line against hostile input, faults and kills (issue #12): each test runs the
// real `trainscope` binary the way a user (or the agent) does and checks the exit code, the
// message and what is left in the workspace.
#include <fcntl.h>
#include <gtest/gtest.h>

#include "tests/apps/cli_test_util.h"
#include <signal.h>
#include <spawn.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/text.h"
#include "profiler/store.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kBin = std::string(TS_BINARY_DIR) + "/apps/trainscope";

using ts::cli_test::Output;
using ts::cli_test::sh;
Output ts(const std::string& args) { return ts::cli_test::run(args); }

struct TempDir {
    fs::path path;
    explicit TempDir(const std::string& name) {
        path = fs::path(TS_BINARY_DIR) / "test_scratch" / ("cli_" + name);
        fs::remove_all(path);
        fs::create_directories(path);
    }
    std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

void writeFile(const std::string& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

std::string readFile(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// A model small enough that a step takes milliseconds.
const char* kMicroYaml =
    "name: micro\nposition_embedding_type: rope\nnum_layers: 1\nhidden_size: 32\nnum_attention_heads: 2\nseq_length: 16\n"
    "vocab_size: 256\nmicro_batch_size: 2\ndata_path: synthetic\ntrain_iters: 3\n";

std::string microConfig(const TempDir& d) {
    const std::string p = d / "micro.yaml";
    writeFile(p, kMicroYaml);
    return p;
}

std::vector<std::string> lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
}

// The JSON objects among the output lines (stderr lines are not JSON).
std::vector<json> jsonLines(const std::string& text) {
    std::vector<json> out;
    for (const auto& l : lines(text)) {
        json j = json::parse(l, nullptr, false);
        if (j.is_object()) out.push_back(j);
    }
    return out;
}

// `runs --json` of a workspace, parsed.
json runsJson(const std::string& ws) {
    Output o = ts("runs --json --workspace '" + ws + "'");
    EXPECT_EQ(o.code, 0) << o.text;
    json j = json::parse(o.text.substr(o.text.find('[')), nullptr, false);
    EXPECT_TRUE(j.is_array()) << o.text;
    return j;
}

std::string firstRunId(const std::string& ws) {
    json runs = runsJson(ws);
    return runs.empty() ? std::string() : runs[0]["id"].get<std::string>();
}

// A trainscope process in the background; stdout into a file.
struct Background {
    pid_t pid = -1;
    std::string out;
    Background(const std::vector<std::string>& args, const std::string& stdoutFile) : out(stdoutFile) {
        std::vector<std::string> all = {kBin};
        all.insert(all.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (auto& a : all) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, stdoutFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
        EXPECT_EQ(posix_spawn(&pid, kBin.c_str(), &fa, nullptr, argv.data(), environ), 0);
        posix_spawn_file_actions_destroy(&fa);
    }
    // Exit status (or -signal); waits at most timeoutS.
    int wait(double timeoutS = 120) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutS);
        int status = 0;
        while (std::chrono::steady_clock::now() < end) {
            const pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid) {
                pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return 999;
    }
    ~Background() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    }
};

// Waits until the stdout file of a --json run holds a step event (its step number), or -1.
int waitForStep(const Background& b, int atLeast, double timeoutS = 120) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutS);
    while (std::chrono::steady_clock::now() < end) {
        int last = -1;
        for (const auto& j : jsonLines(readFile(b.out)))
            if (j.value("event", "") == "step") last = j.value("step", -1);
        if (last >= atLeast) return last;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
}

// ---- numbers, configs, bounds ----------------------------------------------------------------

TEST(CliHardening, NumericFlagsAreParsedStrictly) {
    TempDir d("strict_ints");
    const std::string cfg = microConfig(d);
    for (const char* bad : {"1x", "''", "' 1'", "1e3", "0x10", "+", "99999999999999999999"}) {
        Output o = ts("run '" + cfg + "' --workspace '" + d / "ws" + "' --steps " + bad);
        EXPECT_EQ(o.code, 2) << bad << ": " << o.text;
        EXPECT_NE(o.text.find("--steps"), std::string::npos) << o.text;
    }
    EXPECT_EQ(ts("run '" + cfg + "' --workspace '" + d / "ws" + "' --steps 0").code, 2);
    EXPECT_EQ(ts("demo --steps 2y").code, 2);
    EXPECT_EQ(ts("run '" + cfg + "' --world-size 2q").code, 2);
    EXPECT_EQ(ts("schedule --pp 2x --microbatches 4").code, 2);
    EXPECT_EQ(ts("schedule --pp 2 --microbatches 4 --rank 1.0").code, 2);
    EXPECT_EQ(ts("layout '" + cfg + "' --world-size 8k").code, 2);
    EXPECT_EQ(ts("analyze x --step 1.5").code, 2);
    EXPECT_EQ(ts("analyze x --top ten").code, 2);
    EXPECT_EQ(ts("agent --stdio --max-runs 3z").code, 2);
    // No run was started by any of these.
    EXPECT_FALSE(fs::exists(d / "ws/runs") && !fs::is_empty(d / "ws/runs"));
}

TEST(CliHardening, ConfigThatIsADirectoryOrAFifoIsAnError) {
    TempDir d("config_dir");
    Output o = ts("run '" + d.path.string() + "' --workspace '" + d / "ws" + "'");
    EXPECT_EQ(o.code, 2) << o.text;
    EXPECT_NE(o.text.find("is a directory"), std::string::npos) << o.text;
    EXPECT_TRUE(!fs::exists(d / "ws/runs") || fs::is_empty(d / "ws/runs"));
    ASSERT_EQ(::mkfifo((d / "pipe.yaml").c_str(), 0600), 0);
    Output f = sh("timeout 60 \"$TS\" validate '" + d / "pipe.yaml" + "'");
    EXPECT_EQ(f.code, 2) << f.text;
    EXPECT_NE(f.text.find("not a regular file"), std::string::npos) << f.text;
}

TEST(CliHardening, AliasBombIsRefusedByValidateAndRun) {
    TempDir d("alias_bomb");
    std::string y = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
    for (char c = 'b', p = 'a'; c <= 'i'; p = c, ++c) {
        y += std::string(1, c) + ": &" + c + " [";
        for (int k = 0; k < 9; ++k) y += std::string(k ? ",*" : "*") + p;
        y += "]\n";
    }
    writeFile(d / "bomb.yaml", y);
    // Under a 2 GiB address-space limit the old loader could not even try (9^9 values). The limit
    // leaves room for what a CUDA build maps at start (cuBLAS, NCCL, CUPTI: about 1 GiB of address
    // space). One OpenBLAS thread: under an address-space limit an OpenBLAS worker that cannot map
    // its buffer retries forever, and the exit waits for it.
    for (const std::string& cmd : {std::string("validate"), std::string("run")}) {
        const std::string ws = cmd == "run" ? " --workspace '" + d / "ws" + "'" : "";
        Output o = sh("ulimit -v 2097152; OPENBLAS_NUM_THREADS=1 timeout 60 \"$TS\" " + cmd + " '" + d / "bomb.yaml" +
                      "'" + ws);
        EXPECT_EQ(o.code, 2) << cmd << ": " << o.text;
        EXPECT_NE(o.text.find("expands to more than"), std::string::npos) << o.text;
    }
}

TEST(CliHardening, ValidateReportsEveryProblemOfAFile) {
    TempDir d("validate_all");
    writeFile(d / "all.yaml",
              "num_attention_heads: 8\ntensor_model_parallel_size: 3\noverlap_grad_reduse: true\nnum_layers: 2\n"
              "num_layers: 4\n");
    Output o = ts("validate '" + d / "all.yaml" + "'");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.text.find(":3: unknown key 'overlap_grad_reduse'"), std::string::npos) << o.text;
    EXPECT_NE(o.text.find(":5: num_layers: set more than once"), std::string::npos) << o.text;
    EXPECT_NE(o.text.find(":2: tensor_model_parallel_size: tensor_model_parallel_size=3 does not divide"),
              std::string::npos) << o.text;
    // tp=3 does not divide the derived ffn_hidden_size either: four problems in one pass.
    EXPECT_NE(o.text.find("4 problems"), std::string::npos) << o.text;
}

TEST(CliHardening, ScheduleAndLayoutSizesAreBoundedWithTheReason) {
    TempDir d("bounds");
    Output s = sh("timeout 60 \"$TS\" schedule --pp 4 --microbatches 2000000000");
    EXPECT_EQ(s.code, 2) << s.text;
    EXPECT_NE(s.text.find("more than 100000 microbatches"), std::string::npos) << s.text;
    Output all = sh("timeout 60 \"$TS\" schedule --pp 1000 --microbatches 50000");
    EXPECT_EQ(all.code, 2) << all.text;
    EXPECT_NE(all.text.find("--rank"), std::string::npos) << all.text;
    EXPECT_EQ(ts("schedule --pp 1000 --microbatches 50000 --rank 3").code, 0);

    writeFile(d / "world.yaml", "position_embedding_type: rope\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 2\n");
    Output l = sh("timeout 60 \"$TS\" layout '" + d / "world.yaml" + "' --world-size 100000");
    EXPECT_EQ(l.code, 2) << l.text.substr(0, 2000);
    EXPECT_NE(l.text.find("above the 4096 ranks"), std::string::npos) << l.text.substr(0, 2000);
    EXPECT_EQ(ts("layout '" + d / "world.yaml" + "' --world-size 64").code, 0);
}

// ---- outside text ----------------------------------------------------------------------------

TEST(CliHardening, InvalidUtf8InNamesAndTracesNeverBreaksJsonOutput) {
    TempDir d("utf8");
    const std::string ws = d / "ws", cfg = microConfig(d);
    Output r = ts("run '" + cfg + "' --steps 2 --json --workspace '" + ws + "' --name 'bad\xff\xfe name'");
    ASSERT_EQ(r.code, 0) << r.text;
    for (const auto& j : jsonLines(r.text)) EXPECT_TRUE(ts::isValidUtf8(j.dump()));
    // A trace whose event name holds bytes that are not UTF-8.
    writeFile(d / "t.json",
              "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"good\",\"pid\":0,\"tid\":7,\"ts\":1,"
              "\"dur\":2,\"args\":{\"stream\":7,\"device\":0}},\n"
              "{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"bad\xff\",\"pid\":0,\"tid\":7,\"ts\":5,\"dur\":2}]}");
    Output imp = ts("import '" + d / "t.json" + "' --workspace '" + ws + "' --name 'trace\xff' --json");
    ASSERT_EQ(imp.code, 0) << imp.text;
    json runs = runsJson(ws);
    ASSERT_EQ(runs.size(), 2u);
    for (const auto& run : runs) {
        const std::string id = run["id"];
        Output a = ts("analyze " + id + " --json --workspace '" + ws + "'");
        EXPECT_EQ(a.code, 0) << a.text;
        EXPECT_TRUE(json::parse(a.text, nullptr, false).is_object()) << a.text.substr(0, 500);
        Output e = ts("export-trace " + id + " --chrome '" + d / (id + ".json") + "' --workspace '" + ws + "'");
        EXPECT_EQ(e.code, 0) << e.text;
        EXPECT_TRUE(json::parse(readFile(d / (id + ".json")), nullptr, false).is_object());
    }
}

TEST(CliHardening, ControlCharactersInRunNamesAreEscapedOnTheTerminal) {
    TempDir d("ctrl");
    const std::string ws = d / "ws";
    ASSERT_EQ(ts("run '" + microConfig(d) + "' --steps 1 --workspace '" + ws + "' --name \"$(printf 'red\\033[31m\\tx')\"").code, 0);
    Output list = ts("runs --workspace '" + ws + "'");
    ASSERT_EQ(list.code, 0) << list.text;
    EXPECT_EQ(list.text.find('\x1b'), std::string::npos) << list.text;
    EXPECT_EQ(list.text.find('\t'), std::string::npos) << list.text;
    EXPECT_NE(list.text.find("red\\x1b[31m"), std::string::npos) << list.text;
    Output show = ts("runs show latest --workspace '" + ws + "'");
    EXPECT_EQ(show.text.find('\x1b'), std::string::npos) << show.text;
    // JSON keeps the exact name (escaped the JSON way).
    EXPECT_EQ(runsJson(ws)[0]["name"], "red\x1b[31m\tx");
}

TEST(CliHardening, AnalyzeAndExportTraceTakeIdsNamesAndLatest) {
    TempDir d("resolve");
    const std::string ws = d / "ws";
    ASSERT_EQ(ts("run '" + microConfig(d) + "' --steps 2 --workspace '" + ws + "' --name resolvable").code, 0);
    const std::string id = firstRunId(ws);
    ASSERT_FALSE(id.empty());
    for (const std::string& key : {id, std::string("resolvable"), std::string("latest"), id.substr(0, 16)}) {
        Output a = ts("analyze " + key + " --workspace '" + ws + "'");
        EXPECT_EQ(a.code, 0) << key << ": " << a.text;
        Output e = ts("export-trace " + key + " --chrome '" + d / "out.json" + "' --workspace '" + ws + "'");
        EXPECT_EQ(e.code, 0) << key << ": " << e.text;
    }
    EXPECT_EQ(ts("analyze no-such-run --workspace '" + ws + "'").code, 3);
}

// ---- run files: faults, kills, identity ------------------------------------------------------

TEST(CliHardening, AFullDiskFailsTheRunVisibly) {
    TempDir d("full_disk");
    const std::string ws = d / "ws";
    const std::string cfg = microConfig(d);
    // The file size limit stands in for a full disk: writes past it fail with EFBIG (SIGXFSZ is
    // ignored, as the kernel then reports the error instead of killing the process).
    Output o = sh("trap '' XFSZ; ulimit -f 400; \"$TS\" run '" + cfg + "' --steps 400 --json --workspace '" + ws + "'");
    EXPECT_EQ(o.code, 1) << o.text.substr(0, 3000);
    auto events = jsonLines(o.text);
    ASSERT_FALSE(events.empty()) << o.text.substr(0, 3000);
    const json& end = events.back();
    EXPECT_EQ(end.value("event", ""), "end") << end.dump();
    EXPECT_EQ(end.value("status", ""), "failed") << end.dump();
    EXPECT_NE(end.value("reason", "").find("writing the run file failed"), std::string::npos) << end.dump();
    int lastStep = 0;
    for (const auto& e : events)
        if (e.value("event", "") == "step") lastStep = e.value("step", 0);
    EXPECT_LT(lastStep, 400);
    // Whatever the file could keep, it never claims the run completed; each reported step is in it.
    for (const auto& e : fs::directory_iterator(ws + "/runs")) {
        if (e.path().extension() != ".sqlite") continue;
        auto store = ts::profiler::TraceStore::open(e.path().string(), true);
        if (!store) continue;
        auto info = (*store)->runInfo();
        if (info) {
            EXPECT_NE(info->status, "completed");
        }
        auto steps = (*store)->stepMetrics();
        if (steps) {
            EXPECT_GE(int(steps->size()), lastStep);
        }
    }
}

TEST(CliHardening, AReportedStepIsInTheRunFileEvenAfterAKill) {
    TempDir d("durable_step");
    const std::string cfg = microConfig(d);
    for (int trial = 0; trial < 3; ++trial) {
        const std::string rf = d / ("run" + std::to_string(trial) + ".sqlite");
        Background b({"run", cfg, "--steps", "100000", "--json", "--run-file", rf}, d / "out.txt");
        const int step = waitForStep(b, 2 + trial);
        ASSERT_GT(step, 0) << readFile(d / "out.txt");
        ::kill(b.pid, SIGKILL);
        b.wait();
        // The last step the run reported before the kill (re-read: it may have printed more).
        int reported = 0;
        for (const auto& j : jsonLines(readFile(d / "out.txt")))
            if (j.value("event", "") == "step") reported = j.value("step", 0);
        auto store = ts::profiler::TraceStore::open(rf, true);
        ASSERT_TRUE(store.isOk()) << store.status().toString();
        auto steps = (*store)->stepMetrics();
        ASSERT_TRUE(steps.isOk());
        ASSERT_FALSE(steps->empty());
        EXPECT_GE(steps->back().step, reported) << "trial " << trial;
    }
}

TEST(CliHardening, RunFileThatExistsIsNeverMergedInto) {
    TempDir d("run_file_exists");
    const std::string cfg = microConfig(d);
    const std::string rf = d / "existing.sqlite";
    ASSERT_EQ(ts("run '" + cfg + "' --steps 1 --run-file '" + rf + "' --name first").code, 0);
    const std::string before = readFile(rf);
    Output o = ts("run '" + cfg + "' --steps 1 --run-file '" + rf + "' --name second");
    EXPECT_EQ(o.code, 2) << o.text;
    EXPECT_NE(o.text.find("already exists"), std::string::npos) << o.text;
    EXPECT_EQ(readFile(rf), before);
    auto store = ts::profiler::TraceStore::open(rf, true);
    ASSERT_TRUE(store.isOk());
    EXPECT_EQ((*store)->runInfo()->name, "first");
}

TEST(CliHardening, DeletingARunningRunIsRefusedAndForceCancelsItFirst) {
    TempDir d("delete_running");
    const std::string ws = d / "ws";
    Background b({"run", microConfig(d), "--steps", "1000000", "--json", "--workspace", ws}, d / "out.txt");
    ASSERT_GT(waitForStep(b, 1), 0) << readFile(d / "out.txt");
    const std::string id = firstRunId(ws);
    ASSERT_FALSE(id.empty());
    Output refused = ts("runs delete " + id + " --workspace '" + ws + "'");
    EXPECT_EQ(refused.code, 2) << refused.text;
    EXPECT_NE(refused.text.find("still running"), std::string::npos) << refused.text;
    EXPECT_NE(refused.text.find("--force"), std::string::npos) << refused.text;
    EXPECT_EQ(runsJson(ws).size(), 1u);
    Output forced = ts("runs delete " + id + " --force --workspace '" + ws + "'");
    EXPECT_EQ(forced.code, 0) << forced.text;
    EXPECT_EQ(b.wait(60), 130) << "the run is cancelled (SIGTERM), not killed";
    EXPECT_TRUE(runsJson(ws).empty());
}

TEST(CliHardening, AmbiguousRunIdsAreRefusedNamingBothFiles) {
    TempDir d("dup_ids");
    const std::string ws = d / "ws";
    ASSERT_EQ(ts("run '" + microConfig(d) + "' --steps 1 --workspace '" + ws + "'").code, 0);
    const std::string id = firstRunId(ws);
    const std::string original = ws + "/runs/" + id + ".sqlite", copy = ws + "/runs/copy.sqlite";
    fs::copy_file(original, copy);
    EXPECT_EQ(runsJson(ws).size(), 2u);
    for (const std::string& cmd : {std::string("show"), std::string("delete")}) {
        Output o = ts("runs " + cmd + " " + id + " --workspace '" + ws + "'");
        EXPECT_EQ(o.code, 2) << cmd << ": " << o.text;
        EXPECT_NE(o.text.find(original), std::string::npos) << o.text;
        EXPECT_NE(o.text.find(copy), std::string::npos) << o.text;
    }
    EXPECT_TRUE(fs::exists(original));
    EXPECT_TRUE(fs::exists(copy));
    EXPECT_EQ(ts("runs delete '" + copy + "' --workspace '" + ws + "'").code, 0);
    EXPECT_EQ(ts("runs show " + id + " --workspace '" + ws + "'").code, 0);
}

TEST(CliHardening, IndexThatIsNotADatabaseIsRebuilt) {
    TempDir d("bad_index");
    const std::string ws = d / "ws";
    ASSERT_EQ(ts("run '" + microConfig(d) + "' --steps 1 --workspace '" + ws + "'").code, 0);
    for (const std::string& cmd : {std::string("runs"), std::string("runs --json"), std::string("runs reindex")}) {
        writeFile(ws + "/index.sqlite", std::string(4096, '#'));
        Output o = ts(cmd + " --workspace '" + ws + "'");
        EXPECT_EQ(o.code, 0) << cmd << ": " << o.text;
    }
    EXPECT_EQ(runsJson(ws).size(), 1u);
}

TEST(CliHardening, EmptyRunFileIsReportedAsBroken) {
    TempDir d("empty_run_file");
    const std::string ws = d / "ws";
    ASSERT_EQ(ts("runs --workspace '" + ws + "'").code, 0);
    writeFile(ws + "/runs/20250101T000000000Z-000000.sqlite", "");
    Output list = ts("runs --workspace '" + ws + "'");
    EXPECT_EQ(list.code, 0);
    EXPECT_NE(list.text.find("broken: "), std::string::npos) << list.text;
    EXPECT_NE(list.text.find("empty (0 bytes)"), std::string::npos) << list.text;
    Output show = ts("runs show '" + ws + "/runs/20250101T000000000Z-000000.sqlite' --workspace '" + ws + "'");
    EXPECT_NE(show.code, 0);
    EXPECT_NE(show.text.find("empty (0 bytes)"), std::string::npos) << show.text;
    EXPECT_EQ(show.text.find("migrate"), std::string::npos) << show.text;
    EXPECT_EQ(ts("runs delete 20250101T000000000Z-000000 --workspace '" + ws + "'").code, 0);
    EXPECT_TRUE(runsJson(ws).empty());
}

TEST(CliHardening, ImportRefusesEmptyTracesDirectoriesFifosAndCutGzip) {
    TempDir d("import_inputs");
    const std::string ws = d / "ws";
    writeFile(d / "empty.json", "{\"traceEvents\": []}");
    Output e = ts("import '" + d / "empty.json" + "' --workspace '" + ws + "'");
    EXPECT_EQ(e.code, 2) << e.text;
    EXPECT_NE(e.text.find("no events"), std::string::npos) << e.text;
    EXPECT_TRUE(runsJson(ws).empty());

    fs::create_directories(d / "dir.json");
    Output dir = ts("import '" + d / "dir.json" + "' --workspace '" + ws + "'");
    EXPECT_EQ(dir.code, 2) << dir.text;
    EXPECT_NE(dir.text.find("is a directory"), std::string::npos) << dir.text;

    writeFile(d / "cut.json.gz", std::string("\x1f\x8b\x08\x00\x00", 5));
    Output gz = ts("import '" + d / "cut.json.gz" + "' --workspace '" + ws + "'");
    EXPECT_EQ(gz.code, 2) << gz.text;
    EXPECT_NE(gz.text.find("truncated or damaged gzip"), std::string::npos) << gz.text;

    ASSERT_EQ(::mkfifo((d / "pipe.json").c_str(), 0600), 0);
    Output fifo = sh("timeout 60 \"$TS\" import '" + d / "pipe.json" + "' --workspace '" + ws + "'");
    EXPECT_EQ(fifo.code, 2) << fifo.text;
    EXPECT_NE(fifo.text.find("not a regular file"), std::string::npos) << fifo.text;
    EXPECT_TRUE(runsJson(ws).empty());
}

TEST(CliHardening, CorruptChunkCountIsReportedByAnalyzeAndCompare) {
    TempDir d("chunk_n");
    const std::string ws = d / "ws";
    ASSERT_EQ(ts("run '" + microConfig(d) + "' --steps 2 --workspace '" + ws + "' --name a").code, 0);
    ASSERT_EQ(ts("run '" + microConfig(d) + "' --steps 2 --workspace '" + ws + "' --name b").code, 0);
    json runs = runsJson(ws);
    ASSERT_EQ(runs.size(), 2u);
    const std::string path = runs[0]["path"];
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "UPDATE slice_chunks SET n = 1099511627776", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
    Output a = ts("analyze '" + path + "'");
    EXPECT_EQ(a.code, 1) << a.text;
    EXPECT_NE(a.text.find("slice_chunks.n"), std::string::npos) << a.text;
    // compare still compares what it can read (knobs, step metrics) and says why the trace
    // metrics of the damaged run are missing.
    Output c = ts("compare a b --workspace '" + ws + "'");
    EXPECT_EQ(c.code, 0) << c.text;
    EXPECT_NE(c.text.find("slice_chunks.n"), std::string::npos) << c.text;
    EXPECT_EQ(c.text.find("bad_alloc"), std::string::npos) << c.text;
}

TEST(CliHardening, CraftedCheckpointsAreRefusedWithTheField) {
    TempDir d("checkpoint");
    const std::string cfg = microConfig(d), ckpt = d / "ckpt", ws = d / "ws";
    ASSERT_EQ(ts("run '" + cfg + "' --steps 2 --workspace '" + ws + "' --set save='" + ckpt + "'").code, 0);
    const std::string metaPath = ckpt + "/checkpoint.json";
    const json good = json::parse(readFile(metaPath));
    const std::pair<const char*, json> edits[] = {
        {"samples_consumed", -3}, {"iteration", -1}, {"iteration", "two"}, {"seed", json::array()}};
    for (const auto& [field, value] : edits) {
        json j = good;
        j[field] = value;
        writeFile(metaPath, j.dump());
        Output o = ts("run '" + cfg + "' --steps 3 --workspace '" + ws + "' --set load='" + ckpt + "'");
        EXPECT_EQ(o.code, 2) << field << ": " << o.text;
        EXPECT_NE(o.text.find(std::string("'") + field + "'"), std::string::npos) << o.text;
    }
    writeFile(metaPath, good.dump());
    EXPECT_EQ(ts("run '" + cfg + "' --steps 3 --workspace '" + ws + "' --set load='" + ckpt + "'").code, 0);
}

}  // namespace
