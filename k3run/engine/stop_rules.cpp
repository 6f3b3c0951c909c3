#include "k3run/engine/stop_rules.h"

#include <algorithm>
#include <optional>

namespace k3::run {

std::vector<int64_t> EndTokenIds(const tok::Tokenizer* tokenizer) {
  std::vector<int64_t> ids;
  if (tokenizer == nullptr) return ids;
  for (std::string_view content : kEndTokenContents) {
    if (const std::optional<int32_t> id = tokenizer->SpecialId(content)) ids.push_back(*id);
  }
  return ids;
}

StopText::StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {
  // An empty stop string would match everywhere; it means nothing, so it is dropped.
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

size_t StopText::HeldBackLength() const {
  size_t held = 0;
  for (const std::string& s : stops_) {
    const size_t longest = std::min(s.size() - 1, pending_.size());
    for (size_t k = longest; k > held; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) ==
          std::string_view(s).substr(0, k)) {
        held = k;
        break;
      }
    }
  }
  return held;
}

std::string StopText::Push(std::string_view bytes) {
  if (stopped_) return {};
  pending_ += bytes;
  // The earliest match wins; at one position, the longest stop string.
  size_t at = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t pos = pending_.find(s);
    if (pos < at || (pos == at && pos != std::string::npos && s.size() > matched_.size())) {
      at = pos;
      matched_ = s;
    }
  }
  if (at != std::string::npos) {
    stopped_ = true;
    std::string shown = pending_.substr(0, at);
    pending_.clear();
    return shown;
  }
  // pending_ held no match before this push, and every byte released was not the start of
  // one, so a match can only begin in what stays held back.
  const size_t keep = HeldBackLength();
  std::string shown = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return shown;
}

std::string StopText::Flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace k3::run
