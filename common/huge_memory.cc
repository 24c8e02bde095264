#include "common/huge_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "common/error.h"

namespace lazykv {

constexpr size_t kHugePage = size_t(2) << 20;

HugeMemory::HugeMemory(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  // Over-allocated by a page so the start can be aligned (the kernel only
  // backs whole aligned 2 MiB ranges with huge pages).
  map_bytes_ = bytes + kHugePage;
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) {
    const int err = errno;
    map_ = nullptr;
    throw Error(ErrorCode::kOutOfMemory,
                "cannot map " + std::to_string(bytes) + " bytes of memory: " + std::strerror(err));
  }
  const auto start = reinterpret_cast<uintptr_t>(map_);
  data_ = reinterpret_cast<uint8_t*>((start + kHugePage - 1) & ~(kHugePage - 1));
  // Advice only: without THP the memory works the same on normal pages.
  (void)::madvise(data_, bytes, MADV_HUGEPAGE);
}

HugeMemory::~HugeMemory() { reset(); }

HugeMemory::HugeMemory(HugeMemory&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

HugeMemory& HugeMemory::operator=(HugeMemory&& other) noexcept {
  if (this != &other) {
    reset();
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void HugeMemory::reset() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  data_ = nullptr;
  size_ = 0;
}

}  // namespace lazykv
