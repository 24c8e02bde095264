#include "worker/model.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/error.h"
#include "common/fp16.h"
#include "common/model_registry.h"
#include "kernels/cpu/quant.h"
#include "worker/format/synthetic_model.h"
#include "worker/format/tiny_model.h"

namespace lazykv {
namespace {

constexpr std::string_view kSupportedArchs = "llama, qwen2";

[[noreturn]] void invalid(const std::string& what) { throw Error(ErrorCode::kInvalidModel, what); }

Architecture parse_arch(const std::string& name) {
  if (name == "llama") return Architecture::kLlama;
  if (name == "qwen2") return Architecture::kQwen2;
  invalid("unsupported architecture '" + name + "' (supported: " + std::string(kSupportedArchs) + ")");
}

void check_config(const ModelConfig& c) {
  auto positive = [](int v, const char* what) {
    if (v <= 0 || v > (1 << 24)) invalid(std::string("model config: ") + what + " = " + std::to_string(v) + " is out of range");
  };
  positive(c.n_layer, "block count");
  positive(c.n_embd, "embedding length");
  positive(c.n_head, "head count");
  positive(c.n_head_kv, "KV head count");
  positive(c.n_ff, "feed-forward length");
  positive(c.head_dim, "head dim");
  positive(c.n_vocab, "vocabulary size");
  positive(c.n_ctx_train, "training context length");
  if (c.n_head % c.n_head_kv != 0) {
    invalid("model config: head count " + std::to_string(c.n_head) + " is not a multiple of KV head count " +
            std::to_string(c.n_head_kv));
  }
  if (c.n_rot <= 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    invalid("model config: rope dimension " + std::to_string(c.n_rot) + " invalid for head dim " + std::to_string(c.head_dim));
  }
  if (!(c.rms_eps > 0.0f) || !(c.rope_theta > 0.0f) || !(c.rope_factor > 0.0f)) {
    invalid("model config: rms eps, rope theta and rope factor must be positive");
  }
}

// A 2-D GGUF tensor as a weight matrix; GGUF shape is [cols, rows].
cpu::WeightMatrix gguf_matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (t == nullptr) invalid("gguf: missing tensor '" + name + "'");
  if (t->shape.size() != 2 || t->shape[0] != cols || t->shape[1] != rows) {
    invalid("gguf: tensor '" + name + "' has shape " + shape_string(t->shape) + ", expected " +
            shape_string({cols, rows}));
  }
  if (t->type == DType::kQ8_1 || t->type == DType::kQ8_K) {
    invalid("gguf: tensor '" + name + "' has activation-only type " + std::string(dtype_traits(t->type).name));
  }
  return cpu::WeightMatrix{t->type, rows, cols, t->data};
}

}  // namespace

const float* Model::keep_f32(std::vector<float> values) {
  owned_.push_back(std::make_unique<std::vector<float>>(std::move(values)));
  return owned_.back()->data();
}

TokenizerSpec synthetic_model_tokenizer(const std::string& name) {
  const SyntheticModelSpec spec = parse_synthetic_name(name);
  TokenizerSpec base;
  try {
    base = tokenizer_spec_from_gguf(GgufFile::open(resolve_model_path("default")));
  } catch (const Error&) {  // no default model here: the built-in byte-level vocabulary
    base = tiny_tokenizer_spec(TinyModelSpec{});
  }
  return synthetic_tokenizer(spec, std::move(base));
}

// A synthetic model is written into an anonymous in-memory file and mapped
// from there like any GGUF: nothing touches the disk.
namespace {

std::unique_ptr<Model> load_synthetic(const std::string& name) {
  const SyntheticModelSpec spec = parse_synthetic_name(name);
  const int fd = memfd_create("lazykv-synthetic-model", MFD_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, "synthetic model: memfd_create: " + std::string(std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const int writer_fd = ::dup(fd);
  std::FILE* f = writer_fd < 0 ? nullptr : ::fdopen(writer_fd, "wb");
  if (f == nullptr) {
    if (writer_fd >= 0) ::close(writer_fd);
    throw Error(ErrorCode::kIo, "synthetic model: cannot open its in-memory file");
  }
  try {
    write_synthetic_gguf(spec, synthetic_model_tokenizer(name), f, name);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  if (std::fclose(f) != 0) throw Error(ErrorCode::kIo, "synthetic model: cannot write its in-memory file");
  return Model::load("/proc/self/fd/" + std::to_string(fd));  // mapped: the memory outlives the descriptor
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, FilePages pages) {
  if (is_synthetic_name(path)) {
    std::unique_ptr<Model> m = load_synthetic(path);
    m->path_ = path;
    return m;
  }
  std::unique_ptr<Model> m(new Model());
  m->path_ = path;
  if (std::filesystem::is_directory(path)) {
    try {
      m->load_hf(path);
    } catch (const nlohmann::json::exception& e) {  // a present key of the wrong type
      invalid("config.json: " + std::string(e.what()));
    }
  } else {
    m->load_gguf(path, pages);
  }
  m->finish();
  m->find_calibration_files();
  if (!m->tokenizer_.tokens.empty()) m->token_classes_ = classify_tokens(m->tokenizer_.tokens, m->tokenizer_.model == "gpt2");
  return m;
}

namespace {

// Loads `file` into `out`, or says in `missing` why there is none: absent
// (with the command that makes one), unreadable, or for another shape
// (mismatch's text, empty when it fits). A bad file never stops the model.
template <class T, class Load, class Mismatch>
void find_beside(const std::string& file, Load load, Mismatch mismatch, const std::string& what,
                 const std::string& how_to_make, std::shared_ptr<const T>& out, std::string& missing) {
  try {
    std::shared_ptr<const T> found = load(file);
    if (std::string why = mismatch(*found); !why.empty()) {
      missing = file + " does not match the model (" + why + ")";
      return;
    }
    out = std::move(found);
    missing.clear();
  } catch (const Error& e) {
    missing = e.code() == ErrorCode::kNotFound ? "no " + what + " beside the model (" + file + "); " + how_to_make
                                               : e.what();
  }
}

}  // namespace

void Model::find_calibration_files() {
  const ModelConfig& c = config_;
  const auto str = [](int v) { return std::to_string(v); };
  find_beside(
      query_stats_path(path_), load_query_stats,
      [&](const QueryStats& s) {
        if (s.n_layer == c.n_layer && s.n_head == c.n_head && s.n_freq == c.n_rot / 2) return std::string();
        return str(s.n_layer) + " layers, " + str(s.n_head) + " query heads, " + str(s.n_freq) +
               " frequencies; the model has " + str(c.n_layer) + ", " + str(c.n_head) + ", " + str(c.n_rot / 2);
      },
      "query statistics", "`lazykv calibrate --model " + path_ + " --input TEXT` measures them", query_stats_,
      query_stats_missing_);
  find_beside(
      steering_path(path_), load_steering,
      [&](const SteeringVector& s) {
        if (s.n_layer == c.n_layer && s.n_embd == c.n_embd) return std::string();
        return str(s.n_layer) + " layers, " + str(s.n_embd) + " hidden units; the model has " + str(c.n_layer) +
               ", " + str(c.n_embd);
      },
      "steering vector", "`lazykv steer --model " + path_ + " --input TEXT` measures one", steering_,
      steering_missing_);
  find_beside(
      retention_gates_path(path_), load_retention_gates,
      [&](const RetentionGates& g) {
        if (g.n_layer == c.n_layer && g.n_embd == c.n_embd && g.n_head_kv == c.n_head_kv) return std::string();
        return str(g.n_layer) + " layers, " + str(g.n_embd) + " hidden units, " + str(g.n_head_kv) +
               " KV heads; the model has " + str(c.n_layer) + ", " + str(c.n_embd) + ", " + str(c.n_head_kv);
      },
      "retention gates", "`scripts/train_trimkv.sh " + path_ + "` trains them", retention_gates_,
      retention_gates_missing_);
}

TokenizerSpec tokenizer_spec_from_gguf(const GgufFile& f) {
  TokenizerSpec s;
  s.model = f.get_string("tokenizer.ggml.model").value_or("");
  s.pre = f.get_string("tokenizer.ggml.pre").value_or("default");
  s.tokens = f.get_string_array("tokenizer.ggml.tokens").value_or(std::vector<std::string>{});
  if (auto types = f.get_int_array("tokenizer.ggml.token_type")) {
    s.token_types.assign(types->begin(), types->end());
  }
  s.merges = f.get_string_array("tokenizer.ggml.merges").value_or(std::vector<std::string>{});
  // -1 when absent; checked before the cast, so 2^32 + 1 is an error, not token 1.
  auto token_id = [&](const std::string& key) -> int32_t {
    const std::optional<int64_t> v = f.get_int(key);
    if (!v) return -1;
    if (*v < -1 || *v > std::numeric_limits<int32_t>::max()) {
      invalid("gguf: metadata '" + key + "' = " + std::to_string(*v) + " is not a token id");
    }
    return int32_t(*v);
  };
  s.bos_id = token_id("tokenizer.ggml.bos_token_id");
  s.eos_id = token_id("tokenizer.ggml.eos_token_id");
  s.pad_id = token_id("tokenizer.ggml.padding_token_id");
  s.unk_id = token_id("tokenizer.ggml.unknown_token_id");
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (const int32_t id = token_id(key); id >= 0) s.eog_ids.push_back(id);
  }
  s.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(false);
  s.chat_template = f.get_string("tokenizer.chat_template").value_or("");
  const int64_t n = int64_t(s.tokens.size());
  for (int32_t id : {s.bos_id, s.eos_id, s.pad_id, s.unk_id}) {
    if (id >= n) invalid("gguf: tokenizer special token id " + std::to_string(id) + " >= vocab size " + std::to_string(n));
  }
  if (!s.token_types.empty() && int64_t(s.token_types.size()) != n) {
    invalid("gguf: tokenizer.ggml.token_type has " + std::to_string(s.token_types.size()) + " entries for " +
            std::to_string(n) + " tokens");
  }
  return s;
}

void Model::load_gguf(const std::string& path, FilePages pages) {
  gguf_ = std::make_unique<GgufFile>(GgufFile::open(path, pages));
  const GgufFile& f = *gguf_;
  ModelConfig& c = config_;
  c.arch_name = f.get_string("general.architecture").value_or("");
  if (c.arch_name.empty()) invalid("gguf: missing general.architecture");
  c.arch = parse_arch(c.arch_name);
  c.name = f.get_string("general.name").value_or(std::filesystem::path(path).filename().string());
  const std::string a = c.arch_name + ".";
  // Checked before the cast, so 2^32 + 4 is an error, not 4.
  auto int_of = [&](const std::string& key, std::optional<int> fallback) -> int {
    auto v = f.get_int(key);
    if (!v && !fallback) invalid("gguf: missing metadata key '" + key + "'");
    if (!v) return *fallback;
    if (*v <= 0 || *v > (int64_t(1) << 30)) invalid("gguf: metadata '" + key + "' = " + std::to_string(*v) + " out of range");
    return int(*v);
  };
  c.n_layer = int_of(a + "block_count", std::nullopt);
  c.n_embd = int_of(a + "embedding_length", std::nullopt);
  c.n_ff = int_of(a + "feed_forward_length", std::nullopt);
  c.n_head = int_of(a + "attention.head_count", std::nullopt);
  c.n_head_kv = int_of(a + "attention.head_count_kv", c.n_head);
  c.n_ctx_train = int_of(a + "context_length", 2048);
  c.head_dim = int_of(a + "attention.key_length", c.n_embd / c.n_head);
  c.n_rot = int_of(a + "rope.dimension_count", c.head_dim);
  c.rms_eps = float(f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_theta = float(f.get_float(a + "rope.freq_base").value_or(10000.0));
  const std::string scaling = f.get_string(a + "rope.scaling.type").value_or("none");
  c.rope_factor = float(f.get_float(a + "rope.scaling.factor").value_or(1.0));
  c.rope_orig_ctx = int_of(a + "rope.scaling.original_context_length", c.n_ctx_train);
  if (scaling == "none" || c.rope_factor == 1.0f) {
    c.rope_scaling = RopeScaling::kNone;
  } else if (scaling == "linear") {
    c.rope_scaling = RopeScaling::kLinear;
  } else if (scaling == "yarn") {
    c.rope_scaling = RopeScaling::kYarn;
  } else {
    invalid("gguf: unsupported rope scaling type '" + scaling + "' (supported: none, linear, yarn, llama3 via rope_freqs)");
  }
  // llama.cpp's converter permutes Llama Q/K rows for interleaved RoPE; Qwen2 is stored as trained (NEOX).
  c.rope_style = c.arch == Architecture::kLlama ? cpu::RopeStyle::kInterleaved : cpu::RopeStyle::kNeox;

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd == nullptr) invalid("gguf: missing tensor 'token_embd.weight'");
  if (embd->shape.size() != 2) invalid("gguf: token_embd.weight must be 2-D, has shape " + shape_string(embd->shape));
  c.n_vocab = int(std::min<int64_t>(embd->shape[1], int64_t(1) << 30));
  check_config(c);
  token_embd_ = gguf_matrix(f, "token_embd.weight", c.n_vocab, c.n_embd);
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  output_ = c.tied_embeddings ? token_embd_ : gguf_matrix(f, "output.weight", c.n_vocab, c.n_embd);

  auto vec = [&](const std::string& name, int64_t n, bool required) -> const float* {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (t == nullptr) {
      if (required) invalid("gguf: missing tensor '" + name + "'");
      return nullptr;
    }
    if (t->shape.size() != 1 || t->shape[0] != n) {
      invalid("gguf: tensor '" + name + "' has shape " + shape_string(t->shape) + ", expected [" + std::to_string(n) + "]");
    }
    if (t->type == DType::kF32) return reinterpret_cast<const float*>(t->data);
    std::vector<float> out(static_cast<size_t>(n));
    cpu::dequantize_row(t->type, t->data, out.data(), n);
    return keep_f32(std::move(out));
  };
  output_norm_ = vec("output_norm.weight", c.n_embd, true);
  const int64_t q_dim = int64_t(c.n_head) * c.head_dim;
  const int64_t kv_dim = int64_t(c.n_head_kv) * c.head_dim;
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights w;
    w.attn_norm = vec(p + "attn_norm.weight", c.n_embd, true);
    w.wq = gguf_matrix(f, p + "attn_q.weight", q_dim, c.n_embd);
    w.wk = gguf_matrix(f, p + "attn_k.weight", kv_dim, c.n_embd);
    w.wv = gguf_matrix(f, p + "attn_v.weight", kv_dim, c.n_embd);
    w.wo = gguf_matrix(f, p + "attn_output.weight", c.n_embd, q_dim);
    w.bq = vec(p + "attn_q.bias", q_dim, false);
    w.bk = vec(p + "attn_k.bias", kv_dim, false);
    w.bv = vec(p + "attn_v.bias", kv_dim, false);
    w.ffn_norm = vec(p + "ffn_norm.weight", c.n_embd, true);
    w.w_gate = gguf_matrix(f, p + "ffn_gate.weight", c.n_ff, c.n_embd);
    w.w_up = gguf_matrix(f, p + "ffn_up.weight", c.n_ff, c.n_embd);
    w.w_down = gguf_matrix(f, p + "ffn_down.weight", c.n_embd, c.n_ff);
    if ((w.bq != nullptr) != (w.bk != nullptr) || (w.bk != nullptr) != (w.bv != nullptr)) {
      invalid("gguf: layer " + std::to_string(l) + " has only some of the Q/K/V biases");
    }
    c.qkv_bias = w.bq != nullptr;
    layers_.push_back(w);
  }
  std::vector<float> freq_factors;
  if (const GgufTensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
    if (rf->shape.size() != 1 || rf->shape[0] != c.n_rot / 2 || rf->type != DType::kF32) {
      invalid("gguf: rope_freqs.weight must be F32 [" + std::to_string(c.n_rot / 2) + "]");
    }
    const float* p = reinterpret_cast<const float*>(rf->data);
    freq_factors.assign(p, p + c.n_rot / 2);
    c.rope_scaling = RopeScaling::kLlama3;
  }
  rope_ = make_rope_table(c, freq_factors);
  tokenizer_ = tokenizer_spec_from_gguf(f);
  if (!tokenizer_.tokens.empty() && int(tokenizer_.tokens.size()) > c.n_vocab) {
    invalid("gguf: tokenizer has " + std::to_string(tokenizer_.tokens.size()) + " tokens but the embedding has " +
            std::to_string(c.n_vocab) + " rows");
  }
}

void Model::load_hf(const std::string& dir) {
  hf_ = std::make_unique<HfModelDir>(HfModelDir::open(dir));
  nlohmann::json j;
  try {
    j = parse_bounded_json(hf_->config_json());
  } catch (const JsonLimitError& e) {
    invalid("config.json: " + std::string(e.what()));
  } catch (const nlohmann::json::exception& e) {
    invalid("config.json: " + std::string(e.what()));
  }
  if (!j.is_object()) invalid("config.json: not a JSON object");
  ModelConfig& c = config_;
  auto get_int = [&](const char* key, std::optional<int> fallback) -> int {
    if (j.contains(key) && j[key].is_number_integer()) {
      const int64_t v = j[key].get<int64_t>();  // checked before the cast, as GGUF metadata is
      if (v <= 0 || v > (int64_t(1) << 30)) {
        invalid(std::string("config.json: '") + key + "' = " + std::to_string(v) + " out of range");
      }
      return int(v);
    }
    if (fallback) return *fallback;
    invalid(std::string("config.json: missing integer '") + key + "'");
  };
  auto get_float = [&](const nlohmann::json& obj, const char* key, double fallback) -> float {
    if (obj.contains(key) && obj[key].is_number()) return obj[key].get<float>();
    return float(fallback);
  };
  std::string arch_class;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    arch_class = j["architectures"][0].get<std::string>();
  }
  if (arch_class == "LlamaForCausalLM") {
    c.arch_name = "llama";
  } else if (arch_class == "Qwen2ForCausalLM") {
    c.arch_name = "qwen2";
  } else {
    invalid("config.json: unsupported architecture '" + arch_class + "' (supported: LlamaForCausalLM, Qwen2ForCausalLM)");
  }
  c.arch = parse_arch(c.arch_name);
  c.name = std::filesystem::path(dir).filename().string();
  c.n_layer = get_int("num_hidden_layers", std::nullopt);
  c.n_embd = get_int("hidden_size", std::nullopt);
  c.n_ff = get_int("intermediate_size", std::nullopt);
  c.n_head = get_int("num_attention_heads", std::nullopt);
  c.n_head_kv = get_int("num_key_value_heads", c.n_head);
  c.n_vocab = get_int("vocab_size", std::nullopt);
  c.n_ctx_train = get_int("max_position_embeddings", 2048);
  c.head_dim = get_int("head_dim", c.n_head > 0 ? c.n_embd / c.n_head : 0);
  c.n_rot = c.head_dim;
  c.rms_eps = get_float(j, "rms_norm_eps", 1e-6);
  c.rope_theta = get_float(j, "rope_theta", 10000.0);
  c.rope_style = cpu::RopeStyle::kNeox;
  c.tied_embeddings = j.value("tie_word_embeddings", false);
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const auto& rs = j["rope_scaling"];
    const std::string type = rs.value("rope_type", rs.value("type", std::string("default")));
    c.rope_factor = get_float(rs, "factor", 1.0);
    c.rope_orig_ctx = rs.value("original_max_position_embeddings", c.n_ctx_train);
    if (type == "default") {
      c.rope_scaling = RopeScaling::kNone;
    } else if (type == "linear") {
      c.rope_scaling = RopeScaling::kLinear;
    } else if (type == "yarn") {
      c.rope_scaling = RopeScaling::kYarn;
      c.yarn_beta_fast = get_float(rs, "beta_fast", 32.0);
      c.yarn_beta_slow = get_float(rs, "beta_slow", 1.0);
    } else if (type == "llama3") {
      c.rope_scaling = RopeScaling::kLlama3;
      c.rope_low_freq_factor = get_float(rs, "low_freq_factor", 1.0);
      c.rope_high_freq_factor = get_float(rs, "high_freq_factor", 4.0);
    } else {
      invalid("config.json: unsupported rope_scaling type '" + type + "' (supported: linear, yarn, llama3)");
    }
  }
  check_config(c);

  auto tensor = [&](const std::string& name, std::vector<int64_t> shape, bool required) -> const SafetensorsTensor* {
    const SafetensorsTensor* t = hf_->find(name);
    if (t == nullptr) {
      if (required) invalid("safetensors: missing tensor '" + name + "'");
      return nullptr;
    }
    if (t->shape != shape) {
      invalid("safetensors: tensor '" + name + "' has shape " + shape_string(t->shape) + ", expected " + shape_string(shape));
    }
    return t;
  };
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    const SafetensorsTensor* t = tensor(name, {rows, cols}, true);
    return cpu::WeightMatrix{t->type, rows, cols, t->data};
  };
  auto vec = [&](const std::string& name, int64_t n, bool required) -> const float* {
    const SafetensorsTensor* t = tensor(name, {n}, required);
    if (t == nullptr) return nullptr;
    std::vector<float> out(static_cast<size_t>(n));
    cpu::dequantize_row(t->type, t->data, out.data(), n);  // copies: safetensors data need not be aligned
    return keep_f32(std::move(out));
  };
  token_embd_ = matrix("model.embed_tokens.weight", c.n_vocab, c.n_embd);
  if (!c.tied_embeddings && hf_->find("lm_head.weight") == nullptr) c.tied_embeddings = true;
  output_ = c.tied_embeddings ? token_embd_ : matrix("lm_head.weight", c.n_vocab, c.n_embd);
  output_norm_ = vec("model.norm.weight", c.n_embd, true);
  const int64_t q_dim = int64_t(c.n_head) * c.head_dim;
  const int64_t kv_dim = int64_t(c.n_head_kv) * c.head_dim;
  const bool bias = c.arch == Architecture::kQwen2;
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights w;
    w.attn_norm = vec(p + "input_layernorm.weight", c.n_embd, true);
    w.wq = matrix(p + "self_attn.q_proj.weight", q_dim, c.n_embd);
    w.wk = matrix(p + "self_attn.k_proj.weight", kv_dim, c.n_embd);
    w.wv = matrix(p + "self_attn.v_proj.weight", kv_dim, c.n_embd);
    w.wo = matrix(p + "self_attn.o_proj.weight", c.n_embd, q_dim);
    w.bq = vec(p + "self_attn.q_proj.bias", q_dim, bias);
    w.bk = vec(p + "self_attn.k_proj.bias", kv_dim, bias);
    w.bv = vec(p + "self_attn.v_proj.bias", kv_dim, bias);
    w.ffn_norm = vec(p + "post_attention_layernorm.weight", c.n_embd, true);
    w.w_gate = matrix(p + "mlp.gate_proj.weight", c.n_ff, c.n_embd);
    w.w_up = matrix(p + "mlp.up_proj.weight", c.n_ff, c.n_embd);
    w.w_down = matrix(p + "mlp.down_proj.weight", c.n_embd, c.n_ff);
    c.qkv_bias = w.bq != nullptr;
    layers_.push_back(w);
  }
  rope_ = make_rope_table(c);
}

void Model::finish() {
  auto bytes = [](const cpu::WeightMatrix& w) { return row_bytes(w.type, size_t(w.cols)) * size_t(w.rows); };
  auto check_cols = [](const cpu::WeightMatrix& w, const char* what) {
    const size_t block = dtype_traits(w.type).block_elems;
    if (size_t(w.cols) % block != 0) {
      invalid(std::string("model: ") + what + " has " + std::to_string(w.cols) + " columns, not a multiple of the " +
              std::string(dtype_traits(w.type).name) + " block size " + std::to_string(block));
    }
  };
  size_t layer_bytes = 0;
  for (const LayerWeights& w : layers_) {
    for (const cpu::WeightMatrix* m : {&w.wq, &w.wk, &w.wv, &w.wo, &w.w_gate, &w.w_up, &w.w_down}) {
      check_cols(*m, "a layer weight");
      layer_bytes += bytes(*m);
    }
  }
  weight_bytes_ = bytes(token_embd_) + (config_.tied_embeddings ? 0 : bytes(output_)) + layer_bytes;
  decode_weight_bytes_ = layer_bytes + bytes(output_);
}

}  // namespace lazykv
