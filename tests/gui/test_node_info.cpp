// What the node bar says of a node's devices: the one-line summary and the tooltip's details, from
// `devices` answers as the agent sends them (docs/protocol.md): a GPU node with its topology, and
// a CPU node that says why it has no CUDA.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gui/core/node_session.h"

using namespace ts::gui;
using nlohmann::json;

namespace {

json gpu(int index) {
    return {{"index", index},
            {"name", "NVIDIA H100 80GB HBM3"},
            {"memory_total_bytes", 85520809984.0},
            {"memory_free_bytes", 84000000000.0},
            {"sm_count", 132},
            {"compute_capability", "9.0"},
            {"peak_tflops_fp32", 66.9},
            {"peak_tflops_bf16", 989.4}};
}

TEST(GuiNodeInfo, GpuNodeDetailsListEveryDeviceTheTopologyAndTheBackendsStatus) {
    json cuda = {{"backend", "cuda"},
                 {"count", 2},
                 {"devices", {gpu(0), gpu(1)}},
                 {"status", "the CUDA backend compiles but has not yet been run on a GPU"},
                 {"topology", {{"text", "       GPU0    GPU1    PCI bus       NUMA\nGPU0   X       NVLink  0000:19:00.0  0\n"
                                        "GPU1   NVLink  X       0000:3b:00.0  0\n"}}}};
    json cpu = {{"backend", "cpu"}, {"count", 1}, {"devices", {{{"index", 0}, {"name", "Xeon"}, {"memory_total_bytes", 1e9}, {"cores", 32}}}}};
    NodeInfo info;
    info.host = "gpu-node";
    info.backend = "cuda";
    info.deviceReport = cuda;
    info.deviceReport["backends"] = {cuda, cpu};
    info.devices = cuda["devices"];
    EXPECT_NE(info.summary().indexOf("2× NVIDIA H100 80GB HBM3"), -1) << info.summary().toStdString();
    const QString d = info.details();
    const QStringList lines = d.split('\n');
    EXPECT_EQ(lines.value(0), "cuda: 2 devices") << d.toStdString();
    EXPECT_NE(lines.value(1).indexOf("[0] NVIDIA H100 80GB HBM3"), -1) << d.toStdString();
    EXPECT_NE(lines.value(1).indexOf("132 SMs, compute capability 9.0, 989 bf16 TFLOP/s peak"), -1) << d.toStdString();
    EXPECT_NE(lines.value(2).indexOf("[1]"), -1) << d.toStdString();
    EXPECT_NE(d.indexOf("GPU0   X       NVLink"), -1) << d.toStdString();
    EXPECT_NE(d.indexOf("note: the CUDA backend compiles"), -1) << d.toStdString();
    EXPECT_NE(d.indexOf("cpu: 1 device\n  [0] Xeon"), -1) << d.toStdString();
    EXPECT_NE(d.indexOf("32 cores"), -1) << d.toStdString();
    EXPECT_EQ(d.indexOf("cuda: none"), -1) << d.toStdString();
}

TEST(GuiNodeInfo, CpuNodeDetailsSayWhyThereIsNoCuda) {
    json cpu = {{"backend", "cpu"}, {"count", 1}, {"devices", {{{"index", 0}, {"name", "Xeon"}, {"memory_total_bytes", 2e9}, {"cores", 2}}}}};
    NodeInfo info;
    info.deviceReport = cpu;
    info.deviceReport["backends"] = {cpu};
    info.deviceReport["cuda"] = "no NVIDIA driver is installed";
    const QString d = info.details();
    EXPECT_NE(d.indexOf("cpu: 1 device"), -1) << d.toStdString();
    EXPECT_NE(d.indexOf("cuda: none (no NVIDIA driver is installed)"), -1) << d.toStdString();
    EXPECT_EQ(d.indexOf("topology"), -1) << d.toStdString();
}

}  // namespace
