#include "worker/parallel/nccl/nccl_group.h"

#include <cuda_runtime_api.h>
#include <gloo/rendezvous/store.h>
#include <nccl.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/error.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

std::string describe(int rank, int world) {
  return "tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(world) + " (NCCL)";
}

std::string cuda_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e); }

constexpr const char* kUniqueIdKey = "lazykv_nccl_unique_id";

}  // namespace

NcclGroup::NcclGroup(const NcclGroupOptions& options, gloo::rendezvous::Store& store)
    : rank_(options.rank), world_(options.world), device_(options.device), timeout_(options.timeout) {
  if (world_ < 1 || rank_ < 0 || rank_ >= world_) {
    throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: rank " + std::to_string(rank_) +
                                                 " is outside a world of " + std::to_string(world_));
  }
  if (timeout_.count() <= 0) throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: timeout must be > 0");
  const std::string self = describe(rank_, world_);
  if (const cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    throw Error(ErrorCode::kUnavailable, self + ": CUDA device " + std::to_string(device_) + ": " + cuda_text(e));
  }
  ncclUniqueId id;
  try {
    if (rank_ == 0) {
      if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        throw Error(ErrorCode::kUnavailable, self + ": ncclGetUniqueId: " + ncclGetErrorString(r));
      }
      store.set(kUniqueIdKey, std::vector<char>(reinterpret_cast<const char*>(&id),
                                                reinterpret_cast<const char*>(&id) + sizeof id));
    } else {
      const std::vector<char> bytes = store.get(kUniqueIdKey);
      if (bytes.size() != sizeof id) {
        throw Error(ErrorCode::kUnavailable, self + ": rank 0's NCCL id has " + std::to_string(bytes.size()) +
                                                 " bytes, expected " + std::to_string(sizeof id));
      }
      std::memcpy(&id, bytes.data(), sizeof id);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable, self + ": rendezvous failed: " + e.what());
  }
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
    throw Error(ErrorCode::kUnavailable, self + ": cudaStreamCreate: " + cuda_text(e));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; wait() bounds it by the timeout
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    cudaStreamDestroy(stream_);
    throw Error(ErrorCode::kUnavailable, self + ": ncclCommInitRankConfig: " + ncclGetErrorString(r));
  }
  try {
    wait("communicator setup", nullptr);
  } catch (...) {
    cudaStreamDestroy(stream_);
    throw;
  }
}

NcclGroup::~NcclGroup() {
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    // A broken communicator was aborted already; a working one is torn down
    // without waiting on peers that may be gone.
    if (broken_.empty()) ncclCommAbort(comm_);
  }
  if (staging_ != nullptr) cudaFree(staging_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclGroup::check_usable() const {
  if (!broken_.empty()) throw Error(ErrorCode::kUnavailable, describe(rank_, world_) + " is unusable: " + broken_);
  // The current device is per thread, and collectives may come from other
  // threads than the one that built the group.
  if (const cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    throw Error(ErrorCode::kUnavailable, describe(rank_, world_) + ": CUDA device " + std::to_string(device_) + ": " +
                                             cuda_text(e));
  }
}

void NcclGroup::fail(const char* what, const std::string& why) {
  if (broken_.empty() && comm_ != nullptr) ncclCommAbort(comm_);  // peers blocked on us give up too
  broken_ = std::string(what) + " failed: " + why;
  throw Error(ErrorCode::kUnavailable, describe(rank_, world_) + ": " + broken_);
}

void NcclGroup::wait(const char* what, CUstream_st* stream) {
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail(what, std::string("ncclCommGetAsyncError: ") + ncclGetErrorString(r));
    if (state != ncclSuccess && state != ncclInProgress) {
      fail(what, std::string(ncclGetErrorString(state)) + " (" + ncclGetLastError(comm_) + ")");
    }
    if (state == ncclSuccess) {
      if (stream == nullptr) return;
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) fail(what, cuda_text(e));
    }
    if (Clock::now() >= deadline) {
      fail(what, "timed out after " + std::to_string(timeout_.count()) + " ms (a peer gone or stuck?)");
    }
    std::this_thread::yield();
  }
}

void* NcclGroup::staging(size_t bytes) {
  if (bytes > staging_bytes_) {
    if (staging_ != nullptr) cudaFree(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    if (const cudaError_t e = cudaMalloc(&staging_, bytes); e != cudaSuccess) fail("staging buffer", cuda_text(e));
    staging_bytes_ = bytes;
  }
  return staging_;
}

void NcclGroup::all_reduce_sum_device(float* data, size_t n, CUstream_st* stream) {
  check_usable();
  if (world_ == 1 || n == 0) return;
  const ncclResult_t r = ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream);
  if (r != ncclSuccess && r != ncclInProgress) fail("all-reduce", ncclGetErrorString(r));
  wait("all-reduce", stream);
}

void NcclGroup::all_reduce_sum(float* data, size_t n) {
  check_usable();
  if (world_ == 1 || n == 0) return;
  const size_t bytes = n * sizeof(float);
  auto* device = static_cast<float*>(staging(bytes));
  if (const cudaError_t e = cudaMemcpyAsync(device, data, bytes, cudaMemcpyHostToDevice, stream_); e != cudaSuccess) {
    fail("all-reduce (copy in)", cuda_text(e));
  }
  all_reduce_sum_device(device, n, stream_);
  if (const cudaError_t e = cudaMemcpyAsync(data, device, bytes, cudaMemcpyDeviceToHost, stream_); e != cudaSuccess) {
    fail("all-reduce (copy out)", cuda_text(e));
  }
  if (const cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) fail("all-reduce (copy out)", cuda_text(e));
}

void NcclGroup::broadcast(std::vector<uint8_t>& bytes, int root) {
  check_usable();
  if (root < 0 || root >= world_) {
    throw Error(ErrorCode::kInvalidArgument, "broadcast root " + std::to_string(root) + " outside the group");
  }
  if (world_ == 1) return;
  // Size first (as a 64-bit count), so the receivers can make room.
  uint64_t size = rank_ == root ? uint64_t(bytes.size()) : 0;
  auto send = [&](void* host, size_t count, const char* what) {
    void* device = staging(count);
    if (const cudaError_t e = cudaMemcpyAsync(device, host, count, cudaMemcpyHostToDevice, stream_); e != cudaSuccess) {
      fail(what, cuda_text(e));
    }
    const ncclResult_t r = ncclBroadcast(device, device, count, ncclUint8, root, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) fail(what, ncclGetErrorString(r));
    wait(what, stream_);
    if (const cudaError_t e = cudaMemcpy(host, device, count, cudaMemcpyDeviceToHost); e != cudaSuccess) {
      fail(what, cuda_text(e));
    }
  };
  send(&size, sizeof size, "broadcast (size)");
  if (rank_ != root) bytes.assign(size_t(size), 0);
  if (size > 0) send(bytes.data(), bytes.size(), "broadcast");
}

}  // namespace lazykv
