// /image in `k3run --chat` on the tiny fixture (docs/VISION.md "CLI and chat"): a first-turn image
// gives the ids of the --image --prompt run; an image in the second turn feeds only that turn's
// ids and equals re-reading the conversation from the start; --history records the files and a
// resume refuses one that changed or is gone; bad files and a text-only directory are notices
// and the chat goes on.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "formats/prepared_manifest.h"
#include "k3run/text/chat_history.h"
#include "k3run/text/tokenizer.h"
#include "k3run/vision/image_resize.h"
#include "tests/k3run/engine_fixture.h"
#include "tests/support/files.h"
#include "tests/support/temp_dir.h"

namespace k3::run::testing {
namespace {

std::string Image(const std::string& name) {
  return std::string(K3_SOURCE_DIR) + "/tests/data/images/" + name;
}

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

ChatTemplate Template() {
  static const tok::Tokenizer* t = [] {
    Result<tok::Tokenizer> r =
        tok::Tokenizer::Load(Env::Default(), JoinPath(TinyCheckpointDir(), "tiktoken.model"),
                             JoinPath(TinyCheckpointDir(), "tokenizer_config.json"), 1280);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return new tok::Tokenizer(std::move(r).value());
  }();
  Result<ChatTemplate> tmpl = ChatTemplate::Create(t, "synth");
  EXPECT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  return std::move(tmpl).value();
}

std::vector<ChatMessage> History(const std::string& path) {
  Result<std::vector<ChatMessage>> h = LoadHistory(Env::Default(), path);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  return h.ok() ? *h : std::vector<ChatMessage>();
}

// The N of every "[N new ids, ...]" line: what each turn fed.
std::vector<int64_t> NewIds(const std::string& err) {
  std::vector<int64_t> out;
  static const std::regex re(R"(\[(\d+) new ids, )");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back(std::stoll((*it)[1]));
  }
  return out;
}

TEST(ChatImageCli, FirstTurnImageGivesTheIdsOfTheImagePromptRun) {
  test::TempDir tmp;
  const std::string hist = tmp.Join("h.jsonl");
  for (const bool think : {true, false}) {
    std::filesystem::remove(hist);
    std::filesystem::remove(hist + ".state");
    std::vector<std::string> chat_args = {TinyPreparedDir(), "--chat", "--gen", "6", "--history",
                                          hist, "--no-floor"};
    std::vector<std::string> cli_args = {TinyPreparedDir(), "--prompt", "Describe it.", "--gen",
                                         "6", "--image", Image("rgba_61x47.png"), "--image",
                                         Image("rgb_30x17.jpg"), "--no-floor", "--out",
                                         tmp.Join("r.json")};
    if (!think) {
      chat_args.push_back("--no-think");
      cli_args.push_back("--no-think");
    }
    const CliRun chat = RunCliArgs(chat_args, Stdin({"/image " + Image("rgba_61x47.png"),
                                                     "/image " + Image("rgb_30x17.jpg"),
                                                     "Describe it."}));
    const CliRun cli = RunCliArgs(cli_args);
    ASSERT_EQ(chat.exit_code, 0) << chat.stderr_text;
    ASSERT_EQ(cli.exit_code, 0) << cli.stderr_text;
    const nlohmann::json report = nlohmann::json::parse(test::ReadWholeFile(tmp.Join("r.json")));
    const std::vector<ChatMessage> h = History(hist);
    ASSERT_EQ(h.size(), 2u);
    ASSERT_EQ(h[0].images.size(), 2u);
    EXPECT_EQ(h[0].images[0].path, Image("rgba_61x47.png"));
    EXPECT_EQ(h[0].images[0].width, 61u);
    EXPECT_EQ(h[0].images[0].tokens, vision::ComputeNavitGrid(61, 47).tokens);
    EXPECT_EQ(h[0].images[0].file_hash.size(), 32u);
    EXPECT_EQ(h[0].images[1].path, Image("rgb_30x17.jpg"));
    // The same prompt ids (the images then the text, the generation prompt), the same reply.
    const std::vector<int32_t> rendered = Template().Render({h[0]}, {think, "max"}, true);
    EXPECT_EQ(report["prompt_ids"].get<std::vector<int32_t>>(), rendered) << think;
    EXPECT_EQ(report["generated_ids"].get<std::vector<int32_t>>(), h[1].ids) << think;
    const int64_t tokens = report["images"]["tokens"].get<int64_t>();
    EXPECT_TRUE(Has(chat.stderr_text, "; 2 images: " + std::to_string(tokens) + " image tokens, "
                                      "tower "))
        << chat.stderr_text;
  }
}

TEST(ChatImageCli, SecondTurnImageFeedsOnlyTheNewTurnAndEqualsReReading) {
  test::TempDir tmp;
  const std::string hist = tmp.Join("h.jsonl");
  const CliRun chat = RunCliArgs(
      {TinyPreparedDir(), "--chat", "--gen", "5", "--history", hist, "--no-floor"},
      Stdin({"Hello there.", "/image " + Image("rgba_61x47.png"), "/image", "And this?"}));
  ASSERT_EQ(chat.exit_code, 0) << chat.stderr_text;
  EXPECT_TRUE(Has(chat.stderr_text, "image 1: " + Image("rgba_61x47.png") + ", 61x47, "))
      << "/image alone lists the waiting image: " << chat.stderr_text;
  const std::vector<ChatMessage> h = History(hist);
  ASSERT_EQ(h.size(), 4u);
  EXPECT_TRUE(h[0].images.empty());
  ASSERT_EQ(h[2].images.size(), 1u);
  // Turn 1 left the rendered first turn and its reply but the reply's last token in the
  // sequence; turn 2 fed the rest: the reply's last token, the message with its image, the
  // generation prompt.
  const ChatTemplate tmpl = Template();
  const size_t turn1 = tmpl.Render({h[0]}, {true, "max"}, true).size();
  const size_t turn2 = tmpl.Render({h[0], h[1], h[2]}, {true, "max"}, true).size();
  const size_t held = turn1 + h[1].ids.size() - 1;
  const std::vector<int64_t> fed = NewIds(chat.stderr_text);
  ASSERT_EQ(fed.size(), 2u) << chat.stderr_text;
  EXPECT_EQ(fed[0], static_cast<int64_t>(turn1));
  EXPECT_EQ(fed[1], static_cast<int64_t>(turn2 - held));
  EXPECT_TRUE(Has(chat.stderr_text, "[prompt " + std::to_string(turn2 - held) + " ids in "))
      << chat.stderr_text;
  // The tower ran once, for turn 2's image only.
  const std::string one = "; 1 image: " + std::to_string(h[2].images[0].tokens) + " image tokens";
  EXPECT_TRUE(Has(chat.stderr_text, one)) << chat.stderr_text;
  EXPECT_EQ(chat.stderr_text.find(one), chat.stderr_text.rfind(one));

  // Re-reading the conversation from the start (no state file) encodes the image again and
  // gives turn 2's reply again.
  std::ofstream(hist, std::ios::trunc) << SerializeHistory({h[0], h[1], h[2]});
  std::filesystem::remove(hist + ".state");
  const CliRun resumed = RunCliArgs(
      {TinyPreparedDir(), "--chat", "--gen", "5", "--history", hist, "--no-floor"}, Stdin({}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.stderr_text;
  EXPECT_EQ(NewIds(resumed.stderr_text), std::vector<int64_t>{static_cast<int64_t>(turn2)});
  EXPECT_TRUE(Has(resumed.stderr_text, one)) << resumed.stderr_text;
  const std::vector<ChatMessage> again = History(hist);
  ASSERT_EQ(again.size(), 4u);
  EXPECT_EQ(again[3].ids, h[3].ids);
}

TEST(ChatImageCli, ResumeRefusesAnImageThatChangedOrIsGone) {
  test::TempDir tmp;
  const std::string hist = tmp.Join("h.jsonl");
  const std::string picture = tmp.Join("picture.png");
  std::filesystem::copy_file(Image("rgb_30x17.png"), picture);
  const CliRun chat =
      RunCliArgs({TinyPreparedDir(), "--chat", "--gen", "2", "--history", hist, "--no-floor"},
                 Stdin({"/image " + picture, "What is it?"}));
  ASSERT_EQ(chat.exit_code, 0) << chat.stderr_text;
  const std::string saved = test::ReadWholeFile(hist);
  EXPECT_TRUE(Has(saved, "\"images\":[{\"path\":\"" + picture + "\",\"width\":30,\"height\":17,"))
      << saved;
  // Same size, other pixels: the hash tells.
  std::filesystem::copy_file(Image("gray_30x17.jpg"), picture,
                             std::filesystem::copy_options::overwrite_existing);
  const CliRun changed = RunCliArgs(
      {TinyPreparedDir(), "--chat", "--gen", "2", "--history", hist, "--no-floor"}, Stdin({"x"}));
  EXPECT_EQ(changed.exit_code, 2);
  EXPECT_TRUE(Has(changed.stderr_text, hist + ":1: the image " + picture +
                                           " changed since it was attached"))
      << changed.stderr_text;
  std::filesystem::remove(picture);
  const CliRun gone = RunCliArgs(
      {TinyPreparedDir(), "--chat", "--gen", "2", "--history", hist, "--no-floor"}, Stdin({"x"}));
  EXPECT_EQ(gone.exit_code, 2);
  EXPECT_TRUE(Has(gone.stderr_text, hist + ":1: the image " + picture + " cannot be read"))
      << gone.stderr_text;
  EXPECT_EQ(test::ReadWholeFile(hist), saved);  // nothing rewritten
}

TEST(ChatImageCli, BadImagesAreNamedAndTheChatGoesOn) {
  test::TempDir tmp;
  const std::string hist = tmp.Join("h.jsonl");
  const std::string text = tmp.WriteFile("notes.png", "just some text, not an image\n");
  const std::string png = test::ReadWholeFile(Image("rgb_30x17.png"));
  const std::string cut = tmp.WriteFile("cut.png", png.substr(0, png.size() / 2));
  const CliRun r = RunCliArgs(
      {TinyPreparedDir(), "--chat", "--gen", "2", "--history", hist, "--no-floor"},
      Stdin({"/image " + text, "/image " + tmp.Join("missing.png"), "/image " + cut, "/image",
             "hi"}));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, text + ": not a PNG or JPEG")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "missing.png")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, cut + ": truncated PNG")) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "no image waiting")) << r.stderr_text;
  const std::vector<ChatMessage> h = History(hist);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_TRUE(h[0].images.empty());
  EXPECT_FALSE(Has(r.stderr_text, "image tokens")) << r.stderr_text;
}

TEST(ChatImageCli, ATextOnlyDirectorySaysNoVisionAndTheChatGoesOn) {
  test::TempDir tmp;
  CopyTinyWithoutVision(tmp.Join("p"));
  const std::string hist = tmp.Join("h.jsonl");
  const CliRun r = RunCliArgs({tmp.Join("p"), "--chat", "--gen", "2", "--history", hist,
                               "--no-floor"},
                              Stdin({"/image " + Image("rgb_1x1.png"), "hi"}));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_TRUE(Has(r.stderr_text, "/image " + Image("rgb_1x1.png") + ": " + tmp.Join("p") +
                                     ": no vision"))
      << r.stderr_text;
  const std::vector<ChatMessage> h = History(hist);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_TRUE(h[0].images.empty());
}

}  // namespace
}  // namespace k3::run::testing
