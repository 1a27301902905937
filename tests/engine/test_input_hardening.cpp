// Hostile inputs to the engine's file readers: YAML configs (alias bombs, size, nesting,
// invalid UTF-8, non-regular files, every problem in one pass) and checkpoint.json (every
// field range- and type-checked before it is used).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "common/text.h"
#include "engine/train/checkpoint.h"
#include "engine/config/knobs.h"

namespace ts::engine {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
    auto dir = fs::path(TS_BINARY_DIR) / "test_scratch" / ("engine_" + name);
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

void writeText(const fs::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
}

bool anyIssueContains(const LoadedConfig& r, const std::string& text) {
    for (const auto& i : r.issues)
        if (i.toString().find(text) != std::string::npos) return true;
    return false;
}

std::string issuesText(const LoadedConfig& r) { return issuesToStatus(r.issues).message(); }

// The 509-byte document of the issue: nine levels of nine aliases each = 9^9 (387 million)
// nodes once expanded.
std::string billionLaughs() {
    std::string y = "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
    std::string prev = "a";
    for (char c = 'b'; c <= 'i'; ++c) {
        std::string name(1, c);
        y += name + ": &" + name + " [";
        for (int k = 0; k < 9; ++k) y += (k ? ",*" : "*") + prev;
        y += "]\n";
        prev = name;
    }
    return y;
}

TEST(ConfigYamlLimits, AliasBombIsRefusedQuicklyWithOneIssue) {
    const std::string bomb = billionLaughs();
    ASSERT_LT(bomb.size(), 600u);
    // Without the bound, expanding this takes gigabytes; with it, well under a second.
    const auto t0 = std::chrono::steady_clock::now();
    auto r = parseConfigYaml(bomb, "bomb.yaml");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 5.0);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(anyIssueContains(r, "expands to more than")) << issuesText(r);
    // The same bomb as the value of a real knob, and through --set.
    auto v = parseConfigYaml("x: &x [1,1,1,1,1,1,1,1,1,1]\ny: &y [*x,*x,*x,*x,*x,*x,*x,*x,*x,*x]\n"
                             "z: &z [*y,*y,*y,*y,*y,*y,*y,*y,*y,*y]\nw: &w [*z,*z,*z,*z,*z,*z,*z,*z,*z,*z]\n"
                             "v: &v [*w,*w,*w,*w,*w,*w,*w,*w,*w,*w]\nrecompute_modules: [*v,*v,*v,*v,*v,*v,*v,*v,*v,*v]\n");
    EXPECT_TRUE(anyIssueContains(v, "expands to more than")) << issuesText(v);
    // --set takes one YAML value: anchors inside it expand the same way.
    std::string value = "[&a0 [m,m,m,m,m,m,m,m,m,m]";
    for (int level = 1; level < 9; ++level) {
        value += ", &a" + std::to_string(level) + " [";
        for (int k = 0; k < 10; ++k) value += (k ? ", *a" : "*a") + std::to_string(level - 1);
        value += "]";
    }
    value += "]";
    Config c;
    Status s2 = applyOverride(c, "recompute_modules=" + value);
    EXPECT_FALSE(s2.isOk());
    EXPECT_NE(s2.message().find("expands to more than"), std::string::npos) << s2.message();
}

TEST(ConfigYamlLimits, SizeAndNestingAreBounded) {
    std::string big = "num_layers: 2\n";
    while (big.size() <= (size_t(1) << 20)) big += "# padding padding padding padding padding padding padding\n";
    auto r = parseConfigYaml(big, "big.yaml");
    EXPECT_TRUE(anyIssueContains(r, "at most 1 MiB")) << issuesText(r);

    std::string deep = "recompute_modules: " + std::string(100, '[') + std::string(100, ']') + "\n";
    auto d = parseConfigYaml(deep, "deep.yaml");
    EXPECT_TRUE(anyIssueContains(d, "nested more than")) << issuesText(d);
}

TEST(ConfigYaml, InvalidUtf8BecomesReplacementCharacters) {
    auto r = parseConfigYaml("name: \"run\xff\xfe\"\n", "u.yaml");
    ASSERT_TRUE(r.ok()) << issuesText(r);
    EXPECT_TRUE(isValidUtf8(r.config.name));
    EXPECT_NE(r.config.name.find("\xEF\xBF\xBD"), std::string::npos);
    EXPECT_NO_THROW((void)configToJson(r.config).dump());
    // A value of the wrong type is quoted back in the message: that must not throw either.
    auto bad = parseConfigYaml("num_layers: \"\xff\"\n\xff\xfe: 1\n", "b.yaml");
    EXPECT_EQ(bad.issues.size(), 2u) << issuesText(bad);
    for (const auto& i : bad.issues) EXPECT_TRUE(isValidUtf8(i.toString())) << i.toString();
}

TEST(ConfigYaml, OverrideErrorsQuoteTheValueAsValidUtf8) {
    // Found by fuzz_config_yaml: yaml-cpp's "unknown escape character: " message ends with the
    // raw byte after the backslash.
    Config c;
    Status s = applyOverride(c, std::string("recompute_modules=\"a\\\xf0\""));
    ASSERT_FALSE(s.isOk());
    EXPECT_TRUE(isValidUtf8(s.message())) << s.message();
}

TEST(ConfigYaml, EveryProblemOfAFileIsReportedInOnePass) {
    // An unknown key, a duplicate, a wrong type, a key that is a list, and a rule violation
    // (tp=3 does not divide 8 heads; it does not divide the derived ffn size either).
    auto r = parseConfigYaml("num_attention_heads: 8\n"
                             "tensor_model_parallel_size: 3\n"
                             "overlap_grad_reduse: true\n"
                             "num_layers: 2\n"
                             "num_layers: 4\n"
                             "seq_length: long\n"
                             "[a, b]: 1\n",
                             "all.yaml");
    EXPECT_EQ(r.issues.size(), 6u) << issuesText(r);
    EXPECT_TRUE(anyIssueContains(r, "all.yaml:3: unknown key 'overlap_grad_reduse'")) << issuesText(r);
    EXPECT_TRUE(anyIssueContains(r, "all.yaml:5: num_layers: set more than once (first on line 4)")) << issuesText(r);
    EXPECT_TRUE(anyIssueContains(r, "all.yaml:6: seq_length: expected an integer")) << issuesText(r);
    EXPECT_TRUE(anyIssueContains(r, "all.yaml:7: a key must be a plain knob name")) << issuesText(r);
    EXPECT_TRUE(anyIssueContains(r, "all.yaml:2: tensor_model_parallel_size: tensor_model_parallel_size=3 does not "
                                    "divide num_attention_heads=8")) << issuesText(r);
}

TEST(ConfigFile, DirectoriesFifosAndHugeFilesAreErrors) {
    const fs::path dir = scratch("config_file");
    auto d = loadConfigFile(dir.string());
    EXPECT_TRUE(anyIssueContains(d, "is a directory")) << issuesText(d);

    const fs::path fifo = dir / "pipe.yaml";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto f = loadConfigFile(fifo.string());  // must not block waiting for a writer
    EXPECT_TRUE(anyIssueContains(f, "not a regular file")) << issuesText(f);

    const fs::path big = dir / "big.yaml";
    fs::resize_file((writeText(big, "num_layers: 2\n"), big), (uintmax_t(1) << 20) + 10);
    auto b = loadConfigFile(big.string());
    EXPECT_TRUE(anyIssueContains(b, "at most 1 MiB")) << issuesText(b);
}

// ---- checkpoint.json -----------------------------------------------------------------------

struct TinyCheckpoint {
    std::vector<ParamInfo> table;
    int64_t numel = 6;
    std::vector<float> p, m, v;
    fs::path dir;

    explicit TinyCheckpoint(const std::string& name) : p(6, 1.f), m(6, 0.f), v(6, 0.f) {
        ParamInfo a;
        a.name = "w";
        a.shape = a.fullShape = {2, 3};
        a.numel = 6;
        a.offset = 0;
        table.push_back(a);
        dir = scratch(name);
        CheckpointState s;
        s.iteration = 3;
        s.samplesConsumed = 24;
        s.seed = 1234;
        EXPECT_TRUE(writeCheckpointFiles(dir.string(), table, numel, p.data(), m.data(), v.data(), s).isOk());
    }
    nlohmann::json meta() const {
        std::ifstream in(dir / "checkpoint.json");
        return nlohmann::json::parse(in);
    }
    void setMeta(const nlohmann::json& j) const { writeText(dir / "checkpoint.json", j.dump()); }
    Status load(CheckpointState* s = nullptr) {
        return readCheckpointFiles(dir.string(), table, numel, p.data(), m.data(), v.data(), s);
    }
};

TEST(CheckpointFile, ValidCheckpointLoads) {
    TinyCheckpoint ck("ckpt_valid");
    CheckpointState s;
    ASSERT_TRUE(ck.load(&s).isOk());
    EXPECT_EQ(s.iteration, 3);
    EXPECT_EQ(s.samplesConsumed, 24);
    EXPECT_EQ(s.seed, 1234);
}

TEST(CheckpointFile, EveryFieldIsCheckedAndNamed) {
    TinyCheckpoint ck("ckpt_fields");
    const nlohmann::json good = ck.meta();
    struct Case {
        const char* what;
        std::function<void(nlohmann::json&)> edit;
        const char* field;
    };
    const Case cases[] = {
        {"negative samples", [](nlohmann::json& j) { j["samples_consumed"] = -5; }, "samples_consumed"},
        {"samples past 2^62", [](nlohmann::json& j) { j["samples_consumed"] = uint64_t(1) << 63; }, "samples_consumed"},
        {"samples as text", [](nlohmann::json& j) { j["samples_consumed"] = "24"; }, "samples_consumed"},
        {"negative iteration", [](nlohmann::json& j) { j["iteration"] = -1; }, "iteration"},
        {"iteration beyond int", [](nlohmann::json& j) { j["iteration"] = int64_t(1) << 40; }, "iteration"},
        {"iteration as float", [](nlohmann::json& j) { j["iteration"] = 2.5; }, "iteration"},
        {"seed as object", [](nlohmann::json& j) { j["seed"] = nlohmann::json::object(); }, "seed"},
        {"no seed", [](nlohmann::json& j) { j.erase("seed"); }, "seed"},
        {"numel as text", [](nlohmann::json& j) { j["numel"] = "6"; }, "numel"},
        {"params not a list", [](nlohmann::json& j) { j["params"] = 7; }, "params"},
        {"param not an object", [](nlohmann::json& j) { j["params"][0] = "w"; }, "params[0]"},
        {"param name a number", [](nlohmann::json& j) { j["params"][0]["name"] = 5; }, "params[0].name"},
        {"shape of text", [](nlohmann::json& j) { j["params"][0]["shape"] = {"2", "3"}; }, "params[0].shape"},
        {"negative offset", [](nlohmann::json& j) { j["params"][0]["offset"] = -8; }, "params[0].offset"},
        {"config a list", [](nlohmann::json& j) { j["config"] = nlohmann::json::array(); }, "config"},
    };
    for (const auto& c : cases) {
        nlohmann::json j = good;
        c.edit(j);
        ck.setMeta(j);
        Status s;
        EXPECT_NO_THROW(s = ck.load()) << c.what;
        EXPECT_FALSE(s.isOk()) << c.what;
        EXPECT_NE(s.message().find(std::string("'") + c.field + "'"), std::string::npos) << c.what << ": " << s.message();
    }
    // Not an object at all, or a different format version.
    ck.setMeta(nlohmann::json::array({1, 2}));
    EXPECT_FALSE(ck.load().isOk());
    nlohmann::json v = good;
    v["version"] = "1";
    ck.setMeta(v);
    EXPECT_FALSE(ck.load().isOk());
    ck.setMeta(good);
    EXPECT_TRUE(ck.load().isOk());
}

}  // namespace
}  // namespace ts::engine
