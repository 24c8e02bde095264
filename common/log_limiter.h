// Rate limit for one kind of log line, so that a client repeating a bad
// request cannot flood the log: at most `burst` lines per `interval`. Lines
// held back are counted; the first line written after them says how many.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace lazykv {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  // Receives each line to write, without its newline. Default: stderr.
  using Sink = std::function<void(std::string_view line)>;

  // `kind` names the lines in the suppression note ("unknown request field").
  LogLimiter(std::string kind, int burst, std::chrono::milliseconds interval, Sink sink = {});

  // Writes `line`, or counts it if this interval's burst is spent. Thread-safe.
  void write(std::string_view line);
  // Lines held back since the start.
  uint64_t suppressed() const;

 private:
  std::string kind_;
  int burst_;
  std::chrono::milliseconds interval_;
  Sink sink_;
  mutable std::mutex mutex_;
  Clock::time_point window_start_{};
  int written_in_window_ = 0;
  uint64_t held_back_ = 0;  // since the last note
  uint64_t suppressed_total_ = 0;
};

}  // namespace lazykv
