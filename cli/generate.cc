// lazykv generate: streams one completion to stdout.
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "common/error.h"
#include "common/flags.h"
#include "coordinator/tokenizer/stop_strings.h"
#include "worker/draft.h"
#include "worker/forward.h"
#include "worker/tiers/tier_mover.h"
#include "worker/sampler.h"

namespace lazykv {

int run_generate(const std::vector<std::string>& args) {
  Flags flags("generate");
  add_tier_flags(flags);
  flags.add("model", "default", "model: a .gguf file, a Hugging Face directory, or 'default'")
      .add("prompt", "", "prompt text (required)")
      .add_switch("chat", "render the prompt with the model's chat template as a user message")
      .add("system", "", "system message (with --chat)")
      .add("max-tokens", "256", "maximum tokens to generate")
      .add("temperature", "0", "sampling temperature; 0 is greedy")
      .add("top-k", "0", "keep the k most likely tokens; 0 is off")
      .add("top-p", "1", "nucleus sampling mass; 1 is off")
      .add("min-p", "0", "drop tokens below min-p times the top probability; 0 is off")
      .add("seed", "0", "random seed (same seed, same output)")
      .add("stop", "", "stop string (repeatable)")
      .add_switch("ignore-eos", "go on past end-of-generation tokens to --max-tokens (benchmarks, long runs)")
      .add("threads", "0", "CPU threads; 0 is all cores")
      .add("activations", "f32", "matmul activation precision: f32 (exact) or int8 (llama.cpp-style, less exact)")
      .add("ctx", "0", "context limit in tokens; 0 is the model's training context");
  add_policy_flags(flags);
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  configure_tiers_from_flags(flags);
  if (flags.get("prompt").empty()) throw Error(ErrorCode::kInvalidArgument, "generate: --prompt is required");
  const int64_t max_tokens = flags.get_int("max-tokens");
  if (max_tokens < 0) throw Error(ErrorCode::kInvalidArgument, "--max-tokens must be >= 0");
  SamplingParams sampling;
  sampling.temperature = float(flags.get_double("temperature"));
  sampling.top_k = int(flags.get_int("top-k"));
  sampling.top_p = float(flags.get_double("top-p"));
  sampling.min_p = float(flags.get_double("min-p"));
  sampling.seed = uint64_t(flags.get_int("seed"));
  Sampler sampler(sampling);
  const PolicyConfig policy_config = policy_from_flags(flags);
  std::vector<std::string> stops;
  for (const std::string& s : flags.get_all("stop")) {
    if (!s.empty()) stops.push_back(s);
  }

  LoadedModel m = load_model(flags.get("model"), FilePages::kHuge);
  const ModelConfig& config = m.model->config();
  const std::vector<int32_t> prompt = encode_prompt(m, flags.get("prompt"), flags.get_bool("chat"), flags.get("system"));
  const int64_t n_ctx = flags.get_int("ctx") > 0 ? flags.get_int("ctx") : config.n_ctx_train;
  if (int64_t(prompt.size()) + max_tokens > n_ctx) {
    throw Error(ErrorCode::kInvalidArgument, "prompt of " + std::to_string(prompt.size()) + " tokens plus --max-tokens " +
                                                 std::to_string(max_tokens) + " exceeds the context of " +
                                                 std::to_string(n_ctx) + " tokens");
  }

  ThreadPool pool(int(flags.get_int("threads")));
  KvCache cache({config.n_layer, config.n_head_kv, config.head_dim, 64, 0});
  ForwardPass forward(*m.model, cache, pool, parse_activations(flags.get("activations")));
  SoloGroup solo;  // the drafts' group
  const SeqId seq = 0;
  std::unique_ptr<EvictionPolicy> policy = make_policy(policy_config, policy_shape(*m.model, int32_t(prompt.size()), int32_t(prompt.size() + max_tokens)));
  cache.add_sequence(seq, policy->heads_per_layer());

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  BatchItem item{seq, prompt, 0, false, policy.get()};
  std::span<const float> logits = forward.run({&item, 1});
  const auto t1 = Clock::now();
  StreamDecoder decoder(*m.tokenizer);
  StopStringMatcher stop(stops);
  const bool ignore_eos = flags.get_bool("ignore-eos");
  int64_t generated = 0;
  std::string finish = "length";
  int32_t pos = int32_t(prompt.size());
  while (generated < max_tokens) {
    // Embedding rows past the tokenizer's vocabulary (padding) are never sampled.
    const int32_t id = sampler.sample(logits.first(size_t(m.tokenizer->n_vocab())));
    ++generated;
    if (!ignore_eos && m.tokenizer->is_end_of_generation(id)) {
      finish = "stop";
      break;
    }
    const std::string text = stop.push(decoder.push(id));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (stop.stopped()) {
      finish = "stop";
      break;
    }
    if (generated == max_tokens) break;
    if (policy->draft_wanted() > 0) {  // laq: draft on a copy, then compact, before feeding id
      run_draft(forward, cache, solo, seq, *policy, id, pos, size_t(m.tokenizer->n_vocab()), size_t(config.n_vocab));
    }
    item = BatchItem{seq, {&id, 1}, pos++, false, policy.get()};
    logits = forward.run({&item, 1});
  }
  std::string tail = stop.push(decoder.flush());  // in this order: push may hold text back for flush
  tail += stop.flush();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fputc('\n', stdout);
  const auto t2 = Clock::now();
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  std::fprintf(stderr, "[%zu prompt tokens in %.3f s (%.1f tok/s); %lld generated in %.3f s (%.1f tok/s); finish: %s]\n",
               prompt.size(), prefill_s, double(prompt.size()) / prefill_s, static_cast<long long>(generated), decode_s,
               generated > 1 ? double(generated - 1) / decode_s : 0.0, finish.c_str());
  std::fprintf(stderr,
               "[kv policy %s: peak %lld slots (%.1f MiB), mean %.0f (%.1f MiB), %lld now, %lld evicted, %.1f ms in "
               "the policy]\n",
               policy_config.to_string().c_str(), static_cast<long long>(policy->peak_slots()),
               double(policy->peak_slots()) * double(cache.slot_bytes()) / (1 << 20), policy->mean_slots(),
               policy->mean_slots() * double(cache.slot_bytes()) / (1 << 20),
               static_cast<long long>(policy->slots()), static_cast<long long>(policy->evicted_slots()),
               policy->policy_seconds() * 1e3);
  if (policy_config.name.ends_with("+tiers")) {
    const TierCounters t = policy->tier_counters();
    std::fprintf(stderr,
                 "[tiers %s: %lld slots demoted (%.1f MiB), %lld promoted, %lld promotion hits, %lld row requests "
                 "(%.1f MiB), %lld waits]\n",
                 t.tiers_available ? "on" : "off", static_cast<long long>(t.demoted_slots),
                 double(t.demoted_bytes) / (1 << 20), static_cast<long long>(t.promoted_slots),
                 static_cast<long long>(t.promotion_hits), static_cast<long long>(t.fetched_blocks),
                 double(t.fetched_bytes) / (1 << 20), static_cast<long long>(t.fetch_waits));
    tiers::process_tiers()->flush();
    const kvstore::TierStoreStats s = tiers::process_tiers()->store_stats();
    std::fprintf(stderr,
                 "[tier store: host %zu blocks (%.1f MiB), nvme %zu blocks (%.1f MiB); %llu gets: %llu host hits, "
                 "%llu nvme hits; victims: %llu admitted to nvme, %llu rejected, %llu dropped]\n",
                 s.host_blocks, double(s.host_used_bytes) / (1 << 20), s.nvme_blocks,
                 double(s.nvme_used_bytes) / (1 << 20), static_cast<unsigned long long>(s.gets),
                 static_cast<unsigned long long>(s.host_hits), static_cast<unsigned long long>(s.nvme_hits),
                 static_cast<unsigned long long>(s.nvme_admitted), static_cast<unsigned long long>(s.nvme_rejected),
                 static_cast<unsigned long long>(s.dropped_victims));
  }
  return 0;
}

}  // namespace lazykv
