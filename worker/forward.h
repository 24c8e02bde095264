// One forward pass over a batch of sequences: prefill chunks and single decode
// tokens mixed freely (what continuous batching needs). Keys and values of the
// new tokens are appended to the KV cache; attention reads each sequence's own
// per-head slot tables.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/thread_pool.h"
#include "worker/kv_cache.h"
#include "worker/model.h"
#include "worker/parallel/group.h"
#include "worker/parallel/model_shard.h"
#include "worker/policy/policy.h"

namespace lazykv {

struct BatchItem {
  SeqId seq = 0;
  std::span<const int32_t> tokens;  // new tokens of this sequence
  int32_t start_pos = 0;            // position of tokens[0]
  bool all_logits = false;          // logits for every token, not only the last
  // The sequence's eviction policy (null: no statistics, no eviction). The
  // pass records the statistics it asks for and lets it compact the cache
  // after the step; the sequence must have been added to the cache with
  // policy->heads_per_layer() heads.
  EvictionPolicy* policy = nullptr;
};

// What a worker needs of a forward pass, whichever device runs it: ForwardPass
// here on the CPU, CudaForwardPass (worker/cuda) on a GPU. Both take the same
// batches, keep the KV in the same KvCache and drive the same policies.
class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;
  // Logits [rows][n_vocab], rows as ForwardPass::run says; valid until the next call.
  virtual std::span<const float> run(std::span<const BatchItem> batch) = 0;
  // Wall seconds in the policies' end_step over all runs.
  virtual double eviction_seconds() const = 0;
  // The host threads the policies' end_step runs on (layers in parallel).
  virtual ThreadPool& policy_pool() = 0;

  // Called in every run once the pass's keys and values are in the cache and
  // before any policy's end_step may evict: the worker keeps prompt pages
  // there for reuse (PrefixCache). Empty: nothing is called.
  using AppendedHook = std::function<void(std::span<const BatchItem>)>;
  void set_appended_hook(AppendedHook hook) { appended_hook_ = std::move(hook); }

 protected:
  AppendedHook appended_hook_;
};

class ForwardPass final : public ForwardBackend {
 public:
  // precision: kF32 (exact, the default) or kInt8 (llama.cpp-style 8-bit
  // activations); see kernels/cpu/matmul.h.
  ForwardPass(const Model& model, KvCache& cache, ThreadPool& pool,
              cpu::ActivationPrecision precision = cpu::ActivationPrecision::kF32);
  // Tensor parallelism: this rank's shard of the model (the cache holds only
  // its KV heads); the partial sums after Wo and w_down are all-reduced over
  // `group`, which every rank's pass must join step for step (same batches).
  ForwardPass(const ModelShard& shard, TensorParallelGroup& group, KvCache& cache, ThreadPool& pool,
              cpu::ActivationPrecision precision = cpu::ActivationPrecision::kF32);

  // Returns logits, [rows][n_vocab] with rows in batch order: tokens.size()
  // rows for items with all_logits, else 1. Valid until the next call.
  // Throws Error(kOutOfMemory) if the KV cache is full (nothing appended then),
  // Error(kInvalidArgument) for token ids outside the vocabulary.
  std::span<const float> run(std::span<const BatchItem> batch) override;

  int n_vocab() const { return model_.config().n_vocab; }
  const ModelShard& shard() const { return shard_; }
  // Wall seconds spent in the policies' end_step (statistics upkeep, scoring,
  // selection, compaction) over all runs; layers run in parallel, so this is
  // less than the sum of the policies' own CPU time.
  double eviction_seconds() const override { return eviction_seconds_; }
  ThreadPool& policy_pool() override { return pool_; }

  // Called after every layer with its output, the residual stream [rows][n_embd]
  // of the pass's tokens in batch order (lazykv steer measures with it).
  using LayerOutputHook = std::function<void(int layer, std::span<const float> x)>;
  void set_layer_output_hook(LayerOutputHook hook) { layer_output_hook_ = std::move(hook); }

 private:
  void ensure_buffers(int64_t n_tokens, int64_t n_logit_rows, int32_t max_slots);
  void matmul(const cpu::WeightMatrix& w, const float* x, int64_t rows, float* y);
  // x [rows][width] as the input of a whole matrix of `full` columns: x at
  // column `offset`, zeros elsewhere (when a rank's slice is not block-aligned).
  const float* widen(const float* x, int64_t rows, int64_t width, int64_t full, int64_t offset);

  std::unique_ptr<ModelShard> owned_shard_;  // the whole model, for the one-rank constructor
  std::unique_ptr<SoloGroup> owned_group_;
  const ModelShard& shard_;
  TensorParallelGroup& group_;
  const Model& model_;
  KvCache& cache_;
  ThreadPool& pool_;
  cpu::ActivationPrecision precision_;
  // Activation buffers, grown on demand and reused across calls.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_, logits_, wide_;
  std::vector<uint16_t> k16_, v16_;
  std::vector<std::vector<float>> scores_;  // per thread [n_group][max_slots]
  std::vector<uint8_t> scratch_raw_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  double eviction_seconds_ = 0;
  LayerOutputHook layer_output_hook_;
};

}  // namespace lazykv
