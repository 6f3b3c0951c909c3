// k3.json: schema (render/parse) and the pure validation of a Manifest.
#include "formats/prepared_manifest.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "common/hex.h"
#include "formats/manifest_json.h"
#include "formats/vision_layout.h"

namespace k3::prepared {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

bool IsAbsolute(std::string_view p) { return !p.empty() && p.front() == '/'; }

// Relative, '/'-separated, no empty, "." or ".." component: cannot escape its base directory.
bool IsSafeRelative(std::string_view p) {
  if (p.empty() || IsAbsolute(p) || p.find('\0') != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string_view::npos) end = p.size();
    std::string_view part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// numel × dtype size, false on overflow.
bool RegionBytes(const Region& r, uint64_t* out) {
  uint64_t n = DTypeSize(r.dtype);
  for (uint64_t d : r.shape) {
    if (d != 0 && n > UINT64_MAX / d) return false;
    n *= d;
  }
  *out = n;
  return true;
}

std::string RegionWhere(const std::string& source, size_t i, const Region& r) {
  return source + ": regions[" + std::to_string(i) + "] \"" + r.name + "\" (file " + r.file +
         ", offset " + std::to_string(r.offset) + ")";
}

Status ValidateFiles(const Manifest& m, const std::string& source) {
  std::set<std::string_view> seen;
  for (size_t i = 0; i < m.files.size(); ++i) {
    const FileEntry& f = m.files[i];
    const std::string where = source + ": files[" + std::to_string(i) + "] \"" + f.path + "\"";
    if (!IsSafeRelative(f.path)) {
      return Status::Invalid(where + ": path must be relative to the prepared directory with no "
                                     "empty, \".\" or \"..\" component");
    }
    if (!seen.insert(f.path).second) return Status::Invalid(where + ": listed twice");
    const bool known = f.path == kTrunkFile || f.path == kResidentFile ||
                       f.path == kExpertsIndexFile || f.path == kVisionFile ||
                       StartsWith(f.path, std::string(kTokenizerDir) + "/");
    if (!known) {
      return Status::Invalid(where + ": not a file of the prepared format (trunk.bin, "
                                     "resident.bin, experts.idx, vision.bin, tokenizer/*)");
    }
  }
  for (std::string_view need : {kTrunkFile, kResidentFile, kExpertsIndexFile}) {
    if (m.FindFile(need) == nullptr) {
      return Status::Invalid(source + ": files: required file \"" + std::string(need) +
                             "\" is not listed");
    }
  }
  std::set<std::string_view> expert_seen;
  for (size_t i = 0; i < m.expert_files.size(); ++i) {
    const FileEntry& f = m.expert_files[i];
    const std::string where =
        source + ": expert_files[" + std::to_string(i) + "] \"" + f.path + "\"";
    if (!expert_seen.insert(f.path).second) return Status::Invalid(where + ": listed twice");
    if (m.experts_mode == ExpertsMode::kLink) {
      if (!IsSafeRelative(f.path)) {
        return Status::Invalid(where + ": link mode paths are shard names relative to model_dir");
      }
      auto shard = std::find_if(m.source.shards.begin(), m.source.shards.end(),
                                [&](const SourceShard& s) { return s.name == f.path; });
      if (shard == m.source.shards.end()) {
        return Status::Invalid(where + ": not one of source.shards");
      }
      if (shard->size != f.size) {
        return Status::Invalid(where + ": size " + std::to_string(f.size) +
                               " differs from source.shards size " + std::to_string(shard->size));
      }
    } else if (!IsAbsolute(f.path) &&
               !(IsSafeRelative(f.path) && StartsWith(f.path, std::string(kExpertsDir) + "/"))) {
      return Status::Invalid(where + ": copy mode paths are under experts/ or absolute (stripe "
                                     "directories)");
    }
  }
  return Status::Ok();
}

Status ValidateSource(const Manifest& m, const std::string& source) {
  if (!IsAbsolute(m.source.model_dir_abs)) {
    return Status::Invalid(source + ": source.model_dir_abs \"" + m.source.model_dir_abs +
                           "\" is not an absolute path");
  }
  std::set<std::string_view> seen;
  for (size_t i = 0; i < m.source.shards.size(); ++i) {
    const SourceShard& s = m.source.shards[i];
    const std::string where =
        source + ": source.shards[" + std::to_string(i) + "] \"" + s.name + "\"";
    if (!IsSafeRelative(s.name)) return Status::Invalid(where + ": not a relative file name");
    if (!seen.insert(s.name).second) return Status::Invalid(where + ": listed twice");
    if (!s.sha256.empty() && !IsLowerHex(s.sha256, 64)) {
      return Status::Invalid(where + ": sha256 \"" + s.sha256 +
                             "\" is not 64 lowercase hex digits");
    }
  }
  return Status::Ok();
}

// Every region inside its file, sizes consistent with dtype × shape, names unique, no overlap.
Status ValidateRegionBounds(const Manifest& m, const std::string& source) {
  std::set<std::string_view> names;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::map<std::string_view, std::vector<Span>> by_file;
  for (size_t i = 0; i < m.regions.size(); ++i) {
    const Region& r = m.regions[i];
    const std::string where = RegionWhere(source, i, r);
    if (!names.insert(r.name).second) return Status::Invalid(where + ": region name listed twice");
    const FileEntry* f = m.FindFile(r.file);
    if (f == nullptr) return Status::Invalid(where + ": file is not listed in files");
    if (r.offset > f->size || r.length > f->size - r.offset) {
      return Status::Invalid(where + ": bytes [" + std::to_string(r.offset) + ", +" +
                             std::to_string(r.length) + ") lie outside file " + r.file + " of " +
                             std::to_string(f->size) + " bytes");
    }
    uint64_t bytes = 0;
    if (!RegionBytes(r, &bytes) || bytes != r.length) {
      return Status::Invalid(where + ": length " + std::to_string(r.length) +
                             " is not numel x size of dtype " + DTypeName(r.dtype));
    }
    by_file[r.file].push_back(Span{r.offset, r.offset + r.length, i});
  }
  for (auto& [file, spans] : by_file) {
    std::sort(spans.begin(), spans.end(),
              [](const Span& a, const Span& b) { return a.begin < b.begin; });
    for (size_t k = 1; k < spans.size(); ++k) {
      if (spans[k].begin < spans[k - 1].end) {
        return Status::Invalid(source + ": regions \"" + m.regions[spans[k - 1].index].name +
                               "\" and \"" + m.regions[spans[k].index].name + "\" overlap in " +
                               std::string(file) + " at byte offset " +
                               std::to_string(spans[k].begin));
      }
    }
  }
  return Status::Ok();
}

// Whole-file regions: experts.idx and each tokenizer file is one region covering the file.
Status ValidateWholeFileRegions(const Manifest& m, const std::string& source) {
  for (const FileEntry& f : m.files) {
    if (f.path == kTrunkFile || f.path == kResidentFile || f.path == kVisionFile) continue;
    const Region* r = m.FindRegion(f.path);
    if (r == nullptr || r->file != f.path || r->offset != 0 || r->length != f.size ||
        r->dtype != DType::kU8 || r->shape != std::vector<uint64_t>{f.size}) {
      return Status::Invalid(source + ": file " + f.path +
                             " must have exactly one region named after it covering all " +
                             std::to_string(f.size) + " bytes (dtype U8, shape [size])");
    }
  }
  return Status::Ok();
}

// experts.idx's size follows from the config and expert_files (its path table); checking it here
// means the reader never loads a file larger than the config's record count needs (at most
// kMaxRoutedExperts records, 512 MiB), whatever size k3.json claims.
Status ValidateExpertsIndexSize(const Manifest& m, const std::string& source) {
  std::vector<std::string> paths;
  for (const FileEntry& f : m.expert_files) {
    // experts.idx's own limit on a path (a u32 length it refuses above 4096).
    if (f.path.size() > kMaxExpertPathLen) {
      return Status::Invalid(source + ": expert_files: path of " + std::to_string(f.path.size()) +
                             " bytes exceeds " + std::to_string(kMaxExpertPathLen));
    }
    paths.push_back(f.path);
  }
  const uint64_t records = static_cast<uint64_t>(std::max(0, m.config.n_moe_layers())) *
                           static_cast<uint64_t>(std::max(0, m.config.n_experts));
  const uint64_t want = ExpertsIndexFileSize(paths, records);
  const uint64_t got = m.FindFile(kExpertsIndexFile)->size;
  if (got != want) {
    return Status::Invalid(source + ": files: experts.idx is listed as " + std::to_string(got) +
                           " bytes, but " + std::to_string(records) + " records and the " +
                           std::to_string(paths.size()) + " expert_files paths make " +
                           std::to_string(want) + " bytes");
  }
  return Status::Ok();
}

// A share's fields against the config: the map is version 1's, the ranks fit the experts, the
// rank is one of them.
Status ValidateShare(const Manifest& m, const std::string& source) {
  if (!m.share) return Status::Ok();
  const ExpertShare& s = *m.share;
  if (s.map != kContiguousMap) {
    return Status::Invalid(source + ": share.map: \"" + s.map +
                           "\" is not \"contiguous\" (the only map of format version 1)");
  }
  if (s.ranks > static_cast<uint32_t>(kMaxRanks)) {
    return Status::Invalid(source + ": share.ranks: " + std::to_string(s.ranks) +
                           " exceeds the bound " + std::to_string(kMaxRanks));
  }
  K3_RETURN_IF_ERROR(ValidateRanks(static_cast<int>(s.ranks), RoutedExperts(m.config),
                                   source + ": share.ranks"));
  if (s.rank >= s.ranks) {
    return Status::Invalid(source + ": share.rank: " + std::to_string(s.rank) +
                           " is not below share.ranks " + std::to_string(s.ranks) +
                           " (ranks are numbered 0 to ranks - 1)");
  }
  return Status::Ok();
}

// Recomputes the layout from the config and the listed tensors and requires equality: this is
// where dtypes and shapes are checked against the config, and offsets against the format.
Status ValidateAgainstLayout(const Manifest& m, const std::string& source) {
  std::vector<TensorSpec> tensors;
  std::map<std::string_view, const Region*> tensor_regions;
  for (const Region& r : m.regions) {
    if (r.file == kTrunkFile || r.file == kResidentFile) {
      tensors.push_back(TensorSpec{r.name, r.dtype, r.shape});
      tensor_regions[r.name] = &r;
    }
  }
  for (const TensorSpec& t : tensors) {
    // BuildLayout ignores names outside the language model (vision tensors of a checkpoint);
    // in a manifest such a region would be bytes nobody reads.
    if (!StartsWith(t.name, "language_model.")) {
      return Status::Invalid(source + ": region \"" + t.name + "\" in " +
                             tensor_regions.at(t.name)->file +
                             " is not a tensor of the prepared layout");
    }
  }
  Result<Layout> layout = BuildLayout(m.config, tensors, /*require_experts=*/false);
  if (!layout.ok()) {
    return Status::Invalid(source + ": regions do not match the config: " +
                           layout.status().message());
  }
  for (const std::vector<Region>* part : {&layout->trunk, &layout->resident}) {
    for (const Region& want : *part) {
      const Region& got = *tensor_regions.at(want.name);
      if (got.file != want.file || got.offset != want.offset) {
        return Status::Invalid(source + ": region \"" + want.name + "\" is at " + got.file +
                               " offset " + std::to_string(got.offset) +
                               ", the format places it at " + want.file + " offset " +
                               std::to_string(want.offset) +
                               " (canonical order and alignment, docs/FORMATS.md)");
      }
    }
  }
  const uint64_t trunk = m.FindFile(kTrunkFile)->size;
  const uint64_t resident = m.FindFile(kResidentFile)->size;
  if (trunk != layout->trunk_bytes || resident != layout->resident_bytes) {
    return Status::Invalid(source + ": files: trunk.bin " + std::to_string(trunk) +
                           " / resident.bin " + std::to_string(resident) +
                           " bytes, the layout needs " + std::to_string(layout->trunk_bytes) +
                           " / " + std::to_string(layout->resident_bytes));
  }
  if (m.runs.size() != layout->runs.size()) {
    return Status::Invalid(source + ": trunk_runs has " + std::to_string(m.runs.size()) +
                           " entries, the config has " + std::to_string(layout->runs.size()) +
                           " layers");
  }
  for (size_t i = 0; i < m.runs.size(); ++i) {
    const TrunkRun& got = m.runs[i];
    const TrunkRun& want = layout->runs[i];
    if (got.layer != want.layer || got.offset != want.offset || got.length != want.length) {
      return Status::Invalid(source + ": trunk_runs[" + std::to_string(i) + "] is layer " +
                             std::to_string(got.layer) + " [" + std::to_string(got.offset) +
                             ", +" + std::to_string(got.length) + "), the layout says layer " +
                             std::to_string(want.layer) + " [" + std::to_string(want.offset) +
                             ", +" + std::to_string(want.length) + ")");
    }
  }
  return Status::Ok();
}

// vision.bin against "vision": listed exactly when the directory has a vision config, its regions
// and size those BuildVisionLayout recomputes, the projector's width the text model's.
Status ValidateVision(const Manifest& m, const std::string& source) {
  std::vector<TensorSpec> tensors;
  std::map<std::string_view, const Region*> vision_regions;
  for (const Region& r : m.regions) {
    if (r.file != kVisionFile) continue;
    tensors.push_back(TensorSpec{r.name, r.dtype, r.shape});
    vision_regions[r.name] = &r;
  }
  const FileEntry* file = m.FindFile(kVisionFile);
  if (!m.vision) {
    if (file != nullptr || !tensors.empty()) {
      return Status::Invalid(source + ": vision.bin is listed but \"vision\" (its config) is "
                                      "absent");
    }
    return Status::Ok();
  }
  if (file == nullptr) {
    return Status::Invalid(source + ": \"vision\" is present but vision.bin is not listed in "
                                    "files");
  }
  if (m.vision->text_hidden != m.config.hidden) {
    return Status::Invalid(source + ": vision.text_hidden_size " +
                           std::to_string(m.vision->text_hidden) + " differs from the text "
                           "model's hidden_size " + std::to_string(m.config.hidden));
  }
  for (const TensorSpec& t : tensors) {
    if (!IsVisionTensorName(t.name)) {
      return Status::Invalid(source + ": region \"" + t.name + "\" in vision.bin is not a "
                                      "vision tensor");
    }
  }
  Result<VisionLayout> layout = BuildVisionLayout(*m.vision, tensors);
  if (!layout.ok()) {
    return Status::Invalid(source + ": vision.bin regions: " + layout.status().message());
  }
  for (const Region& want : layout->regions) {
    const Region& got = *vision_regions.at(want.name);
    if (got.offset != want.offset) {
      return Status::Invalid(source + ": region \"" + want.name + "\" is at vision.bin offset " +
                             std::to_string(got.offset) + ", the format places it at offset " +
                             std::to_string(want.offset) + " (canonical order, 4096-aligned)");
    }
  }
  if (file->size != layout->bytes) {
    return Status::Invalid(source + ": files: vision.bin is " + std::to_string(file->size) +
                           " bytes, the layout needs " + std::to_string(layout->bytes));
  }
  return Status::Ok();
}

// A byte size, offset or length: an unsigned integer ≤ kMaxFileBytes (prepared_layout.h), so
// nothing downstream sums or allocates from a value near 2^64.
Result<uint64_t> ByteField(mjson::ObjectReader& o, std::string_view key) {
  K3_ASSIGN_OR_RETURN(uint64_t v, o.Unsigned(key));
  if (v > kMaxFileBytes) {
    return Status::Invalid(o.Path(key) + ": " + std::to_string(v) + " exceeds the bound " +
                           std::to_string(kMaxFileBytes) +
                           " (2^50) on byte sizes and offsets in a prepared directory; the "
                           "manifest is corrupt or hostile: re-run k3prep pack");
  }
  return v;
}

ojson FileArray(const std::vector<FileEntry>& files) {
  ojson a = ojson::array();
  for (const FileEntry& f : files) a.push_back(ojson{{"path", f.path}, {"size", f.size}});
  return a;
}

Result<std::vector<FileEntry>> ParseFileArray(mjson::ObjectReader& parent, std::string_view key) {
  K3_ASSIGN_OR_RETURN(const json* arr, parent.Array(key));
  std::vector<FileEntry> out;
  for (size_t i = 0; i < arr->size(); ++i) {
    K3_ASSIGN_OR_RETURN(mjson::ObjectReader o, mjson::ObjectReader::Make(
                                                   (*arr)[i], mjson::ElementPath(parent.Path(key), i)));
    FileEntry f;
    K3_ASSIGN_OR_RETURN(f.path, o.String("path"));
    K3_ASSIGN_OR_RETURN(f.size, ByteField(o, "size"));
    K3_RETURN_IF_ERROR(o.CheckNoUnknownKeys());
    out.push_back(std::move(f));
  }
  return out;
}

// "share": {"ranks", "rank", "map"}; the values' rules are ValidateShare's.
Result<ExpertShare> ParseShare(mjson::ObjectReader& root) {
  K3_ASSIGN_OR_RETURN(const json* obj, root.Object("share"));
  K3_ASSIGN_OR_RETURN(mjson::ObjectReader o, mjson::ObjectReader::Make(*obj, root.Path("share")));
  K3_ASSIGN_OR_RETURN(uint64_t ranks, o.Unsigned("ranks"));
  K3_ASSIGN_OR_RETURN(uint64_t rank, o.Unsigned("rank"));
  ExpertShare s;
  K3_ASSIGN_OR_RETURN(s.map, o.String("map"));
  K3_RETURN_IF_ERROR(o.CheckNoUnknownKeys());
  // Bounded before narrowing, so a huge value cannot wrap into a valid one.
  for (const auto& [key, v] : {std::pair{"ranks", ranks}, std::pair{"rank", rank}}) {
    if (v > static_cast<uint64_t>(kMaxRanks)) {
      return Status::Invalid(o.Path(key) + ": " + std::to_string(v) + " exceeds the bound " +
                             std::to_string(kMaxRanks) + " (k3 runs at most that many ranks)");
    }
  }
  s.ranks = static_cast<uint32_t>(ranks);
  s.rank = static_cast<uint32_t>(rank);
  return s;
}

Result<ModelConfig> ParseConfigObject(const json& obj, const std::string& where) {
  if (!obj.is_object()) return Status::Invalid(where + ": expected an object");
  Result<ModelConfig> parsed = ParseModelConfig(obj.dump(), where);
  if (!parsed.ok()) return parsed.status();
  ModelConfig c = std::move(parsed).value();
  // ParseModelConfig derives these from quantization_config, which the flat canonical form
  // does not have; the canonical form carries them as plain keys.
  if (auto it = obj.find("experts_mxfp4"); it != obj.end() && it->is_boolean()) {
    c.experts_mxfp4 = it->get<bool>();
  }
  if (auto it = obj.find("mxfp4_group_size"); it != obj.end() && it->is_number_integer()) {
    c.mxfp4_group_size = it->get<int>();
  }
  // Compared as text: json's == holds 64 equal to 64.0, but the canonical form writes integers
  // as integers, and k3.json requires them so (FORMATS.md).
  const json canonical = json::parse(CanonicalConfigJson(c));
  if (canonical.dump() != obj.dump()) {
    std::string key = "(structure)";
    for (auto it = canonical.begin(); it != canonical.end(); ++it) {
      if (!obj.contains(it.key()) || obj.at(it.key()).dump() != it.value().dump()) {
        key = it.key();
        break;
      }
    }
    if (key == "(structure)") {
      for (auto it = obj.begin(); it != obj.end(); ++it) {
        if (!canonical.contains(it.key())) {
          key = it.key();
          break;
        }
      }
    }
    return Status::Invalid(where + "." + key +
                           ": the config is not in canonical resolved form (edited by hand, or "
                           "written by another k3 version); re-run k3prep pack");
  }
  if (!c.experts_mxfp4) {
    return Status::Invalid(where + ".experts_mxfp4: must be true (prepared format version 1 "
                                   "stores routed experts as MXFP4)");
  }
  K3_RETURN_IF_ERROR(ValidateMxfp4Dims(c, where));
  return c;
}

}  // namespace

const char* ExpertsModeName(ExpertsMode m) { return m == ExpertsMode::kLink ? "link" : "copy"; }

const FileEntry* Manifest::FindFile(std::string_view path) const {
  for (const FileEntry& f : files) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

const Region* Manifest::FindRegion(std::string_view name) const {
  for (const Region& r : regions) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

Status ValidateManifest(const Manifest& m, const std::string& source) {
  if (!m.config.experts_mxfp4) {
    return Status::Invalid(source + ": config.experts_mxfp4: must be true (prepared format "
                                    "version 1 stores routed experts as MXFP4)");
  }
  K3_RETURN_IF_ERROR(ValidateSource(m, source));
  K3_RETURN_IF_ERROR(ValidateShare(m, source));
  K3_RETURN_IF_ERROR(ValidateFiles(m, source));
  K3_RETURN_IF_ERROR(ValidateRegionBounds(m, source));
  K3_RETURN_IF_ERROR(ValidateWholeFileRegions(m, source));
  K3_RETURN_IF_ERROR(ValidateAgainstLayout(m, source));
  K3_RETURN_IF_ERROR(ValidateVision(m, source));
  return ValidateExpertsIndexSize(m, source);
}

Result<std::string> RenderManifest(const Manifest& m) {
  K3_RETURN_IF_ERROR(ValidateManifest(m, "k3.json being written"));
  ojson doc;
  doc["format"] = kManifestFormat;
  doc["version"] = kManifestVersion;
  doc["config"] = ojson::parse(CanonicalConfigJson(m.config));
  ojson shards = ojson::array();
  for (const SourceShard& s : m.source.shards) {
    ojson e{{"name", s.name}, {"size", s.size}};
    if (!s.sha256.empty()) e["sha256"] = s.sha256;
    shards.push_back(std::move(e));
  }
  doc["source"] = ojson{{"model_dir_abs", m.source.model_dir_abs},
                        {"model_dir_given", m.source.model_dir_given},
                        {"shards", std::move(shards)}};
  doc["experts_mode"] = ExpertsModeName(m.experts_mode);
  if (m.share) {
    doc["share"] = ojson{{"ranks", m.share->ranks}, {"rank", m.share->rank}, {"map", m.share->map}};
  }
  if (m.vision) doc["vision"] = ojson::parse(CanonicalVisionConfigJson(*m.vision));
  doc["files"] = FileArray(m.files);
  doc["expert_files"] = FileArray(m.expert_files);
  ojson runs = ojson::array();
  for (const TrunkRun& r : m.runs) {
    runs.push_back(ojson{{"layer", r.layer}, {"offset", r.offset}, {"length", r.length}});
  }
  doc["trunk_runs"] = std::move(runs);
  ojson regions = ojson::array();
  for (const Region& r : m.regions) {
    regions.push_back(ojson{{"name", r.name},
                            {"file", r.file},
                            {"offset", r.offset},
                            {"length", r.length},
                            {"dtype", DTypeName(r.dtype)},
                            {"shape", r.shape},
                            {"xxh3_128", r.xxh3_128.Hex()}});
  }
  doc["regions"] = std::move(regions);
  return doc.dump(1, ' ', false, ojson::error_handler_t::replace) + "\n";
}

Result<Manifest> ParseManifest(std::string_view text, const std::string& source) {
  K3_ASSIGN_OR_RETURN(json doc, mjson::ParseStrict(text, source));
  K3_ASSIGN_OR_RETURN(mjson::ObjectReader root, mjson::ObjectReader::Make(doc, source));
  K3_ASSIGN_OR_RETURN(std::string format, root.String("format"));
  if (format != kManifestFormat) {
    return Status::Invalid(root.Path("format") + ": \"" + format +
                           "\" is not \"k3-prepared\" (not a prepared-directory manifest)");
  }
  K3_ASSIGN_OR_RETURN(uint64_t version, root.Unsigned("version"));
  if (version != kManifestVersion) {
    return Status::Invalid(root.Path("version") + ": " + std::to_string(version) +
                           " is not supported (this k3 reads version 1; re-run k3prep pack)");
  }
  Manifest m;
  K3_ASSIGN_OR_RETURN(const json* config, root.Object("config"));
  K3_ASSIGN_OR_RETURN(m.config, ParseConfigObject(*config, root.Path("config")));

  K3_ASSIGN_OR_RETURN(const json* src_json, root.Object("source"));
  K3_ASSIGN_OR_RETURN(mjson::ObjectReader src,
                      mjson::ObjectReader::Make(*src_json, root.Path("source")));
  K3_ASSIGN_OR_RETURN(m.source.model_dir_abs, src.String("model_dir_abs"));
  K3_ASSIGN_OR_RETURN(m.source.model_dir_given, src.String("model_dir_given"));
  K3_ASSIGN_OR_RETURN(const json* shards, src.Array("shards"));
  K3_RETURN_IF_ERROR(src.CheckNoUnknownKeys());
  for (size_t i = 0; i < shards->size(); ++i) {
    K3_ASSIGN_OR_RETURN(mjson::ObjectReader o,
                        mjson::ObjectReader::Make((*shards)[i],
                                                  mjson::ElementPath(src.Path("shards"), i)));
    SourceShard s;
    K3_ASSIGN_OR_RETURN(s.name, o.String("name"));
    K3_ASSIGN_OR_RETURN(s.size, ByteField(o, "size"));
    if (o.Has("sha256")) {
      K3_ASSIGN_OR_RETURN(s.sha256, o.String("sha256"));
      if (s.sha256.empty()) return Status::Invalid(o.Path("sha256") + ": empty (omit it instead)");
    }
    K3_RETURN_IF_ERROR(o.CheckNoUnknownKeys());
    m.source.shards.push_back(std::move(s));
  }

  K3_ASSIGN_OR_RETURN(std::string mode, root.String("experts_mode"));
  if (mode == "link") {
    m.experts_mode = ExpertsMode::kLink;
  } else if (mode == "copy") {
    m.experts_mode = ExpertsMode::kCopy;
  } else {
    return Status::Invalid(root.Path("experts_mode") + ": \"" + mode +
                           "\" is not \"link\" or \"copy\"");
  }
  if (root.Has("share")) {
    K3_ASSIGN_OR_RETURN(m.share, ParseShare(root));
  }
  if (root.Has("vision")) {
    K3_ASSIGN_OR_RETURN(const json* vision, root.Object("vision"));
    K3_ASSIGN_OR_RETURN(m.vision, ParseCanonicalVisionConfig(vision->dump(), root.Path("vision")));
  }
  K3_ASSIGN_OR_RETURN(m.files, ParseFileArray(root, "files"));
  K3_ASSIGN_OR_RETURN(m.expert_files, ParseFileArray(root, "expert_files"));

  K3_ASSIGN_OR_RETURN(const json* runs, root.Array("trunk_runs"));
  for (size_t i = 0; i < runs->size(); ++i) {
    K3_ASSIGN_OR_RETURN(mjson::ObjectReader o,
                        mjson::ObjectReader::Make((*runs)[i],
                                                  mjson::ElementPath(root.Path("trunk_runs"), i)));
    TrunkRun r;
    K3_ASSIGN_OR_RETURN(uint64_t layer, o.Unsigned("layer"));
    if (layer >= static_cast<uint64_t>(kMaxLayers)) {
      return Status::Invalid(o.Path("layer") + ": " + std::to_string(layer) +
                             " exceeds the bound " + std::to_string(kMaxLayers - 1) +
                             " (k3 reads at most " + std::to_string(kMaxLayers) + " layers)");
    }
    r.layer = static_cast<int>(layer);
    K3_ASSIGN_OR_RETURN(r.offset, ByteField(o, "offset"));
    K3_ASSIGN_OR_RETURN(r.length, ByteField(o, "length"));
    K3_RETURN_IF_ERROR(o.CheckNoUnknownKeys());
    m.runs.push_back(r);
  }

  K3_ASSIGN_OR_RETURN(const json* regions, root.Array("regions"));
  for (size_t i = 0; i < regions->size(); ++i) {
    K3_ASSIGN_OR_RETURN(mjson::ObjectReader o,
                        mjson::ObjectReader::Make((*regions)[i],
                                                  mjson::ElementPath(root.Path("regions"), i)));
    Region r;
    K3_ASSIGN_OR_RETURN(r.name, o.String("name"));
    K3_ASSIGN_OR_RETURN(r.file, o.String("file"));
    K3_ASSIGN_OR_RETURN(r.offset, ByteField(o, "offset"));
    K3_ASSIGN_OR_RETURN(r.length, ByteField(o, "length"));
    K3_ASSIGN_OR_RETURN(std::string dtype, o.String("dtype"));
    std::optional<DType> dt = ParseDType(dtype);
    if (!dt) return Status::Invalid(o.Path("dtype") + ": unknown dtype \"" + dtype + "\"");
    r.dtype = *dt;
    K3_ASSIGN_OR_RETURN(const json* shape, o.Array("shape"));
    if (shape->size() > 8) return Status::Invalid(o.Path("shape") + ": rank above 8");
    for (const json& d : *shape) {
      if (!d.is_number_unsigned()) {
        return Status::Invalid(o.Path("shape") + ": dimensions must be unsigned integers");
      }
      if (d.get<uint64_t>() > kMaxFileBytes) {
        return Status::Invalid(o.Path("shape") + ": dimension " + d.dump() +
                               " exceeds the bound " + std::to_string(kMaxFileBytes) +
                               " (2^50; a region is at most that many bytes)");
      }
      r.shape.push_back(d.get<uint64_t>());
    }
    K3_ASSIGN_OR_RETURN(std::string hash, o.String("xxh3_128"));
    if (!Hash128::FromHex(hash, &r.xxh3_128)) {
      return Status::Invalid(o.Path("xxh3_128") + ": \"" + hash +
                             "\" is not 32 lowercase hex digits");
    }
    K3_RETURN_IF_ERROR(o.CheckNoUnknownKeys());
    m.regions.push_back(std::move(r));
  }
  K3_RETURN_IF_ERROR(root.CheckNoUnknownKeys());
  K3_RETURN_IF_ERROR(ValidateManifest(m, source));
  return m;
}

}  // namespace k3::prepared
