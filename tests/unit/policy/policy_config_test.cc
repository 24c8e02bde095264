// Policy names, parameters and their validation (common/policy_config.h).
#include "common/policy_config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"

namespace lazykv {
namespace {

// The message of the kInvalidArgument error `f` throws ("" if none).
std::string invalid_argument(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected Error(kInvalidArgument)";
  return "";
}

std::string config_error(const std::string& name, const std::map<std::string, std::string>& params = {}) {
  return invalid_argument([&] { make_policy_config(name, params); });
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(PolicyCatalog, ListsEveryPolicyInOrder) {
  std::vector<std::string> names;
  for (const PolicyInfo& p : policy_catalog()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"full", "lazy", "lazy+tiers", "streaming", "h2o", "tova", "snapkv", "rkv", "raas", "caote", "obcache", "vase", "triattention", "laq", "skipkv", "trimkv", "epicache"}));
  for (const PolicyInfo& p : policy_catalog()) {
    EXPECT_FALSE(p.summary.empty()) << p.name;
    for (const PolicyParam& param : p.params) {
      EXPECT_LE(param.min, param.default_value) << p.name << "." << param.name;
      EXPECT_GE(param.max, param.default_value) << p.name << "." << param.name;
      EXPECT_FALSE(param.help.empty()) << p.name << "." << param.name;
    }
  }
}

TEST(PolicyConfig, UnknownPolicyListsValidOnes) {
  const std::string msg = config_error("lru");
  EXPECT_TRUE(contains(msg, "'lru'")) << msg;
  for (const char* name : {"full", "lazy", "streaming", "h2o", "tova", "snapkv", "rkv", "raas", "caote", "obcache", "vase"}) {
    EXPECT_TRUE(contains(msg, name)) << msg;
  }
  EXPECT_NE(config_error("LAZY"), "");  // names are case-sensitive
}

TEST(PolicyConfig, UnknownParameterListsThePolicysParameters) {
  const std::string msg = config_error("lazy", {{"windw", "4"}});
  EXPECT_TRUE(contains(msg, "windw")) << msg;
  for (const char* p : {"budget", "window", "alpha", "per_query_head"}) EXPECT_TRUE(contains(msg, p)) << msg;
  // A parameter of another policy is unknown too.
  EXPECT_TRUE(contains(config_error("streaming", {{"alpha", "0.1"}}), "sinks"));
  EXPECT_TRUE(contains(config_error("full", {{"budget", "8"}}), "none"));
}

TEST(PolicyConfig, BadValues) {
  // Out of range.
  EXPECT_TRUE(contains(config_error("lazy", {{"alpha", "1.5"}}), "alpha"));
  EXPECT_NE(config_error("lazy", {{"alpha", "-0.1"}}), "");
  EXPECT_NE(config_error("lazy", {{"budget", "0"}}), "");
  EXPECT_NE(config_error("lazy", {{"per_query_head", "2"}}), "");
  EXPECT_NE(config_error("snapkv", {{"kernel", "65"}}), "");
  EXPECT_NE(config_error("rkv", {{"period", "0"}}), "");
  EXPECT_NE(config_error("rkv", {{"lambda", "1.01"}}), "");
  // Not an integer.
  EXPECT_TRUE(contains(config_error("lazy", {{"budget", "12.5"}}), "integer"));
  EXPECT_NE(config_error("streaming", {{"sinks", "1e-3"}}), "");
  // Not a number.
  EXPECT_NE(config_error("lazy", {{"budget", "many"}}), "");
  EXPECT_NE(config_error("lazy", {{"budget", ""}}), "");
  EXPECT_NE(config_error("lazy", {{"budget", "64x"}}), "");
  EXPECT_NE(config_error("lazy", {{"alpha", "nan"}}), "");
  EXPECT_NE(config_error("lazy", {{"alpha", "inf"}}), "");
}

TEST(PolicyConfig, WindowsMustBeSmallerThanBudget) {
  for (const char* policy : {"lazy", "snapkv", "rkv"}) {
    const std::string msg = config_error(policy, {{"budget", "16"}, {"window", "16"}});
    EXPECT_TRUE(contains(msg, "window")) << policy << ": " << msg;
    EXPECT_NE(config_error(policy, {{"budget", "16"}, {"window", "20"}}), "") << policy;
    EXPECT_NO_THROW(make_policy_config(policy, {{"budget", "16"}, {"window", "15"}})) << policy;
  }
  // The default window against a small budget fails too.
  EXPECT_NE(config_error("lazy", {{"budget", "64"}}), "");
  EXPECT_TRUE(contains(config_error("streaming", {{"budget", "4"}, {"sinks", "4"}}), "sinks"));
  EXPECT_NO_THROW(make_policy_config("streaming", {{"budget", "5"}, {"sinks", "4"}}));
  EXPECT_TRUE(contains(config_error("h2o", {{"budget", "8"}, {"recent", "8"}}), "recent"));
  EXPECT_NO_THROW(make_policy_config("h2o", {{"budget", "8"}, {"recent", "7"}}));
}

TEST(PolicyConfig, KernelMustBeOdd) {
  EXPECT_TRUE(contains(config_error("snapkv", {{"kernel", "4"}}), "odd"));
  EXPECT_TRUE(contains(config_error("rkv", {{"kernel", "6"}}), "odd"));
  EXPECT_NO_THROW(make_policy_config("snapkv", {{"kernel", "1"}}));
}

// The rules between parameters are the rows' data: every parameter a rule
// names exists in its row, and each rule refuses what it should.
TEST(PolicyConfig, EveryRowsRulesNameItsOwnParameters) {
  for (const PolicyInfo& p : policy_catalog()) {
    const auto has = [&](const std::string& name) {
      return std::any_of(p.params.begin(), p.params.end(), [&](const PolicyParam& q) { return q.name == name; });
    };
    for (const std::string& r : p.below_budget) {
      EXPECT_TRUE(has(r) && has("budget")) << p.name << "." << r;
      // The row's other rules hold (1 < 64), so this one alone is broken.
      std::map<std::string, std::string> values = {{"budget", "64"}};
      for (const std::string& other : p.below_budget) values[other] = other == r ? "64" : "1";
      const std::string msg = config_error(p.name, values);
      EXPECT_TRUE(contains(msg, r + " (64) must be smaller than budget (64)")) << msg;
    }
    for (const std::string& r : p.odd) {
      EXPECT_TRUE(has(r)) << p.name << "." << r;
      EXPECT_TRUE(contains(config_error(p.name, {{r, "4"}}), r + " must be odd")) << p.name;
    }
  }
}

// keep_prompt=1 never evicts the prompt: it must leave room in the budget.
TEST(PolicyConfig, APromptThatFillsAKeptBudgetIsRefused) {
  const PolicyConfig kept = make_policy_config("triattention", {{"budget", "16"}});
  EXPECT_EQ(prompt_refusal(kept, 15), "");
  EXPECT_TRUE(contains(prompt_refusal(kept, 16), "the prompt (16 tokens) fills the budget (16)"));
  EXPECT_TRUE(contains(prompt_refusal(kept, 16), "keep_prompt=0"));
  EXPECT_EQ(prompt_refusal(make_policy_config("triattention", {{"budget", "16"}, {"keep_prompt", "0"}}), 40), "");
  EXPECT_EQ(prompt_refusal(make_policy_config("lazy", {{"budget", "16"}, {"window", "8"}}), 40), "");  // evicts prompts
  // The newest slots a compaction keeps take room too: lazy's window, h2o's
  // recent window (0: half the budget); streaming and tova keep none.
  const PolicyConfig lazy = make_policy_config("lazy", {{"budget", "16"}, {"window", "4"}, {"keep_prompt", "1"}});
  EXPECT_EQ(prompt_refusal(lazy, 11), "");
  EXPECT_TRUE(contains(prompt_refusal(lazy, 12), "the prompt (12 tokens) and the 4 newest slots it always keeps fill "
                                                 "the budget (16)"));
  const PolicyConfig h2o = make_policy_config("h2o", {{"budget", "16"}, {"keep_prompt", "1"}});
  EXPECT_EQ(recent_slots(h2o), 8);
  EXPECT_EQ(prompt_refusal(h2o, 7), "");
  EXPECT_NE(prompt_refusal(h2o, 8), "");
  for (const char* name : {"streaming", "tova"}) {
    const PolicyConfig c = make_policy_config(name, {{"budget", "16"}, {"keep_prompt", "1"}});
    EXPECT_EQ(recent_slots(c), 0) << name;
    EXPECT_EQ(prompt_refusal(c, 15), "") << name;
    EXPECT_NE(prompt_refusal(c, 16), "") << name;
  }
}

// Every evicting policy can keep the prompt: raas always does (no parameter);
// epicache's prompt is the history it compresses, the question always stays.
TEST(PolicyConfig, EveryEvictingPolicyCanKeepThePrompt) {
  for (const PolicyInfo& p : policy_catalog()) {
    const bool has = std::any_of(p.params.begin(), p.params.end(),
                                 [](const PolicyParam& q) { return q.name == "keep_prompt"; });
    EXPECT_EQ(has, p.name != "full" && p.name != "raas" && !p.episodic) << p.name;
    EXPECT_EQ(p.episodic, p.name == "epicache") << p.name;
    if (!p.recent.empty()) {
      EXPECT_TRUE(std::any_of(p.params.begin(), p.params.end(), [&](const PolicyParam& q) { return q.name == p.recent; }))
          << p.name << "." << p.recent;
    }
  }
}

TEST(PolicyConfig, DefaultsFilledIn) {
  const PolicyConfig lazy = make_policy_config(std::string("lazy"));
  EXPECT_EQ(lazy.name, "lazy");
  EXPECT_EQ(lazy.params.size(), 5u);
  EXPECT_EQ(lazy.get("budget"), 512);
  EXPECT_EQ(lazy.get("window"), 128);
  EXPECT_DOUBLE_EQ(lazy.get("alpha"), 1e-4);
  EXPECT_EQ(lazy.get("per_query_head"), 0);
  EXPECT_EQ(lazy.budget(), 512);

  const PolicyConfig rkv = make_policy_config("rkv", {{"budget", "256"}});
  EXPECT_EQ(rkv.get_int("budget"), 256);
  EXPECT_EQ(rkv.get_int("period"), 128);
  EXPECT_EQ(rkv.get_int("window"), 8);
  EXPECT_EQ(rkv.get_int("kernel"), 7);
  EXPECT_DOUBLE_EQ(rkv.get("lambda"), 0.1);

  const PolicyConfig full = make_policy_config(std::string("full"));
  EXPECT_TRUE(full.params.empty());
  EXPECT_EQ(full.budget(), 0);
  // Asking a policy for a parameter it lacks is a programming error.
  try {
    full.get("budget");
    ADD_FAILURE() << "expected kInternal";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
  // Every catalog default is itself a valid configuration.
  for (const PolicyInfo& p : policy_catalog()) EXPECT_NO_THROW(make_policy_config(p.name)) << p.name;
}

TEST(PolicyConfig, FromJsonEqualsFromStrings) {
  const PolicyConfig a = make_policy_config(nlohmann::json{{"name", "lazy"}, {"budget", 64}, {"window", 8}, {"alpha", 0.002}});
  const PolicyConfig b = make_policy_config("lazy", {{"budget", "64"}, {"window", "8"}, {"alpha", "0.002"}});
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.to_string(), b.to_string());
  // Booleans are 0/1.
  EXPECT_EQ(make_policy_config(nlohmann::json{{"name", "lazy"}, {"budget", 64}, {"window", 8}, {"per_query_head", true}})
                .get("per_query_head"),
            1);
  // Round trip through to_json.
  EXPECT_EQ(make_policy_config(a.to_json()).params, a.params);
}

TEST(PolicyConfig, BadJson) {
  EXPECT_NE(invalid_argument([] { make_policy_config(nlohmann::json::array()); }), "");
  EXPECT_NE(invalid_argument([] { make_policy_config(nlohmann::json{{"budget", 8}}); }), "");
  EXPECT_NE(invalid_argument([] { make_policy_config(nlohmann::json{{"name", 3}}); }), "");
  EXPECT_TRUE(contains(invalid_argument([] { make_policy_config(nlohmann::json{{"name", "lazy"}, {"budget", "64"}}); }),
                       "budget"));
  EXPECT_NE(invalid_argument([] { make_policy_config(nlohmann::json{{"name", "lazy"}, {"budget", 64.5}}); }), "");
  EXPECT_NE(invalid_argument([] { make_policy_config(nlohmann::json{{"name", "nope"}}); }), "");
}

TEST(PolicyConfig, ToString) {
  EXPECT_EQ(make_policy_config(std::string("full")).to_string(), "full");
  EXPECT_EQ(make_policy_config(std::string("lazy")).to_string(), "lazy(alpha=0.0001,budget=512,keep_prompt=0,per_query_head=0,window=128)");
  EXPECT_EQ(make_policy_config("streaming", {{"budget", "64"}, {"sinks", "2"}}).to_string(),
            "streaming(budget=64,keep_prompt=0,sinks=2)");
  const nlohmann::json j = make_policy_config("tova", {{"budget", "32"}}).to_json();
  EXPECT_EQ(j, (nlohmann::json{{"name", "tova"}, {"budget", 32.0}, {"keep_prompt", 0.0}}));
}

}  // namespace
}  // namespace lazykv
