// Measures a model's steering vector (worker/policy/steering.h) over a text
// of reasoning: the text runs through the forward pass, and at every token
// that ends a thought (a blank line) the residual after `layer` adds to the
// execution mean, or to the reflection mean when the thought held a
// reflection word (token_classes.h). What `lazykv steer` runs.
#pragma once

#include <cstdint>
#include <span>

#include "common/thread_pool.h"
#include "worker/model.h"
#include "worker/policy/steering.h"

namespace lazykv {

// tokens: at most the model's training context; layer in [0, n_layer).
// Throws Error(kInvalidArgument) when the model has no token texts, or when
// the text holds fewer than min_thoughts thoughts of either kind.
SteeringVector measure_steering(const Model& model, std::span<const int32_t> tokens, int layer, ThreadPool& pool,
                                int64_t min_thoughts = 1, int32_t chunk = 256);

}  // namespace lazykv
