// The incremental completion parser (k3run/text/tool_calls.h) on the synth tokenizer: completions
// with tool calls fed with every text piece split at every byte, one byte per token, and cut off
// after every id; one test per malformed structure; a fuzz loop over random id sequences.
#include "k3run/text/tool_calls.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "common/env.h"
#include "tests/k3run/engine_fixture.h"

namespace k3::run::testing {
namespace {

using json = nlohmann::json;

bool Has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

const tok::Tokenizer& Tok() { return TinyTokenizer(); }

const ChatTemplate& Tmpl() {
  static const std::unique_ptr<ChatTemplate> t = [] {
    Result<ChatTemplate> r = ChatTemplate::Create(&Tok(), "synth");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::make_unique<ChatTemplate>(std::move(r).value());
  }();
  return *t;
}

int32_t Special(std::string_view content) {
  const std::optional<int32_t> id = Tok().SpecialId(content);
  EXPECT_TRUE(id.has_value()) << content;
  return id.value_or(-1);
}

// The single-byte ranks of the byte-level vocabulary: any byte string as one token per byte.
std::vector<int32_t> ByteIds(std::string_view s) {
  static const std::map<unsigned char, int32_t> by_byte = [] {
    std::map<unsigned char, int32_t> m;
    for (int32_t id = 0; id < static_cast<int32_t>(Tok().vocab_size()); ++id) {
      const std::string_view b = Tok().TokenBytes(id);
      if (b.size() == 1 && !tok::IsAddedToken(Tok(), id)) {
        m.emplace(static_cast<unsigned char>(b[0]), id);
      }
    }
    EXPECT_EQ(m.size(), 256u);
    return m;
  }();
  std::vector<int32_t> out;
  for (char c : s) out.push_back(by_byte.at(static_cast<unsigned char>(c)));
  return out;
}

// Encode would replace a split character's bytes by U+FFFD: such a part goes byte by byte.
// Memoised: the split tests encode the same pieces thousands of times.
std::vector<int32_t> TextIds(std::string_view s) {
  static std::map<std::string, std::vector<int32_t>, std::less<>> memo;
  if (auto it = memo.find(s); it != memo.end()) return it->second;
  std::vector<int32_t> ids =
      SanitizeUtf8(s) != s ? ByteIds(s) : Tok().Encode(s, /*allow_special=*/false);
  memo.emplace(std::string(s), ids);
  return ids;
}

// A completion as pieces: control tokens by content and text segments.
struct Piece {
  bool control;
  std::string text;
};
struct Pieces {
  std::vector<Piece> v;
  Pieces& S(std::string_view content) {
    v.push_back({true, std::string(content)});
    return *this;
  }
  Pieces& T(std::string_view text) {
    v.push_back({false, std::string(text)});
    return *this;
  }
  Pieces& Open(std::string_view tag, std::string_view attrs = "") {
    S("<|open|>").T(tag);
    if (!attrs.empty()) T(attrs);
    return S("<|sep|>");
  }
  Pieces& Close(std::string_view tag) { return S("<|close|>").T(tag).S("<|sep|>"); }
  Pieces& Arg(std::string_view key, std::string_view type, std::string_view value) {
    Open("argument", " key=\"" + std::string(key) + "\" type=\"" + std::string(type) + "\"");
    return T(value).Close("argument");
  }
};

enum class Split { kNone, kAt, kPerByte };

// The ids of `p`: each text piece encoded alone; with kAt, piece `which` in two parts cut at
// byte `at`; with kPerByte, every text byte one token.
std::vector<int32_t> IdsOf(const Pieces& p, Split split = Split::kNone, size_t which = 0,
                           size_t at = 0) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < p.v.size(); ++i) {
    const Piece& piece = p.v[i];
    std::vector<int32_t> ids;
    if (piece.control) {
      ids = {Special(piece.text)};
    } else if (split == Split::kPerByte) {
      ids = ByteIds(piece.text);
    } else if (split == Split::kAt && i == which) {
      ids = TextIds(std::string_view(piece.text).substr(0, at));
      const std::vector<int32_t> rest = TextIds(std::string_view(piece.text).substr(at));
      ids.insert(ids.end(), rest.begin(), rest.end());
    } else {
      ids = TextIds(piece.text);
    }
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

struct ParserRun {
  std::vector<CompletionDelta> deltas;
  ParsedCompletion result;
};

ParserRun Feed(const std::vector<int32_t>& ids, bool thinking, uint64_t seed = 7) {
  CompletionParser parser(Tmpl(), CompletionParserOptions{thinking, seed});
  ParserRun r;
  for (int32_t id : ids) r.deltas.push_back(parser.Feed(id));
  r.result = parser.Finish();
  r.deltas.push_back(r.result.tail);
  return r;
}

// The streaming contract: the text deltas join to the result's text; each call's first fragment
// carries its id and name; its fragments (with Finish's tail) join to its arguments.
void ExpectStreamConsistent(const ParserRun& r, const std::string& context) {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  for (const CompletionDelta& d : r.deltas) {
    reasoning += d.reasoning;
    content += d.content;
    for (const ToolCallFragment& f : d.tool_calls) {
      if (!f.id.empty()) {
        ASSERT_EQ(f.index, static_cast<int64_t>(calls.size())) << context;
        calls.push_back({f.id, f.name, ""});
      }
      ASSERT_FALSE(calls.empty()) << context << ": a fragment before its call's start";
      ASSERT_EQ(f.index, static_cast<int64_t>(calls.size()) - 1) << context;
      calls.back().arguments += f.arguments;
    }
  }
  EXPECT_EQ(reasoning, r.result.reasoning) << context;
  EXPECT_EQ(content, r.result.content) << context;
  ASSERT_EQ(calls.size(), r.result.tool_calls.size()) << context;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].id, r.result.tool_calls[i].id) << context;
    EXPECT_EQ(calls[i].name, r.result.tool_calls[i].name) << context;
    EXPECT_EQ(calls[i].arguments, r.result.tool_calls[i].arguments) << context;
  }
}

void ExpectArgumentsParse(const ParsedCompletion& r, const std::string& context) {
  for (const ToolCall& c : r.tool_calls) {
    EXPECT_TRUE(json::parse(c.arguments, nullptr, false).is_object())
        << context << ": call " << c.name << " arguments " << c.arguments;
  }
}

void ExpectSame(const ParsedCompletion& got, const ParsedCompletion& want,
                const std::string& context) {
  EXPECT_EQ(FinishKindName(got.finish), FinishKindName(want.finish)) << context;
  EXPECT_EQ(got.error, want.error) << context;
  EXPECT_EQ(got.reasoning, want.reasoning) << context;
  EXPECT_EQ(got.content, want.content) << context;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << context;
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].id, want.tool_calls[i].id) << context;
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name) << context;
    EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments) << context;
  }
}

// ---- the completions ----

struct Case {
  std::string name;
  bool thinking;
  Pieces pieces;
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

Pieces Ending(Pieces p) { return p.Close("tools").Close("message").S("<|end_of_msg|>"); }

std::vector<Case> Cases() {
  std::vector<Case> out;
  {  // strings with quotes, newlines, backslashes, non-ASCII; every non-string type
    Pieces p;
    p.T("I should call the tool.").Close("think").Open("response").T("Let me check.");
    p.Close("response").Open("tools").Open("call", " tool=\"get_weather\" index=\"1\"");
    p.Arg("city", "string", "Toronto \"the 6ix\"\nON");
    p.Arg("note", "string", "naïve 東京 🎉\\ tab\t");
    p.Arg("days", "number", "3").Arg("exp", "number", "1e2");
    p.Arg("opts", "object", "{\"a\": [1, 2]}").Arg("exact", "boolean", "true");
    p.Arg("nothing", "null", "null").Arg("list", "array", "[\"x\"]");
    p.Close("call");
    out.push_back({"one call, every type", true, Ending(p), "I should call the tool.",
                   "Let me check.",
                   {{"get_weather",
                     R"({"city":"Toronto \"the 6ix\"\nON","note":"naïve 東京 🎉\\ tab\t",)"
                     R"("days":3,"exp":1e2,"opts":{"a": [1, 2]},"exact":true,"nothing":null,)"
                     R"("list":["x"]})"}}});
  }
  {  // two calls, the second a json block; no arguments on a third
    Pieces p;
    p.Close("response").Open("tools");
    p.Open("call", " tool=\"search\" index=\"1\"").Arg("q", "string", "kimi k3").Close("call");
    p.Open("call", " tool=\"calc\" index=\"2\"").Open("json", " type=\"object\"");
    p.T("{\"expr\": \"1+2\", \"precise\": false}").Close("json").Close("call");
    p.Open("call", " tool=\"noop\" index=\"3\"").Close("call");
    out.push_back({"three calls, a json block", false, Ending(p), "", "",
                   {{"search", R"({"q":"kimi k3"})"},
                    {"calc", R"({"expr": "1+2", "precise": false})"},
                    {"noop", "{}"}}});
  }
  {  // a character cut short, values that do not parse as their type
    Pieces p;
    p.T("ok").Close("response").Open("tools").Open("call", " tool=\"f\" index=\"1\"");
    p.Arg("s", "string", "ok\xe6\x9d").Arg("n", "number", "12abc");
    p.Arg("m", "number", "\"x\"").Arg("o", "object", "[1]").Arg("e", "null", "");
    p.Close("call");
    out.push_back({"partial UTF-8, bad values", false, Ending(p), "", "ok",
                   {{"f", R"({"s":"ok�","n":"12abc","m":"\"x\"","o":"[1]","e":""})"}}});
  }
  {  // attribute escapes in the name and key
    Pieces p;
    p.Close("response").Open("tools");
    p.Open("call", " tool=\"a&amp;b&quot;\" index=\"1\"").Arg("k&quot;", "string", "v");
    p.Close("call");
    out.push_back({"escaped attributes", false, Ending(p), "", "",
                   {{"a&b\"", R"({"k\"":"v"})"}}});
  }
  return out;
}

TEST(ToolCallParser, CompletionsParseToTheirCalls) {
  for (const Case& c : Cases()) {
    const ParserRun r = Feed(IdsOf(c.pieces), c.thinking);
    ASSERT_EQ(r.result.finish, FinishKind::kToolCalls) << c.name << ": " << r.result.error;
    EXPECT_EQ(r.result.reasoning, c.reasoning) << c.name;
    EXPECT_EQ(r.result.content, c.content) << c.name;
    ASSERT_EQ(r.result.tool_calls.size(), c.calls.size()) << c.name;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(r.result.tool_calls[i].name, c.calls[i].first) << c.name;
      EXPECT_EQ(r.result.tool_calls[i].arguments, c.calls[i].second) << c.name;
      EXPECT_EQ(r.result.tool_calls[i].id, ToolCallId(7, static_cast<int64_t>(i))) << c.name;
    }
    ExpectStreamConsistent(r, c.name);
    ExpectArgumentsParse(r.result, c.name);
  }
}

// Every text piece cut at every byte (each part its own tokens), and every byte its own token:
// the same result, and no markup in the text.
TEST(ToolCallParser, EverySplitOfEveryTextPieceGivesTheSameResult) {
  for (const Case& c : Cases()) {
    const ParsedCompletion want = Feed(IdsOf(c.pieces), c.thinking).result;
    const ParserRun per_byte = Feed(IdsOf(c.pieces, Split::kPerByte), c.thinking);
    ExpectSame(per_byte.result, want, c.name + " per byte");
    ExpectStreamConsistent(per_byte, c.name + " per byte");
    for (size_t i = 0; i < c.pieces.v.size(); ++i) {
      if (c.pieces.v[i].control) continue;
      for (size_t at = 0; at <= c.pieces.v[i].text.size(); ++at) {
        const std::string context = c.name + " piece " + std::to_string(i) + " at " +
                                    std::to_string(at);
        const ParserRun r = Feed(IdsOf(c.pieces, Split::kAt, i, at), c.thinking);
        ExpectSame(r.result, want, context);
        ExpectStreamConsistent(r, context);
        EXPECT_FALSE(Has(r.result.content + r.result.reasoning, "<|")) << context;
        EXPECT_FALSE(Has(r.result.content + r.result.reasoning, "tool=")) << context;
      }
    }
  }
}

// Cut off after every id: length, text a prefix of the whole, every call's arguments still a
// JSON object, calls closed before the cut exactly as in the whole completion.
TEST(ToolCallParser, CutOffAfterEveryIdLeavesParseableArguments) {
  for (const Case& c : Cases()) {
    const std::vector<int32_t> ids = IdsOf(c.pieces, Split::kPerByte);
    const ParsedCompletion whole = Feed(ids, c.thinking).result;
    for (size_t n = 0; n < ids.size(); ++n) {
      const std::string context = c.name + " cut at " + std::to_string(n);
      const ParserRun r =
          Feed(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(n)), c.thinking);
      ASSERT_EQ(r.result.finish, FinishKind::kLength) << context << ": " << r.result.error;
      EXPECT_FALSE(r.result.error.empty()) << context;
      EXPECT_EQ(whole.content.compare(0, r.result.content.size(), r.result.content), 0)
          << context;
      ExpectStreamConsistent(r, context);
      ExpectArgumentsParse(r.result, context);
      ASSERT_LE(r.result.tool_calls.size(), whole.tool_calls.size()) << context;
      // What was streamed before the cut (the tail aside) is a prefix of the whole arguments.
      std::vector<std::string> streamed(r.result.tool_calls.size());
      for (size_t k = 0; k + 1 < r.deltas.size(); ++k) {
        for (const ToolCallFragment& f : r.deltas[k].tool_calls) {
          streamed[static_cast<size_t>(f.index)] += f.arguments;
        }
      }
      for (size_t i = 0; i < streamed.size(); ++i) {
        EXPECT_EQ(whole.tool_calls[i].arguments.compare(0, streamed[i].size(), streamed[i]), 0)
            << context << ": " << streamed[i];
      }
    }
  }
}

TEST(ToolCallParser, CutInsideAStringClosesItExactly) {
  Pieces p;
  p.Close("response").Open("tools").Open("call", " tool=\"f\" index=\"1\"");
  p.Arg("n", "number", "42").Open("argument", " key=\"city\" type=\"string\"").T("Tor\xc3");
  const ParserRun r = Feed(IdsOf(p, Split::kPerByte), false);
  EXPECT_EQ(r.result.finish, FinishKind::kLength);
  ASSERT_EQ(r.result.tool_calls.size(), 1u);
  // The held half character becomes U+FFFD at the close.
  EXPECT_EQ(r.result.tool_calls[0].arguments, R"({"n":42,"city":"Tor�"})");
  EXPECT_EQ(r.result.tail.tool_calls.size(), 1u);
  EXPECT_TRUE(Has(r.result.error, "cut off inside argument \"city\" of call 1")) << r.result.error;
}

// String values stream as their bytes arrive (a split character waits for its last byte).
TEST(ToolCallParser, StringArgumentsStreamAsTheyArrive) {
  Pieces p;
  p.Close("response").Open("tools").Open("call", " tool=\"f\" index=\"1\"");
  p.Open("argument", " key=\"city\" type=\"string\"");
  CompletionParser parser(Tmpl(), CompletionParserOptions{false, 1});
  std::string joined;
  auto feed = [&](const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      for (const ToolCallFragment& f : parser.Feed(id).tool_calls) joined += f.arguments;
    }
  };
  feed(IdsOf(p));
  EXPECT_EQ(joined, "{\"city\":\"");
  feed(ByteIds("Tor"));
  EXPECT_EQ(joined, "{\"city\":\"Tor");
  feed(ByteIds("\xc3"));
  EXPECT_EQ(joined, "{\"city\":\"Tor");
  feed(ByteIds("\xa9\""));
  EXPECT_EQ(joined, "{\"city\":\"Tor\xc3\xa9\\\"");
}

TEST(ToolCallParser, ParseAndStreamingAgree) {
  for (const Case& c : Cases()) {
    Result<Completion> parsed = Tmpl().Parse(IdsOf(c.pieces), c.thinking);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    const ParsedCompletion streamed = Feed(IdsOf(c.pieces, Split::kPerByte), c.thinking, 0).result;
    EXPECT_EQ(parsed->content, streamed.content);
    EXPECT_EQ(parsed->reasoning, streamed.reasoning);
    ASSERT_EQ(parsed->tool_calls.size(), streamed.tool_calls.size());
    for (size_t i = 0; i < streamed.tool_calls.size(); ++i) {
      EXPECT_EQ(parsed->tool_calls[i].id, streamed.tool_calls[i].id);
      EXPECT_EQ(parsed->tool_calls[i].arguments, streamed.tool_calls[i].arguments);
    }
  }
}

TEST(ToolCallParser, AnswersWithoutCallsFinishWithStop) {
  Pieces p;
  p.T("thought").Close("think").Open("response").T("Hi!").Close("response").Close("message");
  p.S("[EOS]");
  const ParserRun r = Feed(IdsOf(p), true);
  EXPECT_EQ(r.result.finish, FinishKind::kStop);
  EXPECT_EQ(r.result.content, "Hi!");
  EXPECT_EQ(r.result.reasoning, "thought");
  EXPECT_TRUE(r.result.tool_calls.empty());
}

TEST(ToolCallParser, CallIdsAreDeterministicPerSeedAndIndex) {
  EXPECT_EQ(ToolCallId(5, 0), ToolCallId(5, 0));
  EXPECT_NE(ToolCallId(5, 0), ToolCallId(5, 1));
  EXPECT_NE(ToolCallId(5, 0), ToolCallId(6, 0));
  EXPECT_NE(ToolCallId(5, 1), ToolCallId(6, 0));
  EXPECT_EQ(ToolCallId(5, 0).size(), 5u + 16u);
  EXPECT_EQ(ToolCallId(5, 0).substr(0, 5), "call_");
}

// ---- rendering and parsing agree ----

std::string RandomJson(std::mt19937& rng, int depth);

std::string Space(std::mt19937& rng) {
  static const char* const kSpaces[] = {"", "", " ", "\n", "\t ", "  "};
  return kSpaces[rng() % 6];
}

std::string RandomObject(std::mt19937& rng, int depth) {
  static const char* const kKeys[] = {"a", "b c", "k\\\"q", "ключ", "&amp;", "x", "x"};
  std::string out = "{" + Space(rng);
  for (size_t n = rng() % 4, i = 0; i < n; ++i) {
    out += (i ? "," : "") + Space(rng) + "\"" + kKeys[rng() % 7] + "\"" + Space(rng) + ":" +
           Space(rng) + RandomJson(rng, depth + 1) + Space(rng);
  }
  return out + "}";
}

std::string RandomJson(std::mt19937& rng, int depth) {
  static const char* const kStrings[] = {
      "plain", "q\\\"uote", "back\\\\slash", "new\\nline", "\\u00e9\\u6771", "ünï 東京 🎉",
      "<|close|>argument<|sep|>", "", "\\u0000x", "&quot;&amp;", "tab\\t"};
  static const char* const kNumbers[] = {"0", "-1", "3.5", "1e2", "-0", "1E+2",
                                         "12345678901234567890", "2.5e-7"};
  static const char* const kLiterals[] = {"true", "false", "null"};
  switch (rng() % (depth > 2 ? 3 : 5)) {
    case 0: return std::string("\"") + kStrings[rng() % 11] + "\"";
    case 1: return kNumbers[rng() % 8];
    case 2: return kLiterals[rng() % 3];
    case 3: return RandomObject(rng, depth);
    default: {
      std::string out = "[" + Space(rng);
      for (size_t n = rng() % 3, i = 0; i < n; ++i) {
        out += (i ? "," : "") + RandomJson(rng, depth + 1) + Space(rng);
      }
      return out + "]";
    }
  }
}

// The completion ids of an assistant message with `calls`, as the template renders it.
std::vector<int32_t> RenderedCompletion(const std::vector<ToolCall>& calls, bool thinking) {
  const TemplateOptions o{thinking, "max"};
  ChatMessage reply{"assistant", "ok", "hm"};
  reply.tool_calls = calls;
  Result<std::vector<int32_t>> prompt = Tmpl().RenderChecked({{"user", "u", ""}}, o, true);
  Result<std::vector<int32_t>> all = Tmpl().RenderChecked({{"user", "u", ""}, reply}, o, false);
  EXPECT_TRUE(prompt.ok() && all.ok());
  if (!prompt.ok() || !all.ok() || all->size() < prompt->size()) return {};
  return std::vector<int32_t>(all->begin() + static_cast<long>(prompt->size()), all->end());
}

// Random objects (nested values, every literal form, odd spacing, escapes, duplicate keys) render
// as arguments and parse back to the same JSON.
TEST(ToolCallParser, RenderedArgumentsParseBackToTheSameJson) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 200 && !::testing::Test::HasFailure(); ++iter) {
    const std::string args = RandomObject(rng, 0);
    ASSERT_TRUE(json::parse(args, nullptr, false).is_object()) << args;
    const bool thinking = iter % 2 == 0;
    Result<Completion> r = Tmpl().Parse(RenderedCompletion({{"x", "f", args}}, thinking), thinking);
    ASSERT_TRUE(r.ok()) << args << ": " << r.status().ToString();
    ASSERT_EQ(r->tool_calls.size(), 1u);
    EXPECT_EQ(json::parse(r->tool_calls[0].arguments), json::parse(args))
        << args << " came back as " << r->tool_calls[0].arguments;
  }
}

// Arbitrary argument text never breaks rendering: an object round-trips, anything else becomes
// a json block, which the parser refuses (a call's arguments must be an object).
TEST(ToolCallParser, ArbitraryArgumentTextRendersSafely) {
  const std::string alphabet = "{}[]\":,\\ a1e.-tnu\xef\xbb\xbf\xff";
  std::mt19937 rng(5);
  for (int iter = 0; iter < 600 && !::testing::Test::HasFailure(); ++iter) {
    std::string args;
    for (size_t n = rng() % 12; n > 0; --n) args += alphabet[rng() % alphabet.size()];
    Result<Completion> r = Tmpl().Parse(RenderedCompletion({{"x", "f", args}}, false), false);
    const json want = args.empty() ? json::object() : json::parse(args, nullptr, false);
    if (want.is_object()) {
      ASSERT_TRUE(r.ok()) << args << ": " << r.status().ToString();
      EXPECT_EQ(json::parse(r->tool_calls[0].arguments), want) << args;
    } else {
      EXPECT_TRUE(!r.ok() && Has(r.status().message(), "is not a JSON object"))
          << args << ": " << (r.ok() ? r->tool_calls[0].arguments : r.status().message());
    }
  }
}

// ---- malformed: one test per rule; each names what and where ----

Pieces InCall() {
  Pieces p;
  p.Close("response").Open("tools").Open("call", " tool=\"f\" index=\"1\"");
  return p;
}

// Feeds `p` (and ids after it); expects malformed with `what` in the message and no tool
// fragment after the failing id.
void ExpectMalformed(const Pieces& p, const std::string& what, bool thinking = false) {
  const std::vector<int32_t> ids = IdsOf(p);
  CompletionParser parser(Tmpl(), CompletionParserOptions{thinking, 0});
  bool failed = false;
  for (int32_t id : ids) {
    const CompletionDelta d = parser.Feed(id);
    if (failed) {
      EXPECT_TRUE(d.empty()) << what << ": a delta after the failure";
    }
    failed = parser.malformed();
  }
  EXPECT_TRUE(parser.done());
  const ParsedCompletion r = parser.Finish();
  EXPECT_EQ(r.finish, FinishKind::kMalformed) << what;
  EXPECT_TRUE(Has(r.error, what)) << r.error;
  EXPECT_TRUE(Has(r.error, "at position ")) << r.error;
  EXPECT_TRUE(r.tail.empty());
}

TEST(ToolCallParserMalformed, EndInsideACall) {
  Pieces p = InCall();
  p.Arg("a", "string", "x").S("<|end_of_msg|>");
  const size_t at = IdsOf(p).size() - 1;
  ExpectMalformed(p, "control id " + std::to_string(Special("<|end_of_msg|>")) +
                         " at position " + std::to_string(at) + " inside call 1");
}

TEST(ToolCallParserMalformed, CallNeverClosesBeforeTheMessage) {
  Pieces p = InCall();
  p.Arg("a", "string", "x").Close("message").S("<|end_of_msg|>");
  ExpectMalformed(p, "unexpected tag <|close|>message<|sep|>");
}

TEST(ToolCallParserMalformed, JsonBlockThatIsNotAnObject) {
  for (const char* text : {"[1, 2]", "{\"a\":", ""}) {
    Pieces p = InCall();
    p.Open("json", " type=\"object\"").T(text).Close("json").Close("call");
    ExpectMalformed(Ending(p), "the json block of call 1 at position");
  }
}

TEST(ToolCallParserMalformed, UnknownTag) {
  Pieces p;
  p.Close("response").Open("tools").Open("invoke", " tool=\"f\"").Close("invoke");
  ExpectMalformed(Ending(p), "unexpected tag <|open|>invoke tool=\"f\"<|sep|>");
}

TEST(ToolCallParserMalformed, StrayControlIdInsideAValue) {
  Pieces p = InCall();
  p.Open("argument", " key=\"city\" type=\"string\"").T("To").S("[BOS]").T("ronto");
  ExpectMalformed(p, "inside argument \"city\" of call 1");
}

TEST(ToolCallParserMalformed, StrayControlIdInsideAHeader) {
  Pieces p;
  p.Close("response").S("<|open|>").T("to").S("<|close|>").T("ols").S("<|sep|>");
  ExpectMalformed(p, "inside the tag header opened at position");
}

TEST(ToolCallParserMalformed, MissingOrUnknownAttributes) {
  for (const char* attrs : {" tool=\"f\"", " index=\"1\"", " tool=\"\" index=\"1\"",
                            " tool=\"f\" index=\"one\"", " tool=\"f\" index=\"1\" x=\"y\""}) {
    Pieces p;
    p.Close("response").Open("tools").Open("call", attrs).Close("call");
    ExpectMalformed(Ending(p), "needs exactly tool=\"NAME\" index=\"N\"");
  }
  Pieces p = InCall();
  p.Arg("k", "text", "v").Close("call");
  ExpectMalformed(Ending(p), "needs exactly key=\"K\" type=");
}

TEST(ToolCallParserMalformed, BadAttributeSyntax) {
  Pieces p;
  p.Close("response").Open("tools").Open("call", " tool=f index=\"1\"").Close("call");
  ExpectMalformed(Ending(p), "malformed tag <|open|>call tool=f");
}

TEST(ToolCallParserMalformed, TextBetweenCalls) {
  Pieces p = InCall();
  p.Close("call").T("\n").Open("call", " tool=\"g\" index=\"2\"").Close("call");
  ExpectMalformed(Ending(p), "text at position");
}

TEST(ToolCallParserMalformed, EmptyToolsSection) {
  Pieces p;
  p.Close("response").Open("tools").Close("tools").Close("message").S("<|end_of_msg|>");
  ExpectMalformed(p, "holds no call");
}

TEST(ToolCallParserMalformed, ArgumentAfterAJsonBlock) {
  Pieces p = InCall();
  p.Open("json").T("{}").Close("json").Arg("a", "string", "x").Close("call");
  ExpectMalformed(Ending(p), "expected close(call)");
}

TEST(ToolCallParserMalformed, IdsAfterTheEnd) {
  Pieces p = InCall();
  p.Close("call");
  p = Ending(p);
  p.T("more");
  ExpectMalformed(p, "after the end id at position");
}

// ---- fuzz: random sequences of control ids, tag texts and text never crash ----

TEST(ToolCallParserFuzz, RandomIdSequencesNeverCrashAndKeepTheContract) {
  std::vector<std::vector<int32_t>> alphabet;
  for (const char* c : {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "[EOS]", "[BOS]"}) {
    alphabet.push_back({Special(c)});
  }
  for (const char* t : {"think", "response", "tools", "call", " tool=\"f\" index=\"1\"", "json",
                        "argument", " key=\"k\" type=\"string\"", " key=\"n\" type=\"number\"",
                        " key=\"o\" type=\"object\"", " type=\"object\"", "message", "{\"a\":1}",
                        "12", "x\"y", "\xe6", "\x9d\x8e"}) {
    alphabet.push_back(TextIds(t));
  }
  alphabet.push_back({-1});
  alphabet.push_back({1 << 30});
  std::mt19937 rng(1234);
  auto check = [](const std::vector<int32_t>& ids, bool thinking, uint64_t seed,
                  const std::string& context) {
    const ParserRun r = Feed(ids, thinking, seed);
    ExpectStreamConsistent(r, context);
    if (r.result.finish != FinishKind::kMalformed) ExpectArgumentsParse(r.result, context);
  };
  // Random sequences over the alphabet.
  for (int iter = 0; iter < 20000 && !::testing::Test::HasFailure(); ++iter) {
    std::vector<int32_t> ids;
    const size_t n = rng() % 48;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<int32_t>& a = alphabet[rng() % alphabet.size()];
      ids.insert(ids.end(), a.begin(), a.end());
    }
    check(ids, rng() % 2 == 1, static_cast<uint64_t>(iter), "random " + std::to_string(iter));
  }
  // Valid completions with a few ids deleted, inserted or replaced: deep states, then damage.
  std::vector<std::pair<const Case*, std::vector<int32_t>>> valid;
  const std::vector<Case> cases = Cases();
  for (const Case& c : cases) {
    valid.emplace_back(&c, IdsOf(c.pieces));
    valid.emplace_back(&c, IdsOf(c.pieces, Split::kPerByte));
  }
  for (int iter = 0; iter < 20000 && !::testing::Test::HasFailure(); ++iter) {
    const auto& [c, original] = valid[rng() % valid.size()];
    std::vector<int32_t> ids = original;
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0 && !ids.empty(); --edits) {
      const size_t at = rng() % ids.size();
      const std::vector<int32_t>& a = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: ids.erase(ids.begin() + static_cast<long>(at)); break;
        case 1: ids.insert(ids.begin() + static_cast<long>(at), a.begin(), a.end()); break;
        default: ids[at] = a[0]; break;
      }
    }
    check(ids, c->thinking, 0, "mutated " + c->name + " " + std::to_string(iter));
  }
}

}  // namespace
}  // namespace k3::run::testing
