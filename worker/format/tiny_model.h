// Tiny random-weight models for tests: a complete llama.cpp-style GGUF (with
// byte-level BPE tokenizer metadata and a ChatML template) and the same model
// as a Hugging Face directory (config.json + safetensors).
//
// Both writers derive every weight from (seed, tensor) deterministically, so a
// GGUF and an HF directory written from the same spec hold the same model:
// - for arch "llama" the GGUF attn_q/attn_k rows are permuted per head the way
//   llama.cpp's converter does (GGUF uses interleaved RoPE, HF rotate-half):
//   HF row (h, i) -> GGUF row (h, 2i) and HF row (h, head_dim/2 + i) -> GGUF
//   row (h, 2i + 1) for i < head_dim/2; qwen2 is not permuted.
// - when the GGUF matrices are quantized (or F16/BF16), the HF directory holds
//   the dequantized values, so both describe exactly the same weights.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/tokenizer_spec.h"

namespace lazykv {

struct TinyModelSpec {
  std::string arch = "llama";  // or "qwen2" (adds q/k/v biases)
  int n_layer = 2;
  int n_embd = 64;
  int n_head = 4;
  int n_head_kv = 2;
  int n_ff = 128;
  int n_ctx = 256;
  DType weight_type = DType::kF32;          // GGUF matrices; norms and biases are always F32
  std::optional<DType> token_embd_type;     // GGUF token_embd (and output); default weight_type
  bool tied_embeddings = true;
  float rope_theta = 10000;
  float rms_eps = 1e-5f;
  uint64_t seed = 1;

  int head_dim() const { return n_embd / n_head; }
};

// The tiny vocabulary: ids 0..2 are <|endoftext|>, <|im_start|> (bos) and
// <|im_end|> (eos, pad), then the 256 GPT-2 byte-level characters in byte
// order (byte b is id 3 + b), then one token per merge.
TokenizerSpec tiny_tokenizer_spec(const TinyModelSpec& spec);
int tiny_vocab_size();

// Throws Error(kInvalidArgument) for an inconsistent spec (e.g. n_embd not a
// multiple of n_head, rows not a multiple of the quantization block size).
void write_tiny_gguf(const std::string& path, const TinyModelSpec& spec);

// Writes config.json and model.safetensors (F32), or with `sharded` two
// shards plus model.safetensors.index.json. Creates `dir` if needed.
void write_tiny_hf_dir(const std::string& dir, const TinyModelSpec& spec, bool sharded = false);

}  // namespace lazykv
