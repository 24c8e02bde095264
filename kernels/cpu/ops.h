// Elementwise and attention ops of the CPU backend. Stateless: callers own
// every buffer (kernels never allocate).
#pragma once

#include <cstdint>

namespace lazykv::cpu {

// y[n] = x[n] / rms(x) * weight[n]. x and y may alias.
void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps);

// out[n] = silu(gate[n]) * up[n]. out may alias gate or up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// x[n] += y[n]
void add_inplace(float* x, const float* y, int64_t n);

// In-place softmax over x[n]; returns the log-sum-exp of the input.
float softmax_inplace(float* x, int64_t n);

// Pairs rotated by RoPE: kInterleaved rotates (x[2i], x[2i+1]) (GGUF Llama,
// whose converter permuted Q/K); kNeox rotates (x[i], x[i + n_rot/2]) (HF
// checkpoints and GGUF Qwen2).
enum class RopeStyle { kInterleaved, kNeox };

// The two dims of pair i (of half = n_rot / 2 pairs): the real and imaginary
// parts of the complex number RoPE turns.
struct RopePair {
  int re, im;
};
inline RopePair rope_pair(RopeStyle style, int i, int half) {
  return style == RopeStyle::kInterleaved ? RopePair{2 * i, 2 * i + 1} : RopePair{i, i + half};
}

// Rotates the first n_rot dims of each of n_heads vectors x[n_heads][head_dim]
// at position pos. inv_freq: [n_rot/2] (scaling already folded in);
// mscale multiplies cos and sin (YaRN attention factor, else 1).
void rope(float* x, int n_heads, int head_dim, int n_rot, int64_t pos, const float* inv_freq,
          float mscale, RopeStyle style);

// Attention of a group of query heads that share one KV head, over KV stored
// as f16 in pages. For each query g: out[g] = Σ_s softmax(scale·q[g]·k_s)·v_s
// over the slots s whose position is ≤ max_pos (causal mask).
// Keys are stored transposed within a page (slot-contiguous per dimension) so
// scores for many slots come from vertical FMAs; values row by row.
struct KvPages {
  const uint16_t* const* keys;    // [n_pages] -> [head_dim][page_slots] f16
  const uint16_t* const* values;  // [n_pages] -> [page_slots][head_dim] f16
  const int32_t* positions;       // [n_slots] token position of each slot
  int32_t n_slots;
  int32_t page_slots;
};

// Per-slot statistics for the eviction policies, produced while each row's
// probabilities are still in cache: no second pass over K or V. A slot is hit
// when p = exp(logit - lse) >= alpha for any query of the group.
struct AttentionStats {
  float alpha = 0.0f;
  uint8_t* hits = nullptr;    // [n_slots]: set to 1 on a hit, never cleared here (null: off)
  float* attn_sum = nullptr;  // [n_slots]: += sum over the group of p (null: off)
};

// Adds one query's probabilities p[n] to the statistics (what attention_group
// does for each row): for a backend whose kernel leaves the probabilities
// behind and whose policies run on the host.
void record_stats(const float* p, int32_t n, const AttentionStats& stats);

// q: [n_group][head_dim] f32; out: [n_group][head_dim] f32;
// scores: scratch [n_group][n_slots] f32, left holding the probabilities;
// lse: [n_group] receives each row's log-sum-exp (may be null);
// stats: policy statistics to record (may be null).
void attention_group(const float* q, int n_group, int head_dim, const KvPages& kv, int64_t max_pos,
                     float scale, float* scores, float* out, float* lse, const AttentionStats* stats = nullptr);

// The scaled logits alone: scores[n_q][n_slots] = scale * q k, -inf where the
// slot's position is past max_pos. q: [n_q][head_dim] f32.
void attention_logits(const float* q, int n_q, int head_dim, const KvPages& kv, int64_t max_pos, float scale,
                      float* scores);

// The probabilities alone (no values): probs[n_q][n_slots] = softmax(scale * q k)
// with the causal mask at max_pos. For policies that rescore the cache from
// remembered queries at compression steps. q: [n_q][head_dim] f32.
void attention_probs(const float* q, int n_q, int head_dim, const KvPages& kv, int64_t max_pos, float scale,
                     float* probs);

// Keys of every slot as f32 rows: out[n_slots][head_dim].
void gather_keys(const KvPages& kv, int head_dim, float* out);
// Values of every slot as f32 rows: out[n_slots][head_dim].
void gather_values(const KvPages& kv, int head_dim, float* out);

// Converts n floats to f16.
void to_f16(const float* x, uint16_t* y, int64_t n);

}  // namespace lazykv::cpu
