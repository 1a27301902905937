// The runs browser: the node's workspace (`list_runs`) as a sortable, searchable table; open a
// run (timeline and panels), load its config into the editor, compare two runs, rename, tag,
// delete (`update_run`, `delete_run`), and drop nsys .sqlite or Kineto .json(.gz) files on it
// to import them into the local workspace.
#pragma once

#include <QComboBox>
#include <QLabel>
#include <QLineEdit>
#include <QTableView>
#include <QWidget>

#include "gui/core/jobs.h"
#include "gui/core/node_session.h"
#include "gui/core/runs_model.h"

namespace ts::gui {

class RunsBrowser : public QWidget {
    Q_OBJECT
public:
    RunsBrowser(NodeSession* session, QWidget* parent = nullptr);
    RunsModel* model() { return &m_model; }
    RunsFilterModel* filterModel() { return &m_filter; }
    QTableView* view() { return m_view; }
    void refresh();
    // Selected runs (JSON summaries), in view order.
    std::vector<nlohmann::json> selectedRuns() const;
    void selectRun(const QString& id);
    // Imports trace files into the local workspace (the GUI's; the local node's too).
    void importFiles(const QStringList& paths);

signals:
    void openRequested(const nlohmann::json& run);
    void configRequested(const nlohmann::json& run);
    void compareRequested(const nlohmann::json& a, const nlohmann::json& b);
    void exportRequested(const nlohmann::json& run);
    void refreshed(int count);
    void imported(const QString& runFile);
    void message(const QString& text, bool error);

protected:
    void dragEnterEvent(QDragEnterEvent* event) override;
    void dropEvent(QDropEvent* event) override;

private:
    void contextMenu(const QPoint& pos);
    void renameSelected();
    void tagSelected();
    void deleteSelected();

    NodeSession* m_session;
    RunsModel m_model;
    RunsFilterModel m_filter;
    QLineEdit* m_search;
    QComboBox* m_status;
    QTableView* m_view;
    QLabel* m_info;
    JobGeneration m_importJob;
};

}  // namespace ts::gui
