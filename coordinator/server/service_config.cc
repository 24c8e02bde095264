#include "coordinator/server/service_config.h"

#include <algorithm>
#include <cctype>

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

namespace {

// Takes time that depends only on the lengths, so response times do not tell
// how much of a guessed key was right.
bool equal_in_constant_time(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= unsigned(x ^ y);
  }
  return diff == 0;
}

bool is_space(char c) { return c == ' ' || c == '\t'; }

}  // namespace

bool ServiceConfig::accepts_key(std::string_view key) const {
  if (api_keys.empty()) return true;
  bool accepted = false;
  for (const std::string& k : api_keys) accepted |= equal_in_constant_time(k, key);  // no early exit either
  return accepted;
}

std::optional<std::string> ServiceConfig::key_of_authorization(std::string_view header) const {
  if (api_keys.empty()) return std::string();
  // RFC 7235: the scheme is case-insensitive and spaces separate it from the credentials.
  constexpr std::string_view kScheme = "bearer";
  if (header.size() <= kScheme.size() || !is_space(header[kScheme.size()])) return std::nullopt;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(header[i])) != kScheme[i]) return std::nullopt;
  }
  std::string_view key = header.substr(kScheme.size());
  while (!key.empty() && is_space(key.front())) key.remove_prefix(1);
  while (!key.empty() && is_space(key.back())) key.remove_suffix(1);
  if (!accepts_key(key)) return std::nullopt;
  return std::string(key);
}

void ServiceConfig::check_model(const std::string& model) const {
  if (model != model_id) {
    throw api::ApiError(404, "invalid_request_error",
                        "The model '" + model + "' does not exist; this server serves '" + model_id + "'", "model",
                        "model_not_found");
  }
}

}  // namespace lazykv
