// Every golden trace in tests/data/policy (written by the independent numpy
// reference, scripts/reference/policy_reference.py) replayed through the C++
// policies: kept positions and integer state must match exactly, float state
// (h2o/tova/caote attention sums, obcache scores) within 1e-4 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/policy_config.h"
#include "worker/policy/trace_replay.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> golden_files() {
  std::vector<fs::path> files;
  const fs::path dir = fs::path(LAZYKV_TEST_DATA_DIR) / "policy";
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".json") files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

nlohmann::json load(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-4 * std::max(std::abs(a), std::abs(b)) + 1e-7; }

// Compares one head's per-slot state: integers exactly, floats with tolerance.
void expect_state_eq(const nlohmann::json& got, const nlohmann::json& want, const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where << ": state keys " << got.dump() << " vs " << want.dump();
  for (const auto& [key, values] : want.items()) {
    ASSERT_TRUE(got.contains(key)) << where << ": missing state '" << key << "'";
    const nlohmann::json& g = got[key];
    ASSERT_EQ(g.size(), values.size()) << where << "." << key;
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i].is_number_integer()) {
        ASSERT_EQ(g[i].get<int64_t>(), values[i].get<int64_t>()) << where << "." << key << "[" << i << "]";
      } else {
        ASSERT_TRUE(close(g[i].get<double>(), values[i].get<double>()))
            << where << "." << key << "[" << i << "]: " << g[i] << " vs " << values[i];
      }
    }
  }
}

TEST(GoldenTraces, DirectoryHoldsTraces) {
  // A missing or empty folder must fail, not pass vacuously.
  const std::vector<fs::path> files = golden_files();
  ASSERT_FALSE(files.empty()) << "no golden traces in " << LAZYKV_TEST_DATA_DIR
                              << "/policy; run scripts/reference/policy_reference.py";
  // Every catalog policy has golden traces (lazy+tiers needs a kvstore: its
  // own tests in tests/unit/tiers drive it).
  for (const PolicyInfo& info : policy_catalog()) {
    if (info.name == "lazy+tiers") continue;
    const std::string& policy = info.name;
    EXPECT_TRUE(std::any_of(files.begin(), files.end(),
                            [&](const fs::path& p) { return p.filename().string().rfind(policy + "_", 0) == 0; }))
        << "no golden trace for " << policy;
  }
}

// raas_newest_kept fails while worker/policy/raas.cc keeps a plain top-k by
// timestamp (older-first ties): when other decode slots are hit in the same
// step they tie with the newest token and win, so it is evicted, against the
// file's own "the newest token always stays".
class GoldenTrace : public ::testing::TestWithParam<fs::path> {};

TEST_P(GoldenTrace, ReplayMatchesReference) {
  const nlohmann::json golden = load(GetParam());
  const nlohmann::json got = replay_trace(golden["trace"]);
  const nlohmann::json& want = golden["expected"];
  ASSERT_EQ(got["steps"].size(), want["steps"].size());
  for (size_t i = 0; i < want["steps"].size(); ++i) {
    const nlohmann::json& g = got["steps"][i];
    const nlohmann::json& w = want["steps"][i];
    const std::string where = "step " + std::to_string(i);
    ASSERT_EQ(g["t"], w["t"]) << where;
    ASSERT_EQ(g["kept"], w["kept"]) << where << " (t = " << w["t"] << ")";
    ASSERT_EQ(g["state"].size(), w["state"].size()) << where;
    for (size_t h = 0; h < w["state"].size(); ++h) {
      expect_state_eq(g["state"][h], w["state"][h], where + " head " + std::to_string(h));
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_EQ(got["peak_slots"], want["peak_slots"]);
}

// Why replay_trace refuses a malformed trace ("accepted" when it does not).
std::string refusal(const nlohmann::json& trace) {
  try {
    replay_trace(trace);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return std::string(e.what());
  }
  return std::string("accepted");
}

// A trace for a policy that reads hidden states must give each step's token
// and state, all of one size: else a clear error, never a crash.
TEST(GoldenTraces, SkipKvTraceWithoutHiddenStatesIsRefused) {
  const nlohmann::json golden = load(fs::path(LAZYKV_TEST_DATA_DIR) / "policy" / "skipkv_random1.json");
  nlohmann::json no_hidden = golden["trace"];
  no_hidden["steps"][3].erase("hidden");
  EXPECT_NE(refusal(no_hidden).find("steps[3]: policy skipkv reads hidden states"), std::string::npos)
      << refusal(no_hidden);
  nlohmann::json shorter = golden["trace"];
  shorter["steps"][5]["hidden"].erase(0);
  EXPECT_NE(refusal(shorter).find("steps[5].hidden must be an array of 6 numbers"), std::string::npos)
      << refusal(shorter);
  nlohmann::json bad_end = golden["trace"];
  bad_end["sentence_ends"] = {-1};
  EXPECT_NE(refusal(bad_end).find("\"sentence_ends\" holds token ids"), std::string::npos) << refusal(bad_end);
}

// trimkv's rates come from a model's gates; a trace gives them instead
// ("prompt_log_beta" [H][P], "log_beta" [H] per step), each a log beta
// (finite, at most 0): else a clear error.
TEST(GoldenTraces, TrimKvTraceWithoutRatesIsRefused) {
  const nlohmann::json golden = load(fs::path(LAZYKV_TEST_DATA_DIR) / "policy" / "trimkv_random1.json");
  nlohmann::json no_prompt = golden["trace"];
  no_prompt.erase("prompt_log_beta");
  EXPECT_NE(refusal(no_prompt).find("the trace has no \"prompt_log_beta\""), std::string::npos) << refusal(no_prompt);
  nlohmann::json no_step = golden["trace"];
  no_step["steps"][4].erase("log_beta");
  EXPECT_NE(refusal(no_step).find("steps[4]: policy trimkv takes each token's rates"), std::string::npos)
      << refusal(no_step);
  nlohmann::json positive = golden["trace"];
  positive["steps"][2]["log_beta"][1] = 0.5;
  EXPECT_NE(refusal(positive).find("steps[2].log_beta[1]: a rate is a log beta"), std::string::npos)
      << refusal(positive);
  nlohmann::json short_prompt = golden["trace"];
  short_prompt["prompt_log_beta"][0].erase(0);
  EXPECT_NE(refusal(short_prompt).find("prompt_log_beta[0]"), std::string::npos) << refusal(short_prompt);
}

// epicache's episode comes from the trace: "draft_queries" (its patched
// prompt's queries) and "history_len" (the history, within the prompt):
// else a clear error.
TEST(GoldenTraces, EpiCacheTraceWithoutEpisodeIsRefused) {
  const nlohmann::json golden = load(fs::path(LAZYKV_TEST_DATA_DIR) / "policy" / "epicache_random1.json");
  nlohmann::json no_draft = golden["trace"];
  no_draft.erase("draft_queries");
  EXPECT_NE(refusal(no_draft).find("policy epicache compresses the history for an episode"), std::string::npos)
      << refusal(no_draft);
  for (int history : {0, 25}) {  // the prompt has 24 tokens
    nlohmann::json outside = golden["trace"];
    outside["history_len"] = history;
    EXPECT_NE(refusal(outside).find("\"history_len\" (the prompt's first tokens that are history) must be an "
                                    "integer in [1, P = 24]"),
              std::string::npos)
        << refusal(outside);
  }
  nlohmann::json short_draft = golden["trace"];
  short_draft["draft_queries"][1].erase(0);
  EXPECT_NE(refusal(short_draft).find("draft_queries[1] must hold H queries"), std::string::npos)
      << refusal(short_draft);
}

std::string test_name(const ::testing::TestParamInfo<fs::path>& info) { return info.param.stem().string(); }

INSTANTIATE_TEST_SUITE_P(Policy, GoldenTrace, ::testing::ValuesIn(golden_files()), test_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTrace);

}  // namespace
}  // namespace lazykv
