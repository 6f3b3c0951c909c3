// Tensor fixtures: a JSON file that pins down named tensors of a checkpoint or a prepared
// directory (docs/FORMATS.md "Tensor fixtures"), written by `k3verify tensors --emit` and
// checked by `k3verify tensors --fixtures`.
//
// Goals: a user records a fixture from a known-good copy and checks another machine's copy,
// whether that copy is the checkpoint or its prepared directory (so entries name tensors by
// their checkpoint names, and an MXFP4 matrix is one entry over its weight_packed/weight_scale
// pair, whichever file holds the bytes). Each entry carries the dtype, the shape, the XXH3-128
// of the bytes and a few sample elements as exact bit patterns, so a mismatch says WHICH
// property changed. The reader is strict: unknown or duplicate keys, a missing field, hex of the
// wrong width or case, an index outside the tensor are kInvalid naming the file, the entry and
// the field.
// Non-goals: tolerances (every comparison is bit-exact), reading tensor bytes (k3verify does),
// float formatting (bit patterns are hex, so no decimal round-trip question arises).
// Evolution: any new key or kind bumps "version"; readers reject versions they do not know.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/hash.h"
#include "common/status.h"
#include "formats/dtype.h"

namespace k3::fixture {

inline constexpr std::string_view kFormat = "k3-tensor-fixture";
inline constexpr uint64_t kVersion = 1;
// The dtype string of an MXFP4 entry (not a safetensors dtype: it spans two U8 tensors).
inline constexpr std::string_view kMxfp4DType = "MXFP4";
// Suffixes of the two tensors an MXFP4 entry named X covers: X.weight_packed, X.weight_scale.
inline constexpr std::string_view kPackedSuffix = ".weight_packed";
inline constexpr std::string_view kScaleSuffix = ".weight_scale";
// A fixture of the released model lists ~500k tensors; anything bigger is not a fixture.
inline constexpr uint64_t kMaxFixtureBytes = uint64_t{1} << 30;
// Bound on samples per entry: they are spot checks, the hash covers every byte.
inline constexpr size_t kMaxSamples = 1024;

struct Sample {
  uint64_t index = 0;  // flat (row-major) element index
  uint64_t bits = 0;   // raw element bits; MXFP4: the fp32 bits of the dequantised value
};

struct Entry {
  std::string name;
  bool mxfp4 = false;   // true: dtype is unused, shape is the logical [rows, cols]
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  // Raw tensors: of the tensor's bytes. MXFP4: of the packed bytes followed by the scale bytes.
  Hash128 xxh3_128;
  std::vector<Sample> samples;

  uint64_t numel() const;  // product of shape (validated not to overflow)
  // Hex digits of one sample: 2 × element size; 8 for MXFP4 (fp32 bits).
  int SampleHexDigits() const;
  // "BF16", …, or "MXFP4".
  std::string DTypeString() const;
};

struct FixtureFile {
  std::vector<Entry> entries;  // unique names
};

// Strict parse + validation. `source` names the file in messages.
Result<FixtureFile> ParseFixture(std::string_view text, const std::string& source);
Result<FixtureFile> LoadFixture(Env* env, const std::string& path);

// Canonical text: entries sorted by name, samples in ascending index, pretty-printed,
// '\n'-terminated. The same tensors give the same bytes whichever directory they came from.
std::string RenderFixture(const FixtureFile& f);
// RenderFixture written atomically (no half-written fixture under its final name).
Status WriteFixture(Env* env, const std::string& path, const FixtureFile& f);

// The sample indices `--emit` records for a tensor of `numel` elements: first, last and six
// spread evenly between (i·(numel−1)/7 for i = 0..7), deduplicated, ascending. Deterministic,
// so two emits of the same tensor agree.
std::vector<uint64_t> SampleIndices(uint64_t numel);

}  // namespace k3::fixture
