// Query statistics (worker/policy/query_stats.h): calibration undoes RoPE,
// files round-trip, and a bad file is a clear error that never stops the
// model from loading.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/policy_config.h"
#include "common/thread_pool.h"
#include "worker/format/tiny_model.h"
#include "worker/model.h"
#include "worker/policy/policy.h"
#include "worker/policy/query_calibration.h"
#include "worker/policy/query_stats.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

class QueryStatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lazykv_query_stats_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "tiny.gguf").string();
    TinyModelSpec spec;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    write_tiny_gguf(path_, spec);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  void write_stats_file(const std::string& text) {
    std::ofstream(query_stats_path(path_)) << text;
  }
  QueryStats measure(const std::vector<int32_t>& tokens) {
    const std::unique_ptr<Model> model = Model::load(path_);
    ThreadPool pool(2);
    return measure_query_stats(*model, tokens, pool, 16);
  }

  fs::path dir_;
  std::string path_;
};

// Layer 0 sees only the token's own embedding, so one token repeated gives
// one pre-RoPE query per head at every position: undone correctly, RoPE
// leaves |mean| equal to the mean magnitude; left in, the turning pairs
// would average towards zero.
TEST_F(QueryStatsTest, OneTokenRepeatedHasOneCentreInTheFirstLayer) {
  const QueryStats s = measure(std::vector<int32_t>(40, 42));  // 40 positions: three chunks of 16
  ASSERT_EQ(s.tokens, 40);
  int turning = 0;
  for (int h = 0; h < s.n_head; ++h) {
    for (int f = 0; f < s.n_freq; ++f) {
      const size_t i = s.offset(0, h) + size_t(f);
      const float centre = std::hypot(s.mean_re[i], s.mean_im[i]);
      EXPECT_NEAR(centre, s.abs_mean[i], 1e-4f * s.abs_mean[i] + 1e-6f) << "head " << h << " frequency " << f;
      if (s.abs_mean[i] > 1e-3f) ++turning;
    }
  }
  EXPECT_GT(turning, s.n_head * s.n_freq / 2);  // not vacuous: most pairs carry a query
}

TEST_F(QueryStatsTest, WrittenBesideTheModelTheyAreLoadedWithIt) {
  const QueryStats s = measure({5, 9, 33, 7, 120, 64, 3, 18, 250, 11});
  write_stats_file(query_stats_to_json(s).dump());
  const std::unique_ptr<Model> model = Model::load(path_);
  ASSERT_NE(model->query_stats(), nullptr) << model->query_stats_missing();
  const QueryStats& loaded = *model->query_stats();
  ASSERT_EQ(loaded.mean_re.size(), s.mean_re.size());
  for (size_t i = 0; i < s.mean_re.size(); ++i) {  // written with five significant digits
    EXPECT_NEAR(loaded.mean_re[i], s.mean_re[i], 1e-4f * std::abs(s.mean_re[i])) << i;
    EXPECT_NEAR(loaded.mean_im[i], s.mean_im[i], 1e-4f * std::abs(s.mean_im[i])) << i;
    EXPECT_NEAR(loaded.abs_mean[i], s.abs_mean[i], 1e-4f * s.abs_mean[i]) << i;
  }
  EXPECT_NO_THROW(make_policy(make_policy_config("triattention"), policy_shape(*model, 4)));
  // (trimkv still lacks its gates: none were written.)
  EXPECT_EQ(unavailable_policies(policy_shape(*model, 0)).count("triattention"), 0u);
}

TEST_F(QueryStatsTest, WithoutStatisticsTriAttentionSaysHowToMakeThem) {
  const std::unique_ptr<Model> model = Model::load(path_);
  EXPECT_EQ(model->query_stats(), nullptr);
  // Listed as unavailable (a worker's info carries this to the coordinator) ...
  const std::map<std::string, std::string> unavailable = unavailable_policies(policy_shape(*model, 0));
  ASSERT_EQ(unavailable.size(), 3u);  // and trimkv, without retention gates, and epicache, without an episode
  EXPECT_NE(unavailable.at("triattention").find("lazykv calibrate"), std::string::npos);
  EXPECT_NE(unavailable.at("trimkv").find("scripts/train_trimkv.sh"), std::string::npos);
  // ... and refused when built anyway.
  try {
    make_policy(make_policy_config("triattention"), policy_shape(*model, 4));
    FAIL() << "triattention ran without query statistics";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("lazykv calibrate"), std::string::npos) << e.what();
  }
}

TEST_F(QueryStatsTest, ABadFileIsNamedAndTheModelStillLoads) {
  const QueryStats good = measure({5, 9, 33, 7});
  nlohmann::json j = query_stats_to_json(good);
  const auto expect_refused = [&](const std::string& text, const std::string& why) {
    write_stats_file(text);
    std::unique_ptr<Model> model;
    ASSERT_NO_THROW(model = Model::load(path_)) << why;
    EXPECT_EQ(model->query_stats(), nullptr) << why;
    EXPECT_NE(model->query_stats_missing().find(why), std::string::npos) << model->query_stats_missing();
    EXPECT_THROW(make_policy(make_policy_config("triattention"), policy_shape(*model, 4)), Error);
  };
  expect_refused("{\"format\": ", "not valid JSON");
  expect_refused("[]", "lazykv-query-stats");
  nlohmann::json short_array = j;
  short_array["mean_im"].erase(0);
  expect_refused(short_array.dump(), "\"mean_im\" must be an array of");
  nlohmann::json text_in_array = j;
  text_in_array["abs_mean"][3] = "1";
  expect_refused(text_in_array.dump(), "\"abs_mean\"[3] is not a finite number");
  nlohmann::json inconsistent = j;
  inconsistent["abs_mean"][0] = 0.0;
  inconsistent["mean_re"][0] = 1.0;
  expect_refused(inconsistent.dump(), "exceeds the mean magnitude");
  nlohmann::json other_model = j;
  other_model["n_layer"] = 3;
  other_model["mean_re"].insert(other_model["mean_re"].end(), j["mean_re"].begin(), j["mean_re"].begin() + j["mean_re"].size() / 2);
  other_model["mean_im"] = other_model["mean_re"];
  for (auto& v : other_model["mean_im"]) v = 0.0;
  other_model["abs_mean"] = other_model["mean_re"];
  for (auto& v : other_model["abs_mean"]) v = std::abs(v.get<double>());
  expect_refused(other_model.dump(), "does not match the model");
}

// A statistics object of the wrong types (from a file or inside a trace) is
// an Error naming the field, never a JSON library exception.
TEST(QueryStatsJson, WrongTypesAreNamedErrors) {
  const auto message = [](const nlohmann::json& j) {
    try {
      query_stats_from_json(j);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted " << j.dump();
    return std::string();
  };
  EXPECT_NE(message({{"format", 1}}).find("lazykv-query-stats"), std::string::npos);
  nlohmann::json j = {{"format", "lazykv-query-stats"}, {"version", 1}, {"tokens", 4}, {"n_layer", 1},
                      {"n_head", 1},  {"n_freq", 1}, {"mean_re", {0.5}}, {"mean_im", {0.0}}, {"abs_mean", {0.5}}};
  EXPECT_NO_THROW(query_stats_from_json(j));
  j["model"] = 5;
  EXPECT_NE(message(j).find("\"model\" must be a string"), std::string::npos);
  j.erase("model");
  j["n_freq"] = "1";
  EXPECT_NE(message(j).find("\"n_freq\""), std::string::npos);
}

// keep_prompt=1 keeps the whole prompt; one that fills the budget would
// leave no room for anything generated, so it is refused up front.
TEST_F(QueryStatsTest, TriAttentionRefusesAPromptThatFillsTheBudget) {
  write_stats_file(query_stats_to_json(measure({5, 9, 33, 7})).dump());
  const std::unique_ptr<Model> model = Model::load(path_);
  const PolicyConfig kept = make_policy_config("triattention", {{"budget", "16"}});
  EXPECT_NO_THROW(make_policy(kept, policy_shape(*model, 15)));
  try {
    make_policy(kept, policy_shape(*model, 16));
    FAIL() << "a 16-token prompt with budget 16 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("keep_prompt=0"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make_policy(make_policy_config("triattention", {{"budget", "16"}, {"keep_prompt", "0"}}),
                              policy_shape(*model, 40)));
  // A sequence resuming after a preemption prefills its generated tokens
  // again; only the request's own prompt is kept whole.
  PolicyShape resumed = policy_shape(*model, 20);
  resumed.resumed_tokens = 10;
  EXPECT_NO_THROW(make_policy(kept, resumed));
  resumed.resumed_tokens = 4;
  EXPECT_THROW(make_policy(kept, resumed), Error);
}

}  // namespace
}  // namespace lazykv
