// JSON-RPC framing and classification: the parser must survive any byte stream and answer
// with the error codes of the JSON-RPC 2.0 specification.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "sessions/jsonrpc.h"

using namespace ts::sessions::rpc;
namespace rpc = ts::sessions::rpc;
using nlohmann::json;

namespace {

std::vector<FrameEvent> drain(FrameReader& r) {
    std::vector<FrameEvent> out;
    for (;;) {
        FrameEvent e = r.next();
        if (e.kind == FrameEvent::Kind::None) return out;
        out.push_back(std::move(e));
    }
}

}  // namespace

TEST(JsonRpcFraming, RoundTripOneByteAtATime) {
    json a = makeRequest(1, "hello", json{{"client", "test"}});
    json b = makeNotification("progress", json{{"step", 3}, {"text", "ünïcode \r\n\r\n"}});
    std::string stream = encodeFrame(a) + encodeFrame(b);
    FrameReader r;
    std::vector<FrameEvent> events;
    for (char c : stream) {
        r.feed(&c, 1);
        for (auto& e : drain(r)) events.push_back(std::move(e));
    }
    ASSERT_EQ(events.size(), 2u);
    EXPECT_EQ(json::parse(events[0].body), a);
    EXPECT_EQ(json::parse(events[1].body), b);
    EXPECT_EQ(r.bufferedBytes(), 0u);
}

TEST(JsonRpcFraming, HeaderIsCaseInsensitiveAndExtraHeadersAreIgnored) {
    std::string body = R"({"jsonrpc":"2.0","method":"x"})";
    std::string frame = "content-type: application/vscode-jsonrpc; charset=utf-8\r\n"
                        "CONTENT-LENGTH:  " + std::to_string(body.size()) + " \r\n\r\n" + body;
    FrameReader r;
    r.feed(frame);
    auto ev = drain(r);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].kind, FrameEvent::Kind::Message);
    EXPECT_EQ(ev[0].body, body);
}

TEST(JsonRpcFraming, OversizeBodyIsRejectedAndSkippedThenStreamResyncs) {
    FrameReader r(/*maxMessageBytes=*/100);
    std::string big(1000, 'x');
    json ok = makeRequest(7, "hello");
    r.feed(encodeFrameBody(big).substr(0, 40));  // header + a few bytes of the huge body
    auto ev = drain(r);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].kind, FrameEvent::Kind::Error);
    EXPECT_EQ(ev[0].errorCode, kMessageTooLarge);
    // The rest of the oversize body arrives, then a good message: it must come out intact and
    // the reader must never have buffered the big body.
    std::string rest = encodeFrameBody(big).substr(40) + encodeFrame(ok);
    r.feed(rest);
    ev = drain(r);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].kind, FrameEvent::Kind::Message);
    EXPECT_EQ(json::parse(ev[0].body), ok);
}

TEST(JsonRpcFraming, BadHeadersGiveParseErrorsAndResync) {
    json ok = makeRequest("a", "devices");
    FrameReader r;
    r.feed("Content-Length: abc\r\n\r\n");
    r.feed("no colon here\r\n\r\n");
    r.feed("Content-Type: x\r\n\r\n");  // missing length
    r.feed("Content-Length: 5\r\nContent-Length: 6\r\n\r\n");
    r.feed(encodeFrame(ok));
    auto ev = drain(r);
    ASSERT_EQ(ev.size(), 5u);
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(ev[size_t(i)].kind, FrameEvent::Kind::Error) << i;
        EXPECT_EQ(ev[size_t(i)].errorCode, kParseError) << i;
    }
    EXPECT_EQ(ev[4].kind, FrameEvent::Kind::Message);
    EXPECT_EQ(json::parse(ev[4].body), ok);
}

TEST(JsonRpcFraming, EndlessHeaderIsDropped) {
    FrameReader r;
    r.feed(std::string(kMaxHeaderBytes + 10, 'A'));
    auto ev = drain(r);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].errorCode, kParseError);
    EXPECT_EQ(r.bufferedBytes(), 0u);
}

TEST(JsonRpcFraming, RandomGarbageNeverCrashesAndBoundsMemory) {
    std::mt19937 rng(42);
    FrameReader r(4096);
    const std::string alphabet = "Content-Length: 0123456789\r\n{}[]\":,x";
    for (int round = 0; round < 2000; ++round) {
        std::string chunk;
        int n = int(rng() % 200);
        for (int i = 0; i < n; ++i)
            chunk += (rng() % 4 == 0) ? char(rng() % 256) : alphabet[rng() % alphabet.size()];
        r.feed(chunk);
        for (auto& e : drain(r))
            if (e.kind == FrameEvent::Kind::Message) (void)parseMessages(e.body);
        // Buffered bytes never exceed header limit + body limit + one chunk.
        ASSERT_LE(r.bufferedBytes(), kMaxHeaderBytes + 4 + 4096 + 200);
    }
}

TEST(JsonRpcMessages, ClassifiesPerSpecification) {
    // Examples from the JSON-RPC 2.0 specification, section 7.
    auto one = [](const std::string& s) {
        auto v = parseMessages(s);
        EXPECT_EQ(v.size(), 1u);
        return v.front();
    };
    auto m = one(R"({"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1})");
    EXPECT_EQ(m.kind, Message::Kind::Request);
    EXPECT_EQ(m.method, "subtract");
    EXPECT_EQ(m.id, 1);
    EXPECT_EQ(m.params, json::array({42, 23}));

    m = one(R"({"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]})");
    EXPECT_EQ(m.kind, Message::Kind::Notification);

    m = one(R"({"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz])");
    EXPECT_EQ(m.kind, Message::Kind::Invalid);
    EXPECT_EQ(m.errorCode, kParseError);

    m = one(R"({"jsonrpc": "2.0", "method": 1, "params": "bar"})");
    EXPECT_EQ(m.errorCode, kInvalidRequest);

    m = one(R"({"jsonrpc": "1.0", "method": "x", "id": 5})");
    EXPECT_EQ(m.errorCode, kInvalidRequest);
    EXPECT_EQ(m.id, 5);  // id is echoed when it could be read

    m = one(R"({"jsonrpc": "2.0", "method": "x", "params": 3, "id": 5})");
    EXPECT_EQ(m.errorCode, kInvalidRequest);

    m = one(R"({"jsonrpc": "2.0", "method": "x", "id": {"a": 1}})");
    EXPECT_EQ(m.errorCode, kInvalidRequest);

    m = one(R"({"jsonrpc": "2.0", "result": 19, "id": 3})");
    EXPECT_EQ(m.kind, Message::Kind::Response);
    EXPECT_EQ(m.result, 19);

    m = one(R"({"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": "1"})");
    EXPECT_EQ(m.kind, Message::Kind::Response);
    EXPECT_EQ(m.error["code"], -32601);

    m = one("1");
    EXPECT_EQ(m.errorCode, kInvalidRequest);

    bool batch = false;
    auto v = parseMessages("[]", &batch);
    ASSERT_EQ(v.size(), 1u);
    EXPECT_EQ(v[0].errorCode, kInvalidRequest);

    v = parseMessages("[1,2,3]", &batch);
    EXPECT_TRUE(batch);
    ASSERT_EQ(v.size(), 3u);
    for (auto& e : v) EXPECT_EQ(e.errorCode, kInvalidRequest);

    v = parseMessages(R"([{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
                          {"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
                          {"foo": "boo"}])");
    ASSERT_EQ(v.size(), 3u);
    EXPECT_EQ(v[0].kind, Message::Kind::Request);
    EXPECT_EQ(v[1].kind, Message::Kind::Notification);
    EXPECT_EQ(v[2].errorCode, kInvalidRequest);
}

TEST(JsonRpcMessages, DeepNestingIsRefusedNotRecursed) {
    std::string deep(100000, '[');
    auto v = parseMessages(deep);
    ASSERT_EQ(v.size(), 1u);
    EXPECT_EQ(v[0].errorCode, kParseError);
}

TEST(JsonRpcUtil, ConstantTimeEquals) {
    EXPECT_TRUE(constantTimeEquals("secret-token", "secret-token"));
    EXPECT_FALSE(constantTimeEquals("secret-token", "secret-tokeN"));
    EXPECT_FALSE(constantTimeEquals("secret-token", "secret-token2"));
    EXPECT_FALSE(constantTimeEquals("", "x"));
    EXPECT_TRUE(constantTimeEquals("", ""));
    EXPECT_FALSE(constantTimeEquals(std::string("a\0b", 3), "a"));
}

TEST(JsonRpcUtil, Base64MatchesRfc4648Vectors) {
    // RFC 4648 section 10 test vectors.
    const std::pair<const char*, const char*> vectors[] = {
        {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"},
        {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
    for (auto [plain, enc] : vectors) {
        EXPECT_EQ(base64Encode(plain, std::strlen(plain)), enc);
        std::string back;
        ASSERT_TRUE(base64Decode(enc, &back));
        EXPECT_EQ(back, plain);
    }
    std::string all;
    for (int i = 0; i < 256; ++i) all += char(i);
    std::string back;
    ASSERT_TRUE(base64Decode(base64Encode(all.data(), all.size()), &back));
    EXPECT_EQ(back, all);
    EXPECT_FALSE(base64Decode("Zg=", &back));
    EXPECT_FALSE(base64Decode("Z===", &back));
    EXPECT_FALSE(base64Decode("Zm9v!A==", &back));
}

// Issue #12: with "last key wins", {"method":"hello","method":"shutdown"} read as shutdown.
TEST(JsonRpcMessages, DuplicateKeysAtAnyDepthAreAnInvalidRequest) {
    for (const char* body : {R"({"jsonrpc":"2.0","id":1,"method":"hello","method":"shutdown"})",
                             R"({"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"a":2}})",
                             R"({"jsonrpc":"2.0","id":1,"method":"x","params":{"l":[{"k":{"z":1,"z":1}}]}})",
                             R"([{"jsonrpc":"2.0","id":1,"method":"x"},{"jsonrpc":"2.0","id":2,"id":3,"method":"x"}])"}) {
        auto msgs = rpc::parseMessages(body);
        ASSERT_EQ(msgs.size(), 1u) << body;
        EXPECT_EQ(msgs[0].kind, rpc::Message::Kind::Invalid) << body;
        EXPECT_EQ(msgs[0].errorCode, rpc::kInvalidRequest) << body;
        EXPECT_NE(msgs[0].errorMessage.find("duplicate key"), std::string::npos) << msgs[0].errorMessage;
    }
    // Equal keys in different objects, and keys equal to values, are fine.
    auto ok = rpc::parseMessages(R"({"jsonrpc":"2.0","id":1,"method":"id","params":{"id":{"id":1},"x":[{"id":2}]}})");
    ASSERT_EQ(ok.size(), 1u);
    EXPECT_EQ(ok[0].kind, rpc::Message::Kind::Request) << ok[0].errorMessage;
    std::string err;
    EXPECT_TRUE(rpc::parseStrictJson(R"({"a":{"b":1},"c":{"b":2}})", &err).is_object());
    EXPECT_TRUE(rpc::parseStrictJson(R"({"a":1,"b":{"a":1},"a":3})", &err).is_discarded());
}

TEST(JsonRpcMessages, LongBatchIsOneError) {
    std::string batch = "[";
    for (size_t i = 0; i <= rpc::kMaxBatchRequests; ++i) batch += R"({"jsonrpc":"2.0","id":1,"method":"x"},)";
    batch.back() = ']';
    bool isBatch = true;
    auto msgs = rpc::parseMessages(batch, &isBatch);
    ASSERT_EQ(msgs.size(), 1u);
    EXPECT_FALSE(isBatch);
    EXPECT_EQ(msgs[0].errorCode, rpc::kInvalidRequest);
}

TEST(JsonRpcUtil, Fnv1a64UsesTheStandardOffsetBasis) {
    EXPECT_EQ(rpc::kFnv1a64Offset, 14695981039346656037ull);
    EXPECT_EQ(rpc::fnv1a64(""), 0xcbf29ce484222325ull);
    EXPECT_EQ(rpc::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
    EXPECT_EQ(rpc::fnv1a64("foobar"), 0x85944171f73967e8ull);
    EXPECT_EQ(rpc::fnv1a64("bar", rpc::fnv1a64("foo")), rpc::fnv1a64("foobar"));  // continues
}

TEST(JsonRpcFraming, MidFrameAndLimitChanges) {
    rpc::FrameReader r(16);
    EXPECT_FALSE(r.midFrame());
    r.feed("Content-Len");
    EXPECT_EQ(r.next().kind, rpc::FrameEvent::Kind::None);
    EXPECT_TRUE(r.midFrame());
    r.feed("gth: 20\r\n\r\n");
    auto e = r.next();
    EXPECT_EQ(e.kind, rpc::FrameEvent::Kind::Error);  // over 16
    EXPECT_TRUE(r.midFrame());                        // skipping the body
    r.feed(std::string(20, 'x'));
    EXPECT_EQ(r.next().kind, rpc::FrameEvent::Kind::None);
    EXPECT_FALSE(r.midFrame());
    r.setMaxMessageBytes(1 << 20);
    r.feed(rpc::encodeFrameBody(R"({"jsonrpc":"2.0","method":"hello","params":{"pad":"xxxxxxxxxxxxxxxxxxxx"}})"));
    EXPECT_EQ(r.next().kind, rpc::FrameEvent::Kind::Message);
}
