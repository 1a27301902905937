// Commands of the 'sessions' group: runs (workspace), agent (node server), compare, export,
// and `run --node` (through an agent). The work is in sessions/; this file parses arguments
// and prints.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/trainscope/commands.h"
#include "common/json_text.h"
#include "common/text.h"
#include "engine/backend/backend.h"
#include "engine/config/knobs.h"
#include "profiler/store.h"
#include "sessions/agent.h"
#include "sessions/compare.h"
#include "sessions/bridge_import.h"
#include "sessions/export.h"
#include "sessions/megatron_import.h"
#include "sessions/node_client.h"
#include "sessions/workspace.h"

#ifndef TS_VERSION
#define TS_VERSION "0.0.0"
#endif

namespace ts::cli {

using nlohmann::json;
using sessions::RunSummary;
using sessions::Workspace;

namespace {

// Said wherever CUDA devices are listed until layouts over several GPUs have been checked.
constexpr const char* kCudaBackendStatus =
    "device_backend: cuda runs one rank on GPU 0 (checked against the CPU backend on an H200); layouts "
    "over several GPUs are not yet verified (TS_CUDA_UNVERIFIED=1 runs them, one rank per GPU; with "
    "cuda_share_gpus: true too, ranks share GPUs to check a layout's results)";

int codeFor(const Status& s) { return exitCodeOf(s); }

int failStatus(const Status& s) { return fail(codeFor(s), s.message()); }

int checkFlags(const Args& a, const std::vector<std::string>& known) {
    auto unknown = a.unknownFlags(known);
    if (unknown.empty()) return 0;
    return fail(2, "unknown option " + unknown.front() + " for '" + a.command() + "' (see `trainscope " +
                       a.command() + " --help`)");
}

std::string human(double bytes) {
    const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (bytes >= 1024 && i < 4) { bytes /= 1024; ++i; }
    char buf[32];
    std::snprintf(buf, sizeof buf, i ? "%.1f %s" : "%.0f %s", bytes, u[i]);
    return buf;
}

std::string shortDate(const std::string& iso) {
    // "2025-01-31T12:00:00Z" -> "2025-01-31 12:00"
    if (iso.size() < 16) return iso;
    return iso.substr(0, 10) + " " + iso.substr(11, 5);
}

void printRunsTable(const std::vector<RunSummary>& runs) {
    std::printf("%-32s %-16s %-16s %-10s %-12s %10s %10s %6s %10s %-10s %s\n", "ID", "NAME", "DATE", "NODE",
                "LAYOUT", "STEP", "TOK/S", "MFU", "PEAK MEM", "STATUS", "KEY KNOBS");
    for (const auto& r : runs) {
        char step[32], tok[32], mfu[16];
        if (r.stepTimeS > 0) std::snprintf(step, sizeof step, "%.1f ms", r.stepTimeS * 1e3);
        else std::snprintf(step, sizeof step, "-");
        if (r.tokensPerS > 0) std::snprintf(tok, sizeof tok, "%.0f", r.tokensPerS);
        else std::snprintf(tok, sizeof tok, "-");
        if (r.mfu > 0) std::snprintf(mfu, sizeof mfu, "%.1f%%", r.mfu * 100);
        else std::snprintf(mfu, sizeof mfu, "-");
        // Names and the rest come from run files: escaped, then cut (a cut never splits an escape).
        std::string name = forTerminal(r.name), node = forTerminal(r.node);
        if (name.size() > 16) name = name.substr(0, 15) + "~";
        if (node.size() > 10) node = node.substr(0, 9) + "~";
        std::string status = r.status == sessions::kBrokenStatus ? "broken: " + r.statusReason : r.status;
        std::printf("%-32s %-16s %-16s %-10s %-12s %10s %10s %6s %10s %-10s %s\n", forTerminal(r.id).c_str(),
                    name.c_str(), forTerminal(shortDate(r.createdAt)).c_str(), node.c_str(),
                    forTerminal(r.layout).c_str(), step, tok, mfu,
                    r.peakMemoryBytes > 0 ? human(double(r.peakMemoryBytes)).c_str() : "-",
                    forTerminal(status).c_str(), forTerminal(r.keyKnobs).c_str());
    }
    if (runs.empty()) std::printf("(no runs yet: `trainscope run CONFIG.yaml` adds one)\n");
}

// The writer process a run file records (sessions::writerProcessMetadata, written by
// `trainscope run`); pid 0 when the file records none.
sessions::WriterProcess recordedWriterOf(const std::string& runFile) {
    sessions::WriterProcess w;
    auto store = profiler::TraceStore::open(runFile, /*readOnly=*/true);
    if (!store) return w;
    auto meta = (*store)->allMetadata();
    if (!meta) return w;
    auto get = [&](const char* k) {
        auto it = meta->find(k);
        return it == meta->end() ? std::string() : it->second;
    };
    const auto pid = parseInteger(get("writer_pid"), 1, INT32_MAX, "writer_pid");
    if (!pid) return w;
    w.pid = *pid;
    w.startTime = get("writer_start");
    w.bootId = get("writer_boot_id");
    w.host = get("writer_host");
    return w;
}

// `runs delete --force` of a running run: asks its process to stop (SIGTERM, which `run`
// handles like Ctrl-C: the run is recorded as cancelled) and waits up to 30 s for it to exit.
// Only a writer known to be alive on this host is signalled (writerState tells a reused pid or
// another boot apart); a run whose process is unknown or gone has nothing to cancel.
Status cancelRunningRun(const RunSummary& r) {
    const sessions::WriterProcess w = recordedWriterOf(r.path);
    if (sessions::writerState(w) != sessions::WriterState::Alive) return Status::ok();
    const pid_t pid = pid_t(w.pid);
    std::fprintf(stderr, "trainscope: cancelling run %s (process %d) before deleting it\n", forTerminal(r.id).c_str(),
                 int(pid));
    if (::kill(pid, SIGTERM) != 0)
        return Status::io("cannot cancel run " + r.id + " (process " + std::to_string(pid) + "): " + std::strerror(errno));
    for (int i = 0; i < 300; ++i) {
        if (sessions::writerState(w) != sessions::WriterState::Alive) return Status::ok();
        ::usleep(100 * 1000);
    }
    return Status::timeout("run " + r.id + " (process " + std::to_string(pid) +
                           ") did not stop within 30 s of SIGTERM; stop it, then delete the run");
}

Result<std::string> readFile(const std::string& path) {
    std::ifstream f(path);
    if (!f) return Status::notFound("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// What `devices` (the command and the agent's method) answers on this node: the CUDA devices
// when this build and machine have them, and always the CPU. `cuda` says why there are none.
json probeDevices() {
    json cpu = sessions::probeCpuDevices();
    json backends = json::array();
    auto cuda = engine::makeCudaBackend();
    if (cuda) {
        json devs = json::array();
        for (int i = 0; i < (*cuda)->deviceCount(); ++i) {
            const auto& info = (*cuda)->device(i).info();
            devs.push_back({{"index", i},
                            {"name", info.name},
                            {"memory_total_bytes", info.memoryTotal},
                            {"memory_free_bytes", info.memoryFree},
                            {"sm_count", info.smCount},
                            {"compute_capability", std::to_string(info.computeCapabilityMajor) + "." +
                                                       std::to_string(info.computeCapabilityMinor)},
                            {"peak_tflops_fp32", info.peakTflopsFp32},
                            {"peak_tflops_bf16", info.peakTflopsBf16}});
        }
        json entry = {{"backend", "cuda"}, {"count", devs.size()}, {"devices", devs}, {"status", kCudaBackendStatus}};
        if (auto topo = engine::probeGpuTopology()) {
            json links = json::array();
            for (int i = 0; i < topo->count(); ++i) {
                json row = json::array();
                for (int j = 0; j < topo->count(); ++j) row.push_back(i == j ? "X" : topo->links[size_t(i)][size_t(j)].kind());
                links.push_back(row);
            }
            entry["topology"] = {{"pci_bus_ids", topo->pciBusIds},
                                 {"numa_nodes", topo->numaNodes},
                                 {"links", links},
                                 {"text", engine::formatGpuTopology(*topo)}};
        }
        const char* conns = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
        entry["cuda_device_max_connections"] = conns ? json(conns) : json(nullptr);
        backends.push_back(entry);
    }
    backends.push_back(cpu["backends"][0]);
    json out = backends[0];
    out["backends"] = backends;
    if (!cuda) out["cuda"] = cuda.status().message();
    return out;
}

}  // namespace

// ---- devices -----------------------------------------------------------------------------

int cmdDevices(const Args& a) {
    if (int rc = checkFlags(a, {"--json"})) return rc;
    const json d = probeDevices();
    if (a.has("--json")) {
        std::printf("%s\n", dumpJson(d, 2).c_str());
        return 0;
    }
    auto num = [](const json& j, const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0; };
    auto str = [](const json& j, const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string(); };
    for (const auto& b : d["backends"]) {
        const std::string kind = str(b, "backend");
        std::printf("%s: %d device%s\n", kind.c_str(), int(num(b, "count")), num(b, "count") == 1 ? "" : "s");
        for (const auto& dev : b["devices"]) {
            std::printf("  [%d] %s\n", int(num(dev, "index")), forTerminal(str(dev, "name")).c_str());
            std::printf("      memory %s total, %s free", human(num(dev, "memory_total_bytes")).c_str(),
                        human(num(dev, "memory_free_bytes")).c_str());
            if (kind == "cuda") {
                std::printf(", %d SMs, compute capability %s", int(num(dev, "sm_count")),
                            str(dev, "compute_capability").c_str());
                auto peak = [&](const char* k) {
                    const double v = num(dev, k);
                    char buf[32];
                    std::snprintf(buf, sizeof buf, "%.1f", v);
                    return v > 0 ? std::string(buf) : std::string("unknown");
                };
                std::printf("\n      peak TFLOP/s fp32 %s, bf16 %s (resources/peak_flops.json)", peak("peak_tflops_fp32").c_str(),
                            peak("peak_tflops_bf16").c_str());
            } else if (dev.contains("cores")) {
                std::printf(", %d cores", int(num(dev, "cores")));
            }
            std::printf("\n");
        }
        if (kind == "cuda" && b.contains("topology") && num(b, "count") > 1)
            std::printf("  topology (CUDA peer access):\n%s", str(b["topology"], "text").c_str());
        if (kind == "cuda") {
            const json& c = b["cuda_device_max_connections"];
            std::printf("  CUDA_DEVICE_MAX_CONNECTIONS=%s (Megatron wants 1 with sequence parallel / TP comm overlap)\n",
                        c.is_string() ? forTerminal(c.get<std::string>()).c_str() : "unset");
            std::printf("  note: %s\n", kCudaBackendStatus);
        }
    }
    if (d.contains("cuda")) std::printf("cuda: none (%s)\n", forTerminal(d["cuda"].get<std::string>()).c_str());
    return 0;
}

// ---- runs --------------------------------------------------------------------------------

int cmdRuns(const Args& a) {
    if (int rc = checkFlags(a, {"--workspace", "--json", "--force"})) return rc;
    const auto& pos = a.positional();
    const std::string sub = pos.empty() ? "list" : pos[0];
    auto need = [&](size_t n, const char* usage) -> bool {
        if (pos.size() >= n) return true;
        fail(2, std::string("usage: trainscope runs ") + usage);
        return false;
    };
    auto ws = Workspace::open(a.value("--workspace").value_or(""));
    if (!ws) return failStatus(ws.status());
    const bool asJson = a.has("--json");
    // Runs left "running" by a process that is gone (killed, crashed) are marked failed first,
    // so no command shows them running forever. Writes only when it finds one.
    if (auto stale = sessions::finalizeStaleRuns(*ws); stale && !stale->empty())
        for (const auto& id : *stale)
            std::fprintf(stderr, "trainscope: run %s was left running by a process that is gone; marked failed (%s)\n",
                         id.c_str(), sessions::kStaleRunReason);
    if (sub == "list" || sub == "ls") {
        auto runs = ws->listRuns();
        if (!runs) return failStatus(runs.status());
        if (asJson) {
            json out = json::array();
            for (const auto& r : *runs) out.push_back(r.toJson());
            std::printf("%s\n", dumpJson(out, 2).c_str());
        } else {
            printRunsTable(*runs);
        }
        return 0;
    }
    if (sub == "show") {
        if (!need(2, "show RUN")) return 2;
        auto r = ws->findRun(pos[1]);
        if (!r) return failStatus(r.status());
        if (asJson) {
            std::printf("%s\n", dumpJson(r->toJson(), 2).c_str());
        } else {
            json j = r->toJson();
            for (auto& [k, v] : j.items())
                std::printf("%-18s %s\n", k.c_str(), forTerminal(v.is_string() ? v.get<std::string>() : dumpJson(v)).c_str());
        }
        return 0;
    }
    Status s;
    if (sub == "name" || sub == "rename") {
        if (!need(3, "name RUN NAME")) return 2;
        s = ws->rename(pos[1], pos[2]);
    } else if (sub == "tag") {
        if (!need(3, "tag RUN TAG")) return 2;
        s = ws->tag(pos[1], pos[2]);
    } else if (sub == "untag") {
        if (!need(3, "untag RUN TAG")) return 2;
        s = ws->untag(pos[1], pos[2]);
    } else if (sub == "delete" || sub == "rm") {
        if (!need(2, "delete RUN [--force]")) return 2;
        sessions::RemoveMode mode = sessions::RemoveMode::RefuseRunning;
        if (a.has("--force")) {
            // --force cancels a running run first (its process is told to stop like Ctrl-C
            // and records "cancelled"), then deletes it.
            auto r = ws->findRun(pos[1]);
            if (r && r->status == "running") {
                if (Status c = cancelRunningRun(*r); !c) return failStatus(c);
            }
            mode = sessions::RemoveMode::EvenIfRunning;
        }
        s = ws->remove(pos[1], mode);
    } else if (sub == "reindex") {
        s = ws->rebuildIndex();  // stale runs were finalised above
    } else {
        return fail(2, "unknown 'runs' subcommand '" + sub + "'; use list, show, name, tag, untag, delete or reindex");
    }
    if (!s) return failStatus(s);
    return 0;
}

// ---- agent -------------------------------------------------------------------------------

int cmdAgent(const Args& a) {
    if (int rc = checkFlags(a, {"--stdio", "--listen", "--token-file", "--workspace", "--max-runs", "--node-name",
                                "--generate-token", "--allow-path"}))
        return rc;
    if (auto file = a.value("--generate-token")) {
        if (a.has("--stdio") || a.has("--listen")) return fail(2, "--generate-token FILE writes a token and exits; start the agent afterwards");
        if (file->empty()) return fail(2, "usage: trainscope agent --generate-token FILE");
        Status s = sessions::generateTokenFile(*file);
        if (!s) return failStatus(s);
        std::fprintf(stderr,
                     "trainscope agent: wrote a new random token to %s (mode 0600)\n"
                     "  serve:   trainscope agent --listen HOST:PORT --token-file %s\n"
                     "  clients: copy the file (keep it private) and pass --token-file FILE or $TRAINSCOPE_TOKEN_FILE\n",
                     file->c_str(), file->c_str());
        std::printf("%s\n", file->c_str());
        return 0;
    }
    sessions::AgentOptions o;
    o.allowedPaths = a.values("--allow-path");
    o.workspaceDir = a.value("--workspace").value_or("");
    o.version = TS_VERSION;
    o.devicesProvider = probeDevices;
    if (auto n = a.value("--node-name")) o.nodeName = *n;
    const auto maxRuns = intFlag(a, "--max-runs", 1, 4096);
    if (!maxRuns) return failStatus(maxRuns.status());
    if (*maxRuns) o.maxActiveRuns = int(**maxRuns);
    if (a.has("--stdio") == a.value("--listen").has_value())
        return fail(2, "give exactly one of --stdio or --listen HOST:PORT --token-file FILE");
    if (a.has("--stdio")) {
        // Protocol frames own stdout; anything else a library prints goes to stderr instead.
        // Close-on-exec: the runs (child processes) must not hold the client's pipe open.
        int protocolOut = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
        if (protocolOut < 0 || ::dup2(2, 1) < 0) return fail(1, "cannot set up stdout for the protocol");
        auto agent = sessions::Agent::create(o);
        if (!agent) return failStatus(agent.status());
        if (Status sig = (*agent)->installSignalHandlers(); !sig) return failStatus(sig);
        Status s = (*agent)->serve(0, protocolOut, /*requireAuth=*/false);
        // The client went away (EOF) or asked to shut down: runs still going are finalised
        // first so their run files say how they ended.
        (*agent)->waitForRuns();
        if (!s) return failStatus(s);
        return 0;
    }
    auto tokenFile = a.value("--token-file");
    if (!tokenFile) return fail(2, "--listen needs --token-file FILE (a secret the clients must send)");
    auto token = sessions::readTokenFile(*tokenFile);
    if (!token) return failStatus(token.status());
    if (Status strong = sessions::checkTokenStrength(*token); !strong)
        return fail(2, "token file " + *tokenFile + ": " + strong.message());
    o.token = *token;
    {
        std::string host;
        int port = 0;
        if (Status p = sessions::parseHostPort(*a.value("--listen"), /*allowZero=*/true, &host, &port); !p)
            return failStatus(p);
    }
    auto agent = sessions::Agent::create(o);
    if (!agent) return failStatus(agent.status());
    Status s = (*agent)->listen(*a.value("--listen"));
    if (!s) return failStatus(s);
    if (Status sig = (*agent)->installSignalHandlers(); !sig) return failStatus(sig);
    std::fprintf(stderr, "trainscope agent: listening on %s (port %d), workspace %s\n", a.value("--listen")->c_str(),
                 (*agent)->boundPort(), o.workspaceDir.empty() ? Workspace::defaultDir().c_str() : o.workspaceDir.c_str());
    std::fflush(stderr);
    s = (*agent)->serveTcp();
    (*agent)->waitForRuns();
    if (!s) return failStatus(s);
    return 0;
}

// ---- run --node ---------------------------------------------------------------------------

int cmdRunOnNode(const Args& a) {
    const auto& pos = a.positional();
    if (pos.empty()) return fail(2, "usage: trainscope run CONFIG.yaml --node ssh://HOST|tcp://HOST:PORT|local");
    auto text = readFile(pos[0]);
    if (!text) return failStatus(text.status());
    sessions::NodeRunRequest req;
    req.nodeUrl = a.value("--node").value_or("local");
    req.configYaml = *text;
    req.overrides = a.values("--set");
    req.name = a.value("--name").value_or("");
    req.workspaceDir = a.value("--workspace").value_or("");
    if (auto t = a.value("--token-file")) req.connect.tokenFile = *t;
    if (req.nodeUrl == "local") {
        // The local agent shares our workspace, so the run is stored once, in place.
        auto ws = Workspace::open(req.workspaceDir);
        if (!ws) return failStatus(ws.status());
        req.connect.localAgentArgs = {"--workspace", ws->dir()};
    }
    const auto steps = intFlag(a, "--steps", 1, kMaxSteps);
    if (!steps) return failStatus(steps.status());
    if (*steps) req.steps = int(**steps);
    req.name = sanitizeUtf8(req.name);
    const bool asJson = a.has("--json");
    // Notification params come from the node: read them by type (json::value() throws on a
    // field of another type).
    auto num = [](const json& p, const char* k) {
        auto it = p.find(k);
        return it != p.end() && it->is_number() ? it->get<double>() : 0.0;
    };
    auto strOf = [](const json& p, const char* k) {
        auto it = p.find(k);
        return it != p.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    auto onEvent = [&](const std::string& method, const json& p) {
        if (!p.is_object()) return;
        if (asJson) {
            if (method == "progress") {
                json e = p;
                e["event"] = "step";
                std::printf("%s\n", dumpJson(e).c_str());
                std::fflush(stdout);
            }
            return;
        }
        if (method == "progress") {
            std::printf("step %4.0f  loss %.4f  %.1f ms  %.0f tokens/s\n", num(p, "step"), num(p, "loss"),
                        num(p, "step_time_s") * 1e3, num(p, "tokens_per_s"));
            std::fflush(stdout);
        } else if (method == "run_log" && strOf(p, "stream") == "stderr") {
            std::fprintf(stderr, "[%s] %s\n", forTerminal(req.nodeUrl).c_str(), forTerminal(strOf(p, "text")).c_str());
        }
    };
    if (asJson) std::printf("%s\n", dumpJson(json{{"event", "start"}, {"node", req.nodeUrl}}).c_str());
    auto r = sessions::runOnNode(req, onEvent);
    if (!r) {
        if (asJson)
            std::printf("%s\n", dumpJson(json{{"event", "end"}, {"status", "failed"}, {"reason", r.status().message()}}).c_str());
        return failStatus(r.status());
    }
    if (asJson) {
        std::printf("%s\n", dumpJson(json{{"event", "end"}, {"status", r->status}, {"reason", r->reason},
                                          {"run_id", r->run.id}, {"run_file", r->run.path}}).c_str());
    } else {
        std::printf("run %s %s on %s%s\nstored as %s\n", forTerminal(r->run.id).c_str(), forTerminal(r->status).c_str(),
                    forTerminal(req.nodeUrl).c_str(), r->reason.empty() ? "" : forTerminal(": " + r->reason).c_str(),
                    forTerminal(r->run.path).c_str());
    }
    return r->status == "completed" ? 0 : 1;
}

// ---- compare -------------------------------------------------------------------------------

int cmdCompare(const Args& a) {
    if (int rc = checkFlags(a, {"--all", "--json", "--workspace"})) return rc;
    if (a.positional().size() != 2) return fail(2, "usage: trainscope compare RUN_A RUN_B [--all] [--json]");
    auto ws = Workspace::open(a.value("--workspace").value_or(""));
    if (!ws) return failStatus(ws.status());
    auto pa = ws->resolveRun(a.positional()[0]);
    if (!pa) return failStatus(pa.status());
    auto pb = ws->resolveRun(a.positional()[1]);
    if (!pb) return failStatus(pb.status());
    sessions::CompareOptions o;
    o.all = a.has("--all");
    o.traceAnalyzer = sessions::analyzeTraceMetrics;
    auto c = sessions::compareRuns(*pa, *pb, o);
    if (!c) return failStatus(c.status());
    if (a.has("--json")) std::printf("%s\n", dumpJson(c->toJson(), 2).c_str());
    else std::fputs(forTerminal(c->toText(), /*keepNewlines=*/true).c_str(), stdout);
    return 0;
}

// ---- export --------------------------------------------------------------------------------

int cmdExport(const Args& a) {
    if (int rc = checkFlags(a, {"--format", "--out", "--workspace"})) return rc;
    if (a.positional().size() != 1)
        return fail(2, "usage: trainscope export RUN --format yaml|megatron-args|bridge-overrides [--out FILE]");
    auto format = sessions::parseExportFormat(a.value("--format").value_or("yaml"));
    if (!format) return failStatus(format.status());
    const std::string what = a.positional()[0];
    engine::Config config;
    if ((what.ends_with(".yaml") || what.ends_with(".yml")) && ::access(what.c_str(), R_OK) == 0) {
        // A config file exports too (handy before any run exists).
        auto loaded = engine::loadConfigFile(what);
        if (!loaded.ok()) return failStatus(engine::issuesToStatus(loaded.issues));
        config = loaded.config;
    } else {
        auto ws = Workspace::open(a.value("--workspace").value_or(""));
        if (!ws) return failStatus(ws.status());
        auto path = ws->resolveRun(what);
        if (!path) return failStatus(path.status());
        auto c = sessions::configOfRunFile(*path);
        if (!c) return failStatus(c.status());
        config = *c;
    }
    sessions::ExportResult r = sessions::exportConfig(config, *format);
    for (const auto& n : r.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
    if (auto out = a.value("--out")) {
        std::ofstream f(*out);
        f << r.text;
        if (!f) return fail(1, "cannot write " + *out);
    } else {
        std::fputs(r.text.c_str(), stdout);
    }
    return 0;
}

// `trainscope config from-megatron FILE|-`: a Megatron-LM launch (pretrain_gpt.py argument
// list or a shell script holding one) as a trainscope YAML; every argument that maps to no
// knob is listed on stderr and as a comment at the top of the YAML.
int cmdConfig(const Args& a) {
    if (int rc = checkFlags(a, {"--out", "--shrink"})) return rc;
    const auto& pos = a.positional();
    if (pos.size() != 2 || (pos[0] != "from-megatron" && pos[0] != "from-bridge"))
        return fail(2, "usage: trainscope config from-megatron SCRIPT|- | from-bridge YAML|OVERRIDES|- [--shrink] [--out CONFIG.yaml]");
    const bool bridge = pos[0] == "from-bridge";
    std::string text;
    if (pos[1] == "-") {
        std::ostringstream ss;
        ss << std::cin.rdbuf();
        text = ss.str();
    } else {
        std::ifstream in(pos[1], std::ios::binary);
        if (!in) return fail(3, "cannot open " + pos[1]);
        std::ostringstream ss;
        ss << in.rdbuf();
        text = ss.str();
    }
    if (text.size() > (size_t(1) << 20)) return fail(2, pos[1] + " is larger than 1 MiB; give the launch script");
    std::vector<std::string> notes, unmapped;
    engine::Config config;
    if (bridge) {
        auto imported = sessions::configFromBridge(text);
        if (!imported) return failStatus(imported.status());
        config = imported->config;
        notes = imported->notes;
        unmapped = imported->unmapped;
    } else {
        auto imported = sessions::configFromMegatronScript(text);
        if (!imported) return failStatus(imported.status());
        config = imported->config;
        notes = imported->notes;
        unmapped = imported->unmapped;
    }
    if (a.has("--shrink"))
        for (const auto& change : sessions::shrinkModelShape(config)) notes.push_back("shrunk " + change);
    std::string yaml = "# Imported by `trainscope config " + pos[0] + "` from " + pos[1] + "\n";
    for (const auto& n : notes) {
        std::fprintf(stderr, "note: %s\n", forTerminal(n).c_str());
        yaml += "# note: " + forTerminal(n) + "\n";
    }
    for (const auto& u : unmapped) {
        std::fprintf(stderr, "unmapped: %s\n", forTerminal(u).c_str());
        yaml += "# unmapped: " + forTerminal(u) + "\n";
    }
    for (const auto& issue : engine::validateConfig(config))
        std::fprintf(stderr, "warning: %s\n", forTerminal(issue.toString()).c_str());
    yaml += engine::configToYaml(config, /*onlyNonDefault=*/true);
    if (auto out = a.value("--out")) {
        std::ofstream f(*out);
        f << yaml;
        if (!f) return fail(1, "cannot write " + *out);
    } else {
        std::fputs(yaml.c_str(), stdout);
    }
    return 0;
}

}  // namespace ts::cli
