// The exact matmul path: activations stay f32 and weights are dequantized on
// the fly (to f32, in registers or in a per-thread panel), so results track an
// fp32 reference to rounding error. Written with GCC vector extensions, so the
// same source compiles to AVX-512, AVX2 or scalar code for the target ISA.
//
// - Few tokens (decode): each weight row is streamed once and dequantized in
//   registers block by block, then multiplied with every token's activations
//   (fused for Q4_0, Q4_1 and Q8_0; other types dequantize one row into the
//   thread's buffer first). Memory-bound, like the weights' bytes.
// - Many tokens (prefill): a panel of kPanelRows rows is dequantized and
//   transposed into the thread's buffer ([cols][kPanelRows] f32), then an
//   outer-product micro-kernel multiplies it with kTileTokens tokens at a time
//   (broadcast one activation, FMA with kPanelRows weights): compute-bound,
//   no horizontal reductions.
#include "kernels/cpu/matmul_f32.h"

// 64-byte vectors are passed between internal (inlined) functions only, so
// the ABI note GCC gives for them on targets without AVX-512 does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <algorithm>
#include <cstring>

#include "common/fp16.h"
#include "kernels/cpu/quant.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
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
  // (Not _mm512_reduce_add_ps: GCC 12 flags its own header as uninitialized.)
  __m256 half[2];
  std::memcpy(half, &v, sizeof(v));
  const __m256 s8 = _mm256_add_ps(half[0], half[1]);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
#else
  float s = 0.0f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
#endif
}

// GCC 12 scalarizes vector-extension conversions from bytes, so the block
// unpacking uses intrinsics. Nibbles: lo = low nibbles of 16 bytes (elements
// 0..15), hi = high nibbles (elements 16..31).
inline void nibbles_to_float(const uint8_t* qs, v16f& lo, v16f& hi) {
#if defined(__AVX512F__)
  const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  lo = v16f(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(0x0F))));
  hi = v16f(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)));
#elif defined(__AVX2__)
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

// One Q4_0/Q4_1/Q8_0 block dequantized to 32 floats in two vectors.
template <DType kType>
inline void block_to_float(const uint8_t* row, int64_t b, v16f& lo, v16f& hi) {
  if constexpr (kType == DType::kQ8_0) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    const float d = fp16_to_fp32(blk->d);
    lo = int8_to_float(blk->qs) * d;
    hi = int8_to_float(blk->qs + 16) * d;
  } else {
    const uint8_t* qs;
    float d, m;
    if constexpr (kType == DType::kQ4_1) {
      const auto* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
      qs = blk->qs;
      d = fp16_to_fp32(blk->d);
      m = fp16_to_fp32(blk->m);
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      qs = blk->qs;
      d = fp16_to_fp32(blk->d);
      m = -8.0f * d;
    }
    nibbles_to_float(qs, lo, hi);
    lo = lo * d + m;
    hi = hi * d + m;
  }
}

// Dot products of one weight row with NT f32 activation rows; the row's blocks
// are dequantized in registers. With few tokens the FMA chains would be
// latency-bound, so each token gets kChains independent accumulators.
template <DType kType, int NT>
void fused_row(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out) {
  constexpr int kChains = NT == 1 ? 4 : NT == 2 ? 2 : 1;
  v16f acc[NT][kChains] = {};
  const int64_t n_blocks = cols / 32;
  int64_t b = 0;
  if constexpr (kChains >= 2) {
    for (; b + kChains / 2 <= n_blocks; b += kChains / 2) {
      for (int c = 0; c < kChains / 2; ++c) {
        v16f lo, hi;
        block_to_float<kType>(row, b + c, lo, hi);
        for (int t = 0; t < NT; ++t) {
          const float* xt = x + t * x_stride + (b + c) * 32;
          acc[t][2 * c] += lo * load16(xt);
          acc[t][2 * c + 1] += hi * load16(xt + 16);
        }
      }
    }
  }
  for (; b < n_blocks; ++b) {
    v16f lo, hi;
    block_to_float<kType>(row, b, lo, hi);
    for (int t = 0; t < NT; ++t) {
      const float* xt = x + t * x_stride + b * 32;
      acc[t][0] += lo * load16(xt) + hi * load16(xt + 16);
    }
  }
  for (int t = 0; t < NT; ++t) {
    v16f sum = acc[t][0];
    for (int c = 1; c < kChains; ++c) sum += acc[t][c];
    out[t] = hsum(sum);
  }
}

template <DType kType>
void fused_row_dispatch(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, int n_tok, float* out) {
  switch (n_tok) {
    case 1: fused_row<kType, 1>(row, cols, x, x_stride, out); break;
    case 2: fused_row<kType, 2>(row, cols, x, x_stride, out); break;
    case 3: fused_row<kType, 3>(row, cols, x, x_stride, out); break;
    case 4: fused_row<kType, 4>(row, cols, x, x_stride, out); break;
    case 5: fused_row<kType, 5>(row, cols, x, x_stride, out); break;
    case 6: fused_row<kType, 6>(row, cols, x, x_stride, out); break;
    case 7: fused_row<kType, 7>(row, cols, x, x_stride, out); break;
    default: fused_row<kType, 8>(row, cols, x, x_stride, out); break;
  }
}

// Dot products of one f32 row with n_tok activation rows.
void f32_row(const float* row, int64_t cols, const float* x, int64_t x_stride, int n_tok, float* out) {
  for (int t = 0; t < n_tok; ++t) {
    const float* xt = x + t * x_stride;
    v16f acc = {};
    int64_t k = 0;
    for (; k + 16 <= cols; k += 16) acc += load16(row + k) * load16(xt + k);
    float s = hsum(acc);
    for (; k < cols; ++k) s += row[k] * xt[k];
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
    const bool fused = w.type == DType::kQ4_0 || w.type == DType::kQ4_1 || w.type == DType::kQ8_0;
    if (!fused && w.type != DType::kF32) dequantize_row(w.type, row, row_buf, cols);
    for (int t0 = 0; t0 < n_tok; t0 += kFusedMaxTokens) {
      const int nt = std::min(kFusedMaxTokens, n_tok - t0);
      const float* xc = x + int64_t(t0) * cols;
      switch (w.type) {
        case DType::kQ4_0: fused_row_dispatch<DType::kQ4_0>(row, cols, xc, cols, nt, out); break;
        case DType::kQ4_1: fused_row_dispatch<DType::kQ4_1>(row, cols, xc, cols, nt, out); break;
        case DType::kQ8_0: fused_row_dispatch<DType::kQ8_0>(row, cols, xc, cols, nt, out); break;
        case DType::kF32: f32_row(reinterpret_cast<const float*>(row), cols, xc, cols, nt, out); break;
        default: f32_row(row_buf, cols, xc, cols, nt, out); break;
      }
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
  const float* xt = x + t * cols;
  float* yt = y + t * y_stride;
  switch (batch - t) {
    case 0: break;
    case 1: panel_tile<1>(panel, cols, xt, cols, yt, y_stride, n_rows); break;
    case 2: panel_tile<2>(panel, cols, xt, cols, yt, y_stride, n_rows); break;
    case 3: panel_tile<3>(panel, cols, xt, cols, yt, y_stride, n_rows); break;
    case 4: panel_tile<4>(panel, cols, xt, cols, yt, y_stride, n_rows); break;
    default: panel_tile<5>(panel, cols, xt, cols, yt, y_stride, n_rows); break;
  }
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
  // panel [cols][kPanelRows] + one row, rounded to 64 bytes
  return (size_t(cols) * (kPanelRows + 1) + 15) / 16 * 16;
}

}  // namespace

size_t matmul_f32_scratch_bytes(const WeightMatrix& w, int n_threads) {
  return thread_floats(w.cols) * sizeof(float) * size_t(std::max(1, n_threads));
}

void matmul_f32(const WeightMatrix& w, const float* x, int64_t batch, float* y, float* scratch, ThreadPool& pool) {
  const size_t per_thread = thread_floats(w.cols);
  // Small batches of fused-type weights (batched decode) also stream rows:
  // dequantizing in registers per 8 tokens beats packing panels up to here.
  const bool fused_type = w.type == DType::kQ4_0 || w.type == DType::kQ4_1 || w.type == DType::kQ8_0;
  if (batch <= kFusedMaxTokens || (fused_type && batch <= kFusedStreamMaxTokens)) {
    // Rows split evenly across threads.
    pool.run([&](int thread, int n_threads) {
      const int64_t begin = w.rows * thread / n_threads;
      const int64_t end = w.rows * (thread + 1) / n_threads;
      rows_few_tokens(w, begin, end, x, int(batch), y, scratch + per_thread * size_t(thread));
    });
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
