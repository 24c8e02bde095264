// What a step costs, learned from the steps the worker ran. The scheduler uses
// it to size prefill chunks by time, so that a newcomer's prompt delays the
// sequences that are decoding by a bounded amount (--max-decode-stall-ms)
// whatever the model, the machine or the batch.
//
// Model: a step of k decoding sequences and p prompt tokens takes
//   decode(k) + [p > 0]·(fixed + per_token·p),
// with decode(k) = base + per_sequence·k. Both are lines fitted by least
// squares over the recent steps: decode(k) over the steps that only decode,
// the prompt line over what the other steps took beyond decode(k). Fixed
// parts are real: a step has its own overhead, and on a CPU past 8 tokens a
// matmul dequantizes its weights into panels once per step (about 390 ms for
// a 1.5B Q4_K model on 2 cores, 6 ms per prompt token after that), so a small
// chunk is paid mostly for that. Every sum decays by `decay` per observed
// step, so the lines follow a changing batch or context within tens of steps.
#pragma once

#include <cstdint>
#include <optional>

namespace lazykv {

// y ≈ intercept + slope·x by least squares over decayed sums. Until the x
// seen spread enough to tell intercept from slope, the intercept is the last
// one trusted (0 before any), and the slope is fitted below it.
class DecayedLine {
 public:
  struct Fit {
    double intercept = 0;
    double slope = 0;
  };
  explicit DecayedLine(double decay) : decay_(decay) {}
  void observe(double x, double y);
  // Empty before any observation, or while the slope is not positive.
  const std::optional<Fit>& fit() const { return fit_; }
  // Whether an intercept was ever fitted (the x seen spread); until then the
  // line goes through zero and says little away from the x seen.
  bool intercept_known() const { return intercept_known_; }
  double mean_x() const { return w_ > 0 ? sx_ / w_ : 0; }

 private:
  double decay_;
  double w_ = 0, sx_ = 0, sxx_ = 0, sy_ = 0, sxy_ = 0;
  double trusted_intercept_ = 0;  // of the last fit with spread, a non-negative intercept and a positive slope
  bool intercept_known_ = false;
  std::optional<Fit> fit_;
};

class StepCost {
 public:
  static constexpr int32_t kMinFittedChunk = 16;

  // Weight of the past per observed step (0 < decay < 1).
  explicit StepCost(double decay = 0.95) : decode_(decay), prompt_(decay) {}

  // One step that ran: its decoding sequences and prompt tokens (only those
  // that ran: not failed items) and the worker's seconds. A step with fewer
  // prompt tokens than kMinFittedChunk says little of a chunk's cost (it may
  // even run another kernel) and is left out of the prompt line, and so is
  // one whose decoding cost would be extrapolated from a line through zero.
  void observe(int32_t decode_items, int32_t prefill_tokens, double seconds);

  // Seconds of a step of k decoding sequences; empty until a decode-only step was seen.
  std::optional<double> decode_seconds(int32_t k) const;
  // The prompt tokens' extra seconds: {fixed, per_token}; empty until known.
  std::optional<DecayedLine::Fit> prefill_cost() const { return prompt_.fit(); }

  // The prompt tokens a step beside decoding sequences should carry, or -1
  // while their cost is unknown: as many as add at most `stall_seconds`, but
  // never so few that the fixed part exceeds half of what the chunk adds
  // (fixed/per_token tokens): where the bound could only be met by chunks
  // paid mostly for the fixed part, they stay large enough to keep at least
  // half of the prefill throughput.
  int64_t prefill_chunk(double stall_seconds) const;

 private:
  DecayedLine decode_;  // seconds over decoding sequences, decode-only steps
  DecayedLine prompt_;  // extra seconds over prompt tokens, steps with prompt tokens
};

}  // namespace lazykv
