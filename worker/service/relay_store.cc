#include "worker/service/relay_store.h"

#include <stdexcept>

namespace lazykv {

RelayStore::RelayStore(Publish publish, std::chrono::milliseconds timeout)
    : publish_(std::move(publish)), timeout_(timeout) {}

void RelayStore::set(const std::string& key, const std::vector<char>& data) {
  {
    std::lock_guard lock(mutex_);
    entries_[key] = data;
  }
  arrived_.notify_all();
  publish_(key, data);
}

std::vector<char> RelayStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard lock(mutex_);
  return entries_.at(key);
}

void RelayStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void RelayStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  std::unique_lock lock(mutex_);
  auto missing = [&]() -> const std::string* {
    for (const std::string& key : keys) {
      if (entries_.count(key) == 0) return &key;
    }
    return nullptr;
  };
  const bool done = arrived_.wait_for(lock, timeout, [&] { return missing() == nullptr || !closed_.empty(); });
  if (const std::string* key = missing()) {
    if (!closed_.empty()) throw std::runtime_error("rendezvous key '" + *key + "' never came: " + closed_);
    if (!done) {
      throw std::runtime_error("rendezvous key '" + *key + "' did not come within " +
                               std::to_string(timeout.count()) + " ms (a rank that never joined?)");
    }
  }
}

void RelayStore::deliver(const std::string& key, std::vector<char> value) {
  {
    std::lock_guard lock(mutex_);
    entries_[key] = std::move(value);
  }
  arrived_.notify_all();
}

void RelayStore::close(const std::string& why) {
  {
    std::lock_guard lock(mutex_);
    if (closed_.empty()) closed_ = why.empty() ? "the relay closed" : why;
  }
  arrived_.notify_all();
}

}  // namespace lazykv
