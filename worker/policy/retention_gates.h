// TRIM-KV's learned retention gates (arXiv 2512.03324): one small MLP per
// layer reads the attention input of each new token (the layer's input
// RMSNorm output, what the Q/K/V projections read) and gives every KV head a
// retention rate beta in (0, 1):
//
//   log beta = logsigmoid(W2 · silu(W1 · x + b1) + bias)
//
// A token created at position j then has the retention score
// (t - j) · log beta at position t (beta^(t-j), in logs): trimkv keeps the
// highest. scripts/train_trimkv.py trains the gates with the model frozen
// and writes them beside the model (retention_gates_path); Model::load
// reads them from there.
//
// File (safetensors): per layer l, "layers.{l}.w1" [hidden][n_embd],
// "layers.{l}.b1" [hidden], "layers.{l}.w2" [n_head_kv][hidden],
// "layers.{l}.bias" [n_head_kv]; F32, F16 or BF16. The metadata (format
// "lazykv-trimkv", the training command and its losses) is for people.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/matmul.h"
#include "worker/format/safetensors.h"

namespace lazykv {

// The gates in f32, copied out of the file: a few MB, and the copies are
// aligned for the matmul kernels whatever the file's offsets.
struct RetentionGates {
  int n_layer = 0, n_embd = 0, n_hidden = 0, n_head_kv = 0;
  struct Layer {
    std::vector<float> w1, b1, w2, bias;  // [n_hidden][n_embd], [n_hidden], [n_head_kv][n_hidden], [n_head_kv]
    cpu::WeightMatrix w1_matrix() const;
    cpu::WeightMatrix w2_matrix() const;
  };
  std::vector<Layer> layers;
};

// Where a model's gates live: "<model path>.trimkv.safetensors".
std::string retention_gates_path(const std::string& model_path);

// Reads and checks a gate file: Error(kNotFound) when it is missing,
// Error(kInvalidArgument) naming the file and the first defect otherwise
// (not safetensors, a missing or misshapen tensor, a gap in the layers, a
// value that is not finite).
std::shared_ptr<const RetentionGates> load_retention_gates(const std::string& path);
// The same checks on a parsed file (`path` names it in the errors): the fuzzer's entry.
std::shared_ptr<const RetentionGates> retention_gates_from(const SafetensorsFile& file, const std::string& path);

// Working memory of retention_log_beta, kept by the caller between calls.
struct RetentionScratch {
  std::vector<float> hidden;
  std::vector<uint8_t> matmul;
};

// log beta of every KV head for n rows x [n][n_embd] at `layer`:
// out [n][n_head_kv], each finite and at most 0.
void retention_log_beta(const RetentionGates& gates, int layer, const float* x, int64_t n, float* out,
                        RetentionScratch& scratch, ThreadPool& pool);

}  // namespace lazykv
