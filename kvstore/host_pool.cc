#include "kvstore/host_pool.h"

#include <dlfcn.h>
#include <sys/mman.h>

#include <iterator>
#include <string>

#include "common/error.h"

namespace lazykv::kvstore {

namespace {

// Pinning without a link-time CUDA dependency: the kvstore library is built
// with and without CUDA and runs on machines without a GPU, so the CUDA
// runtime is looked up at run time. Where it is absent, or no GPU is
// present, the arena stays pageable (transfers still work, through a staging
// copy in the CUDA driver).
using CudaGetDeviceCountFn = int (*)(int*);
using CudaHostRegisterFn = int (*)(void*, size_t, unsigned int);
using CudaHostUnregisterFn = int (*)(void*);
constexpr int kCudaSuccess = 0;
constexpr unsigned int kCudaHostRegisterDefault = 0;

struct CudaRuntime {
  CudaGetDeviceCountFn get_device_count = nullptr;
  CudaHostRegisterFn host_register = nullptr;
  CudaHostUnregisterFn host_unregister = nullptr;
  bool available() const { return get_device_count && host_register && host_unregister; }
};

// Loaded once and never unloaded (unloading the CUDA runtime is unsafe).
const CudaRuntime& cuda_runtime() {
  static const CudaRuntime runtime = [] {
    CudaRuntime r;
    void* handle = nullptr;
    for (const char* name : {"libcudart.so", "libcudart.so.12", "libcudart.so.11.0"}) {
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
    }
    if (!handle) return r;
    r.get_device_count = reinterpret_cast<CudaGetDeviceCountFn>(dlsym(handle, "cudaGetDeviceCount"));
    r.host_register = reinterpret_cast<CudaHostRegisterFn>(dlsym(handle, "cudaHostRegister"));
    r.host_unregister = reinterpret_cast<CudaHostUnregisterFn>(dlsym(handle, "cudaHostUnregister"));
    int devices = 0;
    if (!r.available() || r.get_device_count(&devices) != kCudaSuccess || devices == 0) return CudaRuntime{};
    return r;
  }();
  return runtime;
}

}  // namespace

HostPool::HostPool(uint64_t capacity_bytes, uint64_t alloc_unit) : capacity_(capacity_bytes), unit_(alloc_unit) {
  if (alloc_unit == 0 || capacity_bytes == 0 || capacity_bytes % alloc_unit != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "host pool capacity " + std::to_string(capacity_bytes) +
                    " must be a positive multiple of the allocation unit " + std::to_string(alloc_unit));
  }
  // Anonymous private mapping: pages are materialized on first touch, so a
  // large configured capacity costs nothing until blocks arrive (unless the
  // arena is pinned, which faults every page in).
  void* mapped = mmap(nullptr, capacity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    throw Error(ErrorCode::kOutOfMemory,
                "cannot map a host pool of " + std::to_string(capacity_) + " bytes");
  }
  base_ = static_cast<uint8_t*>(mapped);
  free_.emplace(0, capacity_);
  if (const CudaRuntime& cuda = cuda_runtime(); cuda.available()) {
    pinned_ = cuda.host_register(base_, capacity_, kCudaHostRegisterDefault) == kCudaSuccess;
  }
}

HostPool::~HostPool() {
  if (pinned_) cuda_runtime().host_unregister(base_);
  munmap(base_, capacity_);
}

std::optional<uint64_t> HostPool::allocate(uint64_t bytes) {
  if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, "host pool: cannot allocate 0 bytes");
  if (bytes > capacity_) return std::nullopt;  // also keeps the round-up below from overflowing
  const uint64_t length = (bytes + unit_ - 1) / unit_ * unit_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < length) continue;
    const auto [offset, run] = *it;
    free_.erase(it);
    if (run > length) free_.emplace(offset + length, run - length);
    allocated_.emplace(offset, length);
    return offset;
  }
  return std::nullopt;
}

void HostPool::free(uint64_t offset) {
  const auto block = allocated_.find(offset);
  if (block == allocated_.end()) {
    throw Error(ErrorCode::kInternal,
                "host pool: free of offset " + std::to_string(offset) + ", where no block starts");
  }
  uint64_t start = offset;
  uint64_t length = block->second;
  allocated_.erase(block);

  // Merge with the free runs that touch this one, so no two runs are adjacent.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + length) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == start) {
      start = previous->first;
      length += previous->second;
      free_.erase(previous);
    }
  }
  free_.emplace(start, length);
}

HostPoolStats HostPool::stats() const {
  HostPoolStats stats;
  stats.capacity_bytes = capacity_;
  // One pass over the free runs: no two are adjacent, so there are at most blocks + 1.
  uint64_t free_bytes = 0;
  for (const auto& [offset, length] : free_) {
    free_bytes += length;
    if (length > stats.largest_free_bytes) stats.largest_free_bytes = length;
  }
  stats.used_bytes = capacity_ - free_bytes;
  stats.fragmentation =
      free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(stats.largest_free_bytes) / static_cast<double>(free_bytes);
  stats.blocks = allocated_.size();
  stats.pinned = pinned_;
  return stats;
}

}  // namespace lazykv::kvstore
