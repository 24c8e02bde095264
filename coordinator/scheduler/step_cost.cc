#include "coordinator/scheduler/step_cost.h"

#include <algorithm>
#include <cmath>

namespace lazykv {

namespace {
// The x seen must spread by at least this fraction of their mean before an
// intercept is fitted; below, the last trusted intercept stays.
constexpr double kMinRelativeSpread = 0.1;
constexpr double kMaxChunk = 1e15;
}  // namespace

void DecayedLine::observe(double x, double y) {
  w_ = decay_ * w_ + 1;
  sx_ = decay_ * sx_ + x;
  sxx_ = decay_ * sxx_ + x * x;
  sy_ = decay_ * sy_ + y;
  sxy_ = decay_ * sxy_ + x * y;
  fit_.reset();
  if (sx_ <= 0) return;
  const double mean_x = sx_ / w_;
  const double mean_y = sy_ / w_;
  const double var_x = std::max(sxx_ / w_ - mean_x * mean_x, 0.0);
  if (var_x > (kMinRelativeSpread * mean_x) * (kMinRelativeSpread * mean_x)) {
    const double slope = (sxy_ / w_ - mean_x * mean_y) / var_x;
    const double intercept = mean_y - slope * mean_x;
    if (intercept >= 0 && slope > 0) {
      trusted_intercept_ = intercept;
      intercept_known_ = true;
      fit_ = Fit{intercept, slope};
      return;
    }
  }
  // Not enough spread, or a fit that noise bent: below the last trusted intercept.
  const double slope = (mean_y - trusted_intercept_) / mean_x;
  if (slope > 0) fit_ = Fit{trusted_intercept_, slope};
}

void StepCost::observe(int32_t decode_items, int32_t prefill_tokens, double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds) || decode_items < 0 || prefill_tokens < 0) return;
  if (prefill_tokens == 0) {
    if (decode_items > 0) decode_.observe(decode_items, seconds);
    return;
  }
  if (prefill_tokens < kMinFittedChunk) return;
  // Beside decoding sequences the prompt's share is what decoding alone would
  // not have cost; without a decode cost for this many sequences yet (a line
  // through zero overstates it for more sequences than seen, as a step's
  // fixed overhead scales with it), such a step says nothing.
  double decoding = 0;
  if (decode_items > 0) {
    const std::optional<double> d = decode_seconds(decode_items);
    if (!d) return;
    if (!decode_.intercept_known() && std::abs(decode_items - decode_.mean_x()) > 0.5) return;
    decoding = *d;
  }
  prompt_.observe(prefill_tokens, seconds - decoding);
}

std::optional<double> StepCost::decode_seconds(int32_t k) const {
  const std::optional<DecayedLine::Fit>& line = decode_.fit();
  if (!line) return std::nullopt;
  return line->intercept + line->slope * k;
}

int64_t StepCost::prefill_chunk(double stall_seconds) const {
  const std::optional<DecayedLine::Fit>& cost = prompt_.fit();
  if (!cost) return -1;
  const double within = std::floor((std::max(stall_seconds, 0.0) - cost->intercept) / cost->slope);
  const double efficient = std::ceil(cost->intercept / cost->slope);
  return int64_t(std::min(std::max({within, efficient, 0.0}), kMaxChunk));
}

}  // namespace lazykv
