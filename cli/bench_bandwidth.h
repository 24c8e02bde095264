// The memory-bandwidth side of `lazykv bench` on the CPU: what this
// machine's memory delivers on the benchmark's threads, and how much of it a
// decode step's weight reads use. Decode at batch 1 reads every weight once
// per token, so weight bytes x tokens/s against the measured read rate says
// how close the engine is to the memory limit.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/thread_pool.h"
#include "worker/model.h"

namespace lazykv {

struct MemoryBandwidth {
  double read_bytes_per_s = 0;  // a streaming read (sum) of a buffer far larger than the caches
  double copy_bytes_per_s = 0;  // memcpy of such a buffer: bytes copied (each read once, written once)
};

// Best of a few passes over 1 GiB buffers, split across the pool's threads.
MemoryBandwidth measure_memory_bandwidth(ThreadPool& pool);

// For each decode figure of `figures` ("decode_ctx{C}_tok_s", one sequence;
// "decode_batch{B}_ctx{C}_tok_s", B sequences): the weight bytes it reads per
// second ("<figure>_weight_read_gb_s") and their fraction of
// limit_bytes_per_s ("<figure>_fraction_of_<limit>").
nlohmann::json weight_read_report(double weight_bytes, double limit_bytes_per_s, const std::string& limit,
                                  const nlohmann::json& figures);

// weight_read_report against the measured read rate, with the rates.
nlohmann::json bandwidth_report(const Model& model, const MemoryBandwidth& memory, const nlohmann::json& figures);

}  // namespace lazykv
