// The continuous-batching scheduler over a real in-process worker on a tiny
// random model: batching, preemption by recompute, cancellation, limits,
// draining, a failing worker, and prefill chunks sized by time.
#include "coordinator/scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <optional>
#include <set>
#include <thread>

#include "common/error.h"
#include "coordinator/groups/group_dispatcher.h"
#include "tests/unit/step_plans.h"
#include "tests/unit/tiny_model_fixture.h"
#include "worker/local_worker.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<std::string> token_texts;  // each token's event text
  std::string text;
  std::string finish;
  std::string error;
  bool unavailable = false;
};

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TinyModelSpec spec;
    spec.n_ctx = 256;
    TinyModel tiny = load_tiny_model("scheduler_test", spec);
    model_ = tiny.model.release();
    tokenizer_ = tiny.tokenizer.release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
  }

  static LocalWorkerOptions worker_options(size_t capacity = 0) {
    LocalWorkerOptions o;
    o.threads = 2;
    o.n_vocab = tokenizer_->n_vocab();
    o.kv_capacity_bytes = capacity;
    return o;
  }

  static SequenceRequest request(int i, int32_t max_new, PolicyConfig policy = make_policy_config("full")) {
    SequenceRequest r;
    r.prompt = {1};
    for (int k = 0; k < 6 + 3 * i; ++k) r.prompt.push_back(3 + (17 * i + 5 * k) % 250);
    r.max_new_tokens = max_new;
    r.policy = std::move(policy);
    return r;
  }

  // Runs every event of the handles' stream to the end (with a deadline so a bug cannot hang the test).
  static std::vector<Outcome> collect(const std::vector<SequenceHandle>& handles) {
    std::vector<Outcome> out(handles.size());
    std::map<uint64_t, size_t> index;
    for (size_t i = 0; i < handles.size(); ++i) index[handles[i].id] = i;
    size_t done = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (done < handles.size() && Clock::now() < deadline) {
      for (SequenceEvent& e : handles.front().stream->wait(std::chrono::milliseconds(50))) {
        Outcome& o = out[index.at(e.sequence)];
        o.text += e.text;
        if (e.kind == SequenceEvent::Kind::kToken) {
          o.tokens.push_back(e.token.id);
          o.token_texts.push_back(e.text);
        } else {
          o.finish = e.finish_reason;
          o.error = e.error;
          o.unavailable = e.unavailable;
          ++done;
        }
      }
    }
    EXPECT_EQ(done, handles.size()) << "sequences did not finish before the deadline";
    return out;
  }

  // Each request alone on its own worker and scheduler.
  static std::vector<Outcome> alone(const std::vector<SequenceRequest>& requests) {
    std::vector<Outcome> out;
    for (const SequenceRequest& r : requests) {
      LocalWorker worker(*model_, worker_options());
      metrics::Registry registry;
      Scheduler scheduler(worker, *tokenizer_, registry, SchedulerOptions{});
      out.push_back(collect(scheduler.submit({r})).front());
    }
    return out;
  }

  static Model* model_;
  static Tokenizer* tokenizer_;
};

Model* SchedulerTest::model_ = nullptr;
Tokenizer* SchedulerTest::tokenizer_ = nullptr;

TEST_F(SchedulerTest, BatchedSequencesEqualEachAloneAndFreeTheirKv) {
  std::vector<SequenceRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(request(i, 20 + 3 * i));
  const std::vector<Outcome> reference = alone(requests);

  LocalWorker worker(*model_, worker_options());
  metrics::Registry registry;
  SchedulerOptions options;
  options.max_batch = 4;  // six sequences through four slots: admissions mid-run
  Scheduler scheduler(worker, *tokenizer_, registry, options);
  const std::vector<Outcome> batched = collect(scheduler.submit(requests));
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(batched[i].tokens, reference[i].tokens) << "sequence " << i;
    EXPECT_EQ(batched[i].text, reference[i].text) << "sequence " << i;
    EXPECT_EQ(batched[i].finish, reference[i].finish) << "sequence " << i;
    EXPECT_TRUE(batched[i].finish == "stop" || batched[i].finish == "length");
    if (batched[i].finish == "length") {
      EXPECT_EQ(int32_t(batched[i].tokens.size()), requests[i].max_new_tokens);
    }
  }
  EXPECT_TRUE(scheduler.wait_idle(Clock::now() + std::chrono::seconds(10)));
  scheduler.stop("test over");
  EXPECT_EQ(worker.n_sequences(), 0u);
  const std::string text = registry.render();
  EXPECT_NE(text.find("lazykv_generation_tokens_total"), std::string::npos);
  EXPECT_GT(registry.counter(metrics::kGenerationTokens).value(), 0);
}

// A start whose count of generated tokens does not fit its prompt (it comes
// over the wire) fails that sequence with a clear reason.
TEST_F(SchedulerTest, AStartWithMoreGeneratedTokensThanItsPromptFails) {
  LocalWorker worker(*model_, worker_options());
  for (int32_t generated : {-1, 3, 4}) {
    StepPlan plan = plan_starting(1, {5, 6, 7});
    plan.start[0].generated = generated;
    const StepResult result = worker.step(plan);
    ASSERT_EQ(result.failed.size(), 1u) << generated;
    EXPECT_NE(result.failed[0].second.find("must be below the prompt's 3 tokens"), std::string::npos)
        << result.failed[0].second;
  }
  StepPlan fine = plan_starting(1, {5, 6, 7});
  fine.start[0].generated = 2;
  EXPECT_TRUE(worker.step(fine).failed.empty());
}

TEST_F(SchedulerTest, ChunkedPrefillGivesTheSameTokensAndBoundsEveryStep) {
  std::vector<SequenceRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(request(i, 12 + i));
  // An evicting policy's prompt runs whole even when it exceeds the budget.
  requests.push_back(request(5, 30, make_policy_config("lazy", {{"budget", "64"}, {"window", "8"}})));
  const std::vector<Outcome> reference = alone(requests);

  LocalWorker worker(*model_, worker_options());
  metrics::Registry registry;
  SchedulerOptions options;
  options.max_prefill_tokens = 7;  // every prompt (7..22 tokens) spans several steps
  Scheduler scheduler(worker, *tokenizer_, registry, options);
  const std::vector<Outcome> got = collect(scheduler.submit(requests));
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].tokens, reference[i].tokens) << "sequence " << i;
    EXPECT_EQ(got[i].finish, reference[i].finish) << "sequence " << i;
  }
  // Steps of at most 7 prompt tokens plus one decode token per sequence,
  // except the one that prefilled the lazy prompt (22 tokens) whole.
  const metrics::Histogram::Snapshot tokens = registry.histogram(metrics::kStepTokens, {"0"}).snapshot();
  const std::span<const double> bounds = registry.histogram(metrics::kStepTokens, {"0"}).upper_bounds();
  size_t over_16 = 0;
  for (size_t b = 0; b < bounds.size(); ++b) {
    if (bounds[b] == 16) over_16 = tokens.count - tokens.cumulative[b];
  }
  EXPECT_LE(over_16, 1u) << "only the whole lazy prompt may make a step of more than 16 tokens";
  EXPECT_GT(tokens.count, 10u);
}

// A real worker whose `n`-th sampled token is the end-of-text token.
class EndingWorker final : public StepExecutor {
 public:
  EndingWorker(StepExecutor& inner, int32_t eos, int n) : inner_(inner), eos_(eos), n_(n) {}
  WorkerInfo info() const override { return inner_.info(); }
  StepResult step(const StepPlan& plan) override {
    StepResult result = inner_.step(plan);
    for (SampledToken& t : result.tokens) {
      if (t.token >= 0 && ++sampled_ == n_) {
        t.token = eos_;
        t.logprob = -0.25f;
      }
    }
    return result;
  }

 private:
  StepExecutor& inner_;
  int32_t eos_;
  int n_;
  int sampled_ = 0;
};

TEST_F(SchedulerTest, TheEndOfTextTokenIsAnEventAsItIsCountedInUsage) {
  LocalWorker worker(*model_, worker_options());
  const int32_t eos = tokenizer_->spec().eos_id;
  EndingWorker ending(worker, eos, 5);
  metrics::Registry registry;
  Scheduler scheduler(ending, *tokenizer_, registry, SchedulerOptions{});
  const std::vector<SequenceHandle> handles = scheduler.submit({request(0, 50)});
  std::vector<SequenceEvent> tokens;
  std::optional<SequenceEvent> finish;
  std::string text;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!finish && Clock::now() < deadline) {
    for (SequenceEvent& e : handles.front().stream->wait(std::chrono::milliseconds(50))) {
      text += e.text;
      if (e.kind == SequenceEvent::Kind::kToken) {
        tokens.push_back(e);
      } else {
        finish = e;
      }
    }
  }
  ASSERT_TRUE(finish.has_value());
  EXPECT_EQ(finish->finish_reason, "stop");
  ASSERT_EQ(tokens.size(), 5u);
  EXPECT_EQ(finish->completion_tokens, 5);
  EXPECT_EQ(tokens.back().token.id, eos);
  EXPECT_EQ(tokens.back().text, "");  // no text of its own
  EXPECT_EQ(tokens.back().token.logprob, -0.25f);
  EXPECT_EQ(tokens.back().token.bytes, tokenizer_->token_bytes(eos));
  EXPECT_EQ(text.find(tokenizer_->token_bytes(eos)), std::string::npos);
}

// A real worker whose steps report a cost of 2 ms per decoding sequence, 1 ms
// per prompt token (binary fractions, so the learned costs are exact) and
// `fixed` seconds for a step with any prompt tokens, counting only the items
// that ran; a step that prefills an evicting policy's prompt costs 0.5 s more
// (its prompt-time selection). It records what each step carried;
// `after_step` runs on the scheduler's thread after step k, so a test can
// submit at a known point.
class CostedWorker final : public StepExecutor {
 public:
  static constexpr double kDecodeSeconds = 1.0 / 512;
  static constexpr double kPromptTokenSeconds = 1.0 / 1024;
  struct Step {
    int32_t decoding = 0;
    int32_t prompt_tokens = 0;
  };
  CostedWorker(StepExecutor& inner, double fixed) : inner_(inner), fixed_(fixed) {}
  WorkerInfo info() const override { return inner_.info(); }
  StepResult step(const StepPlan& plan) override {
    StepResult result = inner_.step(plan);
    std::set<SeqId> failed;
    for (const auto& f : result.failed) failed.insert(f.first);
    for (const SequenceStart& start : plan.start) {
      if (start.policy.name != "full") evicting_.insert(start.seq);
    }
    Step s;
    bool selection = false;
    for (const StepItem& item : plan.items) {
      if (failed.count(item.seq) > 0) continue;
      if (item.prefill_tokens == 0) ++s.decoding;
      s.prompt_tokens += item.prefill_tokens;
      selection = selection || (item.prefill_tokens > 0 && evicting_.count(item.seq) > 0);
    }
    result.seconds = kDecodeSeconds * s.decoding + kPromptTokenSeconds * s.prompt_tokens;
    if (s.prompt_tokens > 0) result.seconds += fixed_;
    if (selection) result.seconds += 0.5;
    int k = 0;
    {
      std::lock_guard lock(mutex_);
      if (!plan.items.empty()) steps_.push_back(s);
      k = int(steps_.size());
    }
    if (after_step) after_step(k);
    return result;
  }
  std::vector<Step> steps() const {
    std::lock_guard lock(mutex_);
    return steps_;
  }
  std::function<void(int)> after_step;

 private:
  StepExecutor& inner_;
  double fixed_;
  std::set<SeqId> evicting_;  // sequences started with an evicting policy (scheduler thread only)
  mutable std::mutex mutex_;
  std::vector<Step> steps_;
};

// One sequence decodes for 150 steps; after its third step two prompts of
// 121 and 124 tokens (or `late`) arrive. Checks each late sequence's tokens against a run
// alone and returns what every step carried.
class StallBoundTest : public SchedulerTest {
 protected:
  static std::vector<CostedWorker::Step> run_prompts_beside_a_decoding_sequence(
      const SchedulerOptions& options, double fixed = 0,
      const std::vector<SequenceRequest>& late = {request(38, 8), request(39, 8)}) {
    SequenceRequest early = request(15, 150);  // 52 prompt tokens
    early.ignore_eos = true;
    const std::vector<Outcome> late_alone = alone(late);

    // Declared before the scheduler: its thread calls after_step until it stops.
    std::promise<std::vector<SequenceHandle>> late_handles;
    bool submitted = false;  // only ever touched on the scheduler's thread
    LocalWorker worker(*model_, worker_options());
    CostedWorker costed(worker, fixed);
    metrics::Registry registry;
    Scheduler scheduler(costed, *tokenizer_, registry, options);
    costed.after_step = [&](int k) {
      if (k >= 3 && !submitted) {
        submitted = true;
        late_handles.set_value(scheduler.submit(late));
      }
    };
    const std::vector<SequenceHandle> early_handles = scheduler.submit({early});
    std::future<std::vector<SequenceHandle>> late_future = late_handles.get_future();
    EXPECT_EQ(late_future.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    const std::vector<Outcome> got = collect(late_future.get());
    EXPECT_EQ(collect(early_handles).front().finish, "length");
    for (size_t i = 0; i < late.size(); ++i) {
      EXPECT_EQ(got[i].tokens, late_alone[i].tokens) << "late sequence " << i;
      EXPECT_EQ(got[i].finish, late_alone[i].finish) << "late sequence " << i;
    }
    scheduler.stop("test over");
    return costed.steps();
  }
};

TEST_F(StallBoundTest, PromptTokensBesideDecodingSequencesFitTheStallBound) {
  SchedulerOptions options;
  options.max_prefill_tokens = 512;
  options.max_decode_stall = std::chrono::milliseconds(40);  // 40.96 prompt tokens at 1/1024 s each
  const std::vector<CostedWorker::Step> steps = run_prompts_beside_a_decoding_sequence(options);
  ASSERT_GE(steps.size(), 3u);
  EXPECT_EQ(steps[0].decoding, 0);
  EXPECT_EQ(steps[0].prompt_tokens, 52) << "with nothing decoding, a prompt runs whole";
  int32_t beside_decoding = 0;
  int full_chunks = 0;
  for (const CostedWorker::Step& s : steps) {
    if (s.decoding == 0 || s.prompt_tokens == 0) continue;
    EXPECT_LE(s.prompt_tokens, 40) << "a step beside decoding sequences carries at most 40 prompt tokens";
    beside_decoding += s.prompt_tokens;
    full_chunks += s.prompt_tokens == 40 ? 1 : 0;
  }
  EXPECT_EQ(beside_decoding, 121 + 124) << "both late prompts were prefilled beside the decoding sequence";
  EXPECT_GE(full_chunks, 5) << "the learned budget is reached, not only the minimum chunk";
}

// 100 ms for any step with prompt tokens, more than the 40 ms bound: no
// chunk can meet it, so once the fixed cost is known (two chunk sizes seen)
// chunks are large enough that it is at most half of their time
// (0.1 s · 1024 = 102.4 tokens), not the 16 that would pay it per 16 tokens.
TEST_F(StallBoundTest, WhereAStepsFixedCostBreaksTheBoundChunksStayLarge) {
  SchedulerOptions options;
  options.max_prefill_tokens = 512;
  options.max_decode_stall = std::chrono::milliseconds(40);
  const std::vector<CostedWorker::Step> steps = run_prompts_beside_a_decoding_sequence(options, 0.1);
  std::vector<int32_t> chunks;
  for (const CostedWorker::Step& s : steps) {
    if (s.decoding > 0 && s.prompt_tokens > 0) chunks.push_back(s.prompt_tokens);
  }
  // The first prompt alone (52 tokens, 151 ms) gives a line through zero of
  // 2.9 ms a token: the smallest chunk; then 16 tokens at 116 ms reveal the
  // fixed cost, and the rest of both prompts runs in chunks of 103.
  EXPECT_EQ(chunks, (std::vector<int32_t>{kMinPrefillChunk, 103, 103, 121 + 124 - kMinPrefillChunk - 2 * 103}));
}

// What a step's failed items and an evicting policy's whole prompt cost says
// nothing of a chunk: left out, the chunks stay at 40 tokens. (Counted, the
// failed 40-token chunk would look free and the selection's 0.5 s would make
// the fixed part huge: the chunks would grow past the bound.)
TEST_F(StallBoundTest, FailedItemsAndWholePromptsStayOutOfTheCost) {
  SequenceRequest bad = request(38, 8);  // 121 prompt tokens; the worker refuses to start it
  bad.sampling.top_p = 1.5f;
  const SequenceRequest whole = request(6, 8, make_policy_config("lazy", {{"budget", "64"}, {"window", "8"}}));
  SchedulerOptions options;
  options.max_prefill_tokens = 512;
  options.max_decode_stall = std::chrono::milliseconds(40);
  const std::vector<CostedWorker::Step> steps =
      run_prompts_beside_a_decoding_sequence(options, 0, {bad, whole, request(38, 8), request(39, 8)});
  int32_t beside_decoding = 0;
  int full_chunks = 0;
  for (const CostedWorker::Step& s : steps) {
    if (s.decoding == 0 || s.prompt_tokens == 0) continue;
    EXPECT_LE(s.prompt_tokens, 40);
    beside_decoding += s.prompt_tokens;
    full_chunks += s.prompt_tokens == 40 ? 1 : 0;
  }
  EXPECT_EQ(beside_decoding, 25 + 121 + 124) << "what ran beside the decoding sequence (not the failed prompt)";
  EXPECT_GE(full_chunks, 5);
}

TEST_F(StallBoundTest, WithoutAStallBoundPromptsBesideDecodingSequencesRunWhole) {
  SchedulerOptions options;
  options.max_prefill_tokens = 512;
  options.max_decode_stall = std::chrono::milliseconds(0);
  const std::vector<CostedWorker::Step> steps = run_prompts_beside_a_decoding_sequence(options);
  int32_t largest = 0;
  for (const CostedWorker::Step& s : steps) {
    if (s.decoding > 0) largest = std::max(largest, s.prompt_tokens);
  }
  EXPECT_EQ(largest, 121 + 124) << "both prompts in one step, as max_prefill_tokens allows";
}

TEST_F(SchedulerTest, FullCachePreemptsByRecomputeAndFullKvStaysExact) {
  // Plain greedy, with penalties, then sampled: a restarted sequence must
  // keep the counts of what it generated before and its place in the random
  // stream (the worker is told which of the tokens it prefills were
  // generated), or its output would change.
  for (const char* mode : {"plain", "with penalties", "sampled"}) {
    SCOPED_TRACE(mode);
    std::vector<SequenceRequest> requests;
    for (int i = 0; i < 4; ++i) {
      requests.push_back(request(i, 120));
      requests.back().stop = {};
      if (std::string(mode) == "with penalties") {
        requests.back().sampling.frequency_penalty = 0.4f;
        requests.back().sampling.presence_penalty = 0.3f;
      }
      if (std::string(mode) == "sampled") {
        requests.back().sampling.temperature = 0.8f;
        requests.back().sampling.seed = uint64_t(100 + i);
      }
    }
    const std::vector<Outcome> reference = alone(requests);

    // Room for four sequences' first pages, not for all of them to grow past 64 slots.
    LocalWorker probe(*model_, worker_options());
    const WorkerInfo info = probe.info();
    const size_t per_page_set = info.kv_page_bytes * size_t(info.n_layer * info.n_head_kv);
    LocalWorker worker(*model_, worker_options(6 * per_page_set));
    metrics::Registry registry;
    Scheduler scheduler(worker, *tokenizer_, registry, SchedulerOptions{});
    const std::vector<Outcome> got = collect(scheduler.submit(requests));
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(got[i].tokens, reference[i].tokens) << "sequence " << i;
      EXPECT_EQ(got[i].finish, reference[i].finish) << "sequence " << i;
    }
    const bool long_enough = std::any_of(reference.begin(), reference.end(), [&](const Outcome& o) {
      return o.tokens.size() + requests.front().prompt.size() > size_t(info.page_slots);
    });
    ASSERT_TRUE(long_enough) << "the sequences must outgrow one page for the cache to fill";
    EXPECT_GT(registry.counter(metrics::kPreemptions).value(), 0);
  }
}

// min_tokens holds stop strings back, but one that begins in the text before
// it and ends after (the last character of the first token's text and the
// first of the second's, min_tokens 2) still ends the reply there, as vLLM
// finds it; the text before the boundary was emitted already.
TEST_F(SchedulerTest, AStopStringAcrossTheMinTokensBoundaryEndsTheReply) {
  int tried = 0;
  for (int i = 0; i < 6; ++i) {
    SequenceRequest r = request(i, 8);
    r.stop = {};
    const Outcome plain = alone({r}).front();
    if (plain.tokens.size() < 3) continue;
    const std::string& first = plain.token_texts[0];
    const std::string& second = plain.token_texts[1];
    if (first.empty() || second.empty()) continue;
    ++tried;
    r.stop = {std::string{first.back(), second.front()}};
    r.sampling.min_tokens = 2;
    const Outcome got = alone({r}).front();
    EXPECT_EQ(got.finish, "stop") << "request " << i << ", stop '" << r.stop[0] << "'";
    EXPECT_EQ(got.tokens.size(), 2u) << "request " << i;
    EXPECT_EQ(got.text, first) << "request " << i;
  }
  ASSERT_GT(tried, 0) << "no greedy reply whose first two tokens both have text";
}

// Admission counts the KV a prompt still being prefilled in chunks will take,
// not only the chunks it took so far: the newcomer waits instead of being
// admitted into a cache that cannot hold both, which would cost a preemption.
TEST_F(SchedulerTest, AdmissionReservesTheRestOfAChunkedPrompt) {
  LocalWorker probe(*model_, worker_options());
  const WorkerInfo info = probe.info();
  ASSERT_EQ(info.page_slots, 64);
  // Three pages per (layer, head): 192 slots in all.
  LocalWorker worker(*model_, worker_options(3 * info.kv_page_bytes * size_t(info.n_layer * info.n_head_kv)));
  metrics::Registry registry;
  SchedulerOptions options;
  options.max_prefill_tokens = 64;
  Scheduler scheduler(worker, *tokenizer_, registry, options);
  SequenceRequest big = request(0, 20);  // 150 prompt tokens: 3 chunks, 3 pages with what it generates
  big.prompt.resize(150);
  for (size_t k = 0; k < big.prompt.size(); ++k) big.prompt[k] = int32_t(3 + (7 * k) % 250);
  const SequenceRequest small = request(1, 4);  // one page
  const std::vector<Outcome> got = collect(scheduler.submit({big, small}));
  const std::vector<Outcome> reference = alone({big, small});
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].finish, "length") << got[i].error;
    EXPECT_EQ(got[i].tokens, reference[i].tokens);
  }
  EXPECT_EQ(registry.counter(metrics::kPreemptions).value(), 0);
}

TEST_F(SchedulerTest, CancelEndsARunningSequenceAndFreesItsKv) {
  LocalWorker worker(*model_, worker_options());
  metrics::Registry registry;
  Scheduler scheduler(worker, *tokenizer_, registry, SchedulerOptions{});
  SequenceRequest r = request(1, 200);
  r.sampling.temperature = 1.0f;  // keep generating: no early end-of-generation is likely, but cancel comes first
  std::vector<SequenceHandle> handles = scheduler.submit({r, request(2, 5)});
  // Wait for the first token of the long one, then cancel it.
  bool started = false;
  std::vector<SequenceEvent> seen;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!started && Clock::now() < deadline) {
    for (SequenceEvent& e : handles[0].stream->wait(std::chrono::milliseconds(20))) {
      if (e.sequence == handles[0].id) started = true;
      seen.push_back(std::move(e));
    }
  }
  ASSERT_TRUE(started);
  scheduler.cancel(handles[0].id);
  std::string finish_long, finish_short;
  for (const SequenceEvent& e : seen) {
    if (e.kind == SequenceEvent::Kind::kFinish) (e.sequence == handles[0].id ? finish_long : finish_short) = e.finish_reason;
  }
  while ((finish_long.empty() || finish_short.empty()) && Clock::now() < deadline) {
    for (SequenceEvent& e : handles[0].stream->wait(std::chrono::milliseconds(20))) {
      if (e.kind == SequenceEvent::Kind::kFinish) (e.sequence == handles[0].id ? finish_long : finish_short) = e.finish_reason;
    }
  }
  EXPECT_TRUE(finish_long == "cancelled" || finish_long == "stop") << finish_long;
  EXPECT_TRUE(finish_short == "length" || finish_short == "stop") << finish_short;
  scheduler.stop("test over");
  EXPECT_EQ(worker.n_sequences(), 0u);
}

// Holds every step until opened, so the queue's state can be set up exactly.
class GatedWorker final : public StepExecutor {
 public:
  explicit GatedWorker(StepExecutor& inner) : inner_(inner) {}
  WorkerInfo info() const override { return inner_.info(); }
  StepResult step(const StepPlan& plan) override {
    std::unique_lock lock(mutex_);
    entered_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
    lock.unlock();
    return inner_.step(plan);
  }
  void wait_entered() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return entered_; });
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  StepExecutor& inner_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool entered_ = false, open_ = false;
};

TEST_F(SchedulerTest, RejectsWhatCanNeverRunAndWhatDoesNotFitTheQueue) {
  LocalWorker worker(*model_, worker_options());
  GatedWorker gated(worker);
  metrics::Registry registry;
  SchedulerOptions options;
  options.max_waiting = 2;
  options.max_batch = 1;
  Scheduler scheduler(gated, *tokenizer_, registry, options);
  SequenceRequest empty = request(0, 4);
  empty.prompt.clear();
  EXPECT_THROW(scheduler.submit({empty}), Error);
  SequenceRequest too_long = request(0, 300);  // prompt + 300 > 256
  try {
    scheduler.submit({too_long});
    FAIL() << "expected a context error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos);
  }
  try {
    scheduler.submit({request(0, 4), request(1, 4), request(2, 4)});
    FAIL() << "expected a group larger than the queue to be refused for good";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  // One running (held in the worker), two waiting: the queue is full.
  std::vector<SequenceHandle> running = scheduler.submit({request(0, 4)});
  gated.wait_entered();
  std::vector<SequenceHandle> queued = scheduler.submit({request(1, 4), request(2, 4)});
  EXPECT_EQ(scheduler.waiting(), 2u);
  try {
    scheduler.submit({request(3, 4)});
    FAIL() << "expected the queue limit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
  }
  gated.open();
  // Nothing of the refused requests was queued; the others run.
  EXPECT_FALSE(collect(running)[0].finish.empty());
  for (const Outcome& o : collect(queued)) EXPECT_TRUE(o.finish == "length" || o.finish == "stop") << o.finish;
  scheduler.drain();
  try {
    scheduler.submit({request(0, 4)});
    FAIL() << "expected draining to refuse";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
  }
}

TEST_F(SchedulerTest, BadPolicyFailsAloneAndTheOthersRun) {
  LocalWorker worker(*model_, worker_options());
  metrics::Registry registry;
  Scheduler scheduler(worker, *tokenizer_, registry, SchedulerOptions{});
  SequenceRequest bad = request(3, 8);
  bad.sampling.top_p = 1.5f;  // invalid sampling: the worker refuses to start it
  const std::vector<Outcome> got = collect(scheduler.submit({bad, request(1, 8)}));
  EXPECT_EQ(got[0].finish, "error");
  EXPECT_NE(got[0].error.find("top_p"), std::string::npos) << got[0].error;
  EXPECT_TRUE(got[1].finish == "length" || got[1].finish == "stop");
}

TEST_F(SchedulerTest, EvictingPolicyStaysWithinBudget) {
  LocalWorker worker(*model_, worker_options());
  metrics::Registry registry;
  Scheduler scheduler(worker, *tokenizer_, registry, SchedulerOptions{});
  SequenceRequest r = request(2, 80, make_policy_config("lazy", {{"budget", "32"}, {"window", "8"}}));
  const std::vector<Outcome> got = collect(scheduler.submit({r}));
  ASSERT_FALSE(got[0].finish.empty());
  ASSERT_GT(got[0].tokens.size() + r.prompt.size(), 48u) << "the sequence must outgrow its budget";
  EXPECT_GT(registry.counter(metrics::kEvictions).value(), 0);
  EXPECT_EQ(got[0].finish, "length");
}

// A worker that breaks on its third step (error injection around the real one).
class BreakingWorker final : public StepExecutor {
 public:
  explicit BreakingWorker(StepExecutor& inner) : inner_(inner) {}
  WorkerInfo info() const override { return inner_.info(); }
  StepResult step(const StepPlan& plan) override {
    if (++steps_ == 3) throw Error(ErrorCode::kIo, "connection to worker lost");
    return inner_.step(plan);
  }

 private:
  StepExecutor& inner_;
  int steps_ = 0;
};

TEST_F(SchedulerTest, AFailingWorkerEndsRunningSequencesWithAnErrorAndServingGoesOn) {
  LocalWorker worker(*model_, worker_options());
  BreakingWorker breaking(worker);
  metrics::Registry registry;
  Scheduler scheduler(breaking, *tokenizer_, registry, SchedulerOptions{});
  const std::vector<Outcome> failed = collect(scheduler.submit({request(0, 50)}));
  EXPECT_EQ(failed[0].finish, "error");
  EXPECT_TRUE(failed[0].unavailable);
  EXPECT_NE(failed[0].error.find("connection to worker lost"), std::string::npos);
  const std::vector<Outcome> next = collect(scheduler.submit({request(1, 4)}));
  EXPECT_TRUE(next[0].finish == "length" || next[0].finish == "stop") << next[0].finish << " " << next[0].error;
  // The failed sequence's KV was released once the worker answered again.
  scheduler.stop("test over");
  EXPECT_EQ(worker.n_sequences(), 0u);
}

// A worker whose first `failures` steps throw (-1: every step), reported alive or not.
class FlakyWorker final : public StepExecutor {
 public:
  FlakyWorker(StepExecutor& inner, int failures, bool up) : inner_(inner), failures_(failures), up_(up) {}
  WorkerInfo info() const override { return inner_.info(); }
  bool alive() const override { return up_.load(); }
  StepResult step(const StepPlan& plan) override {
    const int n = ++steps_;
    if (!plan.start.empty()) ++starting_steps_;
    if (failures_.load() < 0 || n <= failures_.load()) throw Error(ErrorCode::kUnavailable, "connection refused");
    return inner_.step(plan);
  }
  int steps() const { return steps_.load(); }
  int starting_steps() const { return starting_steps_.load(); }  // steps whose plan starts sequences
  void heal() {
    failures_ = 0;
    up_ = true;
  }
  void kill() { up_ = false; }  // declared dead, as after missed heartbeats

 private:
  StepExecutor& inner_;
  std::atomic<int> failures_;
  std::atomic<bool> up_;
  std::atomic<int> steps_{0};
  std::atomic<int> starting_steps_{0};
};

TEST_F(SchedulerTest, SequencesAFailedStepWouldHaveStartedStayQueuedAndRunLater) {
  LocalWorker worker(*model_, worker_options());
  FlakyWorker flaky(worker, 2, true);  // a worker restarting: two steps fail, then it answers
  metrics::Registry registry;
  Scheduler scheduler(flaky, *tokenizer_, registry, SchedulerOptions{});
  const std::vector<SequenceRequest> requests = {request(1, 6), request(2, 6)};
  const std::vector<Outcome> got = collect(scheduler.submit(requests));
  const std::vector<Outcome> reference = alone(requests);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].finish, reference[i].finish) << got[i].error;
    EXPECT_EQ(got[i].tokens, reference[i].tokens) << "sequence " << i;
  }
  EXPECT_GE(flaky.steps(), 3);
  scheduler.stop("test over");
  EXPECT_EQ(worker.n_sequences(), 0u);
}

TEST_F(SchedulerTest, ASequenceWhoseStartKeepsFailingEndsAfterTheRetryWindow) {
  LocalWorker worker(*model_, worker_options());
  FlakyWorker flaky(worker, -1, true);  // up, but every step fails (a request that crashes each restart)
  metrics::Registry registry;
  SchedulerOptions options;
  options.start_retry_window = std::chrono::milliseconds(400);
  const auto begin = Clock::now();
  Scheduler scheduler(flaky, *tokenizer_, registry, options);
  const std::vector<Outcome> got = collect(scheduler.submit({request(1, 6)}));
  EXPECT_EQ(got[0].finish, "error");
  EXPECT_TRUE(got[0].unavailable);
  EXPECT_NE(got[0].error.find("connection refused"), std::string::npos) << got[0].error;
  EXPECT_GE(Clock::now() - begin, std::chrono::milliseconds(400)) << "it gave up before its window passed";
  EXPECT_GE(flaky.starting_steps(), 2) << "it was never started again";
  flaky.heal();
  scheduler.stop("test over");
  EXPECT_EQ(worker.n_sequences(), 0u);
}

TEST_F(SchedulerTest, ADeadWorkerFailsQueuedSequencesAtOnce) {
  LocalWorker worker(*model_, worker_options());
  FlakyWorker flaky(worker, -1, false);  // declared dead: no retries
  metrics::Registry registry;
  Scheduler scheduler(flaky, *tokenizer_, registry, SchedulerOptions{});
  const std::vector<Outcome> got = collect(scheduler.submit({request(1, 6), request(2, 6)}));
  for (const Outcome& o : got) {
    EXPECT_EQ(o.finish, "error");
    EXPECT_TRUE(o.unavailable);
  }
  EXPECT_EQ(flaky.starting_steps(), 1) << "both were admitted together and failed with the first step";
  flaky.heal();
}

TEST_F(SchedulerTest, ZeroPrefillTokensPerStepIsRefused) {
  LocalWorker worker(*model_, worker_options());
  metrics::Registry registry;
  SchedulerOptions options;
  options.max_prefill_tokens = 0;
  EXPECT_THROW(Scheduler(worker, *tokenizer_, registry, options), Error);
}

TEST_F(SchedulerTest, ASequenceThatAloneOutgrowsTheCacheEndsWithLengthAndKeepsItsText) {
  LocalWorker probe(*model_, worker_options());
  const WorkerInfo info = probe.info();
  // One page per (layer, head): 64 slots for prompt and output together.
  LocalWorker worker(*model_, worker_options(info.kv_page_bytes * size_t(info.n_layer * info.n_head_kv)));
  metrics::Registry registry;
  Scheduler scheduler(worker, *tokenizer_, registry, SchedulerOptions{});
  SequenceRequest r = request(0, 150);
  const std::vector<Outcome> got = collect(scheduler.submit({r}));
  const std::vector<Outcome> reference = alone({r});
  ASSERT_EQ(reference[0].finish, "length");
  EXPECT_EQ(got[0].finish, "length") << got[0].error;
  // 64 cached tokens, plus the last one sampled (never fed).
  EXPECT_EQ(got[0].tokens.size() + r.prompt.size(), size_t(info.page_slots) + 1);
  // What it generated is the start of the unbounded run.
  EXPECT_TRUE(std::equal(got[0].tokens.begin(), got[0].tokens.end(), reference[0].tokens.begin()));
}

TEST_F(SchedulerTest, StopEndsQueuedAndRunningSequencesWithAnError) {
  LocalWorker worker(*model_, worker_options());
  metrics::Registry registry;
  SchedulerOptions options;
  options.max_batch = 1;
  auto scheduler = std::make_unique<Scheduler>(worker, *tokenizer_, registry, options);
  std::vector<SequenceHandle> handles = scheduler->submit({request(0, 200), request(1, 200), request(2, 200)});
  scheduler->stop("shutting down for the test");
  std::vector<Outcome> got = collect(handles);
  for (const Outcome& o : got) {
    if (o.finish == "error") {
      EXPECT_TRUE(o.unavailable);
      EXPECT_EQ(o.error, "shutting down for the test");
    }
  }
  EXPECT_EQ(got[2].finish, "error");  // it never ran
  EXPECT_EQ(worker.n_sequences(), 0u);
}

// Prompts that start like earlier ones: the worker takes that start from its
// prefix cache, and the scheduler's chunks go on from there, whether a later
// chunk is needed or the first one ends the prompt early; the tokens are
// those of a worker that computes it all, and the metrics count the hits.
TEST_F(SchedulerTest, APrefixCacheHitShortensThePromptsChunksAndIsCounted) {
  SequenceRequest first = request(0, 4);
  first.prompt.clear();
  for (int k = 0; k < 150; ++k) first.prompt.push_back(3 + (11 * k) % 250);
  SequenceRequest second = first;
  for (int k = 0; k < 50; ++k) second.prompt.push_back(3 + (13 * k + 5) % 250);
  second.max_new_tokens = 12;
  SequenceRequest third = second;
  for (int k = 0; k < 5; ++k) third.prompt.push_back(3 + (17 * k + 1) % 250);
  SchedulerOptions options;
  options.max_prefill_tokens = 40;

  LocalWorker plain(*model_, worker_options());
  metrics::Registry plain_registry;
  Scheduler plain_scheduler(plain, *tokenizer_, plain_registry, options);
  const Outcome second_reference = collect(plain_scheduler.submit({second})).front();
  const Outcome third_reference = collect(plain_scheduler.submit({third})).front();
  plain_scheduler.stop("test over");

  LocalWorkerOptions reuse_options = worker_options();
  reuse_options.prefix_cache_bytes = size_t(16) << 20;
  LocalWorker worker(*model_, reuse_options);
  metrics::Registry registry;
  Scheduler scheduler(worker, *tokenizer_, registry, options);
  EXPECT_EQ(collect(scheduler.submit({first})).front().finish, "length");
  EXPECT_EQ(registry.counter(metrics::kPrefixCacheHitTokens).value(), 0);
  // 150 taken (two whole pages, 22 tokens of the first's last); 50 left: a
  // chunk of 40 that samples nothing, then one of 10.
  const Outcome second_reused = collect(scheduler.submit({second})).front();
  EXPECT_EQ(second_reused.error, "");
  EXPECT_EQ(second_reused.tokens, second_reference.tokens);
  EXPECT_EQ(registry.counter(metrics::kPrefixCacheHitTokens).value(), 150);
  // 192 taken (three whole pages; the second's last page has only 8 tokens in
  // common); 13 left, so the first chunk, planned at 40, ends the prompt.
  const Outcome third_reused = collect(scheduler.submit({third})).front();
  EXPECT_EQ(third_reused.error, "");
  EXPECT_EQ(third_reused.tokens, third_reference.tokens);
  EXPECT_EQ(registry.counter(metrics::kPrefixCacheHitTokens).value(), 150 + 192);
  EXPECT_EQ(registry.counter(metrics::kPrefixCacheHitBytes).value(),
            342.0 * double(worker.info().kv_bytes_per_token));
  // The cache holds the first's pages (two whole, a tail) and the second's
  // (a whole one, a tail) since the third started; stopping releases the
  // third, which leaves its tail.
  const WorkerInfo info = worker.info();
  const double page_set = double(info.kv_page_bytes) * double(info.n_layer * info.n_head_kv);
  EXPECT_GE(registry.gauge(metrics::kPrefixCacheBytes).value(), 5 * page_set);
  scheduler.stop("test over");
  EXPECT_EQ(double(worker.step(StepPlan{}).prefix_cache_bytes), 6 * page_set);
}

// Several groups behind one API (GroupDispatcher): each group here is an
// in-process worker with its own scheduler.

std::vector<int32_t> long_prompt(int seed) {  // 140 tokens: two whole 64-token blocks
  std::vector<int32_t> p = {1};
  for (int k = 1; k < 140; ++k) p.push_back(3 + (31 * seed + 7 * k) % 250);
  return p;
}

TEST_F(SchedulerTest, GroupsGiveDistinctIdsAndAPromptGoesBackWhereItsPrefixRan) {
  LocalWorker w0(*model_, worker_options()), w1(*model_, worker_options());
  metrics::Registry registry;
  GroupDispatcher groups({{&w0, "0.0"}, {&w1, "1.0"}}, *tokenizer_, registry, SchedulerOptions{});
  const std::vector<int32_t> a = long_prompt(1), b = long_prompt(2);
  EXPECT_EQ(groups.choose(a), 0) << "nothing known: the least loaded, first in turn";
  EXPECT_EQ(groups.choose(b), 1) << "equal loads go round the groups";
  std::vector<int32_t> a_next_turn = a;
  a_next_turn.insert(a_next_turn.end(), {9, 10, 11});
  EXPECT_EQ(groups.choose(a_next_turn), 0) << "where a's blocks ran";
  EXPECT_EQ(groups.choose(b), 1);

  SequenceRequest ra = request(0, 5), rb = request(0, 5);
  ra.prompt = a_next_turn;
  rb.prompt = b;
  const std::vector<SequenceHandle> ha = groups.submit({ra}), hb = groups.submit({rb});
  EXPECT_EQ(ha[0].id % 2, 1u) << "group 0 numbers 1, 3, 5, ...";
  EXPECT_EQ(hb[0].id % 2, 0u) << "group 1 numbers 2, 4, 6, ...";
  const std::vector<Outcome> reference = alone({ra, rb});
  EXPECT_EQ(collect(ha)[0].tokens, reference[0].tokens);
  EXPECT_EQ(collect(hb)[0].tokens, reference[1].tokens);
  EXPECT_GT(registry.histogram(metrics::kStepDuration, {"0.0"}).snapshot().count, 0u);
  EXPECT_GT(registry.histogram(metrics::kStepDuration, {"1.0"}).snapshot().count, 0u);
  groups.stop("test over");
  EXPECT_EQ(registry.gauge(metrics::kRequestsWaiting).value(), 0);
  EXPECT_EQ(groups.group(0).outstanding_tokens() + groups.group(1).outstanding_tokens(), 0);
}

TEST_F(SchedulerTest, ARequestWhoseHomeGroupIsBusyGoesToTheLeastLoadedAndTheHomeStays) {
  LocalWorker w0(*model_, worker_options()), w1(*model_, worker_options());
  GatedWorker gated(w0);
  metrics::Registry registry;
  GroupDispatcherOptions options;
  options.affinity_slack_tokens = 10;
  GroupDispatcher groups({{&gated, "0.0"}, {&w1, "1.0"}}, *tokenizer_, registry, SchedulerOptions{}, options);
  const std::vector<int32_t> a = long_prompt(1);
  EXPECT_EQ(groups.choose(a), 0);
  EXPECT_EQ(groups.choose(long_prompt(2)), 1);
  // A short prompt has no blocks: the least loaded in turn, group 0, whose gated step holds it.
  const std::vector<SequenceHandle> held = groups.submit({request(0, 30)});
  gated.wait_entered();
  EXPECT_GT(groups.group(0).outstanding_tokens(), 10);
  EXPECT_EQ(groups.choose(a), 1) << "group 0 is more than the slack above group 1";
  gated.open();
  EXPECT_EQ(collect(held)[0].finish, "length");
  EXPECT_EQ(groups.choose(a), 0) << "the spill-over did not move a's home";
}

TEST_F(SchedulerTest, ADeadGroupHandsTheSequencesItHasNotStartedToAnother) {
  LocalWorker w0(*model_, worker_options()), w1(*model_, worker_options());
  FlakyWorker flaky(w0, -1, true);  // up, but every step fails: its sequences wait to be started again
  metrics::Registry registry;
  SchedulerOptions scheduler_options;
  scheduler_options.start_retry_window = std::chrono::seconds(60);
  GroupDispatcher groups({{&flaky, "0.0"}, {&w1, "1.0"}}, *tokenizer_, registry, scheduler_options);
  const std::vector<SequenceRequest> requests = {request(1, 6), request(2, 6)};
  const std::vector<SequenceHandle> handles = groups.submit(requests);  // group 0, first in turn
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (flaky.starting_steps() < 2 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_GE(flaky.starting_steps(), 2) << "group 0 never tried to start them";
  flaky.kill();  // declared dead: the next failed step hands them over
  const std::vector<Outcome> got = collect(handles);
  const std::vector<Outcome> reference = alone(requests);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].error, "");
    EXPECT_EQ(got[i].tokens, reference[i].tokens) << "sequence " << i;
  }
  EXPECT_EQ(registry.counter(metrics::kErrors, {"unavailable"}).value(), 0);
  EXPECT_EQ(registry.counter(metrics::kSequencesMoved).value(), 2);
  EXPECT_EQ(groups.group(0).outstanding_tokens(), 0);
  EXPECT_EQ(groups.choose(long_prompt(3)), 1) << "a dead group gets nothing new";
  EXPECT_EQ(groups.choose(long_prompt(4)), 1);
  flaky.heal();
}

TEST_F(SchedulerTest, GroupsOfDifferentModelsAreRefusedAndCapacitiesAddUp) {
  LocalWorker probe(*model_, worker_options());
  const WorkerInfo info = probe.info();
  const size_t page_set = info.kv_page_bytes * size_t(info.n_layer * info.n_head_kv);
  LocalWorker small(*model_, worker_options(4 * page_set)), large(*model_, worker_options(8 * page_set));
  metrics::Registry registry;
  {
    GroupDispatcher groups({{&small, "0.0"}, {&large, "1.0"}}, *tokenizer_, registry, SchedulerOptions{});
    EXPECT_EQ(groups.worker_info().kv_capacity_bytes, 4 * page_set) << "what every group can take";
    EXPECT_EQ(registry.gauge(metrics::kKvCapacityBytes, {"device"}).value(), double(12 * page_set));
  }
  LocalWorkerOptions other = worker_options();
  other.n_vocab = tokenizer_->n_vocab() - 1;
  LocalWorker other_vocabulary(*model_, other);
  metrics::Registry other_registry;
  try {
    GroupDispatcher groups({{&small, "0.0"}, {&other_vocabulary, "1.0"}}, *tokenizer_, other_registry,
                           SchedulerOptions{});
    ADD_FAILURE() << "groups of different vocabularies were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group 1 serves a different model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lazykv
