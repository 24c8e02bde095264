// Typed, owning, move-only buffers: DeviceBuffer (device memory, plus the
// host<->device copies tests and callers need) and PinnedBuffer (page-locked
// host memory, which asynchronous copies need). Header-only so plain C++ code
// can use them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace lazykv::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count > 0) LAZYKV_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  // Allocates and uploads (synchronously) the host values.
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host.data(), host.size()); }

  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  // Synchronous copies of the first `count` elements.
  void upload(const T* host, size_t count) {
    check_count(count);
    if (count > 0) LAZYKV_CUDA_CHECK(cudaMemcpy(data_, host, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(T* host, size_t count) const {
    check_count(count);
    if (count > 0) LAZYKV_CUDA_CHECK(cudaMemcpy(host, data_, count * sizeof(T), cudaMemcpyDeviceToHost));
  }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    download(host.data(), count_);
    return host;
  }

  // Frees the memory. cudaFree errors are ignored: a destructor must not
  // throw, and a failed free means the context is already broken.
  void reset() noexcept {
    if (data_ != nullptr) static_cast<void>(cudaFree(data_));
    data_ = nullptr;
    count_ = 0;
  }

 private:
  void check_count(size_t count) const {
    if (count > count_) throw Error(ErrorCode::kInternal, "DeviceBuffer copy larger than the buffer");
  }

  T* data_ = nullptr;
  size_t count_ = 0;
};

// Page-locked host memory that grows on demand (contents are not kept).
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `count` elements; reallocates (dropping the contents) when smaller.
  T* reserve(size_t count) {
    if (count > count_) {
      reset();
      // Grow by half again, so a slowly growing batch does not reallocate every step.
      const size_t want = count + count / 2;
      LAZYKV_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&data_), want * sizeof(T), cudaHostAllocDefault));
      count_ = want;
    }
    return data_;
  }
  T* data() { return data_; }
  size_t size() const { return count_; }

  void reset() noexcept {
    if (data_ != nullptr) static_cast<void>(cudaFreeHost(data_));
    data_ = nullptr;
    count_ = 0;
  }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

// At least `count` elements of device memory in `buffer`, reallocated (contents
// dropped) when it is smaller, with headroom like PinnedBuffer.
template <class T>
T* reserve_device(DeviceBuffer<T>& buffer, size_t count) {
  if (buffer.size() < count) {
    buffer.reset();
    buffer = DeviceBuffer<T>(count + count / 2);
  }
  return buffer.data();
}

}  // namespace lazykv::cuda
