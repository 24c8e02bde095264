#include "worker/format/synthetic_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/thread_pool.h"
#include "tests/unit/temp_dir.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/model.h"

namespace lazykv {
namespace {

std::string error_of(const std::string& name) {
  try {
    parse_synthetic_name(name);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "no error";
}

TEST(SyntheticModel, EveryShapeAndTypeParses) {
  const char* types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"};
  ASSERT_EQ(synthetic_shapes().size(), 4u);
  for (const SyntheticShape& shape : synthetic_shapes()) {
    for (const char* type : types) {
      const SyntheticModelSpec spec = parse_synthetic_name("synth:" + shape.name + ":" + type);
      EXPECT_EQ(spec.shape.name, shape.name);
      EXPECT_EQ(spec.seed, 1u);
    }
  }
  const SyntheticModelSpec spec = parse_synthetic_name("synth:Llama3-8B:Q4_K:42");
  EXPECT_EQ(spec.shape.n_layer, 32);
  EXPECT_EQ(spec.shape.n_vocab, 128256);
  EXPECT_EQ(spec.type, DType::kQ4_K);
  EXPECT_EQ(spec.seed, 42u);
}

TEST(SyntheticModel, BadNamesSayWhatIsKnown) {
  EXPECT_NE(error_of("synth:gpt5:q4_0").find("unknown shape 'gpt5'"), std::string::npos);
  EXPECT_NE(error_of("synth:gpt5:q4_0").find("smollm2-135m, qwen2.5-1.5b, llama3-8b, qwen2.5-7b"), std::string::npos);
  EXPECT_NE(error_of("synth:llama3-8b:q3_k").find("unknown type 'q3_k'"), std::string::npos);
  EXPECT_NE(error_of("synth:llama3-8b").find("expected a shape and a type"), std::string::npos);
  EXPECT_NE(error_of("synth:llama3-8b:q4_0:x1").find("seed 'x1'"), std::string::npos);
  EXPECT_NE(error_of("synth:llama3-8b:q4_0:1:2").find("expected a shape and a type"), std::string::npos);
  EXPECT_THROW(Model::load("synth:nope:q4_0"), Error);
}

// Padded to one token per embedding row, the padding inert (unused type).
TEST(SyntheticModel, TheTokenizerIsPaddedToTheVocabulary) {
  const SyntheticModelSpec spec = parse_synthetic_name("synth:qwen2.5-7b:q4_0");
  TokenizerSpec base;
  base.tokens = {"a", "b", "<|im_end|>"};
  base.token_types = {1, 1, 3};
  const TokenizerSpec padded = synthetic_tokenizer(spec, base);
  ASSERT_EQ(padded.tokens.size(), 152064u);
  ASSERT_EQ(padded.token_types.size(), 152064u);
  EXPECT_EQ(padded.tokens[2], "<|im_end|>");
  EXPECT_EQ(padded.token_types[3], 5);
  EXPECT_EQ(padded.tokens[152063], "<|synth_unused_152063|>");
  base.tokens.assign(200000, "x");
  base.token_types.assign(200000, 1);
  EXPECT_THROW(synthetic_tokenizer(spec, base), Error);
}

// Every type of the smallest shape loads in memory, has the shape's
// configuration and gives finite logits on the CPU.
TEST(SyntheticModel, EveryTypeOfTheSmallestShapeLoadsAndRuns) {
  for (const char* type : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"}) {
    SCOPED_TRACE(type);
    const std::string name = std::string("synth:smollm2-135m:") + type;
    const auto model = Model::load(name);
    const ModelConfig& c = model->config();
    EXPECT_EQ(model->path(), name);
    EXPECT_EQ(c.n_layer, 30);
    EXPECT_EQ(c.n_embd, 576);
    EXPECT_EQ(c.n_head, 9);
    EXPECT_EQ(c.n_head_kv, 3);
    EXPECT_EQ(c.n_ff, 1536);
    EXPECT_EQ(c.n_vocab, 49152);
    EXPECT_EQ(model->tokenizer_spec().tokens.size(), 49152u);
    ThreadPool pool(2);
    KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 16, 0});
    ForwardPass fp(*model, cache, pool);
    cache.add_sequence(0);
    const std::vector<int32_t> tokens{1, 200, 3000, 40000};
    BatchItem item{0, tokens, 0, false};
    const auto logits = fp.run({&item, 1});
    ASSERT_EQ(logits.size(), size_t(c.n_vocab));
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
}

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The same bytes on any thread count and for every writer; the file on disk
// gives the same logits as the model made in memory; another seed differs.
TEST(SyntheticModel, TheGgufIsTheModelMadeInMemory) {
  TempDir dir;
  const std::string name = "synth:smollm2-135m:q4_1";
  const SyntheticModelSpec spec = parse_synthetic_name(name);
  const TokenizerSpec tokenizer = synthetic_model_tokenizer(name);
  std::vector<std::string> paths;
  for (int threads : {1, 2}) {
    paths.push_back(dir.file("t" + std::to_string(threads) + ".gguf"));
    std::FILE* f = std::fopen(paths.back().c_str(), "wb");
    ASSERT_NE(f, nullptr);
    write_synthetic_gguf(spec, tokenizer, f, paths.back(), threads);
    ASSERT_EQ(std::fclose(f), 0);
  }
  EXPECT_EQ(file_bytes(paths[0]), file_bytes(paths[1]));

  const auto logits_of = [](const Model& model) {
    const ModelConfig& c = model.config();
    ThreadPool pool(2);
    KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 16, 0});
    ForwardPass fp(model, cache, pool);
    cache.add_sequence(0);
    const std::vector<int32_t> tokens{5, 6, 7};
    BatchItem item{0, tokens, 0, false};
    const auto logits = fp.run({&item, 1});
    return std::vector<float>(logits.begin(), logits.end());
  };
  const auto from_file = logits_of(*Model::load(paths[0]));
  EXPECT_EQ(from_file, logits_of(*Model::load(name)));
  EXPECT_NE(from_file, logits_of(*Model::load(name + ":2")));
}

}  // namespace
}  // namespace lazykv
