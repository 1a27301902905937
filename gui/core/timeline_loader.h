// TimelineLoader: loads TimelineData on a worker thread and hands it to the UI thread with a
// queued call (hotspot's jobs). Every request bumps a generation counter; a result whose
// generation is not the newest is dropped, so a view that moved on never shows stale data.
//
// Follow mode re-reads the run file every interval while the run's status is "running"
// (a file written by a live run: WAL readers see whole committed batches). A poll first
// compares the file's slice count and status with the last load and skips the rebuild when
// nothing changed; after the run stops, one last load is delivered and polling ends.
// A followed file that cannot be read yet (the run has created it but not written its first
// batch: 0 bytes, no schema) is a state of the run, not an error: `waiting` is emitted and the
// next poll tries again. Whoever started the run loads it once more when it ends (load()),
// which reports a file that stayed unreadable through loadFailed.
#pragma once

#include <atomic>
#include <memory>

#include <QObject>
#include <QString>
#include <QThreadPool>
#include <QTimer>

#include "gui/core/timeline_data.h"

namespace ts::gui {

class TimelineLoader : public QObject {
    Q_OBJECT
public:
    explicit TimelineLoader(QObject* parent = nullptr);
    ~TimelineLoader() override;  // drops pending results and waits for the worker

    // Loads `path` once (cancels following).
    void load(const QString& path);
    // Loads `path` now and again every intervalMs while the run is running.
    void follow(const QString& path, int intervalMs = 1000);
    void stop();
    bool isFollowing() const { return m_timer.isActive(); }
    bool isBusy() const { return m_inFlight > 0; }
    quint64 generation() const { return m_generation; }
    QString path() const { return m_path; }

signals:
    // For a first load of a v2 file: first the overview (data->overview), then the detail.
    void loaded(std::shared_ptr<const ts::gui::TimelineData> data);
    void loadFailed(const QString& message);
    // Follow mode, before the first successful load: the file is not readable yet.
    void waiting(const QString& message);
    void followingChanged(bool following);

private:
    void poll();
    void start(bool onlyIfChanged);
    void deliverOverview(quint64 generation, std::shared_ptr<const TimelineData> data);
    void deliver(quint64 generation, Result<std::shared_ptr<const TimelineData>> result, bool unchanged);

    QThreadPool m_pool;
    QTimer m_timer;
    QString m_path;
    quint64 m_generation = 0;
    int m_inFlight = 0;  // jobs started whose result (stale or not) has not come back
    int64_t m_lastCount = -1;
    QString m_lastStatus;
};

}  // namespace ts::gui
