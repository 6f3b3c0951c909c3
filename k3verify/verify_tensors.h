// `k3verify tensors DIR (--fixtures FILE | --emit FILE) [--names REGEX…] [--model-dir DIR]`:
// cross-checks named tensors of a checkpoint or a prepared directory against a tensor fixture
// (formats/tensor_fixture.h), or records one.
//
// --fixtures: every listed tensor (or those whose name matches one of --names) is looked up by
// its checkpoint name, then its dtype, shape, XXH3-128 and sample bit patterns are compared;
// every mismatch is an integrity problem naming the tensor and the field ("dtype", "shape",
// "xxh3_128", "sample[index N]"); a listed tensor the directory lacks is exit 2.
// --emit: every language-model tensor (or those matching --names) is read once and recorded
// with SampleIndices; MXFP4 pairs become one entry with dequantised samples. The file is
// written atomically and only when every tensor was read, so a failed emit leaves nothing.
// Emitting from a checkpoint and from its prepared directory gives byte-identical files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/progress.h"
#include "common/status.h"

namespace k3::verify {

struct TensorsOptions {
  std::string dir;
  std::string fixtures;            // check against this fixture, or
  std::string emit;                // write a fixture here
  std::vector<std::string> names;  // ECMAScript regexes, searched anywhere in the name
  std::string model_dir;           // prepared link mode: where the shards are now
  int jobs = 0;                    // tensors read at once; 0 = number of cores
  ProgressMode progress = ProgressMode::kAuto;
};

struct TensorsReport {
  std::string dir;
  std::string kind;  // "checkpoint" / "prepared directory"; empty when DIR could not be opened
  std::string fixtures;
  std::string emit;
  uint64_t tensors = 0;  // checked or emitted
  uint64_t skipped = 0;  // --emit: checkpoint tensors outside the language model
  uint64_t bytes = 0;
  double seconds = 0;
  std::vector<Status> problems;

  Status Verdict() const;
};

// Fails only when the options are unusable (neither or both of --fixtures/--emit, a bad regex);
// everything found is in the report.
Result<TensorsReport> VerifyTensors(Env* env, const TensorsOptions& options);

std::string RenderTensorsText(const TensorsReport& report);
std::string RenderTensorsJson(const TensorsReport& report);

}  // namespace k3::verify
