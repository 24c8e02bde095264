// Real models against Hugging Face transformers (CPU PyTorch, fp32,
// weights dequantized from the same GGUF). Reference data:
// tests/data/model/*.json, made by scripts/reference/make_model_reference.py
// (SmolLM2) and make_qwen_reference.py (Qwen2.5-Coder-1.5B).
//
// lazykv's default (f32 activations, weights dequantized on the fly, f16 KV
// cache) tracks the fp32 reference to rounding error: measured mean
// |Δ log p(target)| 0.0006, max 0.011, top-1 agreement 100% and all three
// greedy generations identical. The tolerances below leave headroom for other
// CPUs' summation orders. The int8-activation mode (llama.cpp-style) is
// measured too, against the looser bounds its 8-bit rounding allows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "coordinator/tokenizer/tokenizer.h"
#include "kernels/cpu/matmul_amx.h"
#include "worker/forward.h"
#include "worker/model.h"
#include "worker/sampler.h"

namespace lazykv {
namespace {

// Tolerances (natural-log units).
constexpr double kMeanTargetLogprobTol = 0.005;  // mean |Δ log p(next token)|
constexpr double kMaxTargetLogprobTol = 0.05;    // worst position
constexpr double kFullVectorTol = 0.05;          // max |Δ log p| over tokens with log p > -15
constexpr double kMinTop1Agreement = 0.99;
constexpr double kNearTieMargin = 0.01;          // greedy may diverge only where the reference's top-2 logits are this close

nlohmann::json load_json(const std::string& name) {
  std::ifstream in(std::string(LAZYKV_TEST_DATA_DIR) + "/model/" + name);
  if (!in) throw std::runtime_error("missing reference file " + name);
  return nlohmann::json::parse(in);
}

std::string model_path() {
  const char* p = std::getenv("LAZYKV_DEFAULT_MODEL");
  if (p == nullptr || *p == '\0') {
    throw std::runtime_error("LAZYKV_DEFAULT_MODEL is not set (scripts/test.sh sets it after fetching the model)");
  }
  return p;
}

std::vector<float> log_softmax(std::span<const float> logits) {
  float max = logits[0];
  for (float l : logits) max = std::max(max, l);
  double z = 0;
  for (float l : logits) z += std::exp(double(l) - max);
  const double lse = max + std::log(z);
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = float(double(logits[i]) - lse);
  return out;
}

KvCacheConfig cache_config_for(const Model& model) {
  const ModelConfig& c = model.config();
  return {c.n_layer, c.n_head_kv, c.head_dim, 64, 0};
}

void greedy(const Model& model, const std::string& prefix) {
  const nlohmann::json ref = load_json(prefix + "_greedy.json");
  const Tokenizer tokenizer(model.tokenizer_spec());
  for (const nlohmann::json& p : ref["prompts"]) {
    const std::string name = p["name"].get<std::string>();
    const auto prompt = p["prompt_token_ids"].get<std::vector<int32_t>>();
    const auto expected = p["generated_token_ids"].get<std::vector<int32_t>>();
    const auto margins = p["top2_logit_margins"].get<std::vector<double>>();
    // The tokenizer reproduces the reference prompt ids.
    EXPECT_EQ(tokenizer.encode(p["prompt_text"].get<std::string>(), /*parse_special=*/true), prompt) << name;

    ThreadPool pool(0);
    KvCache cache(cache_config_for(model));
    ForwardPass fp(model, cache, pool);
    cache.add_sequence(0);
    BatchItem item{0, prompt, 0, false};
    auto logits = fp.run({&item, 1});
    std::vector<int32_t> generated;
    for (size_t step = 0; step < expected.size(); ++step) {
      const int32_t id = argmax(logits);
      generated.push_back(id);
      if (id != expected[step]) break;
      item = BatchItem{0, {&generated.back(), 1}, int32_t(prompt.size() + step), false};
      logits = fp.run({&item, 1});
    }
    if (generated == expected) {
      std::printf("%s: %zu/%zu tokens identical\n", name.c_str(), expected.size(), expected.size());
      continue;
    }
    const size_t at = generated.size() - 1;
    std::printf("%s: first divergence at step %zu (reference top-2 margin %.4f)\n", name.c_str(), at, margins[at]);
    EXPECT_LT(margins[at], kNearTieMargin)
        << name << ": greedy output diverges at step " << at << " where the reference is not a near tie";
  }
}

class SmolLM2Reference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(model_path()).release(); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static Model* model_;
};
Model* SmolLM2Reference::model_ = nullptr;

struct Tolerances {
  double mean_target, max_target, full_vector, min_top1;
};

void teacher_forced(const Model& model, const std::string& prefix, cpu::ActivationPrecision precision,
                    const Tolerances& tol) {
  const nlohmann::json ref = load_json(prefix + "_teacher_forced.json");
  const std::vector<int32_t> ids = ref["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), ref["positions"].size());
  ThreadPool pool(0);
  KvCache cache(cache_config_for(model));
  ForwardPass fp(model, cache, pool, precision);
  cache.add_sequence(0);
  BatchItem item{0, ids, 0, true};
  const auto logits = fp.run({&item, 1});
  const size_t V = size_t(model.config().n_vocab);

  int top1_agree = 0;
  double sum_abs = 0, max_abs = 0;
  int n_targets = 0;
  std::vector<std::vector<float>> logprobs(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    logprobs[i] = log_softmax(logits.subspan(i * V, V));
    const nlohmann::json& pos = ref["positions"][i];
    if (argmax(logprobs[i]) == pos["top1"].get<int32_t>()) ++top1_agree;
    if (i + 1 < ids.size()) {
      const double d = std::abs(logprobs[i][size_t(ids[i + 1])] - pos["target_logprob"].get<double>());
      sum_abs += d;
      max_abs = std::max(max_abs, d);
      ++n_targets;
    }
  }
  const double agreement = double(top1_agree) / double(ids.size());
  const double mean_abs = sum_abs / n_targets;
  std::printf("teacher forced: %zu positions, top-1 agreement %.4f, |Δ log p(target)| mean %.4f max %.4f\n", ids.size(),
              agreement, mean_abs, max_abs);
  EXPECT_GE(agreement, tol.min_top1);
  EXPECT_LT(mean_abs, tol.mean_target);
  EXPECT_LT(max_abs, tol.max_target);

  for (const nlohmann::json& full : ref["full_logprobs"]) {
    const size_t position = full["position"].get<size_t>();
    const auto expected = full["logprobs"].get<std::vector<double>>();
    ASSERT_EQ(expected.size(), V);
    ASSERT_LT(position, ids.size());
    double worst = 0;
    for (size_t t = 0; t < V; ++t) {
      if (expected[t] > -15.0) worst = std::max(worst, std::abs(logprobs[position][t] - expected[t]));
    }
    std::printf("position %zu: max |Δ log p| over likely tokens %.4f\n", position, worst);
    EXPECT_LT(worst, tol.full_vector) << "position " << position;
  }
}

TEST_F(SmolLM2Reference, TeacherForcedLogprobsMatchTransformers) {
  teacher_forced(*model_, "smollm2", cpu::ActivationPrecision::kF32,
                 {kMeanTargetLogprobTol, kMaxTargetLogprobTol, kFullVectorTol, kMinTop1Agreement});
}

// The int8-activation mode: measured 96.5-98% top-1 agreement, mean |Δ| 0.05-0.056
// (8-bit rounding flips near-ties; which ones depends on summation order).
// The int8 kernels themselves: with AMX tiles a prompt past 64 tokens
// would take the exact path (matmul_amx.h).
TEST_F(SmolLM2Reference, Int8ActivationsStayClose) {
  struct AmxOff {
    AmxOff() { cpu::set_amx_enabled(false); }
    ~AmxOff() { cpu::set_amx_enabled(true); }
  } amx_off;
  teacher_forced(*model_, "smollm2", cpu::ActivationPrecision::kInt8, {0.08, 1.5, 1.0, 0.95});
}

TEST_F(SmolLM2Reference, GreedyGenerationMatchesTransformers) { greedy(*model_, "smollm2"); }

// The optional second model (scripts/fetch_optional_model.sh): Qwen2
// architecture, Q4_K/Q6_K weights, untied output. Runs when it is cached.
class QwenReference : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("LAZYKV_CACHE_DIR");
    const char* home = std::getenv("HOME");
    const std::string dir = env != nullptr && *env ? std::string(env) : std::string(home ? home : ".") + "/.cache/lazykv";
    path_ = dir + "/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
    if (!std::ifstream(path_)) GTEST_SKIP() << "optional model not cached: run scripts/fetch_optional_model.sh";
  }
  std::string path_;
};

TEST_F(QwenReference, TeacherForcedAndGreedyMatchTransformers) {
  const auto model = Model::load(path_);
  teacher_forced(*model, "qwen2.5-coder-1.5b", cpu::ActivationPrecision::kF32,
                 {kMeanTargetLogprobTol, kMaxTargetLogprobTol, kFullVectorTol, kMinTop1Agreement});
  greedy(*model, "qwen2.5-coder-1.5b");
}

}  // namespace
}  // namespace lazykv
