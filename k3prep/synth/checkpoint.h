// `k3prep synth`: makes a synthetic K3 checkpoint in the exact released format (DESIGN.md §8).
//
// What a run writes into --out: the shards (model-%05d-of-%06d.safetensors), config.json
// (released nested shape), tiktoken.model + tokenizer_config.json, and, last,
// model.safetensors.index.json; with --dry-run only layout.json.
//
// Failure behaviour: free disk is checked BEFORE anything is written (refusal: kIo "not enough
// disk" with the required and available bytes). Shards are written under temporary names
// (st::Writer: "<shard>.k3part.k3tmp", renamed to "<shard>.k3part" when complete) and given
// their final names only after every shard and the tokenizer and config files exist; the index
// comes last. A failed run removes its temporaries, so an interrupted or failed synth never
// leaves a file that looks like part of a finished checkpoint.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/progress.h"
#include "common/status.h"
#include "k3prep/synth/layout.h"

namespace k3::synth {

struct SynthOptions {
  std::string preset = "tiny";
  std::string out;
  uint64_t seed = 0;
  int shards = 0;  // 0: one per layer plus the model-level shard
  SmallDType small = SmallDType::kMixed;
  bool vision = true;  // the vision tower and projector (false: --no-vision, text only)
  std::vector<std::string> sets;  // "key=value" config overrides
  bool dry_run = false;
  ProgressMode progress = ProgressMode::kNone;
  uint64_t chunk_bytes = 0;  // 0: kDefaultChunkBytes
};

struct SynthResult {
  Layout layout;
  uint64_t bytes_written = 0;  // all files, shards and small files
  double seconds = 0;          // shard generation + writing
};

// The config a run would use: preset, then --set overrides, validated.
Result<ModelConfig> ResolveSynthConfig(const SynthOptions& opts);

// The vision config a run would use (nullopt with --no-vision), for `text` the resolved config.
Result<std::optional<VisionConfig>> ResolveSynthVision(const SynthOptions& opts,
                                                       const ModelConfig& text);

// Runs synth. Exit-code categories: kInvalid for bad options/overrides or an --out holding
// foreign shards, kIo for "not enough disk" and write failures.
Result<SynthResult> RunSynth(Env* env, const SynthOptions& opts);

// Bytes the tokenizer files take at most for `vocab` (for the free-space check).
uint64_t TokenizerBytesEstimate(int64_t vocab);

}  // namespace k3::synth
