// ConfigEditor (config_editor.h).
#include "gui/app/config_editor.h"

#include <QComboBox>
#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QMenu>
#include <QMessageBox>
#include <QSettings>
#include <QStyledItemDelegate>
#include <QToolButton>
#include <QVBoxLayout>

#include "gui/app/layout_preview.h"
#include "gui/core/layout_grid.h"

namespace ts::gui {

using nlohmann::json;

namespace {

// Enum knobs get a combo box of their allowed values; the rest (lists too) a line edit.
class KnobDelegate : public QStyledItemDelegate {
public:
    using QStyledItemDelegate::QStyledItemDelegate;
    QWidget* createEditor(QWidget* parent, const QStyleOptionViewItem& option, const QModelIndex& index) const override {
        const QStringList allowed = index.data(KnobModel::AllowedValuesRole).toStringList();
        // A value or a list (enum_or_list): a line edit that takes "a, b".
        if (allowed.isEmpty() || index.data(KnobModel::KnobTypeRole).toString() == QLatin1String("enum_or_list"))
            return QStyledItemDelegate::createEditor(parent, option, index);
        auto* combo = new QComboBox(parent);
        for (const QString& a : allowed) combo->addItem(a.isEmpty() ? QStringLiteral("(off)") : a, a);
        return combo;
    }
    void setEditorData(QWidget* editor, const QModelIndex& index) const override {
        if (auto* combo = qobject_cast<QComboBox*>(editor)) {
            combo->setCurrentIndex(std::max(0, combo->findData(index.data(Qt::EditRole).toString())));
            return;
        }
        QStyledItemDelegate::setEditorData(editor, index);
    }
    void setModelData(QWidget* editor, QAbstractItemModel* model, const QModelIndex& index) const override {
        if (auto* combo = qobject_cast<QComboBox*>(editor)) {
            model->setData(index, combo->currentData().toString(), Qt::EditRole);
            return;
        }
        QStyledItemDelegate::setModelData(editor, model, index);
    }
};

QString sourceDirExamples() { return QStringLiteral(TS_SOURCE_DIR "/resources/examples"); }

}  // namespace

QStringList ConfigEditor::examplePaths() {
    QStringList dirs = {QCoreApplication::applicationDirPath() + QStringLiteral("/../share/trainscope/examples"),
                        sourceDirExamples()};
    for (const QString& d : dirs) {
        QDir dir(d);
        const QStringList files = dir.entryList({QStringLiteral("*.yaml")}, QDir::Files, QDir::Name);
        if (files.isEmpty()) continue;
        QStringList out;
        for (const QString& f : files) out << dir.absoluteFilePath(f);
        return out;
    }
    return {};
}

ConfigEditor::ConfigEditor(NodeSession* session, QWidget* parent) : QWidget(parent), m_session(session) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(4, 4, 4, 4);

    auto* tools = new QHBoxLayout;
    auto* open = new QPushButton(QStringLiteral("Open…"), this);
    auto* examples = new QToolButton(this);
    examples->setText(QStringLiteral("Examples"));
    examples->setPopupMode(QToolButton::InstantPopup);
    auto* menu = new QMenu(examples);
    for (const QString& path : examplePaths())
        menu->addAction(QFileInfo(path).fileName(), this, [this, path] { openFile(path); });
    examples->setMenu(menu);
    auto* save = new QPushButton(QStringLiteral("Save as…"), this);
    tools->addWidget(open);
    tools->addWidget(examples);
    tools->addWidget(save);
    tools->addStretch(1);
    layout->addLayout(tools);

    m_sourceLabel = new QLabel(QStringLiteral("defaults"), this);
    m_sourceLabel->setObjectName(QStringLiteral("configSource"));
    m_sourceLabel->setWordWrap(true);  // a long run name wraps instead of widening the panel
    m_sourceLabel->setSizePolicy(QSizePolicy::Ignored, QSizePolicy::Preferred);
    layout->addWidget(m_sourceLabel);

    m_search = new QLineEdit(this);
    m_search->setPlaceholderText(QStringLiteral("Filter knobs (name or flag)…"));
    m_search->setClearButtonEnabled(true);
    layout->addWidget(m_search);

    m_filter.setSourceModel(&m_model);
    m_filter.setRecursiveFilteringEnabled(true);
    m_filter.setFilterCaseSensitivity(Qt::CaseInsensitive);
    m_filter.setFilterKeyColumn(-1);
    m_tree = new QTreeView(this);
    m_tree->setObjectName(QStringLiteral("knobTree"));
    m_tree->setModel(&m_filter);
    m_tree->setItemDelegate(new KnobDelegate(m_tree));
    m_tree->setAlternatingRowColors(true);
    m_tree->setEditTriggers(QAbstractItemView::AllEditTriggers);
    // Names may be long ("num_layers_per_virtual_pipeline_stage (not executed)"): the name
    // column has a fixed share the user can drag, so the value column always shows its value;
    // the full name is the row's tooltip.
    m_tree->header()->setSectionResizeMode(KnobModel::NameColumn, QHeaderView::Interactive);
    m_tree->header()->resizeSection(KnobModel::NameColumn, 255);
    m_tree->header()->resizeSection(KnobModel::ValueColumn, 120);
    m_tree->setUniformRowHeights(true);
    layout->addWidget(m_tree, 1);
    connect(m_search, &QLineEdit::textChanged, this, [this](const QString& t) {
        m_filter.setFilterFixedString(t);
        if (!t.isEmpty()) m_tree->expandAll();
    });

    m_issues = new QLabel(this);
    m_issues->setObjectName(QStringLiteral("configIssues"));
    m_issues->setWordWrap(true);
    m_issues->setTextInteractionFlags(Qt::TextSelectableByMouse);
    layout->addWidget(m_issues);

    m_preview = new LayoutPreview(this);
    layout->addWidget(m_preview);

    auto* form = new QFormLayout;
    m_name = new QLineEdit(this);
    m_name->setPlaceholderText(QStringLiteral("run name (optional)"));
    m_steps = new QSpinBox(this);
    m_steps->setRange(0, 1000000);
    m_steps->setSpecialValueText(QStringLiteral("config's train_iters"));
    m_run = new QPushButton(QStringLiteral("Run on node"), this);
    m_run->setObjectName(QStringLiteral("runButton"));
    m_run->setDefault(true);
    form->addRow(QStringLiteral("Name"), m_name);
    form->addRow(QStringLiteral("Steps"), m_steps);
    form->addRow(m_run);
    layout->addLayout(form);

    m_debounce.setSingleShot(true);
    m_debounce.setInterval(250);
    connect(&m_debounce, &QTimer::timeout, this, &ConfigEditor::validateNow);
    connect(&m_model, &KnobModel::valuesEdited, this, &ConfigEditor::scheduleValidation);
    connect(&m_model, &KnobModel::valuesEdited, this, &ConfigEditor::updatePreview);
    connect(session, &NodeSession::connected, this, &ConfigEditor::onRegistry);
    connect(open, &QPushButton::clicked, this, [this] {
        QSettings settings;
        const QString f = QFileDialog::getOpenFileName(this, QStringLiteral("Open config"),
                                                       settings.value(QStringLiteral("config/lastDir")).toString(),
                                                       QStringLiteral("YAML (*.yaml *.yml);;All files (*)"));
        if (!f.isEmpty()) openFile(f);
    });
    connect(save, &QPushButton::clicked, this, [this] {
        const QString f = QFileDialog::getSaveFileName(this, QStringLiteral("Save config"), QString(), QStringLiteral("YAML (*.yaml)"));
        if (f.isEmpty()) return;
        QString error;
        if (!saveTo(f, &error)) QMessageBox::warning(this, QStringLiteral("Save config"), error);
    });
    connect(m_run, &QPushButton::clicked, this, [this] { emit runRequested(yaml(), runName(), steps()); });
    m_run->setEnabled(false);
    onRegistry();
}

void ConfigEditor::onRegistry() {
    if (!m_session->isConnected()) return;
    m_model.setRegistry(m_session->info().knobs);
    m_tree->expandAll();
    // Fit the names, but never past 255 px: the value column must show its value.
    m_tree->resizeColumnToContents(KnobModel::NameColumn);
    if (m_tree->header()->sectionSize(KnobModel::NameColumn) > 255) m_tree->header()->resizeSection(KnobModel::NameColumn, 255);
    if (!m_pendingYaml.isNull()) {
        const QString y = m_pendingYaml;
        m_pendingYaml = QString();
        loadYaml(y, m_source);
    } else {
        validateNow();
    }
    updatePreview();
}

void ConfigEditor::loadYaml(const QString& yaml, const QString& source) {
    // Not valid (and not runnable) until the node has answered for the new text.
    m_valid = false;
    m_run->setEnabled(false);
    m_source = source;
    m_sourceLabel->setText(QStringLiteral("<b>%1</b>").arg(source.toHtmlEscaped()));
    emit sourceChanged(source);
    if (!m_model.hasRegistry()) {
        m_pendingYaml = yaml;
        return;
    }
    // The node resolves the file (its defaults, its rules); the editor shows what it resolved.
    const uint64_t ticket = ++m_validation;
    m_session->request(QStringLiteral("validate"), {{"yaml", yaml.toStdString()}}, this, [this, ticket](const Result<json>& r) {
        if (ticket != m_validation) return;
        if (!r) {
            m_issues->setText(QStringLiteral("<span style='color:#b00020'>%1</span>").arg(QString::fromStdString(r.status().message()).toHtmlEscaped()));
            return;
        }
        m_model.setRegistry(m_session->info().knobs);
        m_tree->expandAll();
        if (r->contains("config")) m_model.setValues((*r)["config"]);
        updatePreview();
        // The file's own problems (unknown keys, bad values) are shown until the next edit.
        applyValidation(r);
    });
}

bool ConfigEditor::openFile(const QString& path) {
    QFile f(path);
    QFileInfo fi(path);
    if (!fi.isFile() || !f.open(QIODevice::ReadOnly)) {
        m_issues->setText(QStringLiteral("<span style='color:#b00020'>cannot read %1: %2</span>")
                              .arg(path.toHtmlEscaped(), fi.isDir() ? QStringLiteral("it is a folder") : f.errorString()));
        return false;
    }
    if (f.size() > (1 << 20)) {
        m_issues->setText(QStringLiteral("<span style='color:#b00020'>%1 is over 1 MiB: not a trainscope config</span>").arg(path.toHtmlEscaped()));
        return false;
    }
    QSettings settings;
    settings.setValue(QStringLiteral("config/lastDir"), fi.absolutePath());
    QStringList recent = settings.value(QStringLiteral("config/recent")).toStringList();
    recent.removeAll(fi.absoluteFilePath());
    recent.prepend(fi.absoluteFilePath());
    while (recent.size() > 10) recent.removeLast();
    settings.setValue(QStringLiteral("config/recent"), recent);
    if (m_name->text().isEmpty()) m_name->setText(fi.completeBaseName());
    loadYaml(QString::fromUtf8(f.readAll()), fi.fileName());
    return true;
}

void ConfigEditor::loadConfigJson(const json& config, const QString& source) {
    m_valid = false;
    m_run->setEnabled(false);
    m_source = source;
    m_sourceLabel->setText(QStringLiteral("<b>%1</b>").arg(source.toHtmlEscaped()));
    emit sourceChanged(source);
    if (!m_model.hasRegistry()) return;
    m_model.setRegistry(m_session->info().knobs);
    m_tree->expandAll();
    m_model.setValues(config);
    updatePreview();
    validateNow();
}

bool ConfigEditor::saveTo(const QString& path, QString* error) {
    QFile f(path);
    if (!f.open(QIODevice::WriteOnly | QIODevice::Truncate)) {
        *error = QStringLiteral("cannot write %1: %2").arg(path, f.errorString());
        return false;
    }
    const QByteArray text = (QStringLiteral("# trainscope config (knobs that differ from the defaults)\n") + yaml()).toUtf8();
    if (f.write(text) != text.size() || !f.flush()) {
        *error = QStringLiteral("writing %1 failed: %2").arg(path, f.errorString());
        return false;
    }
    return true;
}

void ConfigEditor::scheduleValidation() {
    // An edit makes the last answer stale: Run waits for the node's word on the new values.
    m_valid = false;
    m_run->setEnabled(false);
    m_debounce.start();
}

void ConfigEditor::validateNow() {
    if (!m_session->isConnected()) return;
    const uint64_t ticket = ++m_validation;
    m_session->request(QStringLiteral("validate"), {{"yaml", yaml().toStdString()}}, this, [this, ticket](const Result<json>& r) {
        if (ticket != m_validation) return;  // the user typed on; a newer answer is coming
        applyValidation(r);
    });
}

void ConfigEditor::applyValidation(const Result<json>& r) {
    if (!r) {
        m_valid = false;
        m_issues->setText(QStringLiteral("<span style='color:#b00020'>validation failed: %1</span>")
                              .arg(QString::fromStdString(r.status().message()).toHtmlEscaped()));
        m_run->setEnabled(false);
        emit validated(false);
        return;
    }
    std::map<QString, QString> byKnob;
    QStringList lines;
    if (r->contains("issues") && (*r)["issues"].is_array())
        for (const auto& i : (*r)["issues"]) {
            const QString knob = QString::fromStdString(i.value("knob", std::string()));
            const QString message = QString::fromStdString(i.value("message", std::string()));
            byKnob[knob] = byKnob[knob].isEmpty() ? message : byKnob[knob] + QStringLiteral("; ") + message;
            lines << QString::fromStdString(i.value("text", i.value("message", std::string())));
        }
    m_model.setIssues(byKnob);
    m_valid = r->value("ok", false);
    QString html;
    for (const QString& l : lines) html += QStringLiteral("<div style='color:#b00020'>✗ %1</div>").arg(l.toHtmlEscaped());
    // A valid config the node cannot run (its devices): Run stays off, saying why.
    QStringList nodeIssues;
    if (r->contains("node_issues") && (*r)["node_issues"].is_array())
        for (const auto& n : (*r)["node_issues"])
            if (n.is_string()) nodeIssues << QString::fromStdString(n.get<std::string>());
    for (const QString& n : nodeIssues)
        html += QStringLiteral("<div style='color:#b00020'>✗ cannot run on %1: %2</div>")
                    .arg(m_session->url().toHtmlEscaped(), n.toHtmlEscaped());
    if (r->contains("unsupported") && (*r)["unsupported"].is_array() && !(*r)["unsupported"].empty()) {
        html += QStringLiteral("<div style='color:#8a6d00'>Accepted but not executed by the engine yet:</div>");
        for (const auto& u : (*r)["unsupported"])
            if (u.is_string()) html += QStringLiteral("<div style='color:#8a6d00'>• %1</div>").arg(QString::fromStdString(u.get<std::string>()).toHtmlEscaped());
    }
    if (m_valid && lines.isEmpty() && nodeIssues.isEmpty())
        html.prepend(QStringLiteral("<div style='color:#1b7f3b'>✓ valid on %1</div>").arg(m_session->url().toHtmlEscaped()));
    m_issues->setText(html);
    m_run->setEnabled(m_valid && nodeIssues.isEmpty());
    emit validated(m_valid);
}

void ConfigEditor::updatePreview() { m_preview->setGrid(layoutGridOf(m_model.values())); }

}  // namespace ts::gui
