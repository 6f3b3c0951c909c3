// Text from outside k3 (a Hub listing's file names, HTTP header values, tensor names) as shown in
// a message, a log line or on a terminal.
//
// Why: such text may hold a newline (a forged second log line), an ESC sequence (moving the
// cursor, recolouring or retitling the terminal) or bytes that are not UTF-8. Printable() makes
// it one inert line that still reads naturally when it is ordinary text.
//
// Rule: these bytes become \xNN (two uppercase hex digits), everything else passes unchanged:
//  - C0 control bytes (0x00-0x1F) and DEL (0x7F);
//  - the UTF-8 encodings of the C1 controls U+0080-U+009F (some terminals obey U+009B as CSI),
//    each byte escaped;
//  - every byte of an ill-formed UTF-8 sequence (common/utf8.h's maximal subparts);
//  - the backslash, so that the output is unambiguous: input "\x1B" (4 characters) shows as
//    "\x5Cx1B" and never as the escape of one ESC byte;
//  - the bytes listed in `also` (ASCII; e.g. the quote a caller puts around the text).
//
// Thread safety: pure function.
#pragma once

#include <string>
#include <string_view>

namespace k3 {

std::string Printable(std::string_view s, std::string_view also = {});

// Appends the escape Printable uses for one byte: \xNN with two uppercase hex digits.
void AppendByteEscape(std::string& out, unsigned char byte);

}  // namespace k3
