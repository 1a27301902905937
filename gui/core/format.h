// Human-readable numbers for the workbench: durations, bytes, FLOP rates. One place, so the
// timeline, the panels and the details pane print the same value the same way.
#pragma once

#include <cstdint>

#include <QString>

namespace ts::gui {

// 1234 -> "1.23 µs", 2.5e9 -> "2.50 s"; three significant digits, unit chosen by magnitude.
QString formatDurationNs(double ns);
// 1536 -> "1.50 KiB" (binary units, as the memory counters are allocator bytes).
QString formatBytes(double bytes);
// 3.2e12 -> "3.20 TFLOP" (decimal units, as FLOP counts are quoted).
QString formatFlops(double flops);
// FLOP/s: 3.2e12 -> "3.20 TFLOP/s".
QString formatFlopRate(double flopsPerSecond);
// 0.4231 -> "42.3%".
QString formatPercent(double fraction);

}  // namespace ts::gui
