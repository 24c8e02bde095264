// Eviction policies driven by the real CPU forward pass on a tiny random GQA
// model (4 query heads, 2 KV heads): exactness without eviction, budgets and
// peaks with it, and the errors the pass must raise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "common/policy_config.h"
#include "common/thread_pool.h"
#include "eval/kv_occupancy.h"
#include "kernels/cpu/quant.h"
#include "worker/format/tiny_model.h"
#include "worker/draft.h"
#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/model.h"
#include "worker/policy/policy.h"
#include "worker/policy/query_calibration.h"
#include "tests/unit/policy/random_gates.h"
#include "worker/policy/retention_gates.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

const std::vector<int32_t> kPrompt = {1, 40, 75, 120, 3, 200};

// The tiny model, written to a temporary folder and loaded (the mapping keeps
// the data); with_calibration, its query statistics (measured on a few
// tokens, for triattention) and retention gates (random, for trimkv) are
// written beside it first.
std::unique_ptr<Model> load_tiny_model(bool with_calibration) {
  TinyModelSpec spec;
  spec.n_layer = 2;
  spec.n_embd = 64;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  spec.n_ff = 96;
  spec.seed = 7;
  const fs::path dir = fs::temp_directory_path() /
                       ("lazykv_policy_forward_test_" + std::to_string(::getpid()) + (with_calibration ? "_calibrated" : ""));
  fs::create_directories(dir);
  const std::string path = (dir / "tiny.gguf").string();
  write_tiny_gguf(path, spec);
  if (with_calibration) {
    write_random_gates(retention_gates_path(path), RandomGatesSpec{.n_layer = spec.n_layer, .n_embd = spec.n_embd,
                                                                   .n_head_kv = spec.n_head_kv, .n_hidden = 16});
    ThreadPool pool(2);
    const std::vector<int32_t> text = {1, 17, 99, 140, 23, 61, 77, 200, 5, 9, 180, 33, 250, 14, 3, 90};
    std::ofstream(query_stats_path(path)) << query_stats_to_json(measure_query_stats(*Model::load(path), text, pool)).dump();
  }
  std::unique_ptr<Model> loaded = Model::load(path);
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  return loaded;
}

const Model& tiny_model() {
  static const std::unique_ptr<Model> model = load_tiny_model(false);
  return *model;
}

const Model& tiny_model_with_calibration() {
  static const std::unique_ptr<Model> model = load_tiny_model(true);
  return *model;
}

// The model a policy can run on: the calibrated one for those that need a file beside the model.
const Model& model_for(const PolicyConfig& config) {
  return config.name == "triattention" || config.name == "trimkv" ? tiny_model_with_calibration() : tiny_model();
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

PolicyShape shape_for(const Model& m, int32_t prompt_len, int32_t max_len = 0) {
  return policy_shape(m, prompt_len, max_len);
}

// One sequence on its own cache and forward pass, optionally with a policy.
struct Session {
  const Model& model;
  ThreadPool pool{2};
  KvCache cache;
  ForwardPass forward;
  std::unique_ptr<EvictionPolicy> policy;
  int32_t pos = 0;
  std::vector<float> logits;
  SoloGroup solo;
  DraftRun draft;  // the last draft run
  int drafts = 0;
  bool run_drafts = true;

  Session(const Model& m, const PolicyConfig* config, const std::vector<int32_t>& prompt, int32_t max_len = 0,
          bool drafts = true)
      : model(m),
        cache({m.config().n_layer, m.config().n_head_kv, m.config().head_dim, 4, 0}),
        forward(m, cache, pool),
        run_drafts(drafts) {
    if (config != nullptr) policy = make_policy(*config, shape_for(m, int32_t(prompt.size()), max_len));
    cache.add_sequence(0, policy ? policy->heads_per_layer() : 0);
    feed(prompt);
  }

  // Runs the draft a policy asks for after the pass, as the worker does.
  void feed(const std::vector<int32_t>& tokens) {
    BatchItem item{0, tokens, pos, false, policy.get()};
    const std::span<const float> out = forward.run({&item, 1});
    logits.assign(out.begin(), out.end());
    pos += int32_t(tokens.size());
    if (run_drafts && policy && policy->draft_wanted() > 0) {
      const size_t vocab = size_t(model.config().n_vocab);
      draft = run_draft(forward, cache, solo, 0, *policy, next(), pos, vocab, vocab);
      ++drafts;
    }
  }
  int32_t next() const { return argmax(logits); }
  int heads() const { return cache.heads_per_layer(0); }
};

PolicyConfig config(const std::string& name, const std::map<std::string, std::string>& params) {
  return make_policy_config(name, params);
}

// The catalog (common) and the engine's factories are the two halves of a
// policy's registration: every row has a factory and every factory a row.
TEST(PolicyForward, EveryCatalogRowHasAFactoryAndNoFactoryLacksARow) {
  std::vector<std::string> rows, factories;
  for (const PolicyInfo& p : policy_catalog()) rows.push_back(p.name);
  for (const auto& [name, factory] : policy_factories()) factories.push_back(name);
  std::sort(rows.begin(), rows.end());
  EXPECT_EQ(rows, factories);
}

TEST(PolicyForward, NoEvictionWithinBudgetIsBitIdentical) {
  const Model& m = tiny_model();
  constexpr int kSteps = 60;  // prompt 6 + 60 tokens < budget 128
  const std::vector<PolicyConfig> configs = {
      config("full", {}),
      config("lazy", {{"budget", "128"}, {"window", "8"}, {"alpha", "0.01"}}),
      config("lazy", {{"budget", "128"}, {"window", "8"}, {"per_query_head", "1"}}),
      config("streaming", {{"budget", "128"}}),
      config("h2o", {{"budget", "128"}}),
      config("tova", {{"budget", "128"}}),
      config("snapkv", {{"budget", "128"}, {"window", "8"}, {"period", "4"}}),
      config("rkv", {{"budget", "128"}, {"period", "4"}}),
      config("raas", {{"budget", "128"}, {"alpha", "0.01"}}),
      config("caote", {{"budget", "128"}}),
      config("obcache", {{"budget", "128"}}),
      config("obcache", {{"budget", "128"}, {"accumulate", "0"}}),
      config("vase", {{"budget", "128"}, {"window", "8"}}),
      config("vase", {{"budget", "128"}, {"window", "8"}, {"sketch", "1"}}),
  };
  Session plain(m, nullptr, kPrompt);
  std::vector<std::vector<float>> expected = {plain.logits};
  for (int i = 0; i < kSteps; ++i) {
    plain.feed({plain.next()});
    expected.push_back(plain.logits);
  }
  for (const PolicyConfig& c : configs) {
    Session s(m, &c, kPrompt);
    for (int i = 0; i <= kSteps; ++i) {
      ASSERT_EQ(s.logits.size(), expected[size_t(i)].size());
      ASSERT_EQ(std::memcmp(s.logits.data(), expected[size_t(i)].data(), s.logits.size() * sizeof(float)), 0)
          << c.to_string() << ": logits differ at step " << i;
      if (i < kSteps) s.feed({s.next()});
    }
    EXPECT_EQ(s.policy->evicted_slots(), 0) << c.to_string();
  }
}

struct EvictingCase {
  PolicyConfig config;
  int32_t peak_per_head;                       // documented peak in slots per cache head
  std::function<bool(int32_t t)> compacts_at;  // decode steps at which the cache is brought to budget
  // TOVA, and CAOTE and OBCache without a recent window, rank the newest
  // token with the others (its attention to itself is its score), as their
  // papers do, so they may evict it; the others protect it.
  bool keeps_newest = true;
};

TEST(PolicyForward, EvictingPoliciesRespectBudgetAndPeak) {
  const Model& m = tiny_model();
  const int32_t C = 16;
  const std::vector<EvictingCase> cases = {
      {config("lazy", {{"budget", "16"}, {"window", "4"}, {"alpha", "0.02"}}), C + 4, [](int32_t t) { return t % 4 == 0; }},
      {config("lazy", {{"budget", "16"}, {"window", "4"}, {"per_query_head", "1"}}), C + 4,
       [](int32_t t) { return t % 4 == 0; }},
      {config("streaming", {{"budget", "16"}, {"sinks", "4"}}), C + 1, [](int32_t) { return true; }},
      {config("h2o", {{"budget", "16"}, {"recent", "4"}}), C + 1, [](int32_t) { return true; }},
      {config("h2o", {{"budget", "16"}}), C + 1, [](int32_t) { return true; }},
      {config("tova", {{"budget", "16"}}), C + 1, [](int32_t) { return true; }, false},
      {config("snapkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"}}), C + 8,
       [](int32_t t) { return t % 8 == 0; }},
      {config("rkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"}}), C + 8,
       [](int32_t t) { return t % 8 == 0; }},
      {config("skipkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"}, {"max_sentence", "5"},
                         {"tau", "0.5"}}),
       C + 8, [](int32_t t) { return t % 8 == 0; }},
      {config("raas", {{"budget", "16"}, {"alpha", "0.02"}}), C + 1, [](int32_t) { return true; }},
      {config("caote", {{"budget", "16"}, {"recent", "4"}}), C + 1, [](int32_t) { return true; }},
      {config("caote", {{"budget", "16"}, {"recent", "0"}}), C + 1, [](int32_t) { return true; }, false},
      {config("obcache", {{"budget", "16"}, {"recent", "4"}}), C + 1, [](int32_t) { return true; }},
      {config("obcache", {{"budget", "16"}, {"recent", "0"}, {"accumulate", "0"}}), C + 1, [](int32_t) { return true; },
       false},
      {config("laq", {{"budget", "16"}, {"window", "4"}, {"recent", "2"}, {"lookahead", "3"}, {"kernel", "3"},
                      {"period", "8"}}),
       C + 8, [](int32_t t) { return t % 8 == 0; }},
      // vase compacts when the cache (prompt 6 + t) reaches a multiple of its window.
      {config("vase", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}}), C + 4,
       [](int32_t t) { return (6 + t) % 4 == 0; }},
      {config("vase", {{"budget", "16"}, {"window", "4"}, {"sketch", "1"}, {"rank", "8"}}), C + 4,
       [](int32_t t) { return (6 + t) % 4 == 0; }},
      {config("trimkv", {{"budget", "16"}}), C + 1, [](int32_t) { return true; }},
      // (6 + t reaches 16 + 5 at t = 15, then every 5 steps)
      {config("trimkv", {{"budget", "16"}, {"period", "5"}}), C + 5, [](int32_t t) { return t >= 15 && t % 5 == 0; }},
  };
  const ModelConfig& mc = m.config();
  for (const EvictingCase& ec : cases) {
    const std::string name = ec.config.to_string();
    Session s(model_for(ec.config), &ec.config, kPrompt);
    int32_t newest_evicted_at = -1;
    // What each sampling pass's attention saw: the prompt (below every
    // budget here), then the slots left by the last step plus the new token.
    const int64_t heads = int64_t(mc.n_layer) * s.heads();
    int64_t attended = heads * int64_t(kPrompt.size());
    for (int32_t t = 1; t <= 60; ++t) {
      const int32_t pos = s.pos;
      attended += s.policy->slots() + heads;
      s.feed({s.next()});
      ASSERT_EQ(s.policy->step(), t) << name;
      for (int layer = 0; layer < mc.n_layer; ++layer) {
        for (int h = 0; h < s.heads(); ++h) {
          const std::span<const int32_t> p = s.cache.positions(0, layer, h);
          const int32_t n = int32_t(p.size());
          ASSERT_LE(n, ec.peak_per_head) << name << " t=" << t;
          if (ec.compacts_at(t)) {
            ASSERT_LE(n, C) << name << " t=" << t << " layer " << layer << " head " << h;
          }
          ASSERT_TRUE(std::is_sorted(p.begin(), p.end())) << name << " t=" << t;
          ASSERT_TRUE(std::adjacent_find(p.begin(), p.end()) == p.end()) << name << " t=" << t;
          if (ec.keeps_newest) {
            // raas: fails while the framework bug in worker/policy/raas.cc stands
            // (a plain top-k by timestamp with older-first ties drops the newest
            // token when other decode slots were hit in the same step).
            if (p.back() != pos && newest_evicted_at < 0) newest_evicted_at = t;
          }
        }
      }
    }
    EXPECT_EQ(newest_evicted_at, -1) << name << ": the newest token was evicted at step " << newest_evicted_at;
    EXPECT_GT(s.policy->evicted_slots(), 0) << name;
    EXPECT_EQ(s.policy->peak_slots(), int64_t(mc.n_layer) * s.heads() * ec.peak_per_head) << name;
    int64_t total = 0;
    for (int layer = 0; layer < mc.n_layer; ++layer) {
      for (int h = 0; h < s.heads(); ++h) total += s.cache.n_slots(0, layer, h);
    }
    EXPECT_EQ(s.policy->slots(), total) << name;
    EXPECT_EQ(s.policy->mean_slots(), double(attended) / 61.0) << name;
  }
}

// keep_prompt=1: every policy keeps each prompt slot through every
// compaction and still holds its budget (the peaks above are unchanged).
TEST(PolicyForward, KeepPromptKeepsEveryPromptSlot) {
  const Model& m = tiny_model();
  const int32_t P = int32_t(kPrompt.size());
  const std::vector<std::pair<PolicyConfig, int32_t>> cases = {  // (policy, peak per head)
      {config("lazy", {{"budget", "16"}, {"window", "4"}, {"alpha", "0.02"}, {"keep_prompt", "1"}}), 20},
      {config("streaming", {{"budget", "16"}, {"sinks", "2"}, {"keep_prompt", "1"}}), 17},
      {config("h2o", {{"budget", "16"}, {"recent", "4"}, {"keep_prompt", "1"}}), 17},
      {config("tova", {{"budget", "16"}, {"keep_prompt", "1"}}), 17},
      {config("snapkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"}, {"keep_prompt", "1"}}), 24},
      {config("rkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"}, {"keep_prompt", "1"}}), 24},
      {config("skipkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"}, {"max_sentence", "3"},
                         {"keep_prompt", "1"}}),
       24},
      {config("caote", {{"budget", "16"}, {"recent", "4"}, {"keep_prompt", "1"}}), 17},
      {config("obcache", {{"budget", "16"}, {"recent", "4"}, {"keep_prompt", "1"}}), 17},
      {config("vase", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"keep_prompt", "1"}}), 20},
      {config("laq", {{"budget", "16"}, {"window", "4"}, {"recent", "2"}, {"lookahead", "3"}, {"kernel", "3"},
                      {"period", "8"}, {"keep_prompt", "1"}}),
       24},
      {config("trimkv", {{"budget", "16"}, {"keep_prompt", "1"}}), 17},
  };
  for (const auto& [c, peak] : cases) {
    Session s(model_for(c), &c, kPrompt);
    for (int32_t t = 1; t <= 60; ++t) {
      s.feed({s.next()});
      for (int layer = 0; layer < m.config().n_layer; ++layer) {
        for (int h = 0; h < s.heads(); ++h) {
          const std::span<const int32_t> p = s.cache.positions(0, layer, h);
          ASSERT_LE(int32_t(p.size()), peak) << c.to_string() << " t=" << t;
          ASSERT_GE(int32_t(p.size()), P) << c.to_string() << " t=" << t;
          for (int32_t i = 0; i < P; ++i) ASSERT_EQ(p[size_t(i)], i) << c.to_string() << " t=" << t;
        }
      }
    }
    EXPECT_GT(s.policy->evicted_slots(), 0) << c.to_string();
    EXPECT_EQ(s.policy->peak_slots(), int64_t(m.config().n_layer) * s.heads() * peak) << c.to_string();
  }
}

// The eval harness's occupancy model (eval/kv_occupancy.h) predicts every
// policy's mean and peak slots from its rule alone: short and long prompts,
// kept prompts, every catalog row.
TEST(PolicyForward, OccupancyModelMatchesEveryPolicy) {
  const std::vector<int32_t> long_prompt = {1, 40, 75, 120, 3, 200, 17, 99, 140, 23, 61, 77};
  const auto c = [](const std::string& name, std::map<std::string, std::string> params) {
    return config(name, params);
  };
  const std::vector<std::pair<PolicyConfig, const std::vector<int32_t>*>> cases = {
      {c("full", {}), &kPrompt},
      {c("lazy", {{"budget", "16"}, {"window", "4"}, {"alpha", "0.02"}}), &kPrompt},
      {c("lazy", {{"budget", "8"}, {"window", "3"}}), &long_prompt},
      {c("lazy", {{"budget", "16"}, {"window", "4"}, {"keep_prompt", "1"}}), &kPrompt},
      {c("lazy+tiers", {{"budget", "16"}, {"window", "4"}}), &kPrompt},
      {c("streaming", {{"budget", "16"}, {"sinks", "4"}}), &kPrompt},
      {c("streaming", {{"budget", "8"}, {"sinks", "2"}}), &long_prompt},
      {c("h2o", {{"budget", "16"}}), &kPrompt},
      {c("h2o", {{"budget", "8"}, {"recent", "2"}}), &long_prompt},
      {c("tova", {{"budget", "16"}, {"keep_prompt", "1"}}), &kPrompt},
      {c("tova", {{"budget", "8"}}), &long_prompt},
      {c("snapkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"}}), &kPrompt},
      {c("snapkv", {{"budget", "8"}, {"window", "2"}, {"kernel", "3"}, {"period", "0"}}), &long_prompt},
      {c("rkv", {{"budget", "8"}, {"window", "2"}, {"kernel", "3"}, {"period", "5"}}), &long_prompt},
      {c("skipkv", {{"budget", "8"}, {"window", "2"}, {"kernel", "3"}, {"period", "5"}, {"max_sentence", "4"}}),
       &long_prompt},
      {c("raas", {{"budget", "16"}, {"alpha", "0.02"}}), &kPrompt},
      {c("raas", {{"budget", "8"}}), &long_prompt},
      {c("caote", {{"budget", "16"}, {"recent", "4"}}), &kPrompt},
      {c("obcache", {{"budget", "8"}, {"recent", "2"}}), &long_prompt},
      {c("vase", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}}), &kPrompt},
      {c("vase", {{"budget", "8"}, {"window", "3"}, {"sinks", "2"}, {"kernel", "3"}}), &long_prompt},
      {c("laq", {{"budget", "16"}, {"window", "4"}, {"recent", "2"}, {"kernel", "3"}, {"period", "8"}}), &kPrompt},
      {c("laq", {{"budget", "8"}, {"window", "2"}, {"recent", "0"}, {"kernel", "3"}, {"period", "0"}}), &long_prompt},
      {c("triattention", {{"budget", "16"}, {"period", "4"}}), &kPrompt},
      {c("triattention", {{"budget", "8"}, {"period", "3"}, {"keep_prompt", "0"}}), &long_prompt},
      {c("trimkv", {{"budget", "16"}}), &kPrompt},
      {c("trimkv", {{"budget", "8"}, {"period", "3"}}), &long_prompt},
      {c("trimkv", {{"budget", "16"}, {"period", "4"}, {"keep_prompt", "1"}}), &kPrompt},
  };
  std::set<std::string> covered;
  for (const auto& [config, prompt] : cases) {
    const Model& m = model_for(config);
    constexpr int32_t kGenerated = 50;  // the prefill's token, then 49 decode steps
    Session s(m, &config, *prompt);
    for (int32_t t = 1; t < kGenerated; ++t) s.feed({s.next()});
    const eval::KvOccupancy model = eval::kv_occupancy(config, int32_t(prompt->size()), kGenerated);
    const int64_t heads = int64_t(m.config().n_layer) * s.heads();
    EXPECT_EQ(s.policy->peak_slots(), heads * model.peak) << config.to_string() << " P=" << prompt->size();
    EXPECT_DOUBLE_EQ(s.policy->mean_slots(), double(heads) * model.mean) << config.to_string() << " P=" << prompt->size();
    covered.insert(config.name);
  }
  // (epicache runs only on a conversation's episode: tests/unit/eval/conversation_test.cc.)
  for (const PolicyInfo& p : policy_catalog()) {
    if (!p.episodic) {
      EXPECT_TRUE(covered.contains(p.name)) << p.name << " is not covered";
    }
  }
}

// VaSE's draws come from its seed alone: the same seed keeps the same slots
// in every layer and head, another seed keeps others somewhere.
TEST(PolicyForward, VaseEvictionsFollowTheSeed) {
  const Model& m = tiny_model();
  const auto kept_after = [&](const std::string& variant, const std::string& seed) {
    const PolicyConfig c = config(
        "vase", {{"budget", "16"}, {"window", "4"}, {"large", "0.25"}, {"sketch", variant}, {"seed", seed}});
    Session s(m, &c, kPrompt);
    std::vector<std::vector<int32_t>> kept;
    for (int32_t t = 1; t <= 40; ++t) {
      s.feed({s.next()});
      for (int layer = 0; layer < m.config().n_layer; ++layer) {
        for (int h = 0; h < s.heads(); ++h) {
          const std::span<const int32_t> p = s.cache.positions(0, layer, h);
          kept.emplace_back(p.begin(), p.end());
        }
      }
    }
    EXPECT_GT(s.policy->evicted_slots(), 0) << c.to_string();
    return kept;
  };
  for (const std::string variant : {"0", "1"}) {
    EXPECT_EQ(kept_after(variant, "11"), kept_after(variant, "11")) << "sketch=" << variant;
    EXPECT_NE(kept_after(variant, "11"), kept_after(variant, "12")) << "sketch=" << variant;
  }
}

// A policy that records the hidden states the pass hands it (and evicts nothing).
class HiddenRecorder final : public EvictionPolicy {
 public:
  explicit HiddenRecorder(const PolicyShape& shape)
      : EvictionPolicy(make_policy_config("full", {}), shape, shape.n_head_kv, Needs{}) {}
  bool wants_hidden() const override { return true; }
  void observe_token(int32_t pos, int32_t token, std::span<const float> hidden) override {
    seen.push_back({pos, token, std::vector<float>(hidden.begin(), hidden.end())});
  }
  struct Seen {
    int32_t pos, token;
    std::vector<float> hidden;
  };
  std::vector<Seen> seen;

 protected:
  void select(int, std::span<Head>, const KvCache&, SeqId, std::vector<std::vector<int32_t>>&) override {}
};

// The hidden state a policy gets for a decode token is the row the output
// projection turns into that token's logits, in a batch that mixes a prompt
// chunk with every-token logits, a plain decode item and two recording ones.
TEST(PolicyForward, HiddenStatesAreTheRowsBehindTheLogits) {
  const Model& m = tiny_model();
  const ModelConfig& mc = m.config();
  ThreadPool pool(2);
  KvCache cache({mc.n_layer, mc.n_head_kv, mc.head_dim, 4, 0});
  ForwardPass forward(m, cache, pool);
  const int32_t P = int32_t(kPrompt.size());
  std::vector<std::unique_ptr<HiddenRecorder>> recorders;
  for (SeqId seq = 0; seq < 4; ++seq) {
    recorders.push_back(std::make_unique<HiddenRecorder>(shape_for(m, P)));
    cache.add_sequence(seq, recorders.back()->heads_per_layer());
  }
  for (SeqId seq = 1; seq < 4; ++seq) {  // sequence 0 stays in its prompt
    BatchItem prefill{seq, kPrompt, 0, false, recorders[size_t(seq)].get()};
    forward.run({&prefill, 1});
  }
  const std::vector<int32_t> chunk(kPrompt.begin(), kPrompt.begin() + 3), one = {40}, two = {75}, three = {120};
  const std::vector<BatchItem> batch = {{0, chunk, 0, true, recorders[0].get()},
                                        {1, one, P, false, recorders[1].get()},
                                        {2, two, P, false, nullptr},
                                        {3, three, P, false, recorders[3].get()}};
  const std::vector<float> logits = [&] {
    const std::span<const float> out = forward.run(batch);
    return std::vector<float>(out.begin(), out.end());
  }();
  EXPECT_TRUE(recorders[0]->seen.empty()) << "prompt positions are not observed";
  EXPECT_TRUE(recorders[2]->seen.empty());
  std::vector<float> row(size_t(mc.n_embd));
  const size_t out_row_bytes = row_bytes(m.output().type, size_t(mc.n_embd));
  for (const auto& [seq, logit_row, token] : {std::tuple{1, 3, 40}, std::tuple{3, 5, 120}}) {
    const std::vector<HiddenRecorder::Seen>& seen = recorders[size_t(seq)]->seen;
    ASSERT_EQ(seen.size(), 1u) << "sequence " << seq;
    EXPECT_EQ(seen[0].pos, P);
    EXPECT_EQ(seen[0].token, token);
    ASSERT_EQ(int64_t(seen[0].hidden.size()), mc.n_embd);
    for (int64_t v = 0; v < mc.n_vocab; v += 37) {
      cpu::dequantize_row(m.output().type, static_cast<const uint8_t*>(m.output().data) + size_t(v) * out_row_bytes,
                          row.data(), mc.n_embd);
      double dot = 0;
      for (int64_t d = 0; d < mc.n_embd; ++d) dot += double(row[size_t(d)]) * double(seen[0].hidden[size_t(d)]);
      EXPECT_NEAR(dot, logits[size_t(logit_row) * size_t(mc.n_vocab) + size_t(v)], 1e-3)
          << "sequence " << seq << " vocab " << v;
    }
  }
}

// skipkv on the real pass, sentences cut every 5 tokens (no newline may end
// one): a compression drops each closed sentence's older slots all or none,
// except for at most one sentence per head, the one that crossed the line.
TEST(PolicyForward, SkipKvEvictsWholeSentences) {
  const Model& m = tiny_model();
  ASSERT_NE(m.token_classes(), nullptr);
  const PolicyConfig c = config("skipkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"},
                                           {"min_sentence", "4096"}, {"max_sentence", "5"}, {"tau", "0.3"}});
  Session s(m, &c, kPrompt);
  const int32_t P = int32_t(kPrompt.size());
  int whole_drops = 0;
  for (int32_t t = 1; t <= 64; ++t) {
    std::vector<std::vector<int32_t>> before;  // [layer * heads + head]: the pass's slots, new token included
    for (int layer = 0; layer < m.config().n_layer; ++layer) {
      for (int h = 0; h < s.heads(); ++h) {
        const std::span<const int32_t> p = s.cache.positions(0, layer, h);
        before.emplace_back(p.begin(), p.end());
        before.back().push_back(s.pos);
      }
    }
    s.feed({s.next()});
    if (t % 8 != 0) continue;
    const int32_t closed_end = P + (t / 5) * 5;  // closed sentences: [P + 5i, P + 5i + 5) below this
    for (size_t u = 0; u < before.size(); ++u) {
      const std::span<const int32_t> after = s.cache.positions(0, int(u) / s.heads(), int(u) % s.heads());
      std::map<int32_t, int> had, lost;  // per closed sentence: its older slots, the ones dropped
      for (size_t i = 0; i + 4 < before[u].size(); ++i) {  // all but the window's 4 newest
        const int32_t pos = before[u][i];
        if (pos < P || pos >= closed_end) continue;
        ++had[(pos - P) / 5];
        lost[(pos - P) / 5] += !std::binary_search(after.begin(), after.end(), pos);
      }
      int cut = 0;
      for (const auto& [sentence, n] : had) {
        cut += lost[sentence] > 0 && lost[sentence] < n;
        whole_drops += lost[sentence] == n;
      }
      EXPECT_LE(cut, 1) << "t=" << t << " unit " << u;
    }
  }
  EXPECT_GT(whole_drops, 0) << "no sentence ever left whole";
  EXPECT_GT(s.policy->evicted_slots(), 0);
}

// triattention: compresses to the budget whenever a head reaches budget +
// period slots, never touching the prompt.
TEST(PolicyForward, TriAttentionKeepsThePromptAndTheBudget) {
  const Model& m = tiny_model_with_calibration();
  ASSERT_NE(m.query_stats(), nullptr) << m.query_stats_missing();
  const PolicyConfig c = config("triattention", {{"budget", "16"}, {"period", "4"}});
  Session s(m, &c, kPrompt);
  const int32_t P = int32_t(kPrompt.size());
  for (int32_t t = 1; t <= 40; ++t) {
    s.feed({s.next()});
    for (int layer = 0; layer < m.config().n_layer; ++layer) {
      for (int h = 0; h < s.heads(); ++h) {
        const std::span<const int32_t> p = s.cache.positions(0, layer, h);
        ASSERT_LT(int32_t(p.size()), 16 + 4) << "t=" << t;  // compressed the step it reaches 20
        ASSERT_GE(int32_t(p.size()), P);
        for (int32_t i = 0; i < P; ++i) ASSERT_EQ(p[size_t(i)], i) << "t=" << t << ": prompt slot " << i;
        ASSERT_TRUE(std::is_sorted(p.begin(), p.end()));
      }
    }
  }
  EXPECT_GT(s.policy->evicted_slots(), 0);
  EXPECT_EQ(s.policy->peak_slots(), int64_t(m.config().n_layer) * s.heads() * 20);
}

// trimkv: each slot's state is the rate its gate gave the token (recomputed
// here from the embeddings for layer 0, from the layer before's output for
// the others), and each step evicts the slot of the lowest decayed
// retention (t - j) log beta.
TEST(PolicyForward, TrimKvEvictsTheLowestDecayedRetention) {
  const Model& m = tiny_model_with_calibration();
  ASSERT_NE(m.retention_gates(), nullptr) << m.retention_gates_missing();
  const ModelConfig& mc = m.config();
  const PolicyConfig c = config("trimkv", {{"budget", "12"}});
  Session s(m, &c, kPrompt);
  ThreadPool pool(1);
  std::vector<int32_t> tokens = kPrompt;
  // (position -> log beta) per (layer, head), from the policy's slot state.
  std::vector<std::map<int32_t, float>> rates(size_t(mc.n_layer) * size_t(s.heads()));
  const auto record = [&] {
    for (int layer = 0; layer < mc.n_layer; ++layer) {
      for (int h = 0; h < s.heads(); ++h) {
        const std::span<const int32_t> p = s.cache.positions(0, layer, h);
        const std::vector<float> score = s.policy->slot_state(layer, h)["score"].get<std::vector<float>>();
        ASSERT_EQ(score.size(), p.size());
        for (size_t i = 0; i < p.size(); ++i) {
          auto [it, fresh] = rates[size_t(layer * s.heads() + h)].emplace(p[i], score[i]);
          ASSERT_TRUE(fresh || it->second == score[i]) << "a slot's rate changed";
          ASSERT_LT(score[i], 0.0f);
        }
      }
    }
  };
  record();
  std::vector<float> x(size_t(mc.n_embd)), xn(size_t(mc.n_embd)), log_beta(size_t(mc.n_head_kv));
  RetentionScratch gate_scratch;
  int evictions = 0;
  for (int32_t t = 1; t <= 30; ++t) {
    std::vector<std::vector<int32_t>> before;
    for (int layer = 0; layer < mc.n_layer; ++layer) {
      for (int h = 0; h < s.heads(); ++h) {
        const auto p = s.cache.positions(0, layer, h);
        before.emplace_back(p.begin(), p.end());
      }
    }
    const int32_t pos = s.pos;
    tokens.push_back(s.next());
    std::vector<std::vector<float>> outputs(size_t(mc.n_layer));  // each layer's output row
    s.forward.set_layer_output_hook(
        [&](int layer, std::span<const float> x) { outputs[size_t(layer)].assign(x.begin(), x.end()); });
    s.feed({tokens.back()});
    record();
    // Layers past the first: the gate on the norm of the layer before's output.
    for (int layer = 1; layer < mc.n_layer; ++layer) {
      cpu::rms_norm(outputs[size_t(layer - 1)].data(), m.layers()[size_t(layer)].attn_norm, xn.data(), mc.n_embd,
                    mc.rms_eps);
      retention_log_beta(*m.retention_gates(), layer, xn.data(), 1, log_beta.data(), gate_scratch, pool);
      for (int h = 0; h < mc.n_head_kv; ++h) {
        const float want = log_beta[size_t(h)];
        ASSERT_NEAR(rates[size_t(layer * s.heads() + h)].at(pos), want, 1e-5 * std::fabs(want) + 1e-7)
            << "t=" << t << " layer " << layer << " head " << h;
      }
    }
    for (int layer = 0; layer < mc.n_layer; ++layer) {
      for (int h = 0; h < s.heads(); ++h) {
        const auto& rate = rates[size_t(layer * s.heads() + h)];
        std::vector<int32_t> candidates = before[size_t(layer * s.heads() + h)];
        candidates.push_back(pos);
        const auto p = s.cache.positions(0, layer, h);
        if (candidates.size() <= 12) {
          ASSERT_EQ(std::vector<int32_t>(p.begin(), p.end()), candidates);
          continue;
        }
        ASSERT_EQ(p.size(), 12u);
        ASSERT_EQ(p.back(), pos) << "the newest token scores 0, the most";
        const auto score = [&](int32_t j) { return float(pos - j) * rate.at(j); };
        float kept_min = 0.0f, evicted_max = -1e30f;
        for (int32_t j : candidates) {
          if (std::find(p.begin(), p.end(), j) != p.end()) {
            kept_min = std::min(kept_min, score(j));
          } else {
            evicted_max = std::max(evicted_max, score(j));
            ++evictions;
          }
        }
        ASSERT_LE(evicted_max, kept_min) << "t=" << t << " layer " << layer << " head " << h;
      }
    }
  }
  EXPECT_GT(evictions, 0);
  // Layer 0's rates are the gate on the normed embedding of each token.
  const cpu::WeightMatrix& embd = m.token_embd();
  for (size_t j = 0; j < tokens.size() - 1; ++j) {
    const auto* row = static_cast<const uint8_t*>(embd.data) + size_t(tokens[j]) * row_bytes(embd.type, size_t(mc.n_embd));
    cpu::dequantize_row(embd.type, row, x.data(), mc.n_embd);
    cpu::rms_norm(x.data(), m.layers()[0].attn_norm, xn.data(), mc.n_embd, mc.rms_eps);
    retention_log_beta(*m.retention_gates(), 0, xn.data(), 1, log_beta.data(), gate_scratch, pool);
    for (int h = 0; h < mc.n_head_kv; ++h) {
      const auto& rate = rates[size_t(h)];
      ASSERT_NEAR(rate.at(int32_t(j)), log_beta[size_t(h)], 1e-5 * std::fabs(log_beta[size_t(h)]) + 1e-7)
          << "position " << j << " head " << h;
    }
  }
}

// A prompt past budget + period is compressed by its own pass: layer 0
// keeps the prompt tokens of the highest decayed retention at the prompt's
// last position (rates recomputed from the embeddings).
TEST(PolicyForward, TrimKvCompressesALongPromptByRetention) {
  const Model& m = tiny_model_with_calibration();
  const ModelConfig& mc = m.config();
  const std::vector<int32_t> prompt = {1, 40, 75, 120, 3, 200, 17, 99, 140, 23, 61, 77, 5, 9, 180, 33, 250, 14};
  const int32_t P = int32_t(prompt.size()), C = 8;
  const PolicyConfig c = config("trimkv", {{"budget", std::to_string(C)}, {"period", "2"}});
  Session s(m, &c, prompt);
  ThreadPool pool(1);
  RetentionScratch scratch;
  std::vector<float> x(size_t(mc.n_embd)), xn(size_t(mc.n_embd)), log_beta(size_t(P) * size_t(mc.n_head_kv));
  const cpu::WeightMatrix& embd = m.token_embd();
  for (int32_t j = 0; j < P; ++j) {
    const auto* row = static_cast<const uint8_t*>(embd.data) + size_t(prompt[size_t(j)]) * row_bytes(embd.type, size_t(mc.n_embd));
    cpu::dequantize_row(embd.type, row, x.data(), mc.n_embd);
    cpu::rms_norm(x.data(), m.layers()[0].attn_norm, xn.data(), mc.n_embd, mc.rms_eps);
    retention_log_beta(*m.retention_gates(), 0, xn.data(), 1, log_beta.data() + size_t(j) * size_t(mc.n_head_kv),
                       scratch, pool);
  }
  for (int h = 0; h < mc.n_head_kv; ++h) {
    const std::span<const int32_t> kept = s.cache.positions(0, 0, h);
    ASSERT_EQ(int32_t(kept.size()), C);
    std::vector<std::pair<float, int32_t>> ranked;  // (-score, position): best first, older first on ties
    for (int32_t j = 0; j < P; ++j) {
      ranked.emplace_back(-float(P - 1 - j) * log_beta[size_t(j) * size_t(mc.n_head_kv) + size_t(h)], j);
    }
    std::sort(ranked.begin(), ranked.end());
    std::vector<int32_t> want;
    for (int32_t i = 0; i < C; ++i) want.push_back(ranked[size_t(i)].second);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(std::vector<int32_t>(kept.begin(), kept.end()), want) << "head " << h;
  }
}

// In a batch, each trimkv sequence's gates read its own rows: the rates of a
// prompt chunk and a decode token batched with another sequence's prompt
// are those each gets alone.
TEST(PolicyForward, TrimKvRatesInABatchAreEachSequencesOwn) {
  const Model& m = tiny_model_with_calibration();
  const ModelConfig& mc = m.config();
  const PolicyConfig c = config("trimkv", {{"budget", "64"}});
  const std::vector<int32_t> other = {5, 9, 180, 33};
  const auto rates = [&](bool batched) {
    ThreadPool pool(2);
    KvCache cache({mc.n_layer, mc.n_head_kv, mc.head_dim, 4, 0});
    ForwardPass forward(m, cache, pool);
    std::unique_ptr<EvictionPolicy> a = make_policy(c, shape_for(m, int32_t(kPrompt.size())));
    std::unique_ptr<EvictionPolicy> b = make_policy(c, shape_for(m, int32_t(other.size())));
    cache.add_sequence(0, a->heads_per_layer());
    cache.add_sequence(1, b->heads_per_layer());
    BatchItem prefill_a{0, kPrompt, 0, false, a.get()};
    forward.run({&prefill_a, 1});
    const std::vector<int32_t> next = {7};
    std::vector<BatchItem> items = {{0, next, int32_t(kPrompt.size()), false, a.get()},
                                    {1, other, 0, true, b.get()}};
    if (batched) {
      forward.run(items);
    } else {
      forward.run({&items[0], 1});
      forward.run({&items[1], 1});
    }
    std::vector<nlohmann::json> state;
    for (int layer = 0; layer < mc.n_layer; ++layer) {
      for (int h = 0; h < mc.n_head_kv; ++h) {
        state.push_back(a->slot_state(layer, h)["score"]);
        state.push_back(b->slot_state(layer, h)["score"]);
      }
    }
    return state;
  };
  const std::vector<nlohmann::json> alone = rates(false), together = rates(true);
  ASSERT_EQ(alone.size(), together.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(alone[i].size(), together[i].size());
    for (size_t j = 0; j < alone[i].size(); ++j) {
      const float x = alone[i][j].get<float>(), y = together[i][j].get<float>();
      ASSERT_NEAR(x, y, 1e-5 * std::fabs(x) + 1e-7) << "state " << i << " slot " << j;
    }
  }
}

TEST(PolicyForward, AHugeWindowHoldsOnlyWhatTheSequenceCanUse) {
  // Any request may ask for a window just below the largest budget; the
  // query ring holds only the queries that arrived (sized by the window up
  // front, it would be gigabytes per layer and head), and behaves the same.
  const Model& m = tiny_model();
  constexpr int kSteps = 20;
  const int32_t max_len = int32_t(kPrompt.size()) + kSteps;
  for (const auto& [huge, fitting] : std::vector<std::pair<PolicyConfig, PolicyConfig>>{
           {config("snapkv", {{"budget", "16777216"}, {"window", "16777215"}, {"period", "4"}}),
            config("snapkv", {{"budget", "16777216"}, {"window", std::to_string(max_len)}, {"period", "4"}})},
           {config("obcache", {{"budget", "16777216"}, {"recent", "16777215"}}),
            config("obcache", {{"budget", "16777216"}, {"recent", std::to_string(max_len)}})}}) {
    Session a(m, &huge, kPrompt, max_len), b(m, &fitting, kPrompt, max_len);
    for (int t = 0; t < kSteps; ++t) {
      a.feed({a.next()});
      b.feed({b.next()});
      ASSERT_EQ(a.logits, b.logits) << huge.to_string() << " t=" << t;
    }
    for (int layer = 0; layer < m.config().n_layer; ++layer) {
      EXPECT_EQ(a.policy->slot_state(layer, 0), b.policy->slot_state(layer, 0)) << huge.to_string();
    }
  }
}

TEST(PolicyForward, LazyPerQueryHeadCachesEveryQueryHead) {
  const Model& m = tiny_model();
  const PolicyConfig c = config("lazy", {{"budget", "16"}, {"window", "4"}, {"per_query_head", "1"}});
  Session s(m, &c, kPrompt);
  EXPECT_EQ(s.policy->heads_per_layer(), m.config().n_head);
  EXPECT_EQ(s.heads(), m.config().n_head);
  EXPECT_EQ(s.policy->queries_per_head(), 1);
  for (int i = 0; i < 30; ++i) s.feed({s.next()});
  for (int layer = 0; layer < m.config().n_layer; ++layer) {
    for (int h = 0; h < m.config().n_head; ++h) EXPECT_LE(s.cache.n_slots(0, layer, h), 20);
  }
  EXPECT_GT(s.policy->evicted_slots(), 0);
  // The default mode caches KV heads only.
  const PolicyConfig d = config("lazy", {{"budget", "16"}, {"window", "4"}});
  EXPECT_EQ(make_policy(d, shape_for(m, 6))->heads_per_layer(), m.config().n_head_kv);
}

// How much of a 1,000-token prompt each policy may take from a prefix cache:
// all but the last token, less a window of last queries it keeps, nothing
// when every prompt query's attention counts.
TEST(PolicyForward, ReusablePromptFollowsWhatThePromptsQueriesRecord) {
  const Model& m = tiny_model_with_calibration();
  const auto reusable = [&](const std::string& name, std::map<std::string, std::string> params) {
    params.emplace("budget", "256");
    if (name == "full") params.clear();
    return make_policy(config(name, params), shape_for(m, 1000))->reusable_prompt();
  };
  EXPECT_EQ(reusable("full", {}), 999);
  EXPECT_EQ(reusable("lazy", {{"window", "16"}}), 999);
  EXPECT_EQ(reusable("lazy+tiers", {{"window", "16"}}), 999);
  EXPECT_EQ(reusable("streaming", {}), 999);
  EXPECT_EQ(reusable("tova", {}), 999);
  EXPECT_EQ(reusable("caote", {}), 999);
  EXPECT_EQ(reusable("raas", {}), 999);
  EXPECT_EQ(reusable("triattention", {{"keep_prompt", "0"}}), 999);
  EXPECT_EQ(reusable("h2o", {}), 0);
  EXPECT_EQ(reusable("trimkv", {}), 0);
  EXPECT_EQ(reusable("snapkv", {{"window", "32"}}), 968);
  EXPECT_EQ(reusable("rkv", {{"window", "8"}}), 992);
  EXPECT_EQ(reusable("vase", {{"window", "32"}}), 968);
  EXPECT_EQ(reusable("vase", {{"window", "32"}, {"sketch", "1"}}), 999);
}

TEST(PolicyForward, TwoDecodeTokensInOnePassAreRejected) {
  const Model& m = tiny_model();
  const PolicyConfig c = config("lazy", {{"budget", "16"}, {"window", "4"}});
  Session s(m, &c, kPrompt);
  Session twin(m, &c, kPrompt);
  const int32_t a = s.next();
  s.feed({a});
  twin.feed({a});
  const int64_t slots = s.policy->slots();
  const int32_t step = s.policy->step();
  std::vector<std::vector<int32_t>> before;
  for (int layer = 0; layer < m.config().n_layer; ++layer) {
    for (int h = 0; h < s.heads(); ++h) {
      const auto p = s.cache.positions(0, layer, h);
      before.emplace_back(p.begin(), p.end());
    }
  }
  const std::vector<int32_t> two = {s.next(), 5};
  BatchItem item{0, two, s.pos, false, s.policy.get()};
  try {
    s.forward.run({&item, 1});
    FAIL() << "two decode tokens in one pass were accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  // Nothing changed: cache, policy state, and the next pass's result.
  EXPECT_EQ(s.policy->slots(), slots);
  EXPECT_EQ(s.policy->step(), step);
  size_t i = 0;
  for (int layer = 0; layer < m.config().n_layer; ++layer) {
    for (int h = 0; h < s.heads(); ++h) {
      const auto p = s.cache.positions(0, layer, h);
      EXPECT_EQ(std::vector<int32_t>(p.begin(), p.end()), before[i++]);
    }
  }
  const int32_t b = s.next();
  s.feed({b});
  twin.feed({b});
  EXPECT_EQ(s.logits, twin.logits);
}

TEST(PolicyForward, WrongHeadCountIsRejected) {
  const Model& m = tiny_model();
  ThreadPool pool(1);
  const ModelConfig& mc = m.config();
  const auto expect_rejected = [&](const PolicyConfig& c, int cache_heads) {
    KvCache cache({mc.n_layer, mc.n_head_kv, mc.head_dim, 4, 0});
    ForwardPass forward(m, cache, pool);
    std::unique_ptr<EvictionPolicy> policy = make_policy(c, shape_for(m, int32_t(kPrompt.size())));
    cache.add_sequence(0, cache_heads);
    BatchItem item{0, kPrompt, 0, false, policy.get()};
    try {
      forward.run({&item, 1});
      ADD_FAILURE() << c.to_string() << " ran on a cache with " << cache_heads << " heads per layer";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    }
    EXPECT_EQ(policy->slots(), 0) << c.to_string();
  };
  // per_query_head needs n_head cache heads; the default needs n_head_kv.
  expect_rejected(config("lazy", {{"budget", "16"}, {"window", "4"}, {"per_query_head", "1"}}), mc.n_head_kv);
  expect_rejected(config("lazy", {{"budget", "16"}, {"window", "4"}}), mc.n_head);
  expect_rejected(config("h2o", {{"budget", "16"}}), mc.n_head);
}

TEST(PolicyForward, PrefillCompressionOfALongPrompt) {
  const Model& m = tiny_model();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back(3 + (i * 37) % 250);
  const auto slots_per_head = [&](const Session& s) {
    std::vector<int32_t> n;
    for (int layer = 0; layer < m.config().n_layer; ++layer) {
      for (int h = 0; h < s.heads(); ++h) n.push_back(s.cache.n_slots(0, layer, h));
    }
    return n;
  };
  const size_t n_heads = size_t(m.config().n_layer * m.config().n_head_kv);
  const PolicyConfig h2o = config("h2o", {{"budget", "16"}, {"recent", "4"}});
  const PolicyConfig snapkv = config("snapkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "8"}});
  for (const PolicyConfig* c : {&h2o, &snapkv}) {
    Session s(m, c, prompt);
    EXPECT_EQ(slots_per_head(s), std::vector<int32_t>(n_heads, 16)) << c->to_string();
    EXPECT_EQ(s.policy->peak_slots(), int64_t(n_heads) * 24) << c->to_string();
  }
  // lazy evicts at decode steps t with t mod W == 0 only.
  const PolicyConfig lazy = config("lazy", {{"budget", "16"}, {"window", "4"}});
  Session s(m, &lazy, prompt);
  EXPECT_EQ(slots_per_head(s), std::vector<int32_t>(n_heads, 24));
  for (int32_t t = 1; t <= 3; ++t) {
    s.feed({s.next()});
    EXPECT_EQ(slots_per_head(s), std::vector<int32_t>(n_heads, 24 + t)) << "t=" << t;
  }
  s.feed({s.next()});
  EXPECT_EQ(slots_per_head(s), std::vector<int32_t>(n_heads, 16)) << "t=4";
  EXPECT_EQ(s.policy->evicted_slots(), int64_t(n_heads) * (28 - 16));
}

// LAQ's draft decodes on the SnapKV copy of the cache: its tokens are the
// ones SnapKV (same budget, window, kernel) decodes greedily after the same
// prefill. The draft leaves nothing behind, and the real cache is compacted
// to the budget around the newest `recent` slots.
TEST(PolicyForward, LaqDraftsOnTheSnapKvCopyAndLeavesNothingBehind) {
  const Model& m = tiny_model();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back(3 + (i * 37) % 250);
  const PolicyConfig laq = config(
      "laq", {{"budget", "16"}, {"window", "4"}, {"recent", "2"}, {"lookahead", "5"}, {"kernel", "3"}, {"period", "0"}});
  const PolicyConfig snapkv = config("snapkv", {{"budget", "16"}, {"window", "4"}, {"kernel", "3"}, {"period", "0"}});
  Session a(m, &laq, prompt);
  Session b(m, &snapkv, prompt);
  ASSERT_EQ(a.drafts, 1);
  EXPECT_FALSE(a.draft.out_of_memory);
  std::vector<int32_t> greedy;
  for (int i = 0; i < 5; ++i) {
    greedy.push_back(b.next());
    b.feed({b.next()});
  }
  EXPECT_EQ(a.draft.tokens, greedy);
  EXPECT_EQ(a.cache.n_sequences(), size_t(1));
  EXPECT_EQ(a.pos, 24);
  for (int layer = 0; layer < m.config().n_layer; ++layer) {
    for (int h = 0; h < a.heads(); ++h) {
      const std::span<const int32_t> p = a.cache.positions(0, layer, h);
      ASSERT_EQ(p.size(), size_t(16));
      EXPECT_EQ(p[14], 22);
      EXPECT_EQ(p[15], 23);
    }
  }
  EXPECT_EQ(a.policy->evicted_slots(), int64_t(m.config().n_layer) * a.heads() * 8);
  // Decoding goes on from the token sampled before the draft, within budget.
  for (int t = 1; t <= 10; ++t) a.feed({a.next()});
  EXPECT_EQ(a.drafts, 1);  // period 0: the prefill only
  EXPECT_EQ(a.cache.n_slots(0, 0, 0), 26);
}

// An engine loop that never runs the draft (a caller that forgot) still
// gets a bounded cache: the compaction is done at the next pass, as SnapKV's.
TEST(PolicyForward, LaqWithoutADraftCompactsAtTheNextPass) {
  const Model& m = tiny_model();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back(3 + (i * 37) % 250);
  const PolicyConfig laq = config("laq", {{"budget", "16"}, {"window", "4"}, {"recent", "2"}, {"period", "8"}});
  Session s(m, &laq, prompt, 0, /*drafts=*/false);
  EXPECT_EQ(s.policy->draft_wanted(), 8);
  EXPECT_EQ(s.cache.n_slots(0, 0, 0), 24);
  s.feed({s.next()});
  EXPECT_EQ(s.policy->draft_wanted(), 0);
  const int64_t heads = int64_t(m.config().n_layer) * s.heads();
  for (int layer = 0; layer < m.config().n_layer; ++layer) {
    for (int h = 0; h < s.heads(); ++h) {
      const std::span<const int32_t> p = s.cache.positions(0, layer, h);
      ASSERT_EQ(p.size(), size_t(16));
      EXPECT_EQ(p.back(), 24);  // the window's newest slots stay
    }
  }
  EXPECT_EQ(s.policy->evicted_slots(), heads * (25 - 16));
  for (int t = 2; t <= 8; ++t) s.feed({s.next()});
  EXPECT_EQ(s.policy->draft_wanted(), 8);  // step 8: due again
  s.feed({s.next()});
  EXPECT_EQ(s.cache.n_slots(0, 0, 0), 16);
}

// A cache with no room for the draft's copy: the draft is skipped, the
// policy still compacts (with the real queries alone) and the copy is gone.
TEST(PolicyForward, LaqWithoutRoomForTheDraftStillCompacts) {
  const Model& m = tiny_model();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back(5 + (i * 29) % 250);
  const ModelConfig& mc = m.config();
  const size_t page_bytes = size_t(4) * size_t(mc.head_dim) * 2 * sizeof(uint16_t);
  // Exactly the prompt's pages: 24 slots in pages of 4, per layer and head.
  KvCache cache({mc.n_layer, mc.n_head_kv, mc.head_dim, 4, page_bytes * 6 * size_t(mc.n_layer * mc.n_head_kv)});
  ThreadPool pool(2);
  ForwardPass forward(m, cache, pool);
  SoloGroup solo;
  const PolicyConfig laq = config("laq", {{"budget", "16"}, {"window", "4"}, {"recent", "2"}, {"kernel", "3"}});
  std::unique_ptr<EvictionPolicy> policy = make_policy(laq, shape_for(m, 24));
  cache.add_sequence(0, policy->heads_per_layer());
  BatchItem item{0, prompt, 0, false, policy.get()};
  const std::span<const float> logits = forward.run({&item, 1});
  const int32_t token = argmax(logits.subspan(0, size_t(mc.n_vocab)));
  ASSERT_EQ(policy->draft_wanted(), 8);
  const DraftRun run = run_draft(forward, cache, solo, 0, *policy, token, 24, size_t(mc.n_vocab), size_t(mc.n_vocab));
  EXPECT_TRUE(run.out_of_memory);
  EXPECT_TRUE(run.tokens.empty());
  EXPECT_EQ(policy->draft_wanted(), 0);
  EXPECT_EQ(cache.n_sequences(), size_t(1));
  for (int layer = 0; layer < mc.n_layer; ++layer) {
    for (int h = 0; h < mc.n_head_kv; ++h) EXPECT_EQ(cache.n_slots(0, layer, h), 16);
  }
}

// Gives its own draft (epicache's kind: tokens fed in one pass) until one
// comes back, and records it; keeps the queries of its own last tokens.
class DraftGiver final : public EvictionPolicy {
 public:
  DraftGiver(const PolicyShape& shape, std::vector<int32_t> given, bool wants)
      : EvictionPolicy(make_policy_config("full", {}), shape, shape.n_head_kv,
                       Needs{.keep_queries = int32_t(given.size())}),
        given_(std::move(given)),
        wants_(wants) {}
  int32_t draft_wanted() const override { return wants_ && !received ? int32_t(given_.size()) : 0; }
  std::span<const int32_t> draft_tokens() const override { return given_; }
  std::vector<std::pair<int32_t, const float*>> kept_queries(int layer, int head) const {
    return recent_queries(head_state(layer, head));
  }
  std::optional<DraftQueries> received;

 protected:
  void select(int, std::span<Head>, const KvCache&, SeqId, std::vector<std::vector<int32_t>>&) override {}
  void draft_done() noexcept override { received = *draft(); }

 private:
  std::vector<int32_t> given_;
  bool wants_;
};

// A draft of the policy's own tokens, asked for in the middle of a prompt
// (after a block), hands back the queries those tokens get when the sequence
// itself is fed them at the same positions: every token's, every layer's.
TEST(PolicyForward, AGivenDraftHandsBackTheQueriesOfItsTokens) {
  const Model& m = tiny_model();
  const ModelConfig& mc = m.config();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(5 + (i * 31) % 250);
  const std::vector<int32_t> given = {17, 99, 140, 7, 230};
  const std::span<const int32_t> block(prompt.data(), 16);
  KvCache cache({mc.n_layer, mc.n_head_kv, mc.head_dim, 4, 0});
  ThreadPool pool(2);
  ForwardPass forward(m, cache, pool);
  SoloGroup solo;
  DraftGiver giver(shape_for(m, 40), given, true);           // a block of a 40-token prompt
  DraftGiver reference(shape_for(m, 16 + 5), given, false);  // the block, then the tokens themselves
  cache.add_sequence(0, giver.heads_per_layer());
  cache.add_sequence(1, reference.heads_per_layer());
  const BatchItem first[] = {{0, block, 0, false, &giver}, {1, block, 0, false, &reference}};
  forward.run(first);
  const DraftRun run = run_draft(forward, cache, solo, 0, giver, -1, 16, size_t(mc.n_vocab), size_t(mc.n_vocab));
  EXPECT_FALSE(run.out_of_memory);
  EXPECT_EQ(run.tokens, given);
  const BatchItem fed{1, given, 16, false, &reference};
  forward.run({&fed, 1});

  ASSERT_TRUE(giver.received.has_value());
  const DraftQueries& draft = *giver.received;
  EXPECT_EQ(draft.tokens, 5);
  EXPECT_EQ(draft.first_pos, 16);
  ASSERT_EQ(draft.heads.size(), size_t(mc.n_layer * mc.n_head_kv));
  const size_t stride = size_t(giver.queries_per_head()) * size_t(mc.head_dim);
  for (int layer = 0; layer < mc.n_layer; ++layer) {
    for (int h = 0; h < mc.n_head_kv; ++h) {
      const auto expected = reference.kept_queries(layer, h);
      ASSERT_EQ(expected.size(), 5u);
      const std::vector<float>& rows = draft.heads[size_t(layer * mc.n_head_kv + h)];
      ASSERT_EQ(rows.size(), 5 * stride);
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(expected[i].first, 16 + int32_t(i));
        for (size_t d = 0; d < stride; ++d) {
          EXPECT_NEAR(rows[i * stride + d], expected[i].second[d], 1e-5f) << layer << " " << h << " " << i;
        }
      }
    }
  }
  EXPECT_EQ(cache.n_sequences(), size_t(2));  // the copy is gone
  EXPECT_EQ(cache.n_slots(0, 0, 0), 16);
}

}  // namespace
}  // namespace lazykv
