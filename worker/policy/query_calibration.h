// Measures a model's query statistics (worker/policy/query_stats.h) over a
// token sequence: the text runs through the forward pass in chunks, and every
// query vector, RoPE undone at its position, adds to its (layer, head)
// means. What `lazykv calibrate` runs.
#pragma once

#include <cstdint>
#include <span>

#include "common/thread_pool.h"
#include "worker/model.h"
#include "worker/policy/query_stats.h"

namespace lazykv {

// tokens: at least 2 and at most the model's training context. Throws
// Error(kInvalidArgument) otherwise, or when the model's RoPE does not turn
// every dimension of the head.
QueryStats measure_query_stats(const Model& model, std::span<const int32_t> tokens, ThreadPool& pool,
                               int32_t chunk = 256);

}  // namespace lazykv
