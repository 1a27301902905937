// The GPU topology probe on real GPUs: one entry per visible device, bus ids as
// cudaDeviceGetPCIBusId gives them, and a link for every pair. Skips without a device.
#include <gtest/gtest.h>

#include <cstdio>

#include "engine/backend/backend.h"

namespace ts::engine {
namespace {

TEST(GpuTopologyProbe, DescribesEveryVisibleGpu) {
    auto be = makeCudaBackend();
    if (!be) GTEST_SKIP() << "no CUDA backend: " << be.status().message();
    auto t = probeGpuTopology();
    ASSERT_TRUE(t.isOk()) << t.status().toString();
    ASSERT_EQ(t->count(), (*be)->deviceCount());
    ASSERT_EQ(t->links.size(), size_t(t->count()));
    for (const std::string& id : t->pciBusIds) EXPECT_NE(id, "?");
    std::printf("[gpu topology]\n%s", formatGpuTopology(*t).c_str());
}

}  // namespace
}  // namespace ts::engine
