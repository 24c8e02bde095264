// Q4_K and Q6_K weight rows times f32 activations for a few tokens: the
// decode case of the exact matmul (matmul_f32.cc), where the weights are
// read once per step and dequantizing them costs more than reading them.
//
// Each row is dequantized in registers and multiplied with every token in
// 8-float (256-bit) vectors, so AVX2 machines run the same code; the
// widening and nibble table use AVX-512VL where present. One token of Q4_K,
// the most common decode product, has its own 512-bit kernel on AVX-512
// (nibbles looked up in place, the activations permuted to match), 1.12x
// the 256-bit one; rows are prefetched ahead (prefetch.h).
//
// The scales are applied per sub-block to partial sums, and Q4_K's
// subtracted minimum to the sub-block's sum of activations, computed once
// per call: Σ (d·sc·q − dmin·m)·x = Σ_sb d·sc_sb·Σ q·x − dmin·m_sb·Σ x.
// Results differ from the dequantize-then-dot order by f32 rounding only.
// Internal to kernels/cpu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/row_chunks.h"

namespace lazykv::cpu {

#if defined(__AVX2__) && defined(__FMA__)
inline constexpr bool kHaveKQuantRows = true;
#else
inline constexpr bool kHaveKQuantRows = false;  // the generic fused kernels run instead
#endif

// The most tokens a call takes, by type: past them matmul_f32.cc's generic
// fused kernel, which converts each weight once for all the tokens, runs.
// Measured again on a Zen 4 guest (bench/matmul_bench, 2 threads, against
// the fused kernel with its nibble table): at 8 tokens this kernel's Q4_K
// is 1.05-1.7x (rows from memory / from cache), its Q6_K 1.5x; at 4 tokens
// Q6_K 1.3-1.5x; exact decode of 8 sequences of the 1.5B model 1.12-1.17x.
// (On a Xeon guest at 612b65f, before the fused kernel's table, Q4_K at 8
// tokens was 0.92x and Q6_K at 4 0.97x: the best cut-off differs by CPU.)
inline constexpr int kQ4kRowsMaxTokens = 8;
inline constexpr int kQ6kRowsMaxTokens = 8;

// Whether kquant_rows_f32 takes n_tok tokens of a `type` matrix.
inline bool kquant_rows_take(DType type, int n_tok) {
  if (!kHaveKQuantRows) return false;
  if (type == DType::kQ4_K) return n_tok <= kQ4kRowsMaxTokens;
  return type == DType::kQ6_K && n_tok <= kQ6kRowsMaxTokens;
}

// The vector width of the kernels: the widest this build has (matmul), or
// 256 bits everywhere, so that AVX-512 builds also test the one-token Q4_K
// tile AVX2 machines run.
enum class KQuantRowsWidth { kWidest, k256 };

// y[t * y_stride + r] = (row r of w) · x[t] for the rows this thread takes
// from `rows` and t < n_tok; x is [n_tok][w.cols]; scratch (the thread's
// own) holds 2 * w.cols floats. Only where kquant_rows_take(w.type, n_tok).
void kquant_rows_f32(const WeightMatrix& w, RowChunks& rows, const float* x, int n_tok, float* y, int64_t y_stride,
                     float* scratch, KQuantRowsWidth width = KQuantRowsWidth::kWidest);

}  // namespace lazykv::cpu
