// Kimi K3 tool calls in XTML (docs/TOOLS.md): the rendering helpers the chat template uses for
// declarations, calls and results, and the incremental parser of a completion.
//
// A tools section inside an assistant message (control tokens in <|…|>):
//   open(tools) CALL+ close(tools)
//   CALL = open(call, tool="NAME" index="I") (ARG* | JSONBLOCK) close(call)
//   ARG  = open(argument, key="K" type="T") value close(argument)
//          T = string (the value raw, unquoted) | number | boolean | null | object | array (JSON)
//   JSONBLOCK = open(json [type="object"]) text close(json)   (arguments not a one-level object)
// Attribute values escape `&` → `&amp;` then `"` → `&quot;`.
//
// Goals of CompletionParser: fed one id at a time, it gives OpenAI's streaming deltas (reasoning,
// content, tool-call starts, argument fragments) such that
//   - markup (control tokens and the tag headers between them) is never text, at any split;
//   - the fragments of a call joined are always valid JSON text of an object, and equal the
//     call's final arguments: streamed and non-streamed results are the same;
//   - a cut-off completion (no END: the token limit) still yields parseable arguments;
//   - a malformed one stops the tool deltas and says what and where (the completion's position
//     of the offending id), never crashes.
// Non-goals: checking names or arguments against the declared tools (the grammar constrains
// generation; the server checks), stop strings and UTF-8 hold-back of content (the caller's: text
// deltas are raw bytes, as Completion's).
// Thread safety: the free functions are pure; a CompletionParser is one request's, used by one
// thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "k3run/text/chat_template.h"
#include "k3run/text/tokenizer.h"
#include "k3run/text/utf8.h"

namespace k3::run {

// ---- rendering ----

// Appends XTML to an id vector: control ids as found by content, each text piece one segment
// encoded with allow_special = false.
class XtmlWriter {
 public:
  XtmlWriter(const tok::Tokenizer* tok, const ChatIds& ids, std::vector<int32_t>* out)
      : tok_(tok), ids_(ids), out_(out) {}
  void Text(std::string_view text);
  // open(tag, attrs): `attrs` is the attribute text, e.g. Attr("role", "user") (one segment).
  void Open(std::string_view tag, std::string_view attrs = "");
  void Close(std::string_view tag);
  void EndOfMessage() { out_->push_back(ids_.end_of_msg); }
  void Ids(const std::vector<int32_t>& ids) { out_->insert(out_->end(), ids.begin(), ids.end()); }

 private:
  const tok::Tokenizer* tok_;
  ChatIds ids_;
  std::vector<int32_t>* out_;
};

std::string EscapeAttr(std::string_view value);    // & → &amp; then " → &quot;
std::string UnescapeAttr(std::string_view value);  // &quot; → " then &amp; → &
std::string Attr(std::string_view key, std::string_view value);  // ` key="escaped value"`

// Python's json.dumps(json.loads(text), sort_keys=True, separators=(',', ':'),
// ensure_ascii=False). kInvalid naming `what` when `text` is not JSON. Differs from Python only
// for integers outside 64 bits (nlohmann keeps them as doubles) and NaN/Infinity (refused).
Result<std::string> CompactJson(std::string_view text, std::string_view what);

// open(tools) CALL+ close(tools) for an assistant's calls (none: nothing). Each call's arguments
// become one ARG per member of the object as written (string values decoded, other values their
// exact source text); "" and "{}" give no ARG; text that is not a JSON object becomes a JSON
// block of the raw text.
void RenderToolCalls(const std::vector<ToolCall>& calls, XtmlWriter* w);

// How one tool message of a run renders.
struct ToolResultSlot {
  size_t message = 0;  // index into the messages
  std::string name;    // the tool="…" attribute
  int64_t index = 0;   // the index="…" attribute (tool results since the assistant, from 1)
};
// The run messages[begin, end) of consecutive tool messages answering `caller`'s calls (null:
// no assistant before them); `before` tool messages since that assistant were already rendered.
// The encoder's rule: when every tool_call_id matches a call, the run is sorted by call position
// (stable); otherwise it keeps its order and an unmatched message takes its `name`, else the
// name of the call at its index. kInvalid for a message whose name cannot be resolved.
Result<std::vector<ToolResultSlot>> OrderToolResults(const std::vector<ChatMessage>& messages,
                                                     size_t begin, size_t end,
                                                     const ChatMessage* caller, int64_t before);

// ---- completion parsing ----

enum class FinishKind { kStop, kToolCalls, kLength, kMalformed };
std::string_view FinishKindName(FinishKind kind);  // "stop", "tool_calls", "length", "malformed"

// One streamed piece of a call (OpenAI's delta.tool_calls[k]).
struct ToolCallFragment {
  int64_t index = 0;      // the call's position in the message, from 0
  std::string id;         // the call's first fragment only
  std::string name;       // the call's first fragment only
  std::string arguments;  // JSON text to append to the call's arguments
};

struct CompletionDelta {
  std::string reasoning;  // raw bytes
  std::string content;    // raw bytes
  std::vector<ToolCallFragment> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedCompletion {
  FinishKind finish = FinishKind::kStop;
  // kLength: what was cut off and where; kMalformed: what is wrong and where. "" otherwise.
  std::string error;
  std::string reasoning;  // raw bytes, all of it
  std::string content;    // raw bytes, all of it
  std::vector<ToolCall> tool_calls;  // arguments: every fragment joined (+ tail's)
  // What Finish itself adds (closing a call cut off by the limit): send it before the end.
  CompletionDelta tail;
};

struct CompletionParserOptions {
  bool thinking = true;       // the generation prompt opened the think channel
  uint64_t call_id_seed = 0;  // per request: ids are "call_" + 16 hex of mix(seed, index)
};

// The call id the parser gives the call at `index` (from 0) of a request seeded `seed`.
std::string ToolCallId(uint64_t seed, int64_t index);

class CompletionParser {
 public:
  CompletionParser(const tok::Tokenizer* tok, const ChatIds& ids, CompletionParserOptions o);
  CompletionParser(const ChatTemplate& t, CompletionParserOptions o)
      : CompletionParser(&t.tokenizer(), t.ids(), o) {}

  // The next generated id; what it makes known. Ids after Finish are ignored.
  CompletionDelta Feed(int32_t id);
  // The whole message. Without an END fed: kLength (the caller knows when a stop string ended
  // it instead). Idempotent.
  ParsedCompletion Finish();
  // An END was read or the completion is malformed: more ids change nothing.
  bool done() const { return phase_ == Phase::kDone || phase_ == Phase::kMalformed; }
  bool malformed() const { return phase_ == Phase::kMalformed; }

 private:
  enum class Phase {
    kReasoning,     // think payload
    kAfterThink,    // close(think) read: open(response) next
    kContent,       // response payload
    kAfterContent,  // close(response) read: open(tools) or close(message)
    kInTools,       // open(call) or close(tools)
    kInCall,        // open(argument), open(json) or close(call)
    kInArgument,    // an argument's value
    kInJson,        // a json block's text
    kAfterTools,    // close(message)
    kAfterMessage,  // END
    kDone,
    kMalformed,
  };
  struct Header {
    bool active = false;
    bool open = false;  // <|open|> (else <|close|>)
    size_t position = 0;
    std::string text;
  };
  struct Call {
    ToolCall call;
    int64_t index = 0;
    size_t position = 0;
    int64_t arguments_seen = 0;
    bool json_block = false;  // a json block was read: only close(call) may follow
  };
  struct Argument {
    std::string key, type;
    size_t position = 0;
    std::string raw;   // non-string values, json blocks: buffered to the close
    Utf8Chunker utf8;  // string values: a split character is held until complete
  };

  void Text(std::string_view bytes, CompletionDelta* d);
  void Tag(CompletionDelta* d);
  void StartCall(const std::string& name, CompletionDelta* d);
  void StartArgument(std::string key, std::string type, CompletionDelta* d);
  void EndArgument(CompletionDelta* d);
  Status EndJsonBlock(CompletionDelta* d);
  void EndCall(CompletionDelta* d);
  void Emit(std::string fragment, CompletionDelta* d);
  void Fail(std::string message);
  std::string Where() const;     // the phase, for messages: "inside call 2", …
  std::string Expected() const;  // what the grammar allows next, for messages
  std::string CutOff() const;

  const tok::Tokenizer* tok_;
  ChatIds ids_;
  CompletionParserOptions o_;
  Phase phase_;
  size_t position_ = 0;     // of the id being fed
  size_t phase_start_ = 0;  // where the current payload began (the END's position once done)
  Header header_;
  std::vector<Call> calls_;
  bool in_call_ = false;
  int64_t calls_in_section_ = 0;
  Argument arg_;
  std::string reasoning_, content_;
  std::string error_;
  bool finished_ = false;
  ParsedCompletion result_;
};

}  // namespace k3::run
