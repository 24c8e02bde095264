#include "worker/forward_batch.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "common/error.h"
#include "worker/policy/policy.h"

namespace lazykv {

BatchRows check_batch(std::span<const BatchItem> batch, const ModelConfig& config, const KvCache& cache) {
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (batch[j].seq == batch[i].seq) {
        throw Error(ErrorCode::kInvalidArgument,
                    "forward: sequence " + std::to_string(batch[i].seq) + " appears twice in one batch");
      }
    }
  }
  BatchRows rows;
  rows.row0.assign(batch.size() + 1, 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].tokens.empty()) throw Error(ErrorCode::kInvalidArgument, "forward: empty batch item");
    for (int32_t t : batch[i].tokens) {
      if (t < 0 || t >= config.n_vocab) {
        throw Error(ErrorCode::kInvalidArgument, "forward: token id " + std::to_string(t) +
                                                     " outside vocabulary of " + std::to_string(config.n_vocab));
      }
    }
    rows.row0[i + 1] = rows.row0[i] + int64_t(batch[i].tokens.size());
    rows.n_logit_rows += batch[i].all_logits ? int64_t(batch[i].tokens.size()) : 1;
  }
  for (const BatchItem& item : batch) {
    if (item.policy == nullptr) continue;
    item.policy->check_pass(item.start_pos, int32_t(item.tokens.size()));
    if (item.policy->heads_per_layer() != cache.heads_per_layer(item.seq)) {
      throw Error(ErrorCode::kInvalidArgument, "forward: sequence " + std::to_string(item.seq) + " caches " +
                                                   std::to_string(cache.heads_per_layer(item.seq)) +
                                                   " heads per layer but its policy needs " +
                                                   std::to_string(item.policy->heads_per_layer()));
    }
  }
  return rows;
}

void reserve_batch(std::span<const BatchItem> batch, KvCache& cache, TensorParallelGroup& group,
                   const std::function<void()>& prepare) {
  const auto reserve = [&] {
    for (const BatchItem& item : batch) cache.reserve(item.seq, int(item.tokens.size()));
    if (prepare) prepare();
  };
  if (group.world() == 1) {
    reserve();
    return;
  }
  float full = 0;
  std::string why;
  try {
    reserve();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kOutOfMemory) throw;
    full = 1;
    why = e.what();
  }
  group.all_reduce_sum(&full, 1);
  if (full > 0) {
    throw Error(ErrorCode::kOutOfMemory, why.empty() ? "forward: another tensor-parallel rank's KV cache is full" : why);
  }
}

SteeredRows steered_rows(std::span<const BatchItem> batch, const std::vector<int64_t>& row0) {
  SteeredRows steered;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& item = batch[i];
    if (item.policy == nullptr || item.policy->shape().steering == nullptr) continue;
    const int32_t n_tok = int32_t(item.tokens.size());
    const int32_t pos = item.start_pos + n_tok - 1;
    if (pos < item.policy->shape().prompt_len) continue;
    const float scale = item.policy->steering_scale(pos, item.tokens.back());
    if (scale == 0.0f) continue;
    steered.steering = item.policy->shape().steering.get();
    steered.rows.emplace_back(row0[i] + n_tok - 1, scale);
  }
  return steered;
}

void apply_steering(const SteeredRows& steered, int layer, float* x) {
  if (steered.rows.empty() || layer != steered.steering->layer) return;
  const int64_t E = steered.steering->n_embd;
  const float* v = steered.steering->vector.data();
  for (const auto& [row, scale] : steered.rows) {
    float* r = x + row * E;
    for (int64_t d = 0; d < E; ++d) r[d] += scale * v[d];
  }
}

double observe_layer_inputs(std::span<const BatchItem> batch, const std::vector<int64_t>& row0, int layer,
                            const float* xn, int64_t n_embd, ThreadPool& pool) {
  if (!wants_layer_input(batch)) return 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& item = batch[i];
    if (item.policy == nullptr || !item.policy->wants_layer_input()) continue;
    item.policy->observe_layer_input(layer, item.start_pos, xn + row0[i] * n_embd, int64_t(item.tokens.size()), pool);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool wants_layer_input(std::span<const BatchItem> batch) {
  return std::any_of(batch.begin(), batch.end(),
                     [](const BatchItem& item) { return item.policy != nullptr && item.policy->wants_layer_input(); });
}

bool wants_hidden(std::span<const BatchItem> batch) {
  return std::any_of(batch.begin(), batch.end(),
                     [](const BatchItem& item) { return item.policy != nullptr && item.policy->wants_hidden(); });
}

namespace {

// Each item's last logit row holds its last token's hidden state; a decode
// token (a generated position) goes to the policy.
void observe_hidden(std::span<const BatchItem> batch, HiddenRows hidden) {
  int64_t row = 0;
  for (const BatchItem& item : batch) {
    const int64_t n_tok = int64_t(item.tokens.size());
    row += item.all_logits ? n_tok : 1;
    if (item.policy == nullptr || !item.policy->wants_hidden()) continue;
    const int32_t pos = item.start_pos + int32_t(n_tok) - 1;
    if (pos < item.policy->shape().prompt_len) continue;
    if (hidden.rows == nullptr) throw Error(ErrorCode::kInternal, "forward: a policy wants hidden states the backend did not keep");
    item.policy->observe_token(pos, item.tokens.back(),
                               {hidden.rows + (row - 1) * hidden.dim, size_t(hidden.dim)});
  }
}

}  // namespace

double end_policy_steps(std::span<const BatchItem> batch, int n_layer, KvCache& cache, ThreadPool& pool,
                        const ForwardBackend::AppendedHook& appended, HiddenRows hidden) {
  if (appended) appended(batch);
  std::vector<size_t> with_policy;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].policy != nullptr) with_policy.push_back(i);
  }
  if (with_policy.empty()) return 0;
  const auto start = std::chrono::steady_clock::now();
  observe_hidden(batch, hidden);
  pool.parallel_for(int64_t(with_policy.size()) * n_layer, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const BatchItem& item = batch[with_policy[size_t(u / n_layer)]];
      item.policy->end_step(int(u % n_layer), cache, item.seq);
    }
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace lazykv
