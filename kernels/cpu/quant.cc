// Row conversions between f32 and the GGML block formats, and the portable
// scalar dot products. The formulas follow GGML's reference implementations
// so GGUF tensors are read bit for bit and activations round the same way.
#include "kernels/cpu/quant.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/quant_internal.h"

namespace lazykv::cpu {
namespace {

// Round half to even, as GGML's nearest_int (default FP rounding mode).
inline int nearest_int(float x) { return static_cast<int>(std::nearbyint(x)); }

void check_multiple(DType type, int64_t n) {
  const size_t block = dtype_traits(type).block_elems;
  if (n < 0 || static_cast<size_t>(n) % block != 0) {
    throw Error(ErrorCode::kInternal, "row of " + std::to_string(n) + " elements is not a multiple of the " +
                                          std::string(dtype_traits(type).name) + " block size");
  }
}

// --- K-quant scale packing -------------------------------------------------

void pack_q4k_scales(const int* scales, const int* mins, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = static_cast<uint8_t>(scales[j]);
      s[j + 4] = static_cast<uint8_t>(mins[j]);
    } else {
      s[j + 4] = static_cast<uint8_t>((scales[j] & 0x0F) | ((mins[j] & 0x0F) << 4));
      s[j - 4] |= static_cast<uint8_t>((scales[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((mins[j] >> 4) << 6);
    }
  }
}

// --- dequantization ----------------------------------------------------------

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>((b[i].qs[j] & 0x0F) - 8);
      y[j + kQK / 2] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    const float m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(b[i].qs[j] & 0x0F) + m;
      y[j + kQK / 2] = d * static_cast<float>(b[i].qs[j] >> 4) + m;
    }
  }
}

template <class Block>
void dequant_q8(const Block* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(b[i].qs[j]);
  }
}

#if defined(__AVX512F__)
// 16 bytes -> 16 int32 lanes.
inline __m512i bytes_to_i32(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// y[16] = q * scale - min, in the scalar code's rounding order (no FMA).
inline void store_affine(float* y, __m512i q, float scale, float min) {
  _mm512_storeu_ps(y, _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale)), _mm512_set1_ps(min)));
}
#endif

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const float dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int group = 0; group < 4; ++group, q += 32, y += 64) {
      int sc_lo, m_lo, sc_hi, m_hi;
      q4k_scale_min(2 * group, b[i].scales, sc_lo, m_lo);
      q4k_scale_min(2 * group + 1, b[i].scales, sc_hi, m_hi);
      const float d_lo = d * static_cast<float>(sc_lo), min_lo = dmin * static_cast<float>(m_lo);
      const float d_hi = d * static_cast<float>(sc_hi), min_hi = dmin * static_cast<float>(m_hi);
#if defined(__AVX512F__)
      const __m512i nibble = _mm512_set1_epi32(0x0F);
      for (int half = 0; half < 2; ++half) {
        const __m512i v = bytes_to_i32(q + 16 * half);
        store_affine(y + 16 * half, _mm512_and_si512(v, nibble), d_lo, min_lo);
        store_affine(y + 32 + 16 * half, _mm512_srli_epi32(v, 4), d_hi, min_hi);
      }
#else
      for (int l = 0; l < 32; ++l) y[l] = d_lo * static_cast<float>(q[l] & 0x0F) - min_lo;
      for (int l = 0; l < 32; ++l) y[32 + l] = d_hi * static_cast<float>(q[l] >> 4) - min_hi;
#endif
    }
  }
}

// The 6-bit quant (0..63) of element l (0..127) of one 128-element half of a
// Q6_K block: ql/qh point at the half's 64 and 32 bytes.
inline int q6k_quant(const uint8_t* ql, const uint8_t* qh, int l) {
  const int quarter = l / 32, k = l % 32;
  const uint8_t low = quarter & 1 ? ql[k + 32] : ql[k];
  const int low4 = quarter < 2 ? (low & 0x0F) : (low >> 4);
  const int high2 = (qh[k] >> (2 * quarter)) & 3;
  return low4 | (high2 << 4);
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int half = 0; half < 2; ++half, y += 128) {
      const uint8_t* ql = b[i].ql + 64 * half;
      const uint8_t* qh = b[i].qh + 32 * half;
      const int8_t* sc = b[i].scales + 8 * half;
#if defined(__AVX512F__)
      // Lanes k0..k0+15 of each quarter; quarter q's sub-block is 2q + k0/16.
      const __m512i low4 = _mm512_set1_epi32(0x0F), two = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
      for (int k0 = 0; k0 < 32; k0 += 16) {
        const __m512i a = bytes_to_i32(ql + k0), c = bytes_to_i32(ql + 32 + k0), h = bytes_to_i32(qh + k0);
        const __m512i quant[4] = {
            _mm512_or_si512(_mm512_and_si512(a, low4), _mm512_slli_epi32(_mm512_and_si512(h, two), 4)),
            _mm512_or_si512(_mm512_and_si512(c, low4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 2), two), 4)),
            _mm512_or_si512(_mm512_srli_epi32(a, 4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, 4), two), 4)),
            _mm512_or_si512(_mm512_srli_epi32(c, 4), _mm512_slli_epi32(_mm512_srli_epi32(h, 6), 4))};
        for (int quarter = 0; quarter < 4; ++quarter) {
          const float ds = d * static_cast<float>(sc[2 * quarter + k0 / 16]);
          _mm512_storeu_ps(y + 32 * quarter + k0,
                           _mm512_mul_ps(_mm512_set1_ps(ds),
                                         _mm512_cvtepi32_ps(_mm512_sub_epi32(quant[quarter], bias))));
        }
      }
#else
      for (int l = 0; l < 128; ++l) {
        // Sub-block of 16 within the half: quarter*2 + (k/16).
        const int sub = (l / 32) * 2 + (l % 32) / 16;
        y[l] = d * static_cast<float>(sc[sub]) * static_cast<float>(q6k_quant(ql, qh, l) - 32);
      }
#endif
    }
  }
}

void dequant_q8_k(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    for (int j = 0; j < kQK_K; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
  }
}

// --- quantization --------------------------------------------------------------

void quant_q4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f, max = 0.0f;  // max: the value of largest magnitude, signed
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQK / 2] * id + 8.5f)));
      b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quant_q4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = x[0], max = x[0];
    for (int j = 1; j < kQK; ++j) { min = std::min(min, x[j]); max = std::max(max, x[j]); }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const int hi = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + kQK / 2] - min) * id + 0.5f)));
      b[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Q8_0 and Q8_1: d = amax/127, q = round(x/d) (half away from zero, as
// GGML's reference roundf). Q8_1 also stores s = d * sum(q).
template <class Block, bool kWithSum>
void quant_q8(const float* x, Block* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      const int q = static_cast<int>(std::round(x[j] * id));
      b[i].qs[j] = static_cast<int8_t>(q);
      sum += q;
    }
    if constexpr (kWithSum) b[i].s = fp32_to_fp16(static_cast<float>(sum) * d);
  }
}

// Q8_K: the signed value of largest magnitude maps to -127 (GGML's scheme),
// d = 1/iscale, plus the sums of each group of 16 quants.
void quant_q8_k(const float* x, BlockQ8_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK_K; ++j) {
      if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
    }
    if (amax == 0.0f) {
      std::memset(&b[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) b[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += b[i].qs[16 * g + j];
      b[i].bsums[g] = static_cast<int16_t>(sum);
    }
    b[i].d = 1.0f / iscale;
  }
}

// A simple Q4_K quantizer: per sub-block of 32, min = min(x, 0) and scale =
// (max - min)/15, then both quantized to 6 bits against the block maxima and
// the quants recomputed from the stored (rounded) scales.
void quant_q4_k(const float* x, BlockQ4_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[8], mins[8];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      float lo = 0.0f, hi = xs[0];
      for (int l = 0; l < 32; ++l) { lo = std::min(lo, xs[l]); hi = std::max(hi, xs[l]); }
      scales[j] = (hi - lo) / 15.0f;
      mins[j] = -lo;
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    int ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
      ls[j] = std::min(63, nearest_int(inv_scale * scales[j]));
      lm[j] = std::min(63, nearest_int(inv_min * mins[j]));
    }
    pack_q4k_scales(ls, lm, b[i].scales);
    b[i].d = fp32_to_fp16(max_scale / 63.0f);
    b[i].dmin = fp32_to_fp16(max_min / 63.0f);
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    uint8_t q[kQK_K];
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(ls[j]);
      const float ml = dmin * static_cast<float>(lm[j]);
      for (int l = 0; l < 32; ++l) {
        const int v = dl != 0.0f ? nearest_int((x[32 * j + l] + ml) / dl) : 0;
        q[32 * j + l] = static_cast<uint8_t>(std::clamp(v, 0, 15));
      }
    }
    for (int group = 0; group < 4; ++group) {
      for (int l = 0; l < 32; ++l) {
        b[i].qs[32 * group + l] = static_cast<uint8_t>(q[64 * group + l] | (q[64 * group + 32 + l] << 4));
      }
    }
  }
}

// A simple Q6_K quantizer: per sub-block of 16 a signed scale mapping the
// value of largest magnitude to -32, scales quantized to int8 against the
// block's largest, quants recomputed from the stored scales.
void quant_q6_k(const float* x, BlockQ6_K* b, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float scales[16];
    float max_abs_scale = 0.0f, max_scale = 0.0f;
    for (int j = 0; j < 16; ++j) {
      float amax = 0.0f, max = 0.0f;
      for (int l = 0; l < 16; ++l) {
        const float v = x[16 * j + l];
        if (std::fabs(v) > amax) { amax = std::fabs(v); max = v; }
      }
      scales[j] = max / -32.0f;
      if (std::fabs(scales[j]) > max_abs_scale) { max_abs_scale = std::fabs(scales[j]); max_scale = scales[j]; }
    }
    if (max_abs_scale == 0.0f) {
      std::memset(&b[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.0f / max_scale;
    b[i].d = fp32_to_fp16(1.0f / iscale);
    const float d = fp16_to_fp32(b[i].d);
    uint8_t q[kQK_K];
    for (int j = 0; j < 16; ++j) {
      b[i].scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[j])));
      const float dl = d * static_cast<float>(b[i].scales[j]);
      for (int l = 0; l < 16; ++l) {
        const int v = dl != 0.0f ? nearest_int(x[16 * j + l] / dl) : 0;
        q[16 * j + l] = static_cast<uint8_t>(std::clamp(v, -32, 31) + 32);
      }
    }
    for (int half = 0; half < 2; ++half) {
      uint8_t* ql = b[i].ql + 64 * half;
      uint8_t* qh = b[i].qh + 32 * half;
      const uint8_t* qq = q + 128 * half;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((qq[l] & 0x0F) | ((qq[l + 64] & 0x0F) << 4));
        ql[l + 32] = static_cast<uint8_t>((qq[l + 32] & 0x0F) | ((qq[l + 96] & 0x0F) << 4));
        qh[l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                     ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

// --- scalar dot products ---------------------------------------------------------

float dot_q4_0_scalar(int64_t nb, const BlockQ4_0* x, const BlockQ8_0* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + kQK / 2];
    }
    sum += static_cast<float>(sumi) * fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d);
  }
  return sum;
}

float dot_q4_1_scalar(int64_t nb, const BlockQ4_1* x, const BlockQ8_1* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      sumi += (x[i].qs[j] & 0x0F) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + kQK / 2];
    }
    sum += fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d) * static_cast<float>(sumi) +
           fp16_to_fp32(x[i].m) * fp16_to_fp32(y[i].s);
  }
  return sum;
}

float dot_q8_0_scalar(int64_t nb, const BlockQ8_0* x, const BlockQ8_0* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    sum += static_cast<float>(sumi) * fp16_to_fp32(x[i].d) * fp16_to_fp32(y[i].d);
  }
  return sum;
}

float dot_q4_k_scalar(int64_t nb, const BlockQ4_K* x, const BlockQ8_K* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sum_q = 0, sum_mins = 0;
    for (int j = 0; j < 8; ++j) {
      int scale, min;
      q4k_scale_min(j, x[i].scales, scale, min);
      const uint8_t* q = x[i].qs + 32 * (j / 2);
      const int shift = (j % 2) * 4;
      int s = 0;
      for (int l = 0; l < 32; ++l) s += ((q[l] >> shift) & 0x0F) * y[i].qs[32 * j + l];
      sum_q += scale * s;
      sum_mins += min * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
    }
    sum += y[i].d * (fp16_to_fp32(x[i].d) * static_cast<float>(sum_q) -
                     fp16_to_fp32(x[i].dmin) * static_cast<float>(sum_mins));
  }
  return sum;
}

float dot_q6_k_scalar(int64_t nb, const BlockQ6_K* x, const BlockQ8_K* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = x[i].ql + 64 * half;
      const uint8_t* qh = x[i].qh + 32 * half;
      const int8_t* sc = x[i].scales + 8 * half;
      const int8_t* q8 = y[i].qs + 128 * half;
      for (int sub = 0; sub < 8; ++sub) {
        const int base = (sub / 2) * 32 + (sub % 2) * 16;
        int s = 0;
        for (int l = 0; l < 16; ++l) s += (q6k_quant(ql, qh, base + l) - 32) * q8[base + l];
        sumi += sc[sub] * s;
      }
    }
    sum += fp16_to_fp32(x[i].d) * y[i].d * static_cast<float>(sumi);
  }
  return sum;
}

template <class Convert>
float dot_float_scalar(int64_t n, Convert weight, const float* y) {
  double sum = 0.0;  // double: this is the reference the SIMD paths are checked against
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(weight(i)) * y[i];
  return static_cast<float>(sum);
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  check_multiple(type, n);
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))));
      }
#endif
      for (; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case DType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= n; i += 16) {  // bf16 is the top half of an f32
        const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
      }
#endif
      for (; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case DType::kQ4_0: return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK);
    case DType::kQ4_1: return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, n / kQK);
    case DType::kQ8_0: return dequant_q8(static_cast<const BlockQ8_0*>(src), dst, n / kQK);
    case DType::kQ8_1: return dequant_q8(static_cast<const BlockQ8_1*>(src), dst, n / kQK);
    case DType::kQ4_K: return dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, n / kQK_K);
    case DType::kQ6_K: return dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, n / kQK_K);
    case DType::kQ8_K: return dequant_q8_k(static_cast<const BlockQ8_K*>(src), dst, n / kQK_K);
  }
  throw Error(ErrorCode::kInternal, "dequantize_row: unknown dtype");
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  check_multiple(type, n);
  switch (type) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::kQ4_0: return quant_q4_0(src, static_cast<BlockQ4_0*>(dst), n / kQK);
    case DType::kQ4_1: return quant_q4_1(src, static_cast<BlockQ4_1*>(dst), n / kQK);
    case DType::kQ8_0: return quant_q8<BlockQ8_0, false>(src, static_cast<BlockQ8_0*>(dst), n / kQK);
    case DType::kQ8_1: return quant_q8<BlockQ8_1, true>(src, static_cast<BlockQ8_1*>(dst), n / kQK);
    case DType::kQ4_K: return quant_q4_k(src, static_cast<BlockQ4_K*>(dst), n / kQK_K);
    case DType::kQ6_K: return quant_q6_k(src, static_cast<BlockQ6_K*>(dst), n / kQK_K);
    case DType::kQ8_K: return quant_q8_k(src, static_cast<BlockQ8_K*>(dst), n / kQK_K);
  }
  throw Error(ErrorCode::kInternal, "quantize_row: unknown dtype");
}

DType vec_dot_type(DType weight_type) {
  switch (weight_type) {
    case DType::kF32: case DType::kF16: case DType::kBF16: return DType::kF32;
    case DType::kQ4_0: case DType::kQ8_0: return DType::kQ8_0;
    case DType::kQ4_1: return DType::kQ8_1;
    case DType::kQ4_K: case DType::kQ6_K: return DType::kQ8_K;
    case DType::kQ8_1: case DType::kQ8_K: break;
  }
  throw Error(ErrorCode::kInternal,
              "no dot product for weights of type " + std::string(dtype_traits(weight_type).name));
}

float vec_dot_scalar(DType weight_type, int64_t n, const void* w, const void* a) {
  switch (weight_type) {
    case DType::kF32: {
      const auto* x = static_cast<const float*>(w);
      return dot_float_scalar(n, [x](int64_t i) { return x[i]; }, static_cast<const float*>(a));
    }
    case DType::kF16: {
      const auto* x = static_cast<const uint16_t*>(w);
      return dot_float_scalar(n, [x](int64_t i) { return fp16_to_fp32(x[i]); }, static_cast<const float*>(a));
    }
    case DType::kBF16: {
      const auto* x = static_cast<const uint16_t*>(w);
      return dot_float_scalar(n, [x](int64_t i) { return bf16_to_fp32(x[i]); }, static_cast<const float*>(a));
    }
    case DType::kQ4_0:
      return dot_q4_0_scalar(n / kQK, static_cast<const BlockQ4_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::kQ4_1:
      return dot_q4_1_scalar(n / kQK, static_cast<const BlockQ4_1*>(w), static_cast<const BlockQ8_1*>(a));
    case DType::kQ8_0:
      return dot_q8_0_scalar(n / kQK, static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::kQ4_K:
      return dot_q4_k_scalar(n / kQK_K, static_cast<const BlockQ4_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::kQ6_K:
      return dot_q6_k_scalar(n / kQK_K, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::kQ8_1: case DType::kQ8_K: break;
  }
  throw Error(ErrorCode::kInternal,
              "no dot product for weights of type " + std::string(dtype_traits(weight_type).name));
}

float vec_dot(DType weight_type, int64_t n, const void* weight_row, const void* act_row) {
  float result;
  if (simd::vec_dot(weight_type, n, weight_row, act_row, result)) return result;
  return vec_dot_scalar(weight_type, n, weight_row, act_row);
}

}  // namespace lazykv::cpu
