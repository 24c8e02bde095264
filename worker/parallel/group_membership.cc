#include "worker/parallel/group_membership.h"

#include <string>

#include "common/error.h"

namespace lazykv {

GroupMembership::GroupMembership(int rank, int world) : rank_(rank), world_(world) {
  if (world_ < 1 || rank_ < 0 || rank_ >= world_) {
    throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: rank " + std::to_string(rank_) +
                                                 " is outside a world of " + std::to_string(world_));
  }
}

void GroupMembership::join(std::unique_ptr<TensorParallelGroup> group) {
  if (!group || group->rank() != rank_ || group->world() != world_) {
    throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: a communicator for another rank or world");
  }
  group_.reset();  // the old peers' connections close before the new ones are used
  group_ = std::move(group);
  ++joins_;
}

void GroupMembership::leave() { group_.reset(); }

TensorParallelGroup& GroupMembership::current() {
  if (!group_) {
    throw Error(ErrorCode::kUnavailable, "tensor-parallel rank " + std::to_string(rank_) + " of " +
                                             std::to_string(world_) +
                                             " is not in a group yet (the coordinator forms it when it connects)");
  }
  return *group_;
}

void GroupMembership::all_reduce_sum(float* data, size_t n) { current().all_reduce_sum(data, n); }

void GroupMembership::broadcast(std::vector<uint8_t>& bytes, int root) { current().broadcast(bytes, root); }

}  // namespace lazykv
