// How many slots a policy's cache heads hold over a generation, from its
// compaction rule alone. Every policy's slot count follows from its budget,
// its period-like parameters and the lengths, not from which tokens it keeps
// (lazy+tiers is modelled as lazy: a promotion takes an evicted slot's
// place). The accuracy harness uses it to match policies at equal mean or
// equal peak KV; a test holds it to the real policies.
#pragma once

#include <cstdint>

#include "common/policy_config.h"

namespace lazykv::eval {

// Per cache head, over the passes that sample a token (the prefill, then
// generated - 1 decode steps): the slots each pass's attention sees, as
// EvictionPolicy::mean_slots and peak_slots count them.
struct KvOccupancy {
  double mean = 0;
  int32_t peak = 0;
};

// For a prompt of prompt_len tokens, prefilled in one pass, and `generated`
// sampled tokens (>= 1). Error(kInternal) for a policy without a model here.
KvOccupancy kv_occupancy(const PolicyConfig& config, int32_t prompt_len, int32_t generated);

}  // namespace lazykv::eval
