// One UCX context + worker driven by one progress thread. Only that thread
// touches the worker (UCP_THREAD_MODE_SINGLE): other threads hand work to it
// with post()/run_sync(), which wake it through an eventfd. When idle the
// thread sleeps in poll() on the worker's event fd (ucp_worker_arm) and the
// eventfd, with a short tick so deadlines and UCX keepalive still run.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kvstore/transport/messenger.h"
#include "kvstore/transport/ucx_handles.h"

namespace lazykv::transport {

class ProgressLoop {
 public:
  // Reads the UCX configuration, applies `options` to it (transports,
  // keepalive), creates the context and the worker. Does not start the thread.
  explicit ProgressLoop(const TransportOptions& options);
  ~ProgressLoop();  // stop() if still running
  ProgressLoop(const ProgressLoop&) = delete;
  ProgressLoop& operator=(const ProgressLoop&) = delete;

  ucp_context_h context() const { return context_->get(); }
  ucp_worker_h worker() const { return worker_->get(); }
  std::chrono::milliseconds tick() const { return tick_; }

  // Starts the thread; `on_tick` runs on it after every round of progress.
  void start(std::function<void()> on_tick);
  // Keeps progressing until `drained()` (checked each round on the thread)
  // is true or `grace` passed, then joins the thread. Tasks posted before
  // stop() still run.
  void stop(std::function<bool()> drained, std::chrono::milliseconds grace);

  // Runs `task` on the progress thread. False (and the task is dropped) once
  // the loop has stopped.
  bool post(std::function<void()> task);
  // Runs `task` on the progress thread and waits for it; rethrows what it
  // throws. Inline when called on the progress thread.
  void run_sync(const std::function<void()>& task);
  bool on_progress_thread() const { return std::this_thread::get_id() == thread_id_.load(); }

 private:
  void run();
  bool run_tasks();  // true if any ran
  void wake();

  std::unique_ptr<UcxConfig> config_;
  std::unique_ptr<UcxContext> context_;
  std::unique_ptr<UcxWorker> worker_;
  int worker_fd_ = -1;  // owned by the worker
  int wake_fd_ = -1;    // our eventfd
  std::chrono::milliseconds tick_;

  std::mutex mutex_;
  std::deque<std::function<void()>> tasks_;
  bool accepting_ = true;
  std::function<void()> on_tick_;
  std::function<bool()> drained_;
  std::chrono::steady_clock::time_point stop_deadline_{};
  std::atomic<bool> stopping_{false};
  std::atomic<std::thread::id> thread_id_{};
  std::thread thread_;
};

}  // namespace lazykv::transport
