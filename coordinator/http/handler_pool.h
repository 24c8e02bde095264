// Threads for request handlers, which may block for a whole generation.
// Threads are started as requests need them, up to a maximum; past it,
// tasks wait in arrival order. A thread idle for a while ends, so a burst
// leaves no stacks behind.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace lazykv::http {

class HandlerPool {
 public:
  explicit HandlerPool(int max_threads, std::chrono::milliseconds idle_exit = std::chrono::seconds(30));
  ~HandlerPool();  // join()
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Runs `task` on a pool thread. A task must not throw.
  void submit(std::function<void()> task);
  // Runs what is queued, then ends every thread; submit() after it runs nothing.
  void join();
  int threads() const;

 private:
  void run();
  void join_exited();  // caller holds mutex_

  const int max_threads_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::function<void()>> queue_;
  std::unordered_map<std::thread::id, std::thread> threads_;
  std::vector<std::thread> exited_;  // ended on their own, to be joined
  int idle_ = 0;
  bool stopping_ = false;
};

}  // namespace lazykv::http
