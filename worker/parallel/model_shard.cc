#include "worker/parallel/model_shard.h"

#include <cstring>
#include <numeric>
#include <string>

#include "common/error.h"

namespace lazykv {
namespace {

cpu::WeightMatrix row_slice(const cpu::WeightMatrix& w, int64_t begin, int64_t end) {
  if (begin == 0 && end == w.rows) return w;
  cpu::WeightMatrix out = w;
  out.rows = end - begin;
  out.data = static_cast<const uint8_t*>(w.data) + size_t(begin) * row_bytes(w.type, size_t(w.cols));
  return out;
}

const float* offset_or_null(const float* v, int64_t offset) { return v == nullptr ? nullptr : v + offset; }

}  // namespace

ShardRange shard_range(int64_t count, int rank, int world) {
  const int64_t base = count / world;
  const int64_t extra = count % world;
  ShardRange r;
  r.begin = rank * base + std::min<int64_t>(rank, extra);
  r.end = r.begin + base + (rank < extra ? 1 : 0);
  return r;
}

ModelShard::ModelShard(const Model& model, int rank, int world)
    : model_(model), config_(model.config()), rank_(rank), world_(world) {
  const ModelConfig& c = model.config();
  if (world < 1 || rank < 0 || rank >= world) {
    throw Error(ErrorCode::kInvalidArgument,
                "model shard: rank " + std::to_string(rank) + " outside a world of " + std::to_string(world));
  }
  if (c.n_head_kv < world) {
    throw Error(ErrorCode::kInvalidArgument, "model " + c.name + " has " + std::to_string(c.n_head_kv) +
                                                 " KV heads: it cannot be split over " + std::to_string(world) +
                                                 " tensor-parallel ranks");
  }
  // Hidden units are split in whole blocks of w_down's quantization, so its
  // column slices start on block boundaries.
  int64_t ff_block = 1;
  for (const LayerWeights& w : model.layers()) {
    ff_block = std::lcm(ff_block, int64_t(dtype_traits(w.w_down.type).block_elems));
  }
  if (c.n_ff % ff_block != 0 || c.n_ff / ff_block < world) {
    throw Error(ErrorCode::kInvalidArgument, "model " + c.name + ": an MLP of " + std::to_string(c.n_ff) +
                                                 " units in blocks of " + std::to_string(ff_block) +
                                                 " cannot be split over " + std::to_string(world) + " ranks");
  }
  kv_heads_ = shard_range(c.n_head_kv, rank, world);
  const ShardRange ff_blocks = shard_range(c.n_ff / ff_block, rank, world);
  ff_ = {ff_blocks.begin * ff_block, ff_blocks.end * ff_block};
  const int64_t G = c.n_group();
  const int64_t D = c.head_dim;
  const int64_t q_begin = kv_heads_.begin * G * D, q_end = kv_heads_.end * G * D;
  const int64_t kv_begin = kv_heads_.begin * D, kv_end = kv_heads_.end * D;
  config_.n_head_kv = int(kv_heads_.size());
  config_.n_head = int(kv_heads_.size() * G);
  config_.n_ff = int(ff_.size());

  layers_.reserve(model.layers().size());
  for (const LayerWeights& full : model.layers()) {
    ShardLayer s;
    s.w = full;
    s.w.wq = row_slice(full.wq, q_begin, q_end);
    s.w.wk = row_slice(full.wk, kv_begin, kv_end);
    s.w.wv = row_slice(full.wv, kv_begin, kv_end);
    s.w.bq = offset_or_null(full.bq, q_begin);
    s.w.bk = offset_or_null(full.bk, kv_begin);
    s.w.bv = offset_or_null(full.bv, kv_begin);
    s.w.w_gate = row_slice(full.w_gate, ff_.begin, ff_.end);
    s.w.w_up = row_slice(full.w_up, ff_.begin, ff_.end);
    s.w.wo = input_columns(full.wo, q_begin, q_end, &s.wo_input_offset);
    s.w.w_down = input_columns(full.w_down, ff_.begin, ff_.end, &s.down_input_offset);
    layers_.push_back(s);
  }
}

cpu::WeightMatrix ModelShard::input_columns(const cpu::WeightMatrix& w, int64_t begin, int64_t end,
                                            int64_t* offset) {
  *offset = -1;
  if (begin == 0 && end == w.cols) return w;
  const int64_t block = int64_t(dtype_traits(w.type).block_elems);
  if (begin % block != 0 || end % block != 0) {
    *offset = begin;  // the whole matrix; the forward pass pads the input
    return w;
  }
  // Quantized rows are independent runs of blocks: this rank's columns are the
  // same byte range of every row.
  const size_t src_row = row_bytes(w.type, size_t(w.cols));
  const size_t skip = row_bytes(w.type, size_t(begin));
  const size_t keep = row_bytes(w.type, size_t(end - begin));
  auto bytes = std::make_unique<uint8_t[]>(keep * size_t(w.rows) + 64);
  // 64-byte alignment like the mapped file's tensors, for the SIMD kernels.
  uint8_t* dst = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(bytes.get()) + 63) & ~uintptr_t(63));
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) std::memcpy(dst + size_t(r) * keep, src + size_t(r) * src_row + skip, keep);
  owned_.push_back(std::move(bytes));
  cpu::WeightMatrix out = w;
  out.cols = end - begin;
  out.data = dst;
  return out;
}

}  // namespace lazykv
