// Structured outputs' cost on a real model: decode tok/s of requests
// constrained by a JSON schema (json_object, and a nested schema with enums,
// ranges and arrays), and of the same requests free, each run to the length
// its constrained twin had (so both runs batch alike), through the
// scheduler and the in-process worker as `lazykv serve` runs them; then the masks alone,
// replayed over the constrained outputs' tokens with a cold cache (every
// state computed) and a warm one. Prints one JSON object.
//   usage: structured_output_bench MODEL.gguf [REQUESTS] [MAX_TOKENS] [THREADS]
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/metrics/registry.h"
#include "coordinator/grammar/constraint_cache.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "worker/local_worker.h"
#include "worker/model.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Run {
  double seconds = 0;
  int64_t tokens = 0;
  std::vector<std::vector<int32_t>> outputs;
};

// `requests` sequences of the prompt, `batch` at a time; free ones
// (no constraint) run to `lengths[i]` tokens when given.
Run run(Scheduler& scheduler, const std::vector<int32_t>& prompt, int requests, int batch, int32_t max_tokens,
        std::shared_ptr<const grammar::TokenConstraint> constraint, const std::vector<std::vector<int32_t>>& lengths = {}) {
  Run out;
  const auto start = Clock::now();
  for (int first = 0; first < requests; first += batch) {
    std::vector<SequenceRequest> sequences;
    for (int i = first; i < std::min(requests, first + batch); ++i) {
      SequenceRequest r;
      r.prompt = prompt;
      r.max_new_tokens = lengths.empty() ? max_tokens : std::max<int32_t>(1, int32_t(lengths[size_t(i)].size()));
      r.sampling.temperature = 0.7f;
      r.sampling.seed = uint64_t(i);
      r.ignore_eos = constraint == nullptr;  // free text runs to max_tokens
      r.constraint = constraint;
      sequences.push_back(std::move(r));
    }
    const std::vector<SequenceHandle> handles = scheduler.submit(std::move(sequences));
    std::vector<std::vector<int32_t>> tokens(handles.size());
    size_t done = 0;
    while (done < handles.size()) {
      for (const SequenceEvent& e : handles.front().stream->wait(std::chrono::milliseconds(100))) {
        const size_t k = size_t(e.sequence - handles.front().id);
        if (e.kind == SequenceEvent::Kind::kToken) tokens[k].push_back(e.token.id);
        else ++done;
      }
    }
    for (auto& t : tokens) {
      out.tokens += int64_t(t.size());
      out.outputs.push_back(std::move(t));
    }
  }
  out.seconds = seconds_since(start);
  return out;
}

// Mask time per token over `outputs`, on a fresh constraint: the first pass
// computes every state's mask, the second finds them cached.
Json replay_masks(const grammar::ResponseGrammar& g, const Tokenizer& tokenizer,
                  const std::vector<std::vector<int32_t>>& outputs) {
  grammar::ConstraintCache cache(tokenizer);
  const auto constraint = cache.get(g);
  Json passes = Json::object();
  for (const char* pass : {"cold", "warm"}) {
    int64_t steps = 0;
    double slowest = 0;
    const auto start = Clock::now();
    for (const auto& tokens : outputs) {
      grammar::MatchState state = constraint->start();
      for (int32_t t : tokens) {
        const auto step = Clock::now();
        constraint->allowed(state);
        slowest = std::max(slowest, seconds_since(step));
        ++steps;
        if (!constraint->accept(state, t)) break;
      }
    }
    passes[pass] = {{"mean_us", 1e6 * seconds_since(start) / double(std::max<int64_t>(steps, 1))},
                    {"max_us", 1e6 * slowest}, {"steps", steps}};
  }
  const auto stats = constraint->cache_stats();
  passes["cache"] = {{"hits", stats.hits}, {"misses", stats.misses}};
  return passes;
}

int main_bench(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [REQUESTS] [MAX_TOKENS] [THREADS]\n", argv[0]);
    return 2;
  }
  const int requests = argc > 2 ? std::stoi(argv[2]) : 8;
  const int32_t max_tokens = argc > 3 ? std::stoi(argv[3]) : 128;
  const int threads = argc > 4 ? std::stoi(argv[4]) : 0;
  const std::unique_ptr<Model> model = Model::load(argv[1]);
  const Tokenizer tokenizer(model->tokenizer_spec());
  LocalWorkerOptions options;
  options.threads = threads;
  options.n_vocab = tokenizer.n_vocab();
  LocalWorker worker(*model, options);
  metrics::Registry registry;
  SchedulerOptions scheduler_options;
  scheduler_options.max_batch = 8;
  Scheduler scheduler(worker, tokenizer, registry, scheduler_options);
  const std::vector<int32_t> prompt = tokenizer.encode(
      "<|im_start|>user\nDescribe three cats in JSON: names, ages, colors and favourite toys.<|im_end|>\n"
      "<|im_start|>assistant\n");

  const grammar::ResponseGrammar object{"json_object", std::make_shared<const grammar::JsonSchema>(grammar::any_json_object())};
  const nlohmann::json cats = nlohmann::json::parse(R"({"type":"object","properties":{"cats":{"type":"array",
      "maxItems":3,"items":{"type":"object","properties":{"name":{"type":"string","maxLength":24},
      "age":{"type":"integer","minimum":0,"maximum":30},"color":{"enum":["black","white","ginger","grey","tabby"]},
      "toys":{"type":"array","items":{"type":"string","maxLength":32},"maxItems":4}},
      "required":["name","age","color","toys"]}}},"required":["cats"]})");
  const grammar::ResponseGrammar schema{"schema:" + cats.dump(),
                                        std::make_shared<const grammar::JsonSchema>(grammar::compile_json_schema(cats))};
  grammar::ConstraintCache cache(tokenizer);

  Json out;
  out["model"] = argv[1];
  out["requests"] = requests;
  out["max_tokens"] = max_tokens;
  out["vocabulary"] = tokenizer.n_vocab();
  const auto vocabulary_start = Clock::now();
  cache.get(object);  // builds the vocabulary's trie
  out["vocabulary_trie_ms"] = 1e3 * seconds_since(vocabulary_start);
  for (int batch : {1, 8}) {
    Json figures;
    for (const auto* g : {&object, &schema}) {
      // Alternating twice, the best of each: this machine's speed drifts.
      double rate = 0, free_rate = 0;
      Run constrained;
      for (int round = 0; round < 2; ++round) {
        constrained = run(scheduler, prompt, requests, batch, max_tokens, cache.get(*g));
        const Run free = run(scheduler, prompt, requests, batch, max_tokens, nullptr, constrained.outputs);
        rate = std::max(rate, double(constrained.tokens) / constrained.seconds);
        free_rate = std::max(free_rate, double(free.tokens) / free.seconds);
      }
      const std::string name = g == &object ? "json_object" : "json_schema";
      figures[name + "_tok_s"] = rate;
      figures[name + "_free_tok_s"] = free_rate;
      figures[name + "_tokens"] = constrained.tokens;
      figures[name + "_vs_free"] = rate / free_rate;
      if (batch == 1) out["masks_" + name] = replay_masks(*g, tokenizer, constrained.outputs);
    }
    out["batch_" + std::to_string(batch)] = figures;
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace lazykv

int main(int argc, char** argv) { return lazykv::main_bench(argc, argv); }
