#include "worker/forward.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"

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
    : model_(model), cache_(cache), pool_(pool), precision_(precision) {}

void ForwardPass::ensure_buffers(int64_t n, int64_t n_logit_rows, int32_t max_slots) {
  const ModelConfig& c = model_.config();
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
  for (const LayerWeights& w : model_.layers()) {
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

std::span<const float> ForwardPass::run(std::span<const BatchItem> batch) {
  const ModelConfig& c = model_.config();
  const int64_t E = c.n_embd;
  const int D = c.head_dim;
  const int H = c.n_head;
  const int KV = c.n_head_kv;
  const int G = c.n_group();
  const int64_t q_dim = int64_t(H) * D;
  const int64_t kv_dim = int64_t(KV) * D;

  if (batch.empty()) return {};
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (batch[j].seq == batch[i].seq) {
        throw Error(ErrorCode::kInvalidArgument,
                    "forward: sequence " + std::to_string(batch[i].seq) + " appears twice in one batch");
      }
    }
  }
  // Token rows: item i owns rows [row0[i], row0[i] + tokens.size()).
  std::vector<int64_t> row0(batch.size() + 1, 0);
  int64_t n_logit_rows = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].tokens.empty()) throw Error(ErrorCode::kInvalidArgument, "forward: empty batch item");
    for (int32_t t : batch[i].tokens) {
      if (t < 0 || t >= c.n_vocab) {
        throw Error(ErrorCode::kInvalidArgument,
                    "forward: token id " + std::to_string(t) + " outside vocabulary of " + std::to_string(c.n_vocab));
      }
    }
    row0[i + 1] = row0[i] + int64_t(batch[i].tokens.size());
    n_logit_rows += batch[i].all_logits ? int64_t(batch[i].tokens.size()) : 1;
  }
  const int64_t T = row0.back();

  // Reserve KV room for every item before any change, so a full cache fails
  // cleanly (pages reserved for earlier items simply stay with them).
  for (const BatchItem& item : batch) cache_.reserve(item.seq, int(item.tokens.size()));
  int32_t max_slots = 0;
  for (const BatchItem& item : batch) {
    max_slots = std::max(max_slots, cache_.max_slots(item.seq) + int32_t(item.tokens.size()));
  }
  ensure_buffers(T, n_logit_rows, max_slots);

  // Embedding lookup.
  const cpu::WeightMatrix& embd = model_.token_embd();
  const size_t embd_row = row_bytes(embd.type, size_t(E));
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
      const auto* src = static_cast<const uint8_t*>(embd.data) + size_t(batch[i].tokens[t]) * embd_row;
      cpu::dequantize_row(embd.type, src, x_.data() + (row0[i] + int64_t(t)) * E, E);
    }
  }

  // Work units for attention: (item, token, kv head).
  struct AttnUnit { int32_t item; int32_t token; int32_t kv_head; };
  std::vector<AttnUnit> units;
  units.reserve(size_t(T) * KV);
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int32_t t = 0; t < int32_t(batch[i].tokens.size()); ++t) {
      for (int h = 0; h < KV; ++h) units.push_back({int32_t(i), t, h});
    }
  }
  const float scale = 1.0f / std::sqrt(float(D));
  const RopeTable& rope = model_.rope();

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& w = model_.layers()[size_t(l)];
    for (int64_t r = 0; r < T; ++r) cpu::rms_norm(x_.data() + r * E, w.attn_norm, xn_.data() + r * E, E, c.rms_eps);
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
    // Append new K/V; each (item, head) appends its tokens in order.
    pool_.parallel_for(int64_t(batch.size()) * KV, 1, [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u) {
        const size_t i = size_t(u / KV);
        const int h = int(u % KV);
        for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
          const int64_t r = row0[i] + int64_t(t);
          cache_.append(batch[i].seq, l, h, batch[i].start_pos + int32_t(t), k16_.data() + r * kv_dim + int64_t(h) * D,
                        v16_.data() + r * kv_dim + int64_t(h) * D);
        }
      }
    });
    pool_.run([&](int thread, int n_threads) {
      float* scores = scores_[size_t(thread)].data();
      const int64_t n_units = int64_t(units.size());
      for (int64_t u = n_units * thread / n_threads; u < n_units * (thread + 1) / n_threads; ++u) {
        const AttnUnit& au = units[size_t(u)];
        const BatchItem& item = batch[size_t(au.item)];
        const int64_t r = row0[size_t(au.item)] + au.token;
        const cpu::KvPages kv = cache_.view(item.seq, l, au.kv_head);
        const int64_t head0 = int64_t(au.kv_head) * G;
        cpu::attention_group(q_.data() + r * q_dim + head0 * D, G, D, kv, item.start_pos + au.token, scale, scores,
                             attn_.data() + r * q_dim + head0 * D, nullptr);
      }
    });
    matmul(w.wo, attn_.data(), T, tmp_.data());
    cpu::add_inplace(x_.data(), tmp_.data(), T * E);

    for (int64_t r = 0; r < T; ++r) cpu::rms_norm(x_.data() + r * E, w.ffn_norm, xn_.data() + r * E, E, c.rms_eps);
    matmul(w.w_gate, xn_.data(), T, gate_.data());
    matmul(w.w_up, xn_.data(), T, up_.data());
    pool_.parallel_for(T, 8, [&](int64_t begin, int64_t end) {
      cpu::silu_mul(gate_.data() + begin * c.n_ff, up_.data() + begin * c.n_ff, gate_.data() + begin * c.n_ff,
                    (end - begin) * c.n_ff);
    });
    matmul(w.w_down, gate_.data(), T, tmp_.data());
    cpu::add_inplace(x_.data(), tmp_.data(), T * E);
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
  return {logits_.data(), size_t(n_logit_rows) * size_t(c.n_vocab)};
}

}  // namespace lazykv
