// RunsModel and RunsFilterModel (runs_model.h).
#include "gui/core/runs_model.h"

#include <map>

#include <QBrush>
#include <QColor>

#include "gui/core/format.h"

namespace ts::gui {

using nlohmann::json;

namespace {
QString str(const json& j, const char* key) {
    return j.contains(key) && j[key].is_string() ? QString::fromStdString(j[key].get<std::string>()) : QString();
}
double num(const json& j, const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}
QString tagsText(const json& j) {
    QStringList tags;
    if (j.contains("tags") && j["tags"].is_array())
        for (const auto& t : j["tags"])
            if (t.is_string()) tags << QString::fromStdString(t.get<std::string>());
    return tags.join(QStringLiteral(", "));
}
}  // namespace

RunsModel::RunsModel(QObject* parent) : QAbstractTableModel(parent) {}

void RunsModel::setRuns(const json& runs) {
    std::vector<json> next;
    if (runs.is_array())
        for (const auto& r : runs)
            if (r.is_object()) next.push_back(r);
    // Same ids in the same order: update cells in place (selection and scroll stay).
    bool sameIds = next.size() == m_runs.size();
    for (size_t i = 0; sameIds && i < next.size(); ++i) sameIds = str(next[i], "id") == str(m_runs[i], "id");
    if (sameIds) {
        m_runs = std::move(next);
        if (!m_runs.empty()) emit dataChanged(index(0, 0), index(int(m_runs.size()) - 1, ColumnCount - 1));
        return;
    }
    beginResetModel();
    m_runs = std::move(next);
    endResetModel();
}

int RunsModel::rowOfId(const QString& id) const {
    for (size_t i = 0; i < m_runs.size(); ++i)
        if (str(m_runs[i], "id") == id) return int(i);
    return -1;
}

int RunsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : int(m_runs.size()); }
int RunsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : ColumnCount; }

QVariant RunsModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid() || index.row() >= int(m_runs.size())) return {};
    const json& r = m_runs[size_t(index.row())];
    const QString status = str(r, "status");
    if (role == RunIdRole) return str(r, "id");
    if (role == RunJsonRole) return QString::fromStdString(r.dump(-1, ' ', false, json::error_handler_t::replace));
    if (role == StatusRole) return status;
    if (role == SortRole) {
        switch (index.column()) {
        case StepTime: return num(r, "step_time_s");
        case TokensPerS: return num(r, "tokens_per_s");
        case Mfu: return num(r, "mfu");
        case PeakMemory: return num(r, "peak_memory_bytes");
        case Steps: return num(r, "steps");
        case LastLoss: return num(r, "last_loss");
        default: break;
        }
        return data(index, Qt::DisplayRole);
    }
    if (role == Qt::ToolTipRole) {
        QString tip = QStringLiteral("<b>%1</b><br>id %2<br>%3").arg(str(r, "name").toHtmlEscaped(), str(r, "id"), str(r, "path").toHtmlEscaped());
        if (!str(r, "status_reason").isEmpty()) tip += QStringLiteral("<br>%1").arg(str(r, "status_reason").toHtmlEscaped());
        if (index.column() == Knobs && !data(index, Qt::DisplayRole).toString().isEmpty())
            tip += QStringLiteral("<br>knobs away from their defaults: %1").arg(data(index, Qt::DisplayRole).toString().toHtmlEscaped());
        if (index.column() == StepTime) tip += QStringLiteral("<br>Median step time over the steps after the first (warm-up).");
        if (index.column() == Mfu) tip += QStringLiteral("<br>MFU = model TFLOP/s per device / peak TFLOP/s per device.");
        return tip;
    }
    if (role == Qt::ForegroundRole && index.column() == Status) {
        if (status == QLatin1String("failed")) return QBrush(QColor(176, 0, 32));
        if (status == QLatin1String("running")) return QBrush(QColor(0, 110, 200));
        if (status == QLatin1String("cancelled")) return QBrush(QColor(150, 110, 0));
        return {};
    }
    if (role == Qt::TextAlignmentRole && index.column() >= StepTime && index.column() <= LastLoss)
        return int(Qt::AlignRight | Qt::AlignVCenter);
    if (role != Qt::DisplayRole) return {};
    switch (index.column()) {
    case Name: return str(r, "name");
    case Status: return status;
    case Layout: return str(r, "layout");
    case Knobs: return str(r, "key_knobs");
    case StepTime: return num(r, "step_time_s") > 0 ? formatDurationNs(num(r, "step_time_s") * 1e9) : QString();
    case TokensPerS: return num(r, "tokens_per_s") > 0 ? QString::number(num(r, "tokens_per_s"), 'f', 0) : QString();
    case Mfu: return num(r, "mfu") > 0 ? formatPercent(num(r, "mfu")) : QString();
    case PeakMemory: return num(r, "peak_memory_bytes") > 0 ? formatBytes(num(r, "peak_memory_bytes")) : QString();
    case Steps: return QString::number(int64_t(num(r, "steps")));
    case LastLoss: return num(r, "steps") > 0 ? QString::number(num(r, "last_loss"), 'f', 4) : QString();
    case Created: return str(r, "created_at").replace(QLatin1Char('T'), QLatin1Char(' '));
    case Node: return str(r, "node");
    case Tags: return tagsText(r);
    }
    return {};
}

QVariant RunsModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    static const char* const names[] = {"Name", "Status", "Layout", "Knobs", "Step time", "Tokens/s", "MFU",
                                        "Peak memory", "Steps", "Loss", "Created", "Node", "Tags"};
    return section >= 0 && section < ColumnCount ? QString::fromLatin1(names[section]) : QVariant();
}

RunsFilterModel::RunsFilterModel(QObject* parent) : QSortFilterProxyModel(parent) {
    setSortRole(RunsModel::SortRole);
    setDynamicSortFilter(true);
}

void RunsFilterModel::setSearch(const QString& text) {
    m_terms = text.split(QLatin1Char(' '), Qt::SkipEmptyParts);
    invalidateFilter();
}

void RunsFilterModel::setStatusFilter(const QString& status) {
    m_status = status;
    invalidateFilter();
}

bool RunsFilterModel::filterAcceptsRow(int sourceRow, const QModelIndex& sourceParent) const {
    const QAbstractItemModel* m = sourceModel();
    if (!m_status.isEmpty() && m->index(sourceRow, RunsModel::Status, sourceParent).data(RunsModel::StatusRole).toString() != m_status)
        return false;
    if (m_terms.isEmpty()) return true;
    QString hay;
    for (int c : {RunsModel::Name, RunsModel::Status, RunsModel::Layout, RunsModel::Knobs, RunsModel::Node, RunsModel::Tags})
        hay += m->index(sourceRow, c, sourceParent).data().toString() + QLatin1Char(' ');
    hay += m->index(sourceRow, 0, sourceParent).data(RunsModel::RunIdRole).toString();
    for (const QString& t : m_terms)
        if (!hay.contains(t, Qt::CaseInsensitive)) return false;
    return true;
}

}  // namespace ts::gui
