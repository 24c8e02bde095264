// The f32-activation matmul kernels behind cpu::matmul's exact mode (see
// matmul_f32.cc). Internal to kernels/cpu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/thread_pool.h"
#include "kernels/cpu/matmul.h"

namespace lazykv::cpu {

// Token counts up to this use the fused row-streaming kernel.
constexpr int kFusedMaxTokens = 8;
// Up to this many tokens, Q4_0/Q4_1/Q8_0 weights are streamed row by row
// (kFusedMaxTokens tokens per pass over the row in L1) instead of packed.
constexpr int kFusedStreamMaxTokens = 64;

size_t matmul_f32_scratch_bytes(const WeightMatrix& w, int64_t batch, int n_threads);

// x: [batch][w.cols] f32; y: [batch][w.rows]; scratch: matmul_f32_scratch_bytes
// for pool.size() threads.
void matmul_f32(const WeightMatrix& w, const float* x, int64_t batch, float* y, float* scratch, ThreadPool& pool);

}  // namespace lazykv::cpu
