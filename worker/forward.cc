#include "worker/forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "worker/forward_batch.h"

namespace lazykv {
namespace {

void add_bias(float* y, const float* bias, int64_t rows, int64_t n) {
  if (bias == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) cpu::add_inplace(y + r * n, bias, n);
}

template <typename T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

ForwardPass::ForwardPass(const Model& model, KvCache& cache, ThreadPool& pool, cpu::ActivationPrecision precision)
    : owned_shard_(std::make_unique<ModelShard>(model, 0, 1)),
      owned_group_(std::make_unique<SoloGroup>()),
      shard_(*owned_shard_),
      group_(*owned_group_),
      model_(model),
      cache_(cache),
      pool_(pool),
      precision_(precision) {}

ForwardPass::ForwardPass(const ModelShard& shard, TensorParallelGroup& group, KvCache& cache, ThreadPool& pool,
                         cpu::ActivationPrecision precision)
    : shard_(shard), group_(group), model_(shard.model()), cache_(cache), pool_(pool), precision_(precision) {
  if (group.world() != shard.world() || group.rank() != shard.rank()) {
    throw Error(ErrorCode::kInvalidArgument, "forward: a shard for rank " + std::to_string(shard.rank()) + " of " +
                                                 std::to_string(shard.world()) + " in a group where this is rank " +
                                                 std::to_string(group.rank()) + " of " +
                                                 std::to_string(group.world()));
  }
  if (cache.config().n_head_kv != shard.config().n_head_kv) {
    throw Error(ErrorCode::kInvalidArgument, "forward: the KV cache holds " + std::to_string(cache.config().n_head_kv) +
                                                 " heads but the shard has " +
                                                 std::to_string(shard.config().n_head_kv));
  }
}

void ForwardPass::ensure_buffers(int64_t n, int64_t n_logit_rows, int32_t max_slots) {
  const ModelConfig& c = shard_.config();
  const size_t q_dim = size_t(c.n_head) * c.head_dim;
  const size_t kv_dim = size_t(c.n_head_kv) * c.head_dim;
  grow(x_, size_t(n) * c.n_embd);
  grow(xn_, size_t(n) * std::max<size_t>(c.n_embd, q_dim));
  grow(q_, size_t(n) * q_dim);
  grow(k_, size_t(n) * kv_dim);
  grow(v_, size_t(n) * kv_dim);
  grow(attn_, size_t(n) * q_dim);
  grow(tmp_, size_t(n) * c.n_embd);
  grow(gate_, size_t(n) * c.n_ff);
  grow(up_, size_t(n) * c.n_ff);
  grow(logits_, size_t(n_logit_rows) * c.n_vocab);
  grow(k16_, size_t(n) * kv_dim);
  grow(v16_, size_t(n) * kv_dim);
  scores_.resize(size_t(pool_.size()));
  for (auto& s : scores_) grow(s, size_t(c.n_group()) * size_t(max_slots));

  size_t need = 0;
  for (const ShardLayer& layer : shard_.layers()) {
    const LayerWeights& w = layer.w;
    if (layer.wo_input_offset >= 0) grow(wide_, size_t(n) * size_t(w.wo.cols));
    if (layer.down_input_offset >= 0) grow(wide_, size_t(n) * size_t(w.w_down.cols));
    for (const cpu::WeightMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      need = std::max(need, cpu::matmul_scratch_bytes(*m, n, pool_.size(), precision_));
    }
  }
  need = std::max(need, cpu::matmul_scratch_bytes(model_.output(), n_logit_rows, pool_.size(), precision_));
  if (need > scratch_bytes_) {
    scratch_raw_.assign(need + 64, 0);
    const uintptr_t p = reinterpret_cast<uintptr_t>(scratch_raw_.data());
    scratch_ = reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
    scratch_bytes_ = need;
  }
}

void ForwardPass::matmul(const cpu::WeightMatrix& w, const float* x, int64_t rows, float* y) {
  cpu::matmul(w, x, rows, y, scratch_, pool_, precision_);
}

const float* ForwardPass::widen(const float* x, int64_t rows, int64_t width, int64_t full, int64_t offset) {
  std::fill(wide_.begin(), wide_.begin() + rows * full, 0.0f);
  for (int64_t r = 0; r < rows; ++r) std::copy(x + r * width, x + (r + 1) * width, wide_.data() + r * full + offset);
  return wide_.data();
}

std::span<const float> ForwardPass::run(std::span<const BatchItem> batch) {
  const ModelConfig& c = shard_.config();
  const int64_t E = c.n_embd;
  const int D = c.head_dim;
  const int H = c.n_head;
  const int KV = c.n_head_kv;
  const int G = c.n_group();
  const int64_t q_dim = int64_t(H) * D;
  const int64_t kv_dim = int64_t(KV) * D;

  if (batch.empty()) return {};
  const BatchRows rows = check_batch(batch, c, cache_);
  const std::vector<int64_t>& row0 = rows.row0;
  const int64_t n_logit_rows = rows.n_logit_rows;
  const int64_t T = rows.tokens();
  int32_t max_slots = 0;
  for (const BatchItem& item : batch) {
    max_slots = std::max(max_slots, cache_.max_slots(item.seq) + int32_t(item.tokens.size()));
  }
  ensure_buffers(T, n_logit_rows, max_slots);
  // Reserve KV room for every item before any change, so a full cache fails
  // cleanly (pages reserved for earlier items simply stay with them).
  reserve_batch(batch, cache_, group_);
  // Nothing below throws before the appends, so policies and cache stay in step.
  for (const BatchItem& item : batch) {
    if (item.policy != nullptr) item.policy->begin_step(item.start_pos, int32_t(item.tokens.size()));
  }

  const SteeredRows steered = steered_rows(batch, row0);

  // Embedding lookup.
  const cpu::WeightMatrix& embd = model_.token_embd();
  const size_t embd_row = row_bytes(embd.type, size_t(E));
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
      const auto* src = static_cast<const uint8_t*>(embd.data) + size_t(batch[i].tokens[t]) * embd_row;
      cpu::dequantize_row(embd.type, src, x_.data() + (row0[i] + int64_t(t)) * E, E);
    }
  }

  // Per item: cache heads per layer (KV heads, or one per query head when a
  // policy selects per query head) and the query heads each one serves.
  std::vector<int> cache_heads(batch.size()), queries_per_head(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    cache_heads[i] = cache_.heads_per_layer(batch[i].seq);
    queries_per_head[i] = G * KV / cache_heads[i];
  }
  // Work units for attention: (item, cache head, token range). A range is one
  // token, or every token of the item when its policy accumulates statistics
  // over them (those must not race).
  struct AttnUnit { int32_t item; int32_t head; int32_t token_begin; int32_t token_end; };
  std::vector<AttnUnit> units;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int32_t n_tok = int32_t(batch[i].tokens.size());
    const bool serial = batch[i].policy != nullptr && batch[i].policy->serial_prefill();
    for (int32_t t = 0; t < n_tok; t += serial ? n_tok : 1) {
      for (int h = 0; h < cache_heads[i]; ++h) units.push_back({int32_t(i), h, t, serial ? n_tok : t + 1});
    }
  }
  const float scale = 1.0f / std::sqrt(float(D));
  const RopeTable& rope = model_.rope();

  for (int l = 0; l < c.n_layer; ++l) {
    const ShardLayer& layer = shard_.layers()[size_t(l)];
    const LayerWeights& w = layer.w;
    for (int64_t r = 0; r < T; ++r) cpu::rms_norm(x_.data() + r * E, w.attn_norm, xn_.data() + r * E, E, c.rms_eps);
    eviction_seconds_ += observe_layer_inputs(batch, row0, l, xn_.data(), E, pool_);
    matmul(w.wq, xn_.data(), T, q_.data());
    matmul(w.wk, xn_.data(), T, k_.data());
    matmul(w.wv, xn_.data(), T, v_.data());
    add_bias(q_.data(), w.bq, T, q_dim);
    add_bias(k_.data(), w.bk, T, kv_dim);
    add_bias(v_.data(), w.bv, T, kv_dim);
    pool_.parallel_for(T, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const size_t item = size_t(std::upper_bound(row0.begin(), row0.end(), r) - row0.begin() - 1);
        const int64_t pos = batch[item].start_pos + (r - row0[item]);
        cpu::rope(q_.data() + r * q_dim, H, D, c.n_rot, pos, rope.inv_freq.data(), rope.mscale, c.rope_style);
        cpu::rope(k_.data() + r * kv_dim, KV, D, c.n_rot, pos, rope.inv_freq.data(), rope.mscale, c.rope_style);
        cpu::to_f16(k_.data() + r * kv_dim, k16_.data() + r * kv_dim, kv_dim);
        cpu::to_f16(v_.data() + r * kv_dim, v16_.data() + r * kv_dim, kv_dim);
      }
    });
    // Append new K/V; each (item, cache head) appends its tokens in order.
    pool_.parallel_for(int64_t(batch.size()) * KV, 1, [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u) {
        const size_t i = size_t(u / KV);
        const int h = int(u % KV);
        const int copies = cache_heads[i] / KV;  // > 1: GQA expanded for this sequence
        for (int c = 0; c < copies; ++c) {
          for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
            const int64_t r = row0[i] + int64_t(t);
            cache_.append(batch[i].seq, l, h * copies + c, batch[i].start_pos + int32_t(t),
                          k16_.data() + r * kv_dim + int64_t(h) * D, v16_.data() + r * kv_dim + int64_t(h) * D);
          }
        }
      }
    });
    pool_.run([&](int thread, int n_threads) {
      float* scores = scores_[size_t(thread)].data();
      const int64_t n_units = int64_t(units.size());
      for (int64_t u = n_units * thread / n_threads; u < n_units * (thread + 1) / n_threads; ++u) {
        const AttnUnit& au = units[size_t(u)];
        const BatchItem& item = batch[size_t(au.item)];
        const int qph = queries_per_head[size_t(au.item)];
        const cpu::KvPages kv = cache_.view(item.seq, l, au.head);
        const int64_t head0 = int64_t(au.head) * qph;  // first query head served by this cache head
        for (int32_t t = au.token_begin; t < au.token_end; ++t) {
          const int64_t r = row0[size_t(au.item)] + t;
          const int32_t pos = item.start_pos + t;
          const float* q = q_.data() + r * q_dim + head0 * D;
          const cpu::AttentionStats* stats = nullptr;
          if (item.policy != nullptr) {
            stats = item.policy->stats(l, au.head, pos);
            if (float* keep = item.policy->query_buffer(l, au.head, pos)) std::copy(q, q + int64_t(qph) * D, keep);
          }
          cpu::attention_group(q, qph, D, kv, pos, scale, scores, attn_.data() + r * q_dim + head0 * D, nullptr,
                               stats);
        }
      }
    });
    const float* wo_in = layer.wo_input_offset < 0
                             ? attn_.data()
                             : widen(attn_.data(), T, q_dim, w.wo.cols, layer.wo_input_offset);
    matmul(w.wo, wo_in, T, tmp_.data());
    group_.all_reduce_sum(tmp_.data(), size_t(T * E));
    cpu::add_inplace(x_.data(), tmp_.data(), T * E);

    for (int64_t r = 0; r < T; ++r) cpu::rms_norm(x_.data() + r * E, w.ffn_norm, xn_.data() + r * E, E, c.rms_eps);
    matmul(w.w_gate, xn_.data(), T, gate_.data());
    matmul(w.w_up, xn_.data(), T, up_.data());
    pool_.parallel_for(T, 8, [&](int64_t begin, int64_t end) {
      cpu::silu_mul(gate_.data() + begin * c.n_ff, up_.data() + begin * c.n_ff, gate_.data() + begin * c.n_ff,
                    (end - begin) * c.n_ff);
    });
    const float* down_in = layer.down_input_offset < 0
                               ? gate_.data()
                               : widen(gate_.data(), T, c.n_ff, w.w_down.cols, layer.down_input_offset);
    matmul(w.w_down, down_in, T, tmp_.data());
    group_.all_reduce_sum(tmp_.data(), size_t(T * E));
    cpu::add_inplace(x_.data(), tmp_.data(), T * E);
    apply_steering(steered, l, x_.data());
    if (layer_output_hook_) layer_output_hook_(l, {x_.data(), size_t(T * E)});
  }

  // Final norm on the rows that need logits, then the output projection.
  int64_t out_row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n_tok = int64_t(batch[i].tokens.size());
    const int64_t first = batch[i].all_logits ? row0[i] : row0[i] + n_tok - 1;
    for (int64_t r = first; r < row0[i] + n_tok; ++r, ++out_row) {
      cpu::rms_norm(x_.data() + r * E, model_.output_norm(), xn_.data() + out_row * E, E, c.rms_eps);
    }
  }
  matmul(model_.output(), xn_.data(), n_logit_rows, logits_.data());

  // Eviction, after attention saw the full cache: every (item, layer) apart.
  eviction_seconds_ += end_policy_steps(batch, c.n_layer, cache_, pool_, appended_hook_, {xn_.data(), E});
  return {logits_.data(), size_t(n_logit_rows) * size_t(c.n_vocab)};
}

}  // namespace lazykv
