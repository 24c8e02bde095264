// Model loading: metadata is read correctly and every inconsistency between
// metadata and tensors is a clear kInvalidModel error.
#include "worker/model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>

#include "common/error.h"
#include "tests/unit/temp_dir.h"
#include "worker/format/gguf.h"
#include "worker/format/tiny_model.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

// One directory per test process, removed when the process exits.
std::string temp_path(const std::string& name) {
  static const TempDir dir("lazykv_model_test");
  return dir.file(name);
}

// Copies a GGUF through the writer, letting `edit` change metadata, and
// dropping or reshaping tensors by name.
std::string rewrite(const std::string& src, const std::string& name,
                    const std::function<void(GgufWriter&)>& edit_metadata,
                    const std::string& drop_tensor = "", const std::string& transpose_tensor = "") {
  const GgufFile f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  edit_metadata(w);
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name == drop_tensor) continue;
    std::vector<int64_t> shape = t.shape;
    if (t.name == transpose_tensor) std::swap(shape[0], shape[1]);
    w.add_tensor(t.name, shape, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
  }
  const std::string out = temp_path(name);
  w.write(out);
  return out;
}

std::string tiny(const std::string& arch = "llama") {
  TinyModelSpec spec;
  spec.arch = arch;
  const std::string path = temp_path(arch + ".gguf");
  write_tiny_gguf(path, spec);
  return path;
}

void expect_invalid(const std::string& path, const std::string& fragment) {
  try {
    Model::load(path);
    FAIL() << "expected an error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Model, ReadsLlamaConfig) {
  const auto m = Model::load(tiny());
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_vocab, tiny_vocab_size());
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.rope_style, cpu::RopeStyle::kInterleaved);
  EXPECT_EQ(m->tokenizer_spec().model, "gpt2");
  EXPECT_FALSE(m->tokenizer_spec().chat_template.empty());
  EXPECT_GT(m->weight_bytes(), 0u);
}

TEST(Model, ReadsQwen2BiasesAndNeoxRope) {
  const auto m = Model::load(tiny("qwen2"));
  EXPECT_EQ(m->config().arch, Architecture::kQwen2);
  EXPECT_TRUE(m->config().qkv_bias);
  EXPECT_EQ(m->config().rope_style, cpu::RopeStyle::kNeox);
  EXPECT_NE(m->layers()[0].bq, nullptr);
}

TEST(Model, UnknownArchitectureIsAClearError) {
  const auto path = rewrite(tiny(), "mamba.gguf", [](GgufWriter& w) { w.set_string("general.architecture", "mamba"); });
  expect_invalid(path, "unsupported architecture 'mamba'");
}

TEST(Model, MissingTensorIsNamed) {
  const auto path = rewrite(tiny(), "missing.gguf", [](GgufWriter&) {}, "blk.1.ffn_up.weight");
  expect_invalid(path, "missing tensor 'blk.1.ffn_up.weight'");
}

TEST(Model, ShapeMismatchIsNamed) {
  const auto path = rewrite(tiny(), "shape.gguf", [](GgufWriter&) {}, "", "blk.0.ffn_gate.weight");
  expect_invalid(path, "tensor 'blk.0.ffn_gate.weight' has shape");
}

TEST(Model, InconsistentHeadCountsAreRejected) {
  const auto path = rewrite(tiny(), "heads.gguf", [](GgufWriter& w) { w.set_u32("llama.attention.head_count_kv", 3); });
  expect_invalid(path, "not a multiple of KV head count");
}

// Values past int are errors, not truncated to something that looks valid.
TEST(Model, MetadataBeyondIntIsRejectedNotTruncated) {
  const GgufValue huge{GgufType::kU64, uint64_t(1) << 32 | 4};  // truncated to int: 4
  expect_invalid(rewrite(tiny(), "kv64.gguf", [&](GgufWriter& w) { w.set("llama.attention.head_count_kv", huge); }),
                 "'llama.attention.head_count_kv' = 4294967300 out of range");
  expect_invalid(rewrite(tiny(), "ctx0.gguf", [](GgufWriter& w) { w.set_u32("llama.context_length", 0); }),
                 "'llama.context_length' = 0 out of range");
  const GgufValue bos{GgufType::kU64, uint64_t(1) << 32 | 1};  // truncated: token 1
  expect_invalid(rewrite(tiny(), "bos64.gguf", [&](GgufWriter& w) { w.set("tokenizer.ggml.bos_token_id", bos); }),
                 "'tokenizer.ggml.bos_token_id' = 4294967297 is not a token id");
}

TEST(Model, MissingMetadataIsNamed) {
  const std::string src = tiny();
  const GgufFile f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [key, value] : f.metadata()) {
    if (key != "llama.block_count") w.set(key, value);
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    w.add_tensor(t.name, t.shape, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
  }
  const std::string path = temp_path("nolayers.gguf");
  w.write(path);
  expect_invalid(path, "llama.block_count");
}

TEST(Model, MissingFileIsNotFound) {
  try {
    Model::load(temp_path("does_not_exist.gguf"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

}  // namespace
}  // namespace lazykv
