// Tier 1: one contiguous host-memory arena of a configured capacity, carved
// into blocks in multiples of an allocation unit (first fit over an ordered
// free list, with coalescing). One arena, so the transport registers it once
// and blocks travel zero-copy; pinned through the CUDA runtime when the build
// has CUDA and a GPU is present.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>

namespace lazykv::kvstore {

struct HostPoolStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;          // in allocation units, so >= the bytes asked for
  uint64_t largest_free_bytes = 0;  // the largest block that can be allocated now
  double fragmentation = 0;         // 1 - largest_free / free (0 when free is 0)
  size_t blocks = 0;
  bool pinned = false;
};

class HostPool {
 public:
  // Error(kInvalidArgument) if capacity is 0 or not a multiple of alloc_unit;
  // Error(kOutOfMemory) if the arena cannot be mapped.
  HostPool(uint64_t capacity_bytes, uint64_t alloc_unit = 64 * 1024);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Offset of a block of at least `bytes` (> 0), or nullopt if no free run fits.
  std::optional<uint64_t> allocate(uint64_t bytes);
  // Frees the block at `offset`; Error(kInternal) if no block starts there.
  void free(uint64_t offset);
  std::span<uint8_t> arena() { return {base_, capacity_}; }
  uint8_t* at(uint64_t offset) { return base_ + offset; }
  HostPoolStats stats() const;

 private:
  uint8_t* base_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t unit_ = 0;
  bool pinned_ = false;
  std::map<uint64_t, uint64_t> free_;       // offset -> length, no two adjacent
  std::map<uint64_t, uint64_t> allocated_;  // offset -> length
};

}  // namespace lazykv::kvstore
