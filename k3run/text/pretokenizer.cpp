#define PCRE2_CODE_UNIT_WIDTH 8
#include "k3run/text/pretokenizer.h"

#include <pcre2.h>

namespace k3::tok {
namespace {

// A (?:(?!…)[X])* repeat backtracks through one JIT frame per character, and runs reach
// 25,000 characters: the default 32 KiB JIT stack is far too small. Reserved, not committed.
constexpr size_t kJitStackMax = size_t{64} << 20;

}  // namespace

struct PreTokenizer::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

Result<PreTokenizer> PreTokenizer::Create(const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto impl = std::make_unique<Impl>();
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset,
                             nullptr);
  if (impl->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return Status::Invalid("tokenizer pattern: PCRE2 refused it at byte " +
                           std::to_string(err_offset) + ": " +
                           reinterpret_cast<const char*>(msg) + " (pattern: " + pattern + ")");
  }
  // Without JIT (a platform PCRE2 built without it) matching is slower but identical.
  impl->jit = pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  return PreTokenizer(std::move(impl));
}

void PreTokenizer::Split(std::string_view text,
                         const std::function<void(std::string_view)>& piece) const {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* js = impl_->jit ? pcre2_jit_stack_create(32 << 10, kJitStackMax, nullptr) : nullptr;
  if (js != nullptr) pcre2_jit_stack_assign(mc, nullptr, js);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, md, mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      // Resource limits only (the text is valid UTF-8 and the pattern compiled): never drop
      // text; the rest becomes one piece, which BPE still encodes losslessly.
      piece(text.substr(offset));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {
      // No alternative matches empty; guard anyway so a changed pattern cannot loop forever.
      ++offset;
      while (offset < text.size() && (static_cast<uint8_t>(text[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    piece(text.substr(begin, end - begin));
    offset = end;
  }
  if (js != nullptr) pcre2_jit_stack_free(js);
  pcre2_match_context_free(mc);
  pcre2_match_data_free(md);
}

}  // namespace k3::tok
