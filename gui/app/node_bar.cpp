// NodeBar (node_bar.h).
#include "gui/app/node_bar.h"

#include <QDialog>
#include <QDialogButtonBox>
#include <QFileDialog>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLineEdit>
#include <QMessageBox>
#include <QSettings>

namespace ts::gui {

namespace {
constexpr int kTokenFileRole = Qt::UserRole + 1;
}

NodeBar::NodeBar(NodeSession* session, QWidget* parent) : QWidget(parent), m_session(session) {
    auto* row = new QHBoxLayout(this);
    row->setContentsMargins(6, 4, 6, 4);
    auto* label = new QLabel(QStringLiteral("<b>Node</b>"), this);
    m_nodes = new QComboBox(this);
    m_nodes->setObjectName(QStringLiteral("nodeCombo"));
    m_nodes->setMinimumWidth(180);
    m_nodes->setToolTip(QStringLiteral("local: this machine (trainscope agent --stdio as a child process)\n"
                                       "ssh://[user@]host: the same agent over ssh\n"
                                       "tcp://host:port: an agent started with --listen and a token file"));
    m_connect = new QPushButton(QStringLiteral("Connect"), this);
    m_add = new QPushButton(QStringLiteral("+ Node…"), this);
    m_status = new QLabel(this);
    m_status->setObjectName(QStringLiteral("nodeStatus"));
    m_status->setTextInteractionFlags(Qt::TextSelectableByMouse);
    row->addWidget(label);
    row->addWidget(m_nodes);
    row->addWidget(m_connect);
    row->addWidget(m_add);
    row->addSpacing(12);
    row->addWidget(m_status, 1);

    m_nodes->addItem(QStringLiteral("local"));
    QSettings settings;
    const int n = settings.beginReadArray(QStringLiteral("nodes"));
    for (int i = 0; i < n; ++i) {
        settings.setArrayIndex(i);
        const QString url = settings.value(QStringLiteral("url")).toString();
        if (url.isEmpty() || url == QLatin1String("local")) continue;
        m_nodes->addItem(url);
        m_nodes->setItemData(m_nodes->count() - 1, settings.value(QStringLiteral("token_file")).toString(), kTokenFileRole);
    }
    settings.endArray();

    connect(m_connect, &QPushButton::clicked, this, &NodeBar::connectSelected);
    connect(m_add, &QPushButton::clicked, this, &NodeBar::addNodeDialog);
    connect(m_nodes, &QComboBox::activated, this, [this](int) { connectSelected(); });
    connect(session, &NodeSession::connecting, this, [this](const QString& url) {
        setStatus(QStringLiteral("connecting to %1…").arg(url), false);
        m_connect->setEnabled(false);
    });
    connect(session, &NodeSession::connected, this, [this](const NodeInfo& info) {
        setStatus(info.summary(), false);
        m_status->setToolTip(info.details());
        m_connect->setText(QStringLiteral("Reconnect"));
        m_connect->setEnabled(true);
    });
    connect(session, &NodeSession::connectionFailed, this, [this](const QString& url, const QString& message) {
        m_status->setToolTip(QString());
        setStatus(QStringLiteral("cannot connect to %1: %2").arg(url, message), true);
        m_connect->setText(QStringLiteral("Connect"));
        m_connect->setEnabled(true);
    });
    connect(session, &NodeSession::disconnected, this, [this](const QString& url, const QString& message) {
        setStatus(QStringLiteral("disconnected from %1: %2").arg(url, message), true);
        m_connect->setText(QStringLiteral("Reconnect"));
        m_connect->setEnabled(true);
    });
}

QStringList NodeBar::nodeUrls() const {
    QStringList out;
    for (int i = 0; i < m_nodes->count(); ++i) out << m_nodes->itemText(i);
    return out;
}

void NodeBar::setStatus(const QString& text, bool error) {
    m_status->setText(text);
    m_status->setStyleSheet(error ? QStringLiteral("color: #b00020; font-weight: bold") : QString());
}

void NodeBar::openNode(const QString& url, const QString& tokenFile) {
    int i = m_nodes->findText(url);
    if (i < 0) {
        m_nodes->addItem(url);
        i = m_nodes->count() - 1;
    }
    if (!tokenFile.isEmpty()) m_nodes->setItemData(i, tokenFile, kTokenFileRole);
    m_nodes->setCurrentIndex(i);
    remember(url, tokenFile);
    m_session->connectTo(url, tokenFile);
}

void NodeBar::connectSelected() {
    const QString url = m_nodes->currentText();
    m_session->connectTo(url, m_nodes->currentData(kTokenFileRole).toString());
}

void NodeBar::remember(const QString& url, const QString& tokenFile) {
    if (url == QLatin1String("local")) return;
    QSettings settings;
    QList<QPair<QString, QString>> nodes;
    const int n = settings.beginReadArray(QStringLiteral("nodes"));
    for (int i = 0; i < n; ++i) {
        settings.setArrayIndex(i);
        nodes.append({settings.value(QStringLiteral("url")).toString(), settings.value(QStringLiteral("token_file")).toString()});
    }
    settings.endArray();
    nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [&](const auto& p) { return p.first == url; }), nodes.end());
    nodes.prepend({url, tokenFile});
    while (nodes.size() > 12) nodes.removeLast();
    settings.beginWriteArray(QStringLiteral("nodes"));
    for (int i = 0; i < nodes.size(); ++i) {
        settings.setArrayIndex(i);
        settings.setValue(QStringLiteral("url"), nodes[i].first);
        settings.setValue(QStringLiteral("token_file"), nodes[i].second);  // the path, never the token
    }
    settings.endArray();
}

void NodeBar::addNodeDialog() {
    QDialog dialog(this);
    dialog.setWindowTitle(QStringLiteral("Add a node"));
    auto* form = new QFormLayout(&dialog);
    auto* url = new QLineEdit(&dialog);
    url->setPlaceholderText(QStringLiteral("ssh://user@host  or  tcp://host:7070"));
    auto* token = new QLineEdit(&dialog);
    token->setPlaceholderText(QStringLiteral("tcp only: path of the token file (mode 600)"));
    auto* browse = new QPushButton(QStringLiteral("Browse…"), &dialog);
    auto* tokenRow = new QHBoxLayout;
    tokenRow->addWidget(token, 1);
    tokenRow->addWidget(browse);
    form->addRow(QStringLiteral("URL"), url);
    form->addRow(QStringLiteral("Token file"), tokenRow);
    auto* help = new QLabel(QStringLiteral("The GUI stores the token file's path, never the token. Over an untrusted "
                                           "network prefer ssh:// (the token travels in clear text over tcp://)."), &dialog);
    help->setWordWrap(true);
    form->addRow(help);
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &dialog);
    form->addRow(buttons);
    connect(browse, &QPushButton::clicked, &dialog, [&] {
        const QString f = QFileDialog::getOpenFileName(&dialog, QStringLiteral("Token file"));
        if (!f.isEmpty()) token->setText(f);
    });
    connect(buttons, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
    connect(buttons, &QDialogButtonBox::accepted, &dialog, [&] {
        const QString u = url->text().trimmed();
        if (!(u == QLatin1String("local") || u.startsWith(QLatin1String("ssh://")) || u.startsWith(QLatin1String("tcp://")))) {
            QMessageBox::warning(&dialog, QStringLiteral("Add a node"),
                                 QStringLiteral("'%1' is not a node URL: use local, ssh://[user@]host or tcp://host:port").arg(u));
            return;
        }
        if (u.startsWith(QLatin1String("tcp://")) && token->text().trimmed().isEmpty()) {
            QMessageBox::warning(&dialog, QStringLiteral("Add a node"),
                                 QStringLiteral("a tcp:// node needs the path of its token file (the one given to "
                                                "`trainscope agent --listen ... --token-file FILE`)"));
            return;
        }
        dialog.accept();
    });
    if (dialog.exec() != QDialog::Accepted) return;
    openNode(url->text().trimmed(), token->text().trimmed());
}

}  // namespace ts::gui
