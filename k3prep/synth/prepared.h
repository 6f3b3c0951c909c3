// The prepared directory of a synthetic checkpoint, built in memory: what `k3prep synth` then
// `k3prep pack --experts copy` would produce for a config, without writing or reading a byte
// (k3run's budget plans need only the manifest and experts.idx; tests/bench/plan_released.cpp
// plans the released config this way, without its 1.6 TB of weights).
//
// The tensor list is synth's layout (release names, shapes and dtypes, --small-dtype mixed); the
// manifest and experts.idx come from pack's own functions (k3prep/pack/manifest.h), so the two
// cannot drift. Region and expert hashes are zero, the source lists no shard, no tokenizer.
// Thread safety: a plain function.
#pragma once

#include "common/status.h"
#include "formats/config.h"
#include "formats/prepared_manifest.h"
#include "k3prep/synth/layout.h"

namespace k3::synth {

// kInvalid when the config cannot be laid out or packed (BuildLayout's, pack's rules).
Result<prepared::PreparedDir> PreparedForConfig(const ModelConfig& c,
                                                SmallDType small = SmallDType::kMixed);

}  // namespace k3::synth
