// What every forward backend does around its compute, so the CPU and CUDA
// passes take batches and drive policies exactly alike: checking a batch,
// reserving its KV on every rank or none, and the policies' end of step.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/model_config.h"
#include "worker/parallel/group.h"
#include "worker/policy/steering.h"

namespace lazykv {

struct BatchRows {
  std::vector<int64_t> row0;  // item i owns token rows [row0[i], row0[i + 1])
  int64_t n_logit_rows = 0;   // tokens.size() for items with all_logits, else 1
  int64_t tokens() const { return row0.back(); }
};

// Throws Error(kInvalidArgument) for a sequence twice in the batch, an empty
// item, a token id outside the vocabulary, a pass a policy refuses or a policy
// whose head count is not the cache's.
BatchRows check_batch(std::span<const BatchItem> batch, const ModelConfig& config, const KvCache& cache);

// Reserves every item's new slots, then runs `prepare` (a backend's own
// memory for the pass; may be empty). In a group of several ranks all ranks run
// the pass or none does (a rank that went ahead alone would wait in the
// all-reduce for the others): Error(kOutOfMemory) on every rank when any
// rank's cache is full or its `prepare` ran out of memory.
void reserve_batch(std::span<const BatchItem> batch, KvCache& cache, TensorParallelGroup& group,
                   const std::function<void()>& prepare = {});

// Which (host) rows the final hidden states of a pass are in: the output
// norm's rows, one per logit row ([n_logit_rows][dim]).
struct HiddenRows {
  const float* rows = nullptr;
  int64_t dim = 0;
};

// The rows of a pass whose residual after the steering vector's layer gets
// scale x vector (skipkv's activation steering; no rows: none).
struct SteeredRows {
  const SteeringVector* steering = nullptr;
  std::vector<std::pair<int64_t, float>> rows;  // (row, scale)
};
// Asks each decode item's policy (before the pass: after begin_step).
SteeredRows steered_rows(std::span<const BatchItem> batch, const std::vector<int64_t>& row0);
// Adds the steering to x [rows][n_embd] when `layer` is the vector's.
void apply_steering(const SteeredRows& steered, int layer, float* x);

// Hands each item's rows of a layer's attention input xn [rows][n_embd] to
// its policy when the policy reads them (trimkv), before attention. Returns
// the wall seconds the policies took (0 when none reads them).
double observe_layer_inputs(std::span<const BatchItem> batch, const std::vector<int64_t>& row0, int layer,
                          const float* xn, int64_t n_embd, ThreadPool& pool);
// True when an item's policy reads layer inputs (a backend that cannot
// bring them to the host refuses it).
bool wants_layer_input(std::span<const BatchItem> batch);

// True when an item's policy reads hidden states (the backend then has to
// bring them to the host for end_policy_steps).
bool wants_hidden(std::span<const BatchItem> batch);

// After the pass: `appended` (when set), each decode token's hidden state to
// a policy that wants it, then every (item with a policy, layer) apart, in
// parallel. Returns the wall seconds the policies took (0 when no item has
// one).
double end_policy_steps(std::span<const BatchItem> batch, int n_layer, KvCache& cache, ThreadPool& pool,
                        const ForwardBackend::AppendedHook& appended, HiddenRows hidden);

}  // namespace lazykv
