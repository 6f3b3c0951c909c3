// The model shapes `k3prep synth` can build (DESIGN.md §8 table) and the `--set key=value`
// overrides on top of them.
//
// Goals: exactly the dimensions of the table (tiny, small, bench, full = the release), and any
// config field overridable by its released JSON key name, validated by the same reader that
// loads real checkpoints (serialise with ReleasedConfigJson, edit, parse with ParseModelConfig),
// so a synthetic checkpoint can never carry a config the engine would refuse.
// Non-goals: keys the engine does not read (they cannot be overridden: nothing would use them).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "formats/config.h"
#include "formats/vision_config.h"

namespace k3::synth {

// The released one-based MLA layer list (24 entries), shared by small, bench and full.
const std::vector<int>& ReleasedFullAttnLayers();

// "tiny" | "small" | "bench" | "full"; kInvalid naming --preset otherwise. Token ids are set
// from the vocabulary (SetSpecialIds), experts are MXFP4 with group size 32.
Result<ModelConfig> PresetConfig(std::string_view preset);

// The preset's vision tower and projector (docs/SYNTH.md "Vision"): scaled with the preset, the
// released dimensions for "full". `text_hidden` is the text model's hidden size (after --set).
Result<VisionConfig> PresetVision(std::string_view preset, int text_hidden);

// bos = V−256, eos = V−254, pad = V−1, media = V−235 (DESIGN.md §8).
void SetSpecialIds(ModelConfig* c);

// Applies "key=value" overrides in order. `key` is any key the config reader looks up (e.g.
// num_experts, vocab_size, head_dim, full_attn_layers) or a token id; `value` is a number,
// true/false, or a comma-separated integer list (full_attn_layers=4,8,13). The edited config is
// parsed back with ParseModelConfig; token ids not set explicitly follow the new vocab_size.
// Failures are kInvalid naming the --set argument (unknown key, bad value, or the reader's rule).
Result<ModelConfig> ApplyOverrides(const ModelConfig& base, const std::vector<std::string>& sets);

// Rules synth adds on top of the config reader: vocab_size ≥ 512 (256 bytes + 256 added
// tokens) and experts stored as MXFP4.
Status ValidateForSynth(const ModelConfig& c);

}  // namespace k3::synth
