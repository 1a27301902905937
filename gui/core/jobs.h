// Background jobs for the workbench (hotspot's pattern): work runs on a worker thread and opens
// its own read-only store connection; the result comes back to the UI thread as a plain value
// through a queued call. A view keeps a JobGeneration and drops a result whose ticket is no
// longer current (the view has moved on to another run or step).
#pragma once

#include <atomic>
#include <functional>
#include <memory>

#include <QMetaObject>
#include <QObject>
#include <QPointer>
#include <QThreadPool>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ts::gui {

class JobGeneration {
public:
    uint64_t next() { return ++*m_value; }
    bool isCurrent(uint64_t ticket) const { return m_value->load() == ticket; }
    void invalidate() { ++*m_value; }
    std::shared_ptr<std::atomic<uint64_t>> shared() const { return m_value; }

private:
    std::shared_ptr<std::atomic<uint64_t>> m_value = std::make_shared<std::atomic<uint64_t>>(0);
};

// The pool jobs run on (a few threads; SQLite reads and analyses).
QThreadPool* jobPool();

// Runs work() on the job pool and done(result) on context's thread, unless context is gone or
// the ticket of `generation` moved on meanwhile.
template <typename T>
void runJob(QObject* context, JobGeneration& generation, std::function<T()> work, std::function<void(T)> done) {
    const uint64_t ticket = generation.next();
    auto gen = generation.shared();
    QPointer<QObject> ctx(context);
    jobPool()->start([ctx, ticket, gen, work = std::move(work), done = std::move(done)] {
        if (gen->load() != ticket) return;
        auto result = std::make_shared<T>(work());
        if (!ctx) return;
        QMetaObject::invokeMethod(ctx.data(), [ctx, ticket, gen, result, done] {
            if (ctx && gen->load() == ticket) done(std::move(*result));
        }, Qt::QueuedConnection);
    });
}

// ---- the jobs themselves (pure functions; tests call them directly)

// profiler::analyzeRun over a run file opened read-only (the `analyze --json` document).
Result<nlohmann::json> analyzeRunFile(const std::string& runFile, int step = -1);
// sessions::compareRuns with the trace metrics, as JSON (Comparison::toJson) plus "text".
Result<nlohmann::json> compareRunFiles(const std::string& runFileA, const std::string& runFileB);
// {"yaml": ..., "megatron_args": ..., "bridge_overrides": ..., "notes": {format: [..]}} of a
// run file's config (sessions/export.h).
Result<nlohmann::json> exportRunFile(const std::string& runFile);
// The run's resolved config ({knob: value}) and its step metrics, from a run file.
Result<nlohmann::json> runFileConfig(const std::string& runFile);
// Imports nsys .sqlite / Kineto .json(.gz) files into a new run file of the workspace dir
// (docs/import.md); returns the run file path.
Result<std::string> importTraceFiles(const std::vector<std::string>& paths, const std::string& workspaceDir);

}  // namespace ts::gui

namespace ts::gui {

// Memory of one rank over time, stacked by category (counters "memory.<category>"): every
// change of any category is a sample of all of them (each keeps its latest value); downsampled
// to at most maxPoints equal-time buckets, each keeping its sample with the largest total, so
// the peak survives. {"categories": [names], "ts_ns": [...], "bytes": [[per category]...],
// "peak": {"ts_ns", "bytes"}, "ranks": [ranks with counters]}.
Result<nlohmann::json> memorySeries(const std::string& runFile, int rank, size_t maxPoints = 400);

}  // namespace ts::gui
