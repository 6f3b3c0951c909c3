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

// The body's bytes in order: from memory, or from a file a chunk at a time.
class BodyReader {
 public:
  virtual ~BodyReader() = default;
  // The next n bytes (the caller never asks past the body's end).
  virtual Status Read(size_t n, void* dst) = 0;
};

class MemoryReader : public BodyReader {
 public:
  MemoryReader(std::string_view bytes, uint64_t at) : bytes_(bytes), at_(at) {}
  Status Read(size_t n, void* dst) override {
    if (n != 0) std::memcpy(dst, bytes_.data() + at_, n);
    at_ += n;
    return Status::Ok();
  }

 private:
  std::string_view bytes_;
  uint64_t at_;
};

// Reads the file through one buffer of kStateReadChunk bytes: the loader's only allocation
// besides the token ids, whatever the state's size.
class ChunkReader : public BodyReader {
 public:
  ChunkReader(File* file, uint64_t at) : file_(file), at_(at), buf_(kStateReadChunk) {}
  Status Read(size_t n, void* dst) override {
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      if (have_ == used_) {
        const size_t k = kStateReadChunk;
        size_t got = 0;
        K3_RETURN_IF_ERROR(file_->PRead(at_, k, buf_.data(), &got));
        if (got == 0) return Status::Io("sequence state: the file ended early while read");
        at_ += got;
        have_ = got;
        used_ = 0;
      }
      const size_t take = std::min(n, have_ - used_);
      std::memcpy(out, buf_.data() + used_, take);
      used_ += take;
      out += take;
      n -= take;
    }
    return Status::Ok();
  }

 private:
  File* file_;
  uint64_t at_;
  std::vector<char> buf_;
  size_t have_ = 0, used_ = 0;
};

uint32_t Get32(const char* p) { return le::Get32(std::string_view(p, 4), 0); }
uint64_t Get64(const char* p) { return le::Get64(std::string_view(p, 8), 0); }

// The body after its hash passed: tokens, then each section, then nothing. `end` is the file
// size; offsets in messages are the file's.
Status DecodeBody(BodyReader& r, uint64_t end, const Header& h, const std::string& source,
                  StateSink* sink) {
  uint64_t at = kSequenceStateHeaderSize;
  if (h.n_tokens * 4 > h.body_bytes) {
    return Status::Invalid(At(source, at) + ": tokens: n_tokens " + std::to_string(h.n_tokens) +
                           " x 4 bytes run past the end of the body (body_bytes " +
                           std::to_string(h.body_bytes) + ")" + kSaveAgain);
  }
  std::vector<int32_t> tokens(h.n_tokens);
  for (uint64_t i = 0; i < h.n_tokens; ++i, at += 4) {
    char b[4];
    K3_RETURN_IF_ERROR(r.Read(4, b));
    const auto t = static_cast<int32_t>(Get32(b));
    if (t < 0) {
      return Status::Invalid(At(source, at) + ": tokens[" + std::to_string(i) + "] is " +
                             std::to_string(t) + ", must be >= 0" + kSaveAgain);
    }
    tokens[i] = t;
  }
  K3_RETURN_IF_ERROR(sink->Tokens(std::move(tokens)));
  std::vector<uint32_t> section_of_layer(h.layers, std::numeric_limits<uint32_t>::max());
  std::vector<float> piece;
  for (uint32_t i = 0; i < h.n_sections; ++i) {
    const std::string where = At(source, at) + ": section " + std::to_string(i);
    if (end - at < kSectionHeaderSize) {
      return Status::Invalid(where + ": its 16-byte header runs past the end of the body (" +
                             std::to_string(end - at) + " bytes left; n_sections " +
                             std::to_string(h.n_sections) + ")" + kSaveAgain);
    }
    char head[kSectionHeaderSize];
    K3_RETURN_IF_ERROR(r.Read(kSectionHeaderSize, head));
    const uint32_t layer = Get32(head), kind = Get32(head + 4);
    const uint64_t n_floats = Get64(head + 8);
    if (kind != kKda && kind != kMla) {
      return Status::Invalid(where + ": kind is " + std::to_string(kind) +
                             ", unknown (1 = KDA, 2 = MLA)" + kSaveAgain);
    }
    if (layer >= h.layers) {
      return Status::Invalid(where + ": layer is " + std::to_string(layer) +
                             ", must be < layers " + std::to_string(h.layers) + kSaveAgain);
    }
    if (section_of_layer[layer] != std::numeric_limits<uint32_t>::max()) {
      return Status::Invalid(where + ": layer " + std::to_string(layer) +
                             " already has a section (section " +
                             std::to_string(section_of_layer[layer]) + ")" + kSaveAgain);
    }
    section_of_layer[layer] = i;
    at += kSectionHeaderSize;
    if (n_floats > (end - at) / 4) {
      return Status::Invalid(where + ": n_floats " + std::to_string(n_floats) +
                             " x 4 bytes run past the end of the body (" +
                             std::to_string(end - at) + " bytes left)" + kSaveAgain);
    }
    K3_RETURN_IF_ERROR(sink->Section(layer, kind, n_floats));
    piece.resize(static_cast<size_t>(std::min<uint64_t>(n_floats, kStateReadChunk / 4)));
    for (uint64_t left = n_floats; left > 0;) {
      const size_t k = static_cast<size_t>(std::min<uint64_t>(left, piece.size()));
      K3_RETURN_IF_ERROR(r.Read(4 * k, piece.data()));
      sink->Floats(piece.data(), k);
      left -= k;
    }
    at += 4 * n_floats;
  }
  if (at != end) {
    return Status::Invalid(At(source, at) + ": " + std::to_string(end - at) +
                           " bytes left over after the last section (n_sections " +
                           std::to_string(h.n_sections) + ")" + kSaveAgain);
  }
  return Status::Ok();
}

// Collects a whole SequenceState (DecodeSequenceState, ReadSequenceState).
class CollectSink : public StateSink {
 public:
  explicit CollectSink(SequenceState* s) : s_(s) {}
  Status Header(const StateHeader& h) override {
    s_->layers = h.layers;
    return Status::Ok();
  }
  Status Tokens(std::vector<int32_t> tokens) override {
    s_->tokens = std::move(tokens);
    return Status::Ok();
  }
  Status Section(uint32_t layer, uint32_t kind, uint64_t n_floats) override {
    s_->sections.push_back({layer, kind, {}});
    s_->sections.back().data.reserve(static_cast<size_t>(n_floats));
    return Status::Ok();
  }
  void Floats(const float* data, size_t n) override {
    auto& d = s_->sections.back().data;
    d.insert(d.end(), data, data + n);
  }

 private:
  SequenceState* s_;
};

Status BadHash(const std::string& source, const Header& h, uint64_t hash) {
  return Status::Integrity(At(source, kHdrBodyHash) + ": body_xxh3_64 is " + Hex64(h.body_hash) +
                           ", the body hashes to " + Hex64(hash) +
                           ": the file was altered or damaged after it was saved" + kSaveAgain);
}

}  // namespace

Result<SequenceState> DecodeSequenceState(std::string_view bytes, const std::string& source,
                                          const Hash128& expected_model) {
  Header h;
  K3_RETURN_IF_ERROR(DecodeHeader(bytes, bytes.size(), source, expected_model, &h));
  K3_RETURN_IF_ERROR(CheckFileSize(bytes.size(), h, source));
  const uint64_t hash =
      Xxh3_64(bytes.data() + kSequenceStateHeaderSize, bytes.size() - kSequenceStateHeaderSize);
  if (hash != h.body_hash) return BadHash(source, h, hash);
  SequenceState s;
  s.model = expected_model;
  s.layers = h.layers;
  MemoryReader r(bytes, kSequenceStateHeaderSize);
  CollectSink sink(&s);
  K3_RETURN_IF_ERROR(DecodeBody(r, bytes.size(), h, source, &sink));
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

Status ReadSequenceStateInto(Env* env, const std::string& path, const Hash128& expected_model,
                             StateSink* sink) {
  std::unique_ptr<File> file;
  uint64_t size = 0;
  Header h;
  K3_RETURN_IF_ERROR(OpenChecked(env, path, expected_model, &file, &size, &h));
  K3_RETURN_IF_ERROR(sink->Header(StateHeader{h.layers, h.n_tokens, h.body_bytes, h.n_sections}));
  {  // Every byte is hashed before any is interpreted: a first pass, a chunk at a time.
    Xxh3_64Stream hash;
    std::vector<char> buf(kStateReadChunk);
    for (uint64_t at = kSequenceStateHeaderSize; at < size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - at));
      K3_RETURN_IF_ERROR(file->ReadExact(at, n, buf.data()));
      hash.Update(buf.data(), n);
      at += n;
    }
    if (hash.Digest() != h.body_hash) return BadHash(path, h, hash.Digest());
  }
  ChunkReader r(file.get(), kSequenceStateHeaderSize);
  K3_RETURN_IF_ERROR(DecodeBody(r, size, h, path, sink));
  return file->Close();
}

Result<SequenceState> ReadSequenceState(Env* env, const std::string& path,
                                        const Hash128& expected_model) {
  SequenceState s;
  s.model = expected_model;
  CollectSink sink(&s);
  K3_RETURN_IF_ERROR(ReadSequenceStateInto(env, path, expected_model, &sink));
  return s;
}

Result<StateHeader> ReadSequenceStateHeader(Env* env, const std::string& path,
                                            const Hash128& expected_model) {
  std::unique_ptr<File> file;
  uint64_t size = 0;
  Header h;
  K3_RETURN_IF_ERROR(OpenChecked(env, path, expected_model, &file, &size, &h));
  K3_RETURN_IF_ERROR(file->Close());
  return StateHeader{h.layers, h.n_tokens, h.body_bytes, h.n_sections};
}

}  // namespace k3::seqstate
