#include "kernels/cpu/kquant_rows.h"

#if defined(__AVX2__) && defined(__FMA__)

#include <immintrin.h>

#include <algorithm>
#include <array>

#include "common/fp16.h"
#include "kernels/cpu/compile_time_count.h"
#include "kernels/cpu/hsum_avx.h"
#include "kernels/cpu/kquant_avx.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h"

namespace lazykv::cpu {
namespace {

constexpr int kQ4kSubBlock = 32;  // Q4_K: 8 sub-blocks of 32 per super-block, each with a scale and a min

// float(q & 15) for 8 int32 lanes. With AVX-512VL a two-table permute does
// it on the shuffle port, leaving the FMA ports to the multiply-adds.
inline __m256 low_nibble_to_float(__m256i q) {
#if defined(__AVX512VL__)
  const __m256 values_lo = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 values_hi = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
  return _mm256_permutex2var_ps(values_lo, q, values_hi);  // indexes by the low 4 bits
#else
  return _mm256_cvtepi32_ps(_mm256_and_si256(q, _mm256_set1_epi32(15)));
#endif
}

// Sums of each 32-element group of the tokens' activations: [n_tok][cols / 32].
void group_sums(const float* x, int64_t cols, int n_tok, float* sums) {
  const int64_t groups = cols / kQ4kSubBlock;
  for (int t = 0; t < n_tok; ++t) {
    for (int64_t g = 0; g < groups; ++g) {
      const float* p = x + t * cols + g * kQ4kSubBlock;
      const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)),
                                     _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)));
      sums[t * groups + g] = hsum(s);
    }
  }
}

// kRows rows of Q4_K times NT tokens. With few tokens, each sub-block's
// q·x is summed apart and scaled once (fewer multiplies); from 4 tokens the
// converted weights are scaled once and shared by every token instead.
template <int NT, int kRows>
void q4k_tile(const uint8_t* const* rows, int64_t n_blocks, const float* x, int64_t cols, const float* xsum,
              float* out) {
  constexpr bool kPrescale = NT >= 4;
  constexpr int kChains = 2;  // independent accumulators per (row, token): the low and the high nibbles
  const int64_t groups = cols / kQ4kSubBlock;
  __m256 acc[kRows][NT][kChains];
  for (auto& row : acc) {
    for (auto& token : row) {
      for (__m256& a : token) a = _mm256_setzero_ps();
    }
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    alignas(32) float scale[kRows][8];
    for (int i = 0; i < kRows; ++i) {
      const auto* blk = reinterpret_cast<const BlockQ4_K*>(rows[i]) + b;
      prefetch_ahead<sizeof(BlockQ4_K)>(blk);
      alignas(16) uint8_t sc[8], mn[8];
      q4k_scales_mins(blk->scales, sc, mn);
      _mm256_store_ps(scale[i], _mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(blk->d)), u8x8_to_float(sc)));
      const __m256 mins = _mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(blk->dmin)), u8x8_to_float(mn));
      for (int t = 0; t < NT; ++t) {
        __m256& a = acc[i][t][1];
        a = _mm256_fnmadd_ps(mins, _mm256_loadu_ps(xsum + t * groups + b * 8), a);
      }
    }
    // Group g: 32 bytes, sub-block 2g in the low nibbles, 2g + 1 in the high.
    for (int g = 0; g < 4; ++g) {
      __m256 s_lo[kRows], s_hi[kRows];
      for (int i = 0; i < kRows; ++i) {
        s_lo[i] = _mm256_broadcast_ss(&scale[i][2 * g]);
        s_hi[i] = _mm256_broadcast_ss(&scale[i][2 * g + 1]);
      }
      __m256 part[kRows][NT][2];
      if constexpr (!kPrescale) {
        for (auto& row : part) {
          for (auto& token : row) token[0] = token[1] = _mm256_setzero_ps();
        }
      }
      for (int h = 0; h < 4; ++h) {
        const int64_t k = b * kQK_K + 64 * g + 8 * h;
        __m256 x_lo[NT], x_hi[NT];
        for (int t = 0; t < NT; ++t) {
          x_lo[t] = _mm256_loadu_ps(x + t * cols + k);
          x_hi[t] = _mm256_loadu_ps(x + t * cols + k + 32);
        }
        for (int i = 0; i < kRows; ++i) {
          const auto* blk = reinterpret_cast<const BlockQ4_K*>(rows[i]) + b;
          const __m256i q =
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk->qs + 32 * g + 8 * h)));
          __m256 lo = low_nibble_to_float(q);
          __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
          if constexpr (kPrescale) {
            lo = _mm256_mul_ps(lo, s_lo[i]);
            hi = _mm256_mul_ps(hi, s_hi[i]);
          }
          for (int t = 0; t < NT; ++t) {
            if constexpr (kPrescale) {
              acc[i][t][0] = _mm256_fmadd_ps(lo, x_lo[t], acc[i][t][0]);
              acc[i][t][1] = _mm256_fmadd_ps(hi, x_hi[t], acc[i][t][1]);
            } else {
              part[i][t][0] = _mm256_fmadd_ps(lo, x_lo[t], part[i][t][0]);
              part[i][t][1] = _mm256_fmadd_ps(hi, x_hi[t], part[i][t][1]);
            }
          }
        }
      }
      if constexpr (!kPrescale) {
        for (int i = 0; i < kRows; ++i) {
          for (int t = 0; t < NT; ++t) {
            acc[i][t][0] = _mm256_fmadd_ps(s_lo[i], part[i][t][0], acc[i][t][0]);
            acc[i][t][1] = _mm256_fmadd_ps(s_hi[i], part[i][t][1], acc[i][t][1]);
          }
        }
      }
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < NT; ++t) {
      __m256 sum = acc[i][t][0];
      for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[i][t][c]);
      out[i * NT + t] = hsum(sum);
    }
  }
}

// kRows Q6_K rows times NT tokens. Each half super-block's 128 six-bit
// values are assembled as signed bytes (q - 32), 32 at a time, then widened
// 8 at a time. Element 32·quarter + k of a half takes its low 4 bits from
// ql (byte k or 32 + k; the low nibble for quarters 0 and 1) and its top 2
// from qh[k] (bits 2·quarter); its sub-block of 16 is 2·quarter + k / 16.
template <int NT, int kRows>
void q6k_tile(const uint8_t* const* rows, int64_t n_blocks, const float* x, int64_t cols, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32);
  __m256 acc[kRows][NT][2];
  for (auto& row : acc) {
    for (auto& token : row) token[0] = token[1] = _mm256_setzero_ps();
  }
  alignas(32) int8_t values[kRows][4][32];
  for (int64_t b = 0; b < n_blocks; ++b) {
    alignas(32) float scale[kRows][16];
    for (int i = 0; i < kRows; ++i) {
      const auto* blk = reinterpret_cast<const BlockQ6_K*>(rows[i]) + b;
      prefetch_ahead<sizeof(BlockQ6_K)>(blk);
      const __m256 d = _mm256_set1_ps(fp16_to_fp32(blk->d));
      _mm256_store_ps(scale[i], _mm256_mul_ps(d, s8x8_to_float(blk->scales)));
      _mm256_store_ps(scale[i] + 8, _mm256_mul_ps(d, s8x8_to_float(blk->scales + 8)));
    }
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < kRows; ++i) {
        const auto* blk = reinterpret_cast<const BlockQ6_K*>(rows[i]) + b;
        const auto* ql = reinterpret_cast<const __m256i*>(blk->ql + 64 * half);
        const __m256i l0 = _mm256_loadu_si256(ql), l1 = _mm256_loadu_si256(ql + 1);
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * half));
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45)),
            _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(h, bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                            _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45))};
        for (int quarter = 0; quarter < 4; ++quarter) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(values[i][quarter]), _mm256_sub_epi8(q[quarter], offset));
        }
      }
      for (int quarter = 0; quarter < 4; ++quarter) {
        for (int sb = 0; sb < 2; ++sb) {
          const int64_t k = b * kQK_K + 128 * half + 32 * quarter + 16 * sb;
          __m256 x0[NT], x1[NT];
          for (int t = 0; t < NT; ++t) {
            x0[t] = _mm256_loadu_ps(x + t * cols + k);
            x1[t] = _mm256_loadu_ps(x + t * cols + k + 8);
          }
          for (int i = 0; i < kRows; ++i) {
            const __m256 s = _mm256_broadcast_ss(&scale[i][8 * half + 2 * quarter + sb]);
            const __m256 w0 = s8x8_to_float(values[i][quarter] + 16 * sb);
            const __m256 w1 = s8x8_to_float(values[i][quarter] + 16 * sb + 8);
            for (int t = 0; t < NT; ++t) {
              const __m256 part = _mm256_fmadd_ps(w1, x1[t], _mm256_mul_ps(w0, x0[t]));
              acc[i][t][sb] = _mm256_fmadd_ps(s, part, acc[i][t][sb]);
            }
          }
        }
      }
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < NT; ++t) out[i * NT + t] = hsum(_mm256_add_ps(acc[i][t][0], acc[i][t][1]));
  }
}

#if defined(__AVX512F__)
// One token of Q4_K in 512-bit vectors (1.12x the 256-bit tile on the CI
// Xeon, rows streaming from memory). A 64-byte load of packed quants, half a
// super-block, is 16 dwords of 8 nibbles; a float permute looks up
// float(nibble) by the low 4 bits of each dword, so nibble k of all 16 lanes
// is one shift and one permute away, without widening. Lane i of nibble k is
// byte 4i + k/2 (low nibble for even k), so the token's activations are
// permuted once per call into that order. Lanes 0-7 belong to one 64-element
// group and lanes 8-15 to the next, so the even nibbles of a half belong to
// two sub-blocks, as do the odd ones: the scales are applied per half, as a
// vector of two sub-blocks' scales.

// The element (within its super-block) that lane i of nibble k of half h
// multiplies: kQ4kLaneElement[128 h + 16 k + i].
constexpr auto kQ4kLaneElement = [] {
  std::array<uint8_t, kQK_K> element{};
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 8; ++k) {
      for (int i = 0; i < 16; ++i) {
        const int byte = 64 * h + 4 * i + k / 2;  // of the super-block's 128 quant bytes
        const int group = byte / 32;              // 64 elements: bytes 32g.. in both nibbles
        element[128 * h + 16 * k + i] = uint8_t(64 * group + byte % 32 + 32 * (k % 2));
      }
    }
  }
  return element;
}();

void permute_for_lanes(const float* x, int64_t cols, float* x_lanes) {
  for (int64_t b = 0; b < cols; b += kQK_K) {
    for (int j = 0; j < kQK_K; ++j) x_lanes[b + j] = x[b + kQ4kLaneElement[j]];
  }
}

// kRows rows of Q4_K against one token whose activations are x_lanes
// (permute_for_lanes) with group sums xsum.
template <int kRows>
void q4k_tile_avx512(const uint8_t* const* rows, int64_t n_blocks, const float* x_lanes, const float* xsum,
                     float* out) {
  const __m512 nibble_values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 acc[kRows][2];
  __m256 acc_min[kRows];
  for (int i = 0; i < kRows; ++i) {
    acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    acc_min[i] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int i = 0; i < kRows; ++i) {
      const auto* blk = reinterpret_cast<const BlockQ4_K*>(rows[i]) + b;
      prefetch_ahead<sizeof(BlockQ4_K)>(blk);
      alignas(16) uint8_t sc[8], mn[8];
      q4k_scales_mins(blk->scales, sc, mn);
      const __m512 scales =
          _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(blk->d)), u8x8_to_float(sc)));
      const __m256 mins = _mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(blk->dmin)), u8x8_to_float(mn));
      acc_min[i] = _mm256_fmadd_ps(mins, _mm256_loadu_ps(xsum + 8 * b), acc_min[i]);
      for (int h = 0; h < 2; ++h) {
        const __m512i q = _mm512_loadu_si512(blk->qs + 64 * h);
        const float* xh = x_lanes + b * kQK_K + 128 * h;
        __m512 even = _mm512_mul_ps(_mm512_permutexvar_ps(q, nibble_values), _mm512_loadu_ps(xh));
        __m512 odd = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), nibble_values),
                                   _mm512_loadu_ps(xh + 16));
        for (int k = 2; k < 8; k += 2) {
          even = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4 * k), nibble_values),
                                 _mm512_loadu_ps(xh + 16 * k), even);
          odd = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4 * k + 4), nibble_values),
                                _mm512_loadu_ps(xh + 16 * k + 16), odd);
        }
        acc[i][0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(kQ4kScaleLanes[2 * h], scales), even, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(kQ4kScaleLanes[2 * h + 1], scales), odd, acc[i][1]);
      }
    }
  }
  for (int i = 0; i < kRows; ++i) out[i] = hsum(_mm512_add_ps(acc[i][0], acc[i][1])) - hsum(acc_min[i]);
}

void q4k_rows_one_token(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x_lanes,
                        const float* xsum, float* y) {
  const size_t stride = row_bytes(w.type, size_t(w.cols));
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t n_blocks = w.cols / kQK_K;
  int64_t r = r_begin;
  for (; r + 2 <= r_end; r += 2) {  // two rows at a time: two independent streams for the out-of-order core
    const uint8_t* rows[2] = {base + size_t(r) * stride, base + size_t(r + 1) * stride};
    q4k_tile_avx512<2>(rows, n_blocks, x_lanes, xsum, y + r);
  }
  if (r < r_end) {
    const uint8_t* rows[1] = {base + size_t(r) * stride};
    q4k_tile_avx512<1>(rows, n_blocks, x_lanes, xsum, y + r);
  }
}
#endif  // __AVX512F__

template <int NT>
void q4k_rows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x, float* y, int64_t y_stride,
              const float* xsum) {
  const size_t stride = row_bytes(w.type, size_t(w.cols));
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t n_blocks = w.cols / kQK_K;
  float out[2 * NT];
  int64_t r = r_begin;
  if constexpr (NT == 1) {  // two rows at a time: two independent streams for the out-of-order core
    for (; r + 2 <= r_end; r += 2) {
      const uint8_t* rows[2] = {base + size_t(r) * stride, base + size_t(r + 1) * stride};
      q4k_tile<1, 2>(rows, n_blocks, x, w.cols, xsum, out);
      y[r] = out[0];
      y[r + 1] = out[1];
    }
  }
  for (; r < r_end; ++r) {
    const uint8_t* rows[1] = {base + size_t(r) * stride};
    q4k_tile<NT, 1>(rows, n_blocks, x, w.cols, xsum, out);
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = out[t];
  }
}

template <int NT>
void q6k_rows(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x, float* y, int64_t y_stride) {
  const size_t stride = row_bytes(w.type, size_t(w.cols));
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t n_blocks = w.cols / kQK_K;
  float out[2 * NT];
  int64_t r = r_begin;
  if constexpr (NT == 1) {  // two rows at a time, as q4k_rows
    for (; r + 2 <= r_end; r += 2) {
      const uint8_t* rows[2] = {base + size_t(r) * stride, base + size_t(r + 1) * stride};
      q6k_tile<1, 2>(rows, n_blocks, x, w.cols, out);
      y[r] = out[0];
      y[r + 1] = out[1];
    }
  }
  for (; r < r_end; ++r) {
    const uint8_t* rows[1] = {base + size_t(r) * stride};
    q6k_tile<NT, 1>(rows, n_blocks, x, w.cols, out);
    for (int t = 0; t < NT; ++t) y[t * y_stride + r] = out[t];
  }
}

}  // namespace

// Q4_K's group sums, cols / 32 floats a token, fit the first w.cols floats
// of scratch; one token's permuted activations (w.cols floats) follow them.
static_assert(kQ4kRowsMaxTokens <= kQ4kSubBlock);

// The activations prepared once per thread, then the chunks it takes.
void kquant_rows_f32(const WeightMatrix& w, RowChunks& rows, const float* x, int n_tok, float* y, int64_t y_stride,
                     float* scratch, [[maybe_unused]] KQuantRowsWidth width) {
  int64_t begin = 0, end = 0;
  if (w.type == DType::kQ4_K) {
    group_sums(x, w.cols, n_tok, scratch);
#if defined(__AVX512F__)
    if (n_tok == 1 && width == KQuantRowsWidth::kWidest) {
      float* x_lanes = scratch + w.cols / kQ4kSubBlock;
      permute_for_lanes(x, w.cols, x_lanes);
      while (rows.next(begin, end)) q4k_rows_one_token(w, begin, end, x_lanes, scratch, y);
      return;
    }
#endif
    with_compile_time_count<kQ4kRowsMaxTokens>(n_tok, [&](auto n) {
      while (rows.next(begin, end)) q4k_rows<decltype(n)::value>(w, begin, end, x, y, y_stride, scratch);
    });
  } else {
    with_compile_time_count<kQ6kRowsMaxTokens>(n_tok, [&](auto n) {
      while (rows.next(begin, end)) q6k_rows<decltype(n)::value>(w, begin, end, x, y, y_stride);
    });
  }
}

}  // namespace lazykv::cpu

#else  // no AVX2: kHaveKQuantRows is false and nothing calls these

namespace lazykv::cpu {
void kquant_rows_f32(const WeightMatrix&, RowChunks&, const float*, int, float*, int64_t, float*, KQuantRowsWidth) {}
}  // namespace lazykv::cpu

#endif
