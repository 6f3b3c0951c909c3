// CheckpointIndex over a directory of shards: shard order, lookup down to the tensor's bytes,
// duplicates across shards, and every way model.safetensors.index.json can disagree.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "tests/support/temp_dir.h"

namespace k3::st {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The bytes of tensor `name`: distinct per name, so reading the wrong range is caught.
std::string BytesOf(const std::string& name, size_t n) {
  std::string s(n, '\0');
  unsigned h = 0;
  for (const char c : name) h = h * 131 + static_cast<unsigned char>(c);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((h + i * 7) & 0xFF);
  return s;
}

using Tensors = std::vector<std::pair<std::string, size_t>>;  // name, U8 element count

class SafetensorsIndexTest : public ::testing::Test {
 protected:
  void WriteShard(const std::string& file, const Tensors& tensors) {
    Writer w(Env::Default(), dir_.Join(file));
    for (const auto& [name, n] : tensors) w.Add(name, DType::kU8, {n});
    ASSERT_TRUE(w.Begin().ok());
    for (const auto& [name, n] : tensors) {
      const std::string bytes = BytesOf(name, n);
      ASSERT_TRUE(w.Append(bytes.data(), bytes.size()).ok());
    }
    ASSERT_TRUE(w.Finish().ok());
  }

  // Two shards, three tensors, 4 + 6 + 5 = 15 tensor bytes.
  void WriteTwoShards() {
    WriteShard("model-00001-of-00002.safetensors", {{"embed", 4}, {"layer.0", 6}});
    WriteShard("model-00002-of-00002.safetensors", {{"lm_head", 5}});
  }

  static nlohmann::json ConsistentIndex() {
    nlohmann::json doc;
    doc["metadata"]["total_size"] = 15;
    doc["weight_map"]["embed"] = "model-00001-of-00002.safetensors";
    doc["weight_map"]["layer.0"] = "model-00001-of-00002.safetensors";
    doc["weight_map"]["lm_head"] = "model-00002-of-00002.safetensors";
    return doc;
  }

  void WriteIndex(const nlohmann::json& doc) {
    dir_.WriteFile("model.safetensors.index.json", doc.dump(2));
  }

  Result<CheckpointIndex> Open() { return CheckpointIndex::Open(Env::Default(), dir_.path()); }

  static void ExpectInvalid(const Result<CheckpointIndex>& r,
                            std::initializer_list<std::string> needles) {
    ASSERT_FALSE(r.ok()) << "the inconsistent checkpoint was accepted";
    EXPECT_EQ(r.status().code(), Code::kInvalid) << r.status().ToString();
    for (const std::string& n : needles) EXPECT_THAT(r.status().message(), HasSubstr(n));
  }

  test::TempDir dir_;
};

TEST_F(SafetensorsIndexTest, ShardsAreInNameOrder) {
  WriteShard("c.safetensors", {{"c", 1}});
  WriteShard("a.safetensors", {{"a", 1}});
  WriteShard("b.safetensors", {{"b", 1}});
  const Result<CheckpointIndex> r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> names;
  for (const auto& s : r->shards()) names.push_back(s->name);
  EXPECT_THAT(names, ElementsAre("a.safetensors", "b.safetensors", "c.safetensors"));
  EXPECT_EQ(r->shards()[1]->path, dir_.Join("b.safetensors"));
}

TEST_F(SafetensorsIndexTest, IgnoresFilesThatAreNotShards) {
  WriteShard("a.safetensors", {{"a", 1}});
  dir_.WriteFile("notes.txt", "hello");
  dir_.WriteFile("b.safetensors.k3tmp", "half-written");
  std::filesystem::create_directory(dir_.Join("sub.safetensors"));
  const Result<CheckpointIndex> r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->shards().size(), 1u);
  EXPECT_EQ(r->tensor_count(), 1u);
}

TEST_F(SafetensorsIndexTest, FindLocatesTheTensorBytes) {
  WriteTwoShards();
  const Result<CheckpointIndex> r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensor_count(), 3u);
  EXPECT_EQ(r->Find("missing"), nullptr);
  const std::pair<const char*, size_t> want[] = {{"embed", 4}, {"layer.0", 6}, {"lm_head", 5}};
  for (const auto& [name, n] : want) {
    const CheckpointIndex::Location* loc = r->Find(name);
    ASSERT_NE(loc, nullptr) << name;
    EXPECT_EQ(loc->tensor->name, name);
    std::ifstream in(loc->shard->path, std::ios::binary);
    const std::string file(std::istreambuf_iterator<char>(in), {});
    EXPECT_EQ(file.substr(loc->file_offset(), n), BytesOf(name, n)) << name;
  }
  EXPECT_EQ(r->Find("lm_head")->shard->name, "model-00002-of-00002.safetensors");
}

TEST_F(SafetensorsIndexTest, AllIsShardOrderThenDataOrder) {
  WriteTwoShards();
  const Result<CheckpointIndex> r = Open();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> names;
  for (const auto& loc : r->All()) names.push_back(loc.tensor->name);
  EXPECT_THAT(names, ElementsAre("embed", "layer.0", "lm_head"));
}

TEST_F(SafetensorsIndexTest, NoShardsIsAnError) {
  dir_.WriteFile("config.json", "{}");
  ExpectInvalid(Open(), {dir_.path(), "no *.safetensors file"});
}

TEST_F(SafetensorsIndexTest, MissingDirectoryIsAnError) {
  const Result<CheckpointIndex> r =
      CheckpointIndex::Open(Env::Default(), dir_.Join("does-not-exist"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("does-not-exist"));
}

TEST_F(SafetensorsIndexTest, TensorInTwoShards) {
  WriteShard("a.safetensors", {{"shared.weight", 2}, {"a", 1}});
  WriteShard("b.safetensors", {{"b", 1}, {"shared.weight", 2}});
  ExpectInvalid(Open(), {"tensor \"shared.weight\"", "a.safetensors", "b.safetensors",
                         "a tensor name appears in one shard only"});
}

TEST_F(SafetensorsIndexTest, DamagedShardIsNamed) {
  WriteShard("a.safetensors", {{"a", 1}});
  dir_.WriteFile("b.safetensors", std::string("\x02\0\0\0\0\0\0\0[]", 10));
  ExpectInvalid(Open(), {"b.safetensors", "starts with '{'"});
}

// ---- model.safetensors.index.json ------------------------------------------------------------

TEST_F(SafetensorsIndexTest, ConsistentIndexFileIsAccepted) {
  WriteTwoShards();
  WriteIndex(ConsistentIndex());
  const Result<CheckpointIndex> r = Open();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

// Over 4x the released index's 60 MB is refused before it is read (a sparse file here).
TEST_F(SafetensorsIndexTest, IndexFileOverTheSizeBoundIsRefusedUnread) {
  WriteTwoShards();
  WriteIndex(ConsistentIndex());
  std::filesystem::resize_file(dir_.Join("model.safetensors.index.json"), (uint64_t{256} << 20) + 1);
  ExpectInvalid(Open(), {"model.safetensors.index.json", "268435457 bytes",
                         "more than the limit of 268435456"});
}

TEST_F(SafetensorsIndexTest, IndexEntryMissingFromItsShard) {
  WriteTwoShards();
  nlohmann::json doc = ConsistentIndex();
  doc["weight_map"]["ghost"] = "model-00002-of-00002.safetensors";
  WriteIndex(doc);
  ExpectInvalid(Open(), {"model.safetensors.index.json", "tensor \"ghost\"",
                         "model-00002-of-00002.safetensors", "has no such tensor",
                         "every weight_map entry exists in the shard it names"});
}

TEST_F(SafetensorsIndexTest, IndexNamesAShardThatIsNotThere) {
  WriteTwoShards();
  nlohmann::json doc = ConsistentIndex();
  doc["weight_map"]["vision.patch"] = "model-00003-of-00003.safetensors";
  WriteIndex(doc);
  ExpectInvalid(Open(), {"model.safetensors.index.json", "tensor \"vision.patch\"",
                         "model-00003-of-00003.safetensors", "not a *.safetensors file"});
}

TEST_F(SafetensorsIndexTest, TensorNotListedInIndex) {
  WriteTwoShards();
  nlohmann::json doc = ConsistentIndex();
  doc["weight_map"].erase("layer.0");
  WriteIndex(doc);
  ExpectInvalid(Open(), {"model.safetensors.index.json", "tensor \"layer.0\"",
                         "model-00001-of-00002.safetensors", "does not list it",
                         "weight_map lists every tensor"});
}

TEST_F(SafetensorsIndexTest, IndexPutsTensorInTheWrongShard) {
  WriteTwoShards();
  nlohmann::json doc = ConsistentIndex();
  doc["weight_map"]["lm_head"] = "model-00001-of-00002.safetensors";
  WriteIndex(doc);
  ExpectInvalid(Open(), {"model.safetensors.index.json", "tensor \"lm_head\"",
                         "puts the tensor in model-00001-of-00002.safetensors but it is in "
                         "model-00002-of-00002.safetensors",
                         "names the shard that holds it"});
}

TEST_F(SafetensorsIndexTest, IndexTotalSizeWrong) {
  WriteTwoShards();
  nlohmann::json doc = ConsistentIndex();
  doc["metadata"]["total_size"] = 16;
  WriteIndex(doc);
  ExpectInvalid(Open(), {"model.safetensors.index.json", "total_size is 16",
                         "hold 15 tensor bytes", "equals the sum of the tensors' byte sizes"});
}

TEST_F(SafetensorsIndexTest, IndexTotalSizeNotAnInteger) {
  WriteTwoShards();
  nlohmann::json doc = ConsistentIndex();
  doc["metadata"]["total_size"] = "15";
  WriteIndex(doc);
  ExpectInvalid(Open(), {"model.safetensors.index.json", "total_size is an unsigned integer"});
}

TEST_F(SafetensorsIndexTest, IndexWithoutTotalSizeIsAccepted) {
  WriteTwoShards();
  nlohmann::json doc = ConsistentIndex();
  doc.erase("metadata");
  WriteIndex(doc);
  const Result<CheckpointIndex> r = Open();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

TEST_F(SafetensorsIndexTest, IndexValueNotAString) {
  WriteTwoShards();
  nlohmann::json doc = ConsistentIndex();
  doc["weight_map"]["embed"] = 1;
  WriteIndex(doc);
  ExpectInvalid(Open(), {"model.safetensors.index.json", "tensor \"embed\"",
                         "maps tensor names to shard file names"});
}

TEST_F(SafetensorsIndexTest, IndexNotJson) {
  WriteTwoShards();
  dir_.WriteFile("model.safetensors.index.json", "{\"weight_map\": {");
  ExpectInvalid(Open(), {"model.safetensors.index.json", "the index file is JSON"});
}

TEST_F(SafetensorsIndexTest, IndexWithoutWeightMap) {
  WriteTwoShards();
  WriteIndex(nlohmann::json{{"metadata", {{"total_size", 15}}}});
  ExpectInvalid(Open(), {"model.safetensors.index.json", "has a weight_map object"});
}

// ---- NameTable (the hash table under both the reader and the index) ----------------------------

TEST(SafetensorsNameTableTest, AssignsDenseIdsAndFindsEveryName) {
  std::vector<std::string> names;
  for (int i = 0; i < 20000; ++i) names.push_back("layers." + std::to_string(i) + ".w");
  NameTable table;
  table.Reserve(100);  // far too small: the table must grow without losing names
  for (const std::string& n : names) ASSERT_EQ(table.Insert(n), NameTable::kAbsent) << n;
  EXPECT_EQ(table.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(table.Find(names[i]), static_cast<uint32_t>(i)) << names[i];
  }
  EXPECT_EQ(table.Find("layers.20000.w"), NameTable::kAbsent);
  EXPECT_EQ(table.Find(""), NameTable::kAbsent);
}

TEST(SafetensorsNameTableTest, DuplicateReturnsTheFirstId) {
  const std::string a = "a", b = "b", a_again = "a";
  NameTable table;
  EXPECT_EQ(table.Find("a"), NameTable::kAbsent);
  EXPECT_EQ(table.Insert(a), NameTable::kAbsent);
  EXPECT_EQ(table.Insert(b), NameTable::kAbsent);
  EXPECT_EQ(table.Insert(a_again), 0u);
  EXPECT_EQ(table.size(), 2u);
}

}  // namespace
}  // namespace k3::st
