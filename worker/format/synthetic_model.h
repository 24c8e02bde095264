// Synthetic models for benchmarks, as vLLM's dummy weights: the layer shapes
// of real models with random but valid weights (seeded, finite scales), made
// at load time, so any shape can be measured without a download and a GPU
// machine without model files runs everything. Named
// "synth:<shape>:<type>[:<seed>]" (e.g. synth:llama3-8b:q4_1) wherever a
// model is taken; `lazykv synth-model` writes the same model as a GGUF file,
// so llama.cpp reads exactly the weights lazykv ran.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/tokenizer_spec.h"

namespace lazykv {

struct SyntheticShape {
  std::string name;
  std::string arch;  // "llama", or "qwen2" (Q, K, V biases)
  int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab;
  float rope_theta;
  bool tied_embeddings;
};

// smollm2-135m, qwen2.5-1.5b, llama3-8b, qwen2.5-7b (their published configs).
const std::vector<SyntheticShape>& synthetic_shapes();

struct SyntheticModelSpec {
  SyntheticShape shape;
  DType type;  // every matrix and the embedding; norms and biases are F32
  uint64_t seed = 1;
};

bool is_synthetic_name(std::string_view name);
// Error(kInvalidArgument) naming the known shapes and types for an unknown one.
SyntheticModelSpec parse_synthetic_name(const std::string& name);

// `base` (a real model's tokenizer) with unused tokens appended up to the
// shape's vocabulary, as llama.cpp wants one token per embedding row.
TokenizerSpec synthetic_tokenizer(const SyntheticModelSpec& spec, TokenizerSpec base);

// The model as GGUF, one tensor in memory at a time, filled on `threads`
// threads (0: all). A K-quant matrix whose rows are not a multiple of 256
// (SmolLM2's 576 columns) is written as Q8_0, as llama.cpp falls back too.
void write_synthetic_gguf(const SyntheticModelSpec& spec, const TokenizerSpec& tokenizer, std::FILE* out,
                          const std::string& what, int threads = 0);

}  // namespace lazykv
