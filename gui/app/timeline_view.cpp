// TimelineView: toolbar + TimelineWidget + loader (see timeline_view.h).
#include "gui/app/timeline_view.h"

#include <QComboBox>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QKeyEvent>
#include <QLabel>
#include <QLineEdit>
#include <QScrollBar>
#include <QShortcut>
#include <QToolButton>
#include <QVBoxLayout>

#include "gui/core/format.h"

namespace ts::gui {

TimelineView::TimelineView(QWidget* parent) : QWidget(parent) {
    m_state = new ViewState(this);
    m_timeline = new TimelineWidget(this);
    m_loader = new TimelineLoader(this);
    m_vscroll = new QScrollBar(Qt::Vertical, this);

    auto* bar = new QHBoxLayout;
    bar->setContentsMargins(4, 2, 4, 2);
    bar->addWidget(new QLabel(tr("Step"), this));
    m_steps = new QComboBox(this);
    m_steps->setToolTip(tr("Zoom to one training step (F fits it again)"));
    bar->addWidget(m_steps);
    auto* fit = new QToolButton(this);
    fit->setText(tr("Fit"));
    fit->setToolTip(tr("Fit the selected step, or the whole run (F)"));
    bar->addWidget(fit);
    bar->addSpacing(12);
    m_find = new QLineEdit(this);
    m_find->setPlaceholderText(tr("Find ops by name (Enter: next, Shift+Enter: previous)"));
    m_find->setClearButtonEnabled(true);
    m_find->setMaximumWidth(320);
    m_find->hide();
    bar->addWidget(m_find);
    m_findCount = new QLabel(this);
    m_findCount->hide();
    bar->addWidget(m_findCount);
    bar->addStretch(1);
    m_status = new QLabel(this);
    m_status->setStyleSheet("color:#556");
    // A long message (a path, an error) must never widen the window: the label takes what
    // room the bar has and the full text is its tooltip.
    m_status->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    m_status->setMinimumWidth(120);
    bar->addWidget(m_status);

    auto* body = new QHBoxLayout;
    body->setContentsMargins(0, 0, 0, 0);
    body->setSpacing(0);
    body->addWidget(m_timeline, 1);
    body->addWidget(m_vscroll);

    auto* v = new QVBoxLayout(this);
    v->setContentsMargins(0, 0, 0, 0);
    v->setSpacing(0);
    v->addLayout(bar);
    v->addLayout(body, 1);

    m_timeline->setViewState(m_state);
    connect(m_state, &ViewState::stepChanged, this, [this](int step) {
        int i = m_steps->findData(step);
        if (i >= 0) m_steps->setCurrentIndex(i);
    });
    connect(fit, &QToolButton::clicked, m_timeline, &TimelineWidget::fitSelection);
    connect(m_steps, &QComboBox::activated, this, &TimelineView::onStepChosen);
    connect(m_timeline, &TimelineWidget::sliceSelected, this, &TimelineView::sliceSelected);
    connect(m_timeline, &TimelineWidget::findRequested, this, &TimelineView::showFind);
    connect(m_timeline, &TimelineWidget::contentHeightChanged, this, [this](int) { updateStatus(); });
    connect(m_timeline, &TimelineWidget::verticalOffsetChanged, m_vscroll, &QScrollBar::setValue);
    connect(m_vscroll, &QScrollBar::valueChanged, m_timeline, &TimelineWidget::setVerticalOffset);
    connect(m_timeline, &TimelineWidget::findResultsChanged, this, [this](int count, int current) {
        m_findCount->setText(count ? tr("%1 / %2").arg(current + 1).arg(count) : tr("no match"));
    });
    connect(m_find, &QLineEdit::returnPressed, this, [this] {
        const QString text = m_find->text().trimmed();
        if (text.isEmpty()) return;
        if (text != m_lastFind) {
            m_lastFind = text;
            m_timeline->find(text);
        } else if (QGuiApplication::keyboardModifiers() & Qt::ShiftModifier) {
            m_timeline->findPrevious();
        } else {
            m_timeline->findNext();
        }
        m_findCount->show();
    });
    auto* findKey = new QShortcut(QKeySequence::Find, this);
    findKey->setContext(Qt::WidgetWithChildrenShortcut);
    connect(findKey, &QShortcut::activated, this, &TimelineView::showFind);
    auto* escKey = new QShortcut(QKeySequence(Qt::Key_Escape), m_find);
    escKey->setContext(Qt::WidgetShortcut);
    connect(escKey, &QShortcut::activated, this, [this] {
        m_find->hide();
        m_findCount->hide();
        m_timeline->setFocus();
    });

    connect(m_loader, &TimelineLoader::loaded, this, [this](std::shared_ptr<const TimelineData> data) {
        m_loadMessage.clear();
        m_timeline->setData(data);
        refreshSteps();
        updateStatus();
        emit dataLoaded(data);
    });
    connect(m_loader, &TimelineLoader::loadFailed, this, [this](const QString& msg) {
        m_loadMessage = tr("could not load: %1").arg(msg);
        updateStatus();
        emit loadFailed(msg);
    });
    connect(m_loader, &TimelineLoader::waiting, this, [this](const QString& msg) {
        m_loadMessage = tr("waiting for the run to write its first events…");
        m_status->setToolTip(msg);
        updateStatus();
    });
    connect(m_loader, &TimelineLoader::followingChanged, this, [this](bool) { updateStatus(); });
    refreshSteps();
}

void TimelineView::setViewState(ViewState* state) {
    if (!state || state == m_state) return;
    if (m_state && m_state->parent() == this) m_state->deleteLater();
    m_state = state;
    m_timeline->setViewState(state);
    connect(state, &ViewState::stepChanged, this, [this](int step) {
        int i = m_steps->findData(step);
        if (i >= 0) m_steps->setCurrentIndex(i);
    });
}

void TimelineView::openRunFile(const QString& path) {
    m_loadMessage = tr("loading %1…").arg(path);
    updateStatus();
    m_loader->load(path);
}

void TimelineView::followRunFile(const QString& path, int intervalMs) {
    m_loadMessage = tr("loading %1…").arg(path);
    updateStatus();
    m_loader->follow(path, intervalMs);
}

void TimelineView::stopFollowing() { m_loader->stop(); }

void TimelineView::setData(std::shared_ptr<const TimelineData> data) {
    m_timeline->setData(std::move(data));
    refreshSteps();
    updateStatus();
}

void TimelineView::setRuns(std::vector<TimelineRun> runs) {
    m_timeline->setRuns(std::move(runs));
    refreshSteps();
    updateStatus();
}

void TimelineView::showFind() {
    m_find->show();
    m_find->setFocus();
    m_find->selectAll();
}

void TimelineView::refreshSteps() {
    // Union of the steps of every run shown.
    std::vector<int> steps;
    for (const auto& r : m_timeline->runs())
        for (const auto& s : r.data->steps) steps.push_back(s.step);
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    const int current = m_state ? m_state->step() : -1;
    m_steps->clear();
    m_steps->addItem(tr("all steps"), -1);
    for (int s : steps) m_steps->addItem(tr("step %1").arg(s), s);
    int i = m_steps->findData(current);
    m_steps->setCurrentIndex(i >= 0 ? i : 0);
}

void TimelineView::onStepChosen(int comboIndex) {
    int step = m_steps->itemData(comboIndex).toInt();
    if (m_state->step() == step) {
        m_timeline->fitSelection();
        return;
    }
    m_state->setStep(step);  // the widget follows the state (fitStep / fitAll)
}

void TimelineView::updateStatus() {
    QString s;
    int64_t slices = 0;
    for (const auto& r : m_timeline->runs()) slices += r.data->sliceCount;
    if (!m_timeline->runs().empty()) s = tr("%1 ops").arg(slices);
    for (const auto& r : m_timeline->runs())
        if (r.data->overview) s += tr(" · overview, loading detail…");
    if (m_loader->isFollowing()) s += tr(" · following the run");
    if (!m_loadMessage.isEmpty()) s = m_loadMessage;
    m_status->setText(s);
    if (!s.startsWith(tr("waiting"))) m_status->setToolTip(s);
    const int page = std::max(1, m_timeline->height() - TimelineWidget::kRulerPx);
    m_vscroll->setRange(0, std::max(0, m_timeline->contentHeight() - page));
    m_vscroll->setPageStep(page);
    m_vscroll->setSingleStep(20);
}

}  // namespace ts::gui
