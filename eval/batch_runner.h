// Continuous batching of many generation jobs over one model, for the eval
// harness: up to `batch` sequences run at once, each step is one forward pass
// mixing new sequences' prefills with active sequences' single decode tokens,
// and a finished job's sequence leaves the KV cache so the next job can start.
// Every job has its own eviction policy; sampling is greedy.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/policy_config.h"
#include "common/thread_pool.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "worker/model.h"
#include "worker/policy/policy.h"

namespace lazykv::eval {

struct Job {
  std::vector<int32_t> prompt;
  PolicyConfig policy;
  int32_t max_new_tokens = 0;
  // Teacher forcing: when not empty, these tokens are fed instead of sampled
  // ones and the job runs exactly forced.size() steps (max_new_tokens and
  // end-of-generation are ignored).
  std::vector<int32_t> forced;
  bool ban_eos = false;  // never pick an end-of-generation token: the text runs on to the length
  // Stop with finish "loop" once the last loop_window sampled tokens repeat
  // one block of at most loop_window / 4 tokens (0: never); greedy decoding
  // that has entered such a cycle stays in it to the length.
  int32_t loop_window = 0;
  // Admitted only once no other job is running: the jobs from here up to the
  // next such job (at most a batch of them) then start, step and, when they
  // have equal lengths, finish together.
  bool wait_for_idle = false;
  // epicache's episode: its patched prompt and the history it compresses
  // (eval/conversation.h); null for any other job.
  std::shared_ptr<const EpisodePrompt> episode;
};

struct JobResult {
  std::vector<int32_t> tokens;  // generated (or forced) tokens, a final end-of-generation token included
  std::string finish;           // "stop", "length", "loop" or "error"
  std::string error;            // why the job failed (empty when it ran)
  int64_t peak_slots = 0;       // over all layers and cache heads
  int64_t peak_kv_bytes = 0;    // peak_slots * slot bytes
  double mean_slots = 0;        // time-averaged over the passes that sampled a token (EvictionPolicy::mean_slots)
  double mean_kv_bytes = 0;     // mean_slots * slot bytes
  int64_t cache_heads = 0;      // cache heads over all layers: slots per head = slots / cache_heads
  int64_t evicted_slots = 0;
  double policy_seconds = 0;
  TierCounters tiers;           // what a tiered policy moved (zero otherwise)
  // Wall time of the passes this job took part in (shared with the rest of
  // the batch: per-job speed is meaningful with batch 1 only).
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;
  // Drafts the policy asked for that found no room in the cache (a
  // compaction then went without the draft's queries: worker/draft.h).
  int64_t failed_drafts = 0;

  bool ok() const { return error.empty(); }
};

struct BatchRunnerOptions {
  int batch = 16;     // sequences active at once
  int threads = 0;    // 0: all cores
  int32_t n_ctx = 0;  // context limit; 0: the model's training context
  cpu::ActivationPrecision precision = cpu::ActivationPrecision::kF32;
};

// Logits for the job's token number `index` of its continuation (0: the
// prefill's last row), restricted to the tokenizer's vocabulary. The span is
// valid during the call only.
using LogitsCallback = std::function<void(size_t job, int32_t index, std::span<const float> logits)>;
// After each finished (or failed) job: its index and result, then the jobs
// done so far and the total.
using ProgressCallback = std::function<void(size_t job, const JobResult& result, size_t done, size_t total)>;

// What tiered jobs moved, as the reports write it: counts, the promotion hit
// rate, and bytes moved (demoted + fetched) per token over `tokens` tokens.
nlohmann::json tier_counters_json(const TierCounters& t, double tokens);

class BatchRunner {
 public:
  BatchRunner(const Model& model, const Tokenizer& tokenizer, const BatchRunnerOptions& options);

  // Runs every job; a job that cannot run (too long for the context, a bad
  // token id, a policy the model shape does not suit) fails alone with its
  // error in its result.
  std::vector<JobResult> run(const std::vector<Job>& jobs, const LogitsCallback& on_logits = {},
                             const ProgressCallback& on_done = {});

  int batch() const { return batch_; }
  void set_batch(int batch);
  int32_t n_ctx() const { return n_ctx_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const Model& model() const { return model_; }

 private:
  const Model& model_;
  const Tokenizer& tokenizer_;
  BatchRunnerOptions options_;
  int batch_;
  int32_t n_ctx_;
  ThreadPool pool_;
};

}  // namespace lazykv::eval
