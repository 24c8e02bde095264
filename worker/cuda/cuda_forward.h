// The forward pass on a CUDA device: ForwardPass's batches and results, with
// the weights uploaded once and every matmul, norm, RoPE and attention run on
// the GPU. Built only where CMake found the CUDA toolkit (LAZYKV_HAVE_CUDA).
//
// The KV cache stays the worker's KvCache: its slot tables, and the policies
// and tiers that compact it, run on the host as on the CPU backend, and the
// device holds a mirror of its page pool (same page ids); the pages the host
// writes (compactions, promotions) are copied into the mirror in one launch.
// A pass without a policy appends every layer's slots at its start and writes
// their K/V rows into the mirror on the device, with no host round trip
// inside the layers (the rows reach the host's pages with the logits). A
// pass with a policy appends through the host each layer and brings the
// probabilities back for its statistics. So every policy runs unchanged, on
// the same f16 K/V the CPU backend would hold.
#pragma once

#include <memory>
#include <span>

#include "common/thread_pool.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/parallel/group.h"
#include "worker/parallel/model_shard.h"

namespace lazykv {

class CudaForwardPass final : public ForwardBackend {
 public:
  // Uploads `shard`'s weights to CUDA device `device` (types the device matmul
  // does not read in place become F16). `cache` must be empty and used only
  // through this pass and the policies it drives. In a tensor-parallel group
  // the partial sums are all-reduced on the device when `group` is an
  // NcclGroup, else through host memory. With kInt8 precision the decode
  // matmuls on Q4_0, Q4_1 and Q8_0 weights (under kTensorCoreMinRows rows)
  // take int8 activations (cuda::matmul_q8_shared_input). With `use_graphs`
  // a decode step (one token an item, fewer than kTensorCoreMinRows) without
  // a policy, on one rank, is replayed as a CUDA graph (StepGraphs),
  // captured once per batch size and slot bucket; the logits are the same
  // either way. Throws
  // Error(kUnavailable) when the device cannot be used, Error(kOutOfMemory)
  // when the weights do not fit.
  CudaForwardPass(const ModelShard& shard, TensorParallelGroup& group, KvCache& cache, ThreadPool& pool, int device,
                  cpu::ActivationPrecision precision = cpu::ActivationPrecision::kF32, bool use_graphs = true);
  ~CudaForwardPass() override;
  CudaForwardPass(const CudaForwardPass&) = delete;
  CudaForwardPass& operator=(const CudaForwardPass&) = delete;

  // As ForwardPass::run (same errors, same logits up to float rounding), and
  // Error(kInvalidArgument) for an item whose start_pos is not past every
  // position its sequence caches (attention takes a prefix of each head's
  // slots as the causal mask; the worker always feeds forward). Every buffer
  // is sized before the cache or a policy changes: a device out of memory is
  // Error(kOutOfMemory) with both as they were (on every rank of a group).
  std::span<const float> run(std::span<const BatchItem> batch) override;
  double eviction_seconds() const override;
  ThreadPool& policy_pool() override;
  // Bytes of device memory the weights take.
  size_t weight_bytes() const;
  // Passes run by replaying a captured graph.
  size_t graph_replays() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lazykv
