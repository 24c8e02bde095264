// The worker's side of the scheduler protocol: each step the coordinator sends
// one StepPlan (sequences to drop, sequences to start, and which sequences run
// how many tokens), and the worker answers with the sampled tokens and the
// step's statistics. The coordinator never sees a tensor: prompts, token ids,
// sampling and policy parameters go in; token ids and numbers come out.
// LocalWorker runs it in process (`lazykv serve`); a remote worker answers the
// same messages over gRPC.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/policy_config.h"
#include "worker/kv_cache.h"
#include "worker/sampler.h"

namespace lazykv {

struct SequenceStart {
  SeqId seq = 0;
  std::vector<int32_t> prompt;  // the whole prompt; prefilled by StepItems in chunks
  int32_t generated = 0;        // the prompt's last tokens that were sampled before a preemption
  PolicyConfig policy;
  SamplingParams sampling;
  int top_logprobs = -1;  // -1: no log-probabilities; 0..20: the sampled token's plus that many alternatives
  // Every prefill item of this sequence carries its grammar mask, so the
  // worker may take the prompt's start from its prefix cache (a chunk may
  // then end the prompt early and sample). False from an older coordinator.
  bool chunks_carry_mask = false;
};

struct StepItem {
  SeqId seq = 0;
  // > 0: prefill the next this-many prompt tokens (a token is sampled only
  // when the chunk completes the prompt). 0: decode, feeding the last
  // sampled token.
  int32_t prefill_tokens = 0;
  // When the item samples: the tokens it may sample (bit t of word t / 32),
  // from the coordinator's grammar (structured outputs). Empty: any token.
  std::vector<uint32_t> allowed;
};

struct StepPlan {
  std::vector<SeqId> release;        // dropped first: finished, cancelled or preempted sequences
  std::vector<SequenceStart> start;  // then added (no tokens run yet)
  std::vector<StepItem> items;       // then one forward pass over these
};

struct SampledToken {
  SeqId seq = 0;
  int32_t token = -1;  // -1: a prefill chunk that did not finish the prompt
  float logprob = 0;   // log-probability of `token` under the model (before temperature)
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens and their log-probabilities
  int64_t evicted_slots = 0;  // slots this sequence's policy evicted during the step (part of StepResult's)
  // In the sequence's first item: the prompt tokens (from position 0) whose
  // KV came from the worker's prefix cache when it started. Its prefill
  // items then feed the prompt from there: the chunk of this item ran at
  // positions cached_tokens, cached_tokens + 1, ...
  int32_t cached_tokens = 0;
};

struct StepResult {
  // The pass did not run because the KV cache is full; no sequence advanced
  // (the coordinator preempts and retries).
  bool out_of_memory = false;
  std::vector<SampledToken> tokens;                  // one per item, in item order (when the pass ran)
  std::vector<std::pair<SeqId, std::string>> failed;  // sequences that could not start or run: why
  // Of `failed`: the sequences whose policy the worker refused (one the model
  // cannot run, a prompt it cannot keep, a config that does not validate):
  // the client's error when the client chose the policy.
  std::vector<SeqId> invalid;
  double seconds = 0;        // forward pass and sampling
  int32_t batch_tokens = 0;  // tokens fed in the pass
  int64_t evicted_slots = 0; // by the policies during this step
  int64_t demoted_slots = 0;   // evicted slots sent to a lower tier (lazy+tiers) this step
  int64_t promoted_slots = 0;  // slots brought back into the device cache this step
  int64_t promotion_hits = 0;  // promoted slots that received attention this step
  int64_t kv_slots = 0;      // live slots over all sequences, layers and heads after the step
  size_t kv_bytes = 0;       // pages in use by sequences (a prefix cache's own pages left out: they give way)
  size_t kv_pool_bytes = 0;  // pages the pool holds, in use or free
  size_t prefix_cache_bytes = 0;  // pages the prefix cache holds, shared with sequences or not
  size_t prefix_fetched_bytes = 0;  // prompt blocks fetched from the tiers into it this step
  double prefix_fetch_seconds = 0;  // the time this step spent on those fetches (misses too)
};

struct WorkerInfo {
  int32_t n_ctx = 0;                 // context limit in tokens
  int32_t n_vocab = 0;               // samplable vocabulary
  size_t kv_capacity_bytes = 0;      // 0: unbounded
  size_t kv_bytes_per_token = 0;     // one token in every layer and KV head (GQA not expanded)
  size_t kv_page_bytes = 0;          // allocation unit per (layer, head)
  int32_t page_slots = 0;
  int n_layer = 0;
  int n_head_kv = 0;
  int n_group = 1;  // query heads per KV head
  int rank = 0;     // in its tensor-parallel group
  int world = 1;    // ranks in the group; 1: none
  // Catalog policies this model cannot run, with why (TriAttention without
  // query statistics): the coordinator refuses them with a 400.
  std::map<std::string, std::string> unavailable_policies;
  bool prefix_cache = false;  // it keeps prompt pages for reuse (LocalWorkerOptions::prefix_cache_bytes)
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual WorkerInfo info() const = 0;
  // Never throws for a bad sequence (it is reported in `failed` and dropped);
  // throws lazykv::Error only when the worker itself is broken or unreachable.
  virtual StepResult step(const StepPlan& plan) = 0;
  // False while the worker is known to be down (declared dead after missed
  // heartbeats): the scheduler then fails queued sequences at once instead of
  // keeping them for a retry, or hands them to another group (GroupDispatcher).
  virtual bool alive() const { return true; }
};

}  // namespace lazykv
