#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/fp16.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>

#include "kernels/cpu/hsum_avx.h"
#endif

namespace lazykv::cpu {
namespace {

// y[n] += w · f16 x[n]
inline void axpy_f16(float* y, float w, const uint16_t* x, int n) {
  int i = 0;
#if defined(__AVX512F__)
  const __m512 vw = _mm512_set1_ps(w);
  for (; i + 16 <= n; i += 16) {
    const __m512 vx = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vw, vx, _mm512_loadu_ps(y + i)));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  const __m256 vw = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) {
    const __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vw, vx, _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += w * fp16_to_fp32(x[i]);
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  double sum = 0.0;  // double: n up to ~10^4 and exactness tests compare against fp32 PyTorch
  for (int64_t i = 0; i < n; ++i) sum += double(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(float(sum / double(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * weight[i];
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

#if defined(__AVX512F__)
namespace {

// e^x for 16 lanes: x = n·ln2 + r with |r| <= ln2/2, e^r by its degree-7
// Taylor polynomial (relative error < 1e-8 before rounding), scaled by 2^n.
// Lanes below -87.3 (including -inf, masked slots) give exactly 0.
inline __m512 exp16(__m512 x) {
  const __m512 underflow = _mm512_set1_ps(-87.3f);
  const __mmask16 live = _mm512_cmp_ps_mask(x, underflow, _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, underflow), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 split in two for exactness
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

}  // namespace
#endif

float softmax_inplace(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__)
  if (n >= 16) {
    __m512 vmax = _mm512_set1_ps(max);
    for (; i + 16 <= n; i += 16) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(x + i));
    max = _mm512_reduce_max_ps(vmax);
  }
#endif
  for (; i < n; ++i) max = std::max(max, x[i]);
  if (max == -std::numeric_limits<float>::infinity()) {  // everything masked
    std::fill(x, x + n, 0.0f);
    return max;
  }
  double sum = 0.0;
  i = 0;
#if defined(__AVX512F__)
  const __m512 vmax = _mm512_set1_ps(max);
  __m512 vsum = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax));
    _mm512_storeu_ps(x + i, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  sum = hsum(vsum);
#endif
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (i = 0; i < n; ++i) x[i] *= inv;
  return max + float(std::log(sum));
}

void rope(float* x, int n_heads, int head_dim, int n_rot, int64_t pos, const float* inv_freq,
          float mscale, RopeStyle style) {
  const int half = n_rot / 2;
  for (int i = 0; i < half; ++i) {
    const float theta = float(pos) * inv_freq[i];
    const float c = std::cos(theta) * mscale;
    const float s = std::sin(theta) * mscale;
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + int64_t(h) * head_dim;
      const RopePair p = rope_pair(style, i, half);
      const float x0 = v[p.re];
      const float x1 = v[p.im];
      v[p.re] = x0 * c - x1 * s;
      v[p.im] = x0 * s + x1 * c;
    }
  }
}

namespace {

// Scores of NQ queries against `count` slots of one page. kp: the page's keys
// [head_dim][page_slots] (slot-contiguous), so 16 slots take one f16 load and
// one FMA per query per dimension, with no horizontal sums.
// q: [NQ][head_dim]; scores: row g at scores + g * row_stride.
template <int NQ>
void page_scores(const float* q, int head_dim, const uint16_t* kp, int32_t page_slots, int32_t count, float scale,
                 float* scores, int64_t row_stride) {
  int32_t c = 0;
#if defined(__AVX512F__)
  for (; c + 16 <= count; c += 16) {
    __m512 acc[NQ];
    for (int g = 0; g < NQ; ++g) acc[g] = _mm512_setzero_ps();
    for (int d = 0; d < head_dim; ++d) {
      const __m512 k = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kp + int64_t(d) * page_slots + c)));
      for (int g = 0; g < NQ; ++g) acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(q[g * head_dim + d]), k, acc[g]);
    }
    for (int g = 0; g < NQ; ++g) _mm512_storeu_ps(scores + g * row_stride + c, _mm512_mul_ps(acc[g], _mm512_set1_ps(scale)));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  for (; c + 8 <= count; c += 8) {
    __m256 acc[NQ];
    for (int g = 0; g < NQ; ++g) acc[g] = _mm256_setzero_ps();
    for (int d = 0; d < head_dim; ++d) {
      const __m256 k =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kp + int64_t(d) * page_slots + c)));
      for (int g = 0; g < NQ; ++g) acc[g] = _mm256_fmadd_ps(_mm256_set1_ps(q[g * head_dim + d]), k, acc[g]);
    }
    for (int g = 0; g < NQ; ++g) _mm256_storeu_ps(scores + g * row_stride + c, _mm256_mul_ps(acc[g], _mm256_set1_ps(scale)));
  }
#endif
  for (; c < count; ++c) {
    for (int g = 0; g < NQ; ++g) {
      float dot = 0.0f;
      for (int d = 0; d < head_dim; ++d) dot += q[g * head_dim + d] * fp16_to_fp32(kp[int64_t(d) * page_slots + c]);
      scores[g * row_stride + c] = scale * dot;
    }
  }
}

#if defined(__AVX512F__)
// out[NQ][16·D16] = Σ_s probs[q][s] · V[s]: the outputs stay in registers
// while the value rows stream by once.
template <int NQ, int D16>
void weighted_values(const float* probs, int64_t row_stride, const KvPages& kv, float* out) {
  __m512 acc[NQ][D16];
  for (int q = 0; q < NQ; ++q) {
    for (int j = 0; j < D16; ++j) acc[q][j] = _mm512_setzero_ps();
  }
  for (int32_t s = 0; s < kv.n_slots; ++s) {
    const uint16_t* v = kv.values[s / kv.page_slots] + int64_t(s % kv.page_slots) * (16 * D16);
    __m512 vf[D16];
    for (int j = 0; j < D16; ++j) {
      vf[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * j)));
    }
    for (int q = 0; q < NQ; ++q) {
      const __m512 p = _mm512_set1_ps(probs[q * row_stride + s]);
      for (int j = 0; j < D16; ++j) acc[q][j] = _mm512_fmadd_ps(p, vf[j], acc[q][j]);
    }
  }
  for (int q = 0; q < NQ; ++q) {
    for (int j = 0; j < D16; ++j) _mm512_storeu_ps(out + q * 16 * D16 + 16 * j, acc[q][j]);
  }
}
#endif

}  // namespace

void record_stats(const float* p, int32_t n, const AttentionStats& stats) {
  if (stats.hits != nullptr) {
    for (int32_t s = 0; s < n; ++s) stats.hits[s] |= uint8_t(p[s] >= stats.alpha);
  }
  if (stats.attn_sum != nullptr) {
    for (int32_t s = 0; s < n; ++s) stats.attn_sum[s] += p[s];
  }
}

void attention_logits(const float* q, int n_group, int head_dim, const KvPages& kv, int64_t max_pos, float scale,
                      float* scores) {
  const int32_t n = kv.n_slots;
  // Pass 1 over K, page by page, at most 4 queries at a time (accumulators
  // stay in registers).
  for (int32_t s0 = 0; s0 < n; s0 += kv.page_slots) {
    const uint16_t* kp = kv.keys[s0 / kv.page_slots];
    const int32_t count = std::min(kv.page_slots, n - s0);
    for (int g0 = 0; g0 < n_group; g0 += 4) {
      const float* qg = q + int64_t(g0) * head_dim;
      float* sg = scores + int64_t(g0) * n + s0;
      switch (std::min(4, n_group - g0)) {
        case 1: page_scores<1>(qg, head_dim, kp, kv.page_slots, count, scale, sg, n); break;
        case 2: page_scores<2>(qg, head_dim, kp, kv.page_slots, count, scale, sg, n); break;
        case 3: page_scores<3>(qg, head_dim, kp, kv.page_slots, count, scale, sg, n); break;
        default: page_scores<4>(qg, head_dim, kp, kv.page_slots, count, scale, sg, n); break;
      }
    }
  }
  // Causal mask: slots holding later positions get no attention.
  for (int32_t s = 0; s < n; ++s) {
    if (kv.positions[s] > max_pos) {
      for (int g = 0; g < n_group; ++g) scores[int64_t(g) * n + s] = -std::numeric_limits<float>::infinity();
    }
  }
}


void attention_probs(const float* q, int n_q, int head_dim, const KvPages& kv, int64_t max_pos, float scale,
                     float* probs) {
  attention_logits(q, n_q, head_dim, kv, max_pos, scale, probs);
  for (int g = 0; g < n_q; ++g) softmax_inplace(probs + int64_t(g) * kv.n_slots, kv.n_slots);
}

void gather_keys(const KvPages& kv, int head_dim, float* out) {
  for (int32_t s = 0; s < kv.n_slots; ++s) {
    const uint16_t* kp = kv.keys[s / kv.page_slots];
    const int32_t c = s % kv.page_slots;
    for (int d = 0; d < head_dim; ++d) out[int64_t(s) * head_dim + d] = fp16_to_fp32(kp[int64_t(d) * kv.page_slots + c]);
  }
}

void gather_values(const KvPages& kv, int head_dim, float* out) {
  for (int32_t s = 0; s < kv.n_slots; ++s) {
    const uint16_t* vp = kv.values[s / kv.page_slots] + int64_t(s % kv.page_slots) * head_dim;
    for (int d = 0; d < head_dim; ++d) out[int64_t(s) * head_dim + d] = fp16_to_fp32(vp[d]);
  }
}

void attention_group(const float* q, int n_group, int head_dim, const KvPages& kv, int64_t max_pos,
                     float scale, float* scores, float* out, float* lse, const AttentionStats* stats) {
  const int32_t n = kv.n_slots;
  attention_logits(q, n_group, head_dim, kv, max_pos, scale, scores);
  for (int g = 0; g < n_group; ++g) {
    float* p = scores + int64_t(g) * n;
    const float l = softmax_inplace(p, n);
    if (lse != nullptr) lse[g] = l;
    if (stats != nullptr) record_stats(p, n, *stats);
  }
  // Pass 2 over V: each value row is loaded once per group of queries.
#if defined(__AVX512F__)
  if (head_dim == 64 || head_dim == 128) {
    for (int g0 = 0; g0 < n_group; g0 += 2) {
      const int nq = std::min(2, n_group - g0);
      if (head_dim == 64) {
        nq == 2 ? weighted_values<2, 4>(scores + int64_t(g0) * n, n, kv, out + int64_t(g0) * 64)
                : weighted_values<1, 4>(scores + int64_t(g0) * n, n, kv, out + int64_t(g0) * 64);
      } else {
        nq == 2 ? weighted_values<2, 8>(scores + int64_t(g0) * n, n, kv, out + int64_t(g0) * 128)
                : weighted_values<1, 8>(scores + int64_t(g0) * n, n, kv, out + int64_t(g0) * 128);
      }
    }
    return;
  }
#endif
  std::fill(out, out + int64_t(n_group) * head_dim, 0.0f);
  for (int32_t s = 0; s < n; ++s) {
    const uint16_t* v = kv.values[s / kv.page_slots] + int64_t(s % kv.page_slots) * head_dim;
    for (int g = 0; g < n_group; ++g) {
      const float p = scores[int64_t(g) * n + s];
      if (p != 0.0f) axpy_f16(out + int64_t(g) * head_dim, p, v, head_dim);
    }
  }
}

void to_f16(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

}  // namespace lazykv::cpu
