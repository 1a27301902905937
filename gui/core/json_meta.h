// nlohmann::json as a Qt metatype, so JSON values travel through queued signals between the
// worker threads and the UI thread as plain values.
#pragma once

#include <QMetaType>

#include <nlohmann/json.hpp>

Q_DECLARE_METATYPE(nlohmann::json)
