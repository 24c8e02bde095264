// Continuous batching. One thread runs steps: each step it drops finished and
// cancelled sequences, admits waiting ones (FIFO) while the KV memory allows,
// sends one StepPlan to the worker and turns the sampled tokens into text
// events (detokenized, stop strings applied) on each sequence's stream.
//
// Memory: admission is optimistic (the KV bytes in use, plus the newcomer's
// prompt, must fit the capacity). When a step finds the cache full, the most
// recently admitted sequence is preempted by recompute: its KV is dropped and
// it goes back to the head of the queue with its generated tokens appended to
// its prompt. Recompute, not demotion: the kvstore holds a policy's evicted
// token blocks, not whole sequences on the step's critical path, and a
// prefill of a few thousand tokens costs less than swapping a whole cache.
// With an evicting policy the recomputed cache is rebuilt from the new
// prompt, so the continuation can differ from an uninterrupted run; full KV
// is exact.
//
// Prefill and decode share steps (chunked prefill). While sequences are
// decoding, a step carries only as many prompt tokens as fit in
// max_decode_stall by the learned cost of prompt tokens (StepCost), so a
// newcomer's prompt delays every running stream's next token by a bounded
// time instead of by its whole prefill; with nothing decoding a step takes up
// to max_prefill_tokens, which is best for time to first token.
//
// A step that throws (the worker broke) ends the sequences that ran on it
// with an error; those it would have started never ran and go back to the
// head of the queue (for start_retry_window after their first failed start),
// unless the worker is declared dead (StepExecutor::alive()), when they fail
// at once too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/metrics/registry.h"
#include "coordinator/scheduler/sequence_queue.h"
#include "coordinator/scheduler/step_cost.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "worker/step_executor.h"

namespace lazykv {

// The fewest prompt tokens a step carries while sequences decode, whatever
// max_decode_stall says: a prompt always progresses, and a token budget that
// small would run prompts at a small fraction of the prefill throughput.
constexpr int32_t kMinPrefillChunk = 16;

// A sequence that sent no token yet (queued, or still in its prefill), taken
// off a dead worker to run on another group's (GroupDispatcher): it keeps its
// id and its stream.
struct UnstartedSequence {
  uint64_t id = 0;
  SequenceRequest request;
  std::shared_ptr<SequenceStream> stream;
  bool prompt_counted = false;  // its prompt tokens are in the metrics already
};

struct SchedulerOptions {
  int max_batch = 32;                // sequences in one step
  int max_waiting = 256;             // queued sequences; beyond it submit() throws kUnavailable
  // Prompt tokens run per step. Longer prompts of the full policy are
  // prefilled in chunks over several steps; an evicting policy's prompt runs
  // whole (in a step of its own when it exceeds this).
  int32_t max_prefill_tokens = 512;
  // While sequences are decoding: how much longer than decoding alone a step
  // carrying prompt tokens may take (0: no bound, max_prefill_tokens only).
  // At least kMinPrefillChunk prompt tokens run per step, so prompts always
  // progress, and never a chunk mostly paid for by a step's fixed cost
  // (StepCost::prefill_chunk); an evicting policy's prompt runs whole.
  std::chrono::milliseconds max_decode_stall{150};
  // How long a sequence whose start failed (the worker broke before it ran)
  // keeps being started again: long enough for a restarting worker to come
  // back or be declared dead (3 s with the default heartbeats); a request
  // that crashes the worker then fails instead of crashing it forever.
  std::chrono::milliseconds start_retry_window{10'000};
  std::string worker_label = "0";    // the `worker` label of step metrics
  // Sequence ids are first_id, first_id + id_stride, ...: the schedulers of
  // several groups behind one API never share an id.
  uint64_t first_id = 1;
  uint64_t id_stride = 1;
  // Once the worker is declared dead, each sequence that has sent no event
  // yet is offered here (from the step thread) instead of failing; true when
  // another scheduler adopted it. Null: they fail.
  std::function<bool(UnstartedSequence&)> hand_over;
};

class Scheduler final : public SequenceQueue {
 public:
  Scheduler(StepExecutor& worker, const Tokenizer& tokenizer, metrics::Registry& metrics,
            const SchedulerOptions& options);
  ~Scheduler();  // stop("the server is shutting down")
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  std::vector<SequenceHandle> submit(std::vector<SequenceRequest> requests) override;
  void check_fits_queue(size_t n) const override;
  void cancel(uint64_t id) override;
  void drain() override;
  bool draining() const override { return draining_.load(); }
  void stop(const std::string& reason) override;  // and stops the step thread
  size_t running() const override { return running_count_.load(); }
  size_t waiting() const override { return waiting_count_.load(); }
  const WorkerInfo& worker_info() const override { return info_; }

  // Waits until nothing is queued or running, or the deadline; true if idle.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  // Queues a sequence another scheduler handed over (SchedulerOptions::hand_over),
  // moving from `s` only when it takes it; false when stopping or full (a
  // draining scheduler takes it: it is no new request).
  bool adopt(UnstartedSequence& s);
  // Prompt plus max_new_tokens of every sequence queued or running: its load.
  int64_t outstanding_tokens() const { return outstanding_tokens_.load(); }
  bool worker_alive() const { return worker_.alive(); }

 private:
  struct Sequence;
  void loop();
  bool step_once();  // false when there was nothing to do
  void take_inbox();
  void admit(StepPlan& plan);
  void finish(Sequence& seq, const std::string& reason, const std::string& error = "", bool unavailable = false,
              bool invalid_request = false);
  void on_token(Sequence& seq, const SampledToken& sampled);
  void update_gauges();
  // Prompt tokens this step may carry, given how many sequences decode in it.
  int32_t prefill_budget(int decoding) const;
  // The worker's mask for the sequence's next token (empty without a constraint).
  std::vector<uint32_t> allowed_tokens(const Sequence& seq) const;
  // The worker took the first `cached_tokens` of the sequence's prompt from its prefix cache.
  void count_prefix_hit(Sequence& seq, int32_t cached_tokens);
  // After a failed step on a dead worker: offers `seq` to options_.hand_over; true when it went.
  bool hand_over(Sequence& seq);
  void publish_waiting_locked();

  StepExecutor& worker_;
  const Tokenizer& tokenizer_;
  metrics::Registry& metrics_;
  SchedulerOptions options_;
  WorkerInfo info_;

  // Shared with request threads.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::unordered_set<uint64_t> cancels_;
  bool stopping_ = false;
  std::string stop_reason_;
  uint64_t next_id_;
  std::atomic<bool> draining_{false};
  std::atomic<size_t> running_count_{0};
  std::atomic<size_t> waiting_count_{0};
  std::atomic<int64_t> outstanding_tokens_{0};
  // This scheduler's part of the gauges every group's scheduler adds to.
  metrics::GaugeShare waiting_gauge_;  // under mutex_
  metrics::GaugeShare running_gauge_, kv_slots_gauge_, kv_bytes_gauge_, kv_pool_gauge_, prefix_cache_gauge_,
      capacity_gauge_;  // the step thread's (capacity: the constructor's)

  // Owned by the step thread.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<SeqId> pending_release_;
  size_t kv_bytes_ = 0;  // in use after the last step
  StepCost cost_;

  std::thread thread_;
};

}  // namespace lazykv
