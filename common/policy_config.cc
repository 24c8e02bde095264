#include "common/policy_config.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <iomanip>
#include <sstream>

#include "common/error.h"

namespace lazykv {
namespace {

constexpr double kMaxSlots = 1 << 24;

PolicyParam budget_param() {
  return {"budget", 512, 1, kMaxSlots, true, "slots kept per KV head after compaction, prompt included"};
}

PolicyParam keep_prompt_param(double default_value) {
  return {"keep_prompt", default_value, 0, 1, true,
          "1: the prompt is never evicted (it counts in the budget); 0: it competes with the generated tokens"};
}

// R-KV's parameters, then `more`, then keep_prompt: skipkv scores as rkv does.
std::vector<PolicyParam> rkv_params(std::vector<PolicyParam> more) {
  std::vector<PolicyParam> params = {
      budget_param(),
      {"period", 128, 1, kMaxSlots, true, "decode steps between compressions"},
      {"window", 8, 1, kMaxSlots, true, "observation window: the last queries, whose slots are kept"},
      {"kernel", 7, 1, 63, true, "max-pooling kernel (odd)"},
      {"lambda", 0.1, 0, 1, false, "weight of importance against redundancy"},
  };
  params.insert(params.end(), more.begin(), more.end());
  params.push_back(keep_prompt_param(0));
  return params;
}

// Whole numbers in full (a budget limit of 16777216, not 1.67772e+07).
std::string format_number(double v) {
  std::ostringstream os;
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    os << static_cast<long long>(v);
  } else {
    os << std::setprecision(8) << v;
  }
  return os.str();
}

const PolicyInfo& find_policy(const std::string& name) {
  for (const PolicyInfo& p : policy_catalog()) {
    if (p.name == name) return p;
  }
  throw Error(ErrorCode::kInvalidArgument, "unknown eviction policy '" + name + "'; valid policies: " + policy_names());
}

std::string param_list(const PolicyInfo& info) {
  if (info.params.empty()) return "none";
  std::ostringstream out;
  for (const PolicyParam& p : info.params) {
    if (&p != &info.params.front()) out << "; ";
    out << p.name << " in [" << format_number(p.min) << ", " << format_number(p.max) << "]"
        << (p.integer ? " (integer)" : "") << ", default " << format_number(p.default_value);
  }
  return out.str();
}

// The row's rules between parameters; value ranges alone are checked per parameter.
void check_cross_rules(const PolicyInfo& info, const PolicyConfig& c) {
  for (const std::string& param : info.odd) {
    if (int64_t(c.get(param)) % 2 == 0) {
      throw Error(ErrorCode::kInvalidArgument, "policy " + c.name + ": " + param + " must be odd");
    }
  }
  for (const std::string& param : info.below_budget) {
    if (c.get(param) >= c.get("budget")) {
      throw Error(ErrorCode::kInvalidArgument, "policy " + c.name + ": " + param + " (" + format_number(c.get(param)) +
                                                   ") must be smaller than budget (" +
                                                   format_number(c.get("budget")) + ")");
    }
  }
}

}  // namespace

// Each row: name, summary, parameters, then the parameters below budget, the
// ones that must be odd, and the one counting the newest slots kept.
const std::vector<PolicyInfo>& policy_catalog() {
  static const std::vector<PolicyInfo> catalog = {
      {"full", "no eviction: every token stays cached", {}, {}, {}, ""},
      {"lazy",
       "LazyEviction: lagged eviction by each token's recurrence interval",
       {budget_param(),
        {"window", 128, 1, kMaxSlots, true, "observation window = protected recent slots = eviction period W"},
        {"alpha", 1e-4, 0, 1, false, "attention probability that counts as a hit"},
        {"per_query_head", 0, 0, 1, true, "1: track and select per query head (GQA expanded), as the reference"},
        keep_prompt_param(0)},
       {"window"}, {}, "window"},
      {"lazy+tiers",
       "LazyEviction whose evicted recurring tokens are demoted to the host/NVMe tiers and promoted back",
       {budget_param(),
        {"window", 128, 1, kMaxSlots, true, "observation window = protected recent slots = eviction period W"},
        {"alpha", 1e-4, 0, 1, false, "attention probability that counts as a hit"},
        {"promote", 16, 0, kMaxSlots, true, "most slots promoted per KV head at one eviction step"},
        {"fetch", 16, 0, kMaxSlots, true, "most demoted rows fetched per KV head at one eviction step"},
        {"lead", 16, 1, kMaxSlots, true, "decode steps before an eviction step at which its candidate rows are fetched"},
        {"q8", 1, 0, 1, true, "1: demoted rows travel and are stored as Q8_0 (head_dim a multiple of 32), 0: f16"},
        {"probe", 1, 0, 1, true, "1: also promote by a query probe against the demoted rows' key sketches"},
        keep_prompt_param(0)},
       {"window"}, {}, "window"},
      {"streaming",
       "StreamingLLM: attention sinks plus a recent window",
       {budget_param(), {"sinks", 4, 0, kMaxSlots, true, "first tokens always kept"}, keep_prompt_param(0)},
       {"sinks"}, {}, ""},
      {"h2o",
       "H2O: heavy hitters by accumulated attention plus a recent window, evicting every step",
       {budget_param(), {"recent", 0, 0, kMaxSlots, true, "recent slots always kept; 0 is half the budget"},
        keep_prompt_param(0)},
       {"recent"}, {}, "recent"},
      {"tova", "TOVA: the current query's attention averaged over the layer's heads, one top-k per layer",
       {budget_param(), keep_prompt_param(0)}, {}, {}, ""},
      {"snapkv",
       "SnapKV: pooled attention of the last queries, at prefill and every `period` decode steps",
       {budget_param(),
        {"window", 32, 1, kMaxSlots, true, "observation window: the last queries, whose slots are kept"},
        {"kernel", 5, 1, 63, true, "max-pooling kernel (odd)"},
        {"period", 128, 0, kMaxSlots, true, "decode steps between compressions; 0 is prefill only"},
        keep_prompt_param(0)},
       {"window"},
       {"kernel"},
       "window"},
      {"rkv",
       "R-KV: importance from the last queries minus key redundancy, every `period` steps",
       rkv_params({}),
       {"window"},
       {"kernel"},
       "window"},
      {"raas",
       "RaaS: timestamps refreshed by attention >= alpha, the oldest evicted, prompt kept",
       {budget_param(), {"alpha", 1e-4, 0, 1, false, "attention probability that refreshes a timestamp"}}, {}, {}, ""},
      {"caote",
       "CAOTE: per KV head, a recent window plus the slots whose eviction would move the current attention output most",
       {budget_param(), {"recent", 32, 0, kMaxSlots, true, "recent slots always kept (0: none, the paper's criterion alone)"},
        keep_prompt_param(0)},
       {"recent"}, {}, "recent"},
      {"obcache",
       "OBCache: per KV head, a recent window plus the slots whose pruning moves the attention outputs most, "
       "accumulated over queries",
       {budget_param(),
        {"recent", 32, 0, kMaxSlots, true, "recent slots always kept; also the prompt queries scored (0: none kept, last query scored)"},
        {"accumulate", 1, 0, 1, true,
         "1: sum over queries (the prompt's last max(recent, 1), then every decode query), as H2O; "
         "0: the current query only, as TOVA"},
        keep_prompt_param(0)},
       {"recent"}, {}, "recent"},
      {"vase",
       "VaSE: value-aware stochastic eviction: the largest value ranges and the sinks reserved, the rest sampled "
       "by pooled window attention (or, with sketch=1, kept by a fresh random sketch), every `window` slots",
       {budget_param(),
        {"window", 64, 1, kMaxSlots, true,
         "recency buffer: the newest slots stay, their queries score, and eviction runs whenever the cache reaches a "
         "multiple of it over budget"},
        {"large", 0.25, 0, 1, false, "fraction of the budget reserved for the largest value ranges (sinks first)"},
        {"sinks", 4, 0, kMaxSlots, true, "first slots always kept (reserved before the value ranges)"},
        {"kernel", 5, 1, 63, true, "average-pooling kernel over the attention scores (odd, zero-padded)"},
        {"sketch", 0, 0, 1, true, "1: VaSE-DKV, keep the top |kG|^2 |vG|^2 for a fresh Gaussian G (no queries, no reserve)"},
        {"rank", 20, 1, 256, true, "columns of the Gaussian sketch G (sketch=1)"},
        {"seed", 0, 0, 4294967295.0, true, "random stream: the same seed gives the same evictions"},
        keep_prompt_param(0)},
       {"window", "sinks"},
       {"kernel"},
       "window"},
      {"triattention",
       "TriAttention: keys ranked by the logit that calibrated pre-RoPE query centres will give them at future "
       "positions (needs the model's query statistics: lazykv calibrate)",
       {budget_param(),
        {"period", 128, 1, kMaxSlots, true, "compress when a KV head holds budget + period slots"},
        keep_prompt_param(1)},
       {}, {}, ""},
      {"laq",
       "Lookahead Q-Cache: SnapKV whose observation window holds the queries of a few draft tokens, decoded "
       "greedily on a SnapKV-compressed copy of the cache and discarded, at prefill and every `period` decode steps",
       {budget_param(),
        {"lookahead", 8, 1, 64, true, "draft tokens decoded on the compressed copy; their queries score the cache"},
        {"recent", 8, 0, kMaxSlots, true,
         "real queries scored beside the draft's (LAQ++; 0: the draft's alone), whose slots are kept"},
        {"window", 32, 1, kMaxSlots, true, "observation window of the SnapKV compression the draft runs on"},
        {"kernel", 7, 1, 63, true, "max-pooling kernel (odd)"},
        {"period", 128, 0, kMaxSlots, true, "decode steps between compressions; 0 is prefill only"},
        keep_prompt_param(0)},
       {"recent", "window"},
       {"kernel"},
       "recent"},
      {"skipkv",
       "SkipKV: R-KV's scores less a penalty for sentences a later sentence repeats (cosine of their mean final "
       "hidden states >= tau), evicting whole sentences, every `period` steps",
       rkv_params({
           {"tau", 0.95, 0, 1, false, "cosine at which a later sentence makes an earlier one redundant"},
           {"penalty", 1, 0, 1e6, false, "weight of a redundant sentence's cosine, subtracted from its slots' scores"},
           {"min_sentence", 4, 1, 4096, true, "tokens before a newline may end a sentence"},
           {"max_sentence", 256, 1, 4096, true, "tokens at which a sentence ends without a newline"},
           {"steer", 0, 0, 16, false,
            "activation steering: the scale of the model's steering vector added at each blank line between "
            "thoughts (0: off; needs lazykv steer's file)"},
           {"steer_step", 0.25, 0, 16, false, "added to the scale for each earlier thought that re-checked"},
           {"steer_max", 2, 0, 16, false, "the largest scale"},
       }),
       {"window"},
       {"kernel"},
       "window"},
      {"trimkv",
       "TRIM-KV: each token's retention rate per KV head from a learned gate on its layer input, decayed since "
       "it was written; the highest retention stays (needs the model's gates: scripts/train_trimkv.sh)",
       {budget_param(),
        {"period", 1, 1, kMaxSlots, true, "compress when a KV head holds budget + period slots (prefill included)"},
        keep_prompt_param(0)},
       {}, {}, ""},
      {"epicache",
       "EpiCache: a conversation's history prefilled in blocks, each time compressed to the slots its episode's "
       "patched prompt attends to most; the question routed to that episode is answered on it (needs `lazykv eval "
       "conversation`, which clusters the history into episodes)",
       {budget_param(),
        {"block", 512, 1, kMaxSlots, true, "history tokens prefilled between compressions"},
        {"sinks", 4, 0, kMaxSlots, true, "first slots always kept (the system prompt's start)"},
        {"uniform", 0, 0, 1, true,
         "0: a layer's heads share budget x heads slots, the best scores win whichever head; 1: budget per head"}},
       {"sinks"}, {}, "", true},
  };
  return catalog;
}

std::string policy_names() {
  std::string names;
  for (const PolicyInfo& p : policy_catalog()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

double PolicyConfig::get(const std::string& param) const {
  auto it = params.find(param);
  if (it == params.end()) throw Error(ErrorCode::kInternal, "policy " + name + " has no parameter '" + param + "'");
  return it->second;
}

int32_t PolicyConfig::budget() const {
  auto it = params.find("budget");
  return it == params.end() ? 0 : int32_t(it->second);
}

std::string PolicyConfig::to_string() const {
  std::ostringstream out;
  out << name;
  if (params.empty()) return out.str();
  out << "(";
  for (auto it = params.begin(); it != params.end(); ++it) out << (it == params.begin() ? "" : ",") << it->first << "=" << it->second;
  out << ")";
  return out.str();
}

nlohmann::json PolicyConfig::to_json() const {
  nlohmann::json j = {{"name", name}};
  for (const auto& [k, v] : params) j[k] = v;
  return j;
}

PolicyConfig make_policy_config(const std::string& name, const std::map<std::string, std::string>& params) {
  const PolicyInfo& info = find_policy(name);
  PolicyConfig c;
  c.name = info.name;
  for (const PolicyParam& p : info.params) c.params[p.name] = p.default_value;
  for (const auto& [key, text] : params) {
    const PolicyParam* param = nullptr;
    for (const PolicyParam& p : info.params) {
      if (p.name == key) param = &p;
    }
    if (param == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  "policy " + name + " has no parameter '" + key + "'; its parameters: " + param_list(info));
    }
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    const bool parsed = !text.empty() && end == text.c_str() + text.size() && std::isfinite(v);
    if (!parsed || v < param->min || v > param->max || (param->integer && v != std::floor(v))) {
      throw Error(ErrorCode::kInvalidArgument, "policy " + name + ": invalid " + key + " '" + text + "'; expected " +
                                                   (param->integer ? "an integer" : "a number") + " in [" +
                                                   format_number(param->min) + ", " + format_number(param->max) + "]");
    }
    c.params[key] = v;
  }
  check_cross_rules(info, c);
  return c;
}

PolicyConfig make_policy_config(const nlohmann::json& spec) {
  if (!spec.is_object() || !spec.contains("name") || !spec["name"].is_string()) {
    throw Error(ErrorCode::kInvalidArgument, "policy: expected an object with a string \"name\"");
  }
  std::map<std::string, std::string> params;
  for (const auto& [key, value] : spec.items()) {
    if (key == "name") continue;
    if (value.is_number()) {
      std::ostringstream os;
      os.precision(17);
      os << value.get<double>();
      params[key] = os.str();
    } else if (value.is_boolean()) {
      params[key] = std::string(1, value.get<bool>() ? '1' : '0');
    } else {
      throw Error(ErrorCode::kInvalidArgument, "policy: parameter '" + key + "' must be a number");
    }
  }
  return make_policy_config(spec["name"].get<std::string>(), params);
}

int32_t recent_slots(const PolicyConfig& config) {
  const std::string& param = find_policy(config.name).recent;
  if (param.empty()) return 0;
  const int32_t recent = config.get_int(param);
  return config.name == "h2o" && recent == 0 ? config.budget() / 2 : recent;
}

std::string prompt_refusal(const PolicyConfig& config, int64_t prompt_len) {
  const auto keep = config.params.find("keep_prompt");
  if (keep == config.params.end() || keep->second == 0) return "";
  const int32_t recent = recent_slots(config);
  if (prompt_len + recent < config.budget()) return "";
  const std::string held = recent > 0 ? " and the " + std::to_string(recent) + " newest slots it always keeps" : "";
  return "policy " + config.name + ": the prompt (" + std::to_string(prompt_len) + " tokens)" + held +
         (recent > 0 ? " fill" : " fills") + " the budget (" + std::to_string(config.budget()) +
         ") and keep_prompt=1 keeps all of the prompt, so nothing generated could be chosen; raise the budget or set "
         "keep_prompt=0";
}

}  // namespace lazykv
