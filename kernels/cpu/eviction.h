// Eviction kernels of the CPU backend: policy statistics updates, slot
// scoring, per-head top-k selection and in-place compaction of per-slot
// arrays. Stateless; callers own every buffer. Slot order is position order
// (appends go to the end and compaction preserves order), so "older" means a
// lower slot index.
#pragma once

#include <cstdint>
#include <span>

namespace lazykv::cpu {

// LazyEviction at decode step t, for every slot s with hits[s] != 0:
// mri[s] = max(mri[s], t - last[s]), then last[s] = t.
// hits, last, mri: [n].
void lazy_update(const uint8_t* hits, int32_t* last, int32_t* mri, int32_t n, int32_t t);

// LazyEviction importance at step t, in fp32:
// I = 2/(1+exp(1 + (t-last)/(mri+1e-5))) + (mri == 0 ? 0 : 2/(1+exp(mri-1))).
// last, mri, out: [n].
void lazy_scores(const int32_t* last, const int32_t* mri, int32_t n, int32_t t, float* out);

// The k highest-scoring of slots [0, n), ties broken by the lower index
// (older position), written to keep[k] in increasing index order.
// scores: [n]; keep: [k]; scratch: [n]. Requires 0 <= k <= n.
void top_k_slots(const float* scores, int32_t n, int32_t k, int32_t* keep, int32_t* scratch);

// CAOTE: the attention-output error of evicting each slot alone. With p the
// current query's attention over the slots and o = sum_s p[s] v[s], dropping
// slot s (the others renormalised) moves the output by p[s] / (1 - p[s]) *
// (o - v[s]); out[s] is that vector's L2 norm (+inf when p[s] = 1).
// p, out: [n]; values: [n][head_dim]; o: scratch [head_dim], left holding o.
void caote_scores(const float* p, const float* values, int32_t n, int head_dim, float* o, float* out);

// OBCache (arXiv:2510.07651), joint key-value score: how far pruning slot s
// (its value to zero, its key to zero, that is its logit z to 0) moves a
// query's attention output, to first order: the value term is -p v, the key
// term -z dp/dz = -z p (v - o), so the squared change is
// p^2 * |(1 + z) v - z o|^2, with p = softmax(z) and o = sum_s p v. Adds it to
// acc[s] for every query row; slots a row masks (z = -inf) get nothing.
// logits: [n_q][n] scaled, as attention_logits writes them; values:
// [n][head_dim]; acc: [n]; probs: scratch [n]; o: scratch [head_dim].
void obcache_accumulate(const float* logits, int32_t n_q, const float* values, int32_t n, int head_dim,
                        float* probs, float* o, float* acc);

// Same-length 1-D pooling over a window of `kernel` (odd) slots centred on
// each slot; the window is cut at the ends (padding never counts).
// x, y: [n], must not alias.
void max_pool1d(const float* x, int32_t n, int kernel, float* y);

// Same-length 1-D average over a window of `kernel` (odd) slots centred on
// each slot, zero-padded at the ends: every sum is divided by `kernel`.
// x, y: [n], must not alias.
void avg_pool1d(const float* x, int32_t n, int kernel, float* y);

// Moves a[keep[i]] to a[i] for every i (keep strictly increasing), in place.
template <typename T>
void compact_slots(T* a, std::span<const int32_t> keep) {
  for (size_t i = 0; i < keep.size(); ++i) a[i] = a[keep[i]];
}

}  // namespace lazykv::cpu
