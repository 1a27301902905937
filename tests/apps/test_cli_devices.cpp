// `trainscope devices`: always lists the CPU; lists the CUDA devices (SMs, compute capability,
// peak TFLOP/s, the note that layouts over several GPUs are not yet verified) when there are any, else says why not.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/apps/cli_test_util.h"

namespace {

using ts::cli_test::Output;
using ts::cli_test::run;

TEST(CliDevices, PrintsTheCpuAndWhyThereIsNoGpu) {
    const Output o = run("devices");
    ASSERT_EQ(o.code, 0) << o.text;
    EXPECT_NE(o.text.find("cpu: 1 device"), std::string::npos) << o.text;
    EXPECT_NE(o.text.find("memory "), std::string::npos) << o.text;
    if (o.text.find("cuda: none (") == std::string::npos) {
        // A GPU machine: the CUDA lines and the status note.
        EXPECT_NE(o.text.find("compute capability"), std::string::npos) << o.text;
        EXPECT_NE(o.text.find("peak TFLOP/s"), std::string::npos) << o.text;
        EXPECT_NE(o.text.find("several GPUs are not yet verified"), std::string::npos) << o.text;
    } else {
        EXPECT_NE(o.text.find("device_backend: cpu"), std::string::npos) << o.text;
    }
}

TEST(CliDevices, JsonListsEveryBackend) {
    const Output o = run("devices --json 2>/dev/null");
    ASSERT_EQ(o.code, 0) << o.text;
    const auto j = nlohmann::json::parse(o.text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << o.text;
    ASSERT_TRUE(j.contains("backends")) << o.text;
    bool cpu = false, cuda = false;
    for (const auto& b : j["backends"]) {
        if (b["backend"] == "cpu") {
            cpu = true;
            EXPECT_GT(b["devices"][0]["memory_total_bytes"].get<int64_t>(), 0);
        }
        if (b["backend"] == "cuda") {
            cuda = true;
            for (const auto& d : b["devices"]) {
                EXPECT_GT(d["sm_count"].get<int>(), 0);
                EXPECT_TRUE(d.contains("compute_capability"));
                EXPECT_TRUE(d.contains("peak_tflops_bf16"));
            }
        }
    }
    EXPECT_TRUE(cpu) << o.text;
    if (!cuda) {
        EXPECT_TRUE(j.contains("cuda") && j["cuda"].is_string()) << "the reason there is no GPU: " << o.text;
    }
    EXPECT_EQ(run("devices --bogus").code, 2);
}

}  // namespace
