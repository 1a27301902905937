// UTF-8 sanitising and terminal escaping (common/text.h): the helpers every piece of outside
// text passes through before it is written as JSON or printed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "common/text.h"

namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, ValidTextIsUnchanged) {
    for (std::string s : {std::string(""), std::string("plain ascii"), std::string("caf\xC3\xA9"),
                          std::string("\xE2\x82\xAC 20"), std::string("\xF0\x9F\x98\x80"), std::string("a\0b", 3)}) {
        EXPECT_TRUE(ts::isValidUtf8(s)) << s;
        EXPECT_EQ(ts::sanitizeUtf8(s), s);
    }
}

TEST(Utf8, IllFormedSequencesBecomeReplacementCharacters) {
    EXPECT_FALSE(ts::isValidUtf8("\xFF"));
    EXPECT_EQ(ts::sanitizeUtf8("a\xFF" "b"), "a" + kFffd + "b");
    // Overlong encodings, surrogates and code points above U+10FFFF are ill-formed.
    EXPECT_EQ(ts::sanitizeUtf8("\xC0\xAF"), kFffd + kFffd);
    EXPECT_EQ(ts::sanitizeUtf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);
    EXPECT_EQ(ts::sanitizeUtf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
    // A truncated sequence is one maximal subpart: one U+FFFD, and the next character survives.
    EXPECT_EQ(ts::sanitizeUtf8("\xE2\x82" "x"), kFffd + "x");
    EXPECT_EQ(ts::sanitizeUtf8("\xF0\x9F\x98"), kFffd);
    EXPECT_TRUE(ts::isValidUtf8(ts::sanitizeUtf8("\x80\x80\xC3")));
}

TEST(Utf8, SanitisedTextAlwaysDumpsAsJson) {
    std::string bytes;
    for (int i = 0; i < 256; ++i) bytes += char(i);
    nlohmann::json j = {{"name", ts::sanitizeUtf8(bytes)}};
    EXPECT_NO_THROW((void)j.dump());
    // dumpJson never throws, even on raw bytes.
    nlohmann::json raw = {{"name", bytes}};
    EXPECT_THROW((void)raw.dump(), nlohmann::json::type_error);
    std::string out;
    EXPECT_NO_THROW(out = ts::dumpJson(raw));
    EXPECT_TRUE(ts::isValidUtf8(out));
}

TEST(TerminalText, ControlCharactersAreEscaped) {
    EXPECT_EQ(ts::escapeControlChars("run\x1b[2Jname"), "run\\x1b[2Jname");
    EXPECT_EQ(ts::escapeControlChars("a\tb\nc\rd\x7f"), "a\\tb\\nc\\rd\\x7f");
    EXPECT_EQ(ts::escapeControlChars("\xC2\x9B" "31m"), "\\u009b31m");  // C1 CSI
    EXPECT_EQ(ts::escapeControlChars("caf\xC3\xA9 \xFF"), "caf\xC3\xA9 " + kFffd);
    EXPECT_EQ(ts::escapeControlChars("plain"), "plain");
}

}  // namespace
