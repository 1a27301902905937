// The `trainscope` command line as a user runs it: help, knobs, validate (exit codes and the
// one-message-per-problem output with file:line), layout and schedule errors.
#include <gtest/gtest.h>

#include "tests/apps/cli_test_util.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>

#include "engine/config/knobs.h"

namespace {

using ts::cli_test::Output;
using ts::cli_test::run;

const std::string kRoot = TS_SOURCE_DIR;

TEST(Cli, HelpListsEveryCommand) {
    Output o = run("--help");
    EXPECT_EQ(o.code, 0);
    for (const char* c : {"demo", "run", "knobs", "validate", "layout", "schedule", "analyze", "import",
                          "export-trace", "runs", "compare", "export", "agent"})
        EXPECT_NE(o.text.find(std::string("  ") + c + " "), std::string::npos) << c;
    EXPECT_EQ(run("no-such-command").code, 2);
}

TEST(Cli, KnobsJsonHasEveryRegistryKnobWithFlags) {
    Output o = run("knobs --json");
    ASSERT_EQ(o.code, 0) << o.text;
    auto j = nlohmann::json::parse(o.text);
    ASSERT_EQ(j.size(), ts::engine::knobRegistry().size());
    bool sawOverlap = false;
    for (const auto& k : j) {
        if (k["name"] == "overlap_grad_reduce") {
            sawOverlap = true;
            EXPECT_EQ(k["megatron_flag"], "--overlap-grad-reduce");
            EXPECT_EQ(k["bridge_path"], "comm_overlap.overlap_grad_reduce");  // what Bridge applies last
        }
    }
    EXPECT_TRUE(sawOverlap);
    Output table = run("knobs --group dp_comm");
    EXPECT_EQ(table.code, 0);
    EXPECT_NE(table.text.find("--ddp-bucket-size"), std::string::npos);
}

TEST(Cli, ValidateAcceptsEveryShippedExample) {
    for (const char* f : {"tiny", "small", "tp2_sp", "pp2_1f1b", "pp4_interleaved", "dp2_overlap", "dp2_distopt",
                          "llama_style", "bf16_recompute", "world8_3d", "fp8_hybrid", "cp2_ring", "moe_tiny"}) {
        Output o = run("validate " + kRoot + "/resources/examples/" + f + ".yaml");
        EXPECT_EQ(o.code, 0) << f << ": " << o.text;
        EXPECT_NE(o.text.find(": ok ("), std::string::npos) << o.text;
    }
}

TEST(Cli, ValidatePrintsOneMessagePerProblemWithFileAndLine) {
    const std::string dir = kRoot + "/tests/data/configs/";
    Output types = run("validate " + dir + "bad_types.yaml");
    EXPECT_EQ(types.code, 2);
    EXPECT_NE(types.text.find("bad_types.yaml:1: num_layers: expected an integer"), std::string::npos) << types.text;
    EXPECT_NE(types.text.find("bad_types.yaml:2: sequence_parallel: expected true or false"), std::string::npos);
    EXPECT_NE(types.text.find("bad_types.yaml:3: normalization: 'BatchNorm' is not one of: LayerNorm, RMSNorm"),
              std::string::npos);
    EXPECT_NE(types.text.find("3 problems"), std::string::npos);

    Output unknown = run("validate " + dir + "bad_unknown_key.yaml");
    EXPECT_EQ(unknown.code, 2);
    EXPECT_NE(unknown.text.find(":2: unknown key 'overlap_grad_reduse'; did you mean 'overlap_grad_reduce'?"),
              std::string::npos) << unknown.text;

    Output tp = run("validate " + dir + "bad_tp_heads.yaml");
    EXPECT_EQ(tp.code, 2);
    EXPECT_NE(tp.text.find(":3: tensor_model_parallel_size: tensor_model_parallel_size=3 does not divide "
                           "num_attention_heads=8"), std::string::npos) << tp.text;

    Output inter = run("validate " + dir + "bad_interleave.yaml");
    EXPECT_EQ(inter.code, 2);
    EXPECT_NE(inter.text.find("num_microbatches (6) % pipeline_model_parallel_size (4) == 0"), std::string::npos);

    Output json = run("validate --json " + dir + "bad_param_gather.yaml");
    EXPECT_EQ(json.code, 2);
    auto j = nlohmann::json::parse(json.text);
    ASSERT_EQ(j.size(), 1u);
    EXPECT_FALSE(j[0]["ok"].get<bool>());
    EXPECT_EQ(j[0]["issues"].size(), 2u);

    Output missing = run("validate " + dir + "does_not_exist.yaml");
    EXPECT_EQ(missing.code, 2);
    EXPECT_NE(missing.text.find("cannot open config file"), std::string::npos);
}

TEST(Cli, ValidateNamesKnobsTheEngineDoesNotExecuteYet) {
    Output o = run("validate " + kRoot + "/tests/data/configs/note_permute_fusion.yaml");
    EXPECT_EQ(o.code, 0) << o.text;
    EXPECT_NE(o.text.find("note: moe_permute_fusion=true is valid but not executed by the engine yet"),
              std::string::npos) << o.text;
}

TEST(Cli, LayoutAndScheduleRejectBadInputWithExitTwo) {
    EXPECT_EQ(run("schedule --pp 4 --vpp 2 --microbatches 6").code, 2);
    Output ok = run("schedule --pp 2 --microbatches 4 --rank 0");
    EXPECT_EQ(ok.code, 0) << ok.text;
    EXPECT_NE(ok.text.find("F0"), std::string::npos) << ok.text;
    EXPECT_EQ(run("layout " + kRoot + "/tests/data/configs/bad_world.yaml").code, 2);
}

}  // namespace

namespace {

// `trainscope config from-megatron` / `from-bridge` as a user runs them: the export of an
// example comes back as a config that validates and exports to the same arguments, and what
// cannot be mapped is printed by name (issue #14).
TEST(Cli, ConfigFromMegatronAndFromBridgeRoundTripAnExample) {
    char tmpl[] = "/tmp/ts_cli_import_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string dir = tmpl;
    const std::string example = kRoot + "/resources/examples/world8_3d.yaml";
    Output args = run("export " + example + " --format megatron-args --out " + dir + "/launch.args");
    ASSERT_EQ(args.code, 0) << args.text;
    {
        FILE* f = fopen((dir + "/launch.args").c_str(), "a");
        ASSERT_NE(f, nullptr);
        fputs("--tokenizer-type GPT2BPETokenizer\n", f);  // a second line of the argument file
        fclose(f);
    }
    Output imported = run("config from-megatron " + dir + "/launch.args --out " + dir + "/back.yaml");
    ASSERT_EQ(imported.code, 0) << imported.text;
    EXPECT_NE(imported.text.find("unmapped: --tokenizer-type GPT2BPETokenizer"), std::string::npos) << imported.text;
    EXPECT_EQ(run("validate " + dir + "/back.yaml").code, 0);
    // The imported config exports to the same arguments (without the unmapped tokenizer).
    ASSERT_EQ(run("export " + dir + "/back.yaml --format megatron-args --out " + dir + "/again.args").code, 0);
    auto slurp = [](const std::string& path) {
        std::ifstream in(path);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    std::string original = slurp(dir + "/launch.args");
    original = original.substr(0, original.find("\n--tokenizer-type") + 1);
    EXPECT_EQ(slurp(dir + "/again.args"), original);

    Output bridge = run("export " + example + " --format bridge-overrides --out " + dir + "/bridge.txt");
    ASSERT_EQ(bridge.code, 0) << bridge.text;
    Output fromBridge = run("config from-bridge " + dir + "/bridge.txt --out " + dir + "/bridge_back.yaml");
    ASSERT_EQ(fromBridge.code, 0) << fromBridge.text;
    EXPECT_EQ(fromBridge.text.find("unmapped:"), std::string::npos) << fromBridge.text;
    EXPECT_EQ(run("validate " + dir + "/bridge_back.yaml").code, 0);

    EXPECT_EQ(run("config from-megatron").code, 2);
    EXPECT_EQ(run("config from-megatron " + dir + "/missing.sh").code, 3);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

}  // namespace
