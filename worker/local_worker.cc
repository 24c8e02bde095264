#include "worker/local_worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <new>
#include <utility>

#include "common/error.h"
#include "kvstore/block.h"
#include "worker/draft.h"

namespace lazykv {

namespace {

// The group of a worker that is not a rank: stateless, so one serves all.
// (A member would be used by the delegated constructor before it exists.)
TensorParallelGroup& solo_group() {
  static SoloGroup solo;
  return solo;
}

// What a prompt's KV depends on besides its tokens: the weights, the model's
// settings, and how this worker computes and stores it. Seeds the prefix
// cache's key chain, which names prompt blocks in a kvstore other workers
// share, so it names the model by content, never by path: every setting that
// shapes K and V (the RoPE table included: base, scaling, per-frequency
// factors), the norm and bias vectors, and the first and last KiB of every
// matrix (enough to tell weights apart without reading the files whole). The
// group's size too: its ranks sum partial results in another order than one
// rank. kPageLayout names the page format; change it with the format.
uint64_t prefix_fingerprint(const Model& model, const LocalWorkerOptions& options, const KvCacheConfig& cache,
                            int world) {
  constexpr int kPageLayout = 1;
  const ModelConfig& m = model.config();
  std::string what = std::to_string(kPageLayout) + '|' + m.arch_name + '|' + std::to_string(model.weight_bytes()) +
                     '|' + std::to_string(world) + '|' + std::to_string(int(options.precision)) + '|' +
                     std::to_string(int(options.device)) + '|';
  const auto add = [&what](const void* data, size_t bytes) {
    if (data != nullptr) what.append(static_cast<const char*>(data), bytes);
  };
  for (const int v : {m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.head_dim, m.n_rot, m.n_ff, m.n_vocab,
                      int(m.rope_style), int(m.qkv_bias), cache.n_layer, cache.n_head_kv, cache.head_dim,
                      cache.page_slots}) {
    add(&v, sizeof(v));
  }
  add(&m.rms_eps, sizeof(m.rms_eps));
  add(&model.rope().mscale, sizeof(float));
  add(model.rope().inv_freq.data(), model.rope().inv_freq.size() * sizeof(float));
  const auto sample = [&](const cpu::WeightMatrix& w) {
    const size_t bytes = size_t(w.rows) * row_bytes(w.type, size_t(w.cols));
    const size_t n = std::min<size_t>(bytes, 1024);
    if (w.data == nullptr) return;
    add(w.data, n);
    add(static_cast<const char*>(w.data) + bytes - n, n);
  };
  const auto vector = [&](const float* v, int n) { add(v, v == nullptr ? 0 : size_t(n) * sizeof(float)); };
  sample(model.token_embd());
  sample(model.output());
  vector(model.output_norm(), m.n_embd);
  for (const LayerWeights& l : model.layers()) {
    for (const cpu::WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) sample(*w);
    vector(l.attn_norm, m.n_embd);
    vector(l.ffn_norm, m.n_embd);
    vector(l.bq, m.n_head * m.head_dim);
    vector(l.bk, m.n_head_kv * m.head_dim);
    vector(l.bv, m.n_head_kv * m.head_dim);
  }
  return kvstore::block_checksum(std::span(reinterpret_cast<const uint8_t*>(what.data()), what.size()));
}

}  // namespace

PolicyShape policy_shape_on(ComputeDevice device, PolicyShape shape) {
  if (device != ComputeDevice::kCuda) return shape;
  shape.steering = nullptr;
  shape.steering_missing = "activation steering runs on the CPU backend only (this worker runs on a GPU)";
  shape.retention_gates = nullptr;
  shape.retention_gates_missing =
      "trimkv's retention gates read layer inputs on the CPU backend only (this worker runs on a GPU)";
  return shape;
}

LocalWorker::LocalWorker(const Model& model, const LocalWorkerOptions& options)
    : LocalWorker(model, options, solo_group()) {}

LocalWorker::LocalWorker(const Model& model, const LocalWorkerOptions& options, TensorParallelGroup& group)
    : model_(model),
      options_(options),
      pool_(options.threads),
      group_(group),
      shard_(model, group.rank(), group.world()),
      unavailable_policies_(unavailable_policies(policy_shape_on(options.device, policy_shape(shard_, 0)))),
      cache_({model.config().n_layer, shard_.config().n_head_kv, model.config().head_dim, 64, options.kv_capacity_bytes}),
      forward_(make_forward_backend(options.device, options.cuda_device, shard_, group_, cache_, pool_,
                                    options.precision, options.cuda_graphs)) {
  if (options_.n_ctx <= 0) options_.n_ctx = model.config().n_ctx_train;
  if (options_.n_vocab <= 0 || options_.n_vocab > model.config().n_vocab) options_.n_vocab = model.config().n_vocab;
  if (options_.prefix_cache_bytes > 0) {
    // At least one block: a page in every layer and KV head.
    const size_t block_pages = size_t(cache_.config().n_layer) * size_t(cache_.config().n_head_kv);
    const size_t pages = std::max(options_.prefix_cache_bytes / cache_.page_bytes(), block_pages);
    const uint64_t fingerprint = prefix_fingerprint(model, options_, cache_.config(), group_.world());
    prefix_ = std::make_unique<PrefixCache>(cache_, fingerprint, pages);
    if (options_.prefix_tiers) {
      prefix_tier_ = std::make_unique<tiers::PrefixTier>(cache_, *prefix_, fingerprint, uint32_t(shard_.kv_heads().begin),
                                                         tiers::process_tiers());
    }
    forward_->set_appended_hook([this](std::span<const BatchItem> batch) { publish_prompts(batch); });
  }
}

LocalWorker::~LocalWorker() = default;

WorkerInfo LocalWorker::info() const {
  const ModelConfig& c = shard_.config();  // this rank's heads
  WorkerInfo info;
  info.n_ctx = options_.n_ctx;
  info.n_vocab = options_.n_vocab;
  info.kv_capacity_bytes = cache_.capacity_bytes();
  info.kv_bytes_per_token = cache_.slot_bytes() * size_t(c.n_layer) * size_t(c.n_head_kv);
  info.kv_page_bytes = cache_.page_bytes();
  info.page_slots = cache_.config().page_slots;
  info.n_layer = c.n_layer;
  info.n_head_kv = c.n_head_kv;
  info.n_group = c.n_group();
  info.rank = group_.rank();
  info.world = group_.world();
  info.unavailable_policies = unavailable_policies_;
  info.prefix_cache = prefix_ != nullptr;
  return info;
}

void LocalWorker::release(SeqId seq) {
  const auto found = seqs_.find(seq);
  if (found == seqs_.end()) return;
  Sequence& s = found->second;
  // Its generated tokens too: a chat's next turn, or this sequence resumed
  // after a preemption, starts with them.
  if (prefix_ != nullptr && s.policy->evicted_slots() == 0) {
    std::vector<int32_t> tokens = s.prompt;
    tokens.insert(tokens.end(), s.decoded.begin(), s.decoded.end());
    publish(seq, tokens, s.fed);  // with the last page's tail: no more is written to it
  }
  seqs_.erase(found);
  cache_.remove_sequence(seq);
}

void LocalWorker::release_all() {
  std::vector<SeqId> ids;
  for (const auto& [id, seq] : seqs_) ids.push_back(id);
  for (SeqId id : ids) release(id);
}

std::string LocalWorker::start(const SequenceStart& s, bool& invalid_request) {
  invalid_request = false;
  if (seqs_.count(s.seq) > 0) return "sequence " + std::to_string(s.seq) + " is already running";
  if (is_draft_seq(s.seq)) return "sequence id " + std::to_string(s.seq) + " is reserved for drafts";
  if (s.prompt.empty()) return "the prompt is empty";
  if (s.generated < 0 || size_t(s.generated) >= s.prompt.size()) {
    return "generated (" + std::to_string(s.generated) + ") must be below the prompt's " +
           std::to_string(s.prompt.size()) + " tokens";
  }
  if (int64_t(s.prompt.size()) >= options_.n_ctx) {
    return "prompt of " + std::to_string(s.prompt.size()) + " tokens leaves no room in the context of " +
           std::to_string(options_.n_ctx) + " tokens";
  }
  for (int32_t id : s.prompt) {
    if (id < 0 || id >= options_.n_vocab) return "token id " + std::to_string(id) + " is outside the vocabulary";
  }
  if (s.top_logprobs > 20) return "top_logprobs must be <= 20";
  for (const auto& [id, bias] : s.sampling.logit_bias) {
    if (id >= options_.n_vocab) return "logit_bias: token id " + std::to_string(id) + " is outside the vocabulary";
  }
  Sequence seq;
  try {
    s.sampling.validate();  // the coordinator validated it: a refusal here is the server's (version skew)
  } catch (const Error& e) {
    return e.what();
  }
  try {
    seq.policy = make_sequence_policy(s);
  } catch (const Error& e) {
    invalid_request = e.code() == ErrorCode::kInvalidArgument;
    return e.what();
  } catch (const std::bad_alloc&) {
    return "policy " + s.policy.name + ": its state for this sequence does not fit in memory";
  }
  seq.prompt = s.prompt;
  seq.sampler = std::make_unique<Sampler>(s.sampling);
  seq.sampler->start(s.prompt, s.generated);
  seq.top_logprobs = s.top_logprobs;
  cache_.add_sequence(s.seq, seq.policy->heads_per_layer());
  if (prefix_ != nullptr && s.chunks_carry_mask) {
    try {
      seq.fed = adopt_prefix(s.seq, seq);
    } catch (const std::exception& e) {
      // Whatever failed, the prompt can still be computed: start over without the cache.
      std::fprintf(stderr, "lazykv worker: sequence %llu computes its whole prompt: %s\n",
                   static_cast<unsigned long long>(s.seq), e.what());
      cache_.remove_sequence(s.seq);
      try {
        seq.policy = make_sequence_policy(s);  // it built once: it builds again
        cache_.add_sequence(s.seq, seq.policy->heads_per_layer());
      } catch (const std::exception& again) {
        cache_.remove_sequence(s.seq);
        return std::string("the sequence could not start: ") + again.what();
      }
      seq.fed = 0;
    }
    seq.cached_unreported = seq.fed;
  }
  seqs_.emplace(s.seq, std::move(seq));
  return "";
}

std::unique_ptr<EvictionPolicy> LocalWorker::make_sequence_policy(const SequenceStart& s) const {
  PolicyShape shape = policy_shape_on(options_.device, policy_shape(shard_, int32_t(s.prompt.size()), options_.n_ctx));
  shape.resumed_tokens = s.generated;
  return make_policy(s.policy, shape);
}

int32_t LocalWorker::adopt_prefix(SeqId id, Sequence& seq) {
  const KvCacheConfig& c = cache_.config();
  if (cache_.heads_per_layer(id) != c.n_head_kv) return 0;  // caches per query head are not shared
  const int32_t reusable = seq.policy->reusable_prompt();
  if (prefix_tier_ != nullptr) prefix_tier_->fetch(seq.prompt, reusable);
  // Every rank adopts as many tokens, each its own heads' pages: the fewest
  // any rank holds (their prefix caches give pages back on their own).
  const int32_t n = fewest_on_any_rank(prefix_->lookup(seq.prompt, reusable, prefix_pages_));
  if (n == 0) return 0;
  const size_t pages = size_t((n + c.page_slots - 1) / c.page_slots);
  for (int layer = 0; layer < c.n_layer; ++layer) {
    for (int head = 0; head < c.n_head_kv; ++head) {
      const std::vector<int32_t>& held = prefix_pages_[size_t(layer) * size_t(c.n_head_kv) + size_t(head)];
      cache_.adopt_pages(id, layer, head, std::span(held).first(pages), n);
    }
  }
  // No end_step: the next pass then ends the prompt as one pass over all of
  // it would (an evicting policy's prompt is never chunked).
  seq.policy->begin_step(0, n);
  return n;
}

int32_t LocalWorker::fewest_on_any_rank(int32_t count) {
  if (group_.world() == 1) return count;
  std::vector<float> counts(size_t(group_.world()), 0.0f);  // exact: token counts are far below 2^24
  counts[size_t(group_.rank())] = float(count);
  group_.all_reduce_sum(counts.data(), counts.size());
  return int32_t(*std::min_element(counts.begin(), counts.end()));
}

void LocalWorker::publish_prompts(std::span<const BatchItem> batch) {
  const int32_t page_slots = cache_.config().page_slots;
  for (const BatchItem& item : batch) {
    const auto found = seqs_.find(item.seq);
    if (found == seqs_.end()) continue;  // a draft (laq's lookahead)
    const Sequence& seq = found->second;
    const int32_t prompt_len = int32_t(seq.prompt.size());
    if (item.start_pos >= prompt_len) continue;  // decode
    // After an eviction the later tokens' keys and values were computed
    // without the evicted ones: not those of the prompt alone.
    if (seq.policy->evicted_slots() > 0) continue;
    const int32_t cached = std::min(item.start_pos + int32_t(item.tokens.size()), prompt_len);
    publish(item.seq, seq.prompt, cached / page_slots * page_slots);  // whole pages: it appends to the last
  }
}

void LocalWorker::publish(SeqId id, std::span<const int32_t> tokens, int32_t n_tokens) {
  if (prefix_tier_ == nullptr) {
    prefix_->publish(id, tokens, n_tokens);
    return;
  }
  new_blocks_.clear();
  prefix_->publish(id, tokens, n_tokens, &new_blocks_);
  prefix_tier_->put(new_blocks_, tokens);
}

std::span<const float> LocalWorker::run_pass(std::span<const BatchItem> items) {
  for (;;) {
    try {
      return forward_->run(items);
    } catch (const Error& e) {
      // Only a bounded cache runs out of pages (otherwise it was device memory).
      if (e.code() != ErrorCode::kOutOfMemory || prefix_ == nullptr || cache_.capacity_bytes() == 0) throw;
      // Nothing was appended: give back about the pages the pass takes, then try again.
      size_t wanted = 0;
      for (const BatchItem& item : items) wanted += pages_for_slots(item.seq, item.tokens.size());
      if (prefix_->reclaim(wanted) == 0) throw;
    }
  }
}

size_t LocalWorker::pages_for_slots(SeqId seq, size_t slots) const {
  const KvCacheConfig& c = cache_.config();
  const size_t pages = (slots + size_t(c.page_slots) - 1) / size_t(c.page_slots) + 1;  // + a part-filled one
  return pages * size_t(c.n_layer) * size_t(cache_.heads_per_layer(seq));
}

void LocalWorker::make_room_for_drafts(std::span<const DraftRequest> drafts) {
  if (cache_.capacity_bytes() == 0) return;
  // A copy of the policy's budget (its draft slots) and the draft tokens, in every head.
  size_t wanted = 0;
  for (const DraftRequest& d : drafts) {
    wanted += pages_for_slots(d.seq, size_t(d.policy->config().budget() + d.policy->draft_wanted()));
  }
  const size_t free = (cache_.capacity_bytes() - std::min(cache_.capacity_bytes(), cache_.bytes_used())) /
                      cache_.page_bytes();
  if (free < wanted) prefix_->reclaim(wanted - free);
}

void LocalWorker::fill_logprobs(std::span<const float> logits, int top, SampledToken& out) {
  // log p = logit - logsumexp(logits), in double for a stable sum.
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - double(max));
  const double log_z = double(max) + std::log(sum);
  out.logprob = float(double(logits[size_t(out.token)]) - log_z);
  if (top <= 0) return;
  const size_t k = std::min(size_t(top), logits.size());
  std::vector<int32_t>& ids = top_ids_;
  ids.resize(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  out.top.clear();
  for (size_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], float(double(logits[size_t(ids[i])]) - log_z));
}

StepResult LocalWorker::step(const StepPlan& plan) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  StepResult result;
  const auto finish = [&] {  // every way out reports time and KV memory
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    result.kv_bytes = cache_.bytes_used();
    result.kv_pool_bytes = cache_.bytes_reserved();
    if (prefix_ != nullptr) {
      result.kv_bytes -= prefix_->reclaimable_pages() * cache_.page_bytes();
      result.prefix_cache_bytes = prefix_->pages_held() * cache_.page_bytes();
    }
    if (prefix_tier_ != nullptr) {
      result.prefix_fetched_bytes = size_t(prefix_tier_->fetched_bytes() - fetched_reported_);
      result.prefix_fetch_seconds = prefix_tier_->fetch_seconds() - fetch_seconds_reported_;
      fetched_reported_ = prefix_tier_->fetched_bytes();
      fetch_seconds_reported_ = prefix_tier_->fetch_seconds();
    }
  };
  for (SeqId seq : plan.release) release(seq);
  for (const SequenceStart& s : plan.start) {
    bool invalid_request = false;
    std::string why = start(s, invalid_request);
    if (why.empty()) continue;
    result.failed.emplace_back(s.seq, std::move(why));
    if (invalid_request) result.invalid.push_back(s.seq);
  }

  // The pass: prefill chunks and decode tokens. Items of sequences that failed
  // (or were never started) are dropped and reported.
  std::vector<BatchItem> items;
  std::vector<SeqId> item_seq;
  std::vector<bool> samples;  // the item yields a token
  std::vector<std::span<const uint32_t>> allowed;  // its token mask (empty: any token)
  for (const StepItem& it : plan.items) {
    auto found = seqs_.find(it.seq);
    if (found == seqs_.end()) {
      const bool reported = std::any_of(result.failed.begin(), result.failed.end(),
                                        [&](const auto& f) { return f.first == it.seq; });
      if (!reported) result.failed.emplace_back(it.seq, "sequence " + std::to_string(it.seq) + " is not running");
      continue;
    }
    if (!it.allowed.empty() && !mask_allows_any(it.allowed, size_t(options_.n_vocab))) {
      result.failed.emplace_back(it.seq, "the token mask does not cover the vocabulary of " +
                                             std::to_string(options_.n_vocab) + " or allows no token");
      release(it.seq);
      continue;
    }
    Sequence& s = found->second;
    const int32_t prompt_left = int32_t(s.prompt.size()) - s.fed;
    if (it.prefill_tokens > 0) {
      if (prompt_left <= 0) {
        result.failed.emplace_back(it.seq, "prefill requested after the prompt was cached");
        release(it.seq);
        continue;
      }
      const int32_t n = std::min(it.prefill_tokens, prompt_left);
      items.push_back(BatchItem{it.seq, std::span<const int32_t>(s.prompt).subspan(size_t(s.fed), size_t(n)), s.fed,
                                false, s.policy.get()});
      samples.push_back(n == prompt_left);
    } else {
      if (prompt_left > 0 || s.last < 0) {
        result.failed.emplace_back(it.seq, "decode requested before the prompt was cached");
        release(it.seq);
        continue;
      }
      if (s.fed + 1 > options_.n_ctx) {
        result.failed.emplace_back(it.seq, "the sequence reached the context limit of " +
                                               std::to_string(options_.n_ctx) + " tokens");
        release(it.seq);
        continue;
      }
      items.push_back(BatchItem{it.seq, {&s.last, 1}, s.fed, false, s.policy.get()});
      samples.push_back(true);
    }
    item_seq.push_back(it.seq);
    allowed.push_back(it.allowed);
  }
  if (items.empty()) {
    finish();
    return result;
  }

  std::span<const float> logits;
  try {
    logits = run_pass(items);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kOutOfMemory) throw;
    result.out_of_memory = true;  // nothing was appended; no sequence advanced
    finish();
    return result;
  }

  const size_t model_vocab = size_t(model_.config().n_vocab);
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = seqs_.at(item_seq[i]);
    if (prefix_ != nullptr && s.fed >= int32_t(s.prompt.size())) s.decoded.push_back(s.last);  // this pass fed it
    s.fed += int32_t(items[i].tokens.size());
    result.batch_tokens += int32_t(items[i].tokens.size());
    SampledToken out;
    out.seq = item_seq[i];
    out.cached_tokens = std::exchange(s.cached_unreported, 0);
    if (samples[i]) {
      // Embedding rows past the tokenizer's vocabulary (padding) are never sampled.
      const std::span<const float> row = logits.subspan(i * model_vocab, size_t(options_.n_vocab));
      out.token = s.sampler->sample(row, allowed[i]);
      s.last = out.token;
      if (s.top_logprobs >= 0) fill_logprobs(row, s.top_logprobs, out);
    }
    result.tokens.push_back(std::move(out));
  }
  // Drafts after every item sampled (they reuse the pass's logits buffer),
  // all together, in item order on every rank.
  std::vector<DraftRequest> drafts;
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = seqs_.at(item_seq[i]);
    if (samples[i] && s.policy->draft_wanted() > 0) drafts.push_back({item_seq[i], s.policy.get(), s.last, s.fed});
  }
  if (!drafts.empty()) {
    if (prefix_ != nullptr) make_room_for_drafts(drafts);
    run_drafts(*forward_, cache_, group_, drafts, size_t(options_.n_vocab), model_vocab);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const Sequence& s = seqs_.at(item_seq[i]);
    result.tokens[i].evicted_slots = s.policy->evicted_slots() - s.evicted_seen;  // evicted_seen moves on below
  }
  for (auto& [id, s] : seqs_) {
    const int64_t evicted = s.policy->evicted_slots();
    result.evicted_slots += evicted - s.evicted_seen;
    s.evicted_seen = evicted;
    const TierCounters tiers = s.policy->tier_counters();
    result.demoted_slots += tiers.demoted_slots - s.tiers_seen.demoted_slots;
    result.promoted_slots += tiers.promoted_slots - s.tiers_seen.promoted_slots;
    result.promotion_hits += tiers.promotion_hits - s.tiers_seen.promotion_hits;
    s.tiers_seen = tiers;
    result.kv_slots += s.policy->slots();
  }
  finish();
  return result;
}

}  // namespace lazykv
