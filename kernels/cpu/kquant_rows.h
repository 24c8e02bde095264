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

namespace lazykv::cpu {

#if defined(__AVX2__) && defined(__FMA__)
inline constexpr bool kHaveKQuantRows = true;
#else
inline constexpr bool kHaveKQuantRows = false;  // the generic fused kernels run instead
#endif

// The most tokens a call takes, by type: past them matmul_f32.cc's generic
// fused kernel, which converts each weight once for all the tokens, is the
// faster one (bench/matmul_bench, BM_MatmulLargerModel on the CI Xeon: this
// kernel's Q4_K is 2.2x, 1.8x, 1.3x, 0.92x the fused one at 1, 2, 4, 8
// tokens; its Q6_K 1.3x, 1.1x, 0.97x at 1, 2, 4; measured at 612b65f, before
// the fused kernel looked nibbles up in a table, so worth measuring again).
inline constexpr int kQ4kRowsMaxTokens = 4;
inline constexpr int kQ6kRowsMaxTokens = 2;

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

// y[t * y_stride + r] = (row r of w) · x[t] for r in [r_begin, r_end) and
// t < n_tok; x is [n_tok][w.cols]; scratch holds 2 * w.cols floats. Only where
// kquant_rows_take(w.type, n_tok).
void kquant_rows_f32(const WeightMatrix& w, int64_t r_begin, int64_t r_end, const float* x, int n_tok, float* y,
                     int64_t y_stride, float* scratch, KQuantRowsWidth width = KQuantRowsWidth::kWidest);

}  // namespace lazykv::cpu
