// A tensor-parallel group over NCCL: the GPU all-reduce. Built only where the
// CUDA toolkit and NCCL are found (LAZYKV_HAVE_NCCL); the CPU build never
// needs them. Ranks meet through the same Gloo rendezvous store as the CPU
// group (the coordinator's JoinGroup relay): rank 0 publishes its NCCL unique
// id there and every rank initialises its communicator from it.
//
// The communicator is non-blocking, and every call is polled against
// `timeout`: a peer that is gone or stuck aborts the communicator and turns
// into Error(kUnavailable) instead of a hang; the group is unusable after that.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "worker/parallel/group.h"

namespace gloo::rendezvous {
class Store;
}

struct ncclComm;
struct CUstream_st;

namespace lazykv {

struct NcclGroupOptions {
  int rank = 0;
  int world = 1;
  int device = 0;  // this rank's CUDA device
  std::chrono::milliseconds timeout{30000};
};

class NcclGroup final : public TensorParallelGroup {
 public:
  // Blocks until every rank has initialised its communicator; throws
  // Error(kUnavailable) after options.timeout.
  NcclGroup(const NcclGroupOptions& options, gloo::rendezvous::Store& store);
  ~NcclGroup() override;
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  // Host data (the CPU forward pass on a GPU machine): staged through a
  // device buffer. data: float[n] in host memory.
  void all_reduce_sum(float* data, size_t n) override;
  void broadcast(std::vector<uint8_t>& bytes, int root = 0) override;
  // Device data, in place, enqueued on `stream` and waited for.
  // data: float[n] on this rank's device.
  void all_reduce_sum_device(float* data, size_t n, CUstream_st* stream);

 private:
  void check_usable() const;
  // Polls the communicator until its last call left the in-progress state,
  // then the stream until the work finished; aborts on error or timeout.
  void wait(const char* what, CUstream_st* stream);
  [[noreturn]] void fail(const char* what, const std::string& why);
  void* staging(size_t bytes);

  int rank_;
  int world_;
  int device_;
  std::chrono::milliseconds timeout_;
  ncclComm* comm_ = nullptr;
  CUstream_st* stream_ = nullptr;  // staging copies and collectives on host data
  void* staging_ = nullptr;        // device buffer for host data
  size_t staging_bytes_ = 0;
  std::string broken_;             // why the group is unusable; empty while it works
};

}  // namespace lazykv
