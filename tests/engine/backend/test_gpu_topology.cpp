// The GPU topology `devices` prints and the tensor-parallel placement check, on synthetic
// topologies (the probe itself needs GPUs: tests/gpu/test_gpu_topology.cpp).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/backend/backend.h"

namespace ts::engine {
namespace {

// Two NVLink pairs {0,1} and {2,3}; PCIe peer access between the pairs except 1<->3, which has
// none (through the host).
GpuTopology twoIslands() {
    GpuTopology t;
    t.pciBusIds = {"0000:19:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"};
    t.numaNodes = {0, 0, 1, -1};
    t.links.assign(4, std::vector<GpuPeerLink>(4));
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
            if (i == j) continue;
            GpuPeerLink& l = t.links[size_t(i)][size_t(j)];
            const bool sameIsland = i / 2 == j / 2;
            const bool none = (i == 1 && j == 3) || (i == 3 && j == 1);
            l.p2p = !none;
            l.nativeAtomics = sameIsland;
            l.performanceRank = sameIsland ? 0 : 1;
        }
    return t;
}

TEST(GpuTopology, LinkKindsFollowPeerAccessAndAtomics) {
    const GpuTopology t = twoIslands();
    EXPECT_STREQ(t.links[0][1].kind(), "NVLink");
    EXPECT_STREQ(t.links[0][2].kind(), "PCIe");
    EXPECT_STREQ(t.links[1][3].kind(), "host");
}

TEST(GpuTopology, MatrixHasARowPerGpuWithBusAndNuma) {
    const std::string m = formatGpuTopology(twoIslands());
    std::vector<std::string> lines;
    size_t at = 0;
    for (size_t nl; (nl = m.find('\n', at)) != std::string::npos; at = nl + 1) lines.push_back(m.substr(at, nl - at));
    ASSERT_EQ(lines.size(), 6u) << m;  // header, 4 GPUs, legend
    EXPECT_NE(lines[0].find("GPU3"), std::string::npos) << m;
    // GPU1's row: NVLink to GPU0, X, PCIe to GPU2, host to GPU3, its bus id, NUMA node 0.
    const std::string& row1 = lines[2];
    EXPECT_EQ(row1.rfind("GPU1", 0), 0u) << row1;
    const size_t nv = row1.find("NVLink"), x = row1.find("X "), pcie = row1.find("PCIe"), host = row1.find("host");
    ASSERT_NE(nv, std::string::npos) << row1;
    ASSERT_NE(x, std::string::npos) << row1;
    ASSERT_NE(pcie, std::string::npos) << row1;
    ASSERT_NE(host, std::string::npos) << row1;
    EXPECT_LT(nv, x);
    EXPECT_LT(x, pcie);
    EXPECT_LT(pcie, host);
    EXPECT_NE(row1.find("0000:3b:00.0  0"), std::string::npos) << row1;
    EXPECT_NE(lines[4].find("0000:af:00.0  -"), std::string::npos) << lines[4];  // NUMA unknown
}

TEST(GpuTopology, TensorParallelGroupsOutsideOneNvlinkDomainAreNamed) {
    const GpuTopology t = twoIslands();
    EXPECT_TRUE(tpTopologyWarnings(t, {{0, 1}, {2, 3}}).empty());
    const auto w = tpTopologyWarnings(t, {{0, 2}, {1, 3}, {2, 3}});
    ASSERT_EQ(w.size(), 2u);
    EXPECT_NE(w[0].find("GPU0, GPU2"), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("linked over PCIe"), std::string::npos) << w[0];
    EXPECT_NE(w[1].find("linked over host"), std::string::npos) << w[1];
    EXPECT_NE(w[1].find("tensor_model_parallel_size"), std::string::npos) << w[1];
    // A group of all four crosses the islands.
    EXPECT_EQ(tpTopologyWarnings(t, {{0, 1, 2, 3}}).size(), 1u);
}

}  // namespace
}  // namespace ts::engine
