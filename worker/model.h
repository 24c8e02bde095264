// A loaded model: configuration, tokenizer description and weights. Weights
// stay in the memory-mapped file in their stored type (quantized GGUF blocks
// or F32/F16/BF16 safetensors); only small vectors (norms, biases) are
// converted to f32 when the file stores them otherwise.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer_spec.h"
#include "kernels/cpu/matmul.h"
#include "worker/format/gguf.h"
#include "worker/format/safetensors.h"
#include "worker/model_config.h"
#include "worker/policy/query_stats.h"
#include "worker/policy/retention_gates.h"
#include "worker/policy/steering.h"
#include "worker/policy/token_classes.h"

namespace lazykv {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  cpu::WeightMatrix wq;              // [n_head*head_dim][n_embd]
  cpu::WeightMatrix wk;              // [n_head_kv*head_dim][n_embd]
  cpu::WeightMatrix wv;              // [n_head_kv*head_dim][n_embd]
  cpu::WeightMatrix wo;              // [n_embd][n_head*head_dim]
  const float* bq = nullptr;         // [n_head*head_dim] (Qwen2)
  const float* bk = nullptr;         // [n_head_kv*head_dim]
  const float* bv = nullptr;         // [n_head_kv*head_dim]
  const float* ffn_norm = nullptr;   // [n_embd]
  cpu::WeightMatrix w_gate;          // [n_ff][n_embd]
  cpu::WeightMatrix w_up;            // [n_ff][n_embd]
  cpu::WeightMatrix w_down;          // [n_embd][n_ff]
};

class Model {
 public:
  // path: a .gguf file, a Hugging Face directory or a synthetic model's name
  // ("synth:<shape>:<type>", made in memory). A GGUF file's weights are
  // read where `pages` holds them (kHuge: a private copy on huge pages, for
  // the CPU's decode; common/mapped_file.h). Throws Error(kInvalidModel)
  // naming the problem for corrupt or unsupported models.
  static std::unique_ptr<Model> load(const std::string& path, FilePages pages = FilePages::kMapped);

  const ModelConfig& config() const { return config_; }
  // From GGUF metadata; for a HF directory only chat_template/ids may be set
  // (the caller reads tokenizer.json).
  const TokenizerSpec& tokenizer_spec() const { return tokenizer_; }
  const std::string& path() const { return path_; }
  bool is_hf_dir() const { return hf_ != nullptr; }

  const cpu::WeightMatrix& token_embd() const { return token_embd_; }  // [n_vocab][n_embd]
  const cpu::WeightMatrix& output() const { return output_; }          // [n_vocab][n_embd]
  const float* output_norm() const { return output_norm_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const RopeTable& rope() const { return rope_; }
  // The query statistics beside the model file (query_stats_path), checked
  // against its shape; null when there are none, with the reason in
  // query_stats_missing() (a bad file never stops the model from loading).
  std::shared_ptr<const QueryStats> query_stats() const { return query_stats_; }
  const std::string& query_stats_missing() const { return query_stats_missing_; }
  // What each token id marks in generated text (skipkv); null when the
  // model has no token texts (a Hugging Face directory, whose
  // tokenizer.json the coordinator reads).
  std::shared_ptr<const TokenClasses> token_classes() const { return token_classes_; }
  // The steering vector beside the model file (steering_path), checked
  // against its shape; null when there is none, with the reason in
  // steering_missing() (a bad file never stops the model from loading).
  std::shared_ptr<const SteeringVector> steering() const { return steering_; }
  const std::string& steering_missing() const { return steering_missing_; }
  // trimkv's retention gates beside the model file (retention_gates_path),
  // the same way.
  std::shared_ptr<const RetentionGates> retention_gates() const { return retention_gates_; }
  const std::string& retention_gates_missing() const { return retention_gates_missing_; }
  size_t weight_bytes() const { return weight_bytes_; }
  // Bytes of weights a decode step reads: every layer's matrices and the
  // output projection (the token embedding is read one row per token).
  size_t decode_weight_bytes() const { return decode_weight_bytes_; }

 private:
  Model() = default;
  void load_gguf(const std::string& path, FilePages pages);
  void load_hf(const std::string& dir);
  void finish();
  // After finish(): the calibration files beside the model, each into its
  // pointer or its reason for being null.
  void find_calibration_files();
  const float* keep_f32(std::vector<float> values);

  std::string path_;
  ModelConfig config_;
  TokenizerSpec tokenizer_;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<HfModelDir> hf_;
  std::vector<std::unique_ptr<std::vector<float>>> owned_;
  cpu::WeightMatrix token_embd_;
  cpu::WeightMatrix output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  RopeTable rope_;
  std::shared_ptr<const QueryStats> query_stats_;
  std::string query_stats_missing_ = "no query statistics for a model made in memory";
  std::shared_ptr<const TokenClasses> token_classes_;
  std::shared_ptr<const SteeringVector> steering_;
  std::string steering_missing_ = "no steering vector for a model made in memory";
  std::shared_ptr<const RetentionGates> retention_gates_;
  std::string retention_gates_missing_ = "no retention gates for a model made in memory";
  size_t weight_bytes_ = 0;
  size_t decode_weight_bytes_ = 0;
};

// Reads the tokenizer description from GGUF metadata.
TokenizerSpec tokenizer_spec_from_gguf(const GgufFile& gguf);

// The tokenizer of the synthetic model `name` (synthetic_model.h): the
// default model's when it is in the cache, else the built-in byte-level one
// (tiny_model.h), padded to the shape's vocabulary.
TokenizerSpec synthetic_model_tokenizer(const std::string& name);

}  // namespace lazykv
