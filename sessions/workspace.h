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
#include <string_view>
#include <utility>
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
    // All runs, oldest first. A read: the index is opened read-only and nothing is written
    // (run files that changed since they were indexed, or were never indexed, are summarised
    // from the file; rows whose file disappeared are left out), except that a damaged index is
    // moved aside and an empty one made. Files under runs/ that are not readable run files are
    // listed with status kBrokenStatus and the reason. Two files may hold the same run id (a
    // copied file): both are listed. indexRun()/rebuildIndex() write.
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

    // Summaries of run files read by listRuns(), keyed by path, valid while the file's (and
    // its WAL's) mtime is unchanged: many listings of a busy workspace re-read nothing.
    struct SummaryCache;
    Result<RunSummary> cachedSummary(const std::string& path, int64_t mtimeNs);
    void forgetSummary(const std::string& path);

    std::string m_dir;
    std::unique_ptr<std::mutex> m_mutex = std::make_unique<std::mutex>();  // guards index writes
    std::shared_ptr<SummaryCache> m_cache;
};

// Run ids that may come from a peer (a node's run_id, a client's request) and be joined into a
// path: 1..128 characters of [A-Za-z0-9._-], not starting with '.' or '-'. Every id this
// project generates ("20250131T120000123Z-3f9a2c-name") is one.
bool isValidRunId(std::string_view id);
inline constexpr size_t kMaxRunIdLength = 128;

// The process that writes a run file, recorded in the file's metadata (writer_pid,
// writer_start, writer_boot_id, writer_host) so that a reader can tell a running run from one
// whose process died without finishing (SIGKILL, a crash, a power cut).
struct WriterProcess {
    int64_t pid = 0;
    std::string startTime;  // /proc/PID/stat starttime (clock ticks since boot): tells pid reuse apart
    std::string bootId;     // /proc/sys/kernel/random/boot_id: pids restart after a reboot
    std::string host;
};
WriterProcess currentWriterProcess();
WriterProcess writerProcessOf(int64_t pid);  // another process on this host (pid 0 if gone)
// Metadata rows (key, value) describing this process as the writer of a run file.
std::vector<std::pair<std::string, std::string>> writerProcessMetadata();
// Alive: yes / no (gone, a zombie, another process under a reused pid, another boot) /
// unknown (another host, or nothing recorded).
enum class WriterState { Alive, Gone, Unknown };
WriterState writerState(const WriterProcess& recorded);

// The reason a run gets when its process died without finishing.
inline constexpr const char* kStaleRunReason = "process ended without finishing";
// Marks every run whose file says "running" but whose writer process is gone as failed with
// kStaleRunReason (and a log line saying when it was noticed), then re-indexes it. Runs
// without a recorded writer, or written on another host, are left alone. Writes only when it
// finds such a run. Returns the ids it finalised.
Result<std::vector<std::string>> finalizeStaleRuns(Workspace& workspace);

// Helpers shared with the agent and the CLI.
std::string isoTimeUtcNow();
std::string makeRunId(const std::string& name);
// Non-default tuning knobs of a config JSON (configToJson form), "" when it cannot be read.
std::string keyKnobsOfConfig(const nlohmann::json& configJson);

}  // namespace ts::sessions
