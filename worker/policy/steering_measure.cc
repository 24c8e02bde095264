#include "worker/policy/steering_measure.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "common/error.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/policy/token_classes.h"

namespace lazykv {

SteeringVector measure_steering(const Model& model, std::span<const int32_t> tokens, int layer, ThreadPool& pool,
                                int64_t min_thoughts, int32_t chunk) {
  const ModelConfig& c = model.config();
  if (model.token_classes() == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "steer: the model carries no token texts to find thoughts in");
  }
  if (layer < 0 || layer >= c.n_layer) {
    throw Error(ErrorCode::kInvalidArgument,
                "steer: layer " + std::to_string(layer) + " is not in [0, " + std::to_string(c.n_layer) + ")");
  }
  if (tokens.empty() || int64_t(tokens.size()) > int64_t(c.n_ctx_train)) {
    throw Error(ErrorCode::kInvalidArgument, "steer: needs between 1 and " + std::to_string(c.n_ctx_train) +
                                                 " tokens, got " + std::to_string(tokens.size()));
  }
  const TokenClasses& classes = *model.token_classes();
  const size_t E = size_t(c.n_embd);
  KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 64, 0});
  ForwardPass forward(model, cache, pool);
  cache.add_sequence(0, c.n_head_kv);
  std::vector<float> residual;  // the chunk's rows after `layer`
  forward.set_layer_output_hook([&](int l, std::span<const float> x) {
    if (l == layer) residual.assign(x.begin(), x.end());
  });

  std::vector<double> sum[2] = {std::vector<double>(E, 0.0), std::vector<double>(E, 0.0)};  // execution, reflection
  int64_t count[2] = {0, 0};
  bool reflects = false, has_text = false;  // of the thought so far (blank lines in a row end one thought)
  uint8_t last_bits = 0;
  for (size_t first = 0; first < tokens.size(); first += size_t(chunk)) {
    const std::span<const int32_t> part = tokens.subspan(first, std::min(size_t(chunk), tokens.size() - first));
    const BatchItem item{0, part, int32_t(first), false, nullptr};
    forward.run({&item, 1});
    for (size_t t = 0; t < part.size(); ++t) {
      const uint8_t bits = token_class(classes, part[t]);
      const bool thought_ends = has_text && ends_thought(last_bits, bits);
      last_bits = bits;
      reflects = reflects || (bits & kReflection);
      has_text = has_text || !(bits & kSentenceEnd);
      if (!thought_ends) continue;
      const float* row = residual.data() + t * E;
      for (size_t d = 0; d < E; ++d) sum[reflects][d] += double(row[d]);
      ++count[reflects];
      reflects = has_text = false;
    }
  }
  if (count[0] < std::max<int64_t>(min_thoughts, 1) || count[1] < std::max<int64_t>(min_thoughts, 1)) {
    throw Error(ErrorCode::kInvalidArgument,
                "steer: the text holds " + std::to_string(count[0]) + " execution and " + std::to_string(count[1]) +
                    " reflection thoughts (blank-line separated; a reflection thought holds a word such as "
                    "\"wait\" or \"verify\"); at least " + std::to_string(std::max<int64_t>(min_thoughts, 1)) +
                    " of each kind are needed");
  }
  SteeringVector s;
  s.model = std::filesystem::path(model.path()).filename().string();
  s.n_layer = c.n_layer;
  s.n_embd = c.n_embd;
  s.layer = layer;
  s.execution = count[0];
  s.reflection = count[1];
  s.vector.resize(E);
  for (size_t d = 0; d < E; ++d) {
    s.vector[d] = float(sum[0][d] / double(count[0]) - sum[1][d] / double(count[1]));
  }
  return s;
}

}  // namespace lazykv
