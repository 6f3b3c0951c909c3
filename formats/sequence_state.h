// Sequence state files: one engine sequence saved by `k3run --save-state PATH` and restored by
// `--load-state PATH` (DESIGN.md §11.3, docs/FORMATS.md "Sequence state").
//
// Goals: a conversation resumes without re-reading its tokens, with the same bits as never
// stopping; a state is bound to the prepared directory it was computed with (its k3.sum hash)
// and to the --layers it ran with; every byte is hashed before it is interpreted, so a damaged
// file is an integrity failure (exit 3), never a wrong answer.
// Non-goals: knowing what the floats mean (the engine owns the KDA state and latent-cache
// layouts; this module stores opaque float sections); compression; partial or streamed reads;
// portability to big-endian hosts (floats are copied as raw little-endian IEEE bits).
//
// Layout (all integers little-endian, encoded and decoded field by field, no struct punning):
//   header (64 B): "K3SS", u32 version 1, u64 model.high, u64 model.low, u32 layers,
//                  u32 n_sections, u64 n_tokens, u64 body_bytes, u64 body_xxh3_64,
//                  8 reserved zero bytes
//   body (body_bytes B, hashed by body_xxh3_64, XXH3-64 seed 0):
//                  n_tokens × i32 token id,
//                  n_sections × {u32 layer, u32 kind, u64 n_floats, n_floats × f32}
// The file ends exactly after the body.
//
// Decode order (and the exit code each failure maps to): magic, version, reserved bytes, count
// bounds, model hash (kInvalid, exit 2); file size = 64 + body_bytes, body hash (kIntegrity,
// exit 3); body structure (kInvalid: the hash passed, so the writer or a crafted file is at
// fault). Every message names the file, the byte offset, the field, the rule and what to do.
//
// Evolution: a new field takes reserved bytes and a new version; readers refuse any version but
// theirs and any nonzero reserved byte, so an old k3run never misreads a new file.
//
// Thread safety: the functions are reentrant; nothing is shared.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/hash.h"
#include "common/status.h"

namespace k3::seqstate {

inline constexpr std::array<char, 4> kSequenceStateMagic = {'K', '3', 'S', 'S'};
inline constexpr uint32_t kSequenceStateVersion = 1;
inline constexpr uint32_t kSequenceStateHeaderSize = 64;
// Bounds checked before anything is allocated: the config.json layer bound (formats/config.h),
// 2^20 positions (32× the released --ctx default), one section per (layer, kind) with room.
inline constexpr uint32_t kMaxStateLayers = 4096;
inline constexpr uint64_t kMaxStateTokens = uint64_t{1} << 20;
inline constexpr uint32_t kMaxStateSections = 65536;

// Section kinds. Version 1 knows these two; any other value is refused.
inline constexpr uint32_t kKda = 1;  // a KDA layer's recurrent state
inline constexpr uint32_t kMla = 2;  // an MLA layer's latent cache

struct StateSection {
  uint32_t layer = 0;  // < SequenceState::layers; at most one section per layer
  uint32_t kind = 0;   // kKda or kMla
  std::vector<float> data;  // opaque to this module; stored bit-exactly (NaN payloads, -0.0f)
};

struct SequenceState {
  Hash128 model;            // XXH3-128 of the prepared directory's k3.json (what k3.sum holds)
  uint32_t layers = 0;      // the --layers the sequence was run with, 1..kMaxStateLayers
  std::vector<int32_t> tokens;  // the committed token ids (each ≥ 0); position = tokens.size()
  std::vector<StateSection> sections;
};

// The exact file content. Builds one string reserved to its final size (sections are copied
// once, with memcpy). Does not check `s`: WriteSequenceState does.
std::string EncodeSequenceState(const SequenceState& s);

// Decodes and checks a whole file (`source` names it in messages) in the order of the header
// comment; `expected_model` is the k3.sum hash of the prepared directory in use.
Result<SequenceState> DecodeSequenceState(std::string_view bytes, const std::string& source,
                                          const Hash128& expected_model);

// Checks `s` with the decoder's rules (kInvalid naming `path`: a state that could not be loaded
// is never written), then writes it atomically (WriteFileAtomic: temporary, fsync, rename):
// on failure no file exists under `path` that was not there before.
Status WriteSequenceState(Env* env, const std::string& path, const SequenceState& s);

// What the header says, for planning before the body is read (k3run reserves the positions a
// state brings before it allocates anything).
struct StateHeader {
  uint32_t layers = 0;
  uint64_t n_tokens = 0;
  uint64_t body_bytes = 0;
  uint32_t n_sections = 0;
};

// Where a state's contents go as ReadSequenceStateInto decodes them, in file order: the checked
// header first (before the body is read), then, once the whole body's hash has passed, the
// token ids, then per section Section followed by its floats through Floats, in order, in
// pieces. A callback's refusal stops the read with its Status.
class StateSink {
 public:
  virtual ~StateSink() = default;
  virtual Status Header(const StateHeader& h) {
    (void)h;
    return Status::Ok();
  }
  virtual Status Tokens(std::vector<int32_t> tokens) = 0;
  virtual Status Section(uint32_t layer, uint32_t kind, uint64_t n_floats) = 0;
  virtual void Floats(const float* data, size_t n) = 0;
};

// The bytes a state reader holds at once: the loader needs this much beside the token ids and
// the sink's own buffers, whatever the state's size (--load-state's peak, docs/CONTEXT.md).
inline constexpr size_t kStateReadChunk = size_t{1} << 20;

// Reads `path` twice through one kStateReadChunk buffer: once to hash the body, once to decode
// it into `sink`, with ReadSequenceState's checks, codes and messages. On an error the sink may
// have been given part of the state.
Status ReadSequenceStateInto(Env* env, const std::string& path, const Hash128& expected_model,
                             StateSink* sink);

// Reads and decodes `path`. The header is checked first (foreign model, wrong version, size),
// so a refused file is not read whole. A missing file is kInvalid naming the path and
// --load-state; other I/O failures are kIo.
Result<SequenceState> ReadSequenceState(Env* env, const std::string& path,
                                        const Hash128& expected_model);

// Reads and checks the header and the file size only (the body's hash is ReadSequenceState's
// job): the same refusals and codes as ReadSequenceState for those parts.
Result<StateHeader> ReadSequenceStateHeader(Env* env, const std::string& path,
                                            const Hash128& expected_model);

}  // namespace k3::seqstate
