// lazykv bench: prefill and decode throughput of a model on this machine, as
// JSON. Token ids are fixed pseudo-random ids, so runs are comparable.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/flags.h"
#include "worker/forward.h"
#include "worker/sampler.h"

namespace lazykv {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int32_t> bench_tokens(int n, int n_vocab, uint32_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ salt;
  for (int32_t& id : ids) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    // Avoid the special tokens at both ends when the vocabulary is large enough.
    id = n_vocab > 400 ? int32_t(100 + x % uint64_t(n_vocab - 200)) : int32_t(x % uint64_t(n_vocab));
  }
  return ids;
}

struct Bench {
  const Model& model;
  ThreadPool& pool;
  cpu::ActivationPrecision precision;
  int reps;

  KvCacheConfig cache_config() const {
    const ModelConfig& c = model.config();
    return {c.n_layer, c.n_head_kv, c.head_dim, 64, 0};
  }

  // Best-of-reps prefill throughput for one sequence of n tokens.
  double prefill(int n) {
    double best = 0.0;
    const auto ids = bench_tokens(n, model.config().n_vocab, 1);
    for (int r = 0; r < reps; ++r) {
      KvCache cache(cache_config());
      ForwardPass fp(model, cache, pool, precision);
      cache.add_sequence(0);
      BatchItem item{0, ids, 0, false};
      const auto t = Clock::now();
      fp.run({&item, 1});
      best = std::max(best, n / seconds_since(t));
    }
    return best;
  }

  // Aggregate decode throughput: `batch` sequences with `ctx` tokens of
  // context each, then `steps` decode steps of one token per sequence.
  double decode(int batch, int ctx, int steps) {
    KvCache cache(cache_config());
    ForwardPass fp(model, cache, pool, precision);
    std::vector<int32_t> next(static_cast<size_t>(batch));
    for (int b = 0; b < batch; ++b) {
      cache.add_sequence(b);
      const auto ids = bench_tokens(ctx, model.config().n_vocab, uint32_t(b + 7));
      BatchItem item{b, ids, 0, false};
      next[size_t(b)] = argmax(fp.run({&item, 1}));
    }
    double best = 0.0;
    int pos = ctx;
    for (int r = 0; r < reps; ++r) {
      const auto t = Clock::now();
      for (int s = 0; s < steps; ++s, ++pos) {
        std::vector<BatchItem> items;
        for (int b = 0; b < batch; ++b) items.push_back({b, {&next[size_t(b)], 1}, pos, false});
        const auto logits = fp.run(items);
        for (int b = 0; b < batch; ++b) {
          next[size_t(b)] = argmax(logits.subspan(size_t(b) * size_t(fp.n_vocab()), size_t(fp.n_vocab())));
        }
      }
      best = std::max(best, double(batch) * steps / seconds_since(t));
    }
    return best;
  }
};

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  Flags flags("bench");
  flags.add("model", "default", "model: a .gguf file, a Hugging Face directory, or 'default'")
      .add("threads", "0", "CPU threads; 0 is all cores")
      .add("activations", "f32", "matmul activation precision: f32 (exact) or int8 (llama.cpp-style, less exact)")
      .add("reps", "3", "repetitions; the best is reported")
      .add("prefill-tokens", "512", "prompt length of the prefill measurement")
      .add("decode-steps", "64", "decode steps per measurement");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  LoadedModel m = load_model(flags.get("model"));
  ThreadPool pool(int(flags.get_int("threads")));
  Bench bench{*m.model, pool, parse_activations(flags.get("activations")), std::max(1, int(flags.get_int("reps")))};
  const int steps = std::max(1, int(flags.get_int("decode-steps")));
  const int n_prefill = std::max(1, int(flags.get_int("prefill-tokens")));

  nlohmann::json out;
  out["model"] = m.model->config().name;
  out["model_path"] = m.model->path();
  out["weight_bytes"] = m.model->weight_bytes();
  out["threads"] = pool.size();
  out["activations"] = flags.get("activations");
  out["prefill_tokens"] = n_prefill;
  out["prefill_tok_s"] = bench.prefill(n_prefill);
  out["decode_ctx128_tok_s"] = bench.decode(1, 128, steps);
  out["decode_ctx2048_tok_s"] = bench.decode(1, 2048, steps);
  out["decode_batch8_ctx128_tok_s"] = bench.decode(8, 128, steps);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  out["peak_rss_bytes"] = int64_t(usage.ru_maxrss) * 1024;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace lazykv
