// Text from outside (request fields, file names and keys, protocol bytes) made
// safe to put in a log line or an error message: cut to a short prefix, with
// everything that could forge a line or drive a terminal escaped.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lazykv {

// `text` with every byte of these escaped as \xNN: C0 and C1 control
// characters, DEL, invalid UTF-8, the Unicode line and paragraph separators
// and the bidirectional overrides. Other UTF-8 is kept as it is. At most
// `max_bytes` of `text` are shown, cut at a character boundary and followed
// by "...".
std::string printable(std::string_view text, size_t max_bytes = 120);

// printable(text, max_bytes) in single quotes.
std::string quote(std::string_view text, size_t max_bytes = 120);

}  // namespace lazykv
