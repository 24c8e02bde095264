// One rank's shard of a model for tensor parallelism (Megatron-style):
// rank r of N owns a contiguous range of KV heads with the query heads of
// their groups, and a contiguous range of the MLP's hidden units. It holds
// - the rows of Wq, Wk, Wv (and their biases) for its heads and the rows of
//   w_gate, w_up for its hidden units: views into the model's weights;
// - the matching input columns of Wo and w_down, copied out at quantization
//   block boundaries (or, when a head range does not start on one, the whole
//   matrix, fed with zeros outside the rank's columns).
// Wo and w_down then give partial sums that an all-reduce adds up. Embeddings,
// norms and the output head stay whole on every rank. With one rank the shard
// is the model itself (no copies, the same pointers).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/model.h"

namespace lazykv {

// [begin, end) of `count` units for `rank` of `world`, contiguous; the first
// count % world ranks get one more (3 over 2: {0, 1}, {2}).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
ShardRange shard_range(int64_t count, int rank, int world);

struct ShardLayer {
  LayerWeights w;  // this rank's rows / columns
  // -1: wo (w_down) holds only this rank's input columns. Otherwise it is the
  // whole matrix and this rank's input starts at this column (zeros elsewhere).
  int64_t wo_input_offset = -1;
  int64_t down_input_offset = -1;
};

class ModelShard {
 public:
  // Throws Error(kInvalidArgument) when the model cannot be split over
  // `world` ranks (fewer KV heads or MLP blocks than ranks).
  ModelShard(const Model& model, int rank, int world);

  const Model& model() const { return model_; }
  // The model's config with this rank's n_head, n_head_kv and n_ff.
  const ModelConfig& config() const { return config_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  ShardRange kv_heads() const { return kv_heads_; }
  ShardRange ff() const { return ff_; }
  const std::vector<ShardLayer>& layers() const { return layers_; }

 private:
  cpu::WeightMatrix input_columns(const cpu::WeightMatrix& w, int64_t begin, int64_t end, int64_t* offset);

  const Model& model_;
  ModelConfig config_;
  int rank_;
  int world_;
  ShardRange kv_heads_;
  ShardRange ff_;
  std::vector<ShardLayer> layers_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;  // copied column slices
};

}  // namespace lazykv
