// The CUDA backend's op set: host-callable launchers that mirror
// kernels/cpu (same formats, same semantics). Every pointer is a device
// pointer unless said otherwise; shapes are given per argument, row-major.
// Launches are asynchronous on `stream`; launchers validate their arguments
// and throw lazykv::Error (kInvalidArgument for bad arguments, kInternal for
// CUDA failures, see cuda_check.h). Kernels never allocate.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/dtype.h"
#include "kernels/cpu/ops.h"

namespace lazykv::cuda {

// True when the CUDA runtime reports at least one usable device (false when
// there is no driver, no device, or the query fails).
bool cuda_device_available();

// The number of usable CUDA devices (>= 1); throws Error(kUnavailable) saying
// why there is none (no driver, no device: the runtime's own words).
int usable_device_count();

// The current device's copy rate: bytes per second a device-to-device
// cudaMemcpy of a 1 GiB buffer moves (each byte read once and written once),
// best of 5. The reference a memory-bound kernel is measured against.
double measure_copy_rate();

// ---- elementwise and normalisation --------------------------------------

struct Q8Activations;

// y[r] = x[r] / rms(x[r]) * weight, for each row r. x and y may alias. With
// q8, y is also written quantized (quantize_q8 of y, in the same launch; n a
// multiple of 32): the input of a matmul_q8.
void rms_norm(const float* x,       // [n_rows, n]
              const float* weight,  // [n]
              float* y,             // [n_rows, n]
              int64_t n_rows, int64_t n, float eps, cudaStream_t stream, const Q8Activations* q8 = nullptr);

// x += y, then out = rms_norm(x) (bit for bit add_inplace and rms_norm where
// every pointer is 16-byte aligned, in one launch: a layer's residual add and
// the norm after it). out must not alias x or y. q8 as for rms_norm.
void add_rms_norm(float* x,             // [n_rows, n]
                  const float* y,       // [n_rows, n]
                  const float* weight,  // [n]
                  float* out,           // [n_rows, n]
                  int64_t n_rows, int64_t n, float eps, cudaStream_t stream, const Q8Activations* q8 = nullptr);

// out = silu(gate) * up. out may alias gate or up. q8 as for rms_norm.
void silu_mul(const float* gate,  // [n]
              const float* up,    // [n]
              float* out,         // [n]
              int64_t n, cudaStream_t stream, const Q8Activations* q8 = nullptr);

// x += y
void add_inplace(float* x,        // [n]
                 const float* y,  // [n]
                 int64_t n, cudaStream_t stream);

// x[r] += bias for every row r (a layer's bias on a batch of rows).
void add_rows(float* x,           // [n_rows, n]
              const float* bias,  // [n]
              int64_t n_rows, int64_t n, cudaStream_t stream);

// f32 -> f16 (round to nearest even), e.g. to append K/V to the cache.
void to_f16(const float* x,  // [n]
            uint16_t* y,     // [n] f16 bits
            int64_t n, cudaStream_t stream);

using RopeStyle = cpu::RopeStyle;

// Rotates the first n_rot dims of every head of every token, token t at
// positions[t] (cpu::rope applied per token). inv_freq has scaling folded in;
// mscale multiplies cos and sin.
void rope(float* x,                  // [n_tokens, n_heads, head_dim]
          const int32_t* positions,  // [n_tokens]
          const float* inv_freq,     // [n_rot / 2]
          int64_t n_tokens, int n_heads, int head_dim, int n_rot, float mscale, RopeStyle style,
          cudaStream_t stream);

// A layer's new rows in one launch: rope on q and k (as rope), then k and v
// to f16 (as to_f16) into k16 and v16, bit for bit the four ops.
void rope_qk_to_f16(float* q,                  // [n_tokens, n_q_heads, head_dim]
                    float* k,                  // [n_tokens, n_kv_heads, head_dim]
                    const float* v,            // [n_tokens, n_kv_heads, head_dim]
                    const int32_t* positions,  // [n_tokens]
                    const float* inv_freq,     // [n_rot / 2]
                    int64_t n_tokens, int n_q_heads, int n_kv_heads, int head_dim, int n_rot, float mscale,
                    RopeStyle style,
                    uint16_t* k16,  // [n_tokens, n_kv_heads, head_dim] f16 bits
                    uint16_t* v16,  // [n_tokens, n_kv_heads, head_dim] f16 bits
                    cudaStream_t stream);

// ---- quantized rows ----------------------------------------------------------

// Whether dequantize_rows handles `type`: F32, F16, BF16, Q4_0, Q4_1, Q8_0,
// Q4_K, Q6_K (the GGML block formulas, as cpu::dequantize_row).
bool dequantize_supported(DType type);

// src must be 2-byte aligned (4 for F32); n a multiple of the block size.
void dequantize_rows(DType type,
                     const void* src,  // [n_rows, row_bytes(type, n)]
                     float* dst,       // [n_rows, n]
                     int64_t n_rows, int64_t n, cudaStream_t stream);

// ---- matmul on quantized weights ---------------------------------------------

// Weights as matmul reads them: the tiled layout. Rows go in tiles of 32
// whose 16-byte chunks lie side by side (chunk c of the tile's 32 rows is 512
// contiguous bytes), so a warp, a lane per row, loads 512 bytes per 128-bit
// load and shares each activation load. Quantized types keep their bits (no
// conversion, the same bytes): the quants in the chunks (Q8_0 16 per chunk,
// Q4_0/Q4_1 32), each block's f16 d (Q4_1: d and m) in a second plane after
// them, laid out the same way. F16/BF16 take 8 per chunk; padding is zeros.
struct WeightMatrix {
  DType type = DType::kF32;
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features
  const void* data = nullptr;  // tiled_bytes(type, rows, cols), 16-byte aligned, written by tile_weights
};

// Weight types matmul reads in their own bits: F16, BF16, Q8_0, Q4_0, Q4_1.
bool matmul_supported(DType type);

// Bytes of the tiled layout of a rows x cols matrix (cols a multiple of 32
// for the quantized types).
size_t tiled_bytes(DType type, int64_t rows, int64_t cols);

// GGML rows to the tiled layout; src 4-byte aligned, tiled 16-byte aligned.
void tile_weights(DType type,
                  const void* src,  // [rows, row_bytes(type, cols)]
                  int64_t rows, int64_t cols,
                  void* tiled,      // [tiled_bytes(type, rows, cols)]
                  cudaStream_t stream);

// y[b][r] = Σ_k dequant(w)[r][k] · x[b][k], activations kept in f32 (no
// activation quantization, unlike cpu::matmul's int8 mode). Each pass over
// the weights serves up to 8 activation rows: meant for decode and small
// batches (gemm.h's TensorCoreGemm takes prefill).
void matmul(const WeightMatrix& w,
            const float* x,  // [batch, w.cols]
            int64_t batch,
            float* y,        // [batch, w.rows]
            cudaStream_t stream);

// matmul of n (1 to 3) matrices of one type and width on the same
// activations, in one launch (a layer's Q, K and V; gate and up), so small
// matrices share the GPU with the others: y[i] = x · w[i]ᵀ.
void matmul_shared_input(const WeightMatrix* w, float* const* y, int n, const float* x, int64_t batch,
                         cudaStream_t stream);

// Activations quantized to 8 bits per 32-column block, for matmul_q8: row r
// of a [batch, cols] input has its bytes at q + r·cols and its blocks' scale
// d = max|x| / 127 and sum s = d·Σq at d + r·cols/32 and s + r·cols/32.
struct Q8Activations {
  int8_t* q;  // [batch, cols], 16-byte aligned
  float* d;   // [batch, cols / 32]
  float* s;   // [batch, cols / 32]
};

// x to Q8Activations (q = round(x / d)); cols a multiple of 32.
void quantize_q8(const float* x,  // [batch, cols]
                 int64_t batch, int64_t cols, const Q8Activations& out, cudaStream_t stream);

// Weight types matmul_q8 reads: Q4_0, Q4_1, Q8_0.
bool matmul_q8_supported(DType type);

// matmul_shared_input on int8 activations: integer dot products per block,
// as llama.cpp and cpu::matmul's kInt8 mode (less exact than f32, about a
// quarter of the arithmetic per weight).
void matmul_q8_shared_input(const WeightMatrix* w, float* const* y, int n, const Q8Activations& x, int64_t batch,
                            cudaStream_t stream);

// ---- attention -----------------------------------------------------------------

// ---- KV pages -------------------------------------------------------------------

// Page i of `staged` to dst[i], for i < n_pages: the pages a host pool wrote,
// staged together and placed into its device mirror by one launch.
// page_bytes a multiple of 16; every address 16-byte aligned.
void scatter_pages(const uint8_t* staged,  // [n_pages, page_bytes]
                   uint8_t* const* dst,    // [n_pages] -> [page_bytes]
                   int64_t n_pages, int64_t page_bytes, cudaStream_t stream);

// Where one new K/V row goes in a device page pool (pages in the
// cpu::KvPages layout): its page's keys and values and its slot there.
struct KvRowTarget {
  uint16_t* keys;    // [head_dim, page_slots]: the row becomes column in_page
  uint16_t* values;  // [page_slots, head_dim]: the row becomes row in_page
  int32_t in_page;
  int32_t row;       // the source row in k16 / v16
};

// For each target, row `row` of k16 and v16 into its slot: a pass's new K/V
// written straight into the device pool, one launch for all of them.
void scatter_kv_rows(const uint16_t* k16,  // [rows, head_dim] f16
                     const uint16_t* v16,  // [rows, head_dim] f16
                     const KvRowTarget* targets,  // [n_targets] in device memory
                     int64_t n_targets, int head_dim, int32_t page_slots, cudaStream_t stream);

// Paged f16 KV of one KV head (cpu::KvPages with device memory): the page
// tables themselves are device arrays of device pointers.
struct KvPages {
  const uint16_t* const* keys;    // [n_pages] -> [head_dim, page_slots] f16 (keys transposed within a page)
  const uint16_t* const* values;  // [n_pages] -> [page_slots, head_dim] f16
  const int32_t* positions;       // [n_slots] token position of each slot
  int32_t n_slots;
  int32_t page_slots;
};

// cpu::attention_group on the device: for each query g of the group,
// probs[g] = softmax(scale · q[g] · k_s) over the slots with position ≤
// max_pos (others get probability 0; a fully masked row is all zeros with
// lse = -inf and out = 0), out[g] = Σ_s probs[g][s] · v_s.
void attention_group(const float* q,  // [n_group, head_dim]
                     int n_group, int head_dim, const KvPages& kv, int64_t max_pos, float scale,
                     float* probs,  // [n_group, kv.n_slots] receives the probabilities
                     float* out,    // [n_group, head_dim]
                     float* lse,    // [n_group] log-sum-exp of each row, or null
                     cudaStream_t stream);

// One query group over the first n_slots slots of its paged KV: a forward
// pass's every (token, cache head) in one launch. Causality is a prefix: the
// slots a token may not see are the ones its own pass appended after it, the
// last of the table. Every pointer is a device pointer; a unit array built on
// the host is uploaded as it is.
struct AttentionUnit {
  const float* q;                 // [n_group, head_dim] (n_tokens > 1: each token's rows token_stride apart)
  float* out;                     // likewise
  float* probs;                   // [n_group, n_slots]: receives the probabilities; null: not written
  const uint16_t* const* keys;    // [pages] -> [head_dim, page_slots] f16
  const uint16_t* const* values;  // [pages] -> [page_slots, head_dim] f16
  int32_t n_slots;                // visible slots (0: out = 0); the last token's
  int32_t n_group;                // queries, 1 .. max_group
  // Consecutive tokens of one sequence (a prefill chunk) in one unit, so they
  // share each K/V read: n_group / n_tokens queries per token, token t's at
  // q + t·token_stride (likewise out), seeing n_slots - (n_tokens - 1 - t)
  // slots; probs rows hold 0 past a token's own.
  int32_t n_tokens = 1;
  int32_t token_stride = 0;       // floats
};

// Floats of the scratch attention_units needs: every unit's split states,
// the splits being the blocks of up to 256 slots that max_slots spans.
size_t attention_scratch_floats(int64_t n_units, int max_group, int head_dim, int32_t max_slots);

// For each unit: probs[g] = softmax(scale · q[g] · k_s) over its slots,
// out[g] = Σ_s probs[g][s] · v_s (cpu::attention_group on the prefix).
// max_slots: at least every unit's n_slots; each unit's slots are split
// across blocks (flash-decoding), so one long context fills the GPU.
void attention_units(const AttentionUnit* units,  // [n_units] in device memory
                     int64_t n_units, int max_group, int head_dim, int32_t page_slots, float scale,
                     int32_t max_slots,
                     float* scratch,  // [attention_scratch_floats(n_units, max_group, head_dim, max_slots)]
                     cudaStream_t stream);

}  // namespace lazykv::cuda
