// Hyper-parameters of a decoder-only transformer, read from a model file's
// metadata (GGUF keys or config.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"

namespace lazykv {

enum class Architecture { kLlama, kQwen2 };

enum class RopeScaling { kNone, kLinear, kYarn, kLlama3 };

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string arch_name;  // as in the file: "llama", "qwen2"
  std::string name;       // general.name or the directory name
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_rot = 0;          // rotated dims per head (usually head_dim)
  int n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_factor = 1.0f;
  int rope_orig_ctx = 0;                 // YaRN / Llama-3 original context
  float rope_low_freq_factor = 1.0f;     // Llama-3
  float rope_high_freq_factor = 4.0f;    // Llama-3
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  cpu::RopeStyle rope_style = cpu::RopeStyle::kNeox;
  bool tied_embeddings = false;
  bool qkv_bias = false;

  int n_group() const { return n_head / n_head_kv; }
};

// Per-dimension inverse frequencies [n_rot/2] with the scaling folded in, and
// the magnitude factor applied to cos/sin (YaRN), from the config and an
// optional per-dimension frequency-factor tensor (GGUF rope_freqs).
struct RopeTable {
  std::vector<float> inv_freq;
  float mscale = 1.0f;
};
RopeTable make_rope_table(const ModelConfig& config, const std::vector<float>& freq_factors = {});

}  // namespace lazykv
