// x86 SIMD dot products: AVX-512 (VNNI integer dots on 256-bit registers,
// 512-bit float dots) when the build targets it, AVX2/FMA/F16C otherwise.
// Other CPUs get no SIMD path and fall back to vec_dot_scalar.
//
// Integer blocks: each 32-element block dot is an exact int32 sum (u8 x s8
// multiply-adds), scaled in float per block, as GGML does. Signed weights are
// made unsigned by an offset whose effect, a multiple of the activation
// block's sum, is subtracted again. Single-token tiles (decode) work on groups
// of 8 blocks so scales are applied 8 at a time; multi-token tiles (prefill)
// go block by block, sharing each block's scale work across the tile.
// K-quant super-blocks (Q4_K, Q6_K against Q8_K) are unpacked once per row
// and tile, their sub-block scales applied in int16 (maddubs, then madd).
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h"

#include <algorithm>
#include <utility>

#include "common/fp16.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define LAZYKV_X86_SIMD 1
#include <immintrin.h>

#include "kernels/cpu/hsum_avx.h"
#include "kernels/cpu/prefetch.h"
#endif

// GCC 12 reports false "may be used uninitialized" warnings from inside
// avx512fintrin.h (its _mm512_undefined_* placeholders).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace lazykv::cpu::simd {

#if defined(LAZYKV_X86_SIMD)
namespace {

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr bool kHaveVnni = true;
// acc + Σ u8·s8 over each group of 4 bytes (u must be ≤ 255, exact).
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif defined(__AVXVNNI__)
constexpr bool kHaveVnni = true;
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#else
constexpr bool kHaveVnni = false;
// Exact only while pairs of u·s fit in int16 (u ≤ 128): 4-bit weights.
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
#endif

// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15) in
// the low lane, high nibbles (elements 16..31) in the high lane.
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// The 16-bit halves of each 32-bit lane, packed into 8 words.
inline __m128i low_halves(__m256i v) {
#if defined(__AVX512VL__)
  return _mm256_cvtepi32_epi16(v);
#else
  const __m256i packed = _mm256_shuffle_epi8(
      v, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1,
                          -1, -1, -1, -1, -1, -1, -1));
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
#endif
}
inline __m128i high_halves(__m256i v) { return low_halves(_mm256_srli_epi32(v, 16)); }

// The first 4 bytes of each of `count` (1..8) consecutive blocks of `stride`
// bytes; lanes past `count` are zero. Every block format here starts with its
// fp16 scale d, followed by m (Q4_1) or s (Q8_1).
inline __m256i gather_headers(const uint8_t* first, int stride, int count) {
  const __m256i offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
  const auto* base = reinterpret_cast<const int*>(first);
  if (count == 8) return _mm256_i32gather_epi32(base, offsets, 1);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), base, offsets, mask, 1);
}

// Lane k = the sum of all 8 lanes of v[k].
inline __m256i hsum8(const __m256i v[8]) {
  const __m256i a01 = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i a23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i a45 = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i a67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i b0 = _mm256_hadd_epi32(a01, a23);  // per 128-bit lane: partial sums of v0..v3
  const __m256i b1 = _mm256_hadd_epi32(a45, a67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20), _mm256_permute2x128_si256(b0, b1, 0x31));
}

// --- the 32-element block kinds ---------------------------------------------------
// weights(): the block's quants as bytes; dot(): Σ weights·y as 8 int32
// partial sums; kOffsetShift: the weights() bytes are q + 2^shift (corrected
// with the activation block sums), or -1 for none.

struct KindQ4_0 {
  using WeightBlock = BlockQ4_0;
  using ActBlock = BlockQ8_0;
  static constexpr bool kHasMin = false;
  static constexpr int kOffsetShift = 3;  // x = d*(q-8), q stored as 0..15
  static __m256i weights(const WeightBlock& b) { return unpack_nibbles(b.qs); }
  static __m256i dot(__m256i w, __m256i y) { return dpbusd(_mm256_setzero_si256(), w, y); }
};

struct KindQ4_1 {
  using WeightBlock = BlockQ4_1;
  using ActBlock = BlockQ8_1;
  static constexpr bool kHasMin = true;  // + m * s per block
  static constexpr int kOffsetShift = -1;
  static __m256i weights(const WeightBlock& b) { return unpack_nibbles(b.qs); }
  static __m256i dot(__m256i w, __m256i y) { return dpbusd(_mm256_setzero_si256(), w, y); }
};

struct KindQ8_0 {
  using WeightBlock = BlockQ8_0;
  using ActBlock = BlockQ8_0;
  static constexpr bool kHasMin = false;
  // VNNI: w + 128 as unsigned (a sign-bit flip). AVX2 (maddubs saturates for
  // large unsigned bytes): |w| times y with w's sign, no offset.
  static constexpr int kOffsetShift = kHaveVnni ? 7 : -1;
  static __m256i weights(const WeightBlock& b) {
    const __m256i w = load256(b.qs);
    return kHaveVnni ? _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80))) : w;
  }
  static __m256i dot(__m256i w, __m256i y) {
    if constexpr (kHaveVnni) return dpbusd(_mm256_setzero_si256(), w, y);
    return dpbusd(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(y, w));
  }
};

// One block at a time for R rows x T tokens: each block dot is scaled as soon
// as it is computed. Cheapest per (row, token) pair when T > 1, since the
// per-block scale work is shared by the tile.
template <class Kind, int R, int T>
void dot_tile_blockwise(int64_t nb, const uint8_t* w, size_t ws, const uint8_t* a, size_t as, float* y,
                        size_t ys) {
  using WeightBlock = typename Kind::WeightBlock;
  using ActBlock = typename Kind::ActBlock;
  __m256 acc[R][T];
  __m128 min_acc[R];  // Σ m·s per row, one lane per token
  for (int r = 0; r < R; ++r) {
    min_acc[r] = _mm_setzero_ps();
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i yq[T], bias[T];
    __m256 da[T];
    alignas(16) float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int t = 0; t < T; ++t) {
      const ActBlock& ab = reinterpret_cast<const ActBlock*>(a + t * as)[b];
      yq[t] = load256(ab.qs);
      // Start value -2^shift·Σy cancels the weights' offset.
      bias[t] = Kind::kOffsetShift >= 0
                    ? _mm256_sub_epi32(_mm256_setzero_si256(),
                                       dpbusd(_mm256_setzero_si256(),
                                              _mm256_set1_epi8(static_cast<char>(1 << std::max(Kind::kOffsetShift, 0))),
                                              yq[t]))
                    : _mm256_setzero_si256();
      da[t] = _mm256_set1_ps(fp16_to_fp32(ab.d));
      if constexpr (Kind::kHasMin) sa[t] = fp16_to_fp32(ab.s);
    }
    const __m128 s_vec = _mm_load_ps(sa);
    for (int r = 0; r < R; ++r) {
      const WeightBlock& wb = reinterpret_cast<const WeightBlock*>(w + r * ws)[b];
      const __m256i wq = Kind::weights(wb);
      const __m256 dw = _mm256_set1_ps(fp16_to_fp32(wb.d));
      for (int t = 0; t < T; ++t) {
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_add_epi32(bias[t], Kind::dot(wq, yq[t])));
        acc[r][t] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dw, da[t]), acc[r][t]);
      }
      if constexpr (Kind::kHasMin) {
        min_acc[r] = _mm_fmadd_ps(_mm_set1_ps(fp16_to_fp32(wb.m)), s_vec, min_acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(16) float mins[4];
    _mm_store_ps(mins, min_acc[r]);
    for (int t = 0; t < T; ++t) y[t * ys + r] = hsum(acc[r][t]) + mins[t];
  }
}

// One group of up to 8 consecutive blocks (kFull: exactly 8) for R weight
// rows x T tokens. The 8 block dots of a (row, token) pair are reduced to one
// vector with lane k = block k, so scales are applied 8 blocks at a time.
template <class Kind, int R, int T, bool kFull>
inline void dot_group(int count, const uint8_t* w, size_t ws, const uint8_t* a, size_t as, __m256 (&acc)[R][T]) {
  using WeightBlock = typename Kind::WeightBlock;
  using ActBlock = typename Kind::ActBlock;
  const int n = kFull ? 8 : count;
  __m256 da[T], sa[T];
  __m256i offset[T];
  for (int t = 0; t < T; ++t) {
    const auto* ab = reinterpret_cast<const ActBlock*>(a + t * as);
    const __m256i headers = gather_headers(a + t * as, sizeof(ActBlock), n);
    da[t] = _mm256_cvtph_ps(low_halves(headers));
    if constexpr (Kind::kHasMin) sa[t] = _mm256_cvtph_ps(high_halves(headers));
    if constexpr (Kind::kOffsetShift >= 0) {
      __m256i sums[8];
      for (int k = 0; k < 8; ++k) {
        sums[k] = (kFull || k < n) ? dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(1), load256(ab[k].qs))
                                   : _mm256_setzero_si256();
      }
      offset[t] = _mm256_slli_epi32(hsum8(sums), Kind::kOffsetShift);
    }
  }
  for (int r = 0; r < R; ++r) {
    const auto* wb = reinterpret_cast<const WeightBlock*>(w + r * ws);
    const __m256i headers = gather_headers(w + r * ws, sizeof(WeightBlock), n);
    const __m256 dw = _mm256_cvtph_ps(low_halves(headers));
    __m256 mw;
    if constexpr (Kind::kHasMin) mw = _mm256_cvtph_ps(high_halves(headers));
    __m256i wq[8];
    for (int k = 0; k < 8; ++k) wq[k] = (kFull || k < n) ? Kind::weights(wb[k]) : _mm256_setzero_si256();
    for (int t = 0; t < T; ++t) {
      const auto* ab = reinterpret_cast<const ActBlock*>(a + t * as);
      __m256i dots[8];
      for (int k = 0; k < 8; ++k) dots[k] = (kFull || k < n) ? Kind::dot(wq[k], load256(ab[k].qs)) : _mm256_setzero_si256();
      __m256i sums = hsum8(dots);
      if constexpr (Kind::kOffsetShift >= 0) sums = _mm256_sub_epi32(sums, offset[t]);
      acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dw, da[t]), acc[r][t]);
      if constexpr (Kind::kHasMin) acc[r][t] = _mm256_fmadd_ps(mw, sa[t], acc[r][t]);
    }
  }
}

// Groups of 8 blocks: the single-token (decode) kernel, where the scale
// work of every block would otherwise fall on one (row, token) pair.
template <class Kind, int R, int T>
void dot_tile_grouped(int64_t nb, const uint8_t* w, size_t ws, const uint8_t* a, size_t as, float* y, size_t ys) {
  constexpr size_t kWeightBlock = sizeof(typename Kind::WeightBlock);
  constexpr size_t kActBlock = sizeof(typename Kind::ActBlock);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    for (int r = 0; r < R; ++r) prefetch_ahead<8 * kWeightBlock>(w + r * ws + b * kWeightBlock);
    dot_group<Kind, R, T, true>(8, w + b * kWeightBlock, ws, a + b * kActBlock, as, acc);
  }
  if (b < nb) {
    for (int r = 0; r < R; ++r) prefetch_ahead<8 * kWeightBlock>(w + r * ws + b * kWeightBlock);
    dot_group<Kind, R, T, false>(static_cast<int>(nb - b), w + b * kWeightBlock, ws, a + b * kActBlock, as, acc);
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) y[t * ys + r] = hsum(acc[r][t]);
  }
}

// --- K-quants (AVX2 maddubs; 4- and 6-bit quants never saturate) ------------
// A weight row's super-block is unpacked once (quants as bytes, scales as
// int16 vectors) and multiplied with every token of the tile. Each (row,
// token) pair sums as a one-pair dot would, so a tile's outputs equal
// vec_dot's bit for bit.

// Q4_K: sub-block j (32 elements) has scale and min j; group g's 32 bytes
// hold sub-block 2g in the low nibbles and 2g + 1 in the high ones.
struct Q4kUnpacked {
  using WeightBlock = BlockQ4_K;
  __m256i q[8];      // sub-block j's quants as bytes 0..15
  __m256i scale[8];  // sub-block j's scale in every int16
  int min[8];
  float d, dmin;

  void load(const BlockQ4_K& x) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 8; ++j) {
      int sc;
      q4k_scale_min(j, x.scales, sc, min[j]);
      scale[j] = _mm256_set1_epi16(static_cast<int16_t>(sc));
    }
    for (int g = 0; g < 4; ++g) {
      const __m256i packed = load256(x.qs + 32 * g);
      q[2 * g] = _mm256_and_si256(packed, low4);
      q[2 * g + 1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    }
    d = fp16_to_fp32(x.d);
    dmin = fp16_to_fp32(x.dmin);
  }
  // acc += d·Σ sc·q·y; offset += dmin·Σ min·y (subtracted at the end).
  void accumulate(const BlockQ8_K& y, __m256& acc, float& offset) const {
    int sum_mins = 0;
    for (int j = 0; j < 8; ++j) sum_mins += min[j] * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
    offset += dmin * y.d * static_cast<float>(sum_mins);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], load256(y.qs + 32 * j)), scale[j]));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * y.d), _mm256_cvtepi32_ps(sumi), acc);
  }
};

// Q6_K: quants stored +32, 0..63 as bytes; 32 elements k of a half take
// sub-blocks 2k and 2k + 1 (16 each).
struct Q6kUnpacked {
  using WeightBlock = BlockQ6_K;
  __m256i q[8];      // elements 32k..32k+31 of the super-block
  __m256i scale[8];  // their two sub-blocks' scales: int16 lanes 0-7 and 8-15
  const int8_t* scales;
  float d;

  void load(const BlockQ6_K& x) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i low2 = _mm256_set1_epi8(0x03);
    for (int half = 0; half < 2; ++half) {
      const __m256i ql0 = load256(x.ql + 64 * half);
      const __m256i ql1 = load256(x.ql + 64 * half + 32);
      const __m256i qh = load256(x.qh + 32 * half);
      __m256i* out = q + 4 * half;
      out[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4));
      out[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4));
      out[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4));
      out[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4));
    }
    for (int k = 0; k < 8; ++k) {
      scale[k] = _mm256_set_m128i(_mm_set1_epi16(x.scales[2 * k + 1]), _mm_set1_epi16(x.scales[2 * k]));
    }
    scales = x.scales;
    d = fp16_to_fp32(x.d);
  }
  // Σ sc·(q-32)·y = Σ sc·q·y - 32·Σ sc·bsum: acc takes the first, offset the second.
  void accumulate(const BlockQ8_K& y, __m256& acc, float& offset) const {
    const float dy = d * y.d;
    int sum_offsets = 0;
    for (int j = 0; j < 16; ++j) sum_offsets += scales[j] * y.bsums[j];
    offset += dy * static_cast<float>(32 * sum_offsets);
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], load256(y.qs + 32 * k)), scale[k]));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dy), _mm256_cvtepi32_ps(sumi), acc);
  }
};

template <class Unpacked, int R, int T>
void dot_tile_k_quant(int64_t nb, const uint8_t* w, size_t ws, const uint8_t* a, size_t as, float* y, size_t ys) {
  using WeightBlock = typename Unpacked::WeightBlock;
  __m256 acc[R][T];
  float offset[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm256_setzero_ps();
      offset[r][t] = 0.0f;
    }
  }
  Unpacked u[R];
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const WeightBlock* blk = reinterpret_cast<const WeightBlock*>(w + r * ws) + b;
      prefetch_ahead<sizeof(WeightBlock)>(blk);
      u[r].load(*blk);
    }
    for (int t = 0; t < T; ++t) {
      const BlockQ8_K& yb = reinterpret_cast<const BlockQ8_K*>(a + t * as)[b];
      for (int r = 0; r < R; ++r) u[r].accumulate(yb, acc[r][t], offset[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) y[t * ys + r] = hsum(acc[r][t]) - offset[r][t];
  }
}

// One token (decode): row after row, each streamed once, one super-block
// unpacked at a time instead of a block of every row of the tile.
template <class Unpacked, int R>
void dot_rows_k_quant(int64_t nb, const uint8_t* w, size_t ws, const uint8_t* a, size_t as, float* y, size_t ys) {
  for (int r = 0; r < R; ++r) dot_tile_k_quant<Unpacked, 1, 1>(nb, w + r * ws, ws, a, as, y + r, ys);
}

using TileFn = void (*)(int64_t, const uint8_t*, size_t, const uint8_t*, size_t, float*, size_t);

// The kernel for R rows x T tokens: one token goes block group by block
// group (32-element kinds) or row by row (K-quants); more share the blocks.
template <class Kind, int R, int T>
constexpr TileFn tile_kernel() {
  if constexpr (requires { typename Kind::ActBlock; }) {
    return T == 1 ? &dot_tile_grouped<Kind, R, 1> : &dot_tile_blockwise<Kind, R, T>;
  } else {
    return T == 1 ? &dot_rows_k_quant<Kind, R> : &dot_tile_k_quant<Kind, R, T>;
  }
}

template <class Kind, int R, int... Ts>
constexpr void fill_row(TileFn* row, std::integer_sequence<int, Ts...>) {
  ((row[Ts] = tile_kernel<Kind, R, Ts + 1>()), ...);
}

template <class Kind, int... Rs>
constexpr void fill_table(TileFn (&fns)[kTileRows][kTileTokens], std::integer_sequence<int, Rs...>) {
  (fill_row<Kind, Rs + 1>(fns[Rs], std::make_integer_sequence<int, kTileTokens>()), ...);
}

// fns[rows - 1][tokens - 1]: the kernel for that tile shape.
template <class Kind>
struct TileTable {
  TileFn fns[kTileRows][kTileTokens];
  constexpr TileTable() : fns{} { fill_table<Kind>(fns, std::make_integer_sequence<int, kTileRows>()); }
};

constexpr TileTable<KindQ4_0> kTilesQ4_0;
constexpr TileTable<KindQ4_1> kTilesQ4_1;
constexpr TileTable<KindQ8_0> kTilesQ8_0;
constexpr TileTable<Q4kUnpacked> kTilesQ4_K;
constexpr TileTable<Q6kUnpacked> kTilesQ6_K;

// --- float weights against f32 activations -----------------------------------------

#if defined(__AVX512F__)
inline __m512 load16_f32(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16_f16(const uint16_t* p) { return _mm512_cvtph_ps(load256(p)); }
inline __m512 load16_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load256(p)), 16));
}

template <class Weight, class Load, class ToFloat>
float dot_float(int64_t n, const Weight* w, const float* y, Load load16, ToFloat to_float) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(load16(w + i), _mm512_loadu_ps(y + i), acc0);
    acc1 = _mm512_fmadd_ps(load16(w + i + 16), _mm512_loadu_ps(y + i + 16), acc1);
  }
  for (; i + 16 <= n; i += 16) acc0 = _mm512_fmadd_ps(load16(w + i), _mm512_loadu_ps(y + i), acc0);
  float sum = hsum(_mm512_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += to_float(w[i]) * y[i];
  return sum;
}
#else
inline __m256 load8_f32(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

template <class Weight, class Load, class ToFloat>
float dot_float(int64_t n, const Weight* w, const float* y, Load load8, ToFloat to_float) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(y + i), acc0);
    acc1 = _mm256_fmadd_ps(load8(w + i + 8), _mm256_loadu_ps(y + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(y + i), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) sum += to_float(w[i]) * y[i];
  return sum;
}
#endif

float identity(float x) { return x; }

}  // namespace

bool vec_dot(DType weight_type, int64_t n, const void* w, const void* a, float& result) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  switch (weight_type) {
    case DType::kQ4_0:
      kTilesQ4_0.fns[0][0](n / kQK, wb, 0, ab, 0, &result, 1);
      return true;
    case DType::kQ4_1:
      kTilesQ4_1.fns[0][0](n / kQK, wb, 0, ab, 0, &result, 1);
      return true;
    case DType::kQ8_0:
      kTilesQ8_0.fns[0][0](n / kQK, wb, 0, ab, 0, &result, 1);
      return true;
    case DType::kQ4_K:
      kTilesQ4_K.fns[0][0](n / kQK_K, wb, 0, ab, 0, &result, 1);
      return true;
    case DType::kQ6_K:
      kTilesQ6_K.fns[0][0](n / kQK_K, wb, 0, ab, 0, &result, 1);
      return true;
#if defined(__AVX512F__)
    case DType::kF32:
      result = dot_float(n, static_cast<const float*>(w), static_cast<const float*>(a), load16_f32, identity);
      return true;
    case DType::kF16:
      result = dot_float(n, static_cast<const uint16_t*>(w), static_cast<const float*>(a), load16_f16, fp16_to_fp32);
      return true;
    case DType::kBF16:
      result = dot_float(n, static_cast<const uint16_t*>(w), static_cast<const float*>(a), load16_bf16, bf16_to_fp32);
      return true;
#else
    case DType::kF32:
      result = dot_float(n, static_cast<const float*>(w), static_cast<const float*>(a), load8_f32, identity);
      return true;
    case DType::kF16:
      result = dot_float(n, static_cast<const uint16_t*>(w), static_cast<const float*>(a), load8_f16, fp16_to_fp32);
      return true;
    case DType::kBF16:
      result = dot_float(n, static_cast<const uint16_t*>(w), static_cast<const float*>(a), load8_bf16, bf16_to_fp32);
      return true;
#endif
    default:
      return false;
  }
}

bool has_dot_tile(DType weight_type) {
  return weight_type == DType::kQ4_0 || weight_type == DType::kQ4_1 || weight_type == DType::kQ8_0 ||
         weight_type == DType::kQ4_K || weight_type == DType::kQ6_K;
}

void dot_tile(DType weight_type, int64_t n, const uint8_t* weights, size_t weight_stride, int rows,
              const uint8_t* acts, size_t act_stride, int tokens, float* y, size_t y_stride) {
  TileFn fn = nullptr;
  switch (weight_type) {
    case DType::kQ4_0: fn = kTilesQ4_0.fns[rows - 1][tokens - 1]; break;
    case DType::kQ4_1: fn = kTilesQ4_1.fns[rows - 1][tokens - 1]; break;
    case DType::kQ8_0: fn = kTilesQ8_0.fns[rows - 1][tokens - 1]; break;
    case DType::kQ4_K: fn = kTilesQ4_K.fns[rows - 1][tokens - 1]; break;
    case DType::kQ6_K: fn = kTilesQ6_K.fns[rows - 1][tokens - 1]; break;
    default: return;
  }
  fn(n / dtype_traits(weight_type).block_elems, weights, weight_stride, acts, act_stride, y, y_stride);
}

#else  // no x86 SIMD in this build

bool vec_dot(DType, int64_t, const void*, const void*, float&) { return false; }
bool has_dot_tile(DType) { return false; }
void dot_tile(DType, int64_t, const uint8_t*, size_t, int, const uint8_t*, size_t, int, float*, size_t) {}

#endif

}  // namespace lazykv::cpu::simd
