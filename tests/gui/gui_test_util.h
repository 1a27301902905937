// Shared by the gui tests: one QApplication for the test program (offscreen unless a display
// is set), and a temporary directory that is removed afterwards.
#pragma once

#include <cstdlib>
#include <string>

#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QTemporaryDir>
#include <QThread>

namespace ts::gui::test {

inline QApplication* ensureApp() {
    if (!QCoreApplication::instance()) {
        if (qgetenv("QT_QPA_PLATFORM").isEmpty() && qgetenv("DISPLAY").isEmpty() && qgetenv("WAYLAND_DISPLAY").isEmpty())
            qputenv("QT_QPA_PLATFORM", "offscreen");
        static int argc = 1;
        static char name[] = "test_gui";
        static char* argv[] = {name, nullptr};
        new QApplication(argc, argv);
        QApplication::setOrganizationName(QStringLiteral("trainscope-tests"));
    }
    return qobject_cast<QApplication*>(QCoreApplication::instance());
}

// Processes events until done() or the timeout.
template <typename F>
bool waitUntil(F done, int timeoutMs) {
    QElapsedTimer t;
    t.start();
    while (!done()) {
        if (t.elapsed() > timeoutMs) return false;
        QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
        QThread::msleep(5);
    }
    return true;
}

}  // namespace ts::gui::test
