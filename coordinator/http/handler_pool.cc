#include "coordinator/http/handler_pool.h"

#include <system_error>
#include <utility>

namespace lazykv::http {

HandlerPool::HandlerPool(int max_threads, std::chrono::milliseconds idle_exit)
    : max_threads_(max_threads < 1 ? 1 : max_threads), idle_exit_(idle_exit) {}

HandlerPool::~HandlerPool() { join(); }

void HandlerPool::submit(std::function<void()> task) {
  std::lock_guard lock(mutex_);
  if (stopping_) return;
  join_exited();
  queue_.push_back(std::move(task));
  if (idle_ >= int(queue_.size()) || int(threads_.size()) >= max_threads_) {
    work_.notify_one();
    return;
  }
  try {
    std::thread thread([this] { run(); });
    const std::thread::id id = thread.get_id();
    threads_.emplace(id, std::move(thread));
  } catch (const std::system_error&) {
    // No thread to be had now: the task waits for a running one. With none
    // running it would wait forever, so it runs here instead.
    if (threads_.empty()) {
      std::function<void()> now = std::move(queue_.back());
      queue_.pop_back();
      mutex_.unlock();
      now();
      mutex_.lock();
    }
  }
}

void HandlerPool::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    ++idle_;
    const bool woke = work_.wait_for(lock, idle_exit_, [&] { return stopping_ || !queue_.empty(); });
    --idle_;
    if (queue_.empty()) {
      if (!woke && !stopping_) {  // idle too long: end, to be joined by the next submit or join()
        auto self = threads_.find(std::this_thread::get_id());
        exited_.push_back(std::move(self->second));
        threads_.erase(self);
        return;
      }
      if (stopping_) return;
      continue;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // its captures end on this thread, before the next wait
    lock.lock();
  }
}

void HandlerPool::join_exited() {
  for (std::thread& thread : exited_) thread.join();  // returned from run(), or about to
  exited_.clear();
}

void HandlerPool::join() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    work_.notify_all();
    for (auto& [id, thread] : threads_) threads.push_back(std::move(thread));
    threads_.clear();
    for (std::thread& thread : exited_) threads.push_back(std::move(thread));
    exited_.clear();
  }
  for (std::thread& thread : threads) thread.join();
}

int HandlerPool::threads() const {
  std::lock_guard lock(mutex_);
  return int(threads_.size());
}

}  // namespace lazykv::http
