// `rkv`: R-KV (redundancy-aware KV compression for reasoning models). Every
// `period` decode steps (and when the prompt completes), whenever over
// budget, the older slots are scored
//   score = lambda * importance - (1 - lambda) * redundancy
// and the top budget - window kept with the `window` newest slots, where
//   importance = for each of the last `window` queries, the softmax over the
//                older slots of its logits (max over the GQA group), then the
//                mean over the queries, max-pooled with `kernel` (as R-KV's
//                reference code scores them);
//   redundancy = softmax over the older slots of each key's mean cosine
//                similarity to the other older keys.
// skipkv (skipkv.cc) scores the same way and removes whole sentences.
#pragma once

#include "worker/policy/policy.h"

namespace lazykv {

class RkvPolicy : public EvictionPolicy {
 public:
  RkvPolicy(const PolicyConfig& config, const PolicyShape& shape);

 protected:
  void select(int layer, std::span<Head> heads, const KvCache& cache, SeqId seq,
              std::vector<std::vector<int32_t>>& keep) override;
  // True at a step that compresses: the prompt's end and every `period` steps.
  bool compression_due() const;
  // The scores of the head's older slots (all but the `window` newest) into
  // s.pooled[n - window]; uses s.scores, s.probs, s.aux and s.keys.
  void score_older(const Head& hd, const cpu::KvPages& kv, Scratch& s) const;

  int32_t budget_, period_, window_, kernel_;
  float lambda_;
};

}  // namespace lazykv
