// RamWeights: prepared-directory regions read into RAM on first use (see weights.h).
#include "k3run/weights/weights.h"

#include <cstring>
#include <string>
#include <utility>

#include "common/hash.h"
#include "formats/prepared_layout.h"
#include "k3run/weights/weight_views.h"

namespace k3::run {

using prepared::Region;

ops::Dims DimsFromConfig(const ModelConfig& c) {
  ops::Dims d;
  d.hidden = c.hidden;
  d.rms_eps = c.rms_eps;
  d.kda_heads = c.kda_heads;
  d.kda_head_dim = c.kda_head_dim;
  d.conv_k = c.conv_k;
  d.gate_lb = c.gate_lb;
  d.n_heads = c.n_heads;
  d.q_lora = c.q_lora;
  d.kv_lora = c.kv_lora;
  d.qk_nope = c.qk_nope;
  d.qk_rope = c.qk_rope;
  d.v_head = c.v_head;
  d.mla_out_gate = c.mla_out_gate;
  d.mla_latent_eps = ops::kUpstreamMlaLatentEps;
  d.n_experts = c.n_experts;
  d.topk = c.topk;
  d.n_shared = c.n_shared;
  d.latent = c.latent;
  d.moe_inter = c.moe_inter;
  d.routed_scale = c.routed_scale;
  d.moe_renorm = c.moe_renorm;
  d.latent_norm = c.latent_norm;
  d.first_dense = c.first_dense;
  d.dense_inter = c.dense_inter;
  d.attn_res_block = c.attn_res_block;
  d.situ_b1 = c.situ_b1;
  d.situ_b2 = c.situ_b2;
  return d;
}

namespace {

uint64_t Numel(const Region& r) {
  uint64_t n = 1;
  for (uint64_t s : r.shape) n *= s;
  return n;
}

Result<kernels::WeightType> MatrixType(const Region& r) {
  if (r.dtype == DType::kBF16) return kernels::WeightType::kBF16;
  if (r.dtype == DType::kF32) return kernels::WeightType::kF32;
  return Status::Invalid(r.file + ": tensor " + r.name + " has dtype " + DTypeName(r.dtype) +
                         "; trunk matrices must be BF16 or F32 (re-run k3prep pack)");
}

}  // namespace

// Small vectors may be BF16 or F32 on disk (MODEL.md §2, DESIGN.md §8 --small-dtype).
Status WidenInto(const Region& r, const uint8_t* bytes, std::vector<float>* out) {
  const uint64_t n = Numel(r);
  out->resize(n);
  if (r.dtype == DType::kBF16) {
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, bytes + 2 * i, 2);
      (*out)[i] = kernels::Bf16ToF32(b);
    }
  } else if (r.dtype == DType::kF32) {
    std::memcpy(out->data(), bytes, n * 4);
  } else {
    return Status::Invalid(r.file + ": tensor " + r.name + " has dtype " + DTypeName(r.dtype) +
                           "; a small vector must be BF16 or F32 (re-run k3prep pack)");
  }
  return Status::Ok();
}

struct RamWeights::LoadedLayer {
  AlignedBuffer run;  // the whole trunk run, as on disk
  LayerView view;
};

struct RamWeights::LoadedExpert {
  bool tried = false;
  bool ok = false;
  AlignedBuffer bytes;  // the six sub-tensors, canonical order
  ops::GluWeights w;
};

RamWeights::RamWeights(Env* env, const prepared::PreparedDir* prepared,
                       const RamWeightsOptions& options)
    : env_(env), prepared_(prepared), options_(options),
      dims_(DimsFromConfig(prepared->manifest.config)) {}

RamWeights::~RamWeights() = default;

Result<std::unique_ptr<RamWeights>> RamWeights::Open(Env* env, const prepared::PreparedDir* prepared,
                                                     const RamWeightsOptions& options) {
  std::unique_ptr<RamWeights> w(new RamWeights(env, prepared, options));
  K3_RETURN_IF_ERROR(ops::ValidateDims(w->dims_));
  K3_ASSIGN_OR_RETURN(w->trunk_, env->Open(JoinPath(prepared->dir, std::string(prepared::kTrunkFile)),
                                           OpenMode::kRead));
  K3_ASSIGN_OR_RETURN(w->resident_,
                      env->Open(JoinPath(prepared->dir, std::string(prepared::kResidentFile)),
                                OpenMode::kRead));
  const ModelConfig& c = prepared->manifest.config;
  w->layers_.resize(static_cast<size_t>(c.n_layers));
  w->experts_.resize(prepared->experts.records.size());
  w->expert_files_.resize(prepared->expert_paths.size());
  return w;
}

uint64_t RamWeights::PlannedResidentBytes() const {
  uint64_t bytes = 0;
  for (const prepared::TrunkRun& r : prepared_->manifest.runs) bytes += r.length;
  if (const Region* r = prepared_->manifest.FindRegion(prepared::kLmHeadName)) bytes += r->length;
  return bytes;
}

Result<const ops::LayerWeights*> RamWeights::Layer(int layer) {
  K3_ASSIGN_OR_RETURN(LoadedLayer * l, LoadLayer(layer));
  return &l->view.w;
}

Result<RamWeights::LoadedLayer*> RamWeights::LoadLayer(int layer) {
  const prepared::Manifest& m = prepared_->manifest;
  if (layer < 0 || layer >= m.config.n_layers) {
    return Status::Invalid("layer " + std::to_string(layer) + " out of range");
  }
  auto& slot = layers_[static_cast<size_t>(layer)];
  if (slot) return slot.get();
  K3_ASSIGN_OR_RETURN(const prepared::TrunkRun* run, FindTrunkRun(*prepared_, layer));
  auto l = std::make_unique<LoadedLayer>();
  K3_ASSIGN_OR_RETURN(l->run, AlignedBuffer::AllocateLarge(run->length));  // see StreamingWeights::Init
  K3_RETURN_IF_ERROR(trunk_->ReadExact(run->offset, run->length, l->run.data()));
  counters_.trunk += run->length;

  K3_RETURN_IF_ERROR(BindLayer(*prepared_, dims_, layer, *run, l->run.data(), &l->view));
  slot = std::move(l);
  return slot.get();
}

Result<File*> RamWeights::ExpertFile(uint32_t file_id) {
  auto& f = expert_files_[file_id];
  if (!f) {
    K3_ASSIGN_OR_RETURN(f, env_->Open(prepared_->expert_paths[file_id], OpenMode::kRead));
  }
  return f.get();
}

Status RamWeights::LoadExpert(int layer, int expert, LoadedExpert* out) {
  const prepared::ExpertRecord& rec = prepared_->experts.At(static_cast<uint32_t>(layer),
                                                        static_cast<uint32_t>(expert));
  K3_ASSIGN_OR_RETURN(File * file, ExpertFile(rec.file_id));
  K3_ASSIGN_OR_RETURN(out->bytes, AlignedBuffer::Allocate(rec.length, 64));
  K3_RETURN_IF_ERROR(file->ReadExact(rec.offset, rec.length, out->bytes.data()));
  counters_.experts += rec.length;
  return BindExpert(*prepared_, dims_, layer, expert, out->bytes.data(), options_.verify_reads,
                    &out->w);
}

const ops::GluWeights* RamWeights::Expert(int layer, int expert) {
  const ModelConfig& c = prepared_->manifest.config;
  if (layer < c.first_dense || layer >= c.n_layers || expert < 0 || expert >= c.n_experts) {
    return nullptr;
  }
  const uint64_t i = prepared_->experts.RecordIndex(static_cast<uint32_t>(layer),
                                                    static_cast<uint32_t>(expert));
  auto& slot = experts_[i];
  if (!slot) slot = std::make_unique<LoadedExpert>();
  if (!slot->tried) {
    slot->tried = true;
    if (prepared_->experts.records[i].absent()) {
      // Another rank's share holds it (OpenPrepared checked that only a share has such records).
      failures_.push_back(ExpertFailure{
          layer, expert, prepared::AbsentExpertReason(prepared_->manifest.share.value_or(
                             prepared::ExpertShare{}))});
      return nullptr;
    }
    Status s = LoadExpert(layer, expert, slot.get());
    slot->ok = s.ok();
    if (!s.ok()) failures_.push_back(ExpertFailure{layer, expert, s.ToString()});
  }
  return slot->ok ? &slot->w : nullptr;
}

Status RamWeights::EmbeddingRows(const int32_t* ids, int64_t n, float* out) {
  return ReadEmbeddingRows(resident_.get(), *prepared_, dims_, ids, n, out, &counters_.embedding);
}

int64_t RamWeights::LmHeadChunkRows() const { return prepared_->manifest.config.vocab; }

Result<kernels::Matrix> RamWeights::LmHeadRows(int64_t begin, int64_t n) {
  if (lm_head_matrix_.data == nullptr) {
    K3_ASSIGN_OR_RETURN(const Region* r, LmHeadRegion(*prepared_, dims_));
    K3_ASSIGN_OR_RETURN(kernels::WeightType t, LmHeadType(*r));
    K3_ASSIGN_OR_RETURN(lm_head_, AlignedBuffer::AllocateLarge(r->length));
    K3_RETURN_IF_ERROR(resident_->ReadExact(r->offset, r->length, lm_head_.data()));
    counters_.lm_head += r->length;
    lm_head_matrix_ = kernels::Matrix{t, static_cast<int64_t>(r->shape[0]),
                                      static_cast<int64_t>(r->shape[1]), lm_head_.data(), nullptr};
    K3_RETURN_IF_ERROR(kernels::ValidateMatrix(lm_head_matrix_, prepared::kLmHeadName));
  }
  kernels::Matrix m = lm_head_matrix_;
  if (begin < 0 || n < 0 || begin + n > m.rows) {
    return Status::Invalid("lm_head rows [" + std::to_string(begin) + ", +" + std::to_string(n) +
                           ") outside " + std::to_string(m.rows) + " rows");
  }
  const int64_t esize = m.type == kernels::WeightType::kF32 ? 4 : 2;
  m.data = static_cast<const uint8_t*>(m.data) + begin * m.cols * esize;
  m.rows = n;
  return m;
}

Result<const HeadWeights*> HeadCache::Get(File* resident, const prepared::PreparedDir& p,
                                           const ops::Dims& dims, uint64_t* bytes_read) {
  if (head_) return head_.get();
  auto h = std::make_unique<HeadWeights>();
  K3_RETURN_IF_ERROR(ReadHead(resident, p, dims, &vectors_, h.get(), bytes_read));
  head_ = std::move(h);
  return head_.get();
}

Result<const HeadWeights*> RamWeights::Head() {
  return head_.Get(resident_.get(), *prepared_, dims_, &counters_.head);
}

Result<const prepared::TrunkRun*> FindTrunkRun(const prepared::PreparedDir& p, int layer) {
  for (const prepared::TrunkRun& r : p.manifest.runs) {
    if (r.layer == layer) return &r;
  }
  return Status::Invalid(p.dir + "/k3.json: no trunk run for layer " + std::to_string(layer));
}

Status BindLayer(const prepared::PreparedDir& p, const ops::Dims& dims, int layer,
                 const prepared::TrunkRun& run, const uint8_t* run_bytes, LayerView* view) {
  const prepared::Manifest& m = p.manifest;
  view->vecs.clear();
  view->w = ops::LayerWeights{};
  const std::string pre = prepared::LayerPrefix(layer);
  // Every lookup is bounded by the run, so a manifest bug can never point outside the buffer.
  auto find = [&](const std::string& name, const Region** out) -> Status {
    const Region* r = m.FindRegion(name);
    if (r == nullptr || r->file != prepared::kTrunkFile || r->offset < run.offset ||
        r->length > run.length || r->offset - run.offset > run.length - r->length) {
      return Status::Invalid(p.dir + "/k3.json: layer " + std::to_string(layer) +
                             ": tensor " + name + " is missing or outside the layer's trunk run" +
                             " (re-run k3prep pack)");
    }
    *out = r;
    return Status::Ok();
  };
  auto at = [&](const Region* r) { return run_bytes + (r->offset - run.offset); };
  auto mat = [&](const std::string& name, kernels::Matrix* out) -> Status {
    const Region* r = nullptr;
    K3_RETURN_IF_ERROR(find(pre + name, &r));
    K3_ASSIGN_OR_RETURN(kernels::WeightType t, MatrixType(*r));
    if (r->shape.size() != 2) {
      return Status::Invalid(r->file + ": tensor " + r->name + " must be rank 2");
    }
    *out = kernels::Matrix{t, static_cast<int64_t>(r->shape[0]),
                           static_cast<int64_t>(r->shape[1]), at(r), nullptr};
    return Status::Ok();
  };
  auto vec = [&](const std::string& name, ops::Vec* out) -> Status {
    const Region* r = nullptr;
    K3_RETURN_IF_ERROR(find(pre + name, &r));
    std::vector<float> v;
    K3_RETURN_IF_ERROR(WidenInto(*r, at(r), &v));
    view->vecs.push_back(std::move(v));
    *out = ops::Vec(view->vecs.back().data(), view->vecs.back().size());
    return Status::Ok();
  };

  const ModelConfig& c = m.config;
  ops::LayerWeights& w = view->w;
  K3_RETURN_IF_ERROR(vec("input_layernorm.weight", &w.input_layernorm));
  K3_RETURN_IF_ERROR(vec("post_attention_layernorm.weight", &w.post_attention_layernorm));
  K3_RETURN_IF_ERROR(vec("self_attention_res_norm.weight", &w.self_attention_res_norm));
  K3_RETURN_IF_ERROR(vec("self_attention_res_proj.weight", &w.self_attention_res_proj));
  K3_RETURN_IF_ERROR(vec("mlp_res_norm.weight", &w.mlp_res_norm));
  K3_RETURN_IF_ERROR(vec("mlp_res_proj.weight", &w.mlp_res_proj));
  w.is_mla = c.is_mla(layer);
  if (w.is_mla) {
    ops::MlaWeights& a = w.mla;
    K3_RETURN_IF_ERROR(mat("self_attn.q_a_proj.weight", &a.q_a_proj));
    K3_RETURN_IF_ERROR(vec("self_attn.q_a_layernorm.weight", &a.q_a_layernorm));
    K3_RETURN_IF_ERROR(mat("self_attn.q_b_proj.weight", &a.q_b_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.kv_a_proj_with_mqa.weight", &a.kv_a_proj_with_mqa));
    K3_RETURN_IF_ERROR(vec("self_attn.kv_a_layernorm.weight", &a.kv_a_layernorm));
    K3_RETURN_IF_ERROR(mat("self_attn.kv_b_proj.weight", &a.kv_b_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.o_proj.weight", &a.o_proj));
    if (c.mla_out_gate) K3_RETURN_IF_ERROR(mat("self_attn.g_proj.weight", &a.g_proj));
  } else {
    ops::KdaWeights& a = w.kda;
    K3_RETURN_IF_ERROR(mat("self_attn.q_proj.weight", &a.q_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.k_proj.weight", &a.k_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.v_proj.weight", &a.v_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.f_a_proj.weight", &a.f_a_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.f_b_proj.weight", &a.f_b_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.b_proj.weight", &a.b_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.g_proj.weight", &a.g_proj));
    K3_RETURN_IF_ERROR(mat("self_attn.o_proj.weight", &a.o_proj));
    K3_RETURN_IF_ERROR(vec("self_attn.q_conv1d.weight", &a.q_conv));
    K3_RETURN_IF_ERROR(vec("self_attn.k_conv1d.weight", &a.k_conv));
    K3_RETURN_IF_ERROR(vec("self_attn.v_conv1d.weight", &a.v_conv));
    K3_RETURN_IF_ERROR(vec("self_attn.A_log", &a.A_log));
    K3_RETURN_IF_ERROR(vec("self_attn.dt_bias", &a.dt_bias));
    K3_RETURN_IF_ERROR(vec("self_attn.o_norm.weight", &a.o_norm));
  }
  w.is_dense = c.is_dense(layer);
  if (w.is_dense) {
    K3_RETURN_IF_ERROR(mat("mlp.gate_proj.weight", &w.dense.gate));
    K3_RETURN_IF_ERROR(mat("mlp.up_proj.weight", &w.dense.up));
    K3_RETURN_IF_ERROR(mat("mlp.down_proj.weight", &w.dense.down));
  } else {
    ops::MoeWeights& e = w.moe;
    K3_RETURN_IF_ERROR(mat("block_sparse_moe.gate.weight", &e.gate));
    K3_RETURN_IF_ERROR(vec("block_sparse_moe.gate.e_score_correction_bias", &e.score_bias));
    K3_RETURN_IF_ERROR(mat("block_sparse_moe.routed_expert_down_proj.weight", &e.down));
    K3_RETURN_IF_ERROR(mat("block_sparse_moe.routed_expert_up_proj.weight", &e.up));
    if (c.latent_norm) {
      K3_RETURN_IF_ERROR(vec("block_sparse_moe.routed_expert_norm.weight", &e.norm));
    }
    if (c.n_shared > 0) {
      K3_RETURN_IF_ERROR(mat("block_sparse_moe.shared_experts.gate_proj.weight", &e.shared.gate));
      K3_RETURN_IF_ERROR(mat("block_sparse_moe.shared_experts.up_proj.weight", &e.shared.up));
      K3_RETURN_IF_ERROR(mat("block_sparse_moe.shared_experts.down_proj.weight", &e.shared.down));
    }
  }
  K3_RETURN_IF_ERROR(ops::ValidateLayerWeights(w, dims, layer)
                         .WithContext(p.dir + "/" + std::string(prepared::kTrunkFile)));
  return Status::Ok();
}

Status BindExpert(const prepared::PreparedDir& p, const ops::Dims& dims, int layer, int expert,
                  const uint8_t* bytes, bool verify, ops::GluWeights* out) {
  const prepared::ExpertRecord& rec =
      p.experts.At(static_cast<uint32_t>(layer), static_cast<uint32_t>(expert));
  const std::string& path = p.expert_paths[rec.file_id];
  if (verify) {
    const uint64_t got = Xxh3_64(bytes, rec.length);
    if (got != rec.xxh3_64) {
      return Status::Integrity(path + ": bytes [" + std::to_string(rec.offset) + ", +" +
                               std::to_string(rec.length) + ") have XXH3-64 " + Hex64(got) +
                               ", experts.idx says " + Hex64(rec.xxh3_64));
    }
  }
  const int64_t I = dims.moe_inter, Lt = dims.latent;
  auto mx = [&](int sub, int64_t rows, int64_t cols) {
    return kernels::Matrix{kernels::WeightType::kMXFP4, rows, cols,
                           bytes + rec.sub_offset[static_cast<size_t>(sub)],
                           bytes + rec.sub_offset[static_cast<size_t>(sub + 1)]};
  };
  // Canonical order: w1 (gate), w2 (down), w3 (up), each packed then scale.
  out->gate = mx(0, I, Lt);
  out->down = mx(2, Lt, I);
  out->up = mx(4, I, Lt);
  const uint64_t want_packed = static_cast<uint64_t>(I * Lt / 2);
  const uint64_t want_scale = static_cast<uint64_t>(I * Lt / kernels::kMxfp4GroupSize);
  for (int sub = 0; sub < prepared::kExpertSubCount; ++sub) {
    const uint64_t want = sub % 2 == 0 ? want_packed : want_scale;
    if (rec.sub_size[static_cast<size_t>(sub)] != want) {
      return Status::Invalid(path + ": sub-tensor " +
                             std::string(prepared::kExpertSubNames[static_cast<size_t>(sub)]) +
                             " has " + std::to_string(rec.sub_size[static_cast<size_t>(sub)]) +
                             " bytes, the config implies " + std::to_string(want));
    }
  }
  return ops::ValidateExpert(*out, dims, layer, expert);
}

Status ReadEmbeddingRows(File* resident, const prepared::PreparedDir& p, const ops::Dims& dims,
                         const int32_t* ids, int64_t n, float* out, uint64_t* counter) {
  const std::string name = std::string(prepared::kModelPrefix) + "embed_tokens.weight";
  const Region* r = p.manifest.FindRegion(name);
  if (r == nullptr || r->shape.size() != 2 || r->shape[1] != static_cast<uint64_t>(dims.hidden)) {
    return Status::Invalid(p.dir + "/k3.json: " + name + " missing or mis-shaped");
  }
  const uint64_t E = r->shape[1];
  const uint64_t esize = DTypeSize(r->dtype);
  std::vector<uint8_t> row(E * esize);
  std::vector<float> wide;
  for (int64_t t = 0; t < n; ++t) {
    const uint64_t id = static_cast<uint64_t>(ids[t]);
    if (id >= r->shape[0]) {
      return Status::Invalid("token id " + std::to_string(ids[t]) + " outside the embedding of " +
                             std::to_string(r->shape[0]) + " rows");
    }
    K3_RETURN_IF_ERROR(resident->ReadExact(r->offset + id * E * esize, row.size(), row.data()));
    *counter += row.size();
    Region one = *r;
    one.shape = {E};
    K3_RETURN_IF_ERROR(WidenInto(one, row.data(), &wide));
    std::memcpy(out + static_cast<uint64_t>(t) * E, wide.data(), E * sizeof(float));
  }
  return Status::Ok();
}

Result<const prepared::Region*> LmHeadRegion(const prepared::PreparedDir& p, const ops::Dims& dims) {
  const Region* r = p.manifest.FindRegion(prepared::kLmHeadName);
  const std::vector<uint64_t> want = {static_cast<uint64_t>(p.manifest.config.vocab),
                                      static_cast<uint64_t>(dims.hidden)};
  if (r == nullptr || r->shape != want) {
    return Status::Invalid(p.dir + "/k3.json: " + std::string(prepared::kLmHeadName) +
                           " missing or not [vocab_size][hidden_size] (re-run k3prep pack)");
  }
  return r;
}

Result<kernels::WeightType> LmHeadType(const prepared::Region& r) { return MatrixType(r); }

Status ReadHead(File* resident, const prepared::PreparedDir& p, const ops::Dims& dims,
                std::vector<std::vector<float>>* storage, HeadWeights* h, uint64_t* counter) {
  const std::string pre(prepared::kModelPrefix);
  const std::string names[3] = {pre + "norm.weight", pre + "output_attn_res_norm.weight",
                                pre + "output_attn_res_proj.weight"};
  ops::Vec* dst[3] = {&h->norm, &h->output_attn_res_norm, &h->output_attn_res_proj};
  storage->resize(3);
  for (int i = 0; i < 3; ++i) {
    const Region* r = p.manifest.FindRegion(names[i]);
    if (r == nullptr || r->file != prepared::kResidentFile || Numel(*r) != uint64_t(dims.hidden)) {
      return Status::Invalid(p.dir + "/k3.json: " + names[i] +
                             " missing or not hidden_size elements (re-run k3prep pack)");
    }
    std::vector<uint8_t> bytes(r->length);
    K3_RETURN_IF_ERROR(resident->ReadExact(r->offset, r->length, bytes.data()));
    *counter += r->length;
    K3_RETURN_IF_ERROR(WidenInto(*r, bytes.data(), &(*storage)[static_cast<size_t>(i)]));
    *dst[i] = ops::Vec((*storage)[static_cast<size_t>(i)]);
  }
  return Status::Ok();
}

}  // namespace k3::run
