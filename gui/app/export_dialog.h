// Export: a run's tuned config as our YAML, Megatron-LM arguments or Megatron-Bridge overrides
// (sessions/export.h), with copy and save. What a format cannot express is listed under it.
#pragma once

#include <QDialog>
#include <QLabel>
#include <QPlainTextEdit>
#include <QTabWidget>

#include <nlohmann/json.hpp>

#include "gui/core/jobs.h"

namespace ts::gui {

class ExportDialog : public QDialog {
    Q_OBJECT
public:
    explicit ExportDialog(QWidget* parent = nullptr);
    // Loads the run file's config (worker thread) and fills the three formats.
    void setRunFile(const QString& runFile, const QString& runName);
    QString text(const QString& format) const;  // "yaml", "megatron_args", "bridge_overrides"
    void showFormat(const QString& format);

signals:
    void loaded();

private:
    QTabWidget* m_tabs;
    QLabel* m_title;
    std::map<QString, QPlainTextEdit*> m_texts;
    std::map<QString, QLabel*> m_notes;
    JobGeneration m_job;
};

}  // namespace ts::gui
