// The replicas behind a router and the rule that binds a request to one.
//
// Binding is late: a request waits here, in arrival order, until some
// replica that is up has a free slot (at most `max_requests` in flight on
// each), and only then is it sent. Set `max_requests` to the replica's batch
// size and nothing queues inside a replica, so a replica that dies strands
// no queued request: whatever waits here goes to the others.
//
// The rule, for each waiting request in turn:
//   1. the replica that last served its longest known prefix (PrefixAffinity),
//      if that replica is up and its outstanding tokens are within
//      `affinity_slack_tokens` of the least loaded replica's; if that replica
//      is full, the request holds out for it up to `affinity_wait`;
//   2. otherwise the replica with a free slot and the fewest outstanding
//      tokens (prompt estimate plus max_tokens of the requests in flight).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/metrics/registry.h"
#include "coordinator/router/prefix_affinity.h"

namespace lazykv::router {

struct ReplicaSetOptions {
  int max_requests = 32;  // in flight per replica
  int64_t affinity_slack_tokens = 8192;
  std::chrono::milliseconds affinity_wait{1'000};
  size_t affinity_capacity = 100'000;  // keys in the affinity table
  std::chrono::milliseconds affinity_ttl{600'000};
  size_t max_waiting = 4096;  // requests waiting for a slot; more are refused
  metrics::Registry* metrics = nullptr;
};

struct RouteRequest {
  std::vector<uint64_t> keys;  // prefix_keys() of the request text
  int64_t tokens = 0;          // estimated prompt plus generated tokens
  std::vector<int> excluded;   // replicas that already failed this request
};

struct Assignment {
  int replica = -1;
  size_t matched_blocks = 0;  // > 0: chosen by prefix affinity
};

enum class AcquireFailure {
  kNoReplicaUp,
  kEveryReplicaFailed,  // replicas are up, but each one already failed this request
  kQueueFull,
  kTimedOut,
  kCancelled,
};

class ReplicaSet {
 public:
  using Clock = std::chrono::steady_clock;
  // Replicas start down; the health checker brings them up.
  ReplicaSet(std::vector<std::string> names, ReplicaSetOptions options);

  // Waits for a slot (see the rule above) until `deadline` or until
  // `cancelled()` (polled). Fails at once when no replica is up, and for
  // every waiting request once the last one goes down.
  struct Acquired {
    std::optional<Assignment> assignment;
    AcquireFailure failure = AcquireFailure::kTimedOut;  // when !assignment
  };
  Acquired acquire(const RouteRequest& request, Clock::time_point deadline, const std::function<bool()>& cancelled);
  // Ends an acquired slot; `tokens` as in the RouteRequest.
  void release(int replica, int64_t tokens);
  // For a request that takes no slot (GET /v1/models, /tokenize): the up
  // replica with the fewest requests in flight, not in `excluded`; -1 if none.
  int lightest_up(const std::vector<int>& excluded) const;

  // Health, from a failed connection (down) or a probe that began at
  // `probed_at`; true when it changed. A probe that began before the last
  // failure is ignored: it answered before the replica died.
  bool set_up(int replica, bool up, Clock::time_point probed_at = Clock::now());
  bool any_up() const;

  struct ReplicaState {
    std::string name;
    bool up = false;
    int in_flight = 0;
    int64_t outstanding_tokens = 0;
    Clock::time_point failed_at{};  // the last time it was found down
  };
  std::vector<ReplicaState> snapshot() const;
  size_t waiting() const;
  const std::string& name(int replica) const { return replicas_[size_t(replica)].name; }
  int size() const { return int(replicas_.size()); }

 private:
  struct Waiter {
    const RouteRequest* request;
    Clock::time_point since;
    std::optional<Assignment> assigned;
  };
  int choose_locked(const Waiter& w, Clock::time_point now) const;
  bool has_free_slot_locked() const;
  void assign_waiting_locked(Clock::time_point now);
  void publish_locked(int replica);

  ReplicaSetOptions options_;
  // Each replica's gauges, looked up once (none without options_.metrics).
  struct ReplicaGauges {
    metrics::Gauge *up, *in_flight, *outstanding_tokens;
  };
  std::vector<ReplicaGauges> gauges_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<ReplicaState> replicas_;
  std::list<Waiter*> waiting_;  // arrival order
  int rotation_ = 0;             // where the search for the least loaded replica starts
  uint64_t version_ = 0;         // bumped by every arrival, release and health change
  uint64_t scanned_version_ = 0; // version_ at the last scan of waiting_
  Clock::time_point scanned_at_{};
  PrefixAffinity affinity_;
};

}  // namespace lazykv::router
