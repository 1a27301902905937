// JSON-RPC 2.0 framing and message classification (see jsonrpc.h, docs/protocol.md).
#include "sessions/jsonrpc.h"

#include <algorithm>
#include <cctype>
#include <unordered_set>

namespace ts::sessions::rpc {

using nlohmann::json;

namespace {

// Deeper nesting is refused before parsing: nothing in the protocol nests more than a few
// levels, and a bounded depth keeps every later recursive walk (dump, copy) cheap and safe.
constexpr int kMaxNestingDepth = 64;

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

// Max [ / { depth outside strings; stops counting once over the limit.
int nestingDepth(std::string_view body) {
    int depth = 0, maxDepth = 0;
    bool inString = false, escaped = false;
    for (char c : body) {
        if (inString) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') inString = false;
            continue;
        }
        if (c == '"') inString = true;
        else if (c == '[' || c == '{') {
            maxDepth = std::max(maxDepth, ++depth);
            if (maxDepth > kMaxNestingDepth) return maxDepth;
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    return maxDepth;
}

Message invalid(int code, std::string message, json id = nullptr) {
    Message m;
    m.kind = Message::Kind::Invalid;
    m.errorCode = code;
    m.errorMessage = std::move(message);
    m.id = std::move(id);
    return m;
}

bool validId(const json& id) {
    // JSON-RPC 2.0: String, Number (SHOULD NOT contain fractional parts) or Null.
    return id.is_string() || id.is_number_integer() || id.is_number_unsigned() || id.is_null();
}

}  // namespace

std::string encodeFrameBody(std::string_view body) {
    std::string out = "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
    out.append(body);
    return out;
}

std::string encodeFrame(const json& message) {
    // error_handler::replace: invalid UTF-8 from a child's output never throws here.
    return encodeFrameBody(message.dump(-1, ' ', false, json::error_handler_t::replace));
}

void FrameReader::compact() {
    if (m_pos > 0 && m_pos >= m_buf.size() / 2) {
        m_buf.erase(0, m_pos);
        m_pos = 0;
    }
}

void FrameReader::feed(const char* data, size_t n) {
    if (m_skip > 0) {
        // Discard an oversize body without ever buffering it.
        size_t drop = std::min(m_skip, n);
        m_skip -= drop;
        data += drop;
        n -= drop;
    }
    if (n > 0) m_buf.append(data, n);
}

FrameEvent FrameReader::next() {
    if (!m_pending.empty()) {
        FrameEvent e = std::move(m_pending.front());
        m_pending.erase(m_pending.begin());
        return e;
    }
    if (m_skip > 0) {
        size_t drop = std::min(m_skip, m_buf.size() - m_pos);
        m_skip -= drop;
        m_pos += drop;
        compact();
        if (m_skip > 0) return {};
    }
    std::string_view avail(m_buf.data() + m_pos, m_buf.size() - m_pos);
    size_t headerEnd = avail.substr(0, kMaxHeaderBytes + 4).find("\r\n\r\n");
    if (headerEnd == std::string_view::npos) {
        if (avail.size() > kMaxHeaderBytes) {
            // No blank line within the header limit: drop what we have and start over.
            m_pos = m_buf.size();
            compact();
            FrameEvent e;
            e.kind = FrameEvent::Kind::Error;
            e.errorCode = kParseError;
            e.error = "header block longer than " + std::to_string(kMaxHeaderBytes) +
                      " bytes without a blank line";
            return e;
        }
        return {};
    }
    std::string_view header = avail.substr(0, headerEnd);
    const size_t bodyStart = headerEnd + 4;

    // Parse "Name: value" lines; only Content-Length matters (Content-Type is accepted).
    bool haveLength = false;
    uint64_t length = 0;
    std::string headerError;
    size_t lineStart = 0;
    while (lineStart <= header.size() && headerError.empty()) {
        size_t lineEnd = header.find("\r\n", lineStart);
        if (lineEnd == std::string_view::npos) lineEnd = header.size();
        std::string_view line = header.substr(lineStart, lineEnd - lineStart);
        lineStart = lineEnd + 2;
        if (line.empty()) continue;
        size_t colon = line.find(':');
        if (colon == std::string_view::npos) {
            headerError = "header line without ':'";
            break;
        }
        std::string name = lower(trim(line.substr(0, colon)));
        std::string_view value = trim(line.substr(colon + 1));
        if (name != "content-length") continue;
        if (value.empty() || value.size() > 18 ||
            !std::all_of(value.begin(), value.end(),
                         [](char c) { return c >= '0' && c <= '9'; })) {
            headerError = "Content-Length is not a decimal number";
            break;
        }
        uint64_t v = 0;
        for (char c : value) v = v * 10 + static_cast<uint64_t>(c - '0');
        if (haveLength && v != length) {
            headerError = "conflicting Content-Length headers";
            break;
        }
        haveLength = true;
        length = v;
    }
    if (headerError.empty() && !haveLength) headerError = "missing Content-Length header";
    if (!headerError.empty()) {
        // Resynchronise after the blank line that ended this bad header.
        m_pos += bodyStart;
        compact();
        FrameEvent e;
        e.kind = FrameEvent::Kind::Error;
        e.errorCode = kParseError;
        e.error = headerError;
        return e;
    }
    if (length > m_maxMessageBytes) {
        m_pos += bodyStart;
        m_skip = static_cast<size_t>(length);
        size_t drop = std::min(m_skip, m_buf.size() - m_pos);
        m_skip -= drop;
        m_pos += drop;
        compact();
        FrameEvent e;
        e.kind = FrameEvent::Kind::Error;
        e.errorCode = kMessageTooLarge;
        e.error = "message of " + std::to_string(length) + " bytes exceeds the limit of " +
                  std::to_string(m_maxMessageBytes) + " bytes";
        return e;
    }
    if (avail.size() - bodyStart < length) return {};
    FrameEvent e;
    e.kind = FrameEvent::Kind::Message;
    e.body.assign(avail.substr(bodyStart, static_cast<size_t>(length)));
    m_pos += bodyStart + static_cast<size_t>(length);
    compact();
    return e;
}

Message classify(json v) {
    if (!v.is_object()) return invalid(kInvalidRequest, "a JSON-RPC message must be an object");
    json id = nullptr;
    bool hasId = v.contains("id");
    if (hasId) {
        id = v["id"];
        if (!validId(id)) return invalid(kInvalidRequest, "\"id\" must be a string, integer or null");
    }
    auto version = v.find("jsonrpc");
    if (version == v.end() || !version->is_string() || *version != "2.0")
        return invalid(kInvalidRequest, "\"jsonrpc\" must be \"2.0\"", id);

    auto method = v.find("method");
    if (method != v.end()) {
        if (!method->is_string()) return invalid(kInvalidRequest, "\"method\" must be a string", id);
        Message m;
        m.method = method->get<std::string>();
        auto params = v.find("params");
        if (params != v.end()) {
            if (!params->is_object() && !params->is_array())
                return invalid(kInvalidRequest, "\"params\" must be an object or an array", id);
            m.params = std::move(*params);
        }
        m.kind = hasId ? Message::Kind::Request : Message::Kind::Notification;
        m.id = id;
        return m;
    }
    bool hasResult = v.contains("result"), hasError = v.contains("error");
    if (hasId && (hasResult != hasError)) {
        Message m;
        m.kind = Message::Kind::Response;
        m.id = id;
        if (hasResult) {
            m.result = std::move(v["result"]);
        } else {
            m.error = std::move(v["error"]);
            if (!m.error.is_object() || !m.error.contains("code") ||
                !m.error["code"].is_number_integer())
                return invalid(kInvalidRequest, "\"error\" must be an object with an integer code", id);
        }
        return m;
    }
    return invalid(kInvalidRequest, "neither a request (\"method\") nor a response (\"result\"/\"error\")", id);
}

json parseStrictJson(std::string_view text, std::string* error) {
    if (nestingDepth(text) > kMaxNestingDepth) {
        if (error) *error = "JSON nested deeper than " + std::to_string(kMaxNestingDepth) + " levels";
        return json(json::value_t::discarded);
    }
    // One key set per object still open; keys belong to the innermost one (arrays hold none).
    std::vector<std::unordered_set<std::string>> open;
    std::string duplicate;
    bool haveDuplicate = false;
    auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
        switch (event) {
            case json::parse_event_t::object_start: open.emplace_back(); break;
            case json::parse_event_t::object_end:
                if (!open.empty()) open.pop_back();
                break;
            case json::parse_event_t::key:
                if (!open.empty() && parsed.is_string() && !open.back().insert(parsed.get_ref<const std::string&>()).second &&
                    !haveDuplicate) {
                    haveDuplicate = true;
                    duplicate = parsed.get_ref<const std::string&>();
                }
                break;
            default: break;
        }
        return true;
    };
    json v = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
    if (v.is_discarded()) {
        if (error) *error = "body is not valid JSON";
        return v;
    }
    if (haveDuplicate) {
        if (duplicate.size() > 64) duplicate = duplicate.substr(0, 64) + "...";
        if (error)
            *error = "duplicate key " + json(duplicate).dump(-1, ' ', false, json::error_handler_t::replace) +
                     " in an object; every key may appear once";
        return json(json::value_t::discarded);
    }
    return v;
}

std::vector<Message> parseMessages(std::string_view body, bool* isBatch) {
    if (isBatch) *isBatch = false;
    std::string error;
    json v = parseStrictJson(body, &error);
    if (v.is_discarded()) {
        const bool dup = error.rfind("duplicate key", 0) == 0;
        return {invalid(dup ? kInvalidRequest : kParseError, error)};
    }
    if (!v.is_array()) return {classify(std::move(v))};
    if (isBatch) *isBatch = true;
    if (v.empty()) return {invalid(kInvalidRequest, "empty batch")};
    if (v.size() > kMaxBatchRequests) {
        if (isBatch) *isBatch = false;  // one error object, not an array of them
        return {invalid(kInvalidRequest, "batch of " + std::to_string(v.size()) + " requests; at most " +
                                             std::to_string(kMaxBatchRequests) + " per batch")};
    }
    std::vector<Message> out;
    out.reserve(v.size());
    for (json& e : v) out.push_back(classify(std::move(e)));
    return out;
}

json makeRequest(const json& id, const std::string& method, const json& params) {
    json j = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}};
    if (!params.is_null()) j["params"] = params;
    return j;
}

json makeNotification(const std::string& method, const json& params) {
    json j = {{"jsonrpc", "2.0"}, {"method", method}};
    if (!params.is_null()) j["params"] = params;
    return j;
}

json makeResult(const json& id, json result) {
    return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

json makeError(const json& id, int code, const std::string& message, const json& data) {
    json err = {{"code", code}, {"message", message}};
    if (!data.is_null()) err["data"] = data;
    return {{"jsonrpc", "2.0"}, {"id", id}, {"error", err}};
}

bool constantTimeEquals(std::string_view a, std::string_view b) {
    // Walk the longer length in full; the accumulated difference includes the length mismatch.
    const size_t n = std::max(a.size(), b.size());
    volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
    for (size_t i = 0; i < n; ++i) {
        unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
        unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
        diff = static_cast<unsigned char>(diff | (x ^ y));
    }
    return diff == 0;
}

uint64_t fnv1a64(std::string_view data, uint64_t h) {
    for (unsigned char c : data) {
        h ^= c;
        h *= 1099511628211ull;
    }
    return h;
}

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64Encode(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::string out;
    out.reserve((n + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t(p[i]) << 16) | (uint32_t(p[i + 1]) << 8) | p[i + 2];
        out += kB64[(v >> 18) & 63];
        out += kB64[(v >> 12) & 63];
        out += kB64[(v >> 6) & 63];
        out += kB64[v & 63];
    }
    if (i < n) {
        uint32_t v = uint32_t(p[i]) << 16;
        if (i + 1 < n) v |= uint32_t(p[i + 1]) << 8;
        out += kB64[(v >> 18) & 63];
        out += kB64[(v >> 12) & 63];
        out += i + 1 < n ? kB64[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

bool base64Decode(std::string_view text, std::string* out) {
    auto value = [](char c) -> int {
        if (c >= 'A' && c <= 'Z') return c - 'A';
        if (c >= 'a' && c <= 'z') return c - 'a' + 26;
        if (c >= '0' && c <= '9') return c - '0' + 52;
        if (c == '+') return 62;
        if (c == '/') return 63;
        return -1;
    };
    if (text.size() % 4 != 0) return false;
    out->clear();
    out->reserve(text.size() / 4 * 3);
    for (size_t i = 0; i < text.size(); i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; ++k) {
            char c = text[i + static_cast<size_t>(k)];
            if (c == '=' && i + 4 == text.size() && k >= 2) {
                v[k] = 0;
                ++pad;
            } else {
                if (pad > 0) return false;  // data after padding
                v[k] = value(c);
                if (v[k] < 0) return false;
            }
        }
        uint32_t w = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
        out->push_back(static_cast<char>((w >> 16) & 0xFF));
        if (pad < 2) out->push_back(static_cast<char>((w >> 8) & 0xFF));
        if (pad < 1) out->push_back(static_cast<char>(w & 0xFF));
    }
    return true;
}

}  // namespace ts::sessions::rpc
