#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/fp16.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace lazykv::cpu {
namespace {

// a[n] · f16 b[n]
inline float dot_f32_f16(const float* a, const uint16_t* b, int n) {
  int i = 0;
  float sum = 0.0f;
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 vb = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)));
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), vb, acc);
  }
  sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__) && defined(__F16C__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), vb, acc);
  }
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  sum = _mm_cvtss_f32(s);
#endif
  for (; i < n; ++i) sum += a[i] * fp16_to_fp32(b[i]);
  return sum;
}

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

float softmax_inplace(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  if (max == -std::numeric_limits<float>::infinity()) {  // everything masked
    std::fill(x, x + n, 0.0f);
    return max;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
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
      const int a = style == RopeStyle::kInterleaved ? 2 * i : i;
      const int b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
      const float x0 = v[a];
      const float x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

void attention_group(const float* q, int n_group, int head_dim, const KvPages& kv, int64_t max_pos,
                     float scale, float* scores, float* out, float* lse) {
  const int32_t n = kv.n_slots;
  // Pass 1 over K: each key row is loaded once for the whole query group.
  for (int32_t s = 0; s < n; ++s) {
    const uint16_t* k = kv.keys[s / kv.page_slots] + int64_t(s % kv.page_slots) * head_dim;
    const bool visible = kv.positions[s] <= max_pos;
    for (int g = 0; g < n_group; ++g) {
      scores[int64_t(g) * n + s] = visible ? scale * dot_f32_f16(q + int64_t(g) * head_dim, k, head_dim)
                                           : -std::numeric_limits<float>::infinity();
    }
  }
  for (int g = 0; g < n_group; ++g) {
    const float l = softmax_inplace(scores + int64_t(g) * n, n);
    if (lse != nullptr) lse[g] = l;
  }
  // Pass 2 over V.
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
