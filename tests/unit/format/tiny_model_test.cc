#include "worker/format/tiny_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/quant.h"
#include "worker/format/gguf.h"
#include "worker/format/safetensors.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(testing::TempDir()) / ("lazykv_tiny_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Rows of a GGUF tensor decoded to floats (row = one ne0-long run).
std::vector<float> decode(const GgufTensorInfo& t) {
  const size_t row_len = static_cast<size_t>(t.shape[0]);
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  std::vector<float> out(n);
  const size_t rb = row_bytes(t.type, row_len);
  for (size_t r = 0; r < n / row_len; ++r) {
    const uint8_t* src = t.data + r * rb;
    float* dst = out.data() + r * row_len;
    if (t.type == DType::kF32) {
      std::memcpy(dst, src, rb);
    } else if (t.type == DType::kF16) {
      for (size_t i = 0; i < row_len; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
      }
    } else {
      cpu::dequantize_row(t.type, src, dst, static_cast<int64_t>(row_len));
    }
  }
  return out;
}

std::vector<float> as_floats(const SafetensorsTensor& t) {
  EXPECT_EQ(t.type, DType::kF32);
  std::vector<float> out(t.bytes / 4);
  std::memcpy(out.data(), t.data, t.bytes);
  return out;
}

// Checks GGUF `gguf_name` against HF `hf_name`: equal, or (permute_heads > 0)
// equal under llama.cpp's per-head q/k row permutation.
void expect_same_weights(const GgufFile& g, const HfModelDir& hf, const std::string& gguf_name,
                         const std::string& hf_name, int permute_heads, int head_dim) {
  SCOPED_TRACE(gguf_name);
  const GgufTensorInfo* gt = g.find_tensor(gguf_name);
  const SafetensorsTensor* ht = hf.find(hf_name);
  ASSERT_NE(gt, nullptr);
  ASSERT_NE(ht, nullptr);
  ASSERT_EQ(std::vector<int64_t>(gt->shape.rbegin(), gt->shape.rend()), ht->shape);
  const std::vector<float> gv = decode(*gt);
  const std::vector<float> hv = as_floats(*ht);
  ASSERT_EQ(gv.size(), hv.size());
  if (permute_heads == 0) {
    EXPECT_EQ(gv, hv);
    return;
  }
  const size_t row_len = static_cast<size_t>(gt->shape[0]);
  auto row = [&](const std::vector<float>& v, size_t r) {
    return std::vector<float>(v.begin() + static_cast<ptrdiff_t>(r * row_len),
                              v.begin() + static_cast<ptrdiff_t>((r + 1) * row_len));
  };
  for (int h = 0; h < permute_heads; ++h) {
    for (int i = 0; i < head_dim / 2; ++i) {
      const size_t base = static_cast<size_t>(h * head_dim);
      ASSERT_EQ(row(gv, base + 2 * i), row(hv, base + i)) << "head " << h << " i " << i;
      ASSERT_EQ(row(gv, base + 2 * i + 1), row(hv, base + head_dim / 2 + i)) << "head " << h;
    }
  }
  EXPECT_NE(gv, hv);  // the permutation is not the identity
}

TEST(TinyModelTest, GgufHasLlamaCppMetadataAndTensors) {
  const fs::path dir = fresh_dir("gguf_llama");
  TinyModelSpec spec;
  const std::string path = (dir / "tiny.gguf").string();
  write_tiny_gguf(path, spec);
  const GgufFile f = GgufFile::open(path);

  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 2);
  EXPECT_EQ(f.get_int("llama.context_length"), 256);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 128);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 4);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 2);
  EXPECT_EQ(f.get_int("llama.rope.dimension_count"), 16);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_NEAR(*f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);

  const int n_vocab = tiny_vocab_size();
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  const std::vector<std::string> tokens = *f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), static_cast<size_t>(n_vocab));
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(tokens[2], "<|im_end|>");
  EXPECT_EQ(tokens[3 + 'a'], "a");
  EXPECT_EQ(tokens[3 + ' '], "\xC4\xA0");   // Ġ
  EXPECT_EQ(tokens[3 + '\n'], "\xC4\x8A");  // Ċ
  EXPECT_EQ(tokens[3 + 0], "\xC4\x80");     // Ā
  EXPECT_EQ(tokens[3 + 127], "\xC4\xA1");   // ġ
  EXPECT_EQ(tokens[3 + 173], "\xC5\x83");   // Ń
  EXPECT_EQ(tokens[3 + 255], "\xC3\xBF");   // ÿ
  EXPECT_EQ(std::set<std::string>(tokens.begin(), tokens.end()).size(), tokens.size());
  const std::vector<int64_t> types = *f.get_int_array("tokenizer.ggml.token_type");
  ASSERT_EQ(types.size(), tokens.size());
  EXPECT_EQ(types[0], 3);
  EXPECT_EQ(types[2], 3);
  EXPECT_EQ(types[100], 1);
  const std::vector<std::string> merges = *f.get_string_array("tokenizer.ggml.merges");
  ASSERT_GE(merges.size(), 10u);
  EXPECT_EQ(merges[0], "\xC4\xA0 t");
  const std::set<std::string> vocab(tokens.begin(), tokens.end());
  for (const std::string& m : merges) {  // both parts and the result are tokens
    const size_t space = m.find(' ');
    ASSERT_NE(space, std::string::npos);
    EXPECT_TRUE(vocab.count(m.substr(0, space))) << m;
    EXPECT_TRUE(vocab.count(m.substr(space + 1))) << m;
    EXPECT_TRUE(vocab.count(m.substr(0, space) + m.substr(space + 1))) << m;
  }
  EXPECT_EQ(f.get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_NE(f.get_string("tokenizer.chat_template")->find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(tiny_tokenizer_spec(spec).tokens, tokens);

  EXPECT_EQ(f.tensors().size(), 2u + 9u * 2u);
  auto shape = [&](const std::string& name) {
    const GgufTensorInfo* t = f.find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    return t == nullptr ? std::vector<int64_t>{} : t->shape;
  };
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape("token_embd.weight"), (S{64, n_vocab}));
  EXPECT_EQ(shape("output_norm.weight"), (S{64}));
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    EXPECT_EQ(shape(p + "attn_norm.weight"), (S{64}));
    EXPECT_EQ(shape(p + "attn_q.weight"), (S{64, 64}));
    EXPECT_EQ(shape(p + "attn_k.weight"), (S{64, 32}));
    EXPECT_EQ(shape(p + "attn_v.weight"), (S{64, 32}));
    EXPECT_EQ(shape(p + "attn_output.weight"), (S{64, 64}));
    EXPECT_EQ(shape(p + "ffn_norm.weight"), (S{64}));
    EXPECT_EQ(shape(p + "ffn_gate.weight"), (S{64, 128}));
    EXPECT_EQ(shape(p + "ffn_up.weight"), (S{64, 128}));
    EXPECT_EQ(shape(p + "ffn_down.weight"), (S{128, 64}));
    EXPECT_EQ(f.find_tensor(p + "attn_q.bias"), nullptr);
  }
  for (const GgufTensorInfo& t : f.tensors()) EXPECT_EQ(t.type, DType::kF32) << t.name;

  // Small, sane values: norms near 1, embeddings spread but bounded.
  const std::vector<float> norm = decode(*f.find_tensor("output_norm.weight"));
  for (float x : norm) EXPECT_NEAR(x, 1.0f, 0.5f);
  const std::vector<float> embd = decode(*f.find_tensor("token_embd.weight"));
  double sq = 0;
  for (float x : embd) sq += double(x) * x;
  const double rms = std::sqrt(sq / embd.size());
  EXPECT_GT(rms, 0.15);
  EXPECT_LT(rms, 0.35);
}

TEST(TinyModelTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const fs::path dir = fresh_dir("determinism");
  TinyModelSpec spec;
  write_tiny_gguf((dir / "a.gguf").string(), spec);
  write_tiny_gguf((dir / "b.gguf").string(), spec);
  spec.seed = 2;
  write_tiny_gguf((dir / "c.gguf").string(), spec);
  EXPECT_EQ(read_file(dir / "a.gguf"), read_file(dir / "b.gguf"));
  EXPECT_NE(read_file(dir / "a.gguf"), read_file(dir / "c.gguf"));
}

TEST(TinyModelTest, HfDirHoldsTheSameLlamaWeightsWithPermutedQK) {
  const fs::path dir = fresh_dir("hf_llama");
  TinyModelSpec spec;
  spec.tied_embeddings = false;
  write_tiny_gguf((dir / "tiny.gguf").string(), spec);
  write_tiny_hf_dir((dir / "hf").string(), spec);
  const GgufFile g = GgufFile::open((dir / "tiny.gguf").string());
  const HfModelDir hf = HfModelDir::open((dir / "hf").string());

  const nlohmann::json config = nlohmann::json::parse(hf.config_json());
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(config["intermediate_size"], 128);
  EXPECT_EQ(config["num_attention_heads"], 4);
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["vocab_size"], tiny_vocab_size());
  EXPECT_EQ(config["max_position_embeddings"], 256);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_NEAR(config["rope_theta"].get<double>(), 10000.0, 1e-6);
  EXPECT_NEAR(config["rms_norm_eps"].get<double>(), 1e-5, 1e-9);

  EXPECT_EQ(hf.tensor_names().size(), g.tensors().size());
  EXPECT_EQ(g.find_tensor("output.weight")->shape, (std::vector<int64_t>{64, tiny_vocab_size()}));
  const int hd = spec.head_dim();
  expect_same_weights(g, hf, "token_embd.weight", "model.embed_tokens.weight", 0, hd);
  expect_same_weights(g, hf, "output.weight", "lm_head.weight", 0, hd);
  expect_same_weights(g, hf, "output_norm.weight", "model.norm.weight", 0, hd);
  for (int l = 0; l < spec.n_layer; ++l) {
    const std::string gp = "blk." + std::to_string(l) + ".";
    const std::string hp = "model.layers." + std::to_string(l) + ".";
    expect_same_weights(g, hf, gp + "attn_q.weight", hp + "self_attn.q_proj.weight", spec.n_head, hd);
    expect_same_weights(g, hf, gp + "attn_k.weight", hp + "self_attn.k_proj.weight", spec.n_head_kv, hd);
    expect_same_weights(g, hf, gp + "attn_v.weight", hp + "self_attn.v_proj.weight", 0, hd);
    expect_same_weights(g, hf, gp + "attn_output.weight", hp + "self_attn.o_proj.weight", 0, hd);
    expect_same_weights(g, hf, gp + "attn_norm.weight", hp + "input_layernorm.weight", 0, hd);
    expect_same_weights(g, hf, gp + "ffn_norm.weight", hp + "post_attention_layernorm.weight", 0, hd);
    expect_same_weights(g, hf, gp + "ffn_gate.weight", hp + "mlp.gate_proj.weight", 0, hd);
    expect_same_weights(g, hf, gp + "ffn_up.weight", hp + "mlp.up_proj.weight", 0, hd);
    expect_same_weights(g, hf, gp + "ffn_down.weight", hp + "mlp.down_proj.weight", 0, hd);
  }
}

TEST(TinyModelTest, Qwen2HasBiasesAndNoPermutation) {
  const fs::path dir = fresh_dir("qwen2");
  TinyModelSpec spec;
  spec.arch = "qwen2";
  spec.rope_theta = 1000000;
  spec.rms_eps = 1e-6f;
  write_tiny_gguf((dir / "tiny.gguf").string(), spec);
  write_tiny_hf_dir((dir / "hf").string(), spec);
  const GgufFile g = GgufFile::open((dir / "tiny.gguf").string());
  const HfModelDir hf = HfModelDir::open((dir / "hf").string());
  EXPECT_EQ(g.get_string("general.architecture"), "qwen2");
  EXPECT_EQ(g.get_int("qwen2.block_count"), 2);
  EXPECT_EQ(g.get_float("qwen2.rope.freq_base"), 1000000.0);
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre"), "qwen2");
  EXPECT_EQ(g.tensors().size(), 2u + 12u * 2u);
  EXPECT_EQ(nlohmann::json::parse(hf.config_json())["architectures"][0], "Qwen2ForCausalLM");
  for (int l = 0; l < spec.n_layer; ++l) {
    const std::string gp = "blk." + std::to_string(l) + ".";
    const std::string hp = "model.layers." + std::to_string(l) + ".self_attn.";
    EXPECT_EQ(g.find_tensor(gp + "attn_q.bias")->shape, (std::vector<int64_t>{64}));
    EXPECT_EQ(g.find_tensor(gp + "attn_k.bias")->shape, (std::vector<int64_t>{32}));
    EXPECT_EQ(g.find_tensor(gp + "attn_v.bias")->type, DType::kF32);
    expect_same_weights(g, hf, gp + "attn_q.weight", hp + "q_proj.weight", 0, 16);
    expect_same_weights(g, hf, gp + "attn_k.weight", hp + "k_proj.weight", 0, 16);
    expect_same_weights(g, hf, gp + "attn_q.bias", hp + "q_proj.bias", 0, 16);
    expect_same_weights(g, hf, gp + "attn_k.bias", hp + "k_proj.bias", 0, 16);
    expect_same_weights(g, hf, gp + "attn_v.bias", hp + "v_proj.bias", 0, 16);
  }
  EXPECT_EQ(hf.find("lm_head.weight"), nullptr);
}

TEST(TinyModelTest, QuantizedAndHalfGgufMatchHfValuesExactly) {
  for (DType type : {DType::kQ8_0, DType::kQ4_1, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_traits(type).name));
    const fs::path dir = fresh_dir("quant_" + std::string(dtype_traits(type).name));
    TinyModelSpec spec;
    spec.weight_type = type;
    spec.token_embd_type = DType::kQ8_0;
    write_tiny_gguf((dir / "tiny.gguf").string(), spec);
    write_tiny_hf_dir((dir / "hf").string(), spec);
    const GgufFile g = GgufFile::open((dir / "tiny.gguf").string());
    const HfModelDir hf = HfModelDir::open((dir / "hf").string());
    EXPECT_EQ(g.find_tensor("token_embd.weight")->type, DType::kQ8_0);
    EXPECT_EQ(g.find_tensor("blk.0.attn_q.weight")->type, type);
    EXPECT_EQ(g.find_tensor("blk.0.ffn_down.weight")->type, type);
    EXPECT_EQ(g.find_tensor("blk.0.attn_norm.weight")->type, DType::kF32);
    expect_same_weights(g, hf, "token_embd.weight", "model.embed_tokens.weight", 0, 16);
    expect_same_weights(g, hf, "blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", 4, 16);
    expect_same_weights(g, hf, "blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", 2, 16);
    expect_same_weights(g, hf, "blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight", 0, 16);
  }
}

TEST(TinyModelTest, ShardedHfDirMatchesSingleFile) {
  const fs::path dir = fresh_dir("sharded");
  TinyModelSpec spec;
  write_tiny_hf_dir((dir / "single").string(), spec);
  write_tiny_hf_dir((dir / "sharded").string(), spec, /*sharded=*/true);
  EXPECT_FALSE(fs::exists(dir / "sharded" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "sharded" / "model-00002-of-00002.safetensors"));
  const HfModelDir single = HfModelDir::open((dir / "single").string());
  const HfModelDir sharded = HfModelDir::open((dir / "sharded").string());
  ASSERT_EQ(single.tensor_names(), sharded.tensor_names());
  EXPECT_EQ(single.tensor_names().size(), 2u + 9u * 2u);
  for (const std::string& name : single.tensor_names()) {
    EXPECT_EQ(as_floats(*single.find(name)), as_floats(*sharded.find(name))) << name;
    EXPECT_EQ(single.find(name)->shape, sharded.find(name)->shape);
  }
  EXPECT_EQ(single.find("model.layers.0.mlp.down_proj.weight")->shape,
            (std::vector<int64_t>{64, 128}));
}

TEST(TinyModelTest, RejectsInconsistentSpecs) {
  const std::string path = testing::TempDir() + "/lazykv_tiny_bad.gguf";
  auto expect_bad = [&](TinyModelSpec spec) {
    try {
      write_tiny_gguf(path, spec);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
  };
  TinyModelSpec s;
  s.arch = "gpt2";
  expect_bad(s);
  s = {};
  s.n_head = 3;
  expect_bad(s);
  s = {};
  s.n_head_kv = 3;
  expect_bad(s);
  s = {};
  s.weight_type = DType::kQ4_K;  // rows of 64 are not a multiple of 256
  expect_bad(s);
}

}  // namespace
}  // namespace lazykv
