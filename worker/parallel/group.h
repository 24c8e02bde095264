// The communicator of a tensor-parallel group: the ranks that each hold a
// shard of one model and join their partial results every layer. Collective
// calls must be made by every rank in the same order with the same sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace lazykv {

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Element-wise sum over the ranks, in place; every rank ends with the same
  // bits. Throws Error(kUnavailable) when a peer is gone or times out; the
  // group is unusable afterwards (every later call throws at once).
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // Root's bytes to every rank (others' `bytes` are replaced, any size).
  virtual void broadcast(std::vector<uint8_t>& bytes, int root = 0) = 0;
};

// A group of one: nothing to join.
class SoloGroup final : public TensorParallelGroup {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  void all_reduce_sum(float*, size_t) override {}
  void broadcast(std::vector<uint8_t>&, int) override {}
};

}  // namespace lazykv
