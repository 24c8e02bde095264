// Per-request cost and miss ratio of the host tier's replacement policies on
// a Zipf request sequence with noisy next-use predictions.
//
// Each iteration replays the whole sequence (2^20 requests) through a fresh
// policy with a cache of k unit pages (k = 1024, 65536; 16·k distinct pages,
// Zipf exponent 0.9). Predictions: the exact next use with its distance
// scaled by exp(0.5·N(0,1)), and 10% of them replaced by a uniform random
// time in the next 2^20 requests (kNever stays kNever unless replaced).
// Counters: ns_per_request (CPU time / requests), miss_ratio, belady_miss_ratio,
// misses_vs_belady (policy misses / Belady's misses).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kvstore/paging/replacement_policy.h"

namespace {

using lazykv::paging::kNever;
using lazykv::paging::PageId;

constexpr size_t kRequests = size_t{1} << 20;
constexpr const char* kPolicies[] = {"guard", "follow-prediction", "lru"};

struct Workload {
  std::vector<PageId> requests;
  std::vector<uint64_t> predictions;
  size_t belady_misses = 0;
};

Workload make_workload(size_t k) {
  std::mt19937_64 rng(20250722 + k);
  const size_t universe = 16 * k;
  std::vector<double> cumulative(universe);
  double total = 0;
  for (size_t r = 0; r < universe; ++r) {
    total += std::pow(static_cast<double>(r + 1), -0.9);
    cumulative[r] = total;
  }
  std::vector<PageId> ids(universe);
  for (size_t r = 0; r < universe; ++r) ids[r] = r;
  std::shuffle(ids.begin(), ids.end(), rng);

  Workload w;
  w.requests.resize(kRequests);
  std::uniform_real_distribution<double> unit(0.0, total);
  for (auto& page : w.requests) {
    const size_t rank = std::lower_bound(cumulative.begin(), cumulative.end(), unit(rng)) -
                        cumulative.begin();
    page = ids[std::min(rank, universe - 1)];
  }
  w.predictions = lazykv::paging::perfect_predictions(w.requests);
  std::normal_distribution<double> noise(0.0, 0.5);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (size_t i = 0; i < kRequests; ++i) {
    uint64_t& predicted = w.predictions[i];
    if (coin(rng) < 0.1) {
      predicted = i + 1 + rng() % kRequests;
    } else if (predicted != kNever) {
      const double distance = static_cast<double>(predicted - i) * std::exp(noise(rng));
      predicted = i + std::max<uint64_t>(1, static_cast<uint64_t>(distance));
    }
  }
  w.belady_misses = lazykv::paging::belady_misses(w.requests, k);
  return w;
}

const Workload& workload(size_t k) {
  static std::map<size_t, Workload> built;
  auto it = built.find(k);
  if (it == built.end()) it = built.emplace(k, make_workload(k)).first;
  return it->second;
}

void set_counters(benchmark::State& state, size_t misses, const Workload& w) {
  const double n = static_cast<double>(w.requests.size());
  // Iteration-invariant rate, inverted: seconds per (n·1e-9) = ns per request.
  state.counters["ns_per_request"] = benchmark::Counter(
      n * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["miss_ratio"] = static_cast<double>(misses) / n;
  state.counters["belady_miss_ratio"] = static_cast<double>(w.belady_misses) / n;
  state.counters["misses_vs_belady"] =
      static_cast<double>(misses) / static_cast<double>(w.belady_misses);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(w.requests.size()));
}

void BM_Policy(benchmark::State& state) {
  const char* name = kPolicies[state.range(0)];
  const size_t k = static_cast<size_t>(state.range(1));
  const Workload& w = workload(k);
  state.SetLabel(name);
  size_t misses = 0;
  for (auto _ : state) {
    auto policy = lazykv::paging::make_replacement_policy(name, 1);
    misses = lazykv::paging::simulate_misses(*policy, w.requests, w.predictions, k);
    benchmark::DoNotOptimize(misses);
  }
  set_counters(state, misses, w);
}
BENCHMARK(BM_Policy)
    ->ArgNames({"policy", "k"})
    ->ArgsProduct({{0, 1, 2}, {1024, 65536}})
    ->Unit(benchmark::kMillisecond);

// The offline optimum's own cost, for scale.
void BM_Belady(benchmark::State& state) {
  const size_t k = static_cast<size_t>(state.range(0));
  const Workload& w = workload(k);
  size_t misses = 0;
  for (auto _ : state) {
    misses = lazykv::paging::belady_misses(w.requests, k);
    benchmark::DoNotOptimize(misses);
  }
  set_counters(state, misses, w);
}
BENCHMARK(BM_Belady)->ArgNames({"k"})->Arg(1024)->Arg(65536)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
