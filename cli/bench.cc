// lazykv bench: prefill and decode throughput of a model on this machine (its
// CPU, or a GPU with --device cuda), as JSON; on the CPU also the memory's
// read and copy rates and the fraction of them decode uses
// (bench_bandwidth.h); on a GPU its copy rate and the fraction of it decode
// uses. Token ids are fixed pseudo-random ids, so runs are
// comparable.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/bench_bandwidth.h"
#include "cli/commands.h"
#include "common/error.h"
#include "common/flags.h"
#include "worker/compute_device.h"
#include "worker/draft.h"
#include "worker/forward.h"
#include "worker/sampler.h"
#ifdef LAZYKV_HAVE_CUDA
#include "kernels/cuda/ops.h"
#endif

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
  Bench(const Model& model_, ThreadPool& pool_, cpu::ActivationPrecision precision_, int reps_, ComputeDevice device_,
        int cuda_device_, bool cuda_graphs_)
      : model(model_), pool(pool_), precision(precision_), reps(reps_), device(device_), cuda_device(cuda_device_),
        cuda_graphs(cuda_graphs_), shard(model_, 0, 1) {}

  const Model& model;
  ThreadPool& pool;
  cpu::ActivationPrecision precision;
  int reps;
  ComputeDevice device;
  int cuda_device;
  bool cuda_graphs;
  ModelShard shard;
  SoloGroup solo;

  // A pass on the benchmarked device (a CUDA pass uploads the weights here,
  // outside every timed region).
  std::unique_ptr<ForwardBackend> pass(KvCache& cache) {
    return make_forward_backend(device, cuda_device, shard, solo, cache, pool, precision, cuda_graphs);
  }

  KvCacheConfig cache_config() const {
    const ModelConfig& c = model.config();
    return {c.n_layer, c.n_head_kv, c.head_dim, 64, 0};
  }

  // Best-of-reps prefill throughput for one sequence of n tokens, each rep a
  // fresh sequence on one pass; a first, untimed run warms the pass up (its
  // buffers, and on a GPU the kernels' first loads), as decode's prompt does.
  double prefill(int n) {
    double best = 0.0;
    const auto ids = bench_tokens(n, model.config().n_vocab, 1);
    KvCache cache(cache_config());
    const auto fp = pass(cache);
    for (int r = 0; r <= reps; ++r) {
      cache.add_sequence(r);
      BatchItem item{r, ids, 0, false};
      const auto t = Clock::now();
      fp->run({&item, 1});
      if (r > 0) best = std::max(best, n / seconds_since(t));
      cache.remove_sequence(r);
    }
    return best;
  }

  // Aggregate decode throughput: `batch` sequences with `ctx` tokens of
  // context each, then `steps` decode steps of one token per sequence.
  double decode(int batch, int ctx, int steps) {
    KvCache cache(cache_config());
    const auto fp = pass(cache);
    const size_t n_vocab = size_t(model.config().n_vocab);
    std::vector<int32_t> next(static_cast<size_t>(batch));
    for (int b = 0; b < batch; ++b) {
      cache.add_sequence(b);
      const auto ids = bench_tokens(ctx, model.config().n_vocab, uint32_t(b + 7));
      BatchItem item{b, ids, 0, false};
      next[size_t(b)] = argmax(fp->run({&item, 1}));
    }
    double best = 0.0;
    int pos = ctx;
    for (int r = 0; r < reps; ++r) {
      const auto t = Clock::now();
      for (int s = 0; s < steps; ++s, ++pos) {
        std::vector<BatchItem> items;
        for (int b = 0; b < batch; ++b) items.push_back({b, {&next[size_t(b)], 1}, pos, false});
        const auto logits = fp->run(items);
        for (int b = 0; b < batch; ++b) next[size_t(b)] = argmax(logits.subspan(size_t(b) * n_vocab, n_vocab));
      }
      best = std::max(best, double(batch) * steps / seconds_since(t));
    }
    return best;
  }

  struct PolicyRun {
    double seconds = 0;  // the timed span: the decode steps, or the whole prefill
    double eviction_s = 0, policy_cpu_s = 0, draft_s = 0;
    int64_t peak_slots = 0;
  };
  // One sequence under `config`: a prompt of ctx tokens, then `steps` decode
  // steps (greedy), with the drafts the policy asks for (laq). Times the
  // decode steps, and the eviction's and the drafts' shares of them.
  PolicyRun decode_with_policy(const PolicyConfig& config, int ctx, int steps) {
    const ModelConfig& c = model.config();
    const size_t n_vocab = size_t(c.n_vocab);
    KvCache cache(cache_config());
    const auto fp = pass(cache);
    auto policy = make_policy(config, policy_shape(model, ctx, ctx + steps));
    cache.add_sequence(0, policy->heads_per_layer());
    const auto ids = bench_tokens(ctx, c.n_vocab, 11);
    PolicyRun run;
    const auto step = [&](const BatchItem& item, int32_t pos) {
      const int32_t next = argmax(fp->run({&item, 1}));
      if (policy->draft_wanted() > 0) {
        const auto t = Clock::now();
        run_draft(*fp, cache, solo, 0, *policy, next, pos, n_vocab, n_vocab);
        run.draft_s += seconds_since(t);
      }
      return next;
    };
    int32_t next = step(BatchItem{0, ids, 0, false, policy.get()}, ctx);
    run.draft_s = 0;
    const double eviction_s0 = fp->eviction_seconds(), policy_s0 = policy->policy_seconds();
    const auto t = Clock::now();
    for (int s = 0; s < steps; ++s) next = step(BatchItem{0, {&next, 1}, ctx + s, false, policy.get()}, ctx + s + 1);
    run.seconds = seconds_since(t);
    run.eviction_s = fp->eviction_seconds() - eviction_s0;
    run.policy_cpu_s = policy->policy_seconds() - policy_s0;
    run.peak_slots = policy->peak_slots();
    return run;
  }

  // One history of `history` tokens prefilled as epicache does (blocks, each
  // followed by the episode's patched prompt of `patched` tokens as a draft),
  // or in one pass under a policy that asks for no blocks. Times the whole
  // prefill (seconds), and its eviction's and drafts' shares.
  PolicyRun prefill_episode(const PolicyConfig& config, int history, int patched) {
    const ModelConfig& c = model.config();
    KvCache cache(cache_config());
    const auto fp = pass(cache);
    PolicyShape shape = policy_shape(model, history, history + 1);
    shape.episode = std::make_shared<const EpisodePrompt>(EpisodePrompt{bench_tokens(patched, c.n_vocab, 13), history});
    auto policy = make_policy(config, shape);
    cache.add_sequence(0, policy->heads_per_layer());
    const auto ids = bench_tokens(history, c.n_vocab, 11);
    PolicyRun run;
    const double eviction_s0 = fp->eviction_seconds();
    const auto t = Clock::now();
    for (int32_t pos = 0; pos < history;) {
      const int32_t n = policy->prompt_chunk(pos, history);
      const BatchItem item{0, std::span(ids).subspan(size_t(pos), size_t(n)), pos, false, policy.get()};
      const int32_t next = argmax(fp->run({&item, 1}));
      pos += n;
      if (policy->draft_wanted() > 0) {
        const auto d = Clock::now();
        run_draft(*fp, cache, solo, 0, *policy, next, pos, size_t(c.n_vocab), size_t(c.n_vocab));
        run.draft_s += seconds_since(d);
      }
    }
    run.seconds = seconds_since(t);
    run.eviction_s = fp->eviction_seconds() - eviction_s0;
    run.policy_cpu_s = policy->policy_seconds();
    run.peak_slots = policy->peak_slots();
    return run;
  }
};

// The cost of a policy per decode step, against `full` on the same tokens:
// the policy's own time (statistics upkeep, scoring, selection, compaction)
// as a fraction of the step, and the statistics the attention kernel records
// (the policy with a budget it never reaches against `full`).
nlohmann::json policy_cost(Bench& bench, const PolicyConfig& config, int steps) {
  const int budget = config.budget();
  // Enough steps for several compactions of a periodic policy.
  int period = 1;
  for (const char* p : {"window", "period"}) {
    if (config.params.count(p) != 0) period = std::max(period, config.get_int(p));
  }
  const int ctx = budget;  // the prompt fills the budget: every step runs at C .. C + period slots
  const int total_steps = std::max(steps, 4 * period);
  const Bench::PolicyRun run = bench.decode_with_policy(config, ctx, total_steps);
  PolicyConfig unbounded = config;  // same parameters, a budget it never reaches
  unbounded.params["budget"] = double(ctx + total_steps + 1);
  const Bench::PolicyRun stats_only = bench.decode_with_policy(unbounded, ctx, total_steps);
  const Bench::PolicyRun full = bench.decode_with_policy(make_policy_config("full"), ctx, total_steps);
  const double slot_bytes = double(bench.cache_config().head_dim) * 4;
  return {{"policy", config.to_json()},
          {"steps", total_steps},
          {"prompt_tokens", ctx},
          {"decode_tok_s", total_steps / run.seconds},
          {"eviction_ms_per_step", run.eviction_s * 1e3 / total_steps},
          {"eviction_fraction_of_step", run.eviction_s / run.seconds},
          {"policy_cpu_ms_per_step", run.policy_cpu_s * 1e3 / total_steps},
          {"draft_ms_per_step", run.draft_s * 1e3 / total_steps},
          {"peak_kv_bytes", double(run.peak_slots) * slot_bytes},
          {"stats_only_decode_tok_s", total_steps / stats_only.seconds},
          {"full_decode_tok_s", total_steps / full.seconds},
          {"full_peak_kv_bytes", double(full.peak_slots) * slot_bytes}};
}

// The cost of an episodic policy (epicache), which compresses a history at
// prefill and never per decode step: a history of 4 C tokens prefilled block
// by block with a patched prompt of `patched` tokens, against the same
// history in one pass with full KV (after an untimed warm-up pass).
nlohmann::json episode_cost(Bench& bench, const PolicyConfig& config, int patched) {
  const int history = 4 * config.budget();
  const PolicyConfig full = make_policy_config("full");
  bench.prefill_episode(full, history, patched);
  const Bench::PolicyRun run = bench.prefill_episode(config, history, patched);
  const Bench::PolicyRun plain = bench.prefill_episode(full, history, patched);
  const double slot_bytes = double(bench.cache_config().head_dim) * 4;
  return {{"policy", config.to_json()},
          {"history_tokens", history},
          {"patched_prompt_tokens", patched},
          {"prefill_s", run.seconds},
          {"draft_s", run.draft_s},
          {"eviction_s", run.eviction_s},
          {"policy_cpu_s", run.policy_cpu_s},
          {"prefill_over_full", run.seconds / plain.seconds},
          {"peak_kv_bytes", double(run.peak_slots) * slot_bytes},
          {"full_prefill_s", plain.seconds},
          {"full_peak_kv_bytes", double(plain.peak_slots) * slot_bytes}};
}

// A comma-separated list of positive integers, or the device's default when
// the flag was not given.
std::vector<int> positive_list(const Flags& flags, const std::string& name, const std::string& fallback) {
  const std::string text = flags.is_set(name) ? flags.get(name) : fallback;
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "--" + name + " takes positive integers separated by commas, not '" + text + "'");
    }
    out.push_back(value);
    at = comma + 1;
  }
  return out;
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  Flags flags("bench");
  add_tier_flags(flags);
  flags.add("model", "default", "model: a .gguf file, a Hugging Face directory, or 'default'")
      .add("threads", "0", "CPU threads; 0 is all cores")
      .add("activations", "f32", "matmul activation precision: f32 (exact) or int8 (llama.cpp-style, less exact)")
      .add("device", "cpu", "where the forward pass runs: cpu or cuda")
      .add("cuda-device", "-1", "with --device cuda: the CUDA device (-1: the first)")
      .add_switch("no-cuda-graphs", "with --device cuda: launch each decode step's kernels one by one (no CUDA graphs)")
      .add("reps", "3", "repetitions; the best is reported")
      .add("prefill-tokens", "", "prompt lengths of the prefill measurements, comma-separated (default 512; "
                                 "cuda 512,4096); the first is also prefill_tok_s")
      .add("decode-contexts", "", "contexts of the one-sequence decode measurements (default 128,2048; cuda "
                                  "128,2048,8192)")
      .add("decode-batches", "", "sequences of the batched decode measurements at context 128 (default 8; "
                                 "cuda 8,32)")
      .add("decode-steps", "64", "decode steps per measurement")
      .add_switch("policy-only", "measure only the --kv-policy cost (skip prefill and plain decode)")
      .add("episode-tokens", "384", "an episodic policy's (epicache's) patched prompt, in tokens, for its cost");
  add_policy_flags(flags);
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  configure_tiers_from_flags(flags);
  const ComputeDevice device = parse_compute_device(flags.get("device"));
  const int cuda_device = check_compute_device(device, int(flags.get_int_in("cuda-device", -1, 1 << 20)), 0);
  LoadedModel m = load_model(flags.get("model"), device == ComputeDevice::kCpu ? FilePages::kHuge : FilePages::kMapped);
  ThreadPool pool(int(flags.get_int("threads")));
  Bench bench(*m.model, pool, parse_activations(flags.get("activations")), std::max(1, int(flags.get_int("reps"))),
              device, cuda_device, !flags.get_bool("no-cuda-graphs"));
  const int steps = std::max(1, int(flags.get_int("decode-steps")));
  const bool cuda = device == ComputeDevice::kCuda;
  const std::vector<int> prefills = positive_list(flags, "prefill-tokens", cuda ? "512,4096" : "512");
  const std::vector<int> contexts = positive_list(flags, "decode-contexts", cuda ? "128,2048,8192" : "128,2048");
  const std::vector<int> batches = positive_list(flags, "decode-batches", cuda ? "8,32" : "8");

  nlohmann::json out;
  out["model"] = m.model->config().name;
  out["model_path"] = m.model->path();
  out["weight_bytes"] = m.model->weight_bytes();
  out["device"] = compute_device_name(device);
  if (cuda_device >= 0) out["cuda_device"] = cuda_device;
  out["threads"] = pool.size();
  out["activations"] = flags.get("activations");
  if (cuda) out["cuda_graphs"] = !flags.get_bool("no-cuda-graphs");
  const PolicyConfig policy = policy_from_flags(flags);
  if (!flags.get_bool("policy-only")) {
    out["prefill_tokens"] = prefills.front();
    for (int n : prefills) out["prefill" + std::to_string(n) + "_tok_s"] = bench.prefill(n);
    out["prefill_tok_s"] = out["prefill" + std::to_string(prefills.front()) + "_tok_s"];
    for (int ctx : contexts) out["decode_ctx" + std::to_string(ctx) + "_tok_s"] = bench.decode(1, ctx, steps);
    for (int b : batches) out["decode_batch" + std::to_string(b) + "_ctx128_tok_s"] = bench.decode(b, 128, steps);
  }
  const auto info = std::find_if(policy_catalog().begin(), policy_catalog().end(),
                                 [&](const PolicyInfo& p) { return p.name == policy.name; });
  if (info->episodic) {
    const int64_t patched = flags.get_int("episode-tokens");
    if (patched < 1 || patched > (1 << 20)) {
      throw Error(ErrorCode::kInvalidArgument, "--episode-tokens must be in [1, 2^20]");
    }
    out["policy_cost"] = episode_cost(bench, policy, int(patched));
  } else if (policy.name != "full") {
    out["policy_cost"] = policy_cost(bench, policy, steps);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  out["peak_rss_bytes"] = int64_t(usage.ru_maxrss) * 1024;  // before the bandwidth buffers below
  if (!flags.get_bool("policy-only")) {
    if (!cuda) {
      out["memory"] = bandwidth_report(*m.model, measure_memory_bandwidth(pool), out);
    } else {
#ifdef LAZYKV_HAVE_CUDA
      // The GPU's limit: its own device-to-device copy, counted read + write.
      const double copy = cuda::measure_copy_rate();
      const double weights = double(m.model->decode_weight_bytes());
      out["device_memory"] = {{"copy_gb_s", copy / 1e9}, {"copy_read_write_gb_s", 2 * copy / 1e9},
                              {"decode_weight_bytes", weights}};
      out["device_memory"].update(weight_read_report(weights, 2 * copy, "copy", out));
#endif
    }
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace lazykv
