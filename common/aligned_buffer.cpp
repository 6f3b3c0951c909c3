#include "common/aligned_buffer.h"

#include <sys/mman.h>

#include <string>

#include "common/align.h"

namespace k3 {

Result<AlignedBuffer> AlignedBuffer::Allocate(size_t size, size_t alignment) {
  if (alignment < sizeof(void*)) alignment = sizeof(void*);
  if ((alignment & (alignment - 1)) != 0) {
    return Status::Invalid("AlignedBuffer: alignment " + std::to_string(alignment) +
                           " is not a power of two (internal)");
  }
  AlignedBuffer buf;
  if (size == 0) return buf;
  void* p = nullptr;
  if (::posix_memalign(&p, alignment, size) != 0) {
    return Status::Io("cannot allocate " + std::to_string(size) + " bytes aligned to " +
                      std::to_string(alignment) + ": out of memory (lower the memory budget)");
  }
  buf.data_ = p;
  buf.size_ = size;
  return buf;
}

Result<AlignedBuffer> AlignedBuffer::AllocateAdvised(size_t size) {
  K3_ASSIGN_OR_RETURN(AlignedBuffer buf, Allocate(size, kHugePage));
  if (buf.data_ != nullptr) (void)::madvise(buf.data_, size, MADV_HUGEPAGE);
  return buf;
}

Result<AlignedBuffer> AlignedBuffer::AllocateHuge(size_t size) {
  return AllocateAdvised(AlignUp(size, kHugePage));
}

Result<AlignedBuffer> AlignedBuffer::AllocateLarge(size_t size) {
  // Not rounded to 2 MiB: the plan counts these bytes. The kernel backs each whole 2 MiB of the
  // advised range with a huge page and the tail with 4 KiB pages.
  return size < kLargeBytes ? Allocate(size, kLargeMinAlign)
                            : AllocateAdvised(AlignUp(size, kLargeMinAlign));
}

}  // namespace k3
