// The node bar at the top of the window: which node the workbench talks to (host, backend,
// devices with memory, agent version), adding a node by URL (ssh://[user@]host or
// tcp://host:port with a token file; the token itself is never stored), switching, and a clear
// message with a Reconnect button when the node drops.
#pragma once

#include <QComboBox>
#include <QLabel>
#include <QPushButton>
#include <QWidget>

#include "gui/core/node_session.h"

namespace ts::gui {

class NodeBar : public QWidget {
    Q_OBJECT
public:
    explicit NodeBar(NodeSession* session, QWidget* parent = nullptr);
    // Adds (or selects) a node and connects to it.
    void openNode(const QString& url, const QString& tokenFile = {});
    QString statusText() const { return m_status->text(); }
    QStringList nodeUrls() const;

private:
    void addNodeDialog();
    void connectSelected();
    void remember(const QString& url, const QString& tokenFile);
    void setStatus(const QString& text, bool error);

    NodeSession* m_session;
    QComboBox* m_nodes;
    QPushButton* m_connect;
    QPushButton* m_add;
    QLabel* m_status;
};

}  // namespace ts::gui
