// ReservedFloats: a float array whose address space is reserved up front and whose memory the
// kernel commits page by page as it is first written, so a buffer sized for the most positions a
// sequence may ever hold (--ctx) costs RAM only for the positions it has reached.
//
// Why not std::vector: assign/resize writes every element, so an eager --ctx reservation is
// resident from the first token; growing a vector instead copies it at each step, and the copy
// briefly holds old + new (1.5–3× the data) exactly when the context is longest.
// Here: one anonymous private mapping (MAP_NORESERVE: the reservation itself is not charged
// against overcommit), never moved; unwritten pages read as +0.0f. Release() hands pages back
// (MADV_DONTNEED) so a reused sequence shrinks to what it writes next.
// Copyable: a copy reserves the same size and copies the contents (the source's untouched pages
// read as the shared zero page, the copy's pages are committed). Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace k3 {

class ReservedFloats {
 public:
  ReservedFloats() = default;
  // Reserves n floats, all +0.0f. Throws std::bad_alloc when the address space cannot be
  // mapped, as std::vector would.
  explicit ReservedFloats(size_t n);
  ~ReservedFloats();
  ReservedFloats(const ReservedFloats& o);
  ReservedFloats& operator=(const ReservedFloats& o);
  ReservedFloats(ReservedFloats&& o) noexcept;
  ReservedFloats& operator=(ReservedFloats&& o) noexcept;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }

  // Gives back the memory of every whole page at or past element `from` (their contents become
  // +0.0f again). Elements before `from` keep their values.
  void Release(size_t from = 0);
  // Bytes of this buffer's pages that are mapped now (mincore): what it costs in RAM, except
  // that a page only ever read maps the kernel's shared zero page and counts here too.
  uint64_t ResidentBytes() const;

 private:
  size_t MappedBytes() const;
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace k3
