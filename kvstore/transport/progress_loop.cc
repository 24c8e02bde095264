#include "kvstore/transport/progress_loop.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>

#include "kvstore/transport/transport_config.h"

namespace lazykv::transport {

ProgressLoop::ProgressLoop(const TransportOptions& options) {
  config_ = std::make_unique<UcxConfig>();
  apply_transport_options(*config_, options);

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "lazykv";
  context_ = std::make_unique<UcxContext>(*config_, params);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  worker_params.events = UCP_WAKEUP_RX | UCP_WAKEUP_TX | UCP_WAKEUP_RMA;
  worker_ = std::make_unique<UcxWorker>(context_->get(), worker_params);
  check_ucs(ucp_worker_get_efd(worker_->get(), &worker_fd_), "ucp_worker_get_efd");

  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw Error(ErrorCode::kIo, std::string("eventfd: ") + std::strerror(errno));
  // The tick bounds how late a deadline or a keepalive round can run.
  tick_ = std::clamp(options.peer_timeout / 10, std::chrono::milliseconds(5), std::chrono::milliseconds(50));
}

ProgressLoop::~ProgressLoop() {
  if (thread_.joinable()) {
    stop([] { return true; }, std::chrono::milliseconds(0));
  }
  // Tasks nobody ran still own captured state; run them here, where the
  // worker is idle, so their completions (on_sent(false)...) are not lost.
  run_tasks();
  if (wake_fd_ >= 0) close(wake_fd_);
  worker_.reset();
  context_.reset();
}

void ProgressLoop::start(std::function<void()> on_tick) {
  on_tick_ = std::move(on_tick);
  thread_ = std::thread([this] { run(); });
}

void ProgressLoop::stop(std::function<bool()> drained, std::chrono::milliseconds grace) {
  {
    std::lock_guard lock(mutex_);
    drained_ = std::move(drained);
    stop_deadline_ = std::chrono::steady_clock::now() + grace;
  }
  stopping_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  accepting_ = false;
}

bool ProgressLoop::post(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (!accepting_) return false;
    tasks_.push_back(std::move(task));
  }
  wake();
  return true;
}

void ProgressLoop::run_sync(const std::function<void()>& task) {
  if (on_progress_thread() || !thread_.joinable()) {
    task();
    return;
  }
  std::mutex done_mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
  const bool posted = post([&] {
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lock(done_mutex);
    done = true;
    done_cv.notify_all();
  });
  if (!posted) throw Error(ErrorCode::kUnavailable, "kvstore transport is shut down");
  std::unique_lock lock(done_mutex);
  done_cv.wait(lock, [&] { return done; });
  if (error) std::rethrow_exception(error);
}

void ProgressLoop::wake() {
  const uint64_t one = 1;
  // A full counter already means "wake up"; nothing else can fail here.
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

bool ProgressLoop::run_tasks() {
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard lock(mutex_);
    batch.swap(tasks_);
  }
  for (auto& task : batch) task();
  return !batch.empty();
}

void ProgressLoop::run() {
  thread_id_.store(std::this_thread::get_id());
  ucp_worker_h worker = worker_->get();
  for (;;) {
    bool busy = run_tasks();
    while (ucp_worker_progress(worker) != 0) busy = true;
    if (on_tick_) on_tick_();
    if (stopping_.load()) {
      std::lock_guard lock(mutex_);
      if ((drained_ && drained_()) || std::chrono::steady_clock::now() >= stop_deadline_) break;
    }
    if (busy) continue;
    {
      std::lock_guard lock(mutex_);
      if (!tasks_.empty()) continue;
    }
    const ucs_status_t armed = ucp_worker_arm(worker);
    if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
    if (armed != UCS_OK) {
      // Cannot sleep on the fd; fall back to the tick alone.
      std::this_thread::sleep_for(tick_);
      continue;
    }
    pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int timeout = stopping_.load() ? 1 : static_cast<int>(tick_.count());
    if (poll(fds, 2, timeout) > 0 && (fds[1].revents & POLLIN)) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof(count));
    }
  }
  // Tasks posted until now run before the thread ends; later posts are refused.
  {
    std::lock_guard lock(mutex_);
    accepting_ = false;
  }
  run_tasks();
  thread_id_.store(std::thread::id());
}

}  // namespace lazykv::transport
