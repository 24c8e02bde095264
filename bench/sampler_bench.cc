// The sampler's cost per token on a SmolLM2-sized vocabulary (49,152 logits):
// greedy and temperature sampling, plain and with the logit adjustments
// (logit_bias, presence/frequency penalties over `history` generated tokens,
// the repetition penalty over a prompt of the same length). Beside a decode
// step of the default model (several milliseconds) it shows what the
// adjustments add. Run with --benchmark_format=json for machine-readable output.
#include <benchmark/benchmark.h>

#include <cmath>
#include <utility>
#include <vector>

#include "common/seeded_random.h"
#include "worker/sampler.h"

namespace {

constexpr int kVocab = 49152;

// A language model's logits fall off with rank much as a Zipf law does:
// logit = 12 - 2 ln(rank), ranks shuffled over the vocabulary.
std::vector<float> zipf_logits(uint64_t seed) {
  std::vector<float> logits(kVocab);
  for (int i = 0; i < kVocab; ++i) logits[size_t(i)] = 12.0f - 2.0f * std::log(float(i + 1));
  uint64_t state = seed;
  for (size_t i = logits.size() - 1; i > 0; --i) std::swap(logits[i], logits[lazykv::splitmix64(state) % (i + 1)]);
  return logits;
}

// Arguments: temperature x 10, top_p x 100, adjustments on (0/1), history length.
void sample_token(benchmark::State& state) {
  lazykv::SamplingParams params;
  params.temperature = float(state.range(0)) / 10.0f;
  params.seed = 7;
  params.top_p = float(state.range(1)) / 100.0f;
  const bool adjusted = state.range(2) != 0;
  const int history = int(state.range(3));
  if (adjusted) {
    params.presence_penalty = 0.5f;
    params.frequency_penalty = 0.5f;
    params.repetition_penalty = 1.1f;
    params.logit_bias = {{13, -100.0f}, {42, 5.0f}};
  }
  lazykv::Sampler sampler(params);
  std::vector<int32_t> fed(size_t(2 * history));
  uint64_t s = 3;
  for (int32_t& t : fed) t = int32_t(lazykv::splitmix64(s) % kVocab);
  const std::vector<float> logits = zipf_logits(11);
  for (auto _ : state) {
    // A prompt of `history` tokens, then `history` generated; started again
    // each time so that the counts stay at that size.
    state.PauseTiming();
    sampler.start(fed, history);
    state.ResumeTiming();
    benchmark::DoNotOptimize(sampler.sample(logits));
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(sample_token)
    ->ArgNames({"temperature_x10", "top_p_x100", "adjusted", "history"})
    ->Args({0, 100, 0, 0})
    ->Args({0, 100, 1, 1000})
    ->Args({0, 100, 1, 4000})
    ->Args({7, 100, 0, 0})
    ->Args({7, 100, 1, 1000})
    ->Args({7, 100, 1, 4000})
    ->Args({7, 90, 0, 0})
    ->Args({10, 95, 0, 0});

}  // namespace

BENCHMARK_MAIN();
