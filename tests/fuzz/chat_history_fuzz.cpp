// Fuzz target for the chat transcript (k3run/text/chat_history.h): ParseHistory must never crash and
// refuse only with kInvalid; a transcript it accepts serialises to a file that reads back as the
// same messages, so a resumed chat continues exactly where it was saved. A violated property
// aborts, which libFuzzer and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "k3run/text/chat_history.h"

namespace {

bool Same(const std::vector<k3::run::ChatMessage>& a, const std::vector<k3::run::ChatMessage>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].role != b[i].role || a[i].content != b[i].content ||
        a[i].reasoning != b[i].reasoning || a[i].ids != b[i].ids ||
        a[i].tool_call_id != b[i].tool_call_id || a[i].name != b[i].name ||
        a[i].tool_calls.size() != b[i].tool_calls.size()) {
      return false;
    }
    for (size_t k = 0; k < a[i].tool_calls.size(); ++k) {
      const k3::run::ToolCall& x = a[i].tool_calls[k];
      const k3::run::ToolCall& y = b[i].tool_calls[k];
      if (x.id != y.id || x.name != y.name || x.arguments != y.arguments) return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  k3::Result<std::vector<k3::run::ChatMessage>> msgs =
      k3::run::ParseHistory(text, "fuzz/history.jsonl");
  if (!msgs.ok()) {
    if (msgs.status().code() != k3::Code::kInvalid) std::abort();
    return 0;
  }
  const std::string saved = k3::run::SerializeHistory(*msgs);
  k3::Result<std::vector<k3::run::ChatMessage>> again = k3::run::ParseHistory(saved, "saved");
  if (!again.ok() || !Same(*msgs, *again)) std::abort();
  if (k3::run::SerializeHistory(*again) != saved) std::abort();
  return 0;
}
