#include "worker/policy/trace_replay.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/fp16.h"
#include "worker/kv_cache.h"
#include "worker/policy/policy.h"
#include "worker/policy/retention_gates.h"

namespace lazykv {
namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "trace: " + what); }

int positive_int(const nlohmann::json& trace, const char* key) {
  if (!trace.contains(key) || !trace[key].is_number_integer() || trace[key].get<int64_t>() <= 0 ||
      trace[key].get<int64_t>() > 4096) {
    bad(std::string("\"") + key + "\" must be an integer in [1, 4096]");
  }
  return trace[key].get<int>();
}

// A [D] vector of numbers.
std::vector<float> vector_of(const nlohmann::json& v, int D, const std::string& where) {
  if (!v.is_array() || int(v.size()) != D) bad(where + " must be an array of " + std::to_string(D) + " numbers");
  std::vector<float> out(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d) {
    if (!v[size_t(d)].is_number()) bad(where + "[" + std::to_string(d) + "] is not a number");
    out[size_t(d)] = v[size_t(d)].get<float>();
    if (!std::isfinite(out[size_t(d)])) bad(where + "[" + std::to_string(d) + "] is not finite");
  }
  return out;
}

std::vector<uint16_t> to_half(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = fp32_to_fp16(x[i]);
  return h;
}

// epicache's episode: "draft_queries" stand for its patched prompt's queries
// (one dummy token each: no model reads them), and the prompt's first
// "history_len" tokens (all P when absent) are the history. None without
// draft queries.
std::shared_ptr<const EpisodePrompt> trace_episode(const nlohmann::json& trace, int32_t P) {
  auto episode = std::make_shared<EpisodePrompt>();
  episode->history_len = P;
  if (trace.contains("history_len")) {
    const nlohmann::json& history = trace["history_len"];
    if (!history.is_number_integer() || history.get<int64_t>() < 1 || history.get<int64_t>() > P) {
      bad("\"history_len\" (the prompt's first tokens that are history) must be an integer in [1, P = " +
          std::to_string(P) + "]");
    }
    episode->history_len = history.get<int32_t>();
  }
  if (!trace.contains("draft_queries") || !trace["draft_queries"].is_array() || trace["draft_queries"].empty()) {
    return nullptr;
  }
  episode->tokens.assign(trace["draft_queries"].size(), 0);
  return episode;
}

// One layer of H KV heads with a query each. Keys are RoPE'd NeoX-style with
// base "rope_theta" (10000 when absent) as far as a policy cares, and
// "query_stats" (optional) are the model's query statistics.
PolicyShape replay_shape(const nlohmann::json& trace, int H, int D, int32_t P, int32_t n_total) {
  PolicyShape shape;
  shape.n_layer = 1;
  shape.n_head_kv = H;
  shape.head_dim = D;
  shape.prompt_len = P;
  shape.attn_scale = 1.0f / std::sqrt(float(D));
  shape.max_len = n_total;
  double theta = 10000.0;
  if (trace.contains("rope_theta")) {
    if (!trace["rope_theta"].is_number() || !(trace["rope_theta"].get<double>() > 1.0) ||
        !std::isfinite(trace["rope_theta"].get<double>())) {
      bad("\"rope_theta\" must be a finite number above 1");
    }
    theta = trace["rope_theta"].get<double>();
  }
  for (int f = 0; f < D / 2; ++f) shape.rope_inv_freq.push_back(float(1.0 / std::pow(theta, 2.0 * f / D)));
  // Token ids that end a sentence (skipkv); none when absent.
  auto table = std::make_shared<TokenClasses>();
  if (trace.contains("sentence_ends")) {
    const nlohmann::json& ends = trace["sentence_ends"];
    if (!ends.is_array()) bad("\"sentence_ends\" must be an array of token ids");
    for (const nlohmann::json& id : ends) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= 65536) {
        bad("\"sentence_ends\" holds token ids in [0, 65536)");
      }
      table->resize(std::max(table->size(), size_t(id.get<int64_t>()) + 1), 0);
      (*table)[size_t(id.get<int64_t>())] = kSentenceEnd;
    }
  }
  shape.token_classes = std::move(table);
  if (trace.contains("query_stats")) {
    shape.query_stats = std::make_shared<const QueryStats>(query_stats_from_json(trace["query_stats"]));
  } else {
    shape.query_stats_missing = "the trace has no \"query_stats\"";
  }
  // trimkv: no model to run gates on, so the trace gives the rates
  // ("prompt_log_beta", each step's "log_beta"); gates of that shape stand
  // for the model's and are never run.
  if (trace.contains("prompt_log_beta")) {
    auto gates = std::make_shared<RetentionGates>();
    gates->n_layer = 1;
    gates->n_head_kv = H;
    shape.retention_gates = std::move(gates);
  } else {
    shape.retention_gates_missing =
        "the trace has no \"prompt_log_beta\" (trimkv's rates, [H][P], and \"log_beta\" [H] in every step)";
  }
  shape.episode = trace_episode(trace, P);
  return shape;
}

// A draft's queries from the trace's "draft_queries" [tokens][H][D] (the
// same at every draft: the replay has no model to decode with), the first
// `wanted` of them, at the positions after `pos`.
DraftQueries trace_draft(const nlohmann::json& trace, int H, int D, int32_t wanted, int32_t pos) {
  if (!trace.contains("draft_queries") || !trace["draft_queries"].is_array() || trace["draft_queries"].empty()) {
    bad("policy " + trace["policy"].value("name", std::string()) +
        " decodes draft tokens: \"draft_queries\" must give their queries, [tokens][H][D]");
  }
  const nlohmann::json& tokens = trace["draft_queries"];
  DraftQueries draft;
  draft.tokens = std::min(wanted, int32_t(tokens.size()));
  draft.first_pos = pos + 1;
  draft.heads.resize(size_t(H));
  for (int32_t i = 0; i < draft.tokens; ++i) {
    const std::string where = "draft_queries[" + std::to_string(i) + "]";
    if (!tokens[size_t(i)].is_array() || int(tokens[size_t(i)].size()) != H) bad(where + " must hold H queries");
    for (int h = 0; h < H; ++h) {
      const std::vector<float> q = vector_of(tokens[size_t(i)][size_t(h)], D, where + "[" + std::to_string(h) + "]");
      draft.heads[size_t(h)].insert(draft.heads[size_t(h)].end(), q.begin(), q.end());
    }
  }
  return draft;
}

// A step's token and final hidden state ({"token": id, "hidden": [E]}, E the
// same at every step) for a policy that reads them.
void observe_step(EvictionPolicy& policy, const nlohmann::json& step, int32_t pos, const std::string& where,
                  size_t& hidden_dim) {
  if (!step.contains("token") || !step["token"].is_number_integer() || step["token"].get<int64_t>() < 0 ||
      step["token"].get<int64_t>() >= 65536 || !step.contains("hidden") || !step["hidden"].is_array() ||
      step["hidden"].empty() || step["hidden"].size() > 4096) {
    bad(where + ": policy " + policy.config().name +
        " reads hidden states: the step needs \"token\" (an id in [0, 65536)) and \"hidden\" (1 to 4096 numbers)");
  }
  if (hidden_dim == 0) hidden_dim = step["hidden"].size();
  const std::vector<float> hidden = vector_of(step["hidden"], int(hidden_dim), where + ".hidden");
  policy.observe_token(pos, step["token"].get<int32_t>(), hidden);
}

// Retention rates (log beta, finite and at most 0) for a policy that takes
// them: the prompt's [H][P] ("prompt_log_beta"), of which the tokens of the
// pass, or a step's [H] ("log_beta"), fed token-major as the gates give them.
void observe_rates(EvictionPolicy& policy, const nlohmann::json& rates, int H, int32_t tokens, int32_t start_pos,
                   const std::string& where) {
  const int32_t P = policy.shape().prompt_len;
  const bool one_token = start_pos >= P;
  const int32_t first = one_token ? 0 : start_pos;  // the pass's first rate in heads[h]
  std::vector<std::vector<float>> heads;            // [H][1] or [H][P]
  if (one_token) {
    for (float r : vector_of(rates, H, where)) heads.push_back({r});
  } else {
    if (!rates.is_array() || int(rates.size()) != H) bad(where + " must hold H = " + std::to_string(H) + " heads");
    for (int h = 0; h < H; ++h) heads.push_back(vector_of(rates[size_t(h)], P, where + "[" + std::to_string(h) + "]"));
  }
  std::vector<float> token_major(size_t(tokens) * size_t(H));
  for (int h = 0; h < H; ++h) {
    for (int32_t i = 0; i < tokens; ++i) {
      const float r = heads[size_t(h)][size_t(first + i)];
      if (r > 0.0f) {
        bad(where + "[" + std::to_string(h) + "]" + (one_token ? "" : "[" + std::to_string(first + i) + "]") +
            ": a rate is a log beta, at most 0");
      }
      token_major[size_t(i) * size_t(H) + size_t(h)] = r;
    }
  }
  policy.observe_retention(0, start_pos, token_major, tokens);
}

// One replay: the policy over a one-layer cache, fed the trace's prompt in
// the blocks the policy asks for and then its steps.
class Replay {
 public:
  Replay(const nlohmann::json& trace, const PolicyConfig& config, int H, int D, int32_t P, int32_t n_total)
      : trace_(trace), H_(H), D_(D), P_(P), cache_({1, H, D, 64, 0}), shape_(replay_shape(trace, H, D, P, n_total)),
        probs_(size_t(n_total)), out_(size_t(D)) {
    if (config.name == "epicache" && !shape_.episode) {  // make_policy's "no episode" would point to the eval harness
      bad("policy epicache compresses the history for an episode: \"draft_queries\" must give the queries of "
          "its patched prompt, [tokens][H][D] (and \"history_len\" the history, P when absent)");
    }
    policy_ = make_policy(config, shape_);
    cache_.add_sequence(kSeq, policy_->heads_per_layer());
  }

  const EvictionPolicy& policy() const { return *policy_; }

  // The prompt: one pass, or the blocks of a policy that compresses between
  // them (epicache's history), each perhaps followed by a draft.
  void prefill() {
    for (int32_t pos = 0; pos < P_;) {
      const int32_t n = policy_->prompt_chunk(pos, P_);
      prompt_pass(pos, n);
      pos += n;
    }
  }

  // Decode step i + 1 (the token at P + i); returns what the step reports.
  nlohmann::json decode(size_t i) {
    const nlohmann::json& step = trace_["steps"][i];
    const std::string where = "steps[" + std::to_string(i) + "]";
    if (!step.is_object() || !step.contains("query") || !step.contains("new_key") || !step["query"].is_array() ||
        !step["new_key"].is_array() || int(step["query"].size()) != H_ || int(step["new_key"].size()) != H_) {
      bad(where + " must be {\"query\": [H][D], \"new_key\": [H][D]}");
    }
    const int32_t pos = P_ + int32_t(i);
    cache_.reserve(kSeq, 1);
    policy_->begin_step(pos, 1);
    for (int h = 0; h < H_; ++h) {
      const std::vector<uint16_t> k =
          to_half(vector_of(step["new_key"][size_t(h)], D_, where + ".new_key[" + std::to_string(h) + "]"));
      cache_.append(kSeq, 0, h, pos, k.data(), k.data());
    }
    for (int h = 0; h < H_; ++h) {
      attend(h, pos, vector_of(step["query"][size_t(h)], D_, where + ".query[" + std::to_string(h) + "]"));
    }
    if (policy_->wants_hidden()) observe_step(*policy_, step, pos, where, hidden_dim_);
    if (policy_->wants_layer_input()) {
      if (!step.contains("log_beta")) bad(where + ": policy trimkv takes each token's rates: \"log_beta\" [H]");
      observe_rates(*policy_, step["log_beta"], H_, 1, pos, where + ".log_beta");
    }
    end_pass(pos);
    nlohmann::json kept = nlohmann::json::array(), state = nlohmann::json::array();
    for (int h = 0; h < policy_->heads_per_layer(); ++h) {
      const std::span<const int32_t> p = cache_.positions(kSeq, 0, h);
      kept.push_back(std::vector<int32_t>(p.begin(), p.end()));
      state.push_back(policy_->slot_state(0, h));
    }
    return {{"t", policy_->step()}, {"kept", kept}, {"state", state}};
  }

 private:
  static constexpr SeqId kSeq = 0;

  // Attention of query q at position pos over head h's cache, recording the
  // statistics the policy asks for and keeping the query when it wants it.
  void attend(int h, int32_t pos, const std::vector<float>& q) {
    if (float* keep = policy_->query_buffer(0, h, pos)) std::copy(q.begin(), q.end(), keep);
    cpu::attention_group(q.data(), 1, D_, cache_.view(kSeq, 0, h), pos, shape_.attn_scale, probs_.data(),
                         out_.data(), nullptr, policy_->stats(0, h, pos));
  }

  // One pass over the prompt's tokens [pos, pos + n).
  void prompt_pass(int32_t pos, int32_t n) {
    cache_.reserve(kSeq, n);
    policy_->begin_step(pos, n);
    for (int h = 0; h < H_; ++h) {
      for (int32_t p = pos; p < pos + n; ++p) {
        const std::string where = "prompt_keys[" + std::to_string(h) + "][" + std::to_string(p) + "]";
        const std::vector<uint16_t> k = to_half(vector_of(trace_["prompt_keys"][size_t(h)][size_t(p)], D_, where));
        cache_.append(kSeq, 0, h, p, k.data(), k.data());
      }
    }
    if (trace_.contains("prompt_queries")) {
      for (int h = 0; h < H_; ++h) {
        const nlohmann::json& qs = trace_["prompt_queries"][size_t(h)];
        const std::string where = "prompt_queries[" + std::to_string(h) + "]";
        if (!qs.is_array() || int32_t(qs.size()) != P_) bad(where + " must hold P queries");
        for (int32_t p = pos; p < pos + n; ++p) {
          attend(h, p, vector_of(qs[size_t(p)], D_, where + "[" + std::to_string(p) + "]"));
        }
      }
    }
    if (policy_->wants_layer_input()) observe_rates(*policy_, trace_["prompt_log_beta"], H_, n, pos, "prompt_log_beta");
    end_pass(pos + n - 1);
  }

  // After the pass whose last token is at last_pos: the policy's end_step,
  // and the draft it then waits for, whose queries sit right after it.
  void end_pass(int32_t last_pos) {
    policy_->end_step(0, cache_, kSeq);
    if (const int32_t wanted = policy_->draft_wanted()) {
      policy_->end_draft(trace_draft(trace_, H_, D_, wanted, last_pos), cache_, kSeq);
    }
  }

  const nlohmann::json& trace_;
  const int H_, D_;
  const int32_t P_;
  KvCache cache_;
  const PolicyShape shape_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<float> probs_, out_;
  size_t hidden_dim_ = 0;  // the first step's
};

}  // namespace

nlohmann::json replay_trace(const nlohmann::json& trace) {
  if (!trace.is_object()) bad("expected a JSON object");
  if (!trace.contains("policy")) bad("missing \"policy\"");
  const PolicyConfig config = make_policy_config(trace["policy"]);
  const int H = positive_int(trace, "H");
  const int D = positive_int(trace, "D");
  if (!trace.contains("prompt_keys") || !trace["prompt_keys"].is_array() || int(trace["prompt_keys"].size()) != H) {
    bad("\"prompt_keys\" must be an array of H = " + std::to_string(H) + " heads");
  }
  const int32_t P = int32_t(trace["prompt_keys"][0].is_array() ? trace["prompt_keys"][0].size() : 0);
  for (int h = 0; h < H; ++h) {
    if (!trace["prompt_keys"][size_t(h)].is_array() || int32_t(trace["prompt_keys"][size_t(h)].size()) != P) {
      bad("\"prompt_keys\"[" + std::to_string(h) + "] must hold " + std::to_string(P) + " keys like head 0");
    }
  }
  const bool has_prompt_queries = trace.contains("prompt_queries");
  if (has_prompt_queries && (!trace["prompt_queries"].is_array() || int(trace["prompt_queries"].size()) != H)) {
    bad("\"prompt_queries\" must be an array of H heads of P queries");
  }
  if (!trace.contains("steps") || !trace["steps"].is_array()) bad("\"steps\" must be an array");
  const nlohmann::json& steps = trace["steps"];

  Replay replay(trace, config, H, D, P, P + int32_t(steps.size()));
  replay.prefill();
  nlohmann::json result = {{"policy", config.to_json()}, {"prompt_len", P}, {"steps", nlohmann::json::array()}};
  for (size_t i = 0; i < steps.size(); ++i) result["steps"].push_back(replay.decode(i));
  result["peak_slots"] = replay.policy().peak_slots();
  return result;
}

}  // namespace lazykv
