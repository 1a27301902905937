// UTF-8 validation/sanitising and terminal escaping (see text.h).
#include "common/text.h"

#include <cstdint>
#include <cstdio>

namespace ts {

namespace {

// Length of the well-formed UTF-8 sequence at text[i], 0 when ill-formed. *cp gets the code
// point. Follows Table 3-7 of the Unicode standard (well-formed byte sequences).
size_t validSequence(std::string_view text, size_t i, uint32_t* cp) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char c = b(i);
    const size_t left = text.size() - i;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;   // no overlongs
        if (c == 0xED) hi = 0x9F;   // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;   // no overlongs
        if (c == 0xF4) hi = 0x8F;   // nothing above U+10FFFF
    } else {
        return 0;
    }
    if (left < 2 || b(i + 1) < lo || b(i + 1) > hi) return 0;
    for (size_t k = 2; k < len; ++k)
        if (left <= k || (b(i + k) & 0xC0) != 0x80) return 0;
    uint32_t v = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (size_t k = 1; k < len; ++k) v = (v << 6) | (b(i + k) & 0x3F);
    *cp = v;
    return len;
}

// Bytes of the maximal subpart of an ill-formed sequence starting at i (at least 1): a lead
// byte followed by the continuation bytes that could still have been valid.
size_t invalidRun(std::string_view text, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    const unsigned char c = b(i);
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    size_t n = 1;
    if (i + 1 < text.size() && b(i + 1) >= lo && b(i + 1) <= hi) {
        n = 2;
        while (n < len && i + n < text.size() && (b(i + n) & 0xC0) == 0x80) ++n;
    }
    return n;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

bool isValidUtf8(std::string_view text) {
    uint32_t cp;
    for (size_t i = 0; i < text.size();) {
        const size_t n = validSequence(text, i, &cp);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string sanitizeUtf8(std::string_view text) {
    if (isValidUtf8(text)) return std::string(text);
    std::string out;
    out.reserve(text.size() + 8);
    uint32_t cp;
    for (size_t i = 0; i < text.size();) {
        const size_t n = validSequence(text, i, &cp);
        if (n > 0) {
            out.append(text.substr(i, n));
            i += n;
        } else {
            out.append(kReplacement);
            i += invalidRun(text, i);
        }
    }
    return out;
}

std::string escapeControlChars(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    uint32_t cp;
    char buf[16];
    for (size_t i = 0; i < text.size();) {
        const size_t n = validSequence(text, i, &cp);
        if (n == 0) {
            out.append(kReplacement);
            i += invalidRun(text, i);
            continue;
        }
        if (cp < 0x20 || cp == 0x7F) {
            switch (cp) {
                case '\n': out += "\\n"; break;
                case '\r': out += "\\r"; break;
                case '\t': out += "\\t"; break;
                default:
                    std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(cp));
                    out += buf;
            }
        } else if (cp >= 0x80 && cp <= 0x9F) {
            std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(cp));  // C1 controls (CSI = U+009B)
            out += buf;
        } else {
            out.append(text.substr(i, n));
        }
        i += n;
    }
    return out;
}

}  // namespace ts
