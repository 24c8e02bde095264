#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <utility>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lazykv {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// How long a worker spins for the next job before parking.
constexpr auto kSpinTime = std::chrono::microseconds(2000);

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  try {
    fn(0, n_threads_);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
  }
  // Always wait: the workers still use fn and whatever it captured.
  for (uint32_t spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    cpu_relax();
    if ((spins & 255) == 255) std::this_thread::yield();  // oversubscribed: let the workers run
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int workers = static_cast<int>(std::min<int64_t>(n_threads_, max_chunks));
  if (workers <= 1) {
    fn(0, n);
    return;
  }
  run([&](int index, int) {
    if (index >= workers) return;
    const int64_t begin = n * index / workers;
    const int64_t end = n * (index + 1) / workers;
    if (begin < end) fn(begin, end);
  });
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
    uint64_t gen;
    for (uint32_t spins = 0; (gen = generation_.load(std::memory_order_acquire)) == seen; ++spins) {
      if (stop_.load(std::memory_order_relaxed)) return;
      cpu_relax();
      if ((spins & 255) == 255) std::this_thread::yield();
      if (std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
        spin_until = std::chrono::steady_clock::now() + kSpinTime;
      }
    }
    seen = gen;
    try {
      (*job_)(index, n_threads_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace lazykv
