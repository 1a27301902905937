// Number formatting shared by every view (format.h).
#include "gui/core/format.h"

#include <cmath>

namespace ts::gui {
namespace {

// Three significant digits: 1.23, 12.3, 123.
QString sig3(double v) {
    const double a = std::fabs(v);
    const int decimals = a >= 100 ? 0 : a >= 10 ? 1 : 2;
    return QString::number(v, 'f', decimals);
}

QString scaled(double v, const char* const* units, int count, double base) {
    if (!std::isfinite(v)) return QStringLiteral("–");
    int i = 0;
    double x = v;
    while (i + 1 < count && std::fabs(x) >= base * 0.9995) {
        x /= base;
        ++i;
    }
    return sig3(x) + QStringLiteral(" ") + QString::fromUtf8(units[i]);
}

}  // namespace

QString formatDurationNs(double ns) {
    if (!std::isfinite(ns)) return QStringLiteral("–");
    const double a = std::fabs(ns);
    if (a < 999.5) return sig3(ns) + QStringLiteral(" ns");
    if (a < 999.5e3) return sig3(ns / 1e3) + QStringLiteral(" µs");
    if (a < 999.5e6) return sig3(ns / 1e6) + QStringLiteral(" ms");
    return sig3(ns / 1e9) + QStringLiteral(" s");
}

QString formatBytes(double bytes) {
    static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (std::fabs(bytes) < 1024) return QString::number(std::llround(bytes)) + QStringLiteral(" B");
    return scaled(bytes, units, 5, 1024.0);
}

QString formatFlops(double flops) {
    static const char* const units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"};
    return scaled(flops, units, 6, 1000.0);
}

QString formatFlopRate(double flopsPerSecond) { return formatFlops(flopsPerSecond) + QStringLiteral("/s"); }

QString formatPercent(double fraction) {
    if (!std::isfinite(fraction)) return QStringLiteral("–");
    return QString::number(fraction * 100.0, 'f', 1) + QStringLiteral("%");
}

}  // namespace ts::gui
