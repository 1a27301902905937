// JSON-RPC 2.0 over a byte stream with LSP-style framing (docs/protocol.md):
//   "Content-Length: N\r\n" [other headers] "\r\n" then N bytes of UTF-8 JSON.
// The frame reader is fed arbitrary bytes (a socket, a pipe, a fuzzer) and never throws or
// aborts: a malformed header or an oversize body becomes a FrameEvent::Error, after which the
// reader resynchronises (skips the oversize body, or drops the bad header up to its blank line).
// parseMessage() classifies one body as request / notification / response or an error with the
// JSON-RPC error code the server must answer with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ts::sessions::rpc {

// Standard JSON-RPC 2.0 error codes.
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;
// Server-defined codes (-32000..-32099 is reserved for implementation-defined server errors).
inline constexpr int kUnauthorized = -32001;     // TCP: first request must authenticate
inline constexpr int kMessageTooLarge = -32002;  // Content-Length over the limit
inline constexpr int kRunNotFound = -32003;
inline constexpr int kRunFailedToStart = -32004;
inline constexpr int kInvalidConfig = -32005;
inline constexpr int kBusy = -32006;             // too many runs / connections

inline constexpr size_t kDefaultMaxMessageBytes = 16u << 20;  // 16 MiB body
inline constexpr size_t kMaxHeaderBytes = 8u << 10;           // one header block
// Before a TCP connection has authenticated only one small hello/authenticate is read.
inline constexpr size_t kPreAuthMaxMessageBytes = 64u << 10;  // 64 KiB body
// Requests in one batch; a longer batch is refused whole (-32600), never answered per element.
inline constexpr size_t kMaxBatchRequests = 1024;

// Frames one JSON value: "Content-Length: N\r\n\r\n<body>".
std::string encodeFrame(const nlohmann::json& message);
std::string encodeFrameBody(std::string_view body);

struct FrameEvent {
    enum class Kind { None, Message, Error };
    Kind kind = Kind::None;
    std::string body;     // Message: the JSON text
    int errorCode = 0;    // Error: kParseError (bad header) or kMessageTooLarge
    std::string error;    // Error: what was wrong, for the client
};

// Incremental LSP-style frame reader. Invariant: m_buf holds unconsumed bytes that start at a
// header (or mid-header); m_skip > 0 means we are discarding an oversize body.
class FrameReader {
public:
    explicit FrameReader(size_t maxMessageBytes = kDefaultMaxMessageBytes)
        : m_maxMessageBytes(maxMessageBytes) {}

    void feed(const char* data, size_t n);
    void feed(std::string_view s) { feed(s.data(), s.size()); }
    // The next complete message or error, or Kind::None when more bytes are needed.
    FrameEvent next();
    size_t bufferedBytes() const { return m_buf.size() - m_pos; }
    // True while part of a frame (header or body, or an oversize body being skipped) has
    // arrived but not all of it: what a read timeout for slow senders measures.
    bool midFrame() const { return bufferedBytes() > 0 || m_skip > 0; }
    // The body limit for frames whose header has not been read yet (the agent raises it once
    // a connection has authenticated).
    void setMaxMessageBytes(size_t n) { m_maxMessageBytes = n; }

private:
    void compact();

    size_t m_maxMessageBytes;
    std::string m_buf;
    size_t m_pos = 0;        // consumed prefix of m_buf
    size_t m_skip = 0;       // bytes of an oversize body still to discard
    std::vector<FrameEvent> m_pending;  // errors reported before the next message
};

// One classified JSON-RPC message.
struct Message {
    enum class Kind { Request, Notification, Response, Invalid };
    Kind kind = Kind::Invalid;
    nlohmann::json id;        // Request/Response: string, integer or null
    std::string method;       // Request/Notification
    nlohmann::json params;    // object/array, or null when absent
    nlohmann::json result;    // Response (success)
    nlohmann::json error;     // Response (error object) — or for Invalid: unused
    int errorCode = 0;        // Invalid: kParseError / kInvalidRequest
    std::string errorMessage; // Invalid: human text
};

// Classifies one JSON value (already parsed) as a message.
Message classify(nlohmann::json value);  // by value: an rvalue's params/result are moved
// Parses one body. A body that is not JSON gives Invalid/kParseError; a JSON array (batch)
// gives one Message per element (empty array, or more than kMaxBatchRequests elements -> one
// Invalid/kInvalidRequest). An object with the same key twice, at any depth, gives one
// Invalid/kInvalidRequest for the whole body: a message means exactly one thing (with
// "last key wins", {"method":"hello","method":"shutdown"} would read as shutdown).
std::vector<Message> parseMessages(std::string_view body, bool* isBatch = nullptr);
// Parses JSON text, refusing duplicate keys and nesting deeper than 64. On failure returns a
// discarded value and says why in *error.
nlohmann::json parseStrictJson(std::string_view text, std::string* error);

// Builders.
nlohmann::json makeRequest(const nlohmann::json& id, const std::string& method,
                           const nlohmann::json& params = nullptr);
nlohmann::json makeNotification(const std::string& method, const nlohmann::json& params = nullptr);
nlohmann::json makeResult(const nlohmann::json& id, nlohmann::json result);
nlohmann::json makeError(const nlohmann::json& id, int code, const std::string& message,
                         const nlohmann::json& data = nullptr);

// Constant-time comparison of secrets (time depends only on the lengths, never on where the
// strings first differ).
bool constantTimeEquals(std::string_view a, std::string_view b);

// FNV-1a 64 (offset basis 14695981039346656037, prime 1099511628211): the fetch_run checksum.
// Continue a running hash by passing the previous value as h.
inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;
uint64_t fnv1a64(std::string_view data, uint64_t h = kFnv1a64Offset);

// Base64 (RFC 4648, with padding) for run-file chunks.
std::string base64Encode(const void* data, size_t n);
bool base64Decode(std::string_view text, std::string* out);

}  // namespace ts::sessions::rpc
