#include "worker/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace lazykv {
namespace {

// YaRN: the dimension whose wavelength completes `n_rot_turns` turns over the
// original context (Peng et al. 2023, eq. for the correction range).
float yarn_correction_dim(float n_turns, int dim, float base, int orig_ctx) {
  return float(dim) * std::log(float(orig_ctx) / (n_turns * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

}  // namespace

RopeTable make_rope_table(const ModelConfig& c, const std::vector<float>& freq_factors) {
  const int half = c.n_rot / 2;
  RopeTable t;
  t.inv_freq.resize(size_t(half));
  for (int i = 0; i < half; ++i) {
    t.inv_freq[size_t(i)] = 1.0f / std::pow(c.rope_theta, float(2 * i) / float(c.n_rot));
  }
  switch (c.rope_scaling) {
    case RopeScaling::kNone:
      break;
    case RopeScaling::kLinear:
      for (float& f : t.inv_freq) f /= c.rope_factor;
      break;
    case RopeScaling::kLlama3: {
      if (!freq_factors.empty()) break;  // applied below, as the file states them
      const float low_wavelen = float(c.rope_orig_ctx) / c.rope_low_freq_factor;
      const float high_wavelen = float(c.rope_orig_ctx) / c.rope_high_freq_factor;
      for (float& f : t.inv_freq) {
        const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
          f /= c.rope_factor;
        } else {
          const float smooth = (float(c.rope_orig_ctx) / wavelen - c.rope_low_freq_factor) /
                               (c.rope_high_freq_factor - c.rope_low_freq_factor);
          f = (1.0f - smooth) * f / c.rope_factor + smooth * f;
        }
      }
      break;
    }
    case RopeScaling::kYarn: {
      float low = std::floor(yarn_correction_dim(c.yarn_beta_fast, c.n_rot, c.rope_theta, c.rope_orig_ctx));
      float high = std::ceil(yarn_correction_dim(c.yarn_beta_slow, c.n_rot, c.rope_theta, c.rope_orig_ctx));
      low = std::max(low, 0.0f);
      high = std::min(high, float(c.n_rot - 1));
      if (low == high) high += 0.001f;
      for (int i = 0; i < half; ++i) {
        const float ramp = std::clamp((float(i) - low) / (high - low), 0.0f, 1.0f);
        const float extrapolation = 1.0f - ramp;  // weight of the unscaled frequency
        const float f = t.inv_freq[size_t(i)];
        t.inv_freq[size_t(i)] = f / c.rope_factor * (1.0f - extrapolation) + f * extrapolation;
      }
      t.mscale = 0.1f * std::log(c.rope_factor) + 1.0f;
      break;
    }
  }
  if (!freq_factors.empty()) {
    for (int i = 0; i < half && size_t(i) < freq_factors.size(); ++i) t.inv_freq[size_t(i)] /= freq_factors[size_t(i)];
  }
  return t;
}

}  // namespace lazykv
