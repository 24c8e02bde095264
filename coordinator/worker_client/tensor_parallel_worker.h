// The ranks of one tensor-parallel group (`lazykv worker --world N`), driven
// as one StepExecutor: every step plan goes to every rank at once (they run
// the forward pass together, joined by their all-reduces), and rank 0's result
// is the step's (its sampled tokens are the ones used; the others sample the
// same). A rank that fails, or results that disagree on which sequences failed
// or whether the cache was full, fail the whole step like a dead worker.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/step_executor.h"

namespace lazykv {

struct TensorParallelRank {
  std::unique_ptr<StepExecutor> executor;
  std::string name;                // in errors: "worker HOST:PORT"
  std::function<bool()> alive;     // optional: false skips the step at once (no rank starts it)
};

class TensorParallelWorker final : public StepExecutor {
 public:
  // ranks in rank order. Throws Error(kInvalidArgument) when they do not
  // serve the same model (vocabulary, context, layers).
  explicit TensorParallelWorker(std::vector<TensorParallelRank> ranks);

  // The rank whose KV cache fills first (most KV heads for its capacity, rank
  // 0 when equal), so admission by these numbers fits every rank.
  WorkerInfo info() const override { return info_; }
  // Throws Error(kUnavailable) naming every failed rank.
  StepResult step(const StepPlan& plan) override;
  size_t world() const { return ranks_.size(); }

 private:
  std::vector<TensorParallelRank> ranks_;
  WorkerInfo info_;
};

}  // namespace lazykv
