// The runs browser's model: the node's workspace (`list_runs`, RunSummary fields of
// docs/workspace.md) as a table. Sorting and search go through RunsFilterModel, which searches
// name, tags, layout, knobs, status and node.
#pragma once

#include <vector>

#include <QAbstractTableModel>
#include <QSortFilterProxyModel>

#include <nlohmann/json.hpp>

namespace ts::gui {

class RunsModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column { Name = 0, Status, Layout, Knobs, StepTime, TokensPerS, Mfu, PeakMemory, Steps, LastLoss, Created, Node, Tags, ColumnCount };
    enum Role { RunIdRole = Qt::UserRole + 1, RunJsonRole, SortRole, StatusRole };

    explicit RunsModel(QObject* parent = nullptr);
    // Replaces the list (what list_runs returned), keeping rows whose id is unchanged in place
    // so selections survive a refresh.
    void setRuns(const nlohmann::json& runs);
    const nlohmann::json& run(int row) const { return m_runs[size_t(row)]; }
    int rowOfId(const QString& id) const;  // -1 when absent

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

private:
    std::vector<nlohmann::json> m_runs;
};

// Sorts by the raw value (SortRole) and keeps rows whose searchable text contains every
// whitespace-separated term of the filter (case-insensitive), and whose status matches.
class RunsFilterModel : public QSortFilterProxyModel {
    Q_OBJECT
public:
    explicit RunsFilterModel(QObject* parent = nullptr);
    void setSearch(const QString& text);
    void setStatusFilter(const QString& status);  // "" = any
protected:
    bool filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const override;
private:
    QStringList m_terms;
    QString m_status;
};

}  // namespace ts::gui
