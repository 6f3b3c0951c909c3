// common/printable.h: one test per escaping rule.
#include "common/printable.h"

#include <gtest/gtest.h>

#include <string>

namespace k3 {
namespace {

TEST(Printable, OrdinaryTextAndUtf8Unchanged) {
  EXPECT_EQ(Printable("model-00001-of-000096.safetensors"), "model-00001-of-000096.safetensors");
  EXPECT_EQ(Printable("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(Printable(""), "");
}

TEST(Printable, C0ControlsAndDelEscaped) {
  EXPECT_EQ(Printable("a\nb"), "a\\x0Ab");
  EXPECT_EQ(Printable("\x1B[2Jx"), "\\x1B[2Jx");
  EXPECT_EQ(Printable(std::string("\0\x1F\x7F", 3)), "\\x00\\x1F\\x7F");
}

TEST(Printable, BackslashEscapedSoOutputIsUnambiguous) {
  EXPECT_EQ(Printable("\\x1B"), "\\x5Cx1B");
  EXPECT_NE(Printable("\\x1B"), Printable("\x1B"));
}

TEST(Printable, C1ControlsEscapedEachByte) {
  EXPECT_EQ(Printable("\xC2\x9B" "31m"), "\\xC2\\x9B31m");  // U+009B CSI
  EXPECT_EQ(Printable("\xC2\x80"), "\\xC2\\x80");
  EXPECT_EQ(Printable("\xC2\xA0"), "\xC2\xA0");  // U+00A0 is printable
}

TEST(Printable, IllFormedUtf8EscapedPerByte) {
  EXPECT_EQ(Printable("a\xFF" "b"), "a\\xFFb");
  EXPECT_EQ(Printable("\xE2\x82"), "\\xE2\\x82");       // truncated sequence
  EXPECT_EQ(Printable("\xC0\xAF"), "\\xC0\\xAF");       // overlong '/'
  EXPECT_EQ(Printable("\xED\xA0\x80"), "\\xED\\xA0\\x80");  // surrogate
}

TEST(Printable, AlsoEscapesTheCallersQuote) {
  EXPECT_EQ(Printable("it's \"x\"", "\"'"), "it\\x27s \\x22x\\x22");
  EXPECT_EQ(Printable("it's", ""), "it's");
}

}  // namespace
}  // namespace k3
