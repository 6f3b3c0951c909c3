// CheckpointIndex: every shard header of a checkpoint directory, one hash map by tensor name,
// and agreement with model.safetensors.index.json. Open reads ~500k entries for the release, so
// the name table holds views into the shards' names (no second copy of any name) in one flat
// allocation.
#include <algorithm>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "formats/safetensors.h"

namespace k3::st {

void NameTable::Reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  if (cap <= slots_.size()) return;
  slots_.assign(cap, 0);
  mask_ = cap - 1;
  names_.reserve(n);
  // Re-insert what is already there (only when Reserve follows Inserts).
  for (size_t id = 0; id < names_.size(); ++id) {
    const uint64_t hash = XXH3_64bits(names_[id].data(), names_[id].size());
    slots_[Probe(hash, names_[id])] = (hash & 0xFFFFFFFF00000000ull) | (id + 1);
  }
}

size_t NameTable::Probe(uint64_t hash, std::string_view name) const {
  size_t i = static_cast<size_t>(hash) & mask_;
  while (true) {
    const uint64_t slot = slots_[i];
    if (slot == 0) return i;
    if ((slot >> 32) == (hash >> 32) && names_[(slot & 0xFFFFFFFFu) - 1] == name) return i;
    i = (i + 1) & mask_;
  }
}

uint32_t NameTable::Insert(std::string_view name) {
  if (2 * (names_.size() + 1) > slots_.size()) Reserve(2 * names_.size() + 8);
  const uint64_t hash = XXH3_64bits(name.data(), name.size());
  const size_t i = Probe(hash, name);
  if (slots_[i] != 0) return static_cast<uint32_t>((slots_[i] & 0xFFFFFFFFu) - 1);
  slots_[i] = (hash & 0xFFFFFFFF00000000ull) | (names_.size() + 1);
  names_.push_back(name);
  return kAbsent;
}

uint32_t NameTable::Find(std::string_view name) const {
  if (slots_.empty()) return kAbsent;
  const uint64_t slot = slots_[Probe(XXH3_64bits(name.data(), name.size()), name)];
  return slot == 0 ? kAbsent : static_cast<uint32_t>((slot & 0xFFFFFFFFu) - 1);
}

namespace {

constexpr std::string_view kShardSuffix = ".safetensors";
constexpr char kIndexFileName[] = "model.safetensors.index.json";
// The released index is 60 MB (1.56 TB in 96 shards, ~290k tensor names); nlohmann holds a
// parsed document at several times its text, so a larger file is refused before it is read.
constexpr uint64_t kMaxIndexFileBytes = uint64_t{256} << 20;

bool IsShardName(const std::string& name) {
  return name.size() > kShardSuffix.size() && name.ends_with(kShardSuffix);
}

// `file: tensor "name": what [rule: ...]; hint`, for rules that span files.
Status IndexFail(const std::string& file, std::optional<std::string_view> tensor,
                 std::string_view rule, const std::string& detail, std::string_view hint) {
  std::string msg = file + ": ";
  if (tensor) msg += "tensor " + PrintableName(*tensor) + ": ";
  msg += detail;
  msg += " [rule: ";
  msg += rule;
  msg += "]; ";
  msg += hint;
  return Status::Invalid(std::move(msg));
}

constexpr std::string_view kIndexHint =
    "the index file does not describe these shards: re-download the checkpoint, or delete "
    "model.safetensors.index.json if the shards are known to be right";

using Locations = std::vector<CheckpointIndex::Location>;
using ShardList = std::vector<std::unique_ptr<CheckpointIndex::Shard>>;

Status CheckWeightMap(const std::string& path, const nlohmann::json& weight_map,
                      const ShardList& shards, const NameTable& by_name,
                      const Locations& locations) {
  size_t listed = 0;
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    const std::string& name = it.key();
    if (!it.value().is_string()) {
      return IndexFail(path, name, "weight_map maps tensor names to shard file names",
                       std::string("the value is a JSON ") + it.value().type_name() +
                           ", not a shard file name",
                       kIndexHint);
    }
    const auto& shard_name = it.value().get_ref<const std::string&>();
    const uint32_t found = by_name.Find(name);
    if (found == NameTable::kAbsent) {
      bool shard_exists = false;
      for (const auto& s : shards) shard_exists = shard_exists || s->name == shard_name;
      return IndexFail(path, name, "every weight_map entry exists in the shard it names",
                       "weight_map puts the tensor in " + shard_name +
                           (shard_exists ? ", which has no such tensor"
                                         : ", which is not a *.safetensors file of the "
                                           "directory") +
                           ", and no other shard has it either",
                       kIndexHint);
    }
    const std::string& holder = locations[found].shard->name;
    if (holder != shard_name) {
      return IndexFail(path, name, "every weight_map entry names the shard that holds it",
                       "weight_map puts the tensor in " + shard_name + " but it is in " + holder,
                       kIndexHint);
    }
    ++listed;
  }
  if (listed == by_name.size()) return Status::Ok();
  // Entries are unique JSON keys that all resolved, so some tensor was never listed.
  for (const auto& s : shards) {
    for (const TensorInfo& t : s->header.tensors) {
      if (!weight_map.contains(t.name)) {
        return IndexFail(path, t.name, "weight_map lists every tensor of every shard",
                         "the tensor is in " + s->name + " but weight_map does not list it",
                         kIndexHint);
      }
    }
  }
  return Status::Ok();
}

Status CheckTotalSize(const std::string& path, const nlohmann::json& doc,
                      const ShardList& shards) {
  const auto metadata = doc.find("metadata");
  if (metadata == doc.end() || !metadata->is_object()) return Status::Ok();
  const auto total = metadata->find("total_size");
  if (total == metadata->end()) return Status::Ok();
  if (!total->is_number_unsigned()) {
    return IndexFail(path, std::nullopt, "metadata.total_size is an unsigned integer",
                     "metadata.total_size is " + total->dump(), kIndexHint);
  }
  uint64_t sum = 0;
  for (const auto& s : shards) {
    for (const TensorInfo& t : s->header.tensors) sum += t.nbytes();
  }
  const auto want = total->get<uint64_t>();
  if (want != sum) {
    return IndexFail(path, std::nullopt,
                     "metadata.total_size equals the sum of the tensors' byte sizes",
                     "metadata.total_size is " + std::to_string(want) + " but the " +
                         std::to_string(shards.size()) + " shards hold " +
                         std::to_string(sum) + " tensor bytes",
                     kIndexHint);
  }
  return Status::Ok();
}

Status CheckIndexFile(Env* env, const std::string& dir, const ShardList& shards,
                      const NameTable& by_name, const Locations& locations) {
  const std::string path = JoinPath(dir, kIndexFileName);
  if (!env->Exists(path)) return Status::Ok();
  K3_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(env, path, kMaxIndexFileBytes));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return IndexFail(path, std::nullopt, "the index file is JSON", e.what(), kIndexHint);
  }
  const auto weight_map = doc.is_object() ? doc.find("weight_map") : doc.end();
  if (!doc.is_object() || weight_map == doc.end() || !weight_map->is_object()) {
    return IndexFail(path, std::nullopt, "the index file has a weight_map object",
                     "no \"weight_map\" object at the top level", kIndexHint);
  }
  K3_RETURN_IF_ERROR(CheckWeightMap(path, *weight_map, shards, by_name, locations));
  return CheckTotalSize(path, doc, shards);
}

}  // namespace

Result<CheckpointIndex> CheckpointIndex::Open(Env* env, const std::string& dir) {
  CheckpointIndex index;
  index.dir_ = dir;
  K3_ASSIGN_OR_RETURN(const std::vector<DirEntry> entries, env->ListDir(dir));
  for (const DirEntry& e : entries) {
    if (e.is_dir || !IsShardName(e.name)) continue;
    auto shard = std::make_unique<Shard>();
    shard->name = e.name;
    shard->path = JoinPath(dir, e.name);
    index.shards_.push_back(std::move(shard));
  }
  if (index.shards_.empty()) {
    return IndexFail(dir, std::nullopt, "a checkpoint directory holds *.safetensors shards",
                     "no *.safetensors file in the directory",
                     "check the path, or download or synthesize a checkpoint into it");
  }
  // ListDir promises name order; sorting again costs nothing and keeps the order a property of
  // this function rather than of every Env.
  std::sort(index.shards_.begin(), index.shards_.end(),
            [](const auto& a, const auto& b) { return a->name < b->name; });
  size_t total = 0;
  std::string scratch;
  for (auto& shard : index.shards_) {
    K3_ASSIGN_OR_RETURN(shard->header, ReadHeader(env, shard->path, &scratch));
    total += shard->header.tensors.size();
  }
  index.locations_.reserve(total);
  index.by_name_.Reserve(total);
  for (const auto& shard : index.shards_) {
    for (const TensorInfo& t : shard->header.tensors) {
      const uint32_t earlier = index.by_name_.Insert(t.name);
      if (earlier == NameTable::kAbsent) {
        index.locations_.push_back(Location{shard.get(), &t});
      } else {
        return IndexFail(dir, t.name, "a tensor name appears in one shard only",
                         "the tensor is in both " + index.locations_[earlier].shard->name +
                             " and " + shard->name,
                         "the directory mixes two checkpoints or a shard was copied twice; "
                         "remove the stray shard");
      }
    }
  }
  K3_RETURN_IF_ERROR(
      CheckIndexFile(env, dir, index.shards_, index.by_name_, index.locations_));
  return index;
}

const CheckpointIndex::Location* CheckpointIndex::Find(std::string_view name) const {
  const uint32_t id = by_name_.Find(name);
  return id == NameTable::kAbsent ? nullptr : &locations_[id];
}

std::vector<CheckpointIndex::Location> CheckpointIndex::All() const { return locations_; }

}  // namespace k3::st
