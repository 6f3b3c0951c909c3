#include "common/reserved_floats.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <utility>
#include <vector>

namespace k3 {
namespace {

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

size_t RoundUpToPage(size_t bytes) {
  const size_t page = PageBytes();
  return (bytes + page - 1) / page * page;
}

}  // namespace

ReservedFloats::ReservedFloats(size_t n) : size_(n) {
  if (n == 0) return;
  if (n > SIZE_MAX / sizeof(float)) throw std::bad_alloc();
  void* p = ::mmap(nullptr, MappedBytes(), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    size_ = 0;
    throw std::bad_alloc();
  }
  data_ = static_cast<float*>(p);
}

ReservedFloats::~ReservedFloats() {
  if (data_ != nullptr) ::munmap(data_, MappedBytes());
}

ReservedFloats::ReservedFloats(const ReservedFloats& o) : ReservedFloats(o.size_) {
  if (size_ != 0) std::memcpy(data_, o.data_, size_ * sizeof(float));
}

ReservedFloats& ReservedFloats::operator=(const ReservedFloats& o) {
  if (this != &o) *this = ReservedFloats(o);
  return *this;
}

ReservedFloats::ReservedFloats(ReservedFloats&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

ReservedFloats& ReservedFloats::operator=(ReservedFloats&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, MappedBytes());
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

size_t ReservedFloats::MappedBytes() const { return RoundUpToPage(size_ * sizeof(float)); }

void ReservedFloats::Release(size_t from) {
  if (data_ == nullptr || from >= size_) return;
  const size_t start = RoundUpToPage(from * sizeof(float)), end = MappedBytes();
  if (start < end) {
    (void)::madvise(reinterpret_cast<char*>(data_) + start, end - start, MADV_DONTNEED);
  }
}

uint64_t ReservedFloats::ResidentBytes() const {
  if (data_ == nullptr) return 0;
  const size_t page = PageBytes(), pages = MappedBytes() / page;
  std::vector<unsigned char> resident(pages);
  if (::mincore(data_, MappedBytes(), resident.data()) != 0) return 0;
  uint64_t n = 0;
  for (unsigned char r : resident) n += (r & 1u) != 0 ? page : 0;
  return n;
}

}  // namespace k3
