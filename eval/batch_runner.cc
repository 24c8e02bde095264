#include "eval/batch_runner.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "common/error.h"
#include "worker/draft.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/policy/policy.h"
#include "worker/sampler.h"

namespace lazykv::eval {
namespace {

// Whether the newest `window` tokens repeat one block of at most window / 4
// tokens: per period p, the run of tokens equal to the one p before; the
// last window tokens have period p when that run reaches window - p.
class LoopDetector {
 public:
  explicit LoopDetector(int32_t window) : window_(window), runs_(size_t(std::max(window / 4, 0) + 1), 0) {}

  // After tokens.back() was appended.
  bool looping(const std::vector<int32_t>& tokens) {
    const size_t n = tokens.size();
    bool loop = false;
    for (size_t p = 1; p < runs_.size(); ++p) {
      runs_[p] = n > p && tokens[n - 1] == tokens[n - 1 - p] ? runs_[p] + 1 : 0;
      loop = loop || runs_[p] >= window_ - int32_t(p);
    }
    return loop;
  }

 private:
  int32_t window_;
  std::vector<int32_t> runs_;  // [period]
};

// One running job.
struct Active {
  size_t job = 0;
  std::unique_ptr<EvictionPolicy> policy;
  int32_t steps = 0;     // tokens this job produces in all
  int32_t pos = 0;       // position of the next token fed
  int32_t fed = 0;       // tokens the current pass feeds
  int32_t next = 0;      // the next decode token
  bool prefill = true;   // the prompt is not cached yet (fed in blocks when the policy asks)
  bool done = false;
  LoopDetector loop{0};
};

// Why a job cannot run, or empty.
std::string check_job(const Job& job, int32_t steps, int32_t n_ctx, int32_t n_vocab) {
  if (job.prompt.empty()) return "the prompt is empty";
  if (steps < 0) return "max_new_tokens must be >= 0";
  const int64_t total = int64_t(job.prompt.size()) + steps;
  if (total > n_ctx) {
    return "prompt of " + std::to_string(job.prompt.size()) + " tokens plus " + std::to_string(steps) +
           " new tokens exceeds the context of " + std::to_string(n_ctx) + " tokens";
  }
  for (const std::vector<int32_t>* ids : {&job.prompt, &job.forced}) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= n_vocab) return "token id " + std::to_string(id) + " is outside the vocabulary";
    }
  }
  return "";
}

}  // namespace

nlohmann::json tier_counters_json(const TierCounters& t, double tokens) {
  return {{"available", t.tiers_available},
          {"demoted_slots", t.demoted_slots},
          {"promoted_slots", t.promoted_slots},
          {"promotion_hits", t.promotion_hits},
          {"promotion_hit_rate", t.promoted_slots ? double(t.promotion_hits) / double(t.promoted_slots) : 0.0},
          {"bytes_demoted", t.demoted_bytes},
          {"bytes_promoted", t.promoted_bytes},
          {"fetched_blocks", t.fetched_blocks},
          {"bytes_fetched", t.fetched_bytes},
          {"fetch_waits", t.fetch_waits},
          {"bytes_moved_per_token", double(t.demoted_bytes + t.fetched_bytes) / std::max(tokens, 1.0)}};
}

BatchRunner::BatchRunner(const Model& model, const Tokenizer& tokenizer, const BatchRunnerOptions& options)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      batch_(options.batch),
      n_ctx_(options.n_ctx > 0 ? options.n_ctx : model.config().n_ctx_train),
      pool_(options.threads) {
  set_batch(options.batch);
}

void BatchRunner::set_batch(int batch) {
  if (batch < 1) throw Error(ErrorCode::kInvalidArgument, "--batch must be >= 1, got " + std::to_string(batch));
  batch_ = batch;
}

namespace {

// One call of BatchRunner::run: the jobs, their results and the running ones.
class JobsRun {
 public:
  JobsRun(const Model& model, const Tokenizer& tokenizer, ThreadPool& pool, cpu::ActivationPrecision precision,
          int32_t n_ctx, const std::vector<Job>& jobs, const LogitsCallback& on_logits,
          const ProgressCallback& on_done)
      : tokenizer_(tokenizer),
        jobs_(jobs),
        on_logits_(on_logits),
        on_done_(on_done),
        model_(model),
        n_ctx_(n_ctx),
        model_vocab_(size_t(model.config().n_vocab)),
        // Embedding rows past the tokenizer's vocabulary (padding) are never sampled or compared.
        vocab_(std::min(size_t(tokenizer.n_vocab()), model_vocab_)),
        cache_({model.config().n_layer, model.config().n_head_kv, model.config().head_dim, 64, 0}),
        forward_(model, cache_, pool, precision),
        results_(jobs.size()) {}

  bool busy() const { return next_job_ < jobs_.size() || !active_.empty(); }

  // Starts new jobs up to `batch` running; a job that cannot run fails here
  // ("error"), as does one of no steps ("length").
  void admit(int batch) {
    while (int(active_.size()) < batch && next_job_ < jobs_.size()) {
      if (jobs_[next_job_].wait_for_idle && !active_.empty()) break;
      const size_t j = next_job_++;
      const Job& job = jobs_[j];
      const int32_t steps = job.forced.empty() ? job.max_new_tokens : int32_t(job.forced.size());
      std::unique_ptr<EvictionPolicy> policy = make_job_policy(j, steps);
      if (policy == nullptr) continue;
      cache_.add_sequence(SeqId(j), policy->heads_per_layer());
      Active a;
      a.job = j;
      a.policy = std::move(policy);
      a.steps = steps;
      a.loop = LoopDetector(job.forced.empty() ? job.loop_window : 0);
      active_.push_back(std::move(a));
    }
  }

  // One forward pass over every running job: its next prompt block or its
  // decode token; then each job that finished its prompt samples.
  void step() {
    if (active_.empty()) return;  // every job admitted failed
    items_.clear();
    for (Active& a : active_) {
      const Job& job = jobs_[a.job];
      if (a.prefill) {
        a.fed = a.policy->prompt_chunk(a.pos, int32_t(job.prompt.size()));
        const std::span<const int32_t> tokens = std::span(job.prompt).subspan(size_t(a.pos), size_t(a.fed));
        items_.push_back(BatchItem{SeqId(a.job), tokens, a.pos, false, a.policy.get()});
      } else {
        items_.push_back(BatchItem{SeqId(a.job), {&a.next, 1}, a.pos, false, a.policy.get()});
      }
    }
    const auto t0 = Clock::now();
    const std::span<const float> logits = forward_.run(items_);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t i = 0; i < active_.size(); ++i) {
      Active& a = active_[i];
      if (a.prefill && a.pos + a.fed < int32_t(jobs_[a.job].prompt.size())) {  // a block: nothing sampled yet
        results_[a.job].prefill_seconds += seconds;
        a.pos += a.fed;
        continue;
      }
      sample(a, logits.subspan(i * model_vocab_, vocab_), seconds);
    }
  }

  // The drafts the policies ask for after the pass (they reuse its logits
  // buffer), all together; each drafting job is charged their time, as a
  // pass's. A job between prompt blocks has sampled nothing: its draft is
  // the policy's own. Then the finished jobs leave.
  void run_asked_drafts() {
    std::vector<DraftRequest> drafts;
    for (const Active& a : active_) {
      if (!a.done && a.policy->draft_wanted() > 0) {
        drafts.push_back({SeqId(a.job), a.policy.get(), a.prefill ? -1 : a.next, a.pos});
      }
    }
    if (!drafts.empty()) {
      const auto t0 = Clock::now();
      const std::vector<DraftRun> runs = run_drafts(forward_, cache_, solo_, drafts, vocab_, model_vocab_);
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      for (size_t k = 0; k < drafts.size(); ++k) {
        JobResult& result = results_[size_t(drafts[k].seq)];
        result.failed_drafts += runs[k].out_of_memory;
        (result.decode_steps == 0 ? result.prefill_seconds : result.decode_seconds) += seconds;
      }
    }
    std::erase_if(active_, [](const Active& a) { return a.done; });
  }

  std::vector<JobResult> take_results() { return std::move(results_); }

 private:
  using Clock = std::chrono::steady_clock;

  // The job's policy, or null with the job finished ("error", or "length"
  // for a job of no steps).
  std::unique_ptr<EvictionPolicy> make_job_policy(size_t j, int32_t steps) {
    const Job& job = jobs_[j];
    JobResult& result = results_[j];
    result.error = check_job(job, steps, n_ctx_, int32_t(model_vocab_));
    std::unique_ptr<EvictionPolicy> policy;
    if (result.ok()) {
      try {
        PolicyShape shape = policy_shape(model_, int32_t(job.prompt.size()), int32_t(job.prompt.size()) + steps);
        shape.episode = job.episode;
        policy = make_policy(job.policy, shape);
      } catch (const Error& e) {
        result.error = e.what();
      }
    }
    if (result.ok() && steps > 0) return policy;
    result.finish = result.ok() ? "length" : "error";
    finish_job(j);
    return nullptr;
  }

  // The job's next token from its logits row (or the forced one), and the
  // end of the job when it stops, loops or reaches its length.
  void sample(Active& a, std::span<const float> row, double seconds) {
    const Job& job = jobs_[a.job];
    JobResult& result = results_[a.job];
    const int32_t index = int32_t(result.tokens.size());
    if (on_logits_) on_logits_(a.job, index, row);
    int32_t token = job.forced.empty() ? argmax(row) : job.forced[size_t(index)];
    if (job.forced.empty() && job.ban_eos && tokenizer_.is_end_of_generation(token)) {
      token = -1;  // the best token that does not end the text
      for (size_t v = 0; v < row.size(); ++v) {
        if (!tokenizer_.is_end_of_generation(int32_t(v)) && (token < 0 || row[v] > row[size_t(token)])) {
          token = int32_t(v);
        }
      }
    }
    result.tokens.push_back(token);
    if (a.prefill) {
      result.prefill_seconds += seconds;
      a.pos = int32_t(job.prompt.size());
      a.prefill = false;
    } else {
      result.decode_seconds += seconds;
      ++result.decode_steps;
      ++a.pos;
    }
    const bool stop = job.forced.empty() && !job.ban_eos && tokenizer_.is_end_of_generation(token);
    const bool loop = !stop && a.loop.looping(result.tokens);
    if (stop || loop || int32_t(result.tokens.size()) == a.steps) {
      result.finish = stop ? "stop" : loop ? "loop" : "length";
      end_job(a);
    } else {
      a.next = token;
    }
  }

  // A finished job's memory and policy figures; its sequence leaves the cache.
  void end_job(Active& a) {
    JobResult& result = results_[a.job];
    const EvictionPolicy& policy = *a.policy;
    result.peak_slots = policy.peak_slots();
    result.peak_kv_bytes = policy.peak_slots() * int64_t(cache_.slot_bytes());
    result.mean_slots = policy.mean_slots();
    result.mean_kv_bytes = policy.mean_slots() * double(cache_.slot_bytes());
    result.cache_heads = int64_t(model_.config().n_layer) * policy.heads_per_layer();
    result.evicted_slots = policy.evicted_slots();
    result.policy_seconds = policy.policy_seconds();
    result.tiers = policy.tier_counters();
    cache_.remove_sequence(SeqId(a.job));
    a.done = true;
    finish_job(a.job);
  }

  void finish_job(size_t j) {
    ++done_;
    if (on_done_) on_done_(j, results_[j], done_, jobs_.size());
  }

  const Tokenizer& tokenizer_;
  const std::vector<Job>& jobs_;
  const LogitsCallback& on_logits_;
  const ProgressCallback& on_done_;
  const Model& model_;
  const int32_t n_ctx_;
  const size_t model_vocab_, vocab_;
  KvCache cache_;
  ForwardPass forward_;
  SoloGroup solo_;  // the drafts' group
  std::vector<JobResult> results_;
  std::vector<Active> active_;
  std::vector<BatchItem> items_;
  size_t next_job_ = 0, done_ = 0;
};

}  // namespace

std::vector<JobResult> BatchRunner::run(const std::vector<Job>& jobs, const LogitsCallback& on_logits,
                                        const ProgressCallback& on_done) {
  JobsRun run(model_, tokenizer_, pool_, options_.precision, n_ctx_, jobs, on_logits, on_done);
  while (run.busy()) {
    run.admit(batch_);
    run.step();
    run.run_asked_drafts();
  }
  return run.take_results();
}

}  // namespace lazykv::eval
