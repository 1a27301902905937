// trainscope-gui: the workbench window (README, docs/gui.md).
#include <QApplication>

#include "gui/app/main_window.h"

int main(int argc, char** argv) {
    QApplication app(argc, argv);
    QApplication::setApplicationName(QStringLiteral("trainscope"));
    ts::gui::MainWindow window;
    window.show();
    return QApplication::exec();
}
