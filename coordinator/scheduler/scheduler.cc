#include "coordinator/scheduler/scheduler.h"

#include <algorithm>
#include <unordered_map>

#include "common/error.h"
#include "common/metrics/metric_names.h"
#include "coordinator/tokenizer/stop_strings.h"

namespace lazykv {

using Clock = std::chrono::steady_clock;
// After a worker failure, how long until the next attempt.
constexpr auto kWorkerRetryDelay = std::chrono::milliseconds(100);

struct Scheduler::Sequence {
  Sequence(uint64_t id, SequenceRequest r, std::shared_ptr<SequenceStream> stream, const Tokenizer& tokenizer)
      : id(id), request(std::move(r)), stream(std::move(stream)), decoder(tokenizer),
        stop(request.stop) {
    if (request.constraint) grammar = request.constraint->start();
  }
  uint64_t id;
  SequenceRequest request;
  std::shared_ptr<SequenceStream> stream;
  StreamDecoder decoder;
  StopStringMatcher stop;
  std::vector<int32_t> generated;
  grammar::MatchState grammar;  // where the output stands in request.constraint's grammar
  bool started = false;    // known to the worker
  bool prefilled = false;  // its prompt (plus generated tokens, after a preemption) is cached
  int32_t prompt_fed = 0;  // of those, tokens prefilled so far (chunked prefill)
  bool counted = false;    // prompt tokens counted in the metrics
  Clock::time_point first_failed_start{};  // when a step that would have started it first failed
  bool done = false;
  Clock::time_point last_token{};
  // What the worker prefills: the prompt, plus what was generated before a preemption.
  int32_t feed_size() const { return int32_t(request.prompt.size() + generated.size()); }
  // A prompt that may be prefilled over several steps: an evicting policy's
  // prompt-time selection (SnapKV's window, H2O's prompt scores) needs the
  // whole prompt in one pass.
  bool chunkable() const { return request.policy.name == "full"; }
  std::vector<int32_t> feed() const {
    std::vector<int32_t> tokens = request.prompt;
    tokens.insert(tokens.end(), generated.begin(), generated.end());
    return tokens;
  }
};

namespace {

// KV bytes a new sequence needs for n tokens: whole pages in every layer and
// cache head (a policy selecting per query head caches each KV head once per
// query head of its group).
size_t kv_bytes_for(const WorkerInfo& info, const PolicyConfig& policy, size_t n_tokens) {
  if (info.page_slots <= 0) return 0;
  const size_t pages = (n_tokens + size_t(info.page_slots) - 1) / size_t(info.page_slots);
  const bool per_query_head = policy.params.count("per_query_head") > 0 && policy.get("per_query_head") != 0;
  const size_t heads = size_t(info.n_head_kv) * (per_query_head ? size_t(info.n_group) : 1);
  return pages * info.kv_page_bytes * size_t(info.n_layer) * heads;
}

}  // namespace

Scheduler::Scheduler(StepExecutor& worker, const Tokenizer& tokenizer, metrics::Registry& metrics,
                     const SchedulerOptions& options)
    : worker_(worker),
      tokenizer_(tokenizer),
      metrics_(metrics),
      options_(options),
      info_(worker.info()),
      next_id_(options.first_id),
      waiting_gauge_(metrics.gauge(metrics::kRequestsWaiting)),
      running_gauge_(metrics.gauge(metrics::kRequestsRunning)),
      kv_slots_gauge_(metrics.gauge(metrics::kKvSlots, {"device"})),
      kv_bytes_gauge_(metrics.gauge(metrics::kKvBytes, {"device"})),
      kv_pool_gauge_(metrics.gauge(metrics::kKvPoolBytes, {"device"})),
      prefix_cache_gauge_(metrics.gauge(metrics::kPrefixCacheBytes)),
      capacity_gauge_(metrics.gauge(metrics::kKvCapacityBytes, {"device"})) {
  if (options_.max_batch < 1) throw Error(ErrorCode::kInvalidArgument, "--max-batch must be >= 1");
  if (options_.max_waiting < 1) throw Error(ErrorCode::kInvalidArgument, "--max-waiting must be >= 1");
  if (options_.id_stride < 1) throw Error(ErrorCode::kInvalidArgument, "the id stride must be >= 1");
  // With no prompt tokens per step a prompt would never start, and the step thread would spin.
  if (options_.max_prefill_tokens < 1) {
    throw Error(ErrorCode::kInvalidArgument, "--max-prefill-tokens must be >= 1");
  }
  capacity_gauge_.set(double(info_.kv_capacity_bytes));
  metrics_.gauge(metrics::kWorkerUp, {options_.worker_label}).set(1);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop("the server is shutting down"); }

std::vector<SequenceHandle> Scheduler::submit(std::vector<SequenceRequest> requests) {
  for (const SequenceRequest& r : requests) {
    if (r.prompt.empty()) throw Error(ErrorCode::kInvalidArgument, "the prompt is empty");
    if (r.max_new_tokens < 1) throw Error(ErrorCode::kInvalidArgument, "max_tokens must be >= 1");
    const int64_t total = int64_t(r.prompt.size()) + r.max_new_tokens;
    if (total > info_.n_ctx) {
      throw Error(ErrorCode::kInvalidArgument,
                  "this model's maximum context length is " + std::to_string(info_.n_ctx) + " tokens; the prompt has " +
                      std::to_string(r.prompt.size()) + " tokens and max_tokens is " +
                      std::to_string(r.max_new_tokens));
    }
    const size_t need = kv_bytes_for(info_, r.policy, r.prompt.size() + 1);
    if (info_.kv_capacity_bytes > 0 && need > info_.kv_capacity_bytes) {
      throw Error(ErrorCode::kInvalidArgument, "the prompt of " + std::to_string(r.prompt.size()) + " tokens needs " +
                                                   std::to_string(need) + " bytes of KV cache; the cache holds " +
                                                   std::to_string(info_.kv_capacity_bytes));
    }
  }
  check_fits_queue(requests.size());
  int64_t tokens = 0;
  for (const SequenceRequest& r : requests) tokens += int64_t(r.prompt.size()) + r.max_new_tokens;
  std::vector<SequenceHandle> handles;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || draining_) throw Error(ErrorCode::kUnavailable, "the server is shutting down");
    if (waiting_count_.load() + requests.size() > size_t(options_.max_waiting)) {
      throw Error(ErrorCode::kUnavailable, "the queue is full (" + std::to_string(waiting_count_.load()) +
                                               " sequences waiting); retry later");
    }
    auto stream = std::make_shared<SequenceStream>();
    for (SequenceRequest& r : requests) {
      auto seq = std::make_unique<Sequence>(next_id_, std::move(r), stream, tokenizer_);
      next_id_ += options_.id_stride;
      handles.push_back({seq->id, seq->stream});
      inbox_.push_back(std::move(seq));
    }
    waiting_count_ += handles.size();
    outstanding_tokens_ += tokens;
    publish_waiting_locked();
  }
  wake_.notify_all();
  return handles;
}

bool Scheduler::adopt(UnstartedSequence& s) {
  {
    std::lock_guard lock(mutex_);
    // Not a new request: a draining server still finishes it.
    if (stopping_ || waiting_count_.load() >= size_t(options_.max_waiting)) return false;
    const int64_t tokens = int64_t(s.request.prompt.size()) + s.request.max_new_tokens;
    auto seq = std::make_unique<Sequence>(s.id, std::move(s.request), std::move(s.stream), tokenizer_);
    seq->counted = s.prompt_counted;
    inbox_.push_back(std::move(seq));
    ++waiting_count_;
    outstanding_tokens_ += tokens;
    publish_waiting_locked();
  }
  wake_.notify_all();
  return true;
}

void Scheduler::publish_waiting_locked() { waiting_gauge_.set(double(waiting_count_.load())); }

void Scheduler::check_fits_queue(size_t n) const {
  if (n <= size_t(options_.max_waiting)) return;
  // It could never fit the queue: retrying would not help.
  throw Error(ErrorCode::kInvalidArgument, "the request asks for " + std::to_string(n) +
                                               " sequences (prompts times n); the server queues at most " +
                                               std::to_string(options_.max_waiting));
}

void Scheduler::cancel(uint64_t id) {
  {
    std::lock_guard lock(mutex_);
    cancels_.insert(id);
  }
  wake_.notify_all();
}

void Scheduler::drain() { draining_ = true; }

bool Scheduler::wait_idle(Clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return idle_.wait_until(lock, deadline, [&] { return running_count_ == 0 && waiting_count_ == 0; });
}

void Scheduler::stop(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      stop_reason_ = reason;
    }
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::finish(Sequence& seq, const std::string& reason, const std::string& error, bool unavailable,
                       bool invalid_request) {
  if (seq.done) return;
  seq.done = true;
  outstanding_tokens_ -= int64_t(seq.request.prompt.size()) + seq.request.max_new_tokens;
  SequenceEvent event;
  event.kind = SequenceEvent::Kind::kFinish;
  event.sequence = seq.id;
  if (reason == "stop" || reason == "length") {
    if (!seq.stop.stopped()) {
      event.text = seq.stop.push(seq.decoder.flush());  // in this order: push may hold text back for flush
      event.text += seq.stop.flush();
    }
  }
  event.finish_reason = reason;
  event.error = error;
  event.unavailable = unavailable;
  event.invalid_request = invalid_request;
  event.prompt_tokens = int64_t(seq.request.prompt.size());
  event.completion_tokens = int64_t(seq.generated.size());
  // Counted before the event is pushed: the client that reads the error
  // must find it in the metrics already.
  if (reason == "error") {
    metrics_.counter(metrics::kErrors, {unavailable ? "unavailable" : invalid_request ? "policy_refused" : "worker"}).inc();
  }
  seq.stream->push(std::move(event));
  if (seq.started) pending_release_.push_back(SeqId(seq.id));
  seq.started = false;
}

void Scheduler::take_inbox() {
  std::unordered_set<uint64_t> cancels;
  {
    std::lock_guard lock(mutex_);
    for (auto& seq : inbox_) waiting_.push_back(std::move(seq));
    inbox_.clear();
    cancels.swap(cancels_);
  }
  if (cancels.empty()) return;
  for (auto* list : {&running_}) {
    for (auto& seq : *list) {
      if (cancels.count(seq->id)) finish(*seq, "cancelled");
    }
  }
  for (auto& seq : waiting_) {
    if (cancels.count(seq->id)) finish(*seq, "cancelled");
  }
}

void Scheduler::admit(StepPlan& plan) {
  int32_t pending_prefill = 0;  // prompt tokens not yet cached
  size_t bytes = kv_bytes_;
  for (const auto& seq : running_) {
    if (seq->prefilled) continue;
    pending_prefill += seq->feed_size() - seq->prompt_fed;
    // The KV its prompt has still to take: kv_bytes_ holds only the chunks fed so far.
    bytes += kv_bytes_for(info_, seq->request.policy, size_t(seq->feed_size()) + 1) -
             kv_bytes_for(info_, seq->request.policy, size_t(seq->prompt_fed));
  }
  while (!waiting_.empty() && int(running_.size()) < options_.max_batch) {
    Sequence& next = *waiting_.front();
    const std::vector<int32_t> feed = next.feed();
    const size_t need = kv_bytes_for(info_, next.request.policy, feed.size() + 1);
    const bool alone = running_.empty();
    // Memory and prefill limits, except that one sequence always runs.
    if (!alone && info_.kv_capacity_bytes > 0 && bytes + need > info_.kv_capacity_bytes) break;
    if (!alone && pending_prefill >= options_.max_prefill_tokens) break;
    bytes += need;
    pending_prefill += int32_t(feed.size());
    SequenceStart start;
    start.seq = SeqId(next.id);
    start.prompt = feed;
    start.generated = int32_t(next.generated.size());
    start.policy = next.request.policy;
    start.sampling = next.request.sampling;
    if (start.sampling.min_tokens > 0) start.sampling.end_tokens = tokenizer_.spec().eog_ids;
    start.top_logprobs = next.request.top_logprobs;
    start.chunks_carry_mask = info_.prefix_cache;
    plan.start.push_back(std::move(start));
    next.started = true;
    next.prefilled = false;
    next.prompt_fed = 0;
    if (!next.counted) {
      metrics_.counter(metrics::kPromptTokens).inc(double(next.request.prompt.size()));
      next.counted = true;
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::on_token(Sequence& seq, const SampledToken& sampled) {
  const auto now = Clock::now();
  if (seq.generated.empty()) {
    metrics_.histogram(metrics::kTimeToFirstToken)
        .observe(std::chrono::duration<double>(now - seq.request.arrival).count());
  } else {
    metrics_.histogram(metrics::kInterTokenLatency).observe(std::chrono::duration<double>(now - seq.last_token).count());
  }
  seq.last_token = now;
  if (seq.request.constraint && !seq.request.constraint->accept(seq.grammar, sampled.token)) {
    finish(seq, "error", "the worker sampled token " + std::to_string(sampled.token) +
                             ", which the response format does not allow");
    return;
  }
  seq.generated.push_back(sampled.token);
  metrics_.counter(metrics::kGenerationTokens).inc();
  // The end-of-generation token adds no text, but it is a token of the
  // completion: counted in usage, so it has its event (and log-probability).
  const bool ends = !seq.request.ignore_eos && tokenizer_.is_end_of_generation(sampled.token);
  SequenceEvent event;
  event.kind = SequenceEvent::Kind::kToken;
  event.sequence = seq.id;
  // As vLLM, stop strings count only from min_tokens on (one that begins
  // before and ends after still counts).
  const bool may_stop = int64_t(seq.generated.size()) >= seq.request.sampling.min_tokens;
  if (!ends) {
    std::string text = seq.decoder.push(sampled.token);
    if (may_stop) {
      text = seq.stop.push(text);
    } else {
      seq.stop.pass(text);
    }
    event.text = std::move(text);
  }
  event.token.id = sampled.token;
  event.token.bytes = tokenizer_.token_bytes(sampled.token);
  event.token.logprob = sampled.logprob;
  event.token.evicted_slots = sampled.evicted_slots;
  for (const auto& [id, lp] : sampled.top) event.token.top.emplace_back(tokenizer_.token_bytes(id), lp);
  seq.stream->push(std::move(event));
  if (ends || seq.stop.stopped()) {
    finish(seq, "stop");
  } else if (int32_t(seq.generated.size()) >= seq.request.max_new_tokens ||
             int64_t(seq.request.prompt.size() + seq.generated.size()) >= info_.n_ctx) {
    finish(seq, "length");
  }
}

bool Scheduler::step_once() {
  take_inbox();
  // Sequences that ended (cancelled) while waiting leave the queue.
  std::erase_if(waiting_, [](const auto& s) { return s->done; });
  std::erase_if(running_, [](const auto& s) { return s->done; });

  StepPlan plan;
  admit(plan);
  plan.release.swap(pending_release_);
  // Decode every prefilled sequence; prefill prompts within the step's budget
  // of prompt tokens, in admission order, so a long prompt does not stall
  // everyone's next token (chunked prefill).
  std::unordered_map<SeqId, int32_t> chunks;
  const int32_t step_budget = prefill_budget(int(std::count_if(
      running_.begin(), running_.end(), [](const auto& s) { return s->prefilled; })));
  int32_t budget = step_budget;
  bool whole_prompt = false;  // an unchunkable prompt runs: its step costs more than a chunk of its size
  for (const auto& seq : running_) {
    if (seq->prefilled) {
      plan.items.push_back({SeqId(seq->id), 0, allowed_tokens(*seq)});
      continue;
    }
    const int32_t remaining = seq->feed_size() - seq->prompt_fed;
    int32_t n = remaining;
    if (remaining > budget) {
      if (seq->chunkable()) {
        n = std::max(budget, 0);
      } else if (budget < step_budget) {
        n = 0;  // a whole prompt waits for a step whose prompt tokens are all its own
      }
    }
    if (n <= 0) continue;
    // With a prefix cache the mask goes with every chunk: one may finish the
    // prompt early when the worker took the prompt's start from the cache.
    const bool masked = n == remaining || info_.prefix_cache;
    plan.items.push_back({SeqId(seq->id), n, masked ? allowed_tokens(*seq) : std::vector<uint32_t>{}});
    chunks[SeqId(seq->id)] = n;
    budget -= n;
    whole_prompt = whole_prompt || !seq->chunkable();
  }
  update_gauges();
  if (plan.items.empty() && plan.release.empty()) return false;

  StepResult result;
  try {
    result = worker_.step(plan);
  } catch (const std::exception& e) {
    // The worker is broken: every sequence that ran on it ends with a clear
    // error. Those this plan would have started never ran: they go back to
    // the head of the queue, in order, for the next step (which may succeed),
    // unless the worker is declared dead or they were put back too often.
    // The releases are sent again with the next plan, so a worker that
    // recovers frees that KV.
    std::unordered_set<SeqId> starting;
    for (const SequenceStart& s : plan.start) starting.insert(s.seq);
    const bool retry = worker_.alive();
    const auto now = Clock::now();
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      Sequence& seq = **it;
      if (starting.count(SeqId(seq.id)) > 0 && seq.first_failed_start == Clock::time_point{}) {
        seq.first_failed_start = now;
      }
      if (retry && starting.count(SeqId(seq.id)) > 0 && now - seq.first_failed_start < options_.start_retry_window) {
        seq.started = false;
        seq.prefilled = false;
        seq.prompt_fed = 0;
        waiting_.push_front(std::move(*it));
      } else if (retry || !hand_over(seq)) {
        finish(seq, "error", std::string("the worker failed: ") + e.what(), true);
      }
    }
    running_.clear();
    // A dead worker's queue goes to the other groups now, not a step at a time.
    if (!retry && options_.hand_over) std::erase_if(waiting_, [this](const auto& s) { return hand_over(*s); });
    pending_release_.insert(pending_release_.end(), plan.release.begin(), plan.release.end());
    for (const SequenceStart& s : plan.start) pending_release_.push_back(s.seq);
    update_gauges();
    // Retry the releases a little later, not in a busy loop against a dead worker.
    std::unique_lock lock(mutex_);
    wake_.wait_for(lock, kWorkerRetryDelay, [&] { return stopping_; });
    return true;
  }
  if (!result.out_of_memory && !whole_prompt) {
    // What ran: the items the worker did not drop.
    std::unordered_set<SeqId> failed;
    for (const auto& f : result.failed) failed.insert(f.first);
    int32_t decoding = 0, prompt_tokens = 0;
    for (const StepItem& item : plan.items) {
      if (failed.count(item.seq) > 0) continue;
      decoding += item.prefill_tokens == 0 ? 1 : 0;
      prompt_tokens += item.prefill_tokens;
    }
    // A chunk after a prefix-cache hit ran only the prompt the cache lacked.
    for (const SampledToken& sampled : result.tokens) {
      if (sampled.cached_tokens <= 0 || chunks.count(sampled.seq) == 0) continue;
      const auto it = std::find_if(running_.begin(), running_.end(),
                                   [&](const auto& s) { return SeqId(s->id) == sampled.seq; });
      if (it == running_.end()) continue;
      const int32_t left = (*it)->feed_size() - (*it)->prompt_fed - sampled.cached_tokens;
      prompt_tokens -= chunks[sampled.seq] - std::clamp(left, 0, chunks[sampled.seq]);
    }
    cost_.observe(decoding, prompt_tokens, result.seconds);
  }
  metrics_.histogram(metrics::kStepDuration, {options_.worker_label}).observe(result.seconds);
  metrics_.histogram(metrics::kStepBatchSize, {options_.worker_label}).observe(double(plan.items.size()));
  metrics_.histogram(metrics::kStepTokens, {options_.worker_label}).observe(double(result.batch_tokens));
  kv_bytes_ = result.kv_bytes;
  for (const auto& [id, why] : result.failed) {
    const bool invalid = std::find(result.invalid.begin(), result.invalid.end(), id) != result.invalid.end();
    for (auto& seq : running_) {
      if (SeqId(seq->id) == id) {
        seq->started = false;  // the worker dropped it
        finish(*seq, "error", why, false, invalid);
      }
    }
  }
  if (result.out_of_memory) {
    // Preempt the newest sequence (recompute later), or fail the last one.
    if (running_.size() == 1) {
      // Alone and out of memory: what it generated is kept and it ends as if
      // it had reached its length; with nothing generated it is an error.
      Sequence& seq = *running_.front();
      if (!seq.generated.empty()) {
        finish(seq, "length");
      } else {
        finish(seq, "error",
               "the sequence needs more KV memory than the cache holds (" + std::to_string(info_.kv_capacity_bytes) +
                   " bytes)");
      }
    } else if (!running_.empty()) {
      std::unique_ptr<Sequence> victim = std::move(running_.back());
      running_.pop_back();
      if (victim->started) pending_release_.push_back(SeqId(victim->id));
      victim->started = false;
      victim->prefilled = false;
      victim->prompt_fed = 0;
      waiting_.push_front(std::move(victim));
      metrics_.counter(metrics::kPreemptions).inc();
    }
    return true;
  }
  metrics_.counter(metrics::kEvictions).inc(double(result.evicted_slots));
  metrics_.counter(metrics::kDemotions).inc(double(result.demoted_slots));
  metrics_.counter(metrics::kPromotions).inc(double(result.promoted_slots));
  metrics_.counter(metrics::kPromotionHits).inc(double(result.promotion_hits));
  kv_slots_gauge_.set(double(result.kv_slots));
  kv_bytes_gauge_.set(double(result.kv_bytes));
  kv_pool_gauge_.set(double(result.kv_pool_bytes));
  prefix_cache_gauge_.set(double(result.prefix_cache_bytes));
  metrics_.counter(metrics::kPrefixCacheFetchedBytes).inc(double(result.prefix_fetched_bytes));
  metrics_.counter(metrics::kPrefixCacheFetchSeconds).inc(result.prefix_fetch_seconds);
  for (const SampledToken& sampled : result.tokens) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return SeqId(s->id) == sampled.seq; });
    if (it == running_.end() || (*it)->done) continue;
    Sequence& seq = **it;
    if (sampled.cached_tokens > 0) count_prefix_hit(seq, sampled.cached_tokens);
    if (sampled.token < 0) {  // a prefill chunk that did not finish the prompt
      seq.prompt_fed += chunks[sampled.seq];
      continue;
    }
    seq.prefilled = true;
    seq.prompt_fed = seq.feed_size();
    on_token(seq, sampled);
  }
  return true;
}

bool Scheduler::hand_over(Sequence& seq) {
  // One that sent an event (a token before a preemption) cannot start over elsewhere.
  if (!options_.hand_over || seq.done || !seq.generated.empty()) return false;
  const int64_t tokens = int64_t(seq.request.prompt.size()) + seq.request.max_new_tokens;
  UnstartedSequence moved{seq.id, std::move(seq.request), seq.stream, seq.counted};
  if (!options_.hand_over(moved)) {
    seq.request = std::move(moved.request);  // untouched by a refusal; finish() reports it here
    return false;
  }
  seq.done = true;  // it lives on in the other scheduler
  // A worker declared dead may only have been cut off: if it answers again,
  // it frees what this one held there (releases of unknown ids are no-ops).
  if (seq.started) pending_release_.push_back(SeqId(seq.id));
  seq.started = false;
  outstanding_tokens_ -= tokens;
  metrics_.counter(metrics::kSequencesMoved).inc();
  return true;
}

void Scheduler::count_prefix_hit(Sequence& seq, int32_t cached_tokens) {
  seq.prompt_fed += cached_tokens;  // the worker's prefill items go on from there
  metrics_.counter(metrics::kPrefixCacheHitTokens).inc(double(cached_tokens));
  metrics_.counter(metrics::kPrefixCacheHitBytes).inc(double(cached_tokens) * double(info_.kv_bytes_per_token));
  if (const auto cost = cost_.prefill_cost()) {
    metrics_.counter(metrics::kPrefixCacheSavedSeconds).inc(double(cached_tokens) * cost->slope);
  }
}

std::vector<uint32_t> Scheduler::allowed_tokens(const Sequence& seq) const {
  if (!seq.request.constraint) return {};
  const grammar::TokenMask& mask = *seq.request.constraint->allowed(seq.grammar);
  // In the worker's vocabulary, which may be shorter than the tokenizer's.
  const size_t n_vocab = size_t(info_.n_vocab);
  std::vector<uint32_t> out((n_vocab + 31) / 32, 0);
  std::copy_n(mask.begin(), std::min(mask.size(), out.size()), out.begin());
  if (n_vocab % 32 != 0 && !out.empty()) out.back() &= (uint32_t(1) << (n_vocab % 32)) - 1;
  return out;
}

int32_t Scheduler::prefill_budget(int decoding) const {
  const int32_t most = options_.max_prefill_tokens;
  if (decoding == 0 || options_.max_decode_stall.count() <= 0) return most;
  const int32_t least = std::min(most, kMinPrefillChunk);
  const int64_t chunk = cost_.prefill_chunk(std::chrono::duration<double>(options_.max_decode_stall).count());
  // Cost not learned yet (no step with prompt tokens has run): the smallest chunk.
  if (chunk < 0) return least;
  return int32_t(std::clamp<int64_t>(chunk, least, most));
}

void Scheduler::update_gauges() {
  size_t waiting = 0;
  {
    std::lock_guard lock(mutex_);
    waiting = waiting_.size() + inbox_.size();
    waiting_count_ = waiting;
    running_count_ = running_.size();
    publish_waiting_locked();
  }
  running_gauge_.set(double(running_.size()));
  if (running_.empty() && waiting == 0) idle_.notify_all();
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || !running_.empty() || !waiting_.empty() ||
               !pending_release_.empty();
      });
      if (stopping_) break;
    }
    step_once();
  }
  // Stopping: every sequence still here ends with an error; the worker drops them all.
  take_inbox();
  std::string reason;
  {
    std::lock_guard lock(mutex_);
    reason = stop_reason_;
  }
  for (auto& seq : running_) finish(*seq, "error", reason, true);
  for (auto& seq : waiting_) finish(*seq, "error", reason, true);
  running_.clear();
  waiting_.clear();
  if (!pending_release_.empty()) {
    StepPlan plan;
    plan.release.swap(pending_release_);
    try {
      worker_.step(plan);
    } catch (const std::exception&) {
      // The worker is gone anyway.
    }
  }
  update_gauges();
}

}  // namespace lazykv
