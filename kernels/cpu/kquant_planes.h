// Exact Q4_K and Q6_K decode on CPUs with AVX-512 VNNI: the f32 activations
// are split into three int8 planes and multiplied with the weights' integer
// quants by VNNI dot products, 64 multiply-adds an instruction where the f32
// kernels (kquant_rows.cc) do 16 and must first turn every quant into a float.
//
// Each chunk of 32 activations, with s = max |x| / 127, is written
//   x = s · (a1 + a2 / 128 + a3 / 128²) + e,   a1 in [-127, 127], a2, a3 in [-64, 64],
// each plane a rounding of what the planes before it left over, so
// |e| <= 2 · s · 2^-15 (the last plane's rounding and the f32 roundings of
// 127 / max, x · that and s), about max |x| · 2^-21: a few f32 roundings of
// the chunk's largest value, which the f32 kernels' own sums also carry.
// For one (weight vector, activation vector) the three planes' integer dots
// are combined exactly in int32 (a1·2^14 + a2·2^7 + a3) and scaled once, in
// f32, by the sub-block scale times its chunk's s. Q4_K's mins and Q6_K's
// offset of 32 are taken off through exact f32 sums of the activations, as
// kquant_rows.cc does. With one plane (--activations int8) the same kernels
// run llama.cpp's kind of arithmetic. Rows stream from memory once per call
// (the decode case), prefetched ahead (prefetch.h). Internal to kernels/cpu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/row_chunks.h"

namespace lazykv::cpu {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
inline constexpr bool kHaveKQuantPlanes = true;
#else
inline constexpr bool kHaveKQuantPlanes = false;  // kquant_rows.cc runs instead
#endif

// Planes per activation: three for the exact mode (f32 activations), one
// for --activations int8, whose quants per super-block of 256 are then
// those of llama.cpp's Q8_K (its scale can differ by an ulp).
enum class KQuantPlanes : int { kInt8 = 1, kExact = 3 };

// The most tokens a call takes; more go to the f32 kernels (kquant_rows.cc
// and the packed panels), whose FMAs are shared work past a few tokens where
// each token costs the exact mode three integer dots and a scale per 64
// weights. At 8 tokens the planes were still faster: 1.5B MLP gate/up rows
// from memory 1.9 against 2.6 ms, the output projection 34 against 42 ms
// (bench/matmul_bench, 2 vCPUs of a Zen 4).
inline constexpr int kKQuantPlanesMaxTokens = 8;

// Whether kquant_planes_rows takes n_tok tokens of a `type` matrix.
inline bool kquant_planes_take(DType type, int n_tok) {
  return kHaveKQuantPlanes && (type == DType::kQ4_K || type == DType::kQ6_K) && n_tok <= kKQuantPlanesMaxTokens;
}

// Scratch bytes kquant_planes_rows needs for n_tok tokens of `cols` inputs.
size_t kquant_planes_scratch_bytes(int64_t cols, int n_tok, KQuantPlanes planes);

// y[t * y_stride + r] = (row r of w) · x[t] for the rows this thread takes
// from `rows` and t < n_tok; x is [n_tok][w.cols]; scratch (the thread's
// own): kquant_planes_scratch_bytes, 64-byte aligned. Only where
// kquant_planes_take(w.type, n_tok).
void kquant_planes_rows(const WeightMatrix& w, RowChunks& rows, const float* x, int n_tok, float* y,
                        int64_t y_stride, void* scratch, KQuantPlanes planes);

}  // namespace lazykv::cpu
