// Images through `k3run PREPARED --serve` (docs/SERVER.md "Images"): OpenAI image_url content
// parts with data URLs give the ids of the CLI's --image run (greedy, streamed and not, one and
// two images), an image in a later turn, the prompt cache with images, and each 400 (remote URL,
// bad base64, not an image, truncated, over --max-image-tokens, an image outside a user
// message, no vision) while the server goes on serving.
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/prepared_manifest.h"
#include "k3run/serve/server_images.h"
#include "k3run/vision/image_resize.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/k3run/server_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

using nlohmann::json;

std::string ImagePath(const std::string& name) {
  return std::string(K3_SOURCE_DIR) + "/tests/data/images/" + name;
}

std::string Base64(const std::string& bytes) {
  static const char* kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                       uint32_t{static_cast<uint8_t>(bytes[i + 2])};
    for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (i + 1 < bytes.size()) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string DataUrl(const std::string& file) {
  const bool jpeg = file.size() > 4 && file.substr(file.size() - 4) == ".jpg";
  return std::string("data:image/") + (jpeg ? "jpeg" : "png") + ";base64," +
         Base64(test::ReadWholeFile(ImagePath(file)));
}

json ImagePart(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}, {"detail", "high"}}}};
}
json TextPart(const std::string& text) { return {{"type", "text"}, {"text", text}}; }

json Chat(const json& messages, int max_tokens, bool stream = false) {
  json b = {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (stream) b["stream"] = true;
  return b;
}

json Post(httplib::Client& c, const json& body, int* status, std::string* raw = nullptr) {
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response";
    *status = -1;
    return json();
  }
  *status = r->status;
  if (raw) *raw = r->body;
  return json::parse(r->body, nullptr, false);
}

std::vector<std::string> Tiny(std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {TinyPreparedDir(), "--no-floor", "--ctx", "512"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The CLI's --image run: its generated ids.
std::vector<int32_t> CliImageIds(const std::vector<std::string>& images, const std::string& text,
                                 int gen) {
  std::vector<std::string> args = {TinyPreparedDir(), "--prompt", text, "--gen",
                                   std::to_string(gen)};
  for (const std::string& i : images) args.insert(args.end(), {"--image", ImagePath(i)});
  return CliGeneratedIds(args);
}

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

TEST(ServerImages, OneImageGivesTheCliIdsStreamedAndNot) {
  const std::vector<int32_t> cli = CliImageIds({"rgba_61x47.png"}, "Describe it.", 8);
  ASSERT_FALSE(cli.empty());
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  const json messages = json::array(
      {{{"role", "user"},
        {"content", json::array({ImagePart(DataUrl("rgba_61x47.png")), TextPart("Describe it.")})}}});
  int status = 0;
  const json r = Post(c, Chat(messages, 8), &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["k3"]["generated_ids"].get<std::vector<int32_t>>(), cli);
  const vision::NavitGrid g = vision::ComputeNavitGrid(61, 47);
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int64_t>(), g.tokens);
  std::string raw;
  (void)Post(c, Chat(messages, 8, /*stream=*/true), &status, &raw);
  ASSERT_EQ(status, 200);
  const SseParse sse = ParseSse(raw);
  ASSERT_TRUE(sse.done) << raw;
  EXPECT_EQ(sse.final_chunk["k3"]["generated_ids"].get<std::vector<int32_t>>(), cli);
  // The plan held the tower (PlanBytes(--max-image-tokens)); the request line says what it did.
  const std::string image_line = ", 1 image (" + std::to_string(g.tokens) + " tokens, tower ";
  const std::string log = s.StderrOnceItHas(image_line, 2);  // one per request
  EXPECT_TRUE(Has(log, "+ vision tower ")) << log;
  EXPECT_TRUE(Has(log, image_line)) << log;
}

TEST(ServerImages, TwoImagesInOneMessageGiveTheCliIds) {
  const std::vector<int32_t> cli =
      CliImageIds({"rgba_61x47.png", "rgb_30x17.jpg"}, "Compare them.", 6);
  ASSERT_FALSE(cli.empty());
  ServerProcess s(Tiny());
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  const json messages = json::array(
      {{{"role", "user"},
        {"content", json::array({ImagePart(DataUrl("rgba_61x47.png")),
                                 ImagePart(DataUrl("rgb_30x17.jpg")), TextPart("Compare them.")})}}});
  int status = 0;
  const json r = Post(c, Chat(messages, 6), &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["k3"]["generated_ids"].get<std::vector<int32_t>>(), cli);
}

TEST(ServerImages, AnImageInTheSecondTurnAndThePromptCache) {
  ServerProcess s(Tiny({"--prompt-cache-gb", "1"}));
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  // Turn 1 with an image; turn 2 adds another image (the same size, other pixels or the same).
  const auto turn1 = [](const std::string& image) {
    return json::array({{{"role", "user"},
                         {"content", json::array({TextPart("Look: "), ImagePart(DataUrl(image)),
                                                  TextPart(" What is it?")})}}});
  };
  int status = 0;
  const json a = Post(c, Chat(turn1("rgb_30x17.png"), 4), &status);
  ASSERT_EQ(status, 200) << a.dump();
  const auto turn2 = [&](const std::string& first, const std::string& second) {
    json m = turn1(first);
    m.push_back({{"role", "assistant"}, {"content", "A picture."}});
    m.push_back({{"role", "user"},
                 {"content", json::array({ImagePart(DataUrl(second)), TextPart("And this?")})}});
    return m;
  };
  // Re-sent with the same first image: the turn-1 prompt's snapshot serves it.
  const json same = Post(c, Chat(turn2("rgb_30x17.png", "gray_30x17.jpg"), 4), &status);
  ASSERT_EQ(status, 200) << same.dump();
  EXPECT_GT(same["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  // Same ids and same-size first image with other pixels: nothing cached (the snapshots hold
  // the other image's rows).
  const json other = Post(c, Chat(turn2("rgb_30x17.jpg", "gray_30x17.jpg"), 4), &status);
  ASSERT_EQ(status, 200) << other.dump();
  EXPECT_EQ(other["usage"]["prompt_tokens"], same["usage"]["prompt_tokens"]);
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  // Each equals its own run on a server without a cache.
  ServerProcess cold(Tiny());
  ASSERT_TRUE(cold.WaitReady());
  httplib::Client cc = cold.Client();
  const json same_cold = Post(cc, Chat(turn2("rgb_30x17.png", "gray_30x17.jpg"), 4), &status);
  ASSERT_EQ(status, 200);
  const json other_cold = Post(cc, Chat(turn2("rgb_30x17.jpg", "gray_30x17.jpg"), 4), &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(same["k3"]["generated_ids"], same_cold["k3"]["generated_ids"]);
  EXPECT_EQ(other["k3"]["generated_ids"], other_cold["k3"]["generated_ids"]);
  EXPECT_EQ(same_cold["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  // The tower ran only for images whose rows no snapshot held: the re-sent first image (same)
  // and the re-sent second image (other) were bound from the cache, once each; the cold
  // server held nothing.
  const std::string log = s.StderrOnceItHas(", 1 held)", 3, /*seconds=*/2);  // 3: one too many
  EXPECT_EQ(Occurrences(log, ", 1 held)"), 2u) << log;
  EXPECT_FALSE(Has(cold.stderr_text(), " held)")) << cold.stderr_text();
}

// Each refusal: 400 with an OpenAI error naming the image and the reason; the server serves on.
TEST(ServerImages, BadImagesAre400NamingTheImage) {
  ServerProcess s(Tiny({"--max-image-tokens", "8"}));
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  const auto ask = [&](const json& content, const std::string& role = "user") {
    int status = 0;
    const json r = Post(c, Chat(json::array({{{"role", role}, {"content", content}}}), 2), &status);
    EXPECT_EQ(status, 400) << r.dump();
    return r["error"]["message"].get<std::string>();
  };
  const json hi = TextPart("hi");
  const std::string png = test::ReadWholeFile(ImagePath("rgb_30x17.png"));
  EXPECT_TRUE(Has(ask(json::array({hi, ImagePart("https://example.com/cat.png")})),
                  "image 1 of message 1: remote images are not fetched"));
  EXPECT_TRUE(Has(ask(json::array({ImagePart(DataUrl("rgb_1x1.png")),
                                   ImagePart("data:image/png;base64,iVBOR*w0K")})),
                  "image 2 of message 1: bad base64"));
  EXPECT_TRUE(Has(ask(json::array({ImagePart("data:image/png,abc")})),
                  "image 1 of message 1: malformed data URL"));
  EXPECT_TRUE(Has(ask(json::array({ImagePart("data:image/gif;base64," + Base64("GIF89a....."))})),
                  "image 1 of message 1: not a PNG or JPEG image"));
  EXPECT_TRUE(Has(ask(json::array({ImagePart("data:image/png;base64," +
                                             Base64(png.substr(0, png.size() / 2)))})),
                  "image 1 of message 1: truncated PNG"));
  // 61x47 needs 6 tokens, 30x17 needs 2: together 8 fit, a third image does not.
  const std::string over = ask(json::array({ImagePart(DataUrl("rgba_61x47.png")),
                                            ImagePart(DataUrl("rgb_30x17.png")),
                                            ImagePart(DataUrl("rgb_1x1.png"))}));
  EXPECT_TRUE(Has(over, "image 3 of message 1: a 1x1 image needs 1 tokens, and the request's "
                        "images 9: more than the server's limit of 8 image tokens"))
      << over;
  EXPECT_TRUE(Has(ask(json::array({ImagePart(DataUrl("rgb_1x1.png"))}), "assistant"),
                  "images are accepted in user messages only"));
  // And it still serves.
  int status = 0;
  (void)Post(c, Chat(json::array({{{"role", "user"},
                                   {"content", json::array({ImagePart(DataUrl("rgba_61x47.png")),
                                                            ImagePart(DataUrl("rgb_30x17.png"))})}}}),
                     2),
             &status);
  EXPECT_EQ(status, 200);
}

TEST(ServerImages, ImagesCountInTheContext) {
  ServerProcess s({TinyPreparedDir(), "--no-floor", "--ctx", "24"});
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  int status = 0;
  // 6 image tokens + the image block and the chat markers: over 24 positions with 8 to generate.
  const json r = Post(c, Chat(json::array({{{"role", "user"},
                                            {"content", json::array({ImagePart(DataUrl(
                                                                         "rgba_61x47.png")),
                                                                     TextPart("hi")})}}}),
                              8),
                      &status);
  EXPECT_EQ(status, 400) << r.dump();
  EXPECT_EQ(r["error"]["code"], "context_length_exceeded");
  EXPECT_TRUE(Has(r["error"]["message"].get<std::string>(), "(of which 6 image tokens)"))
      << r.dump();
}

TEST(ServerImages, ATextOnlyDirectorySaysNoVisionAndServesText) {
  test::TempDir tmp;
  CopyTinyWithoutVision(tmp.Join("p"));
  ServerProcess s({tmp.Join("p"), "--no-floor", "--ctx", "256"});
  ASSERT_TRUE(s.WaitReady());
  httplib::Client c = s.Client();
  int status = 0;
  json r = Post(c, Chat(json::array({{{"role", "user"},
                                      {"content", json::array({ImagePart(DataUrl("rgb_1x1.png")),
                                                               TextPart("hi")})}}}),
                        2),
                &status);
  EXPECT_EQ(status, 400);
  const std::string msg = r["error"]["message"];
  EXPECT_TRUE(Has(msg, "image 1 of message 1: no vision: ")) << msg;
  EXPECT_FALSE(Has(msg, tmp.Join("p"))) << msg;  // the server's paths stay its own
  r = Post(c, Chat(json::array({{{"role", "user"}, {"content", "hi"}}}), 2), &status);
  EXPECT_EQ(status, 200) << r.dump();
  EXPECT_FALSE(Has(s.stderr_text(), "+ vision tower ")) << s.stderr_text();
}

TEST(ServerImages, PartsArePlacedAtTheirByteOffset) {
  const json body = {
      {"messages",
       json::array({{{"role", "system"}, {"content", "Be brief."}},
                    {{"role", "user"},
                     {"content", json::array({TextPart("Look: "), ImagePart("data:image/png;base64,AA"),
                                              TextPart(" and "),
                                              {{"type", "image_url"},
                                               {"image_url", "data:image/jpeg;base64,AA"}},
                                              TextPart("?")})}}})}};
  ApiRequest r;
  ApiError e;
  ASSERT_TRUE(ParseApiRequest(body.dump(), Endpoint::kChat, &r, &e)) << e.message;
  EXPECT_EQ(r.messages[1].content, "Look:  and ?");
  ASSERT_EQ(r.images.size(), 2u);
  EXPECT_EQ(r.images[0].message, 1u);
  EXPECT_EQ(r.images[0].index, 1);
  EXPECT_EQ(r.images[0].at, 6u);
  EXPECT_EQ(r.images[1].index, 2);
  EXPECT_EQ(r.images[1].at, 11u);
  EXPECT_EQ(r.images[1].url, "data:image/jpeg;base64,AA");
}

TEST(ServerImages, DataUrlRules) {
  std::string bytes, why;
  EXPECT_TRUE(DecodeDataUrl("data:image/png;base64,aGk=", &bytes, &why)) << why;
  EXPECT_EQ(bytes, "hi");
  EXPECT_TRUE(DecodeDataUrl("data:image/jpeg;base64,aGk", &bytes, &why)) << why;  // unpadded
  EXPECT_EQ(bytes, "hi");
  EXPECT_FALSE(DecodeDataUrl("data:text/plain;base64,aGk=", &bytes, &why));
  EXPECT_TRUE(Has(why, "expected image/png or image/jpeg")) << why;
  EXPECT_FALSE(DecodeDataUrl("data:image/png;base64,a", &bytes, &why));
  EXPECT_TRUE(Has(why, "bad base64")) << why;
  EXPECT_FALSE(DecodeDataUrl("data:image/png;base64,aG k", &bytes, &why));
  EXPECT_TRUE(Has(why, "character 3")) << why;
  EXPECT_FALSE(DecodeDataUrl("file:///etc/passwd", &bytes, &why));
  EXPECT_TRUE(Has(why, "not a data URL")) << why;
  // The decoder's limit follows the token limit (never above Pillow's).
  EXPECT_EQ(ImageLimits(kDefaultMaxImageTokens).max_pixels,
            uint64_t{kDefaultMaxImageTokens} * kImagePixelsPerToken);
  EXPECT_EQ(ImageLimits(int64_t{1} << 20).max_pixels, 178956970u);
}

}  // namespace
}  // namespace k3::run::testing
