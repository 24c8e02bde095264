#include "worker/format/tiny_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/fp16.h"
#include "common/seeded_random.h"
#include "kernels/cpu/quant.h"
#include "worker/format/gguf.h"
#include "worker/format/safetensors.h"

namespace lazykv {
namespace {

[[noreturn]] void bad_spec(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "tiny model: " + message);
}

// ---- vocabulary -------------------------------------------------------------

const char* const kSpecialTokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
constexpr int32_t kBosId = 1;
constexpr int32_t kEosId = 2;
constexpr int kFirstByteId = 3;

// "left right" pairs in priority order; each result is also a token.
const char* const kMerges[] = {
    "Ġ t", "Ġ a", "i n", "h e", "r e", "o n", "Ġt he", "e r", "Ġ s", "a t",
    "Ġ w", "Ġ o", "e n", "Ġ c", "i t", "i s", "a n", "o r", "e s", "Ġ b",
    "e d", "Ġ f", "in g", "Ġ h", "l l", "Ġa n", "Ġan d", "Ġ i", "Ġ Ġ", "Ġ m",
    "o u", "Ġo f", "Ġt o", "Ġ H", "l d", "Ġw or", "Ġwor ld", "l o", "Ġi s", "Ċ Ċ",
};

// The GPT-2 byte-level alphabet: printable Latin-1 bytes map to themselves,
// the rest to U+0100 upwards in byte order.
std::string byte_to_unicode(int b) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  uint32_t cp = static_cast<uint32_t>(b);
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    }
    cp = 256 + static_cast<uint32_t>(n);
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {  // all code points here are below 0x800
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// ---- deterministic weights --------------------------------------------------

// Approximately normal values with only additions and multiplications (sum
// of four uniforms, Irwin-Hall), so they are bit-identical on every platform.
std::vector<float> random_values(uint64_t seed, std::string_view tensor, size_t n, float mean,
                                 float std) {
  uint64_t state = seed ^ fnv1a(tensor);
  std::vector<float> out(n);
  const double scale = std * std::sqrt(3.0);  // var(sum of 4 U(0,1)) = 1/3
  for (size_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int k = 0; k < 4; ++k) sum += static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
    out[i] = static_cast<float>(mean + (sum - 2.0) * scale);
  }
  return out;
}

// llama.cpp's q/k permutation: rows of each head go from rotate-half order
// (HF) to interleaved pairs (GGUF).
std::vector<float> hf_to_gguf_rows(const std::vector<float>& hf, int n_heads, int head_dim,
                                   size_t row_len) {
  std::vector<float> out(hf.size());
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < half; ++i) {
      const size_t base = static_cast<size_t>(h) * head_dim;
      std::memcpy(&out[(base + 2 * i) * row_len], &hf[(base + i) * row_len], row_len * sizeof(float));
      std::memcpy(&out[(base + 2 * i + 1) * row_len], &hf[(base + half + i) * row_len],
                  row_len * sizeof(float));
    }
  }
  return out;
}

std::vector<float> gguf_to_hf_rows(const std::vector<float>& gguf, int n_heads, int head_dim,
                                   size_t row_len) {
  std::vector<float> out(gguf.size());
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < half; ++i) {
      const size_t base = static_cast<size_t>(h) * head_dim;
      std::memcpy(&out[(base + i) * row_len], &gguf[(base + 2 * i) * row_len], row_len * sizeof(float));
      std::memcpy(&out[(base + half + i) * row_len], &gguf[(base + 2 * i + 1) * row_len],
                  row_len * sizeof(float));
    }
  }
  return out;
}

// Converts rows of floats to `type`; `rounded` receives the values the bytes
// decode back to.
std::vector<uint8_t> encode_rows(DType type, const std::vector<float>& values, size_t row_len,
                                 std::vector<float>& rounded) {
  const size_t rows = values.size() / row_len;
  const size_t rb = row_bytes(type, row_len);
  std::vector<uint8_t> bytes(rb * rows);
  rounded.resize(values.size());
  if (type == DType::kF32) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
    rounded = values;
    return bytes;
  }
  for (size_t r = 0; r < rows; ++r) {
    const float* src = values.data() + r * row_len;
    uint8_t* dst = bytes.data() + r * rb;
    float* back = rounded.data() + r * row_len;
    if (type == DType::kF16 || type == DType::kBF16) {
      for (size_t i = 0; i < row_len; ++i) {
        const uint16_t h = type == DType::kF16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
        back[i] = type == DType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
      }
    } else {
      cpu::quantize_row(type, src, dst, static_cast<int64_t>(row_len));
      cpu::dequantize_row(type, dst, back, static_cast<int64_t>(row_len));
    }
  }
  return bytes;
}

struct TinyTensor {
  std::string hf_name;
  std::string gguf_name;
  std::vector<int64_t> hf_shape;  // PyTorch order: [out, in] or [n]
  DType gguf_type = DType::kF32;
  std::vector<uint8_t> gguf_bytes;
  std::vector<float> hf_values;   // what the GGUF bytes decode to, in HF row order
};

void validate(const TinyModelSpec& s) {
  if (s.arch != "llama" && s.arch != "qwen2") bad_spec("arch must be llama or qwen2, got '" + s.arch + "'");
  if (s.n_layer <= 0 || s.n_embd <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.n_ff <= 0 ||
      s.n_ctx <= 0) {
    bad_spec("sizes must be positive");
  }
  if (s.n_embd % s.n_head != 0 || s.head_dim() % 2 != 0) {
    bad_spec("n_embd must be n_head times an even head_dim");
  }
  if (s.n_head % s.n_head_kv != 0) bad_spec("n_head must be a multiple of n_head_kv");
  for (DType t : {s.weight_type, s.token_embd_type.value_or(s.weight_type)}) {
    if (t == DType::kQ8_1 || t == DType::kQ8_K) bad_spec("Q8_1/Q8_K are activation formats");
    const size_t block = dtype_traits(t).block_elems;
    if (s.n_embd % block != 0 || s.n_ff % block != 0) {
      bad_spec("n_embd and n_ff must be multiples of the " + std::string(dtype_traits(t).name) +
               " block size " + std::to_string(block));
    }
  }
}

std::vector<TinyTensor> build_tensors(const TinyModelSpec& s) {
  validate(s);
  const int64_t n_vocab = tiny_vocab_size();
  const int64_t hd = s.head_dim();
  const int64_t n_embd = s.n_embd;
  const int64_t kv_dim = s.n_head_kv * hd;
  const DType embd_type = s.token_embd_type.value_or(s.weight_type);
  std::vector<TinyTensor> out;

  // permute_heads > 0: llama q/k row permutation over that many heads.
  auto add = [&](std::string hf_name, std::string gguf_name, std::vector<int64_t> hf_shape,
                 DType type, float mean, float std, int permute_heads) {
    TinyTensor t;
    t.hf_name = std::move(hf_name);
    t.gguf_name = std::move(gguf_name);
    t.hf_shape = std::move(hf_shape);
    t.gguf_type = type;
    size_t n = 1;
    for (int64_t d : t.hf_shape) n *= static_cast<size_t>(d);
    const size_t row_len = static_cast<size_t>(t.hf_shape.back());
    std::vector<float> hf = random_values(s.seed, t.hf_name, n, mean, std);
    std::vector<float> gguf = permute_heads > 0 ? hf_to_gguf_rows(hf, permute_heads, s.head_dim(), row_len) : hf;
    std::vector<float> rounded;
    t.gguf_bytes = encode_rows(type, gguf, row_len, rounded);
    t.hf_values = permute_heads > 0 ? gguf_to_hf_rows(rounded, permute_heads, s.head_dim(), row_len)
                                    : std::move(rounded);
    out.push_back(std::move(t));
  };
  auto matrix_std = [](int64_t fan_in) { return 0.5f / std::sqrt(static_cast<float>(fan_in)); };
  const bool llama = s.arch == "llama";

  add("model.embed_tokens.weight", "token_embd.weight", {n_vocab, n_embd}, embd_type, 0, 0.25f, 0);
  add("model.norm.weight", "output_norm.weight", {n_embd}, DType::kF32, 1, 0.1f, 0);
  if (!s.tied_embeddings) {
    add("lm_head.weight", "output.weight", {n_vocab, n_embd}, embd_type, 0, 0.25f, 0);
  }
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".";
    const std::string gg = "blk." + std::to_string(l) + ".";
    const DType w = s.weight_type;
    add(hf + "input_layernorm.weight", gg + "attn_norm.weight", {n_embd}, DType::kF32, 1, 0.1f, 0);
    add(hf + "self_attn.q_proj.weight", gg + "attn_q.weight", {n_embd, n_embd}, w, 0,
        matrix_std(n_embd), llama ? s.n_head : 0);
    add(hf + "self_attn.k_proj.weight", gg + "attn_k.weight", {kv_dim, n_embd}, w, 0,
        matrix_std(n_embd), llama ? s.n_head_kv : 0);
    add(hf + "self_attn.v_proj.weight", gg + "attn_v.weight", {kv_dim, n_embd}, w, 0,
        matrix_std(n_embd), 0);
    if (!llama) {
      add(hf + "self_attn.q_proj.bias", gg + "attn_q.bias", {n_embd}, DType::kF32, 0, 0.1f, 0);
      add(hf + "self_attn.k_proj.bias", gg + "attn_k.bias", {kv_dim}, DType::kF32, 0, 0.1f, 0);
      add(hf + "self_attn.v_proj.bias", gg + "attn_v.bias", {kv_dim}, DType::kF32, 0, 0.1f, 0);
    }
    add(hf + "self_attn.o_proj.weight", gg + "attn_output.weight", {n_embd, n_embd}, w, 0,
        matrix_std(n_embd), 0);
    add(hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", {n_embd}, DType::kF32, 1,
        0.1f, 0);
    add(hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", {s.n_ff, n_embd}, w, 0,
        matrix_std(n_embd), 0);
    add(hf + "mlp.up_proj.weight", gg + "ffn_up.weight", {s.n_ff, n_embd}, w, 0,
        matrix_std(n_embd), 0);
    add(hf + "mlp.down_proj.weight", gg + "ffn_down.weight", {n_embd, s.n_ff}, w, 0,
        matrix_std(s.n_ff), 0);
  }
  return out;
}

const char* const kChatTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.good()) throw Error(ErrorCode::kIo, "tiny model: cannot write '" + path.string() + "'");
}

}  // namespace

int tiny_vocab_size() {
  return static_cast<int>(std::size(kSpecialTokens) + 256 + std::size(kMerges));
}

TokenizerSpec tiny_tokenizer_spec(const TinyModelSpec& spec) {
  TokenizerSpec t;
  t.model = "gpt2";
  t.pre = spec.arch == "qwen2" ? "qwen2" : "smollm";
  for (const char* special : kSpecialTokens) {
    t.tokens.emplace_back(special);
    t.token_types.push_back(3);
  }
  for (int b = 0; b < 256; ++b) {
    t.tokens.push_back(byte_to_unicode(b));
    t.token_types.push_back(1);
  }
  for (const char* merge : kMerges) {
    std::string m = merge;
    const size_t space = m.find(' ');
    t.tokens.push_back(m.substr(0, space) + m.substr(space + 1));
    t.token_types.push_back(1);
    t.merges.push_back(std::move(m));
  }
  t.bos_id = kBosId;
  t.eos_id = kEosId;
  t.pad_id = kEosId;
  t.unk_id = 0;
  t.eog_ids = {0, kEosId};
  t.add_bos = false;
  t.chat_template = kChatTemplate;
  static_assert(kFirstByteId == std::size(kSpecialTokens));
  return t;
}

void write_tiny_gguf(const std::string& path, const TinyModelSpec& s) {
  const std::vector<TinyTensor> tensors = build_tensors(s);
  const TokenizerSpec tok = tiny_tokenizer_spec(s);
  const std::string& a = s.arch;

  GgufWriter w;
  set_model_metadata(w, {a, "tiny-" + a, s.n_layer, s.n_ctx, s.n_embd, s.n_ff, s.n_head, s.n_head_kv, s.head_dim(),
                         static_cast<int>(tok.tokens.size()), s.rope_theta, s.rms_eps, s.weight_type != DType::kF32});
  set_tokenizer_metadata(w, tok);

  for (const TinyTensor& t : tensors) {
    w.add_tensor(t.gguf_name, std::vector<int64_t>(t.hf_shape.rbegin(), t.hf_shape.rend()),
                 t.gguf_type, t.gguf_bytes);
  }
  w.write(path);
}

void write_tiny_hf_dir(const std::string& dir, const TinyModelSpec& s, bool sharded) {
  namespace fs = std::filesystem;
  const std::vector<TinyTensor> tensors = build_tensors(s);
  const bool llama = s.arch == "llama";
  fs::create_directories(dir);

  nlohmann::ordered_json config = {
      {"architectures", {llama ? "LlamaForCausalLM" : "Qwen2ForCausalLM"}},
      {"model_type", s.arch},
      {"hidden_size", s.n_embd},
      {"intermediate_size", s.n_ff},
      {"num_attention_heads", s.n_head},
      {"num_key_value_heads", s.n_head_kv},
      {"num_hidden_layers", s.n_layer},
      {"head_dim", s.head_dim()},
      {"hidden_act", "silu"},
      {"rms_norm_eps", s.rms_eps},
      {"rope_theta", s.rope_theta},
      {"vocab_size", tiny_vocab_size()},
      {"max_position_embeddings", s.n_ctx},
      {"tie_word_embeddings", s.tied_embeddings},
      {"bos_token_id", kBosId},
      {"eos_token_id", kEosId},
      {"torch_dtype", "float32"},
  };
  if (llama) {
    config["attention_bias"] = false;
    config["mlp_bias"] = false;
  } else {
    config["use_sliding_window"] = false;
  }
  write_text(fs::path(dir) / "config.json", config.dump(2) + "\n");

  std::vector<SafetensorsTensor> st;
  for (const TinyTensor& t : tensors) {
    SafetensorsTensor x;
    x.name = t.hf_name;
    x.type = DType::kF32;
    x.shape = t.hf_shape;
    x.data = reinterpret_cast<const uint8_t*>(t.hf_values.data());
    x.bytes = t.hf_values.size() * sizeof(float);
    st.push_back(std::move(x));
  }
  if (!sharded) {
    fs::remove(fs::path(dir) / "model.safetensors.index.json");
    write_safetensors((fs::path(dir) / "model.safetensors").string(), st);
    return;
  }
  fs::remove(fs::path(dir) / "model.safetensors");
  const size_t half = st.size() / 2;
  const std::string names[2] = {"model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors"};
  const std::vector<SafetensorsTensor> parts[2] = {
      std::vector<SafetensorsTensor>(st.begin(), st.begin() + static_cast<ptrdiff_t>(half)),
      std::vector<SafetensorsTensor>(st.begin() + static_cast<ptrdiff_t>(half), st.end())};
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total = 0;
  for (int p = 0; p < 2; ++p) {
    write_safetensors((fs::path(dir) / names[p]).string(), parts[p]);
    for (const SafetensorsTensor& t : parts[p]) {
      weight_map[t.name] = names[p];
      total += t.bytes;
    }
  }
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                        {"weight_map", weight_map}};
  write_text(fs::path(dir) / "model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace lazykv
