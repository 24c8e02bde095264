// A typed, owning, move-only buffer of device memory, plus the host<->device
// copies tests and callers need. Header-only so plain C++ code can use it.
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

}  // namespace lazykv::cuda
