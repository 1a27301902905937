// The workbench's main window.
#include "gui/app/main_window.h"

#include <QLabel>

namespace ts::gui {

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
    setWindowTitle(QStringLiteral("trainscope"));
    setCentralWidget(new QLabel(QStringLiteral("trainscope workbench")));
    resize(1400, 900);
}

}  // namespace ts::gui
