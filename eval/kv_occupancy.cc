#include "eval/kv_occupancy.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace lazykv::eval {
namespace {

// When a policy compacts, and to what: the rules of worker/policy/*.cc and
// the table in docs/policies.md, read from the config once per call.
struct CompactionRule {
  enum Kind {
    kNever,           // full
    kEveryPass,       // streaming, h2o, tova, caote, obcache: after every pass, the prefill too
    kPrefillPeriod,   // snapkv, rkv, skipkv, laq: the prefill, then every `period` decode steps (0: never again)
    kWindow,          // lazy, lazy+tiers: decode steps t with t % window == 0
    kWindowMultiple,  // vase: decode steps leaving more than C slots and a multiple of window
    kRaas,            // raas: every decode step; the prompt stays, at least one decode slot does
    kThreshold,       // triattention: decode steps leaving C + period slots; trimkv: the same, prefill included
  } kind = kNever;
  int32_t budget = 0, every = 0;
  bool keep_prompt = false;
  bool prefill = false;  // kThreshold: the prefill compacts too

  explicit CompactionRule(const PolicyConfig& c) : budget(c.budget()) {
    const std::string& name = c.name;
    if (name == "full") {
      kind = kNever;
    } else if (name == "streaming" || name == "h2o" || name == "tova" || name == "caote" || name == "obcache") {
      kind = kEveryPass;
    } else if (name == "snapkv" || name == "rkv" || name == "skipkv" || name == "laq") {
      kind = kPrefillPeriod;
      every = c.get_int("period");
    } else if (name == "lazy" || name == "lazy+tiers") {
      kind = kWindow;
      every = c.get_int("window");
    } else if (name == "vase") {
      kind = kWindowMultiple;
      every = c.get_int("window");
    } else if (name == "raas") {
      kind = kRaas;
    } else if (name == "triattention" || name == "trimkv") {
      kind = kThreshold;
      every = c.get_int("period");
      keep_prompt = c.get_int("keep_prompt") != 0;
      prefill = name == "trimkv";
    } else {
      throw Error(ErrorCode::kInternal, "no KV occupancy model for policy " + name);
    }
  }

  // Slots per cache head after the compaction that follows pass t (0: the
  // prefill, t >= 1: decode step t), when the pass left n.
  int32_t after(int32_t prompt_len, int32_t t, int32_t n) const {
    switch (kind) {
      case kNever:
        return n;
      case kEveryPass:
        return std::min(n, budget);
      case kPrefillPeriod:
        return t == 0 || (every > 0 && t % every == 0) ? std::min(n, budget) : n;
      case kWindow:
        return t >= 1 && t % every == 0 ? std::min(n, budget) : n;
      case kWindowMultiple:
        return t >= 1 && n > budget && n % every == 0 ? budget : n;
      case kRaas: {
        if (t == 0) return n;
        const int32_t decode_kept = std::max(budget - prompt_len, 1);
        return n - prompt_len > decode_kept ? prompt_len + decode_kept : n;
      }
      case kThreshold: {
        if ((t == 0 && !prefill) || n < budget + every) return n;
        const int32_t kept_prompt = keep_prompt ? std::min(prompt_len, n) : 0;
        const int32_t scored = std::max(budget - kept_prompt, 0);
        return n - kept_prompt > scored ? kept_prompt + scored : n;
      }
    }
    return n;
  }
};

}  // namespace

KvOccupancy kv_occupancy(const PolicyConfig& config, int32_t prompt_len, int32_t generated) {
  if (prompt_len < 1 || generated < 1) throw Error(ErrorCode::kInternal, "kv_occupancy: empty prompt or generation");
  const CompactionRule rule(config);
  KvOccupancy o;
  int64_t sum = 0;
  int32_t n = prompt_len;
  for (int32_t t = 0; t < generated; ++t) {
    if (t > 0) ++n;  // the decode token's slot
    sum += n;
    o.peak = std::max(o.peak, n);
    n = rule.after(prompt_len, t, n);
  }
  o.mean = double(sum) / double(generated);
  return o;
}

}  // namespace lazykv::eval
