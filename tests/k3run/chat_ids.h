// Hand-written expected ids for the chat template's tests, on the tiny synth tokenizer:
// S = a control token by content, T = a text segment encoded without specials.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string_view>
#include <vector>

#include "k3run/text/chat_template.h"
#include "tests/k3run/engine_fixture.h"

namespace k3::run::testing {

inline const tok::Tokenizer& Tok() { return TinyTokenizer(); }

inline ChatTemplate Tmpl() {
  Result<ChatTemplate> t = ChatTemplate::Create(&Tok(), "synth");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

struct Ids {
  std::vector<int32_t> v;
  Ids& S(std::string_view content) {
    const std::optional<int32_t> id = Tok().SpecialId(content);
    EXPECT_TRUE(id.has_value()) << content;
    v.push_back(id.value_or(-1));
    return *this;
  }
  Ids& T(std::string_view text) {
    const std::vector<int32_t> ids = Tok().Encode(text, false);
    v.insert(v.end(), ids.begin(), ids.end());
    return *this;
  }
  Ids& Pads(int n) {  // n × <|media_pad|>
    for (int i = 0; i < n; ++i) S("<|media_pad|>");
    return *this;
  }
};

}  // namespace k3::run::testing
