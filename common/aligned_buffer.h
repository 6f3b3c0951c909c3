// AlignedBuffer: an owned, aligned byte buffer (posix_memalign) for O_DIRECT reads and SIMD.
// Move-only. A failed allocation is a Status (kIo: not enough memory at run time), not a throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "common/status.h"

namespace k3 {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // `alignment` must be a power of two (it is raised to at least sizeof(void*)). Contents are
  // uninitialised. size 0 gives an empty buffer with data() == nullptr.
  static Result<AlignedBuffer> Allocate(size_t size, size_t alignment);
  // A large buffer for bulk I/O: 2 MiB aligned, size rounded up to 2 MiB, and advised for
  // transparent huge pages (a hint the kernel may ignore). Direct I/O pins the buffer's pages on
  // every request; with 4 KiB pages that pinning and the TLB misses cost measurable CPU.
  static Result<AlignedBuffer> AllocateHuge(size_t size);
  // For buffers whose exact size is accounted (memory plans): from kLargeBytes up, 2 MiB aligned
  // and advised for huge pages like AllocateHuge, but its size rounded to 4 KiB only, so the
  // buffer holds what the plan counts (each whole 2 MiB a huge page, the tail 4 KiB pages);
  // below it, plain 4 KiB-aligned Allocate. Either way data() is aligned to kLargeMinAlign.
  static constexpr size_t kLargeBytes = size_t{8} << 20;
  static constexpr size_t kLargeMinAlign = 4096;
  static constexpr size_t kHugePage = size_t{2} << 20;
  static Result<AlignedBuffer> AllocateLarge(size_t size);

  uint8_t* data() { return static_cast<uint8_t*>(data_); }
  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }

 private:
  // 2 MiB aligned and advised for huge pages; `size` as given.
  static Result<AlignedBuffer> AllocateAdvised(size_t size);

  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace k3
