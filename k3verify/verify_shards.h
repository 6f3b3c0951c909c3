// `k3verify shards MODEL_DIR [--manifest FILE]`: audits a downloaded (or synthetic) checkpoint.
//
// Checks, in order: every *.safetensors shard's structure (each shard on its own, so every bad
// shard is named, not just the first), the checkpoint as a whole (no tensor in two shards,
// model.safetensors.index.json agreement), config.json (without an index file, also the tensor
// set it implies: every layer's tensors and experts present, else exit 2 naming each incomplete
// layer and its first missing tensor), and then the SHA-256 of every shard,
// hashed in parallel over files, compared with the download manifest when there is one
// (--manifest, or MODEL_DIR/k3-download.json when present) and printed otherwise.
// Exit status: 3 when bytes differ from the manifest (hash, size, a listed file missing),
// else 2 for structure or config problems, else 1 for I/O failures, else 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/progress.h"
#include "common/status.h"

namespace k3::verify {

struct ShardsOptions {
  std::string model_dir;
  std::string manifest;  // empty: MODEL_DIR/k3-download.json when it exists
  int jobs = 0;          // hashing threads; 0 = number of cores
  ProgressMode progress = ProgressMode::kAuto;
};

struct ShardReport {
  std::string name;
  uint64_t size = 0;
  uint64_t tensors = 0;
  std::string sha256;           // empty when not hashed (unreadable)
  std::string expected_sha256;  // from the manifest, empty without one
  std::vector<Status> problems;
};

struct ShardsReport {
  std::string model_dir;
  std::string manifest_path;  // the manifest used, empty when none
  std::vector<ShardReport> shards;
  std::vector<Status> problems;  // not tied to one shard: index, config, manifest
  uint64_t total_bytes = 0;
  uint64_t total_tensors = 0;
  double hash_seconds = 0;

  // The overall verdict: OK, or the most serious problem's code with a summary message.
  Status Verdict() const;
};

// Runs every check. A Status is returned only when the audit itself cannot start (MODEL_DIR is
// not a directory); everything found is in the report.
Result<ShardsReport> VerifyShards(Env* env, const ShardsOptions& options);

std::string RenderShardsText(const ShardsReport& report);
std::string RenderShardsJson(const ShardsReport& report);

}  // namespace k3::verify
