#include "formats/prepared_layout.h"

#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include "common/env.h"

namespace k3::prepared {
namespace {

using Shape = std::vector<uint64_t>;

uint64_t U(int v) { return v < 0 ? 0 : static_cast<uint64_t>(v); }

std::string ShapeString(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

void Want(std::vector<ExpectedTensor>& out, std::string name, std::vector<Shape> shapes,
          bool optional = false) {
  out.push_back(ExpectedTensor{std::move(name), std::move(shapes), 0, optional});
}

bool ShapeAccepted(const ExpectedTensor& want, const Shape& got) {
  for (const Shape& s : want.shapes) {
    if (s == got) return true;
  }
  return want.min_len > 0 && got.size() == 1 && got[0] >= want.min_len;
}

std::string AcceptedShapes(const ExpectedTensor& want) {
  std::string out;
  for (const Shape& s : want.shapes) out += (out.empty() ? "" : " or ") + ShapeString(s);
  if (want.min_len > 0) {
    out += (out.empty() ? "" : " or ") + std::string("[n] with n >= ") +
           std::to_string(want.min_len);
  }
  return out;
}

// Collects problems so one run reports many (a user fixing a checkpoint wants the whole list),
// but keeps the message bounded when, say, every expert is missing.
class Problems {
 public:
  void Add(std::string p) {
    if (shown_.size() < kMaxShown) shown_.push_back(std::move(p));
    ++total_;
  }
  bool empty() const { return total_ == 0; }
  Status ToStatus(const std::string& what) const {
    std::string msg = what + ": " + std::to_string(total_) + " problem(s):";
    for (const std::string& p : shown_) msg += "\n  " + p;
    if (total_ > shown_.size()) {
      msg += "\n  ... and " + std::to_string(total_ - shown_.size()) + " more";
    }
    return Status::Invalid(msg);
  }

 private:
  static constexpr size_t kMaxShown = 16;
  std::vector<std::string> shown_;
  size_t total_ = 0;
};

std::string LayerFileName(int layer) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "layer-%03d.bin", layer);
  return buf;
}

}  // namespace

std::string LayerPrefix(int layer) {
  return std::string(kModelPrefix) + "layers." + std::to_string(layer) + ".";
}

std::string ExpertTensorName(int layer, int expert, int sub) {
  return LayerPrefix(layer) + "block_sparse_moe.experts." + std::to_string(expert) + "." +
         std::string(kExpertSubNames[static_cast<size_t>(sub)]);
}

uint64_t TensorSpec::nbytes() const {
  // Saturates: a shape whose size overflows is then refused as too large by the kMaxFileBytes
  // checks instead of wrapping to a small, plausible size.
  uint64_t n = DTypeSize(dtype);
  for (uint64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / d) return UINT64_MAX;
    n *= d;
  }
  return n;
}

bool IsTrunkDType(DType t) { return t == DType::kBF16 || t == DType::kF32; }

// The canonical order: the tables of spec/MODEL.md §2.2–§2.6 top to bottom (per-layer norms and
// attention residuals, then attention, then the FFN). docs/FORMATS.md repeats this list.
std::vector<ExpectedTensor> ExpectedLayerTensors(const ModelConfig& c, int layer) {
  std::vector<ExpectedTensor> out;
  const std::string p = LayerPrefix(layer);
  const uint64_t h = U(c.hidden);
  Want(out, p + "input_layernorm.weight", {{h}});
  Want(out, p + "post_attention_layernorm.weight", {{h}});
  Want(out, p + "self_attention_res_norm.weight", {{h}});
  Want(out, p + "self_attention_res_proj.weight", {{1, h}, {h}});
  Want(out, p + "mlp_res_norm.weight", {{h}});
  Want(out, p + "mlp_res_proj.weight", {{1, h}, {h}});
  const std::string a = p + "self_attn.";
  if (c.is_mla(layer)) {
    const uint64_t heads = U(c.n_heads), rope = U(c.qk_rope), nope = U(c.qk_nope);
    const uint64_t v = U(c.v_head), ql = U(c.q_lora), kvl = U(c.kv_lora);
    Want(out, a + "q_a_proj.weight", {{ql, h}});
    Want(out, a + "q_a_layernorm.weight", {{ql}});
    Want(out, a + "q_b_proj.weight", {{heads * (nope + rope), ql}});
    Want(out, a + "kv_a_proj_with_mqa.weight", {{kvl + rope, h}});
    Want(out, a + "kv_a_layernorm.weight", {{kvl}});
    Want(out, a + "kv_b_proj.weight", {{heads * (nope + v), kvl}});
    Want(out, a + "o_proj.weight", {{h, heads * v}});
    Want(out, a + "g_proj.weight", {{heads * v, h}}, /*optional=*/!c.mla_out_gate);
  } else {
    const uint64_t heads = U(c.kda_heads), d = U(c.kda_head_dim), k = U(c.conv_k);
    const uint64_t pk = heads * d;
    Want(out, a + "q_proj.weight", {{pk, h}});
    Want(out, a + "k_proj.weight", {{pk, h}});
    Want(out, a + "v_proj.weight", {{pk, h}});
    // Released rank-3 [C][1][K]; [C][K] holds the same bytes.
    Want(out, a + "q_conv1d.weight", {{pk, 1, k}, {pk, k}});
    Want(out, a + "k_conv1d.weight", {{pk, 1, k}, {pk, k}});
    Want(out, a + "v_conv1d.weight", {{pk, 1, k}, {pk, k}});
    Want(out, a + "f_a_proj.weight", {{d, h}});
    Want(out, a + "f_b_proj.weight", {{pk, d}});
    Want(out, a + "b_proj.weight", {{heads, h}});
    // MODEL.md: any length >= num_heads; the release ships head_dim entries, zero-padded.
    out.push_back(ExpectedTensor{a + "A_log", {}, heads, false});
    Want(out, a + "dt_bias", {{pk}});
    Want(out, a + "g_proj.weight", {{pk, h}});
    Want(out, a + "o_norm.weight", {{d}});
    Want(out, a + "o_proj.weight", {{h, pk}});
  }
  if (c.is_dense(layer)) {
    const uint64_t di = U(c.dense_inter);
    Want(out, p + "mlp.gate_proj.weight", {{di, h}});
    Want(out, p + "mlp.up_proj.weight", {{di, h}});
    Want(out, p + "mlp.down_proj.weight", {{h, di}});
  } else {
    const std::string m = p + "block_sparse_moe.";
    const uint64_t e = U(c.n_experts), lat = U(c.latent);
    Want(out, m + "gate.weight", {{e, h}});
    Want(out, m + "gate.e_score_correction_bias", {{e}});
    Want(out, m + "routed_expert_down_proj.weight", {{lat, h}});
    Want(out, m + "routed_expert_up_proj.weight", {{h, lat}});
    Want(out, m + "routed_expert_norm.weight", {{lat}}, /*optional=*/!c.latent_norm);
    if (c.n_shared > 0) {
      const uint64_t si = U(c.moe_inter) * U(c.n_shared);
      Want(out, m + "shared_experts.gate_proj.weight", {{si, h}});
      Want(out, m + "shared_experts.up_proj.weight", {{si, h}});
      Want(out, m + "shared_experts.down_proj.weight", {{h, si}});
    }
  }
  return out;
}

std::vector<ExpectedTensor> ExpectedResidentTensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  const uint64_t h = U(c.hidden), v = U(c.vocab);
  const std::string p(kModelPrefix);
  Want(out, p + "embed_tokens.weight", {{v, h}});
  Want(out, std::string(kLmHeadName), {{v, h}});
  Want(out, p + "norm.weight", {{h}});
  Want(out, p + "output_attn_res_norm.weight", {{h}});
  Want(out, p + "output_attn_res_proj.weight", {{1, h}, {h}});
  return out;
}

std::vector<uint64_t> ExpertSubShape(const ModelConfig& c, int sub) {
  // w1 (gate) and w3 (up): latent → moe_inter; w2 (down): moe_inter → latent. Rows = outputs.
  const bool down = sub == 2 || sub == 3;
  const uint64_t rows = down ? U(c.latent) : U(c.moe_inter);
  const uint64_t cols = down ? U(c.moe_inter) : U(c.latent);
  const bool scale = sub % 2 == 1;
  const uint64_t group = U(c.mxfp4_group_size > 0 ? c.mxfp4_group_size : 32);
  return {rows, scale ? cols / group : cols / 2};
}

std::array<uint64_t, kExpertSubCount> ExpertSubSizes(const ModelConfig& c) {
  std::array<uint64_t, kExpertSubCount> out{};
  for (int s = 0; s < kExpertSubCount; ++s) {
    const Shape shape = ExpertSubShape(c, s);
    out[static_cast<size_t>(s)] = shape[0] * shape[1];  // U8
  }
  return out;
}

uint64_t ExpertBytes(const ModelConfig& c) {
  uint64_t total = 0;
  for (uint64_t s : ExpertSubSizes(c)) total += s;
  return total;
}

namespace {

// The config's counts within k3's bounds (config.h: every loop of BuildLayout runs per layer and
// per expert; ParseModelConfig enforces them, and a config built in code must not bypass them),
// and routed experts that the prepared format can store (MXFP4).
Status CheckLayoutConfig(const ModelConfig& c, const std::string& what) {
  if (c.n_layers > kMaxLayers || c.n_experts > kMaxExperts ||
      (int64_t{c.n_layers} - c.first_dense) * c.n_experts > kMaxRoutedExperts) {
    return Status::Invalid(what + ": config has num_hidden_layers " + std::to_string(c.n_layers) +
                           " and num_experts " + std::to_string(c.n_experts) +
                           ", beyond k3's bounds (" + std::to_string(kMaxLayers) + " layers, " +
                           std::to_string(kMaxExperts) + " experts, " +
                           std::to_string(kMaxRoutedExperts) + " routed experts)");
  }
  if (c.n_layers <= 0 || c.first_dense < 0 || c.first_dense > c.n_layers) {
    return Status::Invalid(what + ": config has num_hidden_layers " +
                           std::to_string(c.n_layers) + " and first_k_dense_replace " +
                           std::to_string(c.first_dense) +
                           "; need 0 <= first_k_dense_replace <= num_hidden_layers");
  }
  const int group = c.mxfp4_group_size > 0 ? c.mxfp4_group_size : 32;
  if (c.n_moe_layers() > 0 &&
      (c.n_experts <= 0 || c.latent <= 0 || c.moe_inter <= 0 || c.latent % group != 0 ||
       c.moe_inter % group != 0)) {
    return Status::Invalid(
        what + ": prepared format version 1 stores routed experts as MXFP4 and needs "
               "num_experts > 0 and routed_expert_hidden_size (" + std::to_string(c.latent) +
        ") and moe_intermediate_size (" + std::to_string(c.moe_inter) +
        ") positive multiples of the group size " + std::to_string(group) +
        "; this checkpoint cannot be packed (experts that are not MXFP4 are not supported)");
  }
  return Status::Ok();
}

// Matches the checkpoint's tensors with what the layout expects, recording every problem and
// which tensors were used.
class TensorMatcher {
 public:
  TensorMatcher(const std::vector<TensorSpec>& tensors, Problems* problems) : problems_(problems) {
    by_name_.reserve(tensors.size());
    used_.reserve(tensors.size());
    for (const TensorSpec& t : tensors) {
      if (!by_name_.emplace(t.name, &t).second) {
        problems_->Add("tensor \"" + t.name + "\" is listed twice");
      }
    }
  }

  // Places `want` at the first multiple of `align` at or after *offset.
  void Place(const ExpectedTensor& want, std::string_view file, uint64_t align, uint64_t* offset,
             std::vector<Region>* out) {
    auto it = by_name_.find(want.name);
    if (it == by_name_.end()) {
      if (!want.optional) {
        problems_->Add("tensor \"" + want.name + "\" is missing (expected shape " +
                       AcceptedShapes(want) + ")");
      }
      return;
    }
    const TensorSpec& t = *it->second;
    used_.insert(t.name);
    if (!IsTrunkDType(t.dtype)) {
      problems_->Add("tensor \"" + t.name + "\" has dtype " + DTypeName(t.dtype) +
                     ", expected BF16 or F32");
      return;
    }
    if (!ShapeAccepted(want, t.shape)) {
      problems_->Add("tensor \"" + t.name + "\" has shape " + ShapeString(t.shape) +
                     ", the config implies " + AcceptedShapes(want));
      return;
    }
    // Offsets stay ≤ kMaxFileBytes (2^50), so this sum cannot overflow; past the bound the file
    // would be one no disk holds, and offsets computed from it would wrap.
    const uint64_t at = AlignUp(*offset, align);
    if (t.nbytes() > kMaxFileBytes - at) {
      problems_->Add("tensor \"" + t.name + "\" (" + std::to_string(t.nbytes()) +
                     " bytes) would end beyond byte " + std::to_string(kMaxFileBytes) + " of " +
                     std::string(file) + ", the bound on prepared file sizes (2^50)");
      return;
    }
    out->push_back(Region{t.name, std::string(file), at, t.nbytes(), t.dtype, t.shape, {}});
    *offset = at + t.nbytes();
  }

  // Every routed expert's six sub-tensors are present as U8 with the MXFP4 shapes.
  void CheckExperts(const ModelConfig& c) {
    for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
      for (int e = 0; e < c.n_experts; ++e) {
        for (int s = 0; s < kExpertSubCount; ++s) CheckExpertSub(c, layer, e, s);
      }
    }
  }

  // No language_model.* tensor is left out of the layout.
  void CheckNoneLeftOver(const std::vector<TensorSpec>& tensors) {
    const std::string_view lm = "language_model.";
    for (const TensorSpec& t : tensors) {
      if (t.name.compare(0, lm.size(), lm) == 0 && used_.find(t.name) == used_.end()) {
        problems_->Add("tensor \"" + t.name +
                       "\" is not part of the prepared layout for this config (wrong config, or a "
                       "tensor the engine does not know)");
      }
    }
  }

 private:
  void CheckExpertSub(const ModelConfig& c, int layer, int e, int s) {
    const std::string name = ExpertTensorName(layer, e, s);
    auto it = by_name_.find(name);
    if (it == by_name_.end()) {
      problems_->Add("expert tensor \"" + name + "\" is missing");
      return;
    }
    const TensorSpec& t = *it->second;
    used_.insert(t.name);
    const Shape want = ExpertSubShape(c, s);
    if (t.dtype != DType::kU8 || t.shape != want) {
      problems_->Add("expert tensor \"" + name + "\" is " + DTypeName(t.dtype) + " " +
                     ShapeString(t.shape) + ", expected U8 " + ShapeString(want) +
                     " (MXFP4 for routed_expert_hidden_size " + std::to_string(c.latent) +
                     ", moe_intermediate_size " + std::to_string(c.moe_inter) + ")");
    }
  }

  Problems* problems_;
  std::unordered_map<std::string_view, const TensorSpec*> by_name_;
  std::unordered_set<std::string_view> used_;
};

}  // namespace

Result<Layout> BuildLayout(const ModelConfig& c, const std::vector<TensorSpec>& tensors,
                           bool require_experts) {
  const std::string what = "prepared layout";
  K3_RETURN_IF_ERROR(CheckLayoutConfig(c, what));
  Problems problems;
  TensorMatcher matcher(tensors, &problems);

  Layout layout;
  uint64_t offset = 0;
  for (int layer = 0; layer < c.n_layers; ++layer) {
    TrunkRun run;
    run.layer = layer;
    run.offset = offset;  // already a multiple of kRunAlign
    for (const ExpectedTensor& want : ExpectedLayerTensors(c, layer)) {
      matcher.Place(want, kTrunkFile, kTensorAlign, &offset, &layout.trunk);
    }
    offset = AlignUp(offset, kRunAlign);
    run.length = offset - run.offset;
    layout.runs.push_back(run);
  }
  layout.trunk_bytes = offset;

  offset = 0;
  for (const ExpectedTensor& want : ExpectedResidentTensors(c)) {
    matcher.Place(want, kResidentFile, kResidentAlign, &offset, &layout.resident);
  }
  // Padded so the last tensor can be read with whole O_DIRECT blocks.
  layout.resident_bytes = AlignUp(offset, kResidentAlign);

  if (require_experts) matcher.CheckExperts(c);
  matcher.CheckNoneLeftOver(tensors);
  if (!problems.empty()) return problems.ToStatus(what);
  return layout;
}

namespace {

// Copy mode's placement of experts [begin, end) of every MoE layer (the others get no slot).
ExpertPlan PlanExperts(const ModelConfig& c, const std::vector<std::string>& stripe_dirs,
                       int begin, int end) {
  ExpertPlan plan;
  const uint64_t n_disks = stripe_dirs.empty() ? 1 : stripe_dirs.size();
  const uint64_t bytes = ExpertBytes(c);
  plan.slots.resize(U(c.n_moe_layers()) * U(c.n_experts));
  std::vector<uint64_t> ends;
  for (int layer = c.first_dense; layer < c.n_layers; ++layer) {
    // file id of (this layer, disk d), assigned on first use so no file is empty.
    std::vector<int64_t> ids(n_disks, -1);
    for (int e = begin; e < end; ++e) {
      const uint64_t disk = (U(layer) * U(c.n_experts) + U(e)) % n_disks;
      if (ids[disk] < 0) {
        ids[disk] = static_cast<int64_t>(plan.files.size());
        plan.files.push_back(stripe_dirs.empty()
                                 ? std::string(kExpertsDir) + "/" + LayerFileName(layer)
                                 : JoinPath(stripe_dirs[disk], LayerFileName(layer)));
        ends.push_back(0);
      }
      const size_t id = static_cast<size_t>(ids[disk]);
      ExpertSlot& slot = plan.slots[ExpertRecordIndex(c, layer, e)];
      slot.file_id = static_cast<uint32_t>(id);
      slot.offset = AlignUp(ends[id], kExpertAlign);
      ends[id] = slot.offset + bytes;
    }
  }
  for (uint64_t end_of_file : ends) plan.file_sizes.push_back(AlignUp(end_of_file, kExpertAlign));
  return plan;
}

}  // namespace

ExpertPlan PlanCopyExperts(const ModelConfig& c, const std::vector<std::string>& stripe_dirs) {
  return PlanExperts(c, stripe_dirs, 0, c.n_experts);
}

ExpertPlan PlanShareExperts(const ModelConfig& c, int begin, int end) {
  return PlanExperts(c, {}, begin, end);
}

}  // namespace k3::prepared
