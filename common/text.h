// Text that comes from outside (config files, trace files, run files, the command line) is
// arbitrary bytes. JSON output needs valid UTF-8 (nlohmann's dump() throws on anything else)
// and a terminal must not receive raw control characters (escape sequences in a run name
// could rewrite the screen). These helpers are applied where such text enters and where it
// is printed.
#pragma once

#include <string>
#include <string_view>

namespace ts {

// True when text is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool isValidUtf8(std::string_view text);

// text with every ill-formed UTF-8 sequence replaced by U+FFFD (one per maximal invalid
// subpart, as the Unicode standard recommends). Valid text comes back unchanged.
std::string sanitizeUtf8(std::string_view text);

// For printing to a terminal: C0 controls, DEL and C1 controls become visible escapes
// (\n, \t, \x1b, \u009b), a backslash stays a backslash; invalid UTF-8 becomes U+FFFD.
std::string escapeControlChars(std::string_view text);

}  // namespace ts
