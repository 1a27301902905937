// TimelineHost (timeline_host.h).
#include "gui/app/timeline_host.h"

#include <QFileInfo>
#include <QTimer>
#include <QVBoxLayout>

namespace ts::gui {

struct TimelineHost::Impl {
    bool loaded = false;
};

TimelineHost::TimelineHost(QWidget* parent) : QWidget(parent), m(new Impl) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    m_placeholder = new QLabel(QStringLiteral("Open a run to see its timeline."), this);
    m_placeholder->setAlignment(Qt::AlignCenter);
    layout->addWidget(m_placeholder);
}

void TimelineHost::setRunFile(const QString& path, const QString& label, bool) {
    m_placeholder->setText(QStringLiteral("%1 — %2").arg(label, QFileInfo(path).fileName()));
    m->loaded = true;
    QTimer::singleShot(0, this, &TimelineHost::loaded);
}

void TimelineHost::setRunFiles(const QString& pathA, const QString& labelA, const QString& pathB, const QString& labelB) {
    m_placeholder->setText(QStringLiteral("A: %1 (%2)\nB: %3 (%4)").arg(labelA, QFileInfo(pathA).fileName(), labelB, QFileInfo(pathB).fileName()));
    m->loaded = true;
    QTimer::singleShot(0, this, &TimelineHost::loaded);
}

void TimelineHost::setStep(int) {}
int TimelineHost::rowCount() const { return 0; }
bool TimelineHost::isLoaded() const { return m->loaded; }

}  // namespace ts::gui
