// MemFile: a read-only in-memory File for tests of readers (TrunkRing, AsyncBatch, BatchReader
// users). A hook runs before every read, from whichever thread reads, so a test can observe the
// order of reads, fail chosen ones, or hold one until it lets it go.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

#include "common/env.h"
#include "common/status.h"

namespace k3::test {

class MemFile : public File {
 public:
  MemFile(std::string path, std::string data) : data_(std::move(data)) { path_ = std::move(path); }

  Status PRead(uint64_t offset, size_t n, void* dst, size_t* got) override {
    *got = 0;
    if (on_read) K3_RETURN_IF_ERROR(on_read(offset, n));
    ++reads;
    if (offset >= data_.size()) return Status::Ok();
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, data_.size() - offset));
    std::memcpy(dst, data_.data() + offset, k);
    *got = k;
    return Status::Ok();
  }
  Status PWrite(uint64_t, const void*, size_t, size_t*) override {
    return Status::Invalid(path_ + ": read-only test file");
  }
  Result<uint64_t> Size() override { return uint64_t{data_.size()}; }
  Status Truncate(uint64_t) override { return Status::Invalid(path_ + ": read-only test file"); }
  Status Sync() override { return Status::Ok(); }

  const std::string& data() const { return data_; }
  // Called before every read with its range; a failure is returned as the read's.
  std::function<Status(uint64_t offset, size_t n)> on_read;
  std::atomic<int> reads{0};  // reads that got past on_read

 private:
  std::string data_;
};

}  // namespace k3::test
