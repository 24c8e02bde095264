// What a step costs, learned from the steps the worker ran. The scheduler uses
// it to size prefill chunks by time, so that a newcomer's prompt delays the
// sequences that are decoding by a bounded amount (--max-decode-stall-ms)
// whatever the model, the machine or the batch.
//
// Model: a step's seconds ≈ a·decode_items + [p > 0]·(fixed + per_token·p),
// for p prompt tokens. `a` comes from steps that only decode (their own fixed
// overhead folded in, so it cancels when subtracted from a mixed step of a
// similar batch). `fixed` and `per_token` are a least-squares line through
// what the steps with prompt tokens took beyond their decoding. The fixed
// part is real on a CPU: past 8 tokens a matmul dequantizes its weights into
// panels once per step (about 390 ms for a 1.5B Q4_K model on 2 cores, 6 ms
// per token after that), so a small chunk is paid mostly for that. Every sum
// decays by `decay` per observed step, so the estimates follow a changing
// batch or context within tens of steps.
#pragma once

#include <cstdint>

namespace lazykv {

class StepCost {
 public:
  // Weight of the past per observed step (0 < decay < 1).
  explicit StepCost(double decay = 0.95) : decay_(decay) {}

  void observe(int32_t decode_items, int32_t prefill_tokens, double seconds);

  // Seconds per decoding sequence in a step; 0 until a decode-only step was seen.
  double decode_item_seconds() const { return a_den_ > 0 ? a_num_ / a_den_ : 0; }
  // The line through the prompt tokens' extra seconds: {fixed, per_token};
  // {0, 0} until a step with prompt tokens was seen. Until the chunks seen
  // differ enough in size to tell the two apart, fixed is 0.
  struct PrefillCost {
    double fixed = 0;
    double per_token = 0;
  };
  PrefillCost prefill_cost() const;

  // The prompt tokens a step beside decoding sequences should carry, or -1
  // while their cost is unknown: as many as add at most `stall_seconds`, but
  // never so few that the fixed part exceeds half of what the chunk adds
  // (fixed/per_token tokens): where the bound could only be met by chunks
  // paid mostly for the fixed part, they stay large enough to keep at least
  // half of the prefill throughput.
  int64_t prefill_chunk(double stall_seconds) const;

 private:
  double decay_;
  double a_num_ = 0, a_den_ = 0;  // decayed sums of seconds and decode items (decode-only steps)
  // Decayed least-squares sums over steps with prompt tokens: weight, p, p², extra seconds r, p·r.
  double w_ = 0, sp_ = 0, spp_ = 0, sr_ = 0, spr_ = 0;
};

}  // namespace lazykv
