// The exact matmul path: activations stay f32 and weights are dequantized on
// the fly (to f32, in registers or in a per-thread panel), so results track an
// fp32 reference to rounding error. Written with GCC vector extensions, so the
// same source compiles to AVX-512, AVX2 or scalar code for the target ISA.
//
// - Few tokens (decode): each weight row is streamed once and dequantized in
//   registers block by block, then multiplied with every token's activations
//   (fused for Q4_0, Q4_1, Q8_0, Q4_K and Q6_K; Q4_K and Q6_K for the fewest
//   tokens by kquant_planes.cc on AVX-512 VNNI, else by kquant_rows.cc,
//   instead; F16 and BF16 rows are dequantized into
//   the thread's buffer first). Memory-bound, like the weights' bytes.
// - Many tokens (prefill): a panel of kPanelRows rows is dequantized and
//   transposed into the thread's buffer ([cols][kPanelRows] f32), then an
//   outer-product micro-kernel multiplies it with kTileTokens tokens at a time
//   (broadcast one activation, FMA with kPanelRows weights): compute-bound,
//   no horizontal reductions.
#include "kernels/cpu/matmul_f32.h"

// 64-byte vectors are passed between internal (inlined) functions only, so
// the ABI note GCC gives for them on targets without AVX-512 does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
// GCC 12 reports its own intrinsics' _mm512_undefined_*() operands as
// uninitialized once they are inlined into the K-quant unit decoders.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/fp16.h"
#include "kernels/cpu/compile_time_count.h"
#include "kernels/cpu/kquant_planes.h"
#include "kernels/cpu/kquant_rows.h"
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/quant.h"
#include "kernels/cpu/quant_internal.h"
#include "kernels/cpu/row_chunks.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>

#include "kernels/cpu/hsum_avx.h"
#endif

namespace lazykv::cpu {
namespace {

typedef float v16f __attribute__((vector_size(64)));

constexpr int kPanelRows = 32;   // two 16-float vectors of weights per k
constexpr int kTileTokens = 6;   // 6 tokens x 2 vectors = 12 accumulators

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof(v)); }

inline float hsum(v16f v) {
#if defined(__AVX2__)
  __m256 half[2];
  std::memcpy(half, &v, sizeof(v));
  return cpu::hsum(_mm256_add_ps(half[0], half[1]));
#else
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
#endif
}

#if !defined(__AVX512F__)  // AVX-512 builds look the nibbles up instead (nibbles_dequantized)
// GCC 12 scalarizes vector-extension conversions from bytes, so the block
// unpacking uses intrinsics. Nibbles: lo = low nibbles of 16 bytes (elements
// 0..15), hi = high nibbles (elements 16..31).
inline void nibbles_to_float(const uint8_t* qs, v16f& lo, v16f& hi) {
#if defined(__AVX2__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i q0 = _mm256_cvtepu8_epi32(bytes);
  const __m256i q1 = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
  const __m256i m = _mm256_set1_epi32(0x0F);
  const __m256 parts[4] = {_mm256_cvtepi32_ps(_mm256_and_si256(q0, m)), _mm256_cvtepi32_ps(_mm256_and_si256(q1, m)),
                           _mm256_cvtepi32_ps(_mm256_srli_epi32(q0, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(q1, 4))};
  std::memcpy(&lo, &parts[0], 64);
  std::memcpy(&hi, &parts[2], 64);
#else
  float l[16], h[16];
  for (int i = 0; i < 16; ++i) {
    l[i] = float(qs[i] & 0x0F);
    h[i] = float(qs[i] >> 4);
  }
  std::memcpy(&lo, l, 64);
  std::memcpy(&hi, h, 64);
#endif
}
#endif

// 16 packed-nibble bytes dequantized: lo = q·d_lo + m_lo for the low
// nibbles (16 elements), hi = q·d_hi + m_hi for the high ones. On AVX-512 the
// nibbles index a table of the 16 possible values (made by one FMA), so the
// permute port does what the conversions and the FMAs did on the FMA ports.
inline void nibbles_dequantized(const uint8_t* qs, float d_lo, float m_lo, float d_hi, float m_hi, v16f& lo,
                                v16f& hi) {
#if defined(__AVX512F__)
  const __m512 nibble_values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 values_lo = _mm512_fmadd_ps(nibble_values, _mm512_set1_ps(d_lo), _mm512_set1_ps(m_lo));
  const __m512 values_hi = _mm512_fmadd_ps(nibble_values, _mm512_set1_ps(d_hi), _mm512_set1_ps(m_hi));
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  lo = v16f(_mm512_permutexvar_ps(q, values_lo));  // indexes by the low 4 bits
  hi = v16f(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), values_hi));
#else
  nibbles_to_float(qs, lo, hi);
  lo = lo * d_lo + m_lo;
  hi = hi * d_hi + m_hi;
#endif
}

inline v16f int8_to_float(const int8_t* q) {
#if defined(__AVX512F__)
  return v16f(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)))));
#elif defined(__AVX2__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m256 parts[2] = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)),
                           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)))};
  v16f v;
  std::memcpy(&v, parts, 64);
  return v;
#else
  float f[16];
  for (int i = 0; i < 16; ++i) f[i] = float(q[i]);
  v16f v;
  std::memcpy(&v, f, 64);
  return v;
#endif
}

typedef int32_t v16i __attribute__((vector_size(64)));

// 16 bytes widened to 16 int32 lanes.
inline v16i bytes_to_i32(const uint8_t* p) {
#if defined(__AVX512F__)
  return v16i(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i parts[2] = {_mm256_cvtepu8_epi32(bytes), _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))};
  v16i v;
  std::memcpy(&v, parts, 64);
  return v;
#else
  v16i v;
  for (int i = 0; i < 16; ++i) v[i] = p[i];
  return v;
#endif
}

// The fused formats are dequantized in registers one unit at a time: a unit
// is a whole number of 16-float vectors in element order.
template <DType kType>
constexpr int kUnitElements = kType == DType::kQ4_K ? 64 : kType == DType::kQ6_K ? 128 : 32;

// Bytes of a unit in the row: a unit is a block, or a whole fraction of one.
template <DType kType>
constexpr size_t kUnitBytes = kType == DType::kQ8_0   ? sizeof(BlockQ8_0)
                              : kType == DType::kQ4_0 ? sizeof(BlockQ4_0)
                              : kType == DType::kQ4_1 ? sizeof(BlockQ4_1)
                              : kType == DType::kQ4_K ? sizeof(BlockQ4_K) / 4
                                                      : sizeof(BlockQ6_K) / 2;

// Prefetching pays where a row's work is short (memory-bound: one or two
// tokens); past that it measured neutral to slower.
template <DType kType, int NT>
inline void prefetch_unit_ahead(const uint8_t* row, int64_t u) {
  if constexpr (NT <= 2) prefetch_ahead<kUnitBytes<kType>>(row + u * kUnitBytes<kType>);
}

// Types with a fused kernel; other types are dequantized into a row buffer.
bool is_fused_type(DType type) {
  return type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ8_0 || type == DType::kQ4_K ||
         type == DType::kQ6_K;
}

// Unit u of a weight row as floats: w[i] holds elements u * kUnitElements + 16 i ...
// + 15, with the values of dequantize_row (up to the rounding of a fused
// multiply-add where that formula multiplies and then adds).
template <DType kType>
inline void unit_to_float(const uint8_t* row, int64_t u, v16f* w) {
  if constexpr (kType == DType::kQ8_0) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + u;
    const float d = fp16_to_fp32(blk->d);
    w[0] = int8_to_float(blk->qs) * d;
    w[1] = int8_to_float(blk->qs + 16) * d;
  } else if constexpr (kType == DType::kQ4_0 || kType == DType::kQ4_1) {
    const uint8_t* qs;
    float d, m;
    if constexpr (kType == DType::kQ4_1) {
      const auto* blk = reinterpret_cast<const BlockQ4_1*>(row) + u;
      qs = blk->qs;
      d = fp16_to_fp32(blk->d);
      m = fp16_to_fp32(blk->m);
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + u;
      qs = blk->qs;
      d = fp16_to_fp32(blk->d);
      m = -8.0f * d;
    }
    nibbles_dequantized(qs, d, m, d, m, w[0], w[1]);
  } else if constexpr (kType == DType::kQ4_K) {
    // Unit = one 64-element group of a super-block: sub-block 2g in the low
    // nibbles of its 32 bytes, sub-block 2g + 1 in the high nibbles.
    const auto* blk = reinterpret_cast<const BlockQ4_K*>(row) + u / 4;
    const int group = int(u % 4);
    int sc_lo, m_lo, sc_hi, m_hi;
    q4k_scale_min(2 * group, blk->scales, sc_lo, m_lo);
    q4k_scale_min(2 * group + 1, blk->scales, sc_hi, m_hi);
    const float d = fp16_to_fp32(blk->d), dmin = fp16_to_fp32(blk->dmin);
    const float d_lo = d * float(sc_lo), min_lo = dmin * float(m_lo);
    const float d_hi = d * float(sc_hi), min_hi = dmin * float(m_hi);
    const uint8_t* q = blk->qs + 32 * group;
    nibbles_dequantized(q, d_lo, -min_lo, d_hi, -min_hi, w[0], w[2]);
    nibbles_dequantized(q + 16, d_lo, -min_lo, d_hi, -min_hi, w[1], w[3]);
  } else {
    static_assert(kType == DType::kQ6_K);
    // Unit = one 128-element half of a super-block. Element 32 q + k (quarter
    // q, k < 32) takes 4 low bits from ql (byte k for q = 0, 2; byte 32 + k for
    // q = 1, 3; low nibble for q < 2) and 2 high bits from qh[k] >> 2q; its
    // sub-block of 16 is 2q + k / 16, which is also its vector index here.
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(row) + u / 2;
    const int half = int(u % 2);
    const uint8_t* ql = blk->ql + 64 * half;
    const uint8_t* qh = blk->qh + 32 * half;
    const int8_t* sc = blk->scales + 8 * half;
    const float d = fp16_to_fp32(blk->d);
    for (int k0 = 0; k0 < 2; ++k0) {
      const v16i a = bytes_to_i32(ql + 16 * k0), c = bytes_to_i32(ql + 32 + 16 * k0), h = bytes_to_i32(qh + 16 * k0);
      const v16i quant[4] = {(a & 15) | ((h & 3) << 4), (c & 15) | (((h >> 2) & 3) << 4),
                             (a >> 4) | (((h >> 4) & 3) << 4), (c >> 4) | ((h >> 6) << 4)};
      for (int quarter = 0; quarter < 4; ++quarter) {
        const int v = 2 * quarter + k0;
        w[v] = (d * float(sc[v])) * __builtin_convertvector(quant[quarter] - 32, v16f);
      }
    }
  }
}

// Independent accumulators per token in the row kernels below: with one FMA
// chain per token, few tokens would wait on FMA latency instead of memory.
constexpr int chains_per_token(int n_tok) { return n_tok == 1 ? 4 : n_tok == 2 ? 2 : 1; }

// Dot products of one weight row with NT f32 activation rows; the row is
// dequantized in registers, a unit at a time, and each weight vector is used
// for all NT tokens.
template <DType kType, int NT>
void fused_row(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out) {
  constexpr int kVectors = kUnitElements<kType> / 16;
  constexpr int kChains = chains_per_token(NT);
  constexpr int kUnitsPerStep = kVectors >= kChains ? 1 : kChains / kVectors;  // to feed every chain
  v16f acc[NT][kChains] = {};
  const int64_t n_units = cols / kUnitElements<kType>;
  int64_t u = 0;
  if constexpr (kChains > 1) {
    for (; u + kUnitsPerStep <= n_units; u += kUnitsPerStep) {
      for (int g = 0; g < kUnitsPerStep; ++g) {
        prefetch_unit_ahead<kType, NT>(row, u + g);
        v16f w[kVectors];
        unit_to_float<kType>(row, u + g, w);
        for (int t = 0; t < NT; ++t) {
          const float* xt = x + t * x_stride + (u + g) * kUnitElements<kType>;
          for (int i = 0; i < kVectors; ++i) acc[t][(g * kVectors + i) % kChains] += w[i] * load16(xt + 16 * i);
        }
      }
    }
  }
  // One chain per token (enough of them with NT >= 3), and the units left over.
  for (; u < n_units; ++u) {
    prefetch_unit_ahead<kType, NT>(row, u);
    v16f w[kVectors];
    unit_to_float<kType>(row, u, w);
    for (int t = 0; t < NT; ++t) {
      const float* xt = x + t * x_stride + u * kUnitElements<kType>;
      v16f sum = w[0] * load16(xt);
      for (int i = 1; i < kVectors; ++i) sum += w[i] * load16(xt + 16 * i);
      acc[t][0] += sum;
    }
  }
  for (int t = 0; t < NT; ++t) {
    v16f sum = acc[t][0];
    for (int c = 1; c < kChains; ++c) sum += acc[t][c];
    out[t] = hsum(sum);
  }
}

// Dot products of one f32 row (f32 weights, or a row of another type
// dequantized into the thread's buffer) with NT activation rows: each weight
// vector is loaded once for all NT tokens.
template <int NT>
void f32_row(const float* row, int64_t cols, const float* x, int64_t x_stride, float* out) {
  constexpr int kChains = chains_per_token(NT);
  v16f acc[NT][kChains] = {};
  int64_t k = 0;
  for (; k + 16 * kChains <= cols; k += 16 * kChains) {
    for (int c = 0; c < kChains; ++c) {
      const v16f w = load16(row + k + 16 * c);
      for (int t = 0; t < NT; ++t) acc[t][c] += w * load16(x + t * x_stride + k + 16 * c);
    }
  }
  for (; k + 16 <= cols; k += 16) {
    const v16f w = load16(row + k);
    for (int t = 0; t < NT; ++t) acc[t][0] += w * load16(x + t * x_stride + k);
  }
  for (int t = 0; t < NT; ++t) {
    v16f sum = acc[t][0];
    for (int c = 1; c < kChains; ++c) sum += acc[t][c];
    float s = hsum(sum);
    for (int64_t j = k; j < cols; ++j) s += row[j] * x[t * x_stride + j];
    out[t] = s;
  }
}

// Rows [r_begin, r_end) against n_tok tokens, kFusedMaxTokens at a time: the
// weight row is read from memory once and stays in L1 across the chunks.
void rows_few_tokens(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x, int n_tok, float* y,
                     float* row_buf) {
  const int64_t cols = w.cols;
  const size_t stride = row_bytes(w.type, size_t(cols));
  const auto* base = static_cast<const uint8_t*>(w.data);
  float out[kFusedMaxTokens];
  for (int64_t r = r_begin; r < r_end; ++r) {
    const uint8_t* row = base + size_t(r) * stride;
    if (!is_fused_type(w.type) && w.type != DType::kF32) dequantize_row(w.type, row, row_buf, cols);
    for (int t0 = 0; t0 < n_tok; t0 += kFusedMaxTokens) {
      const int nt = std::min(kFusedMaxTokens, n_tok - t0);
      const float* xc = x + int64_t(t0) * cols;
      with_compile_time_count<kFusedMaxTokens>(nt, [&](auto n) {
        constexpr int NT = decltype(n)::value;
        switch (w.type) {
          case DType::kQ4_0: fused_row<DType::kQ4_0, NT>(row, cols, xc, cols, out); break;
          case DType::kQ4_1: fused_row<DType::kQ4_1, NT>(row, cols, xc, cols, out); break;
          case DType::kQ8_0: fused_row<DType::kQ8_0, NT>(row, cols, xc, cols, out); break;
          case DType::kQ4_K: fused_row<DType::kQ4_K, NT>(row, cols, xc, cols, out); break;
          case DType::kQ6_K: fused_row<DType::kQ6_K, NT>(row, cols, xc, cols, out); break;
          case DType::kF32: f32_row<NT>(reinterpret_cast<const float*>(row), cols, xc, cols, out); break;
          default: f32_row<NT>(row_buf, cols, xc, cols, out); break;
        }
      });
      for (int t = 0; t < nt; ++t) y[int64_t(t0 + t) * w.rows + r] = out[t];
    }
  }
}

// y[t][r0 .. r0+n_rows) for NT tokens from a transposed panel [cols][kPanelRows].
template <int NT>
void panel_tile(const float* panel, int64_t cols, const float* x, int64_t x_stride, float* y, int64_t y_stride,
                int n_rows) {
  v16f acc0[NT] = {}, acc1[NT] = {};
  for (int64_t k = 0; k < cols; ++k) {
    const v16f w0 = load16(panel + k * kPanelRows);
    const v16f w1 = load16(panel + k * kPanelRows + 16);
    for (int t = 0; t < NT; ++t) {
      const float xv = x[t * x_stride + k];
      acc0[t] += xv * w0;
      acc1[t] += xv * w1;
    }
  }
  for (int t = 0; t < NT; ++t) {
    float* yt = y + t * y_stride;
    if (n_rows == kPanelRows) {
      store16(yt, acc0[t]);
      store16(yt + 16, acc1[t]);
    } else {
      float tmp[kPanelRows];
      store16(tmp, acc0[t]);
      store16(tmp + 16, acc1[t]);
      std::memcpy(yt, tmp, size_t(n_rows) * sizeof(float));
    }
  }
}

void panel_tokens(const float* panel, int64_t cols, const float* x, int64_t batch, float* y, int64_t y_stride,
                  int n_rows) {
  int64_t t = 0;
  for (; t + kTileTokens <= batch; t += kTileTokens) {
    panel_tile<kTileTokens>(panel, cols, x + t * cols, cols, y + t * y_stride, y_stride, n_rows);
  }
  if (t == batch) return;
  with_compile_time_count<kTileTokens - 1>(int(batch - t), [&](auto n) {
    panel_tile<decltype(n)::value>(panel, cols, x + t * cols, cols, y + t * y_stride, y_stride, n_rows);
  });
}

// Dequantizes rows [r0, r0 + n_rows) into panel[k][i] (zero-padded to kPanelRows).
void pack_panel(const WeightMatrix& w, int64_t r0, int n_rows, float* panel, float* row_buf) {
  const size_t stride = row_bytes(w.type, size_t(w.cols));
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int i = 0; i < kPanelRows; ++i) {
    if (i < n_rows) {
      dequantize_row(w.type, base + size_t(r0 + i) * stride, row_buf, w.cols);
      for (int64_t k = 0; k < w.cols; ++k) panel[k * kPanelRows + i] = row_buf[k];
    } else {
      for (int64_t k = 0; k < w.cols; ++k) panel[k * kPanelRows + i] = 0.0f;
    }
  }
}

size_t thread_floats(int64_t cols) {
  // panel [cols][kPanelRows] + one row, rounded to 64 bytes; the few-token kernels use the same room
  // for their row buffer, the K-quant rows' 2 * cols floats or the K-quant planes (under 5 * cols
  // bytes a token, kKQuantPlanesMaxTokens = 8 at most)
  return (size_t(cols) * (kPanelRows + 1) + 15) / 16 * 16;
}

}  // namespace

size_t matmul_f32_scratch_bytes(const WeightMatrix& w, int64_t batch, int n_threads) {
  return std::max(thread_floats(w.cols) * sizeof(float) * size_t(std::max(1, n_threads)),
                  matmul_amx_scratch_bytes(w, batch, n_threads));
}

void matmul_f32(const WeightMatrix& w, const float* x, int64_t batch, float* y, float* scratch, ThreadPool& pool) {
  const size_t per_thread = thread_floats(w.cols);
  // Small batches of the 32-element block types (batched decode) also stream
  // rows: dequantizing in registers per 8 tokens beats packing panels up to
  // here. (Not the K-quants: their panels were faster past 8 tokens.)
  const bool streams = w.type == DType::kQ4_0 || w.type == DType::kQ4_1 || w.type == DType::kQ8_0;
  if (batch <= kFusedMaxTokens || (streams && batch <= kFusedStreamMaxTokens)) {
    RowChunks rows(0, w.rows, pool.size());
    pool.run([&](int thread, int) {
      float* buf = scratch + per_thread * size_t(thread);
      if (kquant_planes_take(w.type, int(batch))) {  // kquant_planes.h: Q4_K and Q6_K on AVX-512 VNNI
        kquant_planes_rows(w, rows, x, int(batch), y, w.rows, buf, KQuantPlanes::kExact);
        return;
      }
      if (kquant_rows_take(w.type, int(batch))) {  // kquant_rows.h: Q4_K and Q6_K for the fewest tokens
        kquant_rows_f32(w, rows, x, int(batch), y, w.rows, buf);
        return;
      }
      for (int64_t begin, end; rows.next(begin, end);) rows_few_tokens(w, begin, end, x, int(batch), y, buf);
    });
    return;
  }
  if (matmul_amx_takes(w, batch)) {  // matmul_amx.h: AMX tiles, where the CPU has them
    matmul_amx(w, x, batch, y, scratch, pool);
    return;
  }
  const int64_t n_panels = (w.rows + kPanelRows - 1) / kPanelRows;
  pool.run([&](int thread, int n_threads) {
    float* panel = scratch + per_thread * size_t(thread);
    float* row_buf = panel + size_t(w.cols) * kPanelRows;
    for (int64_t p = n_panels * thread / n_threads; p < n_panels * (thread + 1) / n_threads; ++p) {
      const int64_t r0 = p * kPanelRows;
      const int n_rows = int(std::min<int64_t>(kPanelRows, w.rows - r0));
      pack_panel(w, r0, n_rows, panel, row_buf);
      panel_tokens(panel, w.cols, x, batch, y + r0, w.rows, n_rows);
    }
  });
}

}  // namespace lazykv::cpu
