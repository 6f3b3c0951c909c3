#include "formats/sequence_state.h"
#include "formats/little_endian.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

namespace k3::seqstate {
namespace {

// Floats and token ids are copied as raw bytes: the file is little-endian IEEE-754.
static_assert(std::endian::native == std::endian::little,
              "sequence state files store raw little-endian floats; port the copies first");
static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559);

// Header field offsets.
constexpr size_t kHdrVersion = 4;
constexpr size_t kHdrModelHigh = 8;
constexpr size_t kHdrModelLow = 16;
constexpr size_t kHdrLayers = 24;
constexpr size_t kHdrSections = 28;
constexpr size_t kHdrTokens = 32;
constexpr size_t kHdrBodyBytes = 40;
constexpr size_t kHdrBodyHash = 48;
constexpr size_t kHdrReserved = 56;
static_assert(kHdrReserved + 8 == kSequenceStateHeaderSize);
// Section header: u32 layer, u32 kind, u64 n_floats.
constexpr uint64_t kSectionHeaderSize = 16;


std::string At(const std::string& source, uint64_t offset) {
  return source + ": byte offset " + std::to_string(offset);
}

constexpr char kSaveAgain[] =
    " (save the state again with k3run --save-state, or run without --load-state)";

uint64_t BodyBytes(const SequenceState& s) {
  uint64_t n = 4 * uint64_t{s.tokens.size()};
  for (const StateSection& sec : s.sections) n += kSectionHeaderSize + 4 * uint64_t{sec.data.size()};
  return n;
}

// The header fields the body decode needs.
struct Header {
  uint32_t layers = 0;
  uint32_t n_sections = 0;
  uint64_t n_tokens = 0;
  uint64_t body_bytes = 0;
  uint64_t body_hash = 0;
};

// The kInvalid header checks, in the documented order. `head` is the file's first bytes (all
// of them, or at least the 64-byte header); `file_size` is the whole file's size.
Status DecodeHeader(std::string_view head, uint64_t file_size, const std::string& source,
                    const Hash128& expected_model, Header* h) {
  if (head.size() < kSequenceStateMagic.size() ||
      std::memcmp(head.data(), kSequenceStateMagic.data(), 4) != 0) {
    return Status::Invalid(
        At(source, 0) + ": magic is not \"K3SS\" (the file is " + std::to_string(file_size) +
        " bytes): not a k3 sequence state file (--load-state takes a file written by k3run "
        "--save-state)");
  }
  if (head.size() >= kHdrVersion + 4) {
    const uint32_t version = le::Get32(head, kHdrVersion);
    if (version != kSequenceStateVersion) {
      return Status::Invalid(At(source, kHdrVersion) + ": version " + std::to_string(version) +
                             "; this k3run reads version 1: save the state again with this "
                             "k3run");
    }
  }
  if (head.size() < kSequenceStateHeaderSize) {
    return Status::Integrity(source + ": truncated: the file is " + std::to_string(file_size) +
                             " bytes, shorter than the 64-byte header" + kSaveAgain);
  }
  for (size_t p = kHdrReserved; p < kSequenceStateHeaderSize; ++p) {
    if (head[p] != '\0') {
      return Status::Invalid(At(source, p) + ": reserved header byte is 0x" +
                             Hex64(static_cast<uint8_t>(head[p])).substr(14) +
                             ", must be 0 (written by a newer k3run? save the state again with "
                             "this k3run)");
    }
  }
  h->layers = le::Get32(head, kHdrLayers);
  h->n_sections = le::Get32(head, kHdrSections);
  h->n_tokens = le::Get64(head, kHdrTokens);
  h->body_bytes = le::Get64(head, kHdrBodyBytes);
  h->body_hash = le::Get64(head, kHdrBodyHash);
  if (h->layers == 0 || h->layers > kMaxStateLayers) {
    return Status::Invalid(At(source, kHdrLayers) + ": layers is " + std::to_string(h->layers) +
                           ", must be 1.." + std::to_string(kMaxStateLayers) + kSaveAgain);
  }
  if (h->n_sections > kMaxStateSections) {
    return Status::Invalid(At(source, kHdrSections) + ": n_sections is " +
                           std::to_string(h->n_sections) + ", exceeds the bound " +
                           std::to_string(kMaxStateSections) + kSaveAgain);
  }
  if (h->n_tokens > kMaxStateTokens) {
    return Status::Invalid(At(source, kHdrTokens) + ": n_tokens is " +
                           std::to_string(h->n_tokens) + ", exceeds the bound " +
                           std::to_string(kMaxStateTokens) + " (2^20)" + kSaveAgain);
  }
  const Hash128 model{le::Get64(head, kHdrModelHigh), le::Get64(head, kHdrModelLow)};
  if (!(model == expected_model)) {
    return Status::Invalid(
        At(source, kHdrModelHigh) + ": model: saved for another prepared directory (k3.json "
        "xxh3-128 " + model.Hex() + "); this one is " + expected_model.Hex() +
        " (load it with the prepared directory it was saved with, or start the conversation "
        "anew)");
  }
  return Status::Ok();
}

// kIntegrity: the file is exactly the header plus body_bytes.
Status CheckFileSize(uint64_t file_size, const Header& h, const std::string& source) {
  const uint64_t body_have = file_size - kSequenceStateHeaderSize;
  if (body_have < h.body_bytes) {
    return Status::Integrity(
        source + ": truncated: the file is " + std::to_string(file_size) + " bytes, the header "
        "says 64 + body_bytes " + std::to_string(h.body_bytes) + " (byte offset 40) = " +
        std::to_string(kSequenceStateHeaderSize + h.body_bytes) + kSaveAgain);
  }
  if (body_have > h.body_bytes) {
    return Status::Integrity(
        At(source, kSequenceStateHeaderSize + h.body_bytes) + ": " +
        std::to_string(body_have - h.body_bytes) + " trailing bytes after the body (body_bytes "
        "at byte offset 40 is " + std::to_string(h.body_bytes) +
        "): the file was altered or appended to" + kSaveAgain);
  }
  return Status::Ok();
}

}  // namespace

std::string EncodeSequenceState(const SequenceState& s) {
  const uint64_t body_bytes = BodyBytes(s);
  std::string out;
  out.reserve(kSequenceStateHeaderSize + body_bytes);
  out.append(kSequenceStateMagic.data(), kSequenceStateMagic.size());
  le::Append32(out, kSequenceStateVersion);
  le::Append64(out, s.model.high);
  le::Append64(out, s.model.low);
  le::Append32(out, s.layers);
  le::Append32(out, static_cast<uint32_t>(s.sections.size()));
  le::Append64(out, s.tokens.size());
  le::Append64(out, body_bytes);
  le::Append64(out, 0);  // body_xxh3_64, set below
  le::Append64(out, 0);  // reserved
  for (const int32_t t : s.tokens) le::Append32(out, static_cast<uint32_t>(t));
  for (const StateSection& sec : s.sections) {
    le::Append32(out, sec.layer);
    le::Append32(out, sec.kind);
    le::Append64(out, sec.data.size());
    if (!sec.data.empty()) {  // an empty vector's data() may be null
      out.append(reinterpret_cast<const char*>(sec.data.data()), 4 * sec.data.size());
    }
  }
  le::Put64(out, kHdrBodyHash,
         Xxh3_64(out.data() + kSequenceStateHeaderSize, out.size() - kSequenceStateHeaderSize));
  return out;
}

namespace {

// The body after its hash passed: tokens, then each section, then nothing.
Status DecodeBody(std::string_view bytes, const Header& h, const std::string& source,
                  SequenceState* s) {
  const uint64_t end = bytes.size();
  uint64_t at = kSequenceStateHeaderSize;
  if (h.n_tokens * 4 > h.body_bytes) {
    return Status::Invalid(At(source, at) + ": tokens: n_tokens " + std::to_string(h.n_tokens) +
                           " x 4 bytes run past the end of the body (body_bytes " +
                           std::to_string(h.body_bytes) + ")" + kSaveAgain);
  }
  s->tokens.resize(h.n_tokens);
  for (uint64_t i = 0; i < h.n_tokens; ++i, at += 4) {
    const auto t = static_cast<int32_t>(le::Get32(bytes, at));
    if (t < 0) {
      return Status::Invalid(At(source, at) + ": tokens[" + std::to_string(i) + "] is " +
                             std::to_string(t) + ", must be >= 0" + kSaveAgain);
    }
    s->tokens[i] = t;
  }
  std::vector<uint32_t> section_of_layer(h.layers, std::numeric_limits<uint32_t>::max());
  s->sections.reserve(std::min<uint64_t>(h.n_sections, (end - at) / kSectionHeaderSize));
  for (uint32_t i = 0; i < h.n_sections; ++i) {
    const std::string where = At(source, at) + ": section " + std::to_string(i);
    if (end - at < kSectionHeaderSize) {
      return Status::Invalid(where + ": its 16-byte header runs past the end of the body (" +
                             std::to_string(end - at) + " bytes left; n_sections " +
                             std::to_string(h.n_sections) + ")" + kSaveAgain);
    }
    StateSection sec;
    sec.layer = le::Get32(bytes, at);
    sec.kind = le::Get32(bytes, at + 4);
    const uint64_t n_floats = le::Get64(bytes, at + 8);
    if (sec.kind != kKda && sec.kind != kMla) {
      return Status::Invalid(where + ": kind is " + std::to_string(sec.kind) +
                             ", unknown (1 = KDA, 2 = MLA)" + kSaveAgain);
    }
    if (sec.layer >= h.layers) {
      return Status::Invalid(where + ": layer is " + std::to_string(sec.layer) +
                             ", must be < layers " + std::to_string(h.layers) + kSaveAgain);
    }
    if (section_of_layer[sec.layer] != std::numeric_limits<uint32_t>::max()) {
      return Status::Invalid(where + ": layer " + std::to_string(sec.layer) +
                             " already has a section (section " +
                             std::to_string(section_of_layer[sec.layer]) + ")" + kSaveAgain);
    }
    section_of_layer[sec.layer] = i;
    at += kSectionHeaderSize;
    if (n_floats > (end - at) / 4) {
      return Status::Invalid(where + ": n_floats " + std::to_string(n_floats) +
                             " x 4 bytes run past the end of the body (" +
                             std::to_string(end - at) + " bytes left)" + kSaveAgain);
    }
    sec.data.resize(n_floats);
    if (n_floats != 0) std::memcpy(sec.data.data(), bytes.data() + at, 4 * n_floats);
    at += 4 * n_floats;
    s->sections.push_back(std::move(sec));
  }
  if (at != end) {
    return Status::Invalid(At(source, at) + ": " + std::to_string(end - at) +
                           " bytes left over after the last section (n_sections " +
                           std::to_string(h.n_sections) + ")" + kSaveAgain);
  }
  return Status::Ok();
}

}  // namespace

Result<SequenceState> DecodeSequenceState(std::string_view bytes, const std::string& source,
                                          const Hash128& expected_model) {
  Header h;
  K3_RETURN_IF_ERROR(DecodeHeader(bytes, bytes.size(), source, expected_model, &h));
  K3_RETURN_IF_ERROR(CheckFileSize(bytes.size(), h, source));
  const uint64_t hash =
      Xxh3_64(bytes.data() + kSequenceStateHeaderSize, bytes.size() - kSequenceStateHeaderSize);
  if (hash != h.body_hash) {
    return Status::Integrity(At(source, kHdrBodyHash) + ": body_xxh3_64 is " + Hex64(h.body_hash) +
                             ", the body hashes to " + Hex64(hash) +
                             ": the file was altered or damaged after it was saved" + kSaveAgain);
  }
  SequenceState s;
  s.model = expected_model;
  s.layers = h.layers;
  K3_RETURN_IF_ERROR(DecodeBody(bytes, h, source, &s));
  return s;
}

namespace {

// The decoder's rules applied to a state about to be written.
Status CheckState(const SequenceState& s, const std::string& path) {
  const std::string what = path + ": cannot save the sequence state: ";
  if (s.layers == 0 || s.layers > kMaxStateLayers) {
    return Status::Invalid(what + "layers is " + std::to_string(s.layers) + ", must be 1.." +
                           std::to_string(kMaxStateLayers));
  }
  if (s.tokens.size() > kMaxStateTokens) {
    return Status::Invalid(what + std::to_string(s.tokens.size()) +
                           " tokens exceed the bound 2^20");
  }
  if (s.sections.size() > kMaxStateSections) {
    return Status::Invalid(what + std::to_string(s.sections.size()) +
                           " sections exceed the bound " + std::to_string(kMaxStateSections));
  }
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (s.tokens[i] < 0) {
      return Status::Invalid(what + "tokens[" + std::to_string(i) + "] is " +
                             std::to_string(s.tokens[i]) + ", must be >= 0");
    }
  }
  std::vector<bool> seen(s.layers, false);
  for (size_t i = 0; i < s.sections.size(); ++i) {
    const StateSection& sec = s.sections[i];
    if ((sec.kind != kKda && sec.kind != kMla) || sec.layer >= s.layers || seen[sec.layer]) {
      return Status::Invalid(what + "section " + std::to_string(i) + " (layer " +
                             std::to_string(sec.layer) + ", kind " + std::to_string(sec.kind) +
                             ") has an unknown kind, a layer >= layers " +
                             std::to_string(s.layers) + " or a layer already saved");
    }
    seen[sec.layer] = true;
  }
  return Status::Ok();
}

}  // namespace

Status WriteSequenceState(Env* env, const std::string& path, const SequenceState& s) {
  K3_RETURN_IF_ERROR(CheckState(s, path));
  return WriteFileAtomic(env, path, EncodeSequenceState(s));
}

namespace {

// Opens `path` and checks its header and size (the refusals that need no body); the open file
// is left in *file for a caller that reads the body.
Status OpenChecked(Env* env, const std::string& path, const Hash128& expected_model,
                   std::unique_ptr<File>* file, uint64_t* size, Header* h) {
  if (!env->Exists(path)) {
    return Status::Invalid(path + ": no such file (--load-state takes a file written by k3run "
                           "--save-state)");
  }
  K3_ASSIGN_OR_RETURN(*file, env->Open(path, OpenMode::kRead));
  K3_ASSIGN_OR_RETURN(*size, (*file)->Size());
  // The header first: a foreign, old or cut-short file is refused before the body is read.
  std::string head(std::min<uint64_t>(*size, kSequenceStateHeaderSize), '\0');
  K3_RETURN_IF_ERROR((*file)->ReadExact(0, head.size(), head.data()));
  K3_RETURN_IF_ERROR(DecodeHeader(head, *size, path, expected_model, h));
  return CheckFileSize(*size, *h, path);
}

}  // namespace

Result<SequenceState> ReadSequenceState(Env* env, const std::string& path,
                                        const Hash128& expected_model) {
  std::unique_ptr<File> file;
  uint64_t size = 0;
  Header h;
  K3_RETURN_IF_ERROR(OpenChecked(env, path, expected_model, &file, &size, &h));
  std::string bytes(static_cast<size_t>(size), '\0');
  K3_RETURN_IF_ERROR(file->ReadExact(0, bytes.size(), bytes.data()));
  K3_RETURN_IF_ERROR(file->Close());
  return DecodeSequenceState(bytes, path, expected_model);
}

Result<StateHeader> ReadSequenceStateHeader(Env* env, const std::string& path,
                                            const Hash128& expected_model) {
  std::unique_ptr<File> file;
  uint64_t size = 0;
  Header h;
  K3_RETURN_IF_ERROR(OpenChecked(env, path, expected_model, &file, &size, &h));
  K3_RETURN_IF_ERROR(file->Close());
  return StateHeader{h.layers, h.n_tokens, h.body_bytes};
}

}  // namespace k3::seqstate
