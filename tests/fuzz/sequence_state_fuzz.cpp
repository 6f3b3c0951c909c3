// Fuzz target for sequence state files (formats/sequence_state.h): DecodeSequenceState must
// never crash, refuse only with kInvalid or kIntegrity, and decode strictly enough that
// re-encoding what it accepts gives back the very same bytes. A mutated body almost always
// fails the body hash first, so each input is also decoded a second time with its header
// repaired (model = the expected one, body_bytes = what follows the header, body_xxh3_64 = the
// body's hash): that reaches the body structure checks. A violated property aborts, which
// libFuzzer and the replay driver both report as a failure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/hash.h"
#include "formats/sequence_state.h"

namespace {

// The model hash of the seed corpus (tests/formats/sequence_state_test.cpp, FuzzSeedCorpus).
constexpr k3::Hash128 kModel{0x0123456789abcdefull, 0xfedcba9876543210ull};

void PutU64(std::string& b, size_t at, uint64_t v) {
  for (size_t i = 0; i < 8; ++i) b[at + i] = static_cast<char>(v >> (8 * i));
}

void Check(std::string_view bytes) {
  k3::Result<k3::seqstate::SequenceState> s =
      k3::seqstate::DecodeSequenceState(bytes, "fuzz/state.k3ss", kModel);
  if (!s.ok()) {
    const k3::Code c = s.status().code();
    if (c != k3::Code::kInvalid && c != k3::Code::kIntegrity) std::abort();
    return;
  }
  if (k3::seqstate::EncodeSequenceState(*s) != bytes) std::abort();
  if (s->layers == 0 || s->sections.size() > s->layers) std::abort();
  for (const int32_t t : s->tokens) {
    if (t < 0) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes);
  constexpr size_t kHeader = k3::seqstate::kSequenceStateHeaderSize;
  if (size >= kHeader) {
    std::string fixed(bytes);
    PutU64(fixed, 8, kModel.high);
    PutU64(fixed, 16, kModel.low);
    PutU64(fixed, 40, size - kHeader);
    PutU64(fixed, 48, k3::Xxh3_64(fixed.data() + kHeader, size - kHeader));
    Check(fixed);
  }
  return 0;
}
