// Everything needed to build a tokenizer, as read from a model file (GGUF
// metadata) or a Hugging Face tokenizer.json. The worker's loaders fill it;
// the coordinator's Tokenizer consumes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lazykv {

struct TokenizerSpec {
  std::string model;         // "gpt2" (byte-level BPE) is the supported one
  std::string pre;           // pre-tokenizer name: "smollm", "qwen2", "llama-bpe", "default", ...
  std::vector<std::string> tokens;     // id -> token text (byte-level encoded)
  std::vector<int32_t> token_types;    // GGUF token types (1 normal, 3 control, 4 user-defined, ...); may be empty
  std::vector<std::string> merges;     // "left right", in priority order
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  int32_t unk_id = -1;
  std::vector<int32_t> eog_ids;  // ids that end generation (eos, <|im_end|>, <|endoftext|>, ...)
  bool add_bos = false;
  std::string chat_template;  // Jinja source; empty if the model has none
};

}  // namespace lazykv
