// Eviction policy framework. One EvictionPolicy object per sequence holds a
// small state machine per (layer, cache head): per-slot arrays kept aligned
// with the KV cache's slots. The forward pass drives it:
//
//   begin_step(start_pos, n_new)     before the pass (new slots get state)
//   observe_layer_input(layer, ...)  each layer's input rows, when asked for
//   stats(layer, head, pos)          what the attention kernel records for
//   query_buffer(layer, head, pos)   the token at pos (null: nothing)
//   end_step(layer, cache, seq)      after the pass: update, select, compact
//
// Attention in the step sees the full cache; eviction happens after it, so a
// policy's peak is its budget plus what it lets accumulate between
// compactions. Decode step t counts from 1 after the prompt: the token at
// position P + t - 1 is step t's query (P = prompt length).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/policy_config.h"
#include "common/thread_pool.h"
#include "kernels/cpu/ops.h"
#include "worker/kv_cache.h"
#include "worker/policy/query_stats.h"
#include "worker/policy/steering.h"
#include "worker/policy/token_classes.h"

namespace lazykv {

struct RetentionGates;  // worker/policy/retention_gates.h

// What epicache compresses a conversation's history for: the tokens of the
// episode's patched prompt (its medoid segments after an instruction),
// whose queries score the cache, and how many of the request's prompt
// tokens are the history (the rest, the question, is appended after the
// compression and never evicted). The conversation harness routes each
// question to an episode and sets this (eval/conversation.h).
struct EpisodePrompt {
  std::vector<int32_t> tokens;
  int32_t history_len = 0;
};

struct PolicyShape {
  int n_layer = 0;
  int n_head_kv = 0;
  int n_group = 1;      // query heads per KV head
  int head_dim = 0;
  int32_t prompt_len = 0;
  // The last of prompt_len's tokens that were generated before a preemption
  // and are prefilled again on resuming; the request's own prompt is the
  // rest (what keep_prompt keeps).
  int32_t resumed_tokens = 0;
  float attn_scale = 0;  // 1/sqrt(head_dim) unless the model says otherwise
  // The most positions the sequence can reach (prompt + generated), 0 when
  // unknown: state sized by a parameter (the query ring of a `window`) is
  // never made larger than the sequence can use.
  int32_t max_len = 0;
  // For policies that score cached keys by position (triattention): the
  // RoPE of the keys (inverse frequencies [n_rot / 2], empty when unknown,
  // and the pairing), the model's query statistics (null: none, and why),
  // and this shard's first KV head (the statistics cover the whole model).
  std::vector<float> rope_inv_freq;
  cpu::RopeStyle rope_style = cpu::RopeStyle::kNeox;
  std::shared_ptr<const QueryStats> query_stats;
  std::string query_stats_missing;
  int kv_head_offset = 0;
  // For policies that read the text's structure (skipkv): what each token id
  // marks (TokenClass bits); null when the model carries no token texts.
  std::shared_ptr<const TokenClasses> token_classes;
  // skipkv's steering vector (null: none, and why).
  std::shared_ptr<const SteeringVector> steering;
  std::string steering_missing;
  // trimkv's retention gates (null: none, and why).
  std::shared_ptr<const RetentionGates> retention_gates;
  std::string retention_gates_missing;
  // epicache's episode (null: the request was not routed to one).
  std::shared_ptr<const EpisodePrompt> episode;
};

struct ModelConfig;
class Model;
class ModelShard;
// The policy shape of a model for a prompt of prompt_len tokens, in a
// sequence of at most max_len positions (0: unknown). From a Model or a
// shard the shape also carries the RoPE and the query statistics.
PolicyShape policy_shape(const ModelConfig& config, int32_t prompt_len, int32_t max_len = 0);
PolicyShape policy_shape(const Model& model, int32_t prompt_len, int32_t max_len = 0);
PolicyShape policy_shape(const ModelShard& shard, int32_t prompt_len, int32_t max_len = 0);

// What a tiered policy moved: the eval harness reports bytes per token and
// the promotion hit rate from these.
struct TierCounters {
  int64_t demoted_slots = 0, demoted_bytes = 0;
  int64_t promoted_slots = 0, promoted_bytes = 0;
  int64_t promotion_hits = 0;   // promoted slots that received attention >= alpha before leaving again
  // Row requests (one per block with rows wanted; the name predates row
  // gets) and the bytes they bring back, promoted or not (failed ones left out).
  int64_t fetched_blocks = 0, fetched_bytes = 0;
  int64_t fetch_waits = 0;      // row requests an eviction step had to wait for, still in flight
  bool tiers_available = true;

  // Sums over sequences (available only when every sequence had tiers).
  TierCounters& operator+=(const TierCounters& o) {
    demoted_slots += o.demoted_slots;
    demoted_bytes += o.demoted_bytes;
    promoted_slots += o.promoted_slots;
    promoted_bytes += o.promoted_bytes;
    promotion_hits += o.promotion_hits;
    fetched_blocks += o.fetched_blocks;
    fetched_bytes += o.fetched_bytes;
    fetch_waits += o.fetch_waits;
    tiers_available = tiers_available && o.tiers_available;
    return *this;
  }
};

// The queries of a draft (laq's lookahead): tokens decoded greedily on a
// compressed copy of the cache, at positions first_pos, first_pos + 1, ...
// heads[layer * heads_per_layer + head] holds [tokens][queries_per_head][head_dim].
struct DraftQueries {
  int32_t tokens = 0;
  int32_t first_pos = 0;
  std::vector<std::vector<float>> heads;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy();
  EvictionPolicy(const EvictionPolicy&) = delete;
  EvictionPolicy& operator=(const EvictionPolicy&) = delete;

  const PolicyConfig& config() const { return config_; }
  const PolicyShape& shape() const { return shape_; }
  // Cache heads per layer: the sequence must be added to the KvCache with
  // this (n_head_kv, or n_head_kv * n_group when selecting per query head).
  int heads_per_layer() const { return heads_per_layer_; }
  int queries_per_head() const { return shape_.n_group * shape_.n_head_kv / heads_per_layer_; }
  // Decode step of the latest token (0 while in the prompt).
  int32_t step() const { return step_; }
  bool evicts() const { return config_.name != "full"; }
  // Prompt tokens (from position 0) whose keys and values may come from a
  // prefix cache instead of this sequence's own pass: their queries would
  // record nothing the policy keeps (none with prompt attention sums; a
  // query ring's window must lie past them). Never the prompt's last token,
  // which samples. The worker then calls begin_step(0, n) and every layer's
  // end_step, as after a first prefill chunk of n tokens.
  virtual int32_t reusable_prompt() const;

  // --- forward-pass hooks ---
  // Throws Error(kInvalidArgument) when a pass feeds more than one decode
  // token to an evicting policy (every decode token is its own step).
  void check_pass(int32_t start_pos, int32_t n_new) const;
  void begin_step(int32_t start_pos, int32_t n_new);  // check_pass, then new slots get state
  // Statistics the kernel records for the query at `pos` (null: none).
  // Concurrent calls for distinct (layer, head) are safe.
  const cpu::AttentionStats* stats(int layer, int head, int32_t pos);
  // Where the forward pass copies the query vectors [queries_per_head][head_dim]
  // of the token at pos, for policies that rescore from recent queries (null: not kept).
  float* query_buffer(int layer, int head, int32_t pos);
  // True when stats accumulate over several tokens of one pass (prompt
  // attention sums): the forward pass then runs a head's tokens on one thread.
  bool serial_prefill() const { return accumulate_prefill_; }
  // Updates state from this step's statistics and compacts the layer's cache
  // heads when the policy says so. Layers may run concurrently.
  void end_step(int layer, KvCache& cache, SeqId seq);

  // --- hidden states (skipkv) ---
  // True when the policy reads each decode token's final hidden state: the
  // forward pass then calls observe_token for the token it appended, after
  // the output norm and before the step's end_step calls.
  virtual bool wants_hidden() const { return false; }
  // token: the id at pos (a generated position); hidden: its [n_embd] row.
  virtual void observe_token(int32_t pos, int32_t token, std::span<const float> hidden);

  // --- layer inputs (trimkv) ---
  // True when the policy reads the attention input of each new token: the
  // forward pass then calls observe_layer_input for every layer, after the
  // input norm and before attention, with the rows of the tokens this pass
  // appends (their slots exist since begin_step).
  virtual bool wants_layer_input() const { return false; }
  // rows: [n][n_embd] for positions start_pos...; pool: the pass's threads.
  // Its time counts in policy_seconds().
  void observe_layer_input(int layer, int32_t start_pos, const float* rows, int64_t n, ThreadPool& pool);
  // The rates themselves, log beta [n][the gates' n_head_kv] for positions
  // start_pos..., where they come from elsewhere than the gates (trace
  // replay). Only a policy that wants_layer_input takes them.
  virtual void observe_retention(int layer, int32_t start_pos, std::span<const float> log_beta, int64_t n);

  // --- activation steering (skipkv) ---
  // The scale of shape().steering's vector to add to the residual after its
  // layer for the decode token at pos (0: none). Asked before the pass.
  virtual float steering_scale(int32_t pos, int32_t token);

  // --- draft (laq, epicache) ---
  // The draft tokens the policy waits for before it compacts (0: none). A
  // policy that defers its compaction this way gets it done in end_draft.
  virtual int32_t draft_wanted() const { return 0; }
  // The draft's tokens when the policy gives them (epicache's patched
  // prompt, draft_wanted() of them, fed in one pass); empty: the draft
  // decodes greedily from the sampled token.
  virtual std::span<const int32_t> draft_tokens() const { return {}; }
  // The most prompt tokens the next pass may feed from position pos, for a
  // policy that compresses between blocks of its prompt (epicache); 0: any.
  // A draft may follow each block (draft_wanted), before anything is sampled.
  virtual int32_t prefill_block(int32_t) const { return 0; }
  // The prompt tokens the pass at pos feeds: the rest of a prompt of
  // prompt_len, or at most a block of it.
  int32_t prompt_chunk(int32_t pos, int32_t prompt_len) const {
    const int32_t block = prefill_block(pos);
    return block > 0 ? std::min(block, prompt_len - pos) : prompt_len - pos;
  }
  // The slots of (layer, head) the draft runs on: keep receives the indices
  // (increasing) of a copy the size of the budget. Every slot by default.
  virtual void draft_slots(int layer, int head, const KvCache& cache, SeqId seq, std::vector<int32_t>& keep);
  // The draft's queries have come (tokens may be fewer than wanted, even 0,
  // when the cache had no room for them): every layer's end_step runs with
  // them in draft() (layers in parallel on `pool` when given), then draft_done().
  void end_draft(const DraftQueries& draft, KvCache& cache, SeqId seq, ThreadPool* pool = nullptr);

  // --- reports ---
  int64_t slots() const { return slots_.load(); }  // over all layers and heads
  int64_t peak_slots() const { return peak_slots_; }
  // Time-averaged occupancy: the mean, over the passes that sampled a token
  // (the prompt's last pass and every decode step), of the slots their
  // attention saw. With the peak, the two memory figures budgets are
  // compared by.
  double mean_slots() const {
    return sampling_passes_ ? double(attended_slot_sum_) / double(sampling_passes_) : 0.0;
  }
  int64_t evicted_slots() const { return evicted_.load(); }
  // Seconds spent in end_step (statistics upkeep, scoring, selection,
  // compaction), summed over layers even when they run in parallel, and in
  // observe_layer_input (trimkv's gates: wall time of the pass's pool).
  double policy_seconds() const { return double(policy_ns_.load()) * 1e-9; }
  // Zero for every policy without tiers.
  virtual TierCounters tier_counters() const { return {}; }
  // The per-slot state of one head, for trace replay: {"last": [...], ...}.
  virtual nlohmann::json slot_state(int layer, int head) const;

 protected:
  // Per-slot state of one (layer, cache head); every non-empty per-slot
  // vector has n entries, in the cache's slot order.
  struct Head {
    int32_t n = 0;
    std::vector<int32_t> last, mri;
    std::vector<float> attn;
    std::vector<float> score;            // the policy's own accumulated score (Needs::slot_score)
    std::vector<uint8_t> hits;
    // Ring of the last keep_queries queries, grown as they arrive:
    // [entries][queries_per_head][head_dim], entries <= keep_queries.
    std::vector<float> queries;
    std::vector<int32_t> query_pos;      // [entries]: position of each kept query (-1: none)
    cpu::AttentionStats stats;         // decode queries
    cpu::AttentionStats prompt_stats;  // prompt queries: attention sums only
  };
  // What the policy asks of the attention kernel and the base class.
  struct Needs {
    bool hits = false;
    float alpha = 0;
    bool attn_sum = false;         // accumulate probabilities into Head::attn
    bool attn_prefill = false;     // ... for prompt tokens too (else decode only)
    bool attn_last_prompt = false; // ... for the last prompt token only
    bool last_mri = false;         // keep Head::last / Head::mri per slot
    bool slot_score = false;       // keep Head::score per slot (zero for new slots)
    int32_t keep_queries = 0;      // remember the last queries (ring)
  };

  EvictionPolicy(PolicyConfig config, const PolicyShape& shape, int heads_per_layer, Needs needs);

  // New slots [first, first + count) hold positions first_pos...; the default
  // sets last = (prompt ? 0 : step - 1), mri = 0, attn = 0.
  virtual void init_slots(Head& h, int32_t first, int32_t count, int32_t first_pos);
  // What observe_layer_input does for a policy that wants_layer_input.
  virtual void read_layer_input(int layer, int32_t start_pos, const float* rows, int64_t n, ThreadPool& pool);
  // After the pass, for one layer: update state from h.hits / h.attn, then
  // fill keep[head] with the slot indices to keep (strictly increasing), or
  // leave it empty to keep every slot. Called with the layer's heads.
  virtual void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
                      std::vector<std::vector<int32_t>>& keep) = 0;

  // Helpers for subclasses.
  int32_t prompt_len() const { return shape_.prompt_len; }
  // The request's own prompt: prompt_len() less the generated tokens a
  // resumed sequence prefills again (what a policy that keeps the prompt keeps).
  int32_t own_prompt_len() const { return shape_.prompt_len - shape_.resumed_tokens; }
  // The position after the current pass's last token.
  int32_t pass_end() const { return pass_end_; }
  // True in the end_step of the pass that appended the prompt's last token.
  bool prompt_just_completed() const { return pass_start_ < shape_.prompt_len && pass_end_ >= shape_.prompt_len; }
  // The decode step a position belongs to (0 for prompt positions).
  int32_t step_of(int32_t pos) const { return pos < shape_.prompt_len ? 0 : pos - shape_.prompt_len + 1; }
  // The prompt slots a keep_prompt=1 policy never evicts: own_prompt_len(),
  // or 0 (keep_prompt=0, or no such parameter). Kept slots lead the slot order.
  int32_t kept_prompt_len() const { return keep_prompt_ ? own_prompt_len() : 0; }
  // Keeps the top `k` slots among [0, n_candidates) by score, plus every slot
  // in [n_candidates, n); writes sorted indices to keep. Ties: older first.
  // The kept prompt's slots are among the k whatever their scores.
  void keep_top(const float* scores, int32_t n_candidates, int32_t n, int32_t k, std::vector<int32_t>& keep,
                std::vector<int32_t>& index);
  // The remembered queries of a head, oldest first: (position, pointer to
  // [queries_per_head][head_dim]).
  std::vector<std::pair<int32_t, const float*>> recent_queries(const Head& h) const;
  // Probabilities of the remembered queries over the head's slots, each with
  // its own causal mask: probs[rows][n], rows = remembered x queries_per_head
  // (returns rows).
  int32_t recent_query_probs(const Head& h, const cpu::KvPages& kv, std::vector<float>& probs) const;
  // The same for any queries: (position, [queries_per_head][head_dim]) each.
  int32_t query_probs(std::span<const std::pair<int32_t, const float*>> queries, const cpu::KvPages& kv,
                      std::vector<float>& probs) const;
  struct Scratch;
  // SnapKV's selection for any queries: their attention over the slots
  // before the `newest` newest, averaged over the queries and the GQA group
  // and max-pooled with `kernel`, keeps the top k of them (keep_top); the
  // newest stay.
  void keep_by_pooled_attention(std::span<const std::pair<int32_t, const float*>> queries, int32_t newest, int32_t k,
                                int kernel, const Head& h, const cpu::KvPages& kv, Scratch& s,
                                std::vector<int32_t>& keep);
  // Hooks for a policy that moves slots between tiers (lazy+tiers).
  // Before a head is compacted, while the rows of the slots it drops are
  // still in the cache (keep: the surviving slot indices, increasing).
  virtual void before_compact(int layer, int head, const Head& h, std::span<const int32_t> keep,
                              const KvCache& cache, SeqId seq);
  // Once per layer at the end of every end_step, after compaction.
  virtual void after_compact(int layer, KvCache& cache, SeqId seq);
  // Appends slots to one head of `layer` (from after_compact): their f16 K
  // and V rows ([n][head_dim] each) into the cache, and their state (last
  // hit, maximum recurrence interval; zero attention, no hit) into the
  // policy. Returns false, appending nothing, when the cache has no room.
  bool append_slots(int layer, int head, KvCache& cache, SeqId seq, std::span<const int32_t> positions,
                    const uint16_t* k_rows, const uint16_t* v_rows, std::span<const int32_t> last,
                    std::span<const int32_t> mri);
  // The head's state, for hooks that need another head of the layer.
  const Head& head_state(int layer, int h) const {
    return heads_[size_t(layer) * size_t(heads_per_layer_) + size_t(h)];
  }

  // Scratch for select() (one set per layer: layers run concurrently).
  struct Scratch {
    std::vector<float> scores, pooled, probs, keys, values, aux;
    std::vector<int32_t> index;
  };
  Scratch& scratch(int layer) { return scratch_[size_t(layer)]; }
  // The draft's queries during end_draft; nullptr in any other step.
  const DraftQueries* draft() const { return draft_; }
  // After end_draft's compaction, even one that threw (draft() still set):
  // forget what asked for the draft. Runs in a destructor: must not throw.
  virtual void draft_done() noexcept {}

 private:
  void point_stats(Head& h) const;  // after the per-slot vectors move
  Head& head(int layer, int h) { return heads_[size_t(layer) * size_t(heads_per_layer_) + size_t(h)]; }

  PolicyConfig config_;
  PolicyShape shape_;
  int heads_per_layer_;
  Needs needs_;
  bool accumulate_prefill_;
  int32_t step_ = 0;
  int32_t pass_start_ = 0, pass_end_ = 0;  // positions of the current pass
  std::vector<Head> heads_;                // [n_layer][heads_per_layer]
  std::vector<Scratch> scratch_;           // [n_layer]
  std::vector<std::vector<std::vector<int32_t>>> keep_;  // [n_layer][heads_per_layer]
  std::atomic<int64_t> slots_{0}, evicted_{0}, policy_ns_{0};
  bool keep_prompt_ = false;
  int64_t peak_slots_ = 0;
  int64_t attended_slot_sum_ = 0, sampling_passes_ = 0;
  const DraftQueries* draft_ = nullptr;
};

using PolicyFactory = std::unique_ptr<EvictionPolicy> (*)(const PolicyConfig& config, const PolicyShape& shape);
// The engine's half of a policy's registration: its factory by catalog name
// (common/policy_config.h holds the other half; the names are the same).
const std::map<std::string, PolicyFactory>& policy_factories();

// Why the named policy cannot run on the model of this shape (TriAttention
// without query statistics: "no query statistics beside the model ..."),
// or "" when it can. A worker lists these in its
// info, so the coordinator refuses such requests before they reach a step.
std::string policy_unavailable(const std::string& name, const PolicyShape& shape);
// Every catalog policy that cannot run on this shape, with why.
std::map<std::string, std::string> unavailable_policies(const PolicyShape& shape);

// Builds the policy named by config for one sequence. Throws
// Error(kInvalidArgument) when the shape or the prompt does not suit it.
std::unique_ptr<EvictionPolicy> make_policy(const PolicyConfig& config, const PolicyShape& shape);

}  // namespace lazykv
