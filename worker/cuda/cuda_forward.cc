#include "worker/cuda/cuda_forward.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/prefill_attention.h"
#include "worker/cuda/step_graphs.h"
#include "worker/forward_batch.h"
#ifdef LAZYKV_HAVE_NCCL
#include "worker/parallel/nccl/nccl_group.h"
#endif

namespace lazykv {
namespace {

using cuda::DeviceBuffer;
using cuda::PinnedBuffer;
using cuda::reserve_device;

// Probabilities one attention wave may hold on the device (floats): a long
// prompt chunk over a long cache runs in several waves instead of one buffer
// of gigabytes.
constexpr size_t kWaveProbFloats = size_t(64) << 20;
// The split attention's scratch one wave may use (floats), likewise.
constexpr size_t kWaveScratchFloats = size_t(32) << 20;
// Device mirror pages are allocated this many at a time.
constexpr size_t kMirrorChunkPages = 256;
// An attention launch is sized for its units' slots rounded up to this, so a
// decode step launches the same kernels for this many steps (its CUDA graph
// replays); the extra split blocks return at once.
constexpr int32_t kSlotBucket = 256;
// Decode-step graphs kept: a few batch sizes at a few slot buckets.
constexpr size_t kMaxStepGraphs = 16;
// Without a policy, consecutive tokens of a prefill chunk share an attention
// unit (and so each K/V read) up to this many queries in all, which the
// split kernel's shared memory holds at head_dim 128.
constexpr int kMaxUnitQueries = 16;
// A sequence's chunk of this many tokens or more (without a policy) attends
// on the tensor cores (PrefillAttention). That path's fixed cost (five
// launches a cache head) makes it 3% slower than the units at 256 tokens
// and 16-27% faster at 512 (an H200, docs/cuda.md).
constexpr int32_t kChunkAttentionMinTokens = 256;

int32_t launch_slots(int32_t slots) { return (slots + kSlotBucket - 1) / kSlotBucket * kSlotBucket; }

// The pass's CUDA stream, destroyed (after its work ends) with the pass, or
// when the constructor fails after creating it.
struct Stream {
  cudaStream_t handle = nullptr;
  ~Stream() {
    if (handle != nullptr) {
      static_cast<void>(cudaStreamSynchronize(handle));
      static_cast<void>(cudaStreamDestroy(handle));
    }
  }
};

struct DeviceLayer {
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
  cuda::WeightMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  int64_t wo_input_offset = -1;
  int64_t down_input_offset = -1;
};

}  // namespace

struct CudaForwardPass::Impl {
  Impl(const ModelShard& shard, TensorParallelGroup& group, KvCache& cache, ThreadPool& pool, int device,
       cpu::ActivationPrecision precision, bool use_graphs);

  std::span<const float> run(std::span<const BatchItem> batch, const AppendedHook& appended);
  struct Unit {
    int32_t item, head, token;  // a query group: tokens [token, + n_tokens) of an item, one cache head
    int32_t n_tokens = 1;       // more than 1 only without a policy (statistics are per token)
    bool tensor_cores = false;  // the item's whole chunk, through PrefillAttention
  };
  // A pass's batch and its attention units: (item, cache head, tokens), a
  // head's tokens in order.
  struct PassUnits {
    std::span<const BatchItem> batch;
    std::vector<int64_t> row0;  // each item's first activation row
    std::vector<Unit> list;
    std::vector<int> cache_heads, queries_per_head;  // per item
    int max_group = 1;
    bool any_policy = false;
    // Without a policy the pass appends every layer's slots at its start and
    // writes their rows on the device: no host round trip inside the layers.
    bool device_appends() const { return !any_policy; }
  };
  // One attention_units launch: units [first, first + count) of the list.
  struct Wave {
    size_t first = 0, count = 0;
    size_t prob_floats = 0;
    int32_t max_slots = 0;  // the launch's: the most slots a unit sees, as launch_slots rounds them
    std::vector<size_t> prob_at;  // each unit's probabilities in the wave's buffer
  };
  // One PrefillAttention::run: a chunk's queries and outputs for one cache head.
  struct ChunkUnit {
    const float* q;
    float* out;
    const uint16_t* const* keys;
    const uint16_t* const* values;
    int32_t n_slots, n_tokens, n_group;
  };
  // A layer's attention: attention_units launches, then long chunks on the tensor cores.
  struct LayerAttention {
    std::vector<Wave> waves;
    std::vector<ChunkUnit> chunks;
  };
  // Every buffer the pass will use, sized before any policy or cache changes,
  // so a device out of memory leaves both as they were.
  void prepare(const PassUnits& pu, const BatchRows& rows);
  // Layer l's page tables and units staged in h_tables / h_units from the
  // given offsets on (advanced past them), pointing into `tables` and
  // `units` at the same offsets; the waves they run in, and the chunks.
  LayerAttention stage_attention(int l, const PassUnits& pu, size_t& tables_at, size_t& units_at);
  // Appends every layer's slots for the pass (rows to come from the device)
  // and stages where each new row goes (h_row_targets), layer by layer.
  void append_pending_slots(const PassUnits& pu);
  // The pass's new rows, downloaded with the logits, into the host cache.
  void write_back_slots(const PassUnits& pu, int64_t T);
  // Where layer l's f16 K/V rows go in k16 / v16: every layer's rows stay
  // for the write-back with device_appends, else one layer's at a time.
  int64_t kv_rows_at(int l, const PassUnits& pu, int64_t T) const;
  // Layer l's f16 K/V rows (at kv_rows_at) to the cache: appended on the
  // device (device_appends) or through the host cache and the mirror.
  void append_layer(int l, const PassUnits& pu, int64_t T);
  // Layer l's attention; statistics and queries to the policies.
  void attend(int l, const PassUnits& pu, const LayerAttention& staged, size_t units_at);
  // The layers and the logits, from the embeddings in x; `layers_staged` as
  // staged with device_appends (else each layer stages its own).
  void run_layers(const PassUnits& pu, const BatchRows& rows, const std::vector<LayerAttention>& layers_staged);
  // Whether run_layers can be captured as a graph: a decode step (one token
  // an item, under kTensorCoreMinRows) with no host work between its
  // launches (device appends, one rank).
  bool graphable(const PassUnits& pu, const BatchRows& rows) const;
  // What run_layers bakes into its launches apart from the weights: shapes,
  // each wave's launch, the buffers' addresses.
  std::vector<int64_t> launch_signature(const PassUnits& pu, const BatchRows& rows,
                                        const std::vector<LayerAttention>& layers_staged) const;

  // --- set-up ---
  cuda::WeightMatrix upload_matrix(const cpu::WeightMatrix& w);
  const float* upload_floats(const float* host, size_t n);

  // --- per step ---
  void sync();
  void upload(void* device, const void* host, size_t bytes);
  void download(void* host, const void* device, size_t bytes);
  void matmul(const cuda::WeightMatrix& w, const float* x, int64_t rows, float* y);
  // y[i] = x · w[i]ᵀ for n (up to 3) matrices: one launch where their types
  // and widths agree; x quantized once where the precision is int8.
  // `quantized`: x_q8 already holds x quantized (written with it by a norm
  // or silu_mul through q8_output).
  void matmul_same_input(std::initializer_list<cuda::WeightMatrix> w, std::initializer_list<float*> y,
                         const float* x, int64_t rows, bool quantized = false);
  // Whether a matmul of w on `rows` activation rows takes int8 activations.
  bool int8_input(const cuda::WeightMatrix& w, int64_t rows) const;
  // Where the op before a matmul of w writes its output quantized as well
  // (x_q8), or null where that matmul takes f32.
  const cuda::Q8Activations* q8_output(const cuda::WeightMatrix& w, int64_t rows);
  const float* widen(const float* x, int64_t rows, int64_t width, int64_t full, int64_t offset);
  void all_reduce(float* data, size_t n);
  uint8_t* mirror_page(int32_t page);
  void mirror_written_pages();
  void grow_mirror();

  const ModelShard& shard;
  TensorParallelGroup& group;
  const Model& model;
  KvCache& cache;
  ThreadPool& pool;
  int device;
  cpu::ActivationPrecision precision;
  bool use_graphs;
  StepGraphs graphs{kMaxStepGraphs};
  Stream owned_stream;
  cudaStream_t stream = nullptr;  // owned_stream's
#ifdef LAZYKV_HAVE_NCCL
  NcclGroup* nccl = nullptr;  // the group, when its all-reduce runs on device memory
#endif

  // Weights, uploaded once.
  std::vector<DeviceBuffer<uint8_t>> owned;
  DeviceBuffer<uint8_t> weight_staging;  // GGML rows on their way to the tiled layout; freed after loading
  std::vector<DeviceLayer> layers;
  std::optional<cuda::TensorCoreGemm> gemm;     // prefill: kTensorCoreMinRows rows or more
  std::optional<cuda::PrefillAttention> chunk_attention;  // chunks of kChunkAttentionMinTokens tokens or more
  int64_t max_matrix_rows = 0, max_matrix_cols = 0;    // over every matrix: the GEMM's scratch
  cuda::WeightMatrix output;
  const float* output_norm = nullptr;
  const float* inv_freq = nullptr;
  size_t weight_bytes = 0;

  // The KV mirror: page p at mirror_chunks[p / kMirrorChunkPages].
  std::vector<DeviceBuffer<uint8_t>> mirror_chunks;
  std::vector<int32_t> written;

  // Activations on the device, grown on demand.
  DeviceBuffer<float> x, xn, q, k, v, attn, tmp, gate, up, logits, wide, probs, attn_scratch;
  DeviceBuffer<uint16_t> k16, v16;  // f16 K/V rows: one layer's, every layer's with device_appends
  DeviceBuffer<int32_t> positions;
  DeviceBuffer<int8_t> x_q8;                    // int8 precision: a matmul's input quantized
  DeviceBuffer<float> x_q8_d, x_q8_s;
  cuda::Q8Activations q8_view{};                // the three, as q8_output hands them out
  DeviceBuffer<cuda::KvRowTarget> row_targets;  // device_appends: [layer][targets]
  DeviceBuffer<uint8_t> staged_pages;           // [pages][page_bytes], then their destinations
  DeviceBuffer<const uint16_t*> tables;         // page tables of a layer (every layer with device_appends)
  DeviceBuffer<cuda::AttentionUnit> units;

  // Host staging (page-locked, for asynchronous copies).
  PinnedBuffer<float> h_x, h_logits, h_hidden, h_probs, h_q, h_reduce;
  PinnedBuffer<uint16_t> h_k16, h_v16;
  PinnedBuffer<int32_t> h_positions;
  PinnedBuffer<uint8_t> h_pages;
  PinnedBuffer<const uint16_t*> h_tables;
  PinnedBuffer<cuda::AttentionUnit> h_units;
  PinnedBuffer<cuda::KvRowTarget> h_row_targets;
  std::vector<int32_t> pending_slots;  // device_appends: the slot of each staged row target
  size_t targets_per_layer = 0;

  double eviction_seconds = 0;
};

CudaForwardPass::Impl::Impl(const ModelShard& shard_, TensorParallelGroup& group_, KvCache& cache_, ThreadPool& pool_,
                            int device_, cpu::ActivationPrecision precision_, bool use_graphs_)
    : shard(shard_),
      group(group_),
      model(shard_.model()),
      cache(cache_),
      pool(pool_),
      device(device_),
      precision(precision_),
      use_graphs(use_graphs_) {
  if (group.world() != shard.world() || group.rank() != shard.rank()) {
    throw Error(ErrorCode::kInvalidArgument, "cuda forward: a shard for rank " + std::to_string(shard.rank()) +
                                                 " of " + std::to_string(shard.world()) +
                                                 " in a group where this is rank " + std::to_string(group.rank()) +
                                                 " of " + std::to_string(group.world()));
  }
  if (cache.config().n_head_kv != shard.config().n_head_kv) {
    throw Error(ErrorCode::kInvalidArgument, "cuda forward: the KV cache holds " +
                                                 std::to_string(cache.config().n_head_kv) + " heads but the shard has " +
                                                 std::to_string(shard.config().n_head_kv));
  }
  if (cache.pool_pages() != 0) {
    throw Error(ErrorCode::kInvalidArgument, "cuda forward: the KV cache must be empty when the pass is made");
  }
  const int head_dim = shard.config().head_dim;
  if (head_dim % 4 != 0 || head_dim > 128 || cache.config().page_slots % 2 != 0) {  // cuda::attention_units'
    throw Error(ErrorCode::kUnavailable, "cuda forward: head_dim " + std::to_string(head_dim) + " and " +
                                             std::to_string(cache.config().page_slots) +
                                             "-slot pages: the CUDA attention needs a head_dim that is a multiple "
                                             "of 4 up to 128 and an even page size");
  }
  const int devices = cuda::usable_device_count();
  if (device < 0 || device >= devices) {
    throw Error(ErrorCode::kUnavailable, "CUDA device " + std::to_string(device) + " does not exist: " +
                                             std::to_string(devices) + " CUDA device(s) are usable");
  }
  LAZYKV_CUDA_CHECK(cudaSetDevice(device));
  LAZYKV_CUDA_CHECK(cudaStreamCreateWithFlags(&owned_stream.handle, cudaStreamNonBlocking));
  stream = owned_stream.handle;
  gemm.emplace(stream);
  chunk_attention.emplace(stream);
#ifdef LAZYKV_HAVE_NCCL
  nccl = dynamic_cast<NcclGroup*>(&group);
#endif

  const ModelConfig& c = shard.config();
  try {
    for (const ShardLayer& layer : shard.layers()) {
      const LayerWeights& w = layer.w;
      DeviceLayer d;
      d.attn_norm = upload_floats(w.attn_norm, size_t(c.n_embd));
      d.ffn_norm = upload_floats(w.ffn_norm, size_t(c.n_embd));
      d.bq = upload_floats(w.bq, size_t(c.n_head) * c.head_dim);
      d.bk = upload_floats(w.bk, size_t(c.n_head_kv) * c.head_dim);
      d.bv = upload_floats(w.bv, size_t(c.n_head_kv) * c.head_dim);
      d.wq = upload_matrix(w.wq);
      d.wk = upload_matrix(w.wk);
      d.wv = upload_matrix(w.wv);
      d.wo = upload_matrix(w.wo);
      d.w_gate = upload_matrix(w.w_gate);
      d.w_up = upload_matrix(w.w_up);
      d.w_down = upload_matrix(w.w_down);
      d.wo_input_offset = layer.wo_input_offset;
      d.down_input_offset = layer.down_input_offset;
      layers.push_back(d);
    }
    output = upload_matrix(model.output());
    output_norm = upload_floats(model.output_norm(), size_t(c.n_embd));
    inv_freq = upload_floats(model.rope().inv_freq.data(), model.rope().inv_freq.size());
    weight_staging = DeviceBuffer<uint8_t>();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kOutOfMemory) throw;
    throw Error(ErrorCode::kOutOfMemory, std::string("cuda forward: uploading the weights: ") + e.what());
  }
  cache.track_written_pages();  // last: a pass that failed to start leaves the cache as it was
}

const float* CudaForwardPass::Impl::upload_floats(const float* host, size_t n) {
  if (host == nullptr || n == 0) return nullptr;
  DeviceBuffer<uint8_t>& buffer = owned.emplace_back(n * sizeof(float));
  buffer.upload(reinterpret_cast<const uint8_t*>(host), n * sizeof(float));
  weight_bytes += buffer.bytes();
  return reinterpret_cast<const float*>(buffer.data());
}

cuda::WeightMatrix CudaForwardPass::Impl::upload_matrix(const cpu::WeightMatrix& w) {
  cuda::WeightMatrix d;
  d.rows = w.rows;
  d.cols = w.cols;
  d.type = w.type;
  const void* rows = w.data;
  std::vector<uint16_t> f16;
  if (!cuda::matmul_supported(w.type)) {
    // A type the device matmul does not read in its own bits (F32, Q4_K,
    // Q6_K, ...): F16 rows, converted here once.
    d.type = DType::kF16;
    const size_t src_row = row_bytes(w.type, size_t(w.cols));
    f16.resize(size_t(w.rows) * size_t(w.cols));
    std::vector<float> row(size_t(w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      cpu::dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + size_t(r) * src_row, row.data(), w.cols);
      cpu::to_f16(row.data(), f16.data() + size_t(r) * size_t(w.cols), w.cols);
    }
    rows = f16.data();
  }
  // The GGML rows through a staging buffer, tiled on the device.
  const size_t src_bytes = size_t(w.rows) * row_bytes(d.type, size_t(w.cols));
  uint8_t* staged = reserve_device(weight_staging, src_bytes);
  LAZYKV_CUDA_CHECK(cudaMemcpy(staged, rows, src_bytes, cudaMemcpyHostToDevice));
  DeviceBuffer<uint8_t>& buffer = owned.emplace_back(cuda::tiled_bytes(d.type, d.rows, d.cols));
  cuda::tile_weights(d.type, staged, d.rows, d.cols, buffer.data(), stream);
  sync();  // the staging buffer is reused by the next matrix
  d.data = buffer.data();
  weight_bytes += buffer.bytes();
  max_matrix_rows = std::max(max_matrix_rows, d.rows);
  max_matrix_cols = std::max(max_matrix_cols, d.cols);
  return d;
}

void CudaForwardPass::Impl::sync() { LAZYKV_CUDA_CHECK(cudaStreamSynchronize(stream)); }

void CudaForwardPass::Impl::upload(void* device_ptr, const void* host, size_t bytes) {
  if (bytes > 0) LAZYKV_CUDA_CHECK(cudaMemcpyAsync(device_ptr, host, bytes, cudaMemcpyHostToDevice, stream));
}

void CudaForwardPass::Impl::download(void* host, const void* device_ptr, size_t bytes) {
  if (bytes > 0) LAZYKV_CUDA_CHECK(cudaMemcpyAsync(host, device_ptr, bytes, cudaMemcpyDeviceToHost, stream));
}

bool CudaForwardPass::Impl::int8_input(const cuda::WeightMatrix& w, int64_t rows) const {
  return precision == cpu::ActivationPrecision::kInt8 && rows < cuda::kTensorCoreMinRows &&
         cuda::matmul_q8_supported(w.type);
}

const cuda::Q8Activations* CudaForwardPass::Impl::q8_output(const cuda::WeightMatrix& w, int64_t rows) {
  if (!int8_input(w, rows)) return nullptr;
  q8_view = {x_q8.data(), x_q8_d.data(), x_q8_s.data()};  // sized by prepare
  return &q8_view;
}

void CudaForwardPass::Impl::matmul(const cuda::WeightMatrix& w, const float* in, int64_t rows, float* out) {
  if (rows >= cuda::kTensorCoreMinRows) return gemm->run(w, in, rows, out);
  matmul_same_input({w}, {out}, in, rows);
}

void CudaForwardPass::Impl::matmul_same_input(std::initializer_list<cuda::WeightMatrix> w,
                                              std::initializer_list<float*> y, const float* in, int64_t rows,
                                              bool quantized) {
  const cuda::WeightMatrix& first = *w.begin();
  const bool alike = std::all_of(w.begin(), w.end(), [&](const cuda::WeightMatrix& m) {
    return m.type == first.type && m.cols == first.cols;
  });
  if (!alike || rows >= cuda::kTensorCoreMinRows) {
    for (size_t i = 0; i < w.size(); ++i) matmul(w.begin()[i], in, rows, y.begin()[i]);
    return;
  }
  const cuda::Q8Activations* q8 = q8_output(first, rows);
  if (q8 == nullptr) return cuda::matmul_shared_input(w.begin(), y.begin(), int(w.size()), in, rows, stream);
  if (!quantized) cuda::quantize_q8(in, rows, first.cols, *q8, stream);
  cuda::matmul_q8_shared_input(w.begin(), y.begin(), int(w.size()), *q8, rows, stream);
}

// x [rows][width] as the input of a matrix of `full` columns: at column
// `offset`, zeros elsewhere (a rank's slice that is not block-aligned).
const float* CudaForwardPass::Impl::widen(const float* in, int64_t rows, int64_t width, int64_t full,
                                          int64_t offset) {
  float* out = reserve_device(wide, size_t(rows * full));
  LAZYKV_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(rows * full) * sizeof(float), stream));
  LAZYKV_CUDA_CHECK(cudaMemcpy2DAsync(out + offset, size_t(full) * sizeof(float), in, size_t(width) * sizeof(float),
                                      size_t(width) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, stream));
  return out;
}

void CudaForwardPass::Impl::all_reduce(float* data, size_t n) {
  if (group.world() == 1) return;
#ifdef LAZYKV_HAVE_NCCL
  if (nccl != nullptr) {
    nccl->all_reduce_sum_device(data, n, stream);
    return;
  }
#endif
  // A host collective (Gloo): through page-locked memory.
  float* host = h_reduce.reserve(n);
  download(host, data, n * sizeof(float));
  sync();
  group.all_reduce_sum(host, n);
  upload(data, host, n * sizeof(float));
}

uint8_t* CudaForwardPass::Impl::mirror_page(int32_t page) {
  return mirror_chunks[size_t(page) / kMirrorChunkPages].data() + (size_t(page) % kMirrorChunkPages) * cache.page_bytes();
}

void CudaForwardPass::Impl::grow_mirror() {
  while (mirror_chunks.size() * kMirrorChunkPages < cache.pool_pages()) {
    try {
      mirror_chunks.emplace_back(kMirrorChunkPages * cache.page_bytes());
    } catch (const Error& e) {
      throw Error(ErrorCode::kOutOfMemory, std::string("cuda forward: growing the device KV pages: ") + e.what());
    }
  }
}

// Copies every page the cache wrote since the last call into the mirror:
// staged in page-locked memory with their destinations, one upload, one launch.
// The caller has synchronised the stream since the previous call (the staging
// memory is reused).
void CudaForwardPass::Impl::mirror_written_pages() {
  cache.take_written_pages(written);
  if (written.empty()) return;
  grow_mirror();
  const size_t page_bytes = cache.page_bytes();
  const size_t n = written.size();
  const size_t pointers_at = n * page_bytes;  // a multiple of 16: page_bytes is
  const size_t total = pointers_at + n * sizeof(uint8_t*);
  uint8_t* host = h_pages.reserve(total);
  auto* destinations = reinterpret_cast<uint8_t**>(host + pointers_at);
  pool.parallel_for(int64_t(n), 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(host + size_t(i) * page_bytes, cache.page_data(written[size_t(i)]), page_bytes);
      destinations[i] = mirror_page(written[size_t(i)]);
    }
  });
  uint8_t* device_staged = reserve_device(staged_pages, total);
  upload(device_staged, host, total);
  cuda::scatter_pages(device_staged, reinterpret_cast<uint8_t* const*>(device_staged + pointers_at), int64_t(n),
                      int64_t(page_bytes), stream);
}

void CudaForwardPass::Impl::prepare(const PassUnits& pu, const BatchRows& rows) {
  const ModelConfig& c = shard.config();
  const std::span<const BatchItem> batch = pu.batch;
  const size_t T = size_t(rows.tokens());
  const size_t E = size_t(c.n_embd);
  const size_t q_dim = size_t(c.n_head) * size_t(c.head_dim);
  const size_t kv_dim = size_t(c.n_head_kv) * size_t(c.head_dim);
  const size_t page_slots = size_t(cache.config().page_slots);
  const size_t layers_staged = pu.device_appends() ? size_t(c.n_layer) : 1;
  grow_mirror();
  reserve_device(x, T * E);
  reserve_device(xn, T * std::max(E, q_dim));
  reserve_device(q, T * q_dim);
  reserve_device(k, T * kv_dim);
  reserve_device(v, T * kv_dim);
  reserve_device(attn, T * q_dim);
  reserve_device(tmp, T * E);
  reserve_device(gate, T * size_t(c.n_ff));
  reserve_device(up, T * size_t(c.n_ff));
  reserve_device(logits, size_t(rows.n_logit_rows) * size_t(c.n_vocab));
  reserve_device(k16, layers_staged * T * kv_dim);
  reserve_device(v16, layers_staged * T * kv_dim);
  reserve_device(positions, T);
  if (precision == cpu::ActivationPrecision::kInt8) {  // the rows a matmul_q8 may take, at the widest input
    const size_t q8_rows = std::min<size_t>(std::max<size_t>(T, size_t(rows.n_logit_rows)), cuda::kTensorCoreMinRows - 1);
    reserve_device(x_q8, q8_rows * size_t(max_matrix_cols));
    reserve_device(x_q8_d, q8_rows * size_t(max_matrix_cols) / cpu::kQK);
    reserve_device(x_q8_s, q8_rows * size_t(max_matrix_cols) / cpu::kQK);
  }
  if (int64_t(T) >= cuda::kTensorCoreMinRows || rows.n_logit_rows >= cuda::kTensorCoreMinRows) {
    gemm->reserve(max_matrix_rows, max_matrix_cols, std::max<int64_t>(int64_t(T), rows.n_logit_rows));
  }
  int64_t widest = 0;  // the widest whole matrix a rank feeds with zeros around its columns
  for (const DeviceLayer& w : layers) {
    if (w.wo_input_offset >= 0) widest = std::max(widest, w.wo.cols);
    if (w.down_input_offset >= 0) widest = std::max(widest, w.w_down.cols);
  }
  if (widest > 0) reserve_device(wide, T * size_t(widest));
  h_x.reserve(T * E);
  h_positions.reserve(T);
  h_k16.reserve(layers_staged * T * kv_dim);
  h_v16.reserve(layers_staged * T * kv_dim);
  if (pu.any_policy) h_q.reserve(T * q_dim);
  h_logits.reserve(size_t(rows.n_logit_rows) * size_t(c.n_vocab));
  if (wants_hidden(pu.batch)) h_hidden.reserve(size_t(rows.n_logit_rows) * size_t(E));
  if (group.world() > 1) h_reduce.reserve(T * E);

  // Attention: every head's table (its pages after this pass's appends), the
  // probabilities and scratch of the largest wave, the pages staged for the mirror.
  size_t table_entries = 0, prob_total = 0, prob_unit_max = 0, appended_pages = 0, targets = 0;
  int32_t max_slots = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const size_t n_tok = batch[i].tokens.size();
    const size_t slots = size_t(cache.max_slots(batch[i].seq)) + n_tok;
    table_entries += size_t(pu.cache_heads[i]) * 2 * ((slots + page_slots - 1) / page_slots);
    const size_t unit_need = size_t(pu.queries_per_head[i]) * slots;
    prob_total += unit_need * size_t(pu.cache_heads[i]) * n_tok;
    prob_unit_max = std::max(prob_unit_max, unit_need);
    max_slots = std::max(max_slots, launch_slots(int32_t(slots)));
    appended_pages += size_t(pu.cache_heads[i]) * ((n_tok + page_slots - 1) / page_slots + 1);
    targets += size_t(pu.cache_heads[i]) * n_tok;
  }
  // Chunks on the tensor cores: their gathered K/V, queries and score blocks.
  int64_t chunk_tokens = 0;
  int32_t chunk_slots = 0;
  int chunk_group = 0;
  for (const Unit& un : pu.list) {
    if (!un.tensor_cores) continue;
    chunk_tokens = std::max<int64_t>(chunk_tokens, un.n_tokens);
    chunk_slots = std::max(chunk_slots, cache.max_slots(batch[size_t(un.item)].seq) + un.n_tokens);
    chunk_group = std::max(chunk_group, pu.queries_per_head[size_t(un.item)]);
  }
  if (chunk_tokens > 0) chunk_attention->reserve(chunk_tokens, chunk_slots, chunk_group, c.head_dim);
  const size_t prob_bound = std::min(prob_total, std::max(kWaveProbFloats, prob_unit_max));
  const size_t n_units = pu.list.size();
  reserve_device(tables, std::max<size_t>(layers_staged * table_entries, 1));
  h_tables.reserve(std::max<size_t>(layers_staged * table_entries, 1));
  reserve_device(units, std::max<size_t>(layers_staged * n_units, 1));
  h_units.reserve(std::max<size_t>(layers_staged * n_units, 1));
  reserve_device(probs, pu.any_policy ? std::max<size_t>(prob_bound, 1) : 1);  // only policies read them
  if (pu.any_policy) h_probs.reserve(std::max<size_t>(prob_bound, 1));
  const size_t scratch_total = cuda::attention_scratch_floats(int64_t(n_units), pu.max_group, c.head_dim, max_slots);
  const size_t scratch_unit = cuda::attention_scratch_floats(1, pu.max_group, c.head_dim, max_slots);
  reserve_device(attn_scratch, std::max<size_t>(std::min(scratch_total, std::max(kWaveScratchFloats, scratch_unit)), 1));
  if (pu.device_appends()) {
    reserve_device(row_targets, std::max<size_t>(size_t(c.n_layer) * targets, 1));
    h_row_targets.reserve(std::max<size_t>(size_t(c.n_layer) * targets, 1));
    appended_pages = 0;  // the pass writes its rows on the device
  }
  // Pages written since the last pass (compactions, promotions) and this
  // pass's appends, which the first layer's copy carries together.
  const size_t staged = (cache.written_page_count() + appended_pages) * (cache.page_bytes() + sizeof(uint8_t*));
  reserve_device(staged_pages, staged);
  h_pages.reserve(staged);
}

CudaForwardPass::Impl::LayerAttention CudaForwardPass::Impl::stage_attention(int l, const PassUnits& pu,
                                                                             size_t& tables_at, size_t& units_at) {
  const int D = shard.config().head_dim;
  const int64_t q_dim = int64_t(shard.config().n_head) * D;
  // Each (item, cache head)'s table once; its units all point to it.
  std::vector<size_t> table_of(pu.list.size());
  const uint16_t** ht = h_tables.data();
  size_t table_at = 0;
  for (size_t j = 0; j < pu.list.size(); ++j) {
    const Unit& un = pu.list[j];
    const BatchItem& item = pu.batch[size_t(un.item)];
    const std::span<const int32_t> pages = cache.page_ids(item.seq, l, un.head);
    if (un.token == 0) {
      table_at = tables_at;
      for (size_t p = 0; p < pages.size(); ++p) {
        const uint8_t* page = mirror_page(pages[p]);
        ht[tables_at + p] = reinterpret_cast<const uint16_t*>(page);
        ht[tables_at + pages.size() + p] = reinterpret_cast<const uint16_t*>(page + cache.values_offset());
      }
      tables_at += 2 * pages.size();
    }
    table_of[j] = table_at;
  }
  // Units, in waves whose probabilities and scratch fit; chunks apart (the
  // list's last units, so the waves' ranges stay contiguous).
  LayerAttention staged;
  std::vector<Wave>& waves = staged.waves;
  for (size_t j = 0; j < pu.list.size(); ++j) {
    const Unit& un = pu.list[j];
    const BatchItem& item = pu.batch[size_t(un.item)];
    const int qph = pu.queries_per_head[size_t(un.item)];
    const int32_t n_tok = int32_t(item.tokens.size());
    const int32_t last_token = un.token + un.n_tokens - 1;
    const int32_t visible = cache.n_slots(item.seq, l, un.head) - (n_tok - 1 - last_token);
    const int64_t r = pu.row0[size_t(un.item)] + un.token;
    const int64_t head0 = int64_t(un.head) * qph;  // first query head served by this cache head
    const size_t pages = cache.page_ids(item.seq, l, un.head).size();
    if (un.tensor_cores) {
      staged.chunks.push_back({q.data() + r * q_dim + head0 * D, attn.data() + r * q_dim + head0 * D,
                               tables.data() + table_of[j], tables.data() + table_of[j] + pages, visible, un.n_tokens,
                               qph});
      continue;
    }
    const size_t need = size_t(qph) * size_t(un.n_tokens) * size_t(visible);
    const int32_t wave_slots = waves.empty() ? 0 : std::max(waves.back().max_slots, launch_slots(visible));
    if (waves.empty() || waves.back().prob_floats + need > kWaveProbFloats ||
        cuda::attention_scratch_floats(int64_t(waves.back().count + 1), pu.max_group, D, wave_slots) >
            kWaveScratchFloats) {
      waves.push_back(Wave{j, 0, 0, 0, {}});
    }
    Wave& wave = waves.back();
    wave.prob_at.push_back(wave.prob_floats);
    cuda::AttentionUnit& a = h_units.data()[units_at + j];
    a.q = q.data() + r * q_dim + head0 * D;
    a.out = attn.data() + r * q_dim + head0 * D;
    a.probs = pu.any_policy ? probs.data() + wave.prob_floats : nullptr;  // only policies read them
    a.keys = tables.data() + table_of[j];
    a.values = tables.data() + table_of[j] + pages;
    a.n_slots = visible;
    a.n_group = qph * un.n_tokens;
    a.n_tokens = un.n_tokens;
    a.token_stride = int32_t(q_dim);
    wave.prob_floats += need;
    wave.max_slots = std::max(wave.max_slots, launch_slots(visible));
    ++wave.count;
  }
  units_at += pu.list.size();
  return staged;
}

void CudaForwardPass::Impl::append_pending_slots(const PassUnits& pu) {
  const ModelConfig& c = shard.config();
  const int KV = c.n_head_kv;
  const int32_t page_slots = cache.config().page_slots;
  cuda::KvRowTarget* targets = h_row_targets.data();
  pending_slots.clear();
  for (int l = 0; l < c.n_layer; ++l) {
    for (size_t i = 0; i < pu.batch.size(); ++i) {
      const BatchItem& item = pu.batch[i];
      const int copies = pu.cache_heads[i] / KV;
      for (int head = 0; head < pu.cache_heads[i]; ++head) {
        for (size_t t = 0; t < item.tokens.size(); ++t) {
          const int32_t slot = cache.append_pending(item.seq, l, head, item.start_pos + int32_t(t));
          const int32_t page = cache.page_ids(item.seq, l, head)[size_t(slot / page_slots)];
          uint8_t* data = mirror_page(page);
          *targets++ = {reinterpret_cast<uint16_t*>(data), reinterpret_cast<uint16_t*>(data + cache.values_offset()),
                        slot % page_slots, int32_t((pu.row0[i] + int64_t(t)) * KV + head / copies)};
          pending_slots.push_back(slot);
        }
      }
    }
  }
  targets_per_layer = pending_slots.size() / size_t(c.n_layer);
  upload(row_targets.data(), h_row_targets.data(), pending_slots.size() * sizeof(cuda::KvRowTarget));
}

void CudaForwardPass::Impl::write_back_slots(const PassUnits& pu, int64_t T) {
  const ModelConfig& c = shard.config();
  const int64_t kv_dim = int64_t(c.n_head_kv) * c.head_dim;
  // Layer by layer, the targets in append_pending_slots' order: item, head, token.
  pool.parallel_for(c.n_layer, 1, [&](int64_t begin, int64_t end) {
    for (int64_t l = begin; l < end; ++l) {
      const uint16_t* hk = h_k16.data() + l * T * kv_dim;
      const uint16_t* hv = h_v16.data() + l * T * kv_dim;
      size_t at = size_t(l) * targets_per_layer;
      for (size_t i = 0; i < pu.batch.size(); ++i) {
        for (int head = 0; head < pu.cache_heads[i]; ++head) {
          for (size_t t = 0; t < pu.batch[i].tokens.size(); ++t, ++at) {
            const int64_t row = h_row_targets.data()[at].row;
            cache.write_slot(pu.batch[i].seq, int(l), head, pending_slots[at], hk + row * c.head_dim,
                             hv + row * c.head_dim);
          }
        }
      }
    }
  });
}

int64_t CudaForwardPass::Impl::kv_rows_at(int l, const PassUnits& pu, int64_t T) const {
  return pu.device_appends() ? int64_t(l) * T * int64_t(shard.config().n_head_kv) * shard.config().head_dim : 0;
}

void CudaForwardPass::Impl::append_layer(int l, const PassUnits& pu, int64_t T) {
  const ModelConfig& c = shard.config();
  const int D = c.head_dim;
  const int KV = c.n_head_kv;
  const int64_t kv_dim = int64_t(KV) * D;
  const int64_t layer_at = kv_rows_at(l, pu, T);
  if (pu.device_appends()) {
    cuda::scatter_kv_rows(k16.data() + layer_at, v16.data() + layer_at,
                          row_targets.data() + size_t(l) * targets_per_layer, int64_t(targets_per_layer), D,
                          cache.config().page_slots, stream);
    return;
  }
  uint16_t* hk16 = h_k16.data();
  uint16_t* hv16 = h_v16.data();
  download(hk16, k16.data(), size_t(T * kv_dim) * sizeof(uint16_t));
  download(hv16, v16.data(), size_t(T * kv_dim) * sizeof(uint16_t));
  download(h_q.data(), q.data(), size_t(T * c.n_head * D) * sizeof(float));
  sync();
  // Append to the host cache (as ForwardPass does), then mirror what it wrote.
  pool.parallel_for(int64_t(pu.batch.size()) * KV, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const size_t i = size_t(u / KV);
      const int h = int(u % KV);
      const int copies = pu.cache_heads[i] / KV;
      for (int cp = 0; cp < copies; ++cp) {
        for (size_t t = 0; t < pu.batch[i].tokens.size(); ++t) {
          const int64_t r = pu.row0[i] + int64_t(t);
          cache.append(pu.batch[i].seq, l, h * copies + cp, pu.batch[i].start_pos + int32_t(t),
                       hk16 + r * kv_dim + int64_t(h) * D, hv16 + r * kv_dim + int64_t(h) * D);
        }
      }
    }
  });
  mirror_written_pages();
}

void CudaForwardPass::Impl::attend(int l, const PassUnits& pu, const LayerAttention& staged, size_t units_at) {
  const ModelConfig& c = shard.config();
  const int D = c.head_dim;
  const int64_t q_dim = int64_t(c.n_head) * D;
  const float scale = 1.0f / std::sqrt(float(D));
  for (const ChunkUnit& chunk : staged.chunks) {
    chunk_attention->run(chunk.q, q_dim, chunk.keys, chunk.values, cache.config().page_slots, chunk.n_slots,
                         chunk.n_tokens, chunk.n_group, D, scale, chunk.out, q_dim);
  }
  std::vector<float> padded;  // one row of probabilities over a head's whole table
  for (const Wave& wave : staged.waves) {
    float* scratch = reserve_device(attn_scratch, cuda::attention_scratch_floats(int64_t(wave.count), pu.max_group, D,
                                                                                 wave.max_slots));
    cuda::attention_units(units.data() + units_at + wave.first, int64_t(wave.count), pu.max_group, D,
                          cache.config().page_slots, scale, wave.max_slots, scratch, stream);
    if (!pu.any_policy) continue;
    // Statistics and remembered queries for the policies, on the host.
    float* hp = h_probs.reserve(std::max<size_t>(wave.prob_floats, 1));
    download(hp, probs.data(), wave.prob_floats * sizeof(float));
    sync();  // also: the next wave reuses the probabilities
    for (size_t j = 0; j < wave.count; ++j) {
      const Unit& un = pu.list[wave.first + j];
      const BatchItem& item = pu.batch[size_t(un.item)];
      if (item.policy == nullptr) continue;
      const int qph = pu.queries_per_head[size_t(un.item)];
      const int32_t pos = item.start_pos + un.token;
      const int64_t r = pu.row0[size_t(un.item)] + un.token;
      const cpu::AttentionStats* stats = item.policy->stats(l, un.head, pos);
      if (float* keep = item.policy->query_buffer(l, un.head, pos)) {
        const float* src = h_q.data() + r * q_dim + int64_t(un.head) * qph * D;
        std::copy(src, src + int64_t(qph) * D, keep);
      }
      if (stats == nullptr) continue;
      // Over the whole table, the slots this token may not see at 0 (as the
      // CPU kernel's causal mask leaves them).
      const int32_t n_all = cache.n_slots(item.seq, l, un.head);
      const int32_t visible = h_units.data()[units_at + wave.first + j].n_slots;
      padded.assign(size_t(n_all), 0.0f);
      for (int g = 0; g < qph; ++g) {
        const float* row = hp + wave.prob_at[j] + size_t(g) * size_t(visible);
        std::copy(row, row + visible, padded.begin());
        cpu::record_stats(padded.data(), n_all, *stats);
      }
    }
  }
}

void CudaForwardPass::Impl::run_layers(const PassUnits& pu, const BatchRows& rows,
                                       const std::vector<LayerAttention>& layers_staged) {
  const ModelConfig& c = shard.config();
  const int64_t E = c.n_embd;
  const int D = c.head_dim;
  const int H = c.n_head;
  const int KV = c.n_head_kv;
  const int64_t q_dim = int64_t(H) * D;
  const int64_t kv_dim = int64_t(KV) * D;
  const int64_t T = rows.tokens();
  const std::span<const BatchItem> batch = pu.batch;
  // Each norm and SiLU writes its output quantized too where the matmul after
  // it takes int8 (q8_output): one launch fewer per matmul input.
  if (!layers.empty()) {
    cuda::rms_norm(x.data(), layers[0].attn_norm, xn.data(), T, E, c.rms_eps, stream, q8_output(layers[0].wq, T));
  }
  for (int l = 0; l < c.n_layer; ++l) {
    const DeviceLayer& w = layers[size_t(l)];
    matmul_same_input({w.wq, w.wk, w.wv}, {q.data(), k.data(), v.data()}, xn.data(), T, true);
    if (w.bq != nullptr) cuda::add_rows(q.data(), w.bq, T, q_dim, stream);
    if (w.bk != nullptr) cuda::add_rows(k.data(), w.bk, T, kv_dim, stream);
    if (w.bv != nullptr) cuda::add_rows(v.data(), w.bv, T, kv_dim, stream);
    const int64_t rows_at = kv_rows_at(l, pu, T);
    cuda::rope_qk_to_f16(q.data(), k.data(), v.data(), positions.data(), inv_freq, T, H, KV, D, c.n_rot,
                         model.rope().mscale, c.rope_style, k16.data() + rows_at, v16.data() + rows_at, stream);
    append_layer(l, pu, T);
    if (pu.device_appends()) {
      attend(l, pu, layers_staged[size_t(l)], size_t(l) * pu.list.size());
    } else {
      size_t tables_at = 0, units_at = 0;  // the staging is reused layer after layer
      const LayerAttention staged = stage_attention(l, pu, tables_at, units_at);
      upload(tables.data(), h_tables.data(), tables_at * sizeof(const uint16_t*));
      upload(units.data(), h_units.data(), units_at * sizeof(cuda::AttentionUnit));
      attend(l, pu, staged, 0);
      sync();  // the page-locked tables and units are reused by the next layer
    }

    const float* wo_in = w.wo_input_offset < 0 ? attn.data() : widen(attn.data(), T, q_dim, w.wo.cols, w.wo_input_offset);
    matmul(w.wo, wo_in, T, tmp.data());
    all_reduce(tmp.data(), size_t(T * E));
    cuda::add_rms_norm(x.data(), tmp.data(), w.ffn_norm, xn.data(), T, E, c.rms_eps, stream, q8_output(w.w_gate, T));
    matmul_same_input({w.w_gate, w.w_up}, {gate.data(), up.data()}, xn.data(), T, true);
    if (w.down_input_offset < 0) {
      cuda::silu_mul(gate.data(), up.data(), gate.data(), T * c.n_ff, stream, q8_output(w.w_down, T));
      matmul_same_input({w.w_down}, {tmp.data()}, gate.data(), T, true);
    } else {  // a rank's slice of w_down's columns, widened: quantized after widening
      cuda::silu_mul(gate.data(), up.data(), gate.data(), T * c.n_ff, stream);
      matmul(w.w_down, widen(gate.data(), T, c.n_ff, w.w_down.cols, w.down_input_offset), T, tmp.data());
    }
    all_reduce(tmp.data(), size_t(T * E));
    if (l + 1 < c.n_layer) {  // the residual add and the next layer's norm in one launch
      const DeviceLayer& next = layers[size_t(l) + 1];
      cuda::add_rms_norm(x.data(), tmp.data(), next.attn_norm, xn.data(), T, E, c.rms_eps, stream,
                         q8_output(next.wq, T));
    } else {
      cuda::add_inplace(x.data(), tmp.data(), T * E, stream);
    }
  }

  // Final norm on the rows that need logits, then the output projection.
  int64_t out_row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n_tok = int64_t(batch[i].tokens.size());
    const int64_t first = batch[i].all_logits ? rows.row0[i] : rows.row0[i] + n_tok - 1;
    const int64_t n_rows = rows.row0[i] + n_tok - first;
    cuda::rms_norm(x.data() + first * E, output_norm, xn.data() + out_row * E, n_rows, E, c.rms_eps, stream);
    out_row += n_rows;
  }
  matmul(output, xn.data(), rows.n_logit_rows, logits.data());
}

bool CudaForwardPass::Impl::graphable(const PassUnits& pu, const BatchRows& rows) const {
  // Decode steps only: a prompt's length would make a graph used once, and
  // push the decode graphs out.
  return use_graphs && pu.device_appends() && group.world() == 1 && rows.tokens() == int64_t(pu.batch.size()) &&
         rows.tokens() < cuda::kTensorCoreMinRows && rows.n_logit_rows < cuda::kTensorCoreMinRows;
}

std::vector<int64_t> CudaForwardPass::Impl::launch_signature(const PassUnits& pu, const BatchRows& rows,
                                                             const std::vector<LayerAttention>& layers_staged) const {
  std::vector<int64_t> s{rows.tokens(), rows.n_logit_rows, int64_t(pu.list.size()), pu.max_group,
                         int64_t(targets_per_layer)};
  for (const BatchItem& item : pu.batch) {
    s.push_back(int64_t(item.tokens.size()));
    s.push_back(item.all_logits);
  }
  for (const LayerAttention& staged : layers_staged) {  // graphable: no chunks
    s.push_back(int64_t(staged.waves.size()));
    for (const Wave& w : staged.waves) s.insert(s.end(), {int64_t(w.first), int64_t(w.count), w.max_slots});
  }
  for (const void* p : {static_cast<const void*>(x.data()), static_cast<const void*>(xn.data()),
                        static_cast<const void*>(q.data()), static_cast<const void*>(k.data()),
                        static_cast<const void*>(v.data()), static_cast<const void*>(attn.data()),
                        static_cast<const void*>(tmp.data()), static_cast<const void*>(gate.data()),
                        static_cast<const void*>(up.data()), static_cast<const void*>(logits.data()),
                        static_cast<const void*>(k16.data()), static_cast<const void*>(v16.data()),
                        static_cast<const void*>(positions.data()), static_cast<const void*>(x_q8.data()),
                        static_cast<const void*>(x_q8_d.data()), static_cast<const void*>(x_q8_s.data()),
                        static_cast<const void*>(row_targets.data()), static_cast<const void*>(units.data()),
                        static_cast<const void*>(attn_scratch.data())}) {
    s.push_back(int64_t(reinterpret_cast<intptr_t>(p)));
  }
  return s;
}

std::span<const float> CudaForwardPass::Impl::run(std::span<const BatchItem> batch, const AppendedHook& appended) {
  const ModelConfig& c = shard.config();
  const int64_t E = c.n_embd;
  const int D = c.head_dim;
  const int KV = c.n_head_kv;
  const int G = c.n_group();
  const int64_t kv_dim = int64_t(KV) * D;

  if (batch.empty()) return {};
  LAZYKV_CUDA_CHECK(cudaSetDevice(device));  // per thread: the worker may call from any
  const BatchRows rows = check_batch(batch, c, cache);
  const int64_t n_logit_rows = rows.n_logit_rows;
  const int64_t T = rows.tokens();

  PassUnits pu;
  pu.batch = batch;
  pu.row0 = rows.row0;
  pu.cache_heads.resize(batch.size());
  pu.queries_per_head.resize(batch.size());
  for (const BatchItem& item : batch) pu.any_policy = pu.any_policy || item.policy != nullptr;
  std::vector<Unit> chunks;  // after every other unit (stage_attention)
  for (size_t i = 0; i < batch.size(); ++i) {
    pu.cache_heads[i] = cache.heads_per_layer(batch[i].seq);
    const int qph = pu.queries_per_head[i] = G * KV / pu.cache_heads[i];
    const int32_t n_tok = int32_t(batch[i].tokens.size());
    if (!pu.any_policy && n_tok >= kChunkAttentionMinTokens) {
      for (int h = 0; h < pu.cache_heads[i]; ++h) chunks.push_back({int32_t(i), h, 0, n_tok, true});
      continue;
    }
    const int32_t per_unit = pu.any_policy ? 1 : std::min(n_tok, std::max(1, kMaxUnitQueries / qph));
    pu.max_group = std::max(pu.max_group, qph * per_unit);
    for (int h = 0; h < pu.cache_heads[i]; ++h) {
      for (int32_t t = 0; t < n_tok; t += per_unit) {
        pu.list.push_back({int32_t(i), h, t, std::min(per_unit, n_tok - t)});
      }
    }
  }
  pu.list.insert(pu.list.end(), chunks.begin(), chunks.end());
  // A unit sees a prefix of its head's table, the slots before the ones its
  // own pass appended after it: the CPU's mask by position only when every
  // slot cached so far precedes the pass (as the worker always feeds).
  for (const BatchItem& item : batch) {
    const int32_t cached = cache.max_position(item.seq);
    if (cached >= item.start_pos) {
      throw Error(ErrorCode::kInvalidArgument,
                  "forward (cuda): sequence " + std::to_string(item.seq) + " starts a pass at position " +
                      std::to_string(item.start_pos) + " but already caches position " + std::to_string(cached) +
                      "; new positions must follow the cached ones");
    }
  }
  if (!steered_rows(batch, rows.row0).rows.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "forward (cuda): skipkv's activation steering (steer > 0) runs on the CPU backend only");
  }
  if (wants_layer_input(batch)) {
    throw Error(ErrorCode::kInvalidArgument, "forward (cuda): trimkv's retention gates run on the CPU backend only");
  }
  reserve_batch(batch, cache, group, [&] { prepare(pu, rows); });
  // Nothing below allocates before the appends, so policies and cache stay in step.
  for (const BatchItem& item : batch) {
    if (item.policy != nullptr) item.policy->begin_step(item.start_pos, int32_t(item.tokens.size()));
  }

  // Embeddings (looked up on the host, from the mapped model) and positions.
  const cpu::WeightMatrix& embd = model.token_embd();
  const size_t embd_row = row_bytes(embd.type, size_t(E));
  float* hx = h_x.data();
  int32_t* hpos = h_positions.data();
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t t = 0; t < batch[i].tokens.size(); ++t) {
      const int64_t r = rows.row0[i] + int64_t(t);
      const auto* src = static_cast<const uint8_t*>(embd.data) + size_t(batch[i].tokens[t]) * embd_row;
      cpu::dequantize_row(embd.type, src, hx + r * E, E);
      hpos[r] = batch[i].start_pos + int32_t(t);
    }
  }
  upload(x.data(), hx, size_t(T * E) * sizeof(float));
  upload(positions.data(), hpos, size_t(T) * sizeof(int32_t));

  // Without a policy: every layer's slots and attention staged now, one upload each.
  std::vector<LayerAttention> layers_staged;
  if (pu.device_appends()) {
    mirror_written_pages();  // compactions and promotions since the last pass
    append_pending_slots(pu);
    size_t tables_at = 0, units_at = 0;
    for (int l = 0; l < c.n_layer; ++l) layers_staged.push_back(stage_attention(l, pu, tables_at, units_at));
    upload(tables.data(), h_tables.data(), tables_at * sizeof(const uint16_t*));
    upload(units.data(), h_units.data(), units_at * sizeof(cuda::AttentionUnit));
  }

  if (graphable(pu, rows)) {
    // Every wave's scratch before the capture (prepare sized it: no allocation here).
    for (const LayerAttention& staged : layers_staged) {
      for (const Wave& wave : staged.waves) {
        reserve_device(attn_scratch, cuda::attention_scratch_floats(int64_t(wave.count), pu.max_group, D,
                                                                    wave.max_slots));
      }
    }
    graphs.run(launch_signature(pu, rows, layers_staged), stream, [&] { run_layers(pu, rows, layers_staged); });
  } else {
    run_layers(pu, rows, layers_staged);
  }
  const size_t n_logits = size_t(n_logit_rows) * size_t(c.n_vocab);
  float* hl = h_logits.data();
  download(hl, logits.data(), n_logits * sizeof(float));
  const bool hidden_wanted = wants_hidden(batch);
  if (hidden_wanted) download(h_hidden.data(), xn.data(), size_t(n_logit_rows) * size_t(c.n_embd) * sizeof(float));
  if (pu.device_appends()) {
    const size_t rows_bytes = size_t(c.n_layer) * size_t(T * kv_dim) * sizeof(uint16_t);
    download(h_k16.data(), k16.data(), rows_bytes);
    download(h_v16.data(), v16.data(), rows_bytes);
  }
  sync();
  if (pu.device_appends()) write_back_slots(pu, T);

  // Eviction on the host, after attention saw the full cache; the pages it
  // rewrites reach the mirror at the next pass's first layer.
  eviction_seconds += end_policy_steps(batch, c.n_layer, cache, pool, appended,
                                       {hidden_wanted ? h_hidden.data() : nullptr, c.n_embd});
  return {hl, n_logits};  // page-locked; valid until the next run
}

CudaForwardPass::CudaForwardPass(const ModelShard& shard, TensorParallelGroup& group, KvCache& cache, ThreadPool& pool,
                                 int device, cpu::ActivationPrecision precision, bool use_graphs)
    : impl_(std::make_unique<Impl>(shard, group, cache, pool, device, precision, use_graphs)) {}

CudaForwardPass::~CudaForwardPass() = default;

std::span<const float> CudaForwardPass::run(std::span<const BatchItem> batch) {
  return impl_->run(batch, appended_hook_);
}

double CudaForwardPass::eviction_seconds() const { return impl_->eviction_seconds; }

ThreadPool& CudaForwardPass::policy_pool() { return impl_->pool; }

size_t CudaForwardPass::weight_bytes() const { return impl_->weight_bytes; }

size_t CudaForwardPass::graph_replays() const { return impl_->graphs.replays(); }

}  // namespace lazykv
