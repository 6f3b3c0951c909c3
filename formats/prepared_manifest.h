// k3.json + k3.sum: the manifest of a prepared directory (DESIGN.md §5, docs/FORMATS.md).
//
// Goals: k3run and k3verify trust nothing in a prepared directory that this module has not
// checked. Reading is ordered so untrusted bytes are never interpreted early:
//   1. k3.sum is read and parsed (missing or malformed → kInvalid);
//   2. k3.json's XXH3-128 is compared with it BEFORE parsing (mismatch → kIntegrity
//      "k3.json altered");
//   3. k3.json is parsed strictly (duplicate/unknown keys, types) and validated: the config
//      re-parses to exactly itself, every region lies inside its file, no two overlap, the
//      trunk/resident regions equal the layout BuildLayout recomputes from the config (so dtypes,
//      shapes, order and alignment are the format's), file sizes are the layout's, a share's
//      ranks fit the config's experts (ValidateRanks) and its rank is below them;
//   4. every file's size on disk equals k3.json's (truncation is caught), experts.idx is hashed
//      against k3.json's region (it is small, so every open pays for it), then decoded and
//      validated against the config, the share (exactly the experts it does not hold are
//      absent; without a share none is) and the expert files.
// Writing validates the same rules first, removes any old k3.sum, writes k3.json atomically, then
// k3.sum atomically: k3.sum exists only when k3.json is complete, so an interrupted pack never
// leaves a directory that opens.
//
// Config decision: "config" holds CanonicalConfigJson (flat, resolved). The reader re-parses it
// with ParseModelConfig (the flat shape is one of its accepted inputs), takes experts_mxfp4 and
// mxfp4_group_size from the object, and requires CanonicalConfigJson(parsed) to equal the stored
// object, so a hand-edited or stale config cannot slip through.
//
// Non-goals: hashing region bytes (k3verify --deep), writing regions (k3prep pack).
// Evolution: unknown keys are rejected; any change bumps "version". "share" and "vision" are the
// optional keys of version 1: a reader older than them refuses such a k3.json (unknown key),
// never misreads one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/env.h"
#include "common/hash.h"
#include "common/status.h"
#include "formats/config.h"
#include "formats/expert_share.h"
#include "formats/experts_index.h"
#include "formats/prepared_layout.h"
#include "formats/vision_config.h"

namespace k3::prepared {

inline constexpr std::string_view kManifestFormat = "k3-prepared";
inline constexpr uint64_t kManifestVersion = 1;
// k3.json of the released model is ~1 MB; anything beyond this is not a manifest.
inline constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

enum class ExpertsMode { kLink, kCopy };
const char* ExpertsModeName(ExpertsMode m);  // "link" / "copy"

struct SourceShard {
  std::string name;    // file name inside model_dir
  uint64_t size = 0;
  std::string sha256;  // 64 lowercase hex from a download manifest; empty = absent (never invented)
};

struct SourceInfo {
  std::string model_dir_abs;    // canonical absolute path at pack time
  std::string model_dir_given;  // as typed on the command line
  std::vector<SourceShard> shards;
};

struct FileEntry {
  std::string path;
  uint64_t size = 0;
};

struct Manifest {
  ModelConfig config;  // resolved; experts_mxfp4 is true in version 1
  SourceInfo source;
  ExpertsMode experts_mode = ExpertsMode::kLink;
  // Files inside the prepared directory (relative paths): trunk.bin, resident.bin, experts.idx,
  // tokenizer/* when present. Expert files of copy mode are listed in expert_files instead.
  std::vector<FileEntry> files;
  // In experts.idx path-table order. Link mode: shard names relative to model_dir. Copy mode:
  // "experts/…" relative to the prepared directory, or absolute (stripe dirs).
  std::vector<FileEntry> expert_files;
  std::vector<TrunkRun> runs;
  // Trunk regions (layout order), resident regions, then experts.idx and tokenizer files.
  std::vector<Region> regions;
  // k3.json "share": this directory holds one rank's experts only (k3prep split; the others'
  // experts.idx records are absent). Absent for a full directory, and then not rendered, so a
  // full directory's k3.json is what it always was.
  std::optional<ExpertShare> share;
  // k3.json "vision": the vision config (CanonicalVisionConfigJson) of a directory that carries
  // the tower and projector in vision.bin (formats/vision_layout.h); absent for a text-only
  // directory, and then not rendered.
  std::optional<VisionConfig> vision;

  const FileEntry* FindFile(std::string_view path) const;
  const Region* FindRegion(std::string_view name) const;
};

// Pure checks of step 3 (no I/O). `source` names k3.json in messages.
Status ValidateManifest(const Manifest& m, const std::string& source);

// Canonical JSON text of a validated manifest (pretty-printed, '\n'-terminated).
Result<std::string> RenderManifest(const Manifest& m);
// Strict parse + ValidateManifest. Does NOT check k3.sum (see ReadVerifiedManifestText).
Result<Manifest> ParseManifest(std::string_view text, const std::string& source);

// "xxh3-128 <32 lowercase hex> k3.json\n" for these manifest bytes.
std::string RenderSumLine(std::string_view manifest_text);
// Parses exactly that line (one line, single spaces, lowercase hex, final '\n').
Result<Hash128> ParseSumLine(std::string_view text, const std::string& source);

// Steps 1–2: reads k3.sum and k3.json from `dir` and returns k3.json's text only when its hash
// matches.
Result<std::string> ReadVerifiedManifestText(Env* env, const std::string& dir);

// Validate, render, remove a stale k3.sum, write k3.json then k3.sum (each atomically).
Status WriteManifestAndSum(Env* env, const std::string& dir, const Manifest& m);

struct OpenOptions {
  // Relocates link-mode shard paths (k3run --model-dir); empty: the manifest's model_dir_abs.
  std::string model_dir;
  // Also compare every expert file's size with k3.json (needs the shards in link mode).
  bool check_expert_files = true;
};

struct PreparedDir {
  std::string dir;
  Manifest manifest;
  Hash128 manifest_hash;  // XXH3-128 of k3.json (what k3.sum holds): the model's identity
  ExpertsIndex experts;
  std::vector<std::string> expert_paths;  // resolved, experts.idx order
};

// Step 4's experts.idx part: reads it, compares its XXH3-128 with k3.json's region BEFORE
// decoding (mismatch → kIntegrity "experts.idx altered"), decodes it and validates it against
// the config and the path table of k3.json's expert_files. Shared by OpenPrepared and k3verify.
Result<ExpertsIndex> ReadExpertsIndex(Env* env, const std::string& dir, const Manifest& m);

// Steps 1–4.
Result<PreparedDir> OpenPrepared(Env* env, const std::string& dir, const OpenOptions& options = {});

// Where expert file `path` (from experts.idx) lives: absolute paths as they are; relative ones
// under model_dir (link mode; `model_dir` overrides model_dir_abs when non-empty) or under the
// prepared directory (copy mode).
std::string ResolveExpertPath(const Manifest& m, const std::string& prepared_dir,
                              const std::string& path, const std::string& model_dir = "");

}  // namespace k3::prepared
