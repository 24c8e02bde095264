// The ranks of one tensor-parallel group (`lazykv worker --world N`), driven
// as one StepExecutor: every step plan goes to every rank at once (they run
// the forward pass together, joined by their all-reduces), and rank 0's result
// is the step's (its sampled tokens are the ones used; the others sample the
// same). A rank that fails, or results that disagree on which sequences failed
// or whether the cache was full, fail the whole step like a dead worker.
// With `form_group` the coordinator arranges the ranks' rendezvous: the group
// forms at construction, and again before the next step after a rank
// restarted or a step failed, so a restarted rank is taken back and a
// communicator broken by a timeout is replaced. A rank restarted when its
// heartbeats show a new process other than the one that joined: a heartbeat
// that is merely older than the group (the group re-formed after a failed step
// with the new process before a heartbeat showed it) is not a restart.
#pragma once

#include <functional>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "worker/step_executor.h"

namespace lazykv {

struct TensorParallelRank {
  std::unique_ptr<StepExecutor> executor;
  std::string name;                // in errors: "worker HOST:PORT"
  std::function<uint64_t()> instance;  // optional: the rank's process (heartbeats); a change means it restarted
};

class TensorParallelWorker final : public StepExecutor {
 public:
  // Forms the group; returns each rank's instance id as it joined (empty:
  // unknown, the heartbeats' ids are taken).
  using FormGroup = std::function<std::vector<uint64_t>()>;

  // ranks in rank order. Throws Error(kInvalidArgument) when they do not
  // serve the same model (vocabulary, context, layers) or are not ranks 0..N-1
  // of a group of N, and Error(kUnavailable) when form_group fails.
  explicit TensorParallelWorker(std::vector<TensorParallelRank> ranks, FormGroup form_group = {});

  // The rank whose KV cache fills first (most KV heads for its capacity, rank
  // 0 when equal), so admission by these numbers fits every rank.
  WorkerInfo info() const override { return info_; }
  // Every rank alive; a step with one down fails at once (no rank starts it).
  bool alive() const override;
  // Throws Error(kUnavailable) naming every failed rank.
  StepResult step(const StepPlan& plan) override;
  size_t world() const { return ranks_.size(); }
  int groups_formed() const { return groups_formed_; }

 private:
  std::vector<uint64_t> instances() const;
  // Forms the group when it never formed or a rank restarted since.
  void regroup_if_needed(const StepPlan& plan);

  std::vector<TensorParallelRank> ranks_;
  FormGroup form_group_;
  WorkerInfo info_;
  bool formed_ = false;
  std::vector<uint64_t> formed_instances_;  // each rank's process that joined the group last formed
  std::vector<uint64_t> seen_instances_;    // each rank's process as the heartbeats showed it at the last step
  int groups_formed_ = 0;
};

}  // namespace lazykv
