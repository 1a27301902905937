// RunsBrowser (runs_browser.h).
#include "gui/app/runs_browser.h"

#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QInputDialog>
#include <QMenu>
#include <QMessageBox>
#include <QMimeData>
#include <QPushButton>
#include <QVBoxLayout>

#include "sessions/workspace.h"

namespace ts::gui {

using nlohmann::json;

RunsBrowser::RunsBrowser(NodeSession* session, QWidget* parent) : QWidget(parent), m_session(session) {
    setAcceptDrops(true);
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);
    auto* top = new QHBoxLayout;
    m_search = new QLineEdit(this);
    m_search->setPlaceholderText(QStringLiteral("Search name, tag, layout, knob, node…"));
    m_search->setClearButtonEnabled(true);
    m_status = new QComboBox(this);
    m_status->addItem(QStringLiteral("any status"), QString());
    for (const char* s : {"completed", "running", "failed", "cancelled"}) m_status->addItem(QString::fromLatin1(s), QString::fromLatin1(s));
    auto* refreshButton = new QPushButton(QStringLiteral("Refresh"), this);
    top->addWidget(m_search, 1);
    top->addWidget(m_status);
    top->addWidget(refreshButton);
    layout->addLayout(top);

    m_filter.setSourceModel(&m_model);
    m_view = new QTableView(this);
    m_view->setObjectName(QStringLiteral("runsView"));
    m_view->setModel(&m_filter);
    m_view->setSortingEnabled(true);
    m_view->sortByColumn(RunsModel::Created, Qt::DescendingOrder);
    m_view->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_view->setSelectionMode(QAbstractItemView::ExtendedSelection);
    m_view->setContextMenuPolicy(Qt::CustomContextMenu);
    m_view->verticalHeader()->hide();
    m_view->horizontalHeader()->setStretchLastSection(true);
    m_view->setAlternatingRowColors(true);
    layout->addWidget(m_view, 1);

    auto* buttons = new QHBoxLayout;
    auto* open = new QPushButton(QStringLiteral("Open"), this);
    auto* config = new QPushButton(QStringLiteral("Edit config"), this);
    auto* compare = new QPushButton(QStringLiteral("Compare 2"), this);
    auto* exportBtn = new QPushButton(QStringLiteral("Export…"), this);
    auto* import = new QPushButton(QStringLiteral("Import traces…"), this);
    for (auto* b : {open, config, compare, exportBtn, import}) buttons->addWidget(b);
    buttons->addStretch(1);
    layout->addLayout(buttons);
    m_info = new QLabel(QStringLiteral("Drop nsys .sqlite or PyTorch/Kineto .json(.gz) traces here to import them."), this);
    m_info->setWordWrap(true);
    layout->addWidget(m_info);

    connect(m_search, &QLineEdit::textChanged, &m_filter, &RunsFilterModel::setSearch);
    connect(m_status, &QComboBox::activated, this, [this](int) { m_filter.setStatusFilter(m_status->currentData().toString()); });
    connect(refreshButton, &QPushButton::clicked, this, &RunsBrowser::refresh);
    connect(m_view, &QTableView::doubleClicked, this, [this](const QModelIndex&) {
        auto runs = selectedRuns();
        if (!runs.empty()) emit openRequested(runs.front());
    });
    connect(open, &QPushButton::clicked, this, [this] {
        auto runs = selectedRuns();
        if (!runs.empty()) emit openRequested(runs.front());
    });
    connect(config, &QPushButton::clicked, this, [this] {
        auto runs = selectedRuns();
        if (!runs.empty()) emit configRequested(runs.front());
    });
    connect(exportBtn, &QPushButton::clicked, this, [this] {
        auto runs = selectedRuns();
        if (!runs.empty()) emit exportRequested(runs.front());
    });
    connect(compare, &QPushButton::clicked, this, [this] {
        auto runs = selectedRuns();
        if (runs.size() != 2) {
            emit message(QStringLiteral("select exactly two runs to compare (Ctrl+click)"), true);
            return;
        }
        emit compareRequested(runs[0], runs[1]);
    });
    connect(import, &QPushButton::clicked, this, [this] {
        const QStringList files = QFileDialog::getOpenFileNames(this, QStringLiteral("Import traces"), QString(),
                                                                QStringLiteral("Traces (*.sqlite *.json *.json.gz *.gz);;All files (*)"));
        if (!files.isEmpty()) importFiles(files);
    });
    connect(m_view, &QTableView::customContextMenuRequested, this, &RunsBrowser::contextMenu);
    connect(session, &NodeSession::connected, this, &RunsBrowser::refresh);
    connect(session, &NodeSession::notification, this, [this](const QString& method, const json&) {
        if (method == QLatin1String("run_finished") || method == QLatin1String("run_started")) refresh();
    });
}

void RunsBrowser::refresh() {
    if (!m_session->isConnected()) return;
    m_session->request(QStringLiteral("list_runs"), json::object(), this, [this](const Result<json>& r) {
        if (!r) {
            emit message(QStringLiteral("listing runs failed: ") + QString::fromStdString(r.status().message()), true);
            return;
        }
        const std::vector<json> before = selectedRuns();
        m_model.setRuns(r->value("runs", json::array()));
        if (!before.empty()) selectRun(QString::fromStdString(before.front().value("id", std::string())));
        emit refreshed(m_model.rowCount());
    });
}

std::vector<json> RunsBrowser::selectedRuns() const {
    std::vector<json> out;
    for (const QModelIndex& i : m_view->selectionModel()->selectedRows()) {
        const QModelIndex src = m_filter.mapToSource(i);
        if (src.isValid()) out.push_back(m_model.run(src.row()));
    }
    return out;
}

void RunsBrowser::selectRun(const QString& id) {
    const int row = m_model.rowOfId(id);
    if (row < 0) return;
    const QModelIndex idx = m_filter.mapFromSource(m_model.index(row, 0));
    if (!idx.isValid()) return;
    m_view->selectionModel()->select(idx, QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    m_view->scrollTo(idx);
}

void RunsBrowser::contextMenu(const QPoint& pos) {
    if (selectedRuns().empty()) return;
    QMenu menu(this);
    menu.addAction(QStringLiteral("Open"), this, [this] { emit openRequested(selectedRuns().front()); });
    menu.addAction(QStringLiteral("Edit config"), this, [this] { emit configRequested(selectedRuns().front()); });
    menu.addAction(QStringLiteral("Export…"), this, [this] { emit exportRequested(selectedRuns().front()); });
    menu.addSeparator();
    menu.addAction(QStringLiteral("Rename…"), this, &RunsBrowser::renameSelected);
    menu.addAction(QStringLiteral("Add tag…"), this, &RunsBrowser::tagSelected);
    menu.addAction(QStringLiteral("Delete"), this, &RunsBrowser::deleteSelected);
    menu.exec(m_view->viewport()->mapToGlobal(pos));
}

void RunsBrowser::renameSelected() {
    auto runs = selectedRuns();
    if (runs.empty()) return;
    bool ok = false;
    const QString name = QInputDialog::getText(this, QStringLiteral("Rename run"), QStringLiteral("Name"), QLineEdit::Normal,
                                               QString::fromStdString(runs.front().value("name", std::string())), &ok);
    if (!ok || name.trimmed().isEmpty()) return;
    m_session->request(QStringLiteral("update_run"), {{"run_id", runs.front().value("id", std::string())}, {"name", name.trimmed().toStdString()}},
                       this, [this](const Result<json>& r) {
                           if (!r) emit message(QString::fromStdString(r.status().message()), true);
                           refresh();
                       });
}

void RunsBrowser::tagSelected() {
    auto runs = selectedRuns();
    if (runs.empty()) return;
    bool ok = false;
    const QString tag = QInputDialog::getText(this, QStringLiteral("Tag runs"), QStringLiteral("Tag"), QLineEdit::Normal, QString(), &ok);
    if (!ok || tag.trimmed().isEmpty()) return;
    for (const auto& run : runs)
        m_session->request(QStringLiteral("update_run"), {{"run_id", run.value("id", std::string())}, {"add_tags", {tag.trimmed().toStdString()}}},
                           this, [this](const Result<json>& r) {
                               if (!r) emit message(QString::fromStdString(r.status().message()), true);
                               refresh();
                           });
}

void RunsBrowser::deleteSelected() {
    auto runs = selectedRuns();
    if (runs.empty()) return;
    if (QMessageBox::question(this, QStringLiteral("Delete runs"),
                              QStringLiteral("Delete %1 run(s) and their run files on %2?").arg(runs.size()).arg(m_session->url())) != QMessageBox::Yes)
        return;
    for (const auto& run : runs)
        m_session->request(QStringLiteral("delete_run"), {{"run_id", run.value("id", std::string())}}, this, [this](const Result<json>& r) {
            if (!r) emit message(QString::fromStdString(r.status().message()), true);
            refresh();
        });
}

void RunsBrowser::importFiles(const QStringList& paths) {
    std::vector<std::string> files;
    for (const QString& p : paths) files.push_back(p.toStdString());
    m_info->setText(QStringLiteral("importing %1 file(s)…").arg(paths.size()));
    runJob<Result<std::string>>(this, m_importJob, [files] { return importTraceFiles(files, ""); }, [this](Result<std::string> r) {
        if (!r) {
            m_info->setText(QStringLiteral("<span style='color:#b00020'>import failed: %1</span>").arg(QString::fromStdString(r.status().message()).toHtmlEscaped()));
            emit message(QStringLiteral("import failed: ") + QString::fromStdString(r.status().message()), true);
            return;
        }
        m_info->setText(QStringLiteral("imported into %1").arg(QString::fromStdString(*r)));
        refresh();
        emit imported(QString::fromStdString(*r));
    });
}

void RunsBrowser::dragEnterEvent(QDragEnterEvent* event) {
    if (event->mimeData()->hasUrls()) event->acceptProposedAction();
}

void RunsBrowser::dropEvent(QDropEvent* event) {
    QStringList paths;
    for (const QUrl& u : event->mimeData()->urls())
        if (u.isLocalFile()) paths << u.toLocalFile();
    if (!paths.isEmpty()) importFiles(paths);
    event->acceptProposedAction();
}

}  // namespace ts::gui
