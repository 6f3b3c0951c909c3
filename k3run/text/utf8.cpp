#include "k3run/text/utf8.h"

#include "common/utf8.h"

namespace k3::run {

std::string SanitizeUtf8(std::string_view s) { return ReplaceInvalidUtf8(s); }

std::string Utf8Chunker::Push(std::string_view bytes) {
  held_.append(bytes);
  size_t i = 0;
  while (i < held_.size()) {
    const Utf8Step st = DecodeUtf8Step(held_, i);
    if (st.truncated) break;
    i += st.len;
  }
  std::string out = held_.substr(0, i);
  held_.erase(0, i);
  return out;
}

std::string Utf8Chunker::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace k3::run
