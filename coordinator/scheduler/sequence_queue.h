// What the API submits sequences to: one Scheduler (one worker or one
// tensor-parallel group), or a GroupDispatcher over several groups' schedulers.
// The HTTP and gRPC front ends and the drain on shutdown see only this.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/grammar/token_constraint.h"
#include "coordinator/scheduler/sequence_stream.h"
#include "worker/step_executor.h"

namespace lazykv {

struct SequenceRequest {
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 16;
  SamplingParams sampling;
  PolicyConfig policy;
  int top_logprobs = -1;  // -1: none
  std::vector<std::string> stop;
  bool ignore_eos = false;  // end-of-generation tokens do not end it (benchmarks: a fixed output length)
  // Structured output: every sampled token keeps the text a prefix of this
  // grammar's language, and it ends only where the grammar may (null: free text).
  std::shared_ptr<const grammar::TokenConstraint> constraint;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

struct SequenceHandle {
  uint64_t id = 0;
  std::shared_ptr<SequenceStream> stream;
};

class SequenceQueue {
 public:
  virtual ~SequenceQueue() = default;
  // Queues sequences together (all or none); their events share one stream.
  // Throws Error(kInvalidArgument) for one that can never run (empty prompt,
  // prompt plus max_new_tokens beyond the context, a prompt larger than the
  // whole KV capacity) and Error(kUnavailable) when the queue is full or it
  // is draining.
  virtual std::vector<SequenceHandle> submit(std::vector<SequenceRequest> requests) = 0;
  // Throws Error(kInvalidArgument) when `n` sequences submitted together could
  // never fit the queue, so callers can refuse before building them.
  virtual void check_fits_queue(size_t n) const = 0;
  // Ends a waiting or running sequence with finish_reason "cancelled" and
  // frees its KV at the next step. Unknown or finished ids are ignored.
  virtual void cancel(uint64_t id) = 0;
  // Stops admitting new submissions (they get kUnavailable); queued and
  // running sequences go on.
  virtual void drain() = 0;
  virtual bool draining() const = 0;
  // Ends every queued and running sequence with an error (unavailable) and
  // stops stepping. Idempotent.
  virtual void stop(const std::string& reason) = 0;
  virtual size_t running() const = 0;
  virtual size_t waiting() const = 0;
  // What the API checks requests against (context, vocabulary, KV capacity).
  virtual const WorkerInfo& worker_info() const = 0;
};

}  // namespace lazykv
