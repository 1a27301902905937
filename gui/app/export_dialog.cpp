// ExportDialog (export_dialog.h).
#include "gui/app/export_dialog.h"

#include <QApplication>
#include <QClipboard>
#include <QDialogButtonBox>
#include <QFile>
#include <QFileDialog>
#include <QFontDatabase>
#include <QHBoxLayout>
#include <QMessageBox>
#include <QPushButton>
#include <QVBoxLayout>

namespace ts::gui {

using nlohmann::json;

namespace {
const std::pair<const char*, const char*> kFormats[] = {
    {"yaml", "trainscope YAML"}, {"megatron_args", "Megatron-LM arguments"}, {"bridge_overrides", "Megatron-Bridge overrides"}};
}

ExportDialog::ExportDialog(QWidget* parent) : QDialog(parent) {
    setWindowTitle(QStringLiteral("Export config"));
    resize(820, 560);
    auto* layout = new QVBoxLayout(this);
    m_title = new QLabel(this);
    layout->addWidget(m_title);
    m_tabs = new QTabWidget(this);
    for (const auto& [key, title] : kFormats) {
        auto* page = new QWidget(m_tabs);
        auto* pl = new QVBoxLayout(page);
        auto* text = new QPlainTextEdit(page);
        text->setReadOnly(true);
        text->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
        text->setObjectName(QStringLiteral("export_") + QString::fromLatin1(key));
        auto* notes = new QLabel(page);
        notes->setWordWrap(true);
        notes->setStyleSheet(QStringLiteral("color: #6d5d00"));
        auto* row = new QHBoxLayout;
        auto* copy = new QPushButton(QStringLiteral("Copy"), page);
        auto* save = new QPushButton(QStringLiteral("Save…"), page);
        row->addStretch(1);
        row->addWidget(copy);
        row->addWidget(save);
        pl->addWidget(text, 1);
        pl->addWidget(notes);
        pl->addLayout(row);
        m_tabs->addTab(page, QString::fromLatin1(title));
        m_texts[QString::fromLatin1(key)] = text;
        m_notes[QString::fromLatin1(key)] = notes;
        connect(copy, &QPushButton::clicked, this, [text] { QApplication::clipboard()->setText(text->toPlainText()); });
        connect(save, &QPushButton::clicked, this, [this, text, k = QString::fromLatin1(key)] {
            const QString suffix = k == QLatin1String("yaml") ? QStringLiteral(".yaml") : QStringLiteral(".txt");
            const QString f = QFileDialog::getSaveFileName(this, QStringLiteral("Save"), QStringLiteral("config") + suffix);
            if (f.isEmpty()) return;
            QFile out(f);
            if (!out.open(QIODevice::WriteOnly | QIODevice::Truncate) || out.write(text->toPlainText().toUtf8()) < 0)
                QMessageBox::warning(this, QStringLiteral("Save"), QStringLiteral("cannot write %1: %2").arg(f, out.errorString()));
        });
    }
    layout->addWidget(m_tabs, 1);
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, this);
    connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
    layout->addWidget(buttons);
}

void ExportDialog::setRunFile(const QString& runFile, const QString& runName) {
    m_title->setText(QStringLiteral("Config of <b>%1</b>").arg(runName.toHtmlEscaped()));
    for (auto& [k, t] : m_texts) t->setPlainText(QStringLiteral("loading…"));
    const std::string path = runFile.toStdString();
    runJob<Result<json>>(this, m_job, [path] { return exportRunFile(path); }, [this](Result<json> r) {
        if (!r) {
            for (auto& [k, t] : m_texts) t->setPlainText(QStringLiteral("cannot export: ") + QString::fromStdString(r.status().message()));
            emit loaded();
            return;
        }
        for (auto& [k, t] : m_texts) {
            t->setPlainText(QString::fromStdString(r->value(k.toStdString(), std::string())));
            QStringList notes;
            const json n = (*r)["notes"].value(k.toStdString(), json::array());
            for (const auto& line : n)
                if (line.is_string()) notes << QString::fromStdString(line.get<std::string>());
            m_notes[k]->setText(notes.isEmpty() ? QString() : QStringLiteral("Not expressed: ") + notes.join(QStringLiteral("; ")));
        }
        emit loaded();
    });
}

QString ExportDialog::text(const QString& format) const {
    auto it = m_texts.find(format);
    return it == m_texts.end() ? QString() : it->second->toPlainText();
}

void ExportDialog::showFormat(const QString& format) {
    int i = 0;
    for (const auto& [key, title] : kFormats) {
        if (format == QLatin1String(key)) m_tabs->setCurrentIndex(i);
        ++i;
    }
}

}  // namespace ts::gui
