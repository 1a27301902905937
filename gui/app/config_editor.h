// The config editor: generated from the connected node's knob registry (KnobModel), grouped as
// the registry groups them, each knob with its help, type, default and Megatron-LM flag; knobs
// the engine does not execute are marked. Every edit is validated by the node (`validate`, the
// same messages the CLI prints) shortly after the user stops typing, and the layout preview
// redraws. Open a YAML file, an example, or a run's config; save as YAML; Run.
#pragma once

#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSortFilterProxyModel>
#include <QSpinBox>
#include <QTimer>
#include <QTreeView>
#include <QWidget>

#include "gui/core/knob_model.h"
#include "gui/core/node_session.h"

namespace ts::gui {

class LayoutPreview;

class ConfigEditor : public QWidget {
    Q_OBJECT
public:
    ConfigEditor(NodeSession* session, QWidget* parent = nullptr);

    KnobModel* model() { return &m_model; }
    // Loads YAML text (a file, an example, a run's config); `source` names it in messages.
    void loadYaml(const QString& yaml, const QString& source);
    bool openFile(const QString& path);
    // Loads a resolved config ({knob: value}) of a run.
    void loadConfigJson(const nlohmann::json& config, const QString& source);
    QString yaml() const { return m_model.toYaml(); }
    bool saveTo(const QString& path, QString* error);
    bool isValid() const { return m_valid; }
    QString issuesText() const { return m_issues->text(); }
    QString runName() const { return m_name->text(); }
    void setRunName(const QString& name) { m_name->setText(name); }
    int steps() const { return m_steps->value(); }
    void setSteps(int steps) { m_steps->setValue(steps); }
    QString source() const { return m_source; }
    // The examples shipped with trainscope (resources/examples/*.yaml).
    static QStringList examplePaths();

signals:
    void runRequested(const QString& yaml, const QString& name, int steps);
    // The node answered a validation: valid or not (issues shown inline).
    void validated(bool ok);
    void sourceChanged(const QString& source);

private:
    void scheduleValidation();
    void validateNow();
    void applyValidation(const Result<nlohmann::json>& r);
    void onRegistry();
    void updatePreview();

    NodeSession* m_session;
    KnobModel m_model;
    QSortFilterProxyModel m_filter;
    QTreeView* m_tree;
    QLineEdit* m_search;
    QLabel* m_sourceLabel;
    QLabel* m_issues;
    LayoutPreview* m_preview;
    QLineEdit* m_name;
    QSpinBox* m_steps;
    QPushButton* m_run;
    QTimer m_debounce;
    uint64_t m_validation = 0;
    bool m_valid = false;
    QString m_source;
    QString m_pendingYaml;  // loaded before the registry arrived
};

}  // namespace ts::gui
