// The in-process worker of `lazykv serve`: the whole model on this machine's
// CPU (or one CUDA GPU, LocalWorkerOptions::device), one KV cache, one forward
// pass per step over every scheduled sequence.
// In a tensor-parallel group (`lazykv worker --world N`) it is one rank: its
// shard of the model and the KV cache of its heads; every rank gets the same
// plans and samples the same tokens (the logits are whole on every rank), and
// the coordinator uses rank 0's.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/thread_pool.h"
#include "worker/compute_device.h"
#include "worker/draft.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/model.h"
#include "worker/policy/policy.h"
#include "worker/prefix_cache.h"
#include "worker/step_executor.h"
#include "worker/tiers/prefix_tier.h"

namespace lazykv {

struct LocalWorkerOptions {
  int threads = 0;                  // 0: all cores
  int32_t n_ctx = 0;                // 0: the model's training context
  int32_t n_vocab = 0;              // samplable vocabulary (the tokenizer's); 0: the model's
  size_t kv_capacity_bytes = 0;     // 0: unbounded
  cpu::ActivationPrecision precision = cpu::ActivationPrecision::kF32;  // the CPU pass's matmuls
  ComputeDevice device = ComputeDevice::kCpu;
  int cuda_device = 0;              // with kCuda: as check_compute_device returned it
  bool cuda_graphs = true;          // with kCuda: decode steps replayed as CUDA graphs
  // Prompt KV reuse: at most this many bytes of prompt pages kept after their
  // sequences end, for later prompts that start the same way (PrefixCache).
  // 0: off. In a group each rank keeps its own heads' pages, and a prompt
  // takes what every rank holds.
  size_t prefix_cache_bytes = 0;
  // With a prefix cache: its whole blocks also go to the process's tiers
  // (tiers::process_tiers: the node's kvstore, or in-process), and a prompt
  // fetches from there what the prefix cache lacks (tiers::PrefixTier).
  bool prefix_tiers = false;
};

// What a policy may use of the shape on `device`: the CUDA pass has no
// steering step and does not hand layer inputs to the host, so there the
// steering vector and the retention gates are gone, with why.
PolicyShape policy_shape_on(ComputeDevice device, PolicyShape shape);

class LocalWorker final : public StepExecutor {
 public:
  LocalWorker(const Model& model, const LocalWorkerOptions& options);
  // One rank of `group` (which must outlive the worker).
  LocalWorker(const Model& model, const LocalWorkerOptions& options, TensorParallelGroup& group);
  ~LocalWorker() override;

  WorkerInfo info() const override;
  StepResult step(const StepPlan& plan) override;
  size_t n_sequences() const { return seqs_.size(); }
  // Drops every sequence and its KV (a tensor-parallel group formed again:
  // the peers' halves of those caches are gone).
  void release_all();

 private:
  struct Sequence {
    std::vector<int32_t> prompt;
    int32_t fed = 0;            // tokens in the cache so far (prompt, then generated)
    int32_t last = -1;          // the last sampled token, fed by the next decode item
    std::vector<int32_t> decoded;  // the decode tokens fed so far (kept for the prefix cache)
    std::unique_ptr<EvictionPolicy> policy;
    std::unique_ptr<Sampler> sampler;
    int top_logprobs = -1;
    int64_t evicted_seen = 0;   // policy->evicted_slots() already reported
    int32_t cached_unreported = 0;  // prompt tokens adopted from the prefix cache, until the first item reports them
    TierCounters tiers_seen;    // policy->tier_counters() already reported
  };
  void release(SeqId seq);
  // Why the sequence cannot start ("" when it started); invalid_request is
  // set when its policy was refused (StepResult::invalid).
  std::string start(const SequenceStart& s, bool& invalid_request);
  void fill_logprobs(std::span<const float> logits, int top, SampledToken& out);
  // The sequence's policy for its prompt (Error(kInvalidArgument) when the shape or prompt does not suit it).
  std::unique_ptr<EvictionPolicy> make_sequence_policy(const SequenceStart& s) const;
  // Adopts the longest stored start of the new sequence's prompt its policy
  // allows (in a group, the longest every rank holds); returns the prompt
  // tokens adopted.
  int32_t adopt_prefix(SeqId id, Sequence& seq);
  // The smallest `count` of any rank of the group (a collective: every rank
  // calls it, for the same sequences in the same order).
  int32_t fewest_on_any_rank(int32_t count);
  // The appended hook: every whole page of each prompt chunk just cached.
  void publish_prompts(std::span<const BatchItem> batch);
  // PrefixCache::publish, and the blocks it stored to the tiers (prefix_tier_).
  void publish(SeqId id, std::span<const int32_t> tokens, int32_t n_tokens);
  // Gives back prefix-cache pages until the drafts' copies fit (run_drafts
  // does not reclaim: a draft that does not fit would just be shorter).
  void make_room_for_drafts(std::span<const DraftRequest> drafts);
  // Pages `slots` more slots may take in every layer and cache head of `seq`.
  size_t pages_for_slots(SeqId seq, size_t slots) const;
  // The pass, with the prefix cache's unshared pages given back to the pool
  // while the cache is too full for it. Error(kOutOfMemory) as ForwardBackend::run.
  std::span<const float> run_pass(std::span<const BatchItem> items);

  const Model& model_;
  LocalWorkerOptions options_;
  ThreadPool pool_;
  TensorParallelGroup& group_;
  ModelShard shard_;
  // Catalog policies this model cannot run, with why (fixed by the model: found once).
  std::map<std::string, std::string> unavailable_policies_;
  KvCache cache_;
  std::unique_ptr<PrefixCache> prefix_;  // after cache_: it releases its pages first
  std::vector<std::vector<int32_t>> prefix_pages_;  // adopt_prefix scratch
  std::unique_ptr<tiers::PrefixTier> prefix_tier_;  // with options.prefix_tiers
  std::vector<PrefixCache::NewBlock> new_blocks_;   // publish scratch
  uint64_t fetched_reported_ = 0;  // prefix_tier_->fetched_bytes() already in a StepResult
  double fetch_seconds_reported_ = 0;  // and its fetch_seconds()
  std::unique_ptr<ForwardBackend> forward_;
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<int32_t> top_ids_;  // fill_logprobs scratch
};

}  // namespace lazykv
