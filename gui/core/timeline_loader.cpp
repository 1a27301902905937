// TimelineLoader: background loads with a generation counter (see timeline_loader.h).
#include "gui/core/timeline_loader.h"

#include "profiler/store.h"

namespace ts::gui {

TimelineLoader::TimelineLoader(QObject* parent) : QObject(parent) {
    // One job at a time: a newer request supersedes by generation, not by running in parallel.
    m_pool.setMaxThreadCount(1);
    connect(&m_timer, &QTimer::timeout, this, &TimelineLoader::poll);
}

TimelineLoader::~TimelineLoader() {
    ++m_generation;
    m_pool.clear();
    m_pool.waitForDone();
}

void TimelineLoader::load(const QString& path) {
    bool wasFollowing = m_timer.isActive();
    m_timer.stop();
    if (wasFollowing) emit followingChanged(false);
    m_path = path;
    m_lastCount = -1;
    start(false);
}

void TimelineLoader::follow(const QString& path, int intervalMs) {
    m_path = path;
    m_lastCount = -1;
    m_timer.start(std::max(50, intervalMs));
    emit followingChanged(true);
    start(false);
}

void TimelineLoader::stop() {
    ++m_generation;
    if (m_timer.isActive()) {
        m_timer.stop();
        emit followingChanged(false);
    }
}

void TimelineLoader::poll() {
    if (m_inFlight > 0) return;  // the previous poll is still loading; its result comes first
    start(true);
}

void TimelineLoader::start(bool onlyIfChanged) {
    const quint64 gen = ++m_generation;
    const std::string path = m_path.toStdString();
    const int64_t lastCount = onlyIfChanged ? m_lastCount : -1;
    const std::string lastStatus = m_lastStatus.toStdString();
    ++m_inFlight;
    m_pool.start([this, gen, path, lastCount, lastStatus] {
        // Worker thread: all file and SQLite work happens here.
        if (lastCount >= 0) {
            auto store = profiler::TraceStore::open(path, true);
            if (store.isOk()) {
                auto n = store.value()->sliceCount();
                auto info = store.value()->runInfo();
                std::string status = info.isOk() ? info.value().status : std::string();
                if (n.isOk() && n.value() == lastCount && status == lastStatus) {
                    QMetaObject::invokeMethod(this, [this, gen] { deliver(gen, std::shared_ptr<const TimelineData>(), true); },
                                              Qt::QueuedConnection);
                    return;
                }
            }
        }
        if (lastCount < 0) {
            // First load of this file: the overview paints in milliseconds while the detail loads.
            auto quick = loadTimelineOverview(path);
            if (quick.isOk())
                QMetaObject::invokeMethod(this, [this, gen, data = quick.value()] { deliverOverview(gen, data); },
                                          Qt::QueuedConnection);
        }
        auto result = loadTimelineData(path);
        QMetaObject::invokeMethod(this, [this, gen, result = std::move(result)]() mutable { deliver(gen, std::move(result), false); },
                                  Qt::QueuedConnection);
    });
}

void TimelineLoader::deliverOverview(quint64 generation, std::shared_ptr<const TimelineData> data) {
    // Not the end of the job: m_inFlight stays until the detail arrives.
    if (generation != m_generation) return;
    emit loaded(data);
}

void TimelineLoader::deliver(quint64 generation, Result<std::shared_ptr<const TimelineData>> result, bool unchanged) {
    --m_inFlight;
    if (generation != m_generation) return;  // stale: a newer request superseded it
    if (unchanged) {
        if (m_lastStatus != "running" && m_timer.isActive()) stop();
        return;
    }
    if (!result.isOk()) {
        const QString message = QString::fromStdString(result.status().toString());
        // A followed run that has not written its first batch yet: try again at the next poll
        // (m_lastCount stays -1, so that poll loads in full).
        if (m_timer.isActive() && m_lastCount < 0) emit waiting(message);
        else emit loadFailed(message);
        return;
    }
    auto data = std::move(result).value();
    m_lastCount = data->lastLoadedSliceCount;
    m_lastStatus = data->status;
    emit loaded(data);
    // A run that is no longer running will not change: this was the last load.
    if (m_timer.isActive() && data->status != "running") stop();
}

}  // namespace ts::gui
