#include "k3prep/synth/checkpoint.h"

#include <chrono>
#include <memory>
#include <set>

#include "common/log.h"
#include "formats/safetensors.h"
#include "k3prep/synth/manifests.h"
#include "k3prep/synth/pipeline.h"
#include "k3prep/synth/presets.h"
#include "k3prep/synth/shard_meta.h"
#include "k3prep/synth/tokenizer.h"
#include "k3prep/synth/weights.h"

namespace k3::synth {
namespace {

constexpr const char* kPartSuffix = ".k3part";
constexpr const char* kIndexName = "model.safetensors.index.json";

std::string Human(uint64_t bytes) { return FormatIecBytes(static_cast<double>(bytes)); }

// The closest existing directory at or above `path` (free space is asked there before --out
// exists, so the check happens before anything, even the directory, is created).
std::string ExistingAncestor(Env* env, const std::string& path) {
  std::string p = path;
  while (!p.empty() && !env->IsDirectory(p)) {
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.rfind('/');
    if (slash == std::string::npos) return ".";
    p = slash == 0 ? "/" : p.substr(0, slash);
  }
  return p.empty() ? "." : p;
}

// --out may hold an earlier synth of the same layout (its files are replaced), but not shards
// this layout would not overwrite: the checkpoint reader takes every *.safetensors in the
// directory, so a stale one would silently join the new checkpoint.
Status CheckOutDir(Env* env, const std::string& out, const Layout& layout) {
  if (!env->Exists(out)) return Status::Ok();
  if (!env->IsDirectory(out)) {
    return Status::Invalid("--out " + out + " exists and is not a directory");
  }
  K3_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(out));
  std::set<std::string> planned;
  for (const ShardPlan& sp : layout.shards) planned.insert(sp.name);
  for (const DirEntry& e : entries) {
    const std::string suffix = ".safetensors";
    if (e.name.size() >= suffix.size() &&
        e.name.compare(e.name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        !planned.count(e.name)) {
      return Status::Invalid("--out " + out + " already holds " + e.name +
                             ", which this synth would not replace (different preset or "
                             "--shards); it would join the new checkpoint. Remove the old "
                             "checkpoint or choose an empty --out");
    }
  }
  return Status::Ok();
}

// Writes every shard as "<name>.k3part" through st::Writer, consuming the pipeline's chunks.
class ShardSink {
 public:
  ShardSink(Env* env, const std::string& out, const Layout& layout, Progress* progress)
      : env_(env), out_(out), layout_(layout), progress_(progress) {}

  Status Consume(const Chunk& c) {
    if (!writer_) K3_RETURN_IF_ERROR(Open(c.shard));
    progress_->SetStatus("layer " + (c.layer < 0 ? std::string("model-level")
                                                 : std::to_string(c.layer + 1) + "/" +
                                                       std::to_string(layout_.config.n_layers)) +
                         ", shard " + std::to_string(c.shard + 1) + "/" +
                         std::to_string(layout_.shards.size()));
    K3_RETURN_IF_ERROR(writer_->Append(c.data.data(), c.data.size()));
    progress_->Add(c.data.size());
    if (c.last_in_shard) {
      K3_RETURN_IF_ERROR(writer_->Finish());
      writer_.reset();
      parts_.push_back(c.shard);
    }
    return Status::Ok();
  }

  // Removes the completed "<name>.k3part" files of a failed run (best effort).
  void RemoveParts() {
    if (writer_) writer_->Abandon();
    for (size_t s : parts_) (void)env_->Remove(PartPath(s));
    parts_.clear();
  }

  std::string PartPath(size_t s) const { return JoinPath(out_, layout_.shards[s].name) + kPartSuffix; }
  size_t completed() const { return parts_.size(); }

 private:
  Status Open(size_t s) {
    const ShardPlan& sp = layout_.shards[s];
    writer_ = std::make_unique<st::Writer>(env_, PartPath(s));
    writer_->SetMetadata(ShardMetadata());
    for (size_t i = sp.first_tensor; i < sp.first_tensor + sp.tensor_count; ++i) {
      const TensorPlan& t = layout_.tensors[i];
      writer_->Add(t.name, t.dtype, t.shape);
    }
    if (writer_->FileSize() != sp.file_size) {
      return Status::Invalid("internal: shard " + sp.name + " sized " +
                             std::to_string(writer_->FileSize()) + " bytes, layout planned " +
                             std::to_string(sp.file_size));
    }
    return writer_->Begin();
  }

  Env* env_;
  const std::string out_;
  const Layout& layout_;
  Progress* progress_;
  std::unique_ptr<st::Writer> writer_;
  std::vector<size_t> parts_;
};

}  // namespace

uint64_t TokenizerBytesEstimate(int64_t vocab) {
  // tiktoken.model: "base64(bytes) rank\n" per rank, generously 64 bytes; tokenizer_config.json
  // for 256 added tokens stays far below 256 KiB.
  return static_cast<uint64_t>(vocab) * 64 + (256u << 10);
}

Result<ModelConfig> ResolveSynthConfig(const SynthOptions& opts) {
  K3_ASSIGN_OR_RETURN(ModelConfig base, PresetConfig(opts.preset));
  K3_ASSIGN_OR_RETURN(ModelConfig c, ApplyOverrides(base, opts.sets));
  K3_RETURN_IF_ERROR(ValidateForSynth(c));
  return c;
}

Result<std::optional<VisionConfig>> ResolveSynthVision(const SynthOptions& opts,
                                                       const ModelConfig& text) {
  if (!opts.vision) return std::optional<VisionConfig>();
  K3_ASSIGN_OR_RETURN(VisionConfig v, PresetVision(opts.preset, text.hidden));
  return std::optional<VisionConfig>(v);
}

Result<SynthResult> RunSynth(Env* env, const SynthOptions& opts) {
  if (opts.out.empty()) return Status::Invalid("--out DIR is required");
  K3_ASSIGN_OR_RETURN(ModelConfig config, ResolveSynthConfig(opts));
  K3_ASSIGN_OR_RETURN(const std::optional<VisionConfig> vision, ResolveSynthVision(opts, config));
  const VisionConfig* v = vision ? &*vision : nullptr;
  K3_ASSIGN_OR_RETURN(Layout layout, BuildLayout(env, config, opts.small, opts.shards, v));
  const std::string config_json = ReleasedConfigJson(config, v);
  SynthResult result;

  if (opts.dry_run) {
    const std::string text = LayoutJson(layout, opts.preset, opts.seed, config_json);
    if (env->Exists(opts.out) && !env->IsDirectory(opts.out)) {
      return Status::Invalid("--out " + opts.out + " exists and is not a directory");
    }
    K3_RETURN_IF_ERROR(env->MakeDirs(opts.out));
    K3_RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(opts.out, "layout.json"), text));
    result.bytes_written = text.size();
    result.layout = std::move(layout);
    return result;
  }

  // Everything that will be written, sized before the first byte is.
  const std::string index_json = IndexJson(layout);
  const uint64_t required = layout.total_file_bytes + index_json.size() + config_json.size() +
                            TokenizerBytesEstimate(config.vocab);
  K3_RETURN_IF_ERROR(CheckOutDir(env, opts.out, layout));
  const std::string where = ExistingAncestor(env, opts.out);
  K3_ASSIGN_OR_RETURN(uint64_t available, env->FreeSpace(where));
  if (available < required) {
    return Status::Io("not enough disk: synth --preset " + opts.preset + " needs " +
                      std::to_string(required) + " bytes (" + Human(required) + ") in " + opts.out +
                      ", but the file system holding " + where + " has " +
                      std::to_string(available) + " bytes (" + Human(available) +
                      ") available; free space, choose another --out, or a smaller preset");
  }
  K3_RETURN_IF_ERROR(env->MakeDirs(opts.out));

  const WeightGenerator gen(layout, opts.seed);
  Progress progress("synth " + opts.preset, layout.total_tensor_bytes, opts.progress);
  ShardSink sink(env, opts.out, layout, &progress);
  const auto t0 = std::chrono::steady_clock::now();
  Status s = RunPipeline(layout, gen, 0, layout.shards.size(),
                         opts.chunk_bytes ? opts.chunk_bytes : kDefaultChunkBytes,
                         [&](const Chunk& c) { return sink.Consume(c); });
  if (s.ok()) {
    progress.SetStatus("tokenizer and config");
    s = WriteSynthTokenizer(env, opts.out, config.vocab);
  }
  if (s.ok()) s = WriteFileAtomic(env, JoinPath(opts.out, "config.json"), config_json);
  // Shards take their final names only now, all together, then the index that lists them.
  for (size_t i = 0; s.ok() && i < layout.shards.size(); ++i) {
    s = env->Rename(sink.PartPath(i), JoinPath(opts.out, layout.shards[i].name));
    if (!s.ok()) {
      // Shards already renamed are complete files; without the index they are not a checkpoint.
      for (size_t k = 0; k < i; ++k) (void)env->Remove(JoinPath(opts.out, layout.shards[k].name));
    }
  }
  if (s.ok()) s = env->SyncDir(opts.out);
  if (s.ok()) s = WriteFileAtomic(env, JoinPath(opts.out, kIndexName), index_json);
  if (!s.ok()) {
    sink.RemoveParts();
    progress.SetStatus("failed");
    progress.Finish();
    return s;
  }
  progress.SetStatus("done");
  progress.Finish();
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.bytes_written = layout.total_file_bytes + index_json.size() + config_json.size();
  result.layout = std::move(layout);
  return result;
}

}  // namespace k3::synth
