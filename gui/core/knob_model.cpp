// KnobModel (knob_model.h).
#include "gui/core/knob_model.h"

#include <QBrush>
#include <QColor>
#include <QFont>

namespace ts::gui {

using nlohmann::json;

namespace {
// Group rows have internalId 0; knob rows carry their group's index + 1.
constexpr quintptr kGroupId = 0;

QString groupTitle(const QString& g) {
    static const std::map<QString, QString> titles = {
        {"model", "Model"}, {"parallel", "Parallel layout"}, {"batch", "Batch and data"},
        {"dp_comm", "Data-parallel communication"}, {"tp_pp_comm", "TP / PP communication"},
        {"fusion", "Kernel fusion"}, {"precision", "Precision"}, {"recompute", "Recompute"},
        {"moe", "Mixture of experts"}, {"misc", "Misc"}, {"run", "Run"}};
    auto it = titles.find(g);
    return it == titles.end() ? g : it->second;
}
}  // namespace

KnobModel::KnobModel(QObject* parent) : QAbstractItemModel(parent) {}

void KnobModel::setRegistry(const json& registry) {
    beginResetModel();
    m_knobs.clear();
    m_groups.clear();
    m_byName.clear();
    m_fileIssues.clear();
    std::map<QString, int> groupIndex;
    if (registry.is_object() && registry.contains("groups") && registry["groups"].is_array())
        for (const auto& g : registry["groups"])
            if (g.is_string() && !groupIndex.count(QString::fromStdString(g.get<std::string>()))) {
                groupIndex[QString::fromStdString(g.get<std::string>())] = int(m_groups.size());
                m_groups.push_back({QString::fromStdString(g.get<std::string>()), {}});
            }
    const json knobs = registry.is_object() && registry.contains("knobs") ? registry["knobs"] : json::array();
    for (const auto& k : knobs) {
        if (!k.is_object() || !k.contains("name") || !k["name"].is_string()) continue;
        auto str = [&](const char* key) {
            return k.contains(key) && k[key].is_string() ? QString::fromStdString(k[key].get<std::string>()) : QString();
        };
        Knob knob;
        knob.name = str("name");
        knob.type = str("type");
        knob.group = str("group");
        knob.flag = str("megatron_flag");
        knob.falseFlag = str("megatron_false_flag");
        knob.bridgePath = str("bridge_path");
        knob.help = str("help");
        knob.rules = str("rules");
        knob.executed = k.value("engine_supported", true);
        if (k.contains("engine_values") && k["engine_values"].is_array())
            for (const auto& v : k["engine_values"])
                if (v.is_string()) knob.executedValues << QString::fromStdString(v.get<std::string>());
        if (k.contains("allowed") && k["allowed"].is_array())
            for (const auto& a : k["allowed"])
                if (a.is_string()) knob.allowed << QString::fromStdString(a.get<std::string>());
        knob.defaultValue = k.contains("default") ? k["default"] : json();
        knob.value = knob.defaultValue;
        if (!groupIndex.count(knob.group)) {
            groupIndex[knob.group] = int(m_groups.size());
            m_groups.push_back({knob.group, {}});
        }
        m_groups[size_t(groupIndex[knob.group])].knobs.push_back(int(m_knobs.size()));
        m_byName[knob.name] = int(m_knobs.size());
        m_knobs.push_back(std::move(knob));
    }
    std::erase_if(m_groups, [](const Group& g) { return g.knobs.empty(); });
    endResetModel();
}

void KnobModel::setValues(const json& config) {
    if (!config.is_object()) return;
    for (auto it = config.begin(); it != config.end(); ++it) {
        auto found = m_byName.find(QString::fromStdString(it.key()));
        if (found != m_byName.end()) m_knobs[size_t(found->second)].value = it.value();
    }
    if (!m_groups.empty()) emit dataChanged(index(0, 0), index(int(m_groups.size()) - 1, ColumnCount - 1));
    for (int g = 0; g < int(m_groups.size()); ++g) {
        const QModelIndex parent = index(g, 0);
        const int n = int(m_groups[size_t(g)].knobs.size());
        if (n) emit dataChanged(index(0, 0, parent), index(n - 1, ColumnCount - 1, parent));
    }
}

bool KnobModel::setValue(const QString& knob, const json& value) {
    auto found = m_byName.find(knob);
    if (found == m_byName.end()) return false;
    Knob& k = m_knobs[size_t(found->second)];
    if (k.value == value) return true;
    k.value = value;
    const QModelIndex first = indexOfKnob(knob, NameColumn);
    emit dataChanged(first, first.siblingAtColumn(ColumnCount - 1));
    emit valuesEdited();
    return true;
}

json KnobModel::value(const QString& knob) const {
    auto found = m_byName.find(knob);
    return found == m_byName.end() ? json() : m_knobs[size_t(found->second)].value;
}

json KnobModel::values() const {
    json out = json::object();
    for (const auto& k : m_knobs) out[k.name.toStdString()] = k.value;
    return out;
}

QString KnobModel::toYaml() const {
    QString out;
    for (const auto& g : m_groups) {
        QString block;
        for (int i : g.knobs) {
            const Knob& k = m_knobs[size_t(i)];
            if (k.value == k.defaultValue) continue;
            // A JSON value is a YAML flow value: strings come out double-quoted and escaped.
            block += k.name + QStringLiteral(": ") + QString::fromStdString(k.value.dump(-1, ' ', false, json::error_handler_t::replace)) + QLatin1Char('\n');
        }
        if (!block.isEmpty()) out += QStringLiteral("# %1\n").arg(groupTitle(g.name)) + block;
    }
    return out;
}

void KnobModel::setIssues(const std::map<QString, QString>& issues) {
    m_fileIssues.clear();
    for (auto& k : m_knobs) k.issue.clear();
    for (const auto& [knob, message] : issues) {
        auto found = m_byName.find(knob);
        if (found == m_byName.end()) m_fileIssues << (knob.isEmpty() ? message : knob + QStringLiteral(": ") + message);
        else m_knobs[size_t(found->second)].issue = message;
    }
    for (int g = 0; g < int(m_groups.size()); ++g) {
        const QModelIndex parent = index(g, 0);
        const int n = int(m_groups[size_t(g)].knobs.size());
        if (n) emit dataChanged(index(0, 0, parent), index(n - 1, ColumnCount - 1, parent));
    }
}

QModelIndex KnobModel::indexOfKnob(const QString& knob, int column) const {
    auto found = m_byName.find(knob);
    if (found == m_byName.end()) return {};
    for (int g = 0; g < int(m_groups.size()); ++g) {
        const auto& ks = m_groups[size_t(g)].knobs;
        for (int r = 0; r < int(ks.size()); ++r)
            if (ks[size_t(r)] == found->second) return createIndex(r, column, quintptr(g + 1));
    }
    return {};
}

QStringList KnobModel::knobNames() const {
    QStringList out;
    for (const auto& k : m_knobs) out << k.name;
    return out;
}

const KnobModel::Knob* KnobModel::knobAt(const QModelIndex& index) const {
    if (!index.isValid() || index.internalId() == kGroupId) return nullptr;
    const auto& g = m_groups[size_t(index.internalId() - 1)];
    return &m_knobs[size_t(g.knobs[size_t(index.row())])];
}

QModelIndex KnobModel::index(int row, int column, const QModelIndex& parent) const {
    if (column < 0 || column >= ColumnCount || row < 0) return {};
    if (!parent.isValid()) return row < int(m_groups.size()) ? createIndex(row, column, kGroupId) : QModelIndex();
    if (parent.internalId() != kGroupId) return {};
    const auto& g = m_groups[size_t(parent.row())];
    return row < int(g.knobs.size()) ? createIndex(row, column, quintptr(parent.row() + 1)) : QModelIndex();
}

QModelIndex KnobModel::parent(const QModelIndex& child) const {
    if (!child.isValid() || child.internalId() == kGroupId) return {};
    return createIndex(int(child.internalId() - 1), 0, kGroupId);
}

int KnobModel::rowCount(const QModelIndex& parent) const {
    if (!parent.isValid()) return int(m_groups.size());
    if (parent.column() != 0 || parent.internalId() != kGroupId) return 0;
    return int(m_groups[size_t(parent.row())].knobs.size());
}

int KnobModel::columnCount(const QModelIndex&) const { return ColumnCount; }

QString KnobModel::valueText(const json& v) {
    if (v.is_string()) return QString::fromStdString(v.get<std::string>());
    if (v.is_boolean()) return v.get<bool>() ? QStringLiteral("true") : QStringLiteral("false");
    if (v.is_array()) {
        QStringList parts;
        for (const auto& e : v) parts << valueText(e);
        return parts.join(QStringLiteral(", "));
    }
    if (v.is_null()) return {};
    return QString::fromStdString(v.dump());
}

bool KnobModel::parseValue(const QString& type, const QString& text, json* out, QString* error) {
    const QString t = text.trimmed();
    bool ok = false;
    if (type == QLatin1String("int")) {
        const qlonglong v = t.toLongLong(&ok);
        if (!ok) { *error = QStringLiteral("'%1' is not a whole number").arg(t); return false; }
        *out = int64_t(v);
    } else if (type == QLatin1String("float")) {
        const double v = t.toDouble(&ok);
        if (!ok) { *error = QStringLiteral("'%1' is not a number").arg(t); return false; }
        *out = v;
    } else if (type == QLatin1String("bool")) {
        const QString l = t.toLower();
        if (l == QLatin1String("true") || l == QLatin1String("1") || l == QLatin1String("yes") || l == QLatin1String("on")) *out = true;
        else if (l == QLatin1String("false") || l == QLatin1String("0") || l == QLatin1String("no") || l == QLatin1String("off")) *out = false;
        else { *error = QStringLiteral("'%1' is not true or false").arg(t); return false; }
    } else if (type == QLatin1String("int_list")) {
        json arr = json::array();
        for (const QString& part : t.split(QLatin1Char(','), Qt::SkipEmptyParts)) {
            const qlonglong v = part.trimmed().toLongLong(&ok);
            if (!ok) { *error = QStringLiteral("'%1' is not a whole number").arg(part.trimmed()); return false; }
            arr.push_back(int64_t(v));
        }
        *out = arr;
    } else if (type == QLatin1String("string_list") || type == QLatin1String("list")) {
        json arr = json::array();
        for (const QString& part : t.split(QLatin1Char(','), Qt::SkipEmptyParts)) arr.push_back(part.trimmed().toStdString());
        *out = arr;
    } else if (type == QLatin1String("enum_or_list") || type == QLatin1String("float_or_list")) {
        // Megatron's Union[T, List[T]]: "aux_loss" or "aux_loss, seq_aux_loss" (one value: the scalar).
        json arr = json::array();
        for (const QString& part : t.split(QLatin1Char(','), Qt::SkipEmptyParts)) {
            const QString p = part.trimmed();
            if (type == QLatin1String("float_or_list")) {
                const double v = p.toDouble(&ok);
                if (!ok) { *error = QStringLiteral("'%1' is not a number").arg(p); return false; }
                arr.push_back(v);
            } else {
                arr.push_back(p.toStdString());
            }
        }
        if (arr.empty()) { *error = QStringLiteral("give a value or a comma-separated list"); return false; }
        *out = arr.size() == 1 ? arr[0] : arr;
    } else {
        *out = t.toStdString();
    }
    return true;
}

QString KnobModel::tooltip(const Knob& k) const {
    QString tip = QStringLiteral("<b>%1</b> (%2)<br>%3").arg(k.name.toHtmlEscaped(), k.type, k.help.toHtmlEscaped());
    tip += QStringLiteral("<br>default: <code>%1</code>").arg(valueText(k.defaultValue).toHtmlEscaped());
    if (!k.allowed.isEmpty()) tip += QStringLiteral("<br>values: %1").arg(k.allowed.join(QStringLiteral(", ")).toHtmlEscaped());
    if (!k.flag.isEmpty() || !k.falseFlag.isEmpty())
        tip += QStringLiteral("<br>Megatron-LM: <code>%1</code>")
                   .arg((k.flag + (k.falseFlag.isEmpty() ? QString() : QStringLiteral(" / ") + k.falseFlag)).toHtmlEscaped());
    else tip += QStringLiteral("<br>Megatron-LM: no flag");
    if (!k.bridgePath.isEmpty()) tip += QStringLiteral("<br>Megatron-Bridge: <code>%1</code>").arg(k.bridgePath.toHtmlEscaped());
    if (!k.rules.isEmpty()) tip += QStringLiteral("<br>%1").arg(k.rules.toHtmlEscaped());
    if (!k.executedValues.isEmpty())
        tip += QStringLiteral("<br>The engine executes: %1").arg(k.executedValues.join(QStringLiteral(", ")).toHtmlEscaped());
    if (!runs(k))
        tip += k.executed ? QStringLiteral("<br><i>This value is accepted and exported, not executed by the engine yet.</i>")
                          : QStringLiteral("<br><i>Accepted and exported, not executed by the engine yet.</i>");
    if (!k.issue.isEmpty()) tip += QStringLiteral("<br><span style='color:#b00020'>%1</span>").arg(k.issue.toHtmlEscaped());
    return tip;
}

bool KnobModel::runs(const Knob& k) {
    if (!k.executed) return false;
    if (k.executedValues.isEmpty() || !k.value.is_string()) return true;
    return k.executedValues.contains(QString::fromStdString(k.value.get<std::string>()));
}

QVariant KnobModel::data(const QModelIndex& index, int role) const {
    if (!index.isValid()) return {};
    if (index.internalId() == kGroupId) {
        const auto& g = m_groups[size_t(index.row())];
        if (index.column() == NameColumn && role == Qt::DisplayRole) return groupTitle(g.name);
        if (role == Qt::FontRole) { QFont f; f.setBold(true); return f; }
        return {};
    }
    const Knob& k = *knobAt(index);
    const bool isDefault = k.value == k.defaultValue;
    switch (role) {
    case Qt::DisplayRole:
        switch (index.column()) {
        case NameColumn: return runs(k) ? k.name : k.name + QStringLiteral(" (not executed)");
        case ValueColumn: return k.type == QLatin1String("bool") ? QVariant() : QVariant(valueText(k.value));
        case DefaultColumn: return valueText(k.defaultValue);
        case FlagColumn: return k.flag.isEmpty() ? k.falseFlag : k.flag;
        }
        return {};
    case Qt::EditRole:
        return index.column() == ValueColumn ? QVariant(valueText(k.value)) : QVariant();
    case Qt::CheckStateRole:
        if (index.column() == ValueColumn && k.type == QLatin1String("bool"))
            return k.value.is_boolean() && k.value.get<bool>() ? Qt::Checked : Qt::Unchecked;
        return {};
    case Qt::ToolTipRole: return tooltip(k);
    case Qt::FontRole:
        if (!isDefault && (index.column() == NameColumn || index.column() == ValueColumn)) { QFont f; f.setBold(true); return f; }
        return {};
    case Qt::ForegroundRole:
        if (!runs(k)) return QBrush(QColor(120, 120, 120));
        return {};
    case Qt::BackgroundRole:
        if (!k.issue.isEmpty()) return QBrush(QColor(255, 225, 225));
        return {};
    case KnobNameRole: return k.name;
    case KnobTypeRole: return k.type;
    case AllowedValuesRole: return k.allowed;
    case IsDefaultRole: return isDefault;
    case ExecutedRole: return runs(k);
    case IssueRole: return k.issue;
    }
    return {};
}

bool KnobModel::setData(const QModelIndex& index, const QVariant& value, int role) {
    const Knob* k = knobAt(index);
    if (!k || index.column() != ValueColumn) return false;
    json parsed;
    if (role == Qt::CheckStateRole && k->type == QLatin1String("bool")) {
        parsed = value.toInt() == Qt::Checked;
    } else if (role == Qt::EditRole) {
        QString error;
        if (!parseValue(k->type, value.toString(), &parsed, &error)) return false;
    } else {
        return false;
    }
    return setValue(k->name, parsed);
}

Qt::ItemFlags KnobModel::flags(const QModelIndex& index) const {
    if (!index.isValid()) return Qt::NoItemFlags;
    Qt::ItemFlags f = Qt::ItemIsEnabled | Qt::ItemIsSelectable;
    const Knob* k = knobAt(index);
    if (k && index.column() == ValueColumn)
        f |= k->type == QLatin1String("bool") ? Qt::ItemIsUserCheckable : Qt::ItemIsEditable;
    return f;
}

QVariant KnobModel::headerData(int section, Qt::Orientation orientation, int role) const {
    if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
    switch (section) {
    case NameColumn: return QStringLiteral("Knob");
    case ValueColumn: return QStringLiteral("Value");
    case DefaultColumn: return QStringLiteral("Default");
    case FlagColumn: return QStringLiteral("Megatron-LM flag");
    }
    return {};
}

}  // namespace ts::gui
