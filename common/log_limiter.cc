#include "common/log_limiter.h"

#include <cstdio>
#include <utility>

namespace lazykv {

LogLimiter::LogLimiter(std::string kind, int burst, std::chrono::milliseconds interval, Sink sink)
    : kind_(std::move(kind)), burst_(burst), interval_(interval), sink_(std::move(sink)) {
  if (!sink_) {
    sink_ = [](std::string_view line) { std::fprintf(stderr, "%.*s\n", int(line.size()), line.data()); };
  }
}

void LogLimiter::write(std::string_view line) {
  std::lock_guard lock(mutex_);
  const auto now = Clock::now();
  if (now - window_start_ >= interval_) {
    window_start_ = now;
    written_in_window_ = 0;
  }
  if (written_in_window_ >= burst_) {
    ++held_back_;
    ++suppressed_total_;
    return;
  }
  ++written_in_window_;
  if (held_back_ > 0) {
    sink_("lazykv: " + std::to_string(held_back_) + " more '" + kind_ + "' log lines were suppressed (at most " +
          std::to_string(burst_) + " per " + std::to_string(interval_.count()) + " ms)");
    held_back_ = 0;
  }
  sink_(line);
}

uint64_t LogLimiter::suppressed() const {
  std::lock_guard lock(mutex_);
  return suppressed_total_;
}

}  // namespace lazykv
