// trainscope-gui: the workbench (README, docs/gui.md).
//   trainscope-gui [--node URL] [--token-file FILE] [--config FILE] [--run RUN_FILE]
//   trainscope-gui --tour DIR      drive the whole story on the local node, one PNG per view
//   trainscope-gui --run RUN_FILE --screenshot PNG   open a run, save the window as PNG, exit
//   trainscope-gui --run RUN_FILE --tab "MoE routing"  open a run on one of its panel tabs
#include <cstdio>

#include <QApplication>
#include <QCommandLineParser>
#include <QDir>
#include <QSettings>
#include <QTimer>

#include "gui/app/config_editor.h"
#include "gui/app/main_window.h"
#include "gui/app/node_bar.h"
#include "gui/app/panels.h"
#include "gui/app/tour.h"

int main(int argc, char** argv) {
    QApplication app(argc, argv);
    QApplication::setOrganizationName(QStringLiteral("trainscope"));
    QApplication::setApplicationName(QStringLiteral("trainscope"));
    QApplication::setApplicationVersion(QStringLiteral(TS_VERSION));
    QCommandLineParser parser;
    parser.setApplicationDescription(QStringLiteral(
        "The trainscope workbench: run a few training steps on a node with a parallel layout, see where the step "
        "time goes, flip a knob, rerun, compare A/B, export."));
    parser.addHelpOption();
    parser.addVersionOption();
    QCommandLineOption node(QStringLiteral("node"), QStringLiteral("Node to open: local, ssh://[user@]host or tcp://host:port (default local)."),
                            QStringLiteral("URL"), QStringLiteral("local"));
    QCommandLineOption token(QStringLiteral("token-file"), QStringLiteral("Token file for a tcp:// node (its path is remembered, never the token)."),
                             QStringLiteral("FILE"));
    QCommandLineOption config(QStringLiteral("config"), QStringLiteral("Open this YAML config in the editor."), QStringLiteral("FILE"));
    QCommandLineOption run(QStringLiteral("run"), QStringLiteral("Open this run file (timeline and panels)."), QStringLiteral("RUN_FILE"));
    QCommandLineOption tour(QStringLiteral("tour"),
                            QStringLiteral("Drive the workbench through the whole story on the local node (in a fresh workspace DIR/workspace) "
                                           "and write one PNG per view and tour.json into DIR, then exit (0 when every step worked)."),
                            QStringLiteral("DIR"));
    QCommandLineOption shot(QStringLiteral("screenshot"),
                            QStringLiteral("With --run or --config: once it is shown (after --screenshot-delay ms), save the window "
                                           "as this PNG and exit (0 when saved)."),
                            QStringLiteral("PNG"));
    QCommandLineOption shotDelay(QStringLiteral("screenshot-delay"), QStringLiteral("Milliseconds before --screenshot (default 3000)."),
                                 QStringLiteral("MS"), QStringLiteral("3000"));
    QCommandLineOption tab(QStringLiteral("tab"),
                           QStringLiteral("With --run: show this panel tab once the run is analysed (Breakdown, Bubbles, Communication, "
                                          "Memory, Kernels, MFU, \"MoE routing\", FP8)."),
                           QStringLiteral("NAME"));
    parser.addOptions({node, token, config, run, tour, shot, shotDelay, tab});
    parser.process(app);

    if (parser.isSet(tour)) {
        // The tour touches neither the user's workspace nor their settings.
        const QString dir = QDir(parser.value(tour)).absolutePath();
        QDir().mkpath(dir + QStringLiteral("/workspace"));
        qputenv("TRAINSCOPE_WORKSPACE", (dir + QStringLiteral("/workspace")).toLocal8Bit());
        QSettings::setDefaultFormat(QSettings::IniFormat);
        QSettings::setPath(QSettings::IniFormat, QSettings::UserScope, dir + QStringLiteral("/settings"));
        ts::gui::MainWindow window;
        window.resize(1600, 980);
        window.show();
        ts::gui::TourOptions options;
        options.outDir = dir;
        const ts::gui::TourResult r = ts::gui::runTour(window, options);
        for (const QString& f : r.screenshots) std::printf("%s\n", qPrintable(f));
        if (!r.ok) {
            std::fprintf(stderr, "trainscope-gui --tour: %s\n", qPrintable(r.error));
            return 1;
        }
        std::printf("tour: %lld screenshots in %s\n", (long long)r.screenshots.size(), qPrintable(dir));
        return 0;
    }

    ts::gui::MainWindow window;
    if (parser.isSet(shot)) window.resize(1600, 980);
    window.show();
    window.nodeBar()->openNode(parser.value(node), parser.value(token));
    if (parser.isSet(config)) window.openConfigFile(parser.value(config));
    if (parser.isSet(run) && parser.isSet(tab)) {
        // The MoE and FP8 tabs appear only once the analysis says the run has them.
        const QString name = parser.value(tab);
        QObject::connect(window.panels(), &ts::gui::AnalysisPanels::analysisReady, &window, [&window, name] { window.showTab(name); });
    }
    if (parser.isSet(run)) window.openRunFile(parser.value(run));
    if (parser.isSet(shot)) {
        const QString file = parser.value(shot);
        QTimer::singleShot(parser.value(shotDelay).toInt(), &window, [&window, file] {
            const bool saved = window.grab().save(file);
            if (!saved) std::fprintf(stderr, "trainscope-gui: cannot write %s\n", qPrintable(file));
            QApplication::exit(saved ? 0 : 1);
        });
    }
    return QApplication::exec();
}
