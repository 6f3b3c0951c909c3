#include "k3verify/tensor_source.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/aligned_buffer.h"
#include "common/direct_reader.h"
#include "formats/mxfp4.h"
#include "formats/prepared_layout.h"
#include "formats/tensor_fixture.h"
#include "formats/vision_layout.h"

namespace k3::verify {
namespace {

constexpr uint64_t kChunk = 8u << 20;

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Parses "<digits>" at s[*pos] (no sign, no leading zero unless "0"), advancing *pos.
bool ParseIndex(const std::string& s, size_t* pos, int* out) {
  size_t p = *pos;
  int64_t v = 0;
  while (p < s.size() && s[p] >= '0' && s[p] <= '9' && v < (int64_t{1} << 31)) {
    v = v * 10 + (s[p] - '0');
    ++p;
  }
  if (p == *pos || p - *pos > 10 || (s[*pos] == '0' && p - *pos > 1) || v >= (int64_t{1} << 31)) {
    return false;
  }
  *pos = p;
  *out = static_cast<int>(v);
  return true;
}

// "language_model.model.layers.<L>.block_sparse_moe.experts.<e>.<rest>".
bool ParseExpertName(const std::string& name, int* layer, int* expert, std::string* rest) {
  const std::string head = std::string(prepared::kModelPrefix) + "layers.";
  const std::string mid = ".block_sparse_moe.experts.";
  if (name.compare(0, head.size(), head) != 0) return false;
  size_t p = head.size();
  if (!ParseIndex(name, &p, layer) || name.compare(p, mid.size(), mid) != 0) return false;
  p += mid.size();
  if (!ParseIndex(name, &p, expert) || p >= name.size() || name[p] != '.') return false;
  *rest = name.substr(p + 1);
  return true;
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

TensorPiece PieceOf(const st::CheckpointIndex::Location& loc) {
  return TensorPiece{loc.shard->path, loc.file_offset(), loc.tensor->nbytes()};
}

}  // namespace

uint64_t TensorRef::numel() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

uint64_t TensorRef::bytes() const {
  uint64_t n = 0;
  for (const TensorPiece& p : pieces) n += p.length;
  return n;
}

Result<TensorDir> TensorDir::Open(Env* env, const std::string& dir, const std::string& model_dir) {
  if (!env->IsDirectory(dir)) {
    return Status::Invalid(dir + ": not a directory (give a checkpoint or a prepared directory)");
  }
  TensorDir out;
  if (env->Exists(JoinPath(dir, std::string(prepared::kSumFile))) ||
      env->Exists(JoinPath(dir, std::string(prepared::kManifestFile)))) {
    prepared::OpenOptions o;
    o.model_dir = model_dir;
    K3_ASSIGN_OR_RETURN(out.prepared_, prepared::OpenPrepared(env, dir, o));
  } else {
    K3_ASSIGN_OR_RETURN(out.checkpoint_, st::CheckpointIndex::Open(env, dir));
    // Vision tensors are the model's when config.json has a vision_config (pack carries them
    // then); otherwise they are left out like any other name outside the language model.
    const std::string config = JoinPath(dir, "config.json");
    if (env->Exists(config)) {
      K3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(env, config, kMaxConfigBytes));
      K3_ASSIGN_OR_RETURN(const std::optional<VisionConfig> v, ParseVisionConfig(text, config));
      out.checkpoint_vision_ = v.has_value();
    }
  }
  return out;
}

Result<std::optional<TensorRef>> TensorDir::ExpertRef(int layer, int expert, int sub,
                                                     bool mxfp4) const {
  const prepared::PreparedDir& p = *prepared_;
  const prepared::ExpertsIndex& idx = p.experts;
  if (layer < static_cast<int>(idx.first_moe_layer) || layer >= static_cast<int>(idx.n_layers) ||
      expert < 0 || expert >= static_cast<int>(idx.n_experts)) {
    return std::optional<TensorRef>();
  }
  const prepared::ExpertRecord& rec =
      idx.At(static_cast<uint32_t>(layer), static_cast<uint32_t>(expert));
  const std::string full = prepared::ExpertTensorName(layer, expert, sub);
  if (rec.absent()) {
    // Only a share has absent records (OpenPrepared checked it), and it names who holds them.
    const prepared::ExpertShare& share = *p.manifest.share;
    const int owner = share.Map(static_cast<int>(idx.n_experts)).Owner(expert);
    return Status::Invalid(p.dir + ": tensor \"" + full + "\" (layer " + std::to_string(layer) +
                           ", expert " + std::to_string(expert) +
                           ") is in another rank's share (rank " + std::to_string(owner) +
                           "'s): " + prepared::AbsentExpertReason(share));
  }
  const std::string& path = p.expert_paths[rec.file_id];
  TensorRef ref;
  auto piece = [&](int s) {
    const auto si = static_cast<size_t>(s);
    return TensorPiece{path, rec.offset + rec.sub_offset[si], rec.sub_size[si]};
  };
  if (mxfp4) {
    ref.name = full.substr(0, full.size() - fixture::kPackedSuffix.size());
    ref.mxfp4 = true;
    const std::vector<uint64_t> packed = prepared::ExpertSubShape(p.manifest.config, sub);
    ref.shape = {packed[0], packed[1] * 2};
    ref.pieces = {piece(sub), piece(sub + 1)};
  } else {
    ref.name = full;
    ref.dtype = DType::kU8;
    ref.shape = prepared::ExpertSubShape(p.manifest.config, sub);
    ref.pieces = {piece(sub)};
  }
  return std::optional<TensorRef>(std::move(ref));
}

Result<std::optional<TensorRef>> TensorDir::FindPreparedRaw(const std::string& name) const {
  const prepared::Manifest& m = prepared_->manifest;
  const prepared::Region* r = m.FindRegion(name);
  if (r != nullptr && (r->file == prepared::kTrunkFile || r->file == prepared::kResidentFile ||
                       r->file == prepared::kVisionFile)) {
    return std::optional<TensorRef>(
        TensorRef{name, false, r->dtype, r->shape,
                  {TensorPiece{JoinPath(prepared_->dir, r->file), r->offset, r->length}}});
  }
  int layer = 0, expert = 0;
  std::string rest;
  if (!ParseExpertName(name, &layer, &expert, &rest)) return std::optional<TensorRef>();
  for (int s = 0; s < prepared::kExpertSubCount; ++s) {
    if (rest == prepared::kExpertSubNames[static_cast<size_t>(s)]) return ExpertRef(layer, expert, s, false);
  }
  return std::optional<TensorRef>();
}

Result<std::optional<TensorRef>> TensorDir::CheckpointPair(const std::string& name) const {
  const auto* packed = checkpoint_->Find(name + std::string(fixture::kPackedSuffix));
  const auto* scale = checkpoint_->Find(name + std::string(fixture::kScaleSuffix));
  if (packed == nullptr && scale == nullptr) return std::optional<TensorRef>();
  const std::string where = checkpoint_->dir() + ": MXFP4 matrix \"" + name + "\"";
  if (packed == nullptr || scale == nullptr) {
    return Status::Invalid(where + ": has " + (packed ? "weight_packed" : "weight_scale") +
                           " but no " + (packed ? "weight_scale" : "weight_packed"));
  }
  const st::TensorInfo& p = *packed->tensor;
  const st::TensorInfo& s = *scale->tensor;
  if (p.dtype != DType::kU8 || s.dtype != DType::kU8 || p.shape.size() != 2 ||
      s.shape.size() != 2 || p.shape[0] != s.shape[0] || p.shape[1] * 2 != s.shape[1] * 32) {
    return Status::Invalid(where + ": weight_packed " + DTypeName(p.dtype) + " " +
                           ShapeString(p.shape) + " and weight_scale " + DTypeName(s.dtype) + " " +
                           ShapeString(s.shape) +
                           " do not form an MXFP4 matrix (U8 [rows][cols/2] and U8 [rows][cols/32])");
  }
  TensorRef ref;
  ref.name = name;
  ref.mxfp4 = true;
  ref.shape = {p.shape[0], p.shape[1] * 2};
  ref.pieces = {PieceOf(*packed), PieceOf(*scale)};
  return std::optional<TensorRef>(std::move(ref));
}

Result<std::optional<TensorRef>> TensorDir::Find(const std::string& name, bool mxfp4) const {
  if (checkpoint_) {
    if (mxfp4) return CheckpointPair(name);
    const auto* loc = checkpoint_->Find(name);
    if (loc == nullptr) return std::optional<TensorRef>();
    return std::optional<TensorRef>(
        TensorRef{name, false, loc->tensor->dtype, loc->tensor->shape, {PieceOf(*loc)}});
  }
  if (!mxfp4) return FindPreparedRaw(name);
  int layer = 0, expert = 0;
  std::string rest;
  if (!ParseExpertName(name, &layer, &expert, &rest)) return std::optional<TensorRef>();
  for (int s = 0; s < prepared::kExpertSubCount; s += 2) {
    const std::string_view packed = prepared::kExpertSubNames[static_cast<size_t>(s)];
    if (rest + std::string(fixture::kPackedSuffix) == packed) return ExpertRef(layer, expert, s, true);
  }
  return std::optional<TensorRef>();
}

std::vector<TensorRef> TensorDir::All(uint64_t* skipped) const {
  std::vector<TensorRef> out;
  *skipped = 0;
  if (prepared_) {
    for (const prepared::Region& r : prepared_->manifest.regions) {
      if (r.file != prepared::kTrunkFile && r.file != prepared::kResidentFile &&
          r.file != prepared::kVisionFile) {
        continue;
      }
      out.push_back(**FindPreparedRaw(r.name));  // a trunk/resident/vision region: always found
    }
    const prepared::ExpertsIndex& idx = prepared_->experts;
    for (uint32_t layer = idx.first_moe_layer; layer < idx.n_layers; ++layer) {
      for (uint32_t e = 0; e < idx.n_experts; ++e) {
        // A share records only what it holds; the other ranks' shares record the rest.
        if (idx.At(layer, e).absent()) continue;
        for (int s = 0; s < prepared::kExpertSubCount; s += 2) {
          out.push_back(**ExpertRef(static_cast<int>(layer), static_cast<int>(e), s, true));
        }
      }
    }
    return out;
  }
  for (const auto& loc : checkpoint_->All()) {
    const std::string& name = loc.tensor->name;
    if (name.rfind("language_model.", 0) != 0 &&
        !(checkpoint_vision_ && IsVisionTensorName(name))) {
      ++*skipped;
      continue;
    }
    // A valid pair becomes one MXFP4 entry (at its weight_packed); anything else stays raw.
    for (std::string_view suffix : {fixture::kPackedSuffix, fixture::kScaleSuffix}) {
      if (!EndsWith(name, suffix)) continue;
      auto pair = CheckpointPair(name.substr(0, name.size() - suffix.size()));
      if (pair.ok() && pair->has_value()) {
        if (suffix == fixture::kPackedSuffix) out.push_back(std::move(**pair));
        goto next;
      }
    }
    out.push_back(TensorRef{name, false, loc.tensor->dtype, loc.tensor->shape, {PieceOf(loc)}});
  next:;
  }
  return out;
}

Result<TensorContent> ReadTensor(Env* env, FileCache* files, const TensorRef& ref,
                                 const std::vector<uint64_t>& indices,
                                 const std::function<void(uint64_t)>& progress_bytes) {
  // The bytes each sample needs: (piece, offset in piece) → filled while streaming.
  struct Want {
    size_t piece;
    uint64_t offset;
    uint32_t length;
    uint8_t bytes[8];
  };
  std::vector<Want> wants;
  const uint64_t cols = ref.mxfp4 ? ref.shape[1] : 0;
  const uint32_t es = ref.mxfp4 ? 1 : DTypeSize(ref.dtype);
  for (uint64_t i : indices) {
    if (ref.mxfp4) {
      const uint64_t row = i / cols, col = i % cols;
      wants.push_back(Want{0, row * (cols / 2) + col / 2, 1, {}});
      wants.push_back(Want{1, row * (cols / 32) + col / 32, 1, {}});
    } else {
      wants.push_back(Want{0, i * es, es, {}});
    }
  }

  K3_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(kChunk, 4096));
  Xxh3_128Stream hash;
  for (size_t pi = 0; pi < ref.pieces.size(); ++pi) {
    const TensorPiece& piece = ref.pieces[pi];
    auto it = files->find(piece.path);
    if (it == files->end()) {
      K3_ASSIGN_OR_RETURN(std::unique_ptr<File> f, env->Open(piece.path, OpenMode::kReadDirect));
      it = files->emplace(piece.path, std::move(f)).first;
    }
    File* file = it->second.get();
    const uint32_t align = env->DirectAlignment(piece.path);
    for (uint64_t done = 0; done < piece.length;) {
      const uint64_t n = std::min(kChunk, piece.length - done);
      K3_RETURN_IF_ERROR(DirectRead(file, align, piece.offset + done, n, buf.data())
                             .WithContext("tensor \"" + ref.name + "\""));
      hash.Update(buf.data(), static_cast<size_t>(n));
      for (Want& w : wants) {
        if (w.piece == pi && w.offset >= done && w.offset + w.length <= done + n) {
          std::memcpy(w.bytes, buf.data() + (w.offset - done), w.length);
        }
      }
      done += n;
      if (progress_bytes) progress_bytes(n);
    }
  }
  TensorContent out;
  out.xxh3_128 = hash.Digest();
  for (size_t k = 0; k < indices.size(); ++k) {
    if (ref.mxfp4) {
      const uint8_t packed = wants[2 * k].bytes[0];
      const uint8_t scale = wants[2 * k + 1].bytes[0];
      // Element parity picks the nibble; DecodeElement on a one-byte row does exactly that.
      const float v = mxfp4::DecodeElement(&packed, &scale, indices[k] % cols % 2);
      out.bits.push_back(std::bit_cast<uint32_t>(v));
    } else {
      uint64_t bits = 0;  // little-endian element
      for (uint32_t b = 0; b < es; ++b) bits |= uint64_t{wants[k].bytes[b]} << (8 * b);
      out.bits.push_back(bits);
    }
  }
  return out;
}

}  // namespace k3::verify
