// The Gloo rendezvous store of a rank whose group the coordinator arranges
// (the JoinGroup call of lazykv.worker.v1): this rank's entries go to the
// coordinator through `publish`, which relays them to every peer; the peers'
// entries arrive through deliver(). Lookups wait for a key until the timeout,
// or until close() (the coordinator's stream ended), and then throw.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace lazykv {

class RelayStore final : public gloo::rendezvous::Store {
 public:
  using Publish = std::function<void(const std::string& key, const std::vector<char>& value)>;
  RelayStore(Publish publish, std::chrono::milliseconds timeout);

  // Store: set publishes (and keeps the entry, so this rank can read its own).
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // A peer's entry, relayed by the coordinator.
  void deliver(const std::string& key, std::vector<char> value);
  // No more entries will come: waiting lookups throw `why`.
  void close(const std::string& why);

 private:
  const Publish publish_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::string, std::vector<char>> entries_;
  std::string closed_;  // why no more entries come; empty while open
};

}  // namespace lazykv
