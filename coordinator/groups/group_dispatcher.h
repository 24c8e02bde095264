// Several groups behind one coordinator's API (`--group`, repeated). Each
// group (one worker, or one tensor-parallel group of ranks) has its own
// Scheduler and step thread; all of a request's sequences go to one group:
//   1. the group that last ran the prompt's longest known prefix (its prefix
//      cache may hold it), unless its outstanding tokens exceed the least
//      loaded group's by more than `affinity_slack_tokens`;
//   2. otherwise the group with the fewest outstanding tokens.
// Prefixes are the router's (PrefixAffinity): 64-token blocks of token ids,
// the prefix cache's block size. Only groups whose workers are alive get new
// requests; when a group's worker is declared dead, the sequences that sent
// no token yet (queued, or started and still in their prefill) move to the
// others, one by one, and those that sent tokens end with an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/metrics/registry.h"
#include "coordinator/router/prefix_affinity.h"
#include "coordinator/scheduler/scheduler.h"

namespace lazykv {

struct GroupDispatcherOptions {
  int64_t affinity_slack_tokens = 8192;
  size_t affinity_capacity = 100'000;  // keys in the affinity table
  std::chrono::milliseconds affinity_ttl{600'000};
};

struct DispatchGroup {
  StepExecutor* executor = nullptr;
  std::string label;  // the `worker` label of its step metrics
};

class GroupDispatcher final : public SequenceQueue {
 public:
  // Every group must serve the same model (context, vocabulary, KV layout).
  GroupDispatcher(const std::vector<DispatchGroup>& groups, const Tokenizer& tokenizer, metrics::Registry& metrics,
                  const SchedulerOptions& scheduler_options, const GroupDispatcherOptions& options = {});
  ~GroupDispatcher() override;  // stops every group before any goes away

  std::vector<SequenceHandle> submit(std::vector<SequenceRequest> requests) override;
  void check_fits_queue(size_t n) const override { schedulers_.front()->check_fits_queue(n); }
  void cancel(uint64_t id) override;  // to every group: a sequence may have moved
  void drain() override;
  bool draining() const override { return schedulers_.front()->draining(); }
  void stop(const std::string& reason) override;
  size_t running() const override;
  size_t waiting() const override;
  // The first group's, with the smallest KV capacity of all.
  const WorkerInfo& worker_info() const override { return info_; }

  // The group a request with this prompt would go to now (-1: none alive).
  int choose(const std::vector<int32_t>& prompt);
  Scheduler& group(int g) { return *schedulers_[size_t(g)]; }
  int size() const { return int(schedulers_.size()); }

 private:
  bool usable(int g) const;
  // Usable groups other than `except`, least outstanding tokens first.
  std::vector<int> by_load_locked(int except) const;
  std::vector<int> others_by_load(int except);
  int choose_locked(const std::vector<uint64_t>& keys, router::PrefixAffinity::Clock::time_point now);
  bool hand_over(int from, UnstartedSequence& s);

  GroupDispatcherOptions options_;
  WorkerInfo info_;
  std::vector<std::unique_ptr<Scheduler>> schedulers_;
  std::mutex mutex_;  // guards affinity_, rotation_ and the cancels; held across a hand-over
  router::PrefixAffinity affinity_;
  int rotation_ = 0;  // where ties start, so equal loads go round the groups
  // The latest cancelled ids (at most kRecentCancels), so a sequence
  // cancelled while it moves between groups does not start on the new one.
  std::unordered_set<uint64_t> recent_cancels_;
  std::deque<uint64_t> cancel_order_;
};

}  // namespace lazykv
