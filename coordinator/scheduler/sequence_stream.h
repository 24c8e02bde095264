// The channel from the scheduler to the thread answering one request: the
// scheduler pushes its sequences' events (released text, tokens, the finish),
// the request thread waits for them. One per request (shared by its n choices).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace lazykv {

struct TokenInfo {
  int32_t id = -1;
  std::string bytes;  // the token's raw bytes
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  // alternatives' bytes and log-probabilities
  int64_t evicted_slots = 0;  // slots the sequence's policy evicted in the step that sampled it
};

struct SequenceEvent {
  enum class Kind { kToken, kFinish };
  Kind kind = Kind::kToken;
  uint64_t sequence = 0;  // the SequenceHandle id it belongs to
  // Text released now: for kToken what this token completed (may be empty,
  // e.g. part of a UTF-8 character or of a possible stop string); for
  // kFinish the held-back rest.
  std::string text;
  TokenInfo token;  // kToken (with log-probabilities when asked for)
  // kFinish:
  std::string finish_reason;  // "stop", "length", "cancelled" or "error"
  std::string error;          // with "error": what went wrong
  bool unavailable = false;   // with "error": the server could not run it (shutdown, worker down): a 503
  bool invalid_request = false;  // with "error": the worker refused its policy (a 400 when the request chose it)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

class SequenceStream {
 public:
  void push(SequenceEvent event) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
    }
    ready_.notify_all();
  }
  // Every event available now, waiting up to `timeout` for the first one.
  std::vector<SequenceEvent> wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    ready_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    std::vector<SequenceEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<SequenceEvent> events_;
};

}  // namespace lazykv
