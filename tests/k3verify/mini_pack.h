// Test helpers for k3verify: a real two-shard checkpoint of the tiny test config (st::Writer),
// a prepared directory packed from it BY THE TEST (k3prep pack is not used, so these tests do
// not depend on it), and Reseal() for prepared_fixture.h's directories, whose expert records
// carry no hashes.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/experts_index.h"
#include "formats/prepared_layout.h"
#include "formats/prepared_manifest.h"
#include "formats/safetensors.h"
#include "tests/formats/prepared_fixture.h"

namespace k3::test {

inline constexpr char kShard1[] = "model-00001-of-00002.safetensors";
inline constexpr char kShard2[] = "model-00002-of-00002.safetensors";

// Deterministic bytes of tensor number `i` (xorshift, so no two tensors share bytes).
inline std::string TensorBytes(uint64_t n, uint64_t i) {
  std::string s(n, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1);
  for (uint64_t k = 0; k < n; ++k) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[k] = static_cast<char>(x >> 56);
  }
  return s;
}

// Writes the tiny checkpoint: layers 0–1 in shard 1, layers 2–3 and the model-level tensors in
// shard 2, each expert's six tensors contiguous in canonical order (TinyTensors' order), plus
// config.json and tiktoken.model.
inline void WriteTinyCheckpoint(const std::string& dir) {
  const std::vector<TensorSpec> tensors = TinyTensors();
  auto in_shard1 = [](const std::string& n) {
    return n.find("layers.0.") != std::string::npos || n.find("layers.1.") != std::string::npos;
  };
  for (int shard = 1; shard <= 2; ++shard) {
    st::Writer w(Env::Default(), dir + "/" + (shard == 1 ? kShard1 : kShard2));
    std::vector<size_t> mine;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (in_shard1(tensors[i].name) == (shard == 1)) mine.push_back(i);
    }
    for (size_t i : mine) w.Add(tensors[i].name, tensors[i].dtype, tensors[i].shape);
    ASSERT_TRUE(w.Begin().ok());
    for (size_t i : mine) {
      const std::string b = TensorBytes(tensors[i].nbytes(), i);
      ASSERT_TRUE(w.Append(b.data(), b.size()).ok());
    }
    ASSERT_TRUE(w.Finish().ok());
  }
  WriteBytes(dir + "/config.json", kTinyFlatConfig);
  WriteBytes(dir + "/tiktoken.model", "dGVzdA== 0\n");
}

// The bytes of one tensor of the checkpoint, read back through the test's own file access.
inline std::string SourceBytes(const st::CheckpointIndex& index, const std::string& name) {
  const auto* loc = index.Find(name);
  EXPECT_NE(loc, nullptr) << name;
  if (loc == nullptr) return "";
  return ReadBytes(loc->shard->path).substr(loc->file_offset(), loc->tensor->nbytes());
}

// Packs `model_dir` into `out` the way DESIGN.md §5 describes: BuildLayout for trunk/resident,
// PlanCopyExperts (copy) or shard offsets (link) for experts, every hash computed here.
inline void PackTiny(const std::string& model_dir, const std::string& out, ExpertsMode mode) {
  Result<st::CheckpointIndex> index = st::CheckpointIndex::Open(Env::Default(), model_dir);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  Manifest m;
  m.config = TinyConfig();
  Result<Layout> layout = BuildLayout(m.config, TensorsOf(*index));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  auto fill = [&](const std::vector<Region>& regions, uint64_t size, const std::string& file) {
    std::string bytes(size, '\0');
    for (Region r : regions) {
      const std::string b = SourceBytes(*index, r.name);
      bytes.replace(r.offset, b.size(), b);
      r.xxh3_128 = Xxh3_128(b.data(), b.size());
      m.regions.push_back(r);
    }
    WriteBytes(out + "/" + file, bytes);
    m.files.push_back(FileEntry{file, size});
  };
  fill(layout->trunk, layout->trunk_bytes, "trunk.bin");
  fill(layout->resident, layout->resident_bytes, "resident.bin");
  m.runs = layout->runs;
  m.experts_mode = mode;
  m.source.model_dir_abs = model_dir;
  m.source.model_dir_given = model_dir;
  for (const auto& s : index->shards()) {
    m.source.shards.push_back(SourceShard{s->name, s->header.file_size, ""});
  }

  ExpertsIndex idx;
  idx.n_layers = 4;
  idx.first_moe_layer = 1;
  idx.n_experts = 4;
  const auto sizes = ExpertSubSizes(m.config);
  std::vector<std::string> files_bytes;
  ExpertPlan plan;
  if (mode == ExpertsMode::kCopy) {
    plan = PlanCopyExperts(m.config, {});
    idx.files = plan.files;
    for (size_t f = 0; f < plan.files.size(); ++f) {
      files_bytes.emplace_back(plan.file_sizes[f], '\0');
      m.expert_files.push_back(FileEntry{plan.files[f], plan.file_sizes[f]});
    }
  } else {
    idx.files = {kShard1, kShard2};
    for (const auto& s : index->shards()) {
      m.expert_files.push_back(FileEntry{s->name, s->header.file_size});
    }
  }
  for (int layer = 1; layer < 4; ++layer) {
    for (int e = 0; e < 4; ++e) {
      std::string bytes;
      for (int s = 0; s < kExpertSubCount; ++s) bytes += SourceBytes(*index, ExpertTensorName(layer, e, s));
      const uint64_t h = Xxh3_64(bytes.data(), bytes.size());
      if (mode == ExpertsMode::kCopy) {
        const ExpertSlot& slot = plan.slots[ExpertRecordIndex(m.config, layer, e)];
        files_bytes[slot.file_id].replace(slot.offset, bytes.size(), bytes);
        idx.records.push_back(MakeExpertRecord(slot.file_id, slot.offset, sizes, h));
      } else {
        const auto* loc = index->Find(ExpertTensorName(layer, e, 0));
        idx.records.push_back(MakeExpertRecord(layer == 1 ? 0 : 1, loc->file_offset(), sizes, h));
      }
    }
  }
  for (size_t f = 0; f < files_bytes.size(); ++f) WriteBytes(out + "/" + plan.files[f], files_bytes[f]);
  const std::string idx_bytes = EncodeExpertsIndex(idx);
  WriteBytes(out + "/experts.idx", idx_bytes);
  const std::string tok = ReadBytes(model_dir + "/tiktoken.model");
  WriteBytes(out + "/tokenizer/tiktoken.model", tok);
  m.files.push_back(FileEntry{"experts.idx", idx_bytes.size()});
  m.files.push_back(FileEntry{"tokenizer/tiktoken.model", tok.size()});
  m.regions.push_back(Region{"experts.idx", "experts.idx", 0, idx_bytes.size(), DType::kU8,
                             {idx_bytes.size()}, Xxh3_128(idx_bytes.data(), idx_bytes.size())});
  m.regions.push_back(Region{"tokenizer/tiktoken.model", "tokenizer/tiktoken.model", 0,
                             tok.size(), DType::kU8, {tok.size()}, Xxh3_128(tok.data(), tok.size())});
  Status s = WriteManifestAndSum(Env::Default(), out, m);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// Fills in the expert hashes prepared_fixture.h leaves at zero (from the bytes as they are),
// rewrites experts.idx, and re-seals k3.json/k3.sum.
inline void Reseal(const std::string& dir) {
  Result<PreparedDir> p = OpenPrepared(Env::Default(), dir);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  for (ExpertRecord& r : p->experts.records) {
    const std::string file = ReadBytes(p->expert_paths[r.file_id]);
    r.xxh3_64 = Xxh3_64(file.data() + r.offset, r.length);
  }
  const std::string idx = EncodeExpertsIndex(p->experts);
  WriteBytes(dir + "/experts.idx", idx);
  Manifest m = p->manifest;
  for (Region& r : m.regions) {
    if (r.name == "experts.idx") r.xxh3_128 = Xxh3_128(idx.data(), idx.size());
  }
  Status s = WriteManifestAndSum(Env::Default(), dir, m);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// XORs one byte of a file with 0x5a.
inline void FlipByte(const std::string& path, uint64_t offset) {
  std::string b = ReadBytes(path);
  ASSERT_LT(offset, b.size()) << path;
  b[offset] = static_cast<char>(b[offset] ^ 0x5a);
  WriteBytes(path, b);
}

}  // namespace k3::test
