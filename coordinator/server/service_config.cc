#include "coordinator/server/service_config.h"

namespace lazykv {

KeyLimiter::Slot KeyLimiter::acquire(const std::string& key) {
  if (limit_ <= 0) return {};
  std::lock_guard lock(mutex_);
  if (in_flight_[key] >= limit_) {
    throw api::ApiError(429, "rate_limit_error",
                        "too many concurrent requests for this API key (the limit is " + std::to_string(limit_) + ")",
                        "", "rate_limit_exceeded");
  }
  ++in_flight_[key];
  return Slot(this, key);
}

void KeyLimiter::release(const std::string& key) {
  std::lock_guard lock(mutex_);
  if (--in_flight_[key] <= 0) in_flight_.erase(key);
}

bool ServiceConfig::accepts_key(std::string_view key) const {
  if (api_keys.empty()) return true;
  for (const std::string& k : api_keys) {
    if (k == key) return true;
  }
  return false;
}

}  // namespace lazykv
