// The exact mode's many-token matmul on AMX tiles (x86 CPUs with AMX-BF16).
// Internal to kernels/cpu: matmul_f32 hands it prefill-sized batches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/thread_pool.h"
#include "kernels/cpu/matmul.h"

namespace lazykv::cpu {

// True where this build has the kernel, the CPU has AMX-BF16 and the OS lets
// this process use the tiles (asked once, on the first call).
bool amx_bf16_usable();

// Tests and benchmarks turn the kernel off to compare it with the f32 panels.
void set_amx_enabled(bool enabled);

// Whether matmul_f32 runs w at this batch on the tiles.
bool matmul_amx_takes(const WeightMatrix& w, int64_t batch);

size_t matmul_amx_scratch_bytes(const WeightMatrix& w, int64_t batch, int n_threads);

// x: [batch][w.cols] f32; y: [batch][w.rows]; scratch: matmul_amx_scratch_bytes,
// 64-byte aligned. Only where matmul_amx_takes(w, batch).
void matmul_amx(const WeightMatrix& w, const float* x, int64_t batch, float* y, void* scratch, ThreadPool& pool);

}  // namespace lazykv::cpu
