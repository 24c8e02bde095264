// Which device runs a worker's forward passes: the CPU (always built) or a
// CUDA GPU (built where CMake found the CUDA toolkit), and making the pass.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/thread_pool.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/parallel/group.h"
#include "worker/parallel/model_shard.h"

namespace lazykv {

enum class ComputeDevice { kCpu, kCuda };

// "cpu" or "cuda"; anything else is Error(kInvalidArgument) listing both.
ComputeDevice parse_compute_device(std::string_view name);
const char* compute_device_name(ComputeDevice device);

// Whether this binary has the CUDA backend.
bool cuda_backend_built();

// The CUDA device a rank uses: cuda_device, or rank modulo the usable devices
// for -1. Errors as check_compute_device's, prefixed with `who` (the flag that
// asked for a GPU).
int pick_cuda_device(int cuda_device, int rank, const std::string& who);

// Checks that `device` can run here before a model is loaded, and returns the
// CUDA device to use (-1 for the CPU). cuda_device -1 means rank modulo the
// usable devices. CUDA without a CUDA build, without a usable device, or with
// a device index outside those present is Error(kUnavailable) saying which; a
// negative index other than -1 is Error(kInvalidArgument).
int check_compute_device(ComputeDevice device, int cuda_device, int rank);

// The forward pass for `device` (cuda_device as check_compute_device returned;
// cuda_graphs: CudaForwardPass's use_graphs).
std::unique_ptr<ForwardBackend> make_forward_backend(ComputeDevice device, int cuda_device, const ModelShard& shard,
                                                     TensorParallelGroup& group, KvCache& cache, ThreadPool& pool,
                                                     cpu::ActivationPrecision precision, bool cuda_graphs = true);

}  // namespace lazykv
