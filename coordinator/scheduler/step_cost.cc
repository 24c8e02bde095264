#include "coordinator/scheduler/step_cost.h"

#include <algorithm>
#include <cmath>

namespace lazykv {

namespace {
// A prompt token costs at least this (1 µs): noisy mixed steps can make the
// fitted slope zero or negative.
constexpr double kMinTokenSeconds = 1e-6;
// The chunk sizes seen must spread by at least this fraction of their mean
// before the line's intercept is trusted; below, the line goes through zero.
constexpr double kMinRelativeSpread = 0.1;
constexpr double kMaxChunk = 1e15;
}  // namespace

void StepCost::observe(int32_t decode_items, int32_t prefill_tokens, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds) || decode_items < 0 || prefill_tokens < 0) return;
  if (prefill_tokens == 0) {
    if (decode_items == 0) return;
    a_num_ = decay_ * a_num_ + seconds;
    a_den_ = decay_ * a_den_ + decode_items;
    return;
  }
  // Beside decoding sequences the prompt's share is what decoding alone would
  // not have cost; without a decode cost yet, such a step says nothing.
  if (decode_items > 0 && a_den_ == 0) return;
  const double p = prefill_tokens;
  const double r = seconds - decode_item_seconds() * decode_items;
  w_ = decay_ * w_ + 1;
  sp_ = decay_ * sp_ + p;
  spp_ = decay_ * spp_ + p * p;
  sr_ = decay_ * sr_ + r;
  spr_ = decay_ * spr_ + p * r;
}

StepCost::PrefillCost StepCost::prefill_cost() const {
  if (w_ == 0) return {};
  const double mean_p = sp_ / w_;
  const double var_p = spp_ / w_ - mean_p * mean_p;
  if (var_p > (kMinRelativeSpread * mean_p) * (kMinRelativeSpread * mean_p)) {
    const double per_token = (w_ * spr_ - sp_ * sr_) / (w_ * spp_ - sp_ * sp_);
    const double fixed = (sr_ - per_token * sp_) / w_;
    if (fixed >= 0 && per_token >= kMinTokenSeconds) return {fixed, per_token};
  }
  // Through zero: the seconds per token of all the chunks together.
  return {0, std::max(sr_ / sp_, kMinTokenSeconds)};
}

int64_t StepCost::prefill_chunk(double stall_seconds) const {
  const PrefillCost cost = prefill_cost();
  if (cost.per_token <= 0) return -1;
  const double within = std::floor((std::max(stall_seconds, 0.0) - cost.fixed) / cost.per_token);
  const double efficient = std::ceil(cost.fixed / cost.per_token);
  return int64_t(std::min(std::max({within, efficient, 0.0}), kMaxChunk));
}

}  // namespace lazykv
