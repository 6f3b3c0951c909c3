// safetensors: strict reader, multi-shard index, streaming writer.
//
// Goals: validate like the official Rust crate and more (DESIGN.md §4, ECOSYSTEM-NOTES §6):
// header ≤ 100,000,000 bytes starting with '{', parsed with a SAX handler so duplicate keys and
// non-unsigned offsets are caught, known dtypes, rank ≤ 8, end − begin == numel × size, entries
// sorted by begin cover the data section contiguously from 0, data ends exactly at end of file,
// names non-empty, ≤ 4 KiB, valid UTF-8, __metadata__ string → string, no unknown keys in a
// tensor entry. Only spaces (0x20, the writers' padding) may follow the JSON object. Every
// failure is Code::kInvalid with a message naming the shard, the tensor, the rule and, where
// one exists, the byte offset in the file.
// Non-goals: reading tensor data (callers read byte ranges through Env), mmap, the sub-byte
// dtypes (F4, F6_*) and complex C64, which no K3 checkpoint uses.
// Evolution: a new dtype is one row in formats/dtype.cpp; the JSON layout is fixed upstream.
// Speed: the index reads ~500k tensor entries for the release, so the parser is a SAX handler
// that allocates only each tensor's name and shape (k3_bench_index measures it against the
// raw SAX rate).
// Thread safety: ParseHeader and ReadHeader share no state. A CheckpointIndex is immutable
// after Open, so any number of threads may call Find/All. A Writer is used by one thread.
// Invariants of a parsed Header: tensors sorted by begin tile [0, file_size − data_offset)
// exactly; every nbytes() == numel() × DTypeSize(dtype) without overflow; names are unique.
// This module is the only place in k3 that parses safetensors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "formats/dtype.h"

namespace k3::st {

inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr size_t kMaxRank = 8;
inline constexpr size_t kMaxNameBytes = 4096;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // relative to the data section
  uint64_t end = 0;    // one past the last byte, relative to the data section
  uint64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct Header {
  uint64_t header_len = 0;   // N, the JSON length
  uint64_t data_offset = 0;  // 8 + N: file offset of the data section
  uint64_t file_size = 0;
  std::vector<TensorInfo> tensors;  // sorted by begin
  std::map<std::string, std::string> metadata;
};

// Names → dense ids by open addressing: one allocation for the whole table and no node per
// name, because the index holds ~500k names for the release. Stores views: the caller keeps
// the names alive and in place.
class NameTable {
 public:
  static constexpr uint32_t kAbsent = UINT32_MAX;
  // Sizes the table for `n` names (load factor ≤ 1/2).
  void Reserve(size_t n);
  // Adds `name` with the next id (0, 1, 2, …) and returns kAbsent, or returns the id of the
  // equal name already present (and adds nothing).
  uint32_t Insert(std::string_view name);
  // The id of `name`, or kAbsent.
  uint32_t Find(std::string_view name) const;
  size_t size() const { return names_.size(); }

 private:
  size_t Probe(uint64_t hash, std::string_view name) const;
  std::vector<uint64_t> slots_;  // 0 = empty, else (hash high 32 bits << 32) | (id + 1)
  std::vector<std::string_view> names_;
  size_t mask_ = 0;
};

// Parses and validates one header. `json` is the N bytes after the length prefix; `file_size` is
// the whole file's size (the data must end exactly there); `shard` names the file in messages.
Result<Header> ParseHeader(std::string_view json, uint64_t file_size, const std::string& shard);
// Reads the length prefix and header of `path`, then ParseHeader. `scratch`, when given, holds
// the header bytes and is reused across calls (reading many shards then allocates once).
Result<Header> ReadHeader(Env* env, const std::string& path, std::string* scratch = nullptr);
// The same checks over a whole file held in memory (prefix + header + data); for fuzzing.
Result<Header> ParseFileBytes(std::string_view file, const std::string& shard);
// The rules on the 8-byte length prefix: N ≤ kMaxHeaderBytes and 8 + N ≤ file_size.
Status CheckHeaderLength(uint64_t header_len, uint64_t file_size, const std::string& shard);
// numel × DTypeSize(dtype); nullopt when that overflows 64 bits.
std::optional<uint64_t> CheckedByteSize(DType dtype, const std::vector<uint64_t>& shape);
// A tensor name as shown in messages: common/printable.h's Printable() between double quotes
// (a '"' inside shows as \x22), cut after 200 bytes.
std::string PrintableName(std::string_view name);
// Index of the first byte that breaks well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF); nullopt when `s` is valid.
std::optional<size_t> FindInvalidUtf8(std::string_view s);

// All shards of a checkpoint directory: every *.safetensors sorted by name, a hash map by
// tensor name (a name in two shards is an error naming both), and agreement with
// model.safetensors.index.json when present (every entry exists in the named shard, every
// tensor is listed).
class CheckpointIndex {
 public:
  struct Shard {
    std::string name;  // file name inside the directory
    std::string path;
    Header header;
  };
  struct Location {
    const Shard* shard;
    const TensorInfo* tensor;
    uint64_t file_offset() const { return shard->header.data_offset + tensor->begin; }
  };

  static Result<CheckpointIndex> Open(Env* env, const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<std::unique_ptr<Shard>>& shards() const { return shards_; }
  size_t tensor_count() const { return locations_.size(); }
  // nullptr when absent.
  const Location* Find(std::string_view name) const;
  // Every tensor, in shard order then data order.
  std::vector<Location> All() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<Shard>> shards_;
  // Every tensor in shard order then data order; by_name_ maps a name to its position here.
  // Both view the names inside shards_, which never move once Open returns.
  std::vector<Location> locations_;
  NameTable by_name_;
};

// Streaming writer: declare every tensor, then Begin() writes the header with final offsets to
// a temporary name, then the data is appended in declaration order, then Finish() checks that
// exactly the declared bytes arrived, fsyncs and renames to the final name. Abandon() (or the
// destructor without Finish) removes the temporary.
class Writer {
 public:
  Writer(Env* env, std::string path);
  ~Writer();
  void SetMetadata(std::map<std::string, std::string> metadata);
  void Add(std::string name, DType dtype, std::vector<uint64_t> shape);
  // Size the finished file will have; valid after all Add calls (used for free-space checks).
  uint64_t FileSize() const;
  Status Begin();
  Status Append(const void* data, size_t n);
  Status Finish();
  void Abandon();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::st
