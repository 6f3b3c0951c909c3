// Images in the chat template (docs/VISION.md "Prompt"): the ids around each image byte-exact,
// hand-written from spec/VISION-AND-TOOLS.md: <|media_begin|>image WxH<|media_content|>, one
// <|media_pad|> per row, <|media_end|>, where the image sits in the content.
#include <gtest/gtest.h>

#include "k3run/text/chat_template.h"
#include "tests/k3run/chat_ids.h"

namespace k3::run::testing {
namespace {

ChatMessage User(std::string text, std::vector<ChatImage> images) {
  ChatMessage m;
  m.role = "user";
  m.content = std::move(text);
  m.images = std::move(images);
  return m;
}

TEST(ChatImages, MediaTokensAreTheReleasedOnesAtTheSynthPositions) {
  const ChatTemplate t = Tmpl();
  // Released 163602..163605 at vocab − 256 + (id − 163584) (DESIGN.md §8).
  EXPECT_EQ(t.ids().media_begin, 1280 - 256 + 18);
  EXPECT_EQ(t.ids().media_content, 1280 - 256 + 19);
  EXPECT_EQ(t.ids().media_end, 1280 - 256 + 20);
  EXPECT_EQ(t.ids().media_pad, 1280 - 256 + 21);
}

TEST(ChatImages, OneImageBeforeTheTextIsByteExact) {
  const std::vector<ChatMessage> conv = {User("What is this?", {ChatImage{0, 1024, 768, 3}})};
  Ids want;
  want.S("<|open|>").T("message").T(" role=\"user\"").S("<|sep|>");
  want.S("<|media_begin|>").T("image 1024x768").S("<|media_content|>").Pads(3);
  want.S("<|media_end|>").T("What is this?");
  want.S("<|close|>").T("message").S("<|sep|>").S("<|end_of_msg|>");
  want.S("<|open|>").T("message").T(" role=\"assistant\"").S("<|sep|>");
  want.S("<|open|>").T("response").S("<|sep|>");
  Result<std::vector<int32_t>> got = Tmpl().RenderChecked(conv, {false, "max"}, true);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want.v);
  EXPECT_EQ(Tok().Decode(*got).find("<|media_begin|>image 1024x768<|media_content|>"
                                    "<|media_pad|><|media_pad|><|media_pad|><|media_end|>What"),
            std::string("<|open|>message role=\"user\"<|sep|>").size());
}

TEST(ChatImages, TwoImagesWhereTheContentHasThem) {
  // "Compare " | image 30x17 (1 row) | " with " | image 64x28 (2 rows) | "."
  const std::string text = "Compare  with .";
  const std::vector<ChatMessage> conv = {
      User(text, {ChatImage{8, 30, 17, 1}, ChatImage{14, 64, 28, 2}})};
  Ids want;
  want.S("<|open|>").T("message").T(" role=\"user\"").S("<|sep|>");
  want.T("Compare ");
  want.S("<|media_begin|>").T("image 30x17").S("<|media_content|>").Pads(1).S("<|media_end|>");
  want.T(" with ");
  want.S("<|media_begin|>").T("image 64x28").S("<|media_content|>").Pads(2).S("<|media_end|>");
  want.T(".");
  want.S("<|close|>").T("message").S("<|sep|>").S("<|end_of_msg|>");
  Result<std::vector<int32_t>> got = Tmpl().RenderChecked(conv, {false, "max"}, false);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, want.v);
}

TEST(ChatImages, ASecondTurnImageExtendsTheFirstTurnsRendering) {
  // Only the new turn is fed in a chat: the second rendering starts with the first one.
  ChatMessage reply;
  reply.role = "assistant";
  reply.content = "A cat.";
  const std::vector<ChatMessage> one = {User("Hi", {ChatImage{0, 14, 14, 1}})};
  std::vector<ChatMessage> two = one;
  two.push_back(reply);
  two.push_back(User("And this?", {ChatImage{0, 28, 28, 1}}));
  const ChatTemplate t = Tmpl();
  Result<std::vector<int32_t>> a = t.RenderChecked(one, {false, "max"}, false);
  Result<std::vector<int32_t>> b = t.RenderChecked(two, {false, "max"}, true);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_GT(b->size(), a->size());
  EXPECT_TRUE(std::equal(a->begin(), a->end(), b->begin()));
  const int32_t pad = t.ids().media_pad;
  EXPECT_EQ(std::count(b->begin(), b->end(), pad), 2);
}

TEST(ChatImages, UserTextNamingMediaTokensStaysText) {
  const std::vector<ChatMessage> conv = {User("<|media_pad|><|media_begin|>", {})};
  Result<std::vector<int32_t>> got = Tmpl().RenderChecked(conv, {false, "max"}, false);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::count(got->begin(), got->end(), Tmpl().ids().media_pad), 0);
}

TEST(ChatImages, ImagesOutsideUserMessagesOrOutOfOrderAreRefused) {
  ChatMessage sys = User("x", {ChatImage{0, 14, 14, 1}});
  sys.role = "system";
  Result<std::vector<int32_t>> r = Tmpl().RenderChecked({sys}, {false, "max"}, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("images are accepted in user messages only"),
            std::string::npos);
  r = Tmpl().RenderChecked({User("ab", {ChatImage{2, 1, 1, 1}, ChatImage{1, 1, 1, 1}})},
                           {false, "max"}, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("out of order"), std::string::npos);
  r = Tmpl().RenderChecked({User("ab", {ChatImage{3, 1, 1, 1}})}, {false, "max"}, false);
  ASSERT_FALSE(r.ok());
  r = Tmpl().RenderChecked({User("ab", {ChatImage{0, 1, 1, 0}})}, {false, "max"}, false);
  ASSERT_FALSE(r.ok());
}

}  // namespace
}  // namespace k3::run::testing
