// The chat transcript file of `k3run --chat --history PATH` (ORIGINAL-ENGINE.md §6 "JSONL
// history").
//
// Format: one JSON object per line, LF-terminated:
//   {"role":"system"|"user"|"assistant"|"tool","content":"…"[,"reasoning_content":"…"]
//    [,"ids":[…]][,"tool_calls":[{"id","name","arguments"}]][,"tool_call_id":"…"][,"name":"…"]
//    [,"images":[{"path":"…","width":W,"height":H,"tokens":N,"xxh3":"…"[,"at":B]}]]}
// images only on user lines: the files a chat's /image attached (ChatImage: original size, rows,
// XXH3-128 of the file's bytes as 32 hex digits, byte offset in the content when not 0); the
// pixels are not copied in, a resumed chat re-reads and re-checks the files (app/chat_images.h).
// reasoning_content, ids and tool_calls only on assistant lines, tool_call_id (required) and
// name only on tool lines (a tool's result, chat --tools); ids are the token ids the reply was
// generated as (after the generation prompt, END token included), so a resumed conversation
// renders exactly the tokens the model saw, whatever their text re-encodes to. Order: an optional system message first, then
// user and assistant strictly alternating, starting with user, except that tool results may
// follow an assistant message with tool_calls (then the assistant, or the user, goes on); a
// transcript may end with a user turn or tool results (the REPL resumes it).
// Reading is strict; each rule names the file, the 1-based line and the byte offset where known:
// valid UTF-8 JSON; one object per line and nothing after it; no blank lines; no raw control
// bytes anywhere on a line (tab and CR included); no duplicate or unknown keys; string values;
// escapes valid (unpaired surrogates refused); no NUL in a value; lines ≤ 16 MiB.
// Writing escapes `"` `\` `\n` `\r` `\t` and other bytes < 0x20 as \u00XX, non-ASCII raw, and
// goes through WriteFileAtomic: a failed save leaves the previous transcript intact.
// A missing file is an empty history.
// Non-goals: other chat formats (OpenAI arrays), merging concurrent writers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "k3run/text/chat_template.h"

namespace k3::run {

inline constexpr size_t kMaxHistoryLineBytes = size_t{16} << 20;

Result<std::vector<ChatMessage>> ParseHistory(std::string_view text, const std::string& source);
// Role order rules (above); `source` and 1-based message numbers (= line numbers) in errors.
Status CheckRoleOrder(const std::vector<ChatMessage>& messages, const std::string& source);
std::string SerializeHistory(const std::vector<ChatMessage>& messages);

Result<std::vector<ChatMessage>> LoadHistory(Env* env, const std::string& path);
Status SaveHistory(Env* env, const std::string& path, const std::vector<ChatMessage>& messages);

}  // namespace k3::run
