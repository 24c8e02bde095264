#include "kernels/cpu/kquant_planes.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)

#include <immintrin.h>

// GCC 12 reports its own intrinsics' _mm512_undefined_*() operands as
// uninitialized once they are inlined (the extracts and casts here).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "common/fp16.h"
#include "kernels/cpu/compile_time_count.h"
#include "kernels/cpu/hsum_avx.h"
#include "kernels/cpu/kquant_avx.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h"

namespace lazykv::cpu {
namespace {

constexpr int kChunk = 32;                          // the unit of the planes' element order
constexpr int kBlockChunks = kQK_K / kChunk;        // 8 a super-block

// The weight of the last plane in a combined plane dot: 2^-7 per plane after the first.
constexpr float plane_unit(int planes) { return planes == 3 ? 1.0f / (128.0f * 128.0f) : 1.0f; }

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// One token's activations in scratch: its planes, the s of each sub-block
// of the weight type (that of the chunk of 32 its elements are in) and the
// exact sums the mins or offsets need.
struct TokenPlanes {
  static constexpr int kScalesPerBlock = 16;  // Q6_K's sub-blocks of 16; Q4_K uses the first 8

  int8_t* planes = nullptr;    // [blocks][n_planes][kQK_K], chunks in the weight type's vector order
  float* sub_scale = nullptr;  // [blocks][16]: s · plane_unit of the sub-block's chunk, in sub-block order
  float* sums = nullptr;       // Q4_K: per 32 elements; Q6_K: per 16; in element order

  static size_t plane_bytes(int64_t cols, int n_planes) { return align64(size_t(cols) * size_t(n_planes)); }
  static size_t scale_bytes(int64_t cols) { return align64(size_t(cols) / kQK_K * kScalesPerBlock * sizeof(float)); }
  static size_t sum_bytes(int64_t cols) { return align64(size_t(cols) / 16 * sizeof(float)); }
  static size_t bytes(int64_t cols, int n_planes) {
    return plane_bytes(cols, n_planes) + scale_bytes(cols) + sum_bytes(cols);
  }

  TokenPlanes() = default;
  TokenPlanes(uint8_t* base, int64_t cols, int n_planes)
      : planes(reinterpret_cast<int8_t*>(base)),
        sub_scale(reinterpret_cast<float*>(base + plane_bytes(cols, n_planes))),
        sums(reinterpret_cast<float*>(base + plane_bytes(cols, n_planes) + scale_bytes(cols))) {}
};

// Splits 32 activations into kPlanes planes, each kQK_K bytes from the
// last, and returns their s: max(|x|, at_least) / 127; with one plane,
// first_sums gets the sums of its two halves of 16. A non-finite activation makes
// s NaN, so the outputs it reaches are NaN, as an f32 dot's would be.
template <int kPlanes>
float split_chunk(const float* x, float at_least, int8_t* planes, float* first_sums) {
  const __m512 v[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
  const __m512 a0 = _mm512_abs_ps(v[0]), a1 = _mm512_abs_ps(v[1]);
  const __m512 inf = _mm512_set1_ps(INFINITY);
  const bool non_finite = _mm512_cmp_ps_mask(a0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(a1, inf, _CMP_NLT_UQ);
  const float m = std::max(at_least, _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)));
  const float inv_m = 127.0f / m;  // inf for m = 0 or below 127 / FLT_MAX: the chunk is zero then
  const __m512 inv = _mm512_set1_ps(inv_m < INFINITY && !non_finite ? inv_m : 0.0f);
  for (int i = 0; i < 2; ++i) {
    __m512 t = _mm512_mul_ps(v[i], inv);
    for (int k = 0; k < kPlanes; ++k) {
      const __m512 a = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      if (kPlanes == 1) first_sums[i] = hsum(a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(planes + k * kQK_K + 16 * i),
                       _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(a)));
      t = _mm512_mul_ps(_mm512_sub_ps(t, a), _mm512_set1_ps(128.0f));
    }
  }
  return non_finite ? NAN : m / 127.0f;
}

// Lane i of weight vector v multiplies bytes 4i..4i+3 of that vector of the
// super-block; the planes hold, at vector v, the 64 activations those bytes
// meet: chunk kChunkOrder[c] of the super-block at chunk position c.
// kSumElems is also the sub-block: one scale (and Q4_K min) per kSumElems weights.
struct Q4kLayout {
  using Block = BlockQ4_K;
  static constexpr int kChunkOrder[kBlockChunks] = {0, 2, 1, 3, 4, 6, 5, 7};  // a half's low nibbles, then high
  static constexpr int kSumElems = 32;
  static constexpr const ScaleLanes& kLanes = kQ4kScaleLanes;
};
struct Q6kLayout {
  using Block = BlockQ6_K;
  static constexpr int kChunkOrder[kBlockChunks] = {0, 1, 2, 3, 4, 5, 6, 7};
  static constexpr int kSumElems = 16;
  static constexpr const ScaleLanes& kLanes = kQ6kScaleLanes;
};

// One plane (int8) takes one s per super-block and sums the rounded
// activations for the mins and offsets, as llama.cpp's Q8_K and its bsums;
// three (exact) take one s per chunk of 32, so that an outlier costs
// precision in its own chunk only (the error is relative to the chunk's
// largest value), and the exact sums of x.
template <class Layout, int kPlanes>
void split_token(const float* x, int64_t cols, TokenPlanes tok) {
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    constexpr int kSubBlocks = kQK_K / Layout::kSumElems;  // Q4_K's 8 leave lanes 8-15 multiplied, never read
    std::fill_n(tok.sub_scale + b * TokenPlanes::kScalesPerBlock + kSubBlocks, TokenPlanes::kScalesPerBlock - kSubBlocks,
                0.0f);
    float block_max = 0.0f;
    if constexpr (kPlanes == 1) {
      __m512 amax = _mm512_setzero_ps();
      for (int i = 0; i < kQK_K; i += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(xb + i)));
      block_max = _mm512_reduce_max_ps(amax);
    }
    for (int c = 0; c < kBlockChunks; ++c) {
      const int chunk = Layout::kChunkOrder[c];
      float rounded[2];
      const float s = split_chunk<kPlanes>(xb + chunk * kChunk, block_max,
                                           tok.planes + b * kPlanes * kQK_K + c * kChunk, rounded);
      constexpr int kPerChunk = kChunk / Layout::kSumElems;  // sub-blocks in a chunk: 1 (Q4_K) or 2 (Q6_K)
      std::fill_n(tok.sub_scale + b * TokenPlanes::kScalesPerBlock + chunk * kPerChunk, kPerChunk,
                  s * plane_unit(kPlanes));
      if constexpr (kPlanes == 1) {
        float* sums = tok.sums + (b * kQK_K + chunk * kChunk) / Layout::kSumElems;
        if constexpr (Layout::kSumElems == 32) {
          sums[0] = s * (rounded[0] + rounded[1]);
        } else {
          sums[0] = s * rounded[0];
          sums[1] = s * rounded[1];
        }
      }
    }
  }
  if constexpr (kPlanes > 1) {
    for (int64_t e = 0; e < cols; e += Layout::kSumElems) {
      __m512 s = _mm512_loadu_ps(x + e);
      if constexpr (Layout::kSumElems == 32) s = _mm512_add_ps(s, _mm512_loadu_ps(x + e + 16));
      tok.sums[e / Layout::kSumElems] = hsum(s);
    }
  }
}

// Per int32 lane: Σ over its 4 bytes of q·(a1·2^14 + a2·2^7 + a3) (or q·a1
// with one plane), exact: q <= 63 keeps it under 4·63·(127·2^14 + 64·2^7 + 64) < 2^30.
template <int kPlanes>
inline __m512i plane_dot(__m512i q, const int8_t* p) {
  __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_loadu_si512(p));
  for (int k = 1; k < kPlanes; ++k) {
    acc = _mm512_dpbusd_epi32(_mm512_slli_epi32(acc, 7), q, _mm512_loadu_si512(p + k * kQK_K));
  }
  return acc;
}

// A weight super-block made ready for plane_dot: four 64-byte vectors of
// unsigned quants, the sub-block scales in sub-block order (Q4_K: 8, the
// upper lanes zero; Q6_K: 16), and the weights of the activation sums to
// take off (Q4_K: dmin·min per 32; Q6_K: 32·d·scale per 16).
struct UnpackedBlock {
  __m512i q[4];
  __m512 sub_scale;
  __m512 correction;
};

// The scale of each lane of the four weight vectors, from per-sub-block scales.
template <class Layout>
inline void lane_scales(__m512 sub_scale, __m512 (&lane)[4]) {
  for (int v = 0; v < 4; ++v) lane[v] = _mm512_permutexvar_ps(Layout::kLanes[v], sub_scale);
}

inline void unpack(const BlockQ4_K& blk, UnpackedBlock& u) {
  alignas(16) uint8_t sc[8], mn[8];
  q4k_scales_mins(blk.scales, sc, mn);
  u.sub_scale = _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(blk.d)), u8x8_to_float(sc)));
  u.correction = _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_set1_ps(fp16_to_fp32(blk.dmin)), u8x8_to_float(mn)));
  // Vector 2h + n: half h's 64 bytes, low (n = 0) or high nibbles (kQ4kScaleLanes).
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int h = 0; h < 2; ++h) {
    const __m512i packed = _mm512_loadu_si512(blk.qs + 64 * h);
    u.q[2 * h] = _mm512_and_si512(packed, low4);
    u.q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low4);
  }
}

inline void unpack(const BlockQ6_K& blk, UnpackedBlock& u) {
  u.sub_scale = _mm512_mul_ps(_mm512_set1_ps(fp16_to_fp32(blk.d)),
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)))));
  u.correction = _mm512_mul_ps(u.sub_scale, _mm512_set1_ps(32.0f));
  // Vector 2·half + n: elements 64n..64n+63 of the half, in order, 4 lanes a
  // sub-block of 16. Low 4 bits from ql (low nibbles for n = 0), top 2 from
  // qh: bits 0-1 and 2-3 of qh[k] for elements k and 32 + k, 4-5 and 6-7 for
  // 64 + k and 96 + k.
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  for (int half = 0; half < 2; ++half) {
    const __m512i ql = _mm512_loadu_si512(blk.ql + 64 * half);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * half));
    const __m512i top_lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(qh, 4)), _mm256_slli_epi16(qh, 2), 1);
    const __m512i top_hi = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    u.q[2 * half] = _mm512_or_si512(_mm512_and_si512(ql, low4), _mm512_and_si512(top_lo, bits45));
    u.q[2 * half + 1] =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), _mm512_and_si512(top_hi, bits45));
  }
}

inline __m512 load_sums(const float* p, int count) {
  return count == 16 ? _mm512_loadu_ps(p) : _mm512_zextps256_ps512(_mm256_loadu_ps(p));
}

// Σ over the four weight vectors of their plane dots, each lane scaled.
template <int kPlanes>
inline __m512 scaled_dots(const UnpackedBlock& u, const int8_t* planes, const __m512 (&lane_scale)[4]) {
  __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(plane_dot<kPlanes>(u.q[0], planes)), lane_scale[0]);
  for (int v = 1; v < 4; ++v) {
    part = _mm512_fmadd_ps(_mm512_cvtepi32_ps(plane_dot<kPlanes>(u.q[v], planes + 64 * v)), lane_scale[v], part);
  }
  return part;
}

// kRows rows against NT tokens.
template <class Layout, int kPlanes, int NT, int kRows, size_t kAhead>
void tile(const uint8_t* first_row, size_t row_stride, int64_t n_blocks, const TokenPlanes* tok, float* out,
          int64_t out_stride) {
  using Block = typename Layout::Block;
  constexpr int kSums = kQK_K / Layout::kSumElems;
  constexpr int kScales = TokenPlanes::kScalesPerBlock;
  __m512 acc[kRows][NT];
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < NT; ++t) acc[i][t] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (int i = 0; i < kRows; ++i) {
      const auto* blk = reinterpret_cast<const Block*>(first_row + size_t(i) * row_stride) + b;
      prefetch_ahead<sizeof(Block), kAhead>(blk);
      UnpackedBlock u;
      unpack(*blk, u);
      __m512 lane_scale[4];
      if constexpr (kPlanes == 1) lane_scales<Layout>(u.sub_scale, lane_scale);
      for (int t = 0; t < NT; ++t) {
        const int8_t* planes = tok[t].planes + b * kPlanes * kQK_K;
        const float* sub_scale = tok[t].sub_scale + b * kScales;
        __m512 part;
        if constexpr (kPlanes == 1) {  // one s for the super-block: applied once
          part = _mm512_mul_ps(scaled_dots<kPlanes>(u, planes, lane_scale), _mm512_set1_ps(sub_scale[0]));
        } else {  // an s per chunk: folded into the sub-block scales before they are spread over lanes
          lane_scales<Layout>(_mm512_mul_ps(u.sub_scale, _mm512_load_ps(sub_scale)), lane_scale);
          part = scaled_dots<kPlanes>(u, planes, lane_scale);
        }
        part = _mm512_fnmadd_ps(u.correction, load_sums(tok[t].sums + b * kSums, kSums), part);
        acc[i][t] = _mm512_add_ps(acc[i][t], part);
      }
    }
  }
  for (int i = 0; i < kRows; ++i) {
    for (int t = 0; t < NT; ++t) out[t * out_stride + i] = hsum(acc[i][t]);
  }
}

// Rows [r_begin, r_end), kRows at a time.
template <class Layout, int kPlanes, int NT, int kRows, size_t kAhead>
void tiles(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const TokenPlanes* tok, float* y,
           int64_t y_stride) {
  const size_t stride = row_bytes(w.type, size_t(w.cols));
  const auto* base = static_cast<const uint8_t*>(w.data);
  const int64_t n_blocks = w.cols / kQK_K;
  int64_t r = r_begin;
  for (; r + kRows <= r_end; r += kRows) {
    tile<Layout, kPlanes, NT, kRows, kAhead>(base + size_t(r) * stride, stride, n_blocks, tok, y + r, y_stride);
  }
  for (; r < r_end; ++r) {
    tile<Layout, kPlanes, NT, 1, kAhead>(base + size_t(r) * stride, stride, n_blocks, tok, y + r, y_stride);
  }
}

template <class Layout, int kPlanes, int NT>
void rows_of(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const TokenPlanes* tok, float* y,
             int64_t y_stride) {
  // Rows per tile and prefetch distance, as measured (bench/matmul_bench, 1.5B rows from memory, 2 vCPUs
  // of a Zen 4): one row and 4 KiB fastest but for exact Q6_K, the heaviest to unpack, on long rows:
  // the MLP down rows (35 blocks) took 466-515 us two at a time with 8 KiB, 553-570 one at a time;
  // the output projection's (6 blocks) 10.4 ms two at a time, 5.5 ms one at a time.
  constexpr bool kWide = std::is_same_v<Layout, Q6kLayout> && kPlanes == 3 && NT <= 4;  // (more tokens: the
  constexpr int64_t kWideMinBlocks = 16;  // accumulators of two rows fill the registers)
  if constexpr (kWide) {
    if (w.cols / kQK_K >= kWideMinBlocks) {
      tiles<Layout, kPlanes, NT, 2, 2 * kPrefetchAhead>(w, r_begin, r_end, tok, y, y_stride);
      return;
    }
  }
  tiles<Layout, kPlanes, NT, 1, kPrefetchAhead>(w, r_begin, r_end, tok, y, y_stride);
}

// The tokens split once per thread, then the chunks it takes.
template <class Layout, int kPlanes>
void run(const WeightMatrix& w, RowChunks& rows, const float* x, int n_tok, float* y, int64_t y_stride,
         uint8_t* scratch) {
  TokenPlanes tok[kKQuantPlanesMaxTokens];
  for (int t = 0; t < n_tok; ++t) {
    tok[t] = TokenPlanes(scratch + size_t(t) * TokenPlanes::bytes(w.cols, kPlanes), w.cols, kPlanes);
    split_token<Layout, kPlanes>(x + t * w.cols, w.cols, tok[t]);
  }
  with_compile_time_count<kKQuantPlanesMaxTokens>(n_tok, [&](auto n) {
    for (int64_t begin, end; rows.next(begin, end);) {
      rows_of<Layout, kPlanes, decltype(n)::value>(w, begin, end, tok, y, y_stride);
    }
  });
}

template <class Layout>
void run(const WeightMatrix& w, RowChunks& rows, const float* x, int n_tok, float* y, int64_t y_stride,
         uint8_t* scratch, KQuantPlanes planes) {
  if (planes == KQuantPlanes::kExact) {
    run<Layout, 3>(w, rows, x, n_tok, y, y_stride, scratch);
  } else {
    run<Layout, 1>(w, rows, x, n_tok, y, y_stride, scratch);
  }
}

}  // namespace

size_t kquant_planes_scratch_bytes(int64_t cols, int n_tok, KQuantPlanes planes) {
  return TokenPlanes::bytes(cols, int(planes)) * size_t(n_tok);
}

void kquant_planes_rows(const WeightMatrix& w, RowChunks& rows, const float* x, int n_tok, float* y,
                        int64_t y_stride, void* scratch, KQuantPlanes planes) {
  auto* bytes = static_cast<uint8_t*>(scratch);
  if (w.type == DType::kQ4_K) {
    run<Q4kLayout>(w, rows, x, n_tok, y, y_stride, bytes, planes);
  } else {
    run<Q6kLayout>(w, rows, x, n_tok, y, y_stride, bytes, planes);
  }
}

}  // namespace lazykv::cpu

#else  // no AVX-512 VNNI: kHaveKQuantPlanes is false and nothing calls these

namespace lazykv::cpu {
size_t kquant_planes_scratch_bytes(int64_t, int, KQuantPlanes) { return 0; }
void kquant_planes_rows(const WeightMatrix&, RowChunks&, const float*, int, float*, int64_t, void*, KQuantPlanes) {}
}  // namespace lazykv::cpu

#endif
