// A worker's place in a tensor-parallel group whose communicator is formed,
// and formed again, while the worker runs: `lazykv worker --rank R --world N`
// starts without peers and the coordinator arranges the rendezvous (the
// JoinGroup call); a rank that restarts joins a new group with the others.
// Rank and world never change, so the model shard and KV cache built for them
// stay valid. Collectives before the first join, or after the communicator
// broke, throw Error(kUnavailable). Not thread-safe: the worker service joins
// and steps under one lock.
#pragma once

#include <memory>

#include "worker/parallel/group.h"

namespace lazykv {

class GroupMembership final : public TensorParallelGroup {
 public:
  GroupMembership(int rank, int world);

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void all_reduce_sum(float* data, size_t n) override;
  void broadcast(std::vector<uint8_t>& bytes, int root = 0) override;

  // Replaces the communicator (the old one is closed first). Throws
  // Error(kInvalidArgument) when its rank or world is not this member's.
  void join(std::unique_ptr<TensorParallelGroup> group);
  // Closes the communicator; collectives throw until the next join.
  void leave();
  bool joined() const { return group_ != nullptr; }
  int joins() const { return joins_; }  // groups formed so far

 private:
  TensorParallelGroup& current();

  const int rank_;
  const int world_;
  std::unique_ptr<TensorParallelGroup> group_;
  int joins_ = 0;
};

}  // namespace lazykv
