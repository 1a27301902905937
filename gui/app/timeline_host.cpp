// TimelineHost (timeline_host.h): a TimelineView for one run (optionally followed while it
// writes) or for two runs stacked on one axis, aligned at the start of their first measured step.
#include "gui/app/timeline_host.h"

#include <QVBoxLayout>

#include "gui/app/timeline_view.h"
#include "gui/core/jobs.h"
#include "gui/core/timeline_data.h"

namespace ts::gui {

struct TimelineHost::Impl {
    TimelineView* view = nullptr;
    ViewState state;
    int rows = 0;
    bool loaded = false;
    bool fitOnLoad = false;      // a run opened (not followed): show all of it once loaded
    int64_t shownSlices = 0;     // slices of the data on screen (0: nothing worth keeping a zoom for)
    JobGeneration pairJob;
};

TimelineHost::TimelineHost(QWidget* parent) : QWidget(parent), m(new Impl) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    m_placeholder = new QLabel(QStringLiteral("Open a run to see its timeline."), this);
    m_placeholder->setAlignment(Qt::AlignCenter);
    m_placeholder->setWordWrap(true);
    m_placeholder->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    m->view = new TimelineView(this);
    m->view->setViewState(&m->state);
    m->view->hide();
    layout->addWidget(m_placeholder);
    layout->addWidget(m->view, 1);
    connect(m->view, &TimelineView::sliceSelected, this, [this](const SliceDetails& d) { emit sliceSelectedHtml(sliceDetailsHtml(d)); });
    connect(m->view, &TimelineView::dataLoaded, this, [this](std::shared_ptr<const TimelineData> data) {
        // The overview stage arrives first; the host counts as loaded with the full data.
        if (!data || data->overview) return;
        // Fit when a run was opened, or when the first slices of a followed run arrive; a
        // reload of a followed run keeps the user's zoom.
        if (m->fitOnLoad || (m->shownSlices == 0 && data->sliceCount > 0)) m->view->timeline()->fitAll();
        m->fitOnLoad = false;
        m->shownSlices = data->sliceCount;
        m->rows = int(data->rows.size());
        m->loaded = true;
        emit loaded();
    });
    connect(m->view, &TimelineView::loadFailed, this, [this](const QString& message) {
        m_placeholder->setText(QStringLiteral("The timeline could not be loaded: %1").arg(message));
        m_placeholder->show();
        m->loaded = true;
        emit loaded();
    });
    connect(&m->state, &ViewState::stepChanged, this, &TimelineHost::stepSelected);
}

TimelineHost::~TimelineHost() { delete m; }

void TimelineHost::setRunFile(const QString& path, const QString& label, bool follow) {
    (void)label;
    m->loaded = false;
    m->rows = 0;
    m->fitOnLoad = !follow;
    m->shownSlices = 0;
    m->pairJob.invalidate();
    m_placeholder->hide();
    m->view->show();
    if (follow) m->view->followRunFile(path);
    else m->view->openRunFile(path);
}

void TimelineHost::setRunFiles(const QString& pathA, const QString& labelA, const QString& pathB, const QString& labelB) {
    m->loaded = false;
    m->rows = 0;
    m->view->stopFollowing();
    m_placeholder->setText(QStringLiteral("loading both timelines…"));
    m_placeholder->show();
    using Pair = std::pair<Result<std::shared_ptr<const TimelineData>>, Result<std::shared_ptr<const TimelineData>>>;
    const std::string a = pathA.toStdString(), b = pathB.toStdString();
    runJob<std::shared_ptr<Pair>>(this, m->pairJob,
        [a, b] { return std::make_shared<Pair>(loadTimelineData(a), loadTimelineData(b)); },
        [this, labelA, labelB](std::shared_ptr<Pair> r) {
            if (!r->first || !r->second) {
                const Status& st = !r->first ? r->first.status() : r->second.status();
                m_placeholder->setText(QStringLiteral("The timelines could not be loaded: %1").arg(QString::fromStdString(st.message())));
                m->loaded = true;
                emit loaded();
                return;
            }
            m_placeholder->hide();
            m->view->show();
            const auto& da = *r->first;
            const auto& db = *r->second;
            m->view->setRuns({TimelineRun{da, labelA, 0}, TimelineRun{db, labelB, 0}});
            // Aligned at the first step after warm-up when both have one, else at step 0.
            const int step = da->stepSpan(1) && db->stepSpan(1) ? 1 : 0;
            m->view->timeline()->alignRunsAtStep(step);
            m->rows = int(da->rows.size() + db->rows.size());
            m->loaded = true;
            emit loaded();
        });
}

void TimelineHost::setStep(int step) { m->state.setStep(step); }
int TimelineHost::rowCount() const { return m->rows; }
bool TimelineHost::isLoaded() const { return m->loaded; }

}  // namespace ts::gui
