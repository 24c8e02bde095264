// A fixed pool of worker threads that run one parallel job at a time.
// Decode steps issue hundreds of small parallel ops per token, so workers spin
// briefly between jobs instead of sleeping; they park on a condition variable
// after a short idle period so an idle server burns no CPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lazykv {

class ThreadPool {
 public:
  // n_threads includes the calling thread; 0 means all hardware threads.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index, n_threads) on every thread (the caller is index 0)
  // and returns when all have finished. If any thread's fn throws, run()
  // still waits for every thread, then rethrows the first exception.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks of at least `grain` items and runs
  // fn(begin, end) on them in parallel.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;  // first exception of the current job (guarded by mutex_)
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace lazykv
