// The workspace: a folder of runs (docs/workspace.md).
//
//   <dir>/runs/<id>.sqlite   one run file per run (profiler/store.h: config, per-step metrics,
//                            trace, status, logs, who/when/where) — the source of truth
//   <dir>/index.sqlite       an index of the run files (a cache: `rebuildIndex()` recreates it
//                            from the run files alone, so it may be deleted at any time)
//   <dir>/tmp/               scratch (configs handed to child runs, fetch snapshots)
//
// Run ids sort by creation time: "20250131T120000Z-3f9a2c" (UTC time + random suffix).
// Names and tags are written into the run file itself (RunInfo) and mirrored in the index.
// Thread-safety: a Workspace object may be used from several threads; several processes may
// share one workspace folder (SQLite locking on the index, busy timeout).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ts::sessions {

struct RunSummary {
    std::string id;
    std::string name;
    std::string createdAt;      // ISO-8601 UTC
    std::string finishedAt;
    std::string node;           // "local", "tcp://host:port", "ssh://host", hostname
    std::string layout;         // "tp2 pp2 dp2"
    std::string keyKnobs;       // non-default tuning knobs: "overlap_grad_reduce bf16 recompute_granularity=selective"
    double stepTimeS = 0;       // median over steps after the first (warm-up); 0 = no steps
    double tokensPerS = 0;      // median, same steps
    double mfu = 0;             // model FLOPs utilisation in [0,1]; 0 = unknown
    int64_t peakMemoryBytes = 0;  // max over steps (max over ranks as the run reports it)
    int steps = 0;
    double lastLoss = 0;
    std::string status;         // running | completed | failed | cancelled | unknown | broken
    std::string statusReason;
    std::vector<std::string> tags;
    std::string path;           // absolute path of the run file

    nlohmann::json toJson() const;
};

// Status of a file under runs/ that is not a readable run file (empty, damaged, not ours);
// listRuns() lists it with the reason so that it can be seen and deleted.
inline constexpr const char* kBrokenStatus = "broken";

// How remove() treats a run whose file says it is still running.
enum class RemoveMode { RefuseRunning, EvenIfRunning };

// Reads a run file into a summary (no index involved). Fails when the file is not a run file.
Result<RunSummary> summarizeRunFile(const std::string& runFilePath);

class Workspace {
public:
    // Opens (creating folders as needed) the workspace at dir; "" = defaultDir().
    static Result<Workspace> open(const std::string& dir = "");
    // $TRAINSCOPE_WORKSPACE, else $XDG_DATA_HOME/trainscope, else ~/.local/share/trainscope.
    static std::string defaultDir();

    Workspace(Workspace&& other) noexcept;
    Workspace& operator=(Workspace&& other) noexcept;

    const std::string& dir() const { return m_dir; }
    std::string runsDir() const { return m_dir + "/runs"; }
    std::string tmpDir() const { return m_dir + "/tmp"; }
    std::string indexPath() const { return m_dir + "/index.sqlite"; }

    // A fresh, unused path runs/<id>.sqlite (the file is not created). name (may be "") only
    // adds a readable slug to the id.
    Result<std::string> newRunFile(const std::string& name = "");
    // Reads the run file and inserts/updates its index row.
    Status indexRun(const std::string& runFilePath);
    // All runs, oldest first. Rows whose run file changed since indexing are refreshed; rows
    // whose file disappeared are dropped. Files under runs/ that are not readable run files
    // are listed too (first: they have no creation time), with status kBrokenStatus and the
    // reason. Two files may hold the same
    // run id (a copied file): both are listed. A damaged index is moved aside and rebuilt.
    Result<std::vector<RunSummary>> listRuns();
    // A run by path (existing file), id, unique id prefix, name (newest with that name), or
    // "latest". Returns the run file path. An id held by several files is refused (the
    // message names the files; give a path).
    Result<std::string> resolveRun(const std::string& nameOrIdOrPath);
    Result<RunSummary> findRun(const std::string& nameOrIdOrPath);
    Status rename(const std::string& run, const std::string& newName);
    Status tag(const std::string& run, const std::string& tag);     // adds (idempotent)
    Status untag(const std::string& run, const std::string& tag);
    // Deletes the run file (and its -wal/-shm) and its index row. A run whose file says
    // "running" is refused unless mode is EvenIfRunning (cancel its process first). A broken
    // file (see listRuns) is deleted when named by its path or file name.
    Status remove(const std::string& run, RemoveMode mode = RemoveMode::RefuseRunning);
    // Drops the index and re-reads every runs/*.sqlite (an index that is not a database is
    // moved aside first). Unreadable files are skipped and reported in the returned Status
    // message only if none could be read.
    Status rebuildIndex();

private:
    Workspace() = default;
    Status ensureIndex();
    Status upsert(const RunSummary& s, int64_t mtimeNs);
    Status updateRunInfoInFile(const std::string& path, const std::string* newName,
                               const std::string* addTag, const std::string* removeTag);

    std::string m_dir;
    std::unique_ptr<std::mutex> m_mutex = std::make_unique<std::mutex>();  // guards index writes
};

// Helpers shared with the agent and the CLI.
std::string isoTimeUtcNow();
std::string makeRunId(const std::string& name);
// Non-default tuning knobs of a config JSON (configToJson form), "" when it cannot be read.
std::string keyKnobsOfConfig(const nlohmann::json& configJson);

}  // namespace ts::sessions
