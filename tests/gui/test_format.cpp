// Number formatting used by every view (gui/core/format.h).
#include <gtest/gtest.h>

#include <limits>

#include "gui/core/format.h"

using namespace ts::gui;

TEST(GuiFormat, DurationsPickTheUnitByMagnitude) {
    EXPECT_EQ(formatDurationNs(0), "0.00 ns");
    EXPECT_EQ(formatDurationNs(999), "999 ns");
    EXPECT_EQ(formatDurationNs(1234), QString::fromUtf8("1.23 µs"));
    EXPECT_EQ(formatDurationNs(45.6e6), "45.6 ms");
    EXPECT_EQ(formatDurationNs(2.5e9), "2.50 s");
    EXPECT_EQ(formatDurationNs(std::numeric_limits<double>::quiet_NaN()), QString::fromUtf8("–"));
}

TEST(GuiFormat, BytesAreBinaryFlopsAreDecimal) {
    EXPECT_EQ(formatBytes(512), "512 B");
    EXPECT_EQ(formatBytes(1536), "1.50 KiB");
    EXPECT_EQ(formatBytes(3.0 * 1024 * 1024 * 1024), "3.00 GiB");
    EXPECT_EQ(formatFlops(3.2e12), "3.20 TFLOP");
    EXPECT_EQ(formatFlopRate(950e9), "950 GFLOP/s");
    EXPECT_EQ(formatPercent(0.4231), "42.3%");
}
