#include "worker/policy/trace_replay.h"

#include <algorithm>
#include <cmath>
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
// them: the prompt's [H][P] ("prompt_log_beta") or a step's [H]
// ("log_beta"), fed token-major as the gates give them.
void observe_rates(EvictionPolicy& policy, const nlohmann::json& rates, int H, int32_t tokens, int32_t start_pos,
                   const std::string& where) {
  const bool one_token = start_pos >= policy.shape().prompt_len;
  std::vector<std::vector<float>> heads;  // [H][tokens]
  if (one_token) {
    for (float r : vector_of(rates, H, where)) heads.push_back({r});
  } else {
    if (!rates.is_array() || int(rates.size()) != H) bad(where + " must hold H = " + std::to_string(H) + " heads");
    for (int h = 0; h < H; ++h) heads.push_back(vector_of(rates[size_t(h)], tokens, where + "[" + std::to_string(h) + "]"));
  }
  std::vector<float> token_major(size_t(tokens) * size_t(H));
  for (int h = 0; h < H; ++h) {
    for (int32_t i = 0; i < tokens; ++i) {
      const float r = heads[size_t(h)][size_t(i)];
      if (r > 0.0f) {
        bad(where + "[" + std::to_string(h) + "]" + (one_token ? "" : "[" + std::to_string(i) + "]") +
            ": a rate is a log beta, at most 0");
      }
      token_major[size_t(i) * size_t(H) + size_t(h)] = r;
    }
  }
  policy.observe_retention(0, start_pos, token_major, tokens);
}

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

  const int32_t n_total = P + int32_t(steps.size());
  KvCache cache({1, H, D, 64, 0});
  const PolicyShape shape = replay_shape(trace, H, D, P, n_total);
  std::unique_ptr<EvictionPolicy> policy = make_policy(config, shape);
  const SeqId seq = 0;
  cache.add_sequence(seq, policy->heads_per_layer());
  std::vector<float> probs(static_cast<size_t>(n_total)), out(static_cast<size_t>(D));

  // Attention of query q at position pos over head h's cache, recording the
  // statistics the policy asks for and keeping the query when it wants it.
  const auto attend = [&](int h, int32_t pos, const std::vector<float>& q) {
    if (float* keep = policy->query_buffer(0, h, pos)) std::copy(q.begin(), q.end(), keep);
    cpu::attention_group(q.data(), 1, D, cache.view(seq, 0, h), pos, shape.attn_scale, probs.data(), out.data(),
                         nullptr, policy->stats(0, h, pos));
  };

  if (P > 0) {
    cache.reserve(seq, P);
    policy->begin_step(0, P);
    for (int h = 0; h < H; ++h) {
      for (int32_t p = 0; p < P; ++p) {
        const std::string where = "prompt_keys[" + std::to_string(h) + "][" + std::to_string(p) + "]";
        const std::vector<uint16_t> k = to_half(vector_of(trace["prompt_keys"][size_t(h)][size_t(p)], D, where));
        cache.append(seq, 0, h, p, k.data(), k.data());
      }
    }
    if (has_prompt_queries) {
      for (int h = 0; h < H; ++h) {
        const nlohmann::json& qs = trace["prompt_queries"][size_t(h)];
        if (!qs.is_array() || int32_t(qs.size()) != P) bad("\"prompt_queries\"[" + std::to_string(h) + "] must hold P queries");
        for (int32_t p = 0; p < P; ++p) {
          attend(h, p, vector_of(qs[size_t(p)], D, "prompt_queries[" + std::to_string(h) + "][" + std::to_string(p) + "]"));
        }
      }
    }
    if (policy->wants_layer_input()) observe_rates(*policy, trace["prompt_log_beta"], H, P, 0, "prompt_log_beta");
    policy->end_step(0, cache, seq);
    if (const int32_t wanted = policy->draft_wanted()) {
      policy->end_draft(trace_draft(trace, H, D, wanted, P - 1), cache, seq);
    }
  }

  size_t hidden_dim = 0;  // the first step's
  nlohmann::json result = {{"policy", config.to_json()}, {"prompt_len", P}, {"steps", nlohmann::json::array()}};
  for (size_t i = 0; i < steps.size(); ++i) {
    const nlohmann::json& step = steps[i];
    const std::string where = "steps[" + std::to_string(i) + "]";
    if (!step.is_object() || !step.contains("query") || !step.contains("new_key") || !step["query"].is_array() ||
        !step["new_key"].is_array() || int(step["query"].size()) != H || int(step["new_key"].size()) != H) {
      bad(where + " must be {\"query\": [H][D], \"new_key\": [H][D]}");
    }
    const int32_t pos = P + int32_t(i);
    cache.reserve(seq, 1);
    policy->begin_step(pos, 1);
    for (int h = 0; h < H; ++h) {
      const std::vector<uint16_t> k =
          to_half(vector_of(step["new_key"][size_t(h)], D, where + ".new_key[" + std::to_string(h) + "]"));
      cache.append(seq, 0, h, pos, k.data(), k.data());
    }
    for (int h = 0; h < H; ++h) {
      attend(h, pos, vector_of(step["query"][size_t(h)], D, where + ".query[" + std::to_string(h) + "]"));
    }
    if (policy->wants_hidden()) observe_step(*policy, step, pos, where, hidden_dim);
    if (policy->wants_layer_input()) {
      if (!step.contains("log_beta")) bad(where + ": policy trimkv takes each token's rates: \"log_beta\" [H]");
      observe_rates(*policy, step["log_beta"], H, 1, pos, where + ".log_beta");
    }
    policy->end_step(0, cache, seq);
    if (const int32_t wanted = policy->draft_wanted()) {
      policy->end_draft(trace_draft(trace, H, D, wanted, pos), cache, seq);
    }
    nlohmann::json kept = nlohmann::json::array(), state = nlohmann::json::array();
    for (int h = 0; h < policy->heads_per_layer(); ++h) {
      const std::span<const int32_t> p = cache.positions(seq, 0, h);
      kept.push_back(std::vector<int32_t>(p.begin(), p.end()));
      state.push_back(policy->slot_state(0, h));
    }
    result["steps"].push_back({{"t", policy->step()}, {"kept", kept}, {"state", state}});
  }
  result["peak_slots"] = policy->peak_slots();
  return result;
}

}  // namespace lazykv
