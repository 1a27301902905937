// The config editor's model: the node's knob registry (sessions/knobs_json.h) as a tree of
// groups and knobs, with the values of the config being edited. Generated from what the node
// reports, so a remote node's knobs are the ones edited. Columns: knob, value, default,
// Megatron-LM flag. Validation issues from the node's `validate` are attached per knob.
#pragma once

#include <map>
#include <vector>

#include <QAbstractItemModel>
#include <QStringList>

#include <nlohmann/json.hpp>

namespace ts::gui {

class KnobModel : public QAbstractItemModel {
    Q_OBJECT
public:
    enum Column { NameColumn = 0, ValueColumn, DefaultColumn, FlagColumn, ColumnCount };
    enum Role {
        KnobNameRole = Qt::UserRole + 1,  // QString; empty on group rows
        KnobTypeRole,                     // "int", "float", "bool", "string", "enum", "list", "int_list", "enum_or_list", "float_or_list"
        AllowedValuesRole,                // QStringList (enum knobs)
        IsDefaultRole,                    // bool
        ExecutedRole,                     // bool: false = accepted and exported, not executed yet (the knob or its value)
        IssueRole,                        // QString: the node's message for this knob, "" when fine
    };

    explicit KnobModel(QObject* parent = nullptr);

    // The registry as the node's `knobs` method returns it. Values reset to the defaults.
    void setRegistry(const nlohmann::json& registry);
    bool hasRegistry() const { return !m_knobs.empty(); }
    // Values of a resolved config ({knob: value}); knobs it does not name keep their value.
    void setValues(const nlohmann::json& config);
    // Sets one knob (JSON of its type). False (nothing changes) for an unknown knob.
    bool setValue(const QString& knob, const nlohmann::json& value);
    nlohmann::json value(const QString& knob) const;
    nlohmann::json values() const;  // every knob
    // Knobs that differ from the registry default, as YAML (`knob: value` per line, grouped with
    // a comment per group): what Save writes and what is sent to the node.
    QString toYaml() const;
    // Knob -> message; a message for "" (file-level) goes to fileIssues().
    void setIssues(const std::map<QString, QString>& issues);
    QStringList fileIssues() const { return m_fileIssues; }
    // Index of the knob's value cell (invalid when unknown).
    QModelIndex indexOfKnob(const QString& knob, int column = ValueColumn) const;
    QStringList knobNames() const;

    // QAbstractItemModel
    QModelIndex index(int row, int column, const QModelIndex& parent = {}) const override;
    QModelIndex parent(const QModelIndex& child) const override;
    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;
    Qt::ItemFlags flags(const QModelIndex& index) const override;
    QVariant headerData(int section, Qt::Orientation orientation, int role = Qt::DisplayRole) const override;

    // Text of a JSON knob value as the editor shows it ("true", "2", "selective", "a, b").
    static QString valueText(const nlohmann::json& v);
    // Parses editor text into the knob's JSON type; false with *error set when it does not fit.
    static bool parseValue(const QString& type, const QString& text, nlohmann::json* out, QString* error);

signals:
    // The user (or setValue) changed a knob: the editor re-validates.
    void valuesEdited();

private:
    struct Knob {
        QString name, type, group, flag, falseFlag, bridgePath, help, rules;
        QStringList allowed;
        nlohmann::json defaultValue, value;
        bool executed = true;
        QStringList executedValues;  // an enum knob the engine executes some values of: those
        QString issue;
    };
    // Whether the engine executes the knob at its current value.
    static bool runs(const Knob& k);
    struct Group {
        QString name;
        std::vector<int> knobs;
    };
    const Knob* knobAt(const QModelIndex& index) const;
    QString tooltip(const Knob& k) const;

    std::vector<Knob> m_knobs;
    std::vector<Group> m_groups;
    std::map<QString, int> m_byName;
    QStringList m_fileIssues;
};

}  // namespace ts::gui
