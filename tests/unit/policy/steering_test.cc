// skipkv's activation steering: token classes from a vocabulary, the
// steering file (round trip, and a bad one is a clear error that never stops
// the model from loading), the scale schedule, and the forward pass adding
// the vector at thought ends only.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/policy_config.h"
#include "common/thread_pool.h"
#include "worker/format/tiny_model.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/model.h"
#include "worker/policy/policy.h"
#include "worker/policy/steering.h"
#include "worker/policy/steering_measure.h"
#include "worker/policy/token_classes.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

TEST(TokenClasses, NewlinesBlankLinesAndReflectionWords) {
  // Byte-level BPE texts: U+010A is a newline, U+0120 a leading space.
  const std::vector<std::string> vocab = {"Hello", "\xC4\x8A", ".\xC4\x8A", "\xC4\x8A\xC4\x8A", ")\xC4\x8A\xC4\x8A",
                                          "Wait", "\xC4\xA0wait", "\xC4\xA0verify", "\xC4\xA0waiting", "\n\n",
                                          "<0x0A>", "\xC4\xA0" "Alternatively", "\xC4\x8A\xC4\xA0\xC4\xA0"};
  const std::shared_ptr<const TokenClasses> c = classify_tokens(vocab, true);
  ASSERT_EQ(c->size(), vocab.size());
  constexpr uint8_t kLine = kSentenceEnd | kLeadingNewline | kTrailingNewline;
  const std::vector<uint8_t> want = {0,
                                     kLine,
                                     kSentenceEnd | kTrailingNewline,
                                     kLine | kBlankLine,
                                     kSentenceEnd | kBlankLine | kTrailingNewline,
                                     kReflection,
                                     kReflection,
                                     kReflection,
                                     0,
                                     kLine | kBlankLine,
                                     0,  // a SentencePiece byte token, not byte-level text
                                     kReflection,
                                     kSentenceEnd | kLeadingNewline};
  for (size_t id = 0; id < vocab.size(); ++id) EXPECT_EQ(int((*c)[id]), int(want[id])) << "token " << id;
  EXPECT_EQ(token_class(*c, -1), 0);
  EXPECT_EQ(token_class(*c, 1000), 0);
  // A thought ends at a blank line, in one token or across two.
  EXPECT_TRUE(ends_thought(0, (*c)[3]));
  EXPECT_TRUE(ends_thought((*c)[2], (*c)[1]));   // ".\n" then "\n"
  EXPECT_TRUE(ends_thought((*c)[1], (*c)[12]));  // "\n" then "\n  "
  EXPECT_FALSE(ends_thought((*c)[0], (*c)[1]));  // "Hello" then "\n"
  EXPECT_FALSE(ends_thought((*c)[2], (*c)[0]));  // ".\n" then "Hello"

  // SentencePiece: "<0x0A>" is a newline, U+2581 a space, and U+010A is a
  // letter (Maltese), not a newline.
  const std::shared_ptr<const TokenClasses> sp =
      classify_tokens({"<0x0A>", "\xE2\x96\x81Wait", "\xC4\x8A", "\xE2\x96\x81the"}, false);
  EXPECT_EQ(int((*sp)[0]), int(kSentenceEnd | kLeadingNewline | kTrailingNewline));
  EXPECT_EQ(int((*sp)[1]), int(kReflection));
  EXPECT_EQ(int((*sp)[2]), 0);
  EXPECT_EQ(int((*sp)[3]), 0);
}

class SteeringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lazykv_steering_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "tiny.gguf").string();
    write_tiny_gguf(path_, spec_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  SteeringVector vector(float value, int layer) const {
    SteeringVector s;
    s.model = "tiny";
    s.n_layer = spec_.n_layer;
    s.n_embd = spec_.n_embd;
    s.layer = layer;
    s.execution = 3;
    s.reflection = 2;
    s.vector.assign(size_t(spec_.n_embd), value);
    return s;
  }
  void write(const nlohmann::json& j) const { std::ofstream(steering_path(path_)) << j.dump(); }

  TinyModelSpec spec_;
  fs::path dir_;
  std::string path_;
};

TEST_F(SteeringTest, FileRoundTripsAndTheModelFindsIt) {
  const SteeringVector s = vector(0.25f, 1);
  write(steering_to_json(s));
  const std::unique_ptr<Model> model = Model::load(path_);
  ASSERT_NE(model->steering(), nullptr) << model->steering_missing();
  EXPECT_EQ(model->steering()->layer, 1);
  EXPECT_EQ(model->steering()->reflection, 2);
  EXPECT_EQ(model->steering()->vector, s.vector);
  EXPECT_TRUE(model->steering_missing().empty());
}

TEST_F(SteeringTest, MissingOrBadFilesAreNamedAndTheModelStillLoads) {
  const auto missing = [&] {
    const std::unique_ptr<Model> model = Model::load(path_);
    EXPECT_EQ(model->steering(), nullptr);
    return model->steering_missing();
  };
  EXPECT_NE(missing().find("lazykv steer --model"), std::string::npos) << missing();
  std::ofstream(steering_path(path_)) << "{not json";
  EXPECT_NE(missing().find("not valid JSON"), std::string::npos) << missing();
  nlohmann::json j = steering_to_json(vector(1.0f, 0));
  j["layer"] = spec_.n_layer;
  write(j);
  EXPECT_NE(missing().find("\"layer\" must be an integer in [0, n_layer)"), std::string::npos) << missing();
  j = steering_to_json(vector(1.0f, 0));
  j["vector"][3] = "x";
  write(j);
  EXPECT_NE(missing().find("\"vector\"[3] is not a finite number"), std::string::npos) << missing();
  j = steering_to_json(vector(1.0f, 0));
  j["reflection"] = 0;
  write(j);
  EXPECT_NE(missing().find("\"reflection\" must be a positive integer"), std::string::npos) << missing();
  j = steering_to_json(vector(1.0f, 0));
  j["version"] = 2;
  write(j);
  EXPECT_NE(missing().find("unsupported \"version\""), std::string::npos) << missing();
  SteeringVector other = vector(1.0f, 0);
  other.n_embd = spec_.n_embd * 2;
  other.vector.resize(size_t(other.n_embd));
  write(steering_to_json(other));
  EXPECT_NE(missing().find("does not match the model"), std::string::npos) << missing();
}

// The scale: steer at a blank line, plus steer_step for each earlier thought
// that held a reflection word, up to steer_max; nothing elsewhere or when off.
TEST_F(SteeringTest, ScaleGrowsWithReflectionThoughtsUpToTheMaximum) {
  PolicyShape shape;
  shape.n_layer = 1;
  shape.n_head_kv = 1;
  shape.head_dim = 8;
  shape.prompt_len = 2;
  auto classes = std::make_shared<TokenClasses>(8, 0);
  (*classes)[5] = kSentenceEnd | kBlankLine | kTrailingNewline;
  (*classes)[6] = kReflection;
  shape.token_classes = classes;
  shape.steering = std::make_shared<const SteeringVector>(vector(1.0f, 0));
  const PolicyConfig c = make_policy_config(
      "skipkv", {{"budget", "64"}, {"steer", "0.5"}, {"steer_step", "0.25"}, {"steer_max", "1"}});
  std::unique_ptr<EvictionPolicy> p = make_policy(c, shape);
  const std::vector<float> hidden(4, 1.0f);
  int32_t pos = 2;
  const auto feed = [&](int32_t token) { p->observe_token(pos++, token, hidden); };
  EXPECT_EQ(p->steering_scale(1, 5), 0.0f) << "a prompt position";
  EXPECT_EQ(p->steering_scale(pos, 3), 0.0f) << "not a thought end";
  EXPECT_EQ(p->steering_scale(pos, 5), 0.0f) << "no text yet";
  feed(3);
  EXPECT_EQ(p->steering_scale(pos, 5), 0.5f);
  feed(6), feed(5);  // a thought that re-checked
  EXPECT_EQ(p->steering_scale(pos, 5), 0.0f) << "a blank line right after another ends no thought";
  feed(3);
  EXPECT_EQ(p->steering_scale(pos, 5), 0.75f);
  feed(5), feed(3);  // one that did not
  EXPECT_EQ(p->steering_scale(pos, 5), 0.75f);
  feed(6), feed(5), feed(6), feed(5), feed(3);
  EXPECT_EQ(p->steering_scale(pos, 5), 1.0f) << "capped at steer_max";

  std::unique_ptr<EvictionPolicy> off = make_policy(make_policy_config("skipkv", {{"budget", "64"}}), shape);
  EXPECT_EQ(off->steering_scale(2, 5), 0.0f);
  shape.steering = nullptr;
  shape.steering_missing = "no steering vector beside the model";
  try {
    make_policy(c, shape);
    ADD_FAILURE() << "steer > 0 without a vector was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("no steering vector beside the model"), std::string::npos) << e.what();
  }
}

// Steered and unsteered runs give the same logits until the pass that feeds a
// blank line, and different ones from then on.
TEST_F(SteeringTest, TheForwardPassSteersAtThoughtEndsOnly) {
  write(steering_to_json(vector(0.5f, 0)));
  const std::unique_ptr<Model> model = Model::load(path_);
  ASSERT_NE(model->steering(), nullptr) << model->steering_missing();
  const std::vector<std::string>& vocab = model->tokenizer_spec().tokens;
  const auto blank = std::find(vocab.begin(), vocab.end(), "\xC4\x8A\xC4\x8A");
  ASSERT_NE(blank, vocab.end()) << "the tiny vocabulary has a blank-line token";
  const int32_t blank_line = int32_t(blank - vocab.begin());
  const std::vector<int32_t> prompt = {1, 40, 75}, generated = {120, 3, blank_line, 200, 17};
  const auto logits = [&](const std::string& steer) {
    ThreadPool pool(2);
    const ModelConfig& mc = model->config();
    KvCache cache({mc.n_layer, mc.n_head_kv, mc.head_dim, 4, 0});
    ForwardPass forward(*model, cache, pool);
    const PolicyConfig c = make_policy_config("skipkv", {{"budget", "64"}, {"steer", steer}});
    std::unique_ptr<EvictionPolicy> p = make_policy(c, policy_shape(*model, int32_t(prompt.size())));
    cache.add_sequence(0, p->heads_per_layer());
    BatchItem item{0, prompt, 0, false, p.get()};
    forward.run({&item, 1});
    std::vector<std::vector<float>> out;
    int32_t pos = int32_t(prompt.size());
    for (int32_t token : generated) {
      const std::vector<int32_t> one = {token};
      BatchItem step{0, one, pos++, false, p.get()};
      const std::span<const float> l = forward.run({&step, 1});
      out.emplace_back(l.begin(), l.end());
    }
    return out;
  };
  const auto plain = logits("0"), steered = logits("1");
  EXPECT_EQ(plain[0], steered[0]);
  EXPECT_EQ(plain[1], steered[1]);
  EXPECT_NE(plain[2], steered[2]) << "the blank line's pass is steered";
  EXPECT_NE(plain[3], steered[3]) << "its keys and values stay in the cache";
}

TEST_F(SteeringTest, MeasuringNeedsThoughtsOfBothKinds) {
  const std::unique_ptr<Model> model = Model::load(path_);
  ThreadPool pool(2);
  const std::vector<std::string>& vocab = model->tokenizer_spec().tokens;
  const int32_t blank_line = int32_t(std::find(vocab.begin(), vocab.end(), "\xC4\x8A\xC4\x8A") - vocab.begin());
  const std::vector<int32_t> text = {1, 40, 75, blank_line, 120, 3, blank_line};
  try {
    measure_steering(*model, text, 1, pool);
    ADD_FAILURE() << "a text without reflection was measured";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("2 execution and 0 reflection thoughts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at least 1 of each kind"), std::string::npos) << e.what();
  }
  EXPECT_THROW(measure_steering(*model, text, spec_.n_layer, pool), Error);
}

}  // namespace
}  // namespace lazykv
