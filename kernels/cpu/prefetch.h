// Software prefetch for the decode kernels, which stream each weight row
// from memory once per step. On the CI Xeon one core's hardware prefetcher
// alone kept about half of its read bandwidth busy: the kernels work long
// between cache lines (dequantizing), so too few lines were in flight.
// With it, the one-token kernels read rows from memory 1.1-2x as fast on
// the CI Xeon (1.5B MLP rows, 2 threads; bench/matmul_bench's copies:64
// cases measure that regime).
// Internal to kernels/cpu.
#pragma once

#include <cstddef>

namespace lazykv::cpu {

// How far ahead of the block being read its row is requested: under a
// microsecond of work at the kernels' rate, about a memory latency or a few
// (4 KiB measured best of 1, 2, 4 and 8 KiB).
inline constexpr size_t kPrefetchAhead = 4096;

// Requests the cache lines of kBytes bytes, kAhead past p. Called
// for every block (or group of blocks) of a row, it covers every line of the
// rows that follow.
template <size_t kBytes, size_t kAhead = kPrefetchAhead>
inline void prefetch_ahead(const void* p) {
  const char* ahead = static_cast<const char*>(p) + kAhead;
  for (size_t offset = 0; offset < kBytes; offset += 64) __builtin_prefetch(ahead + offset);
}

}  // namespace lazykv::cpu
