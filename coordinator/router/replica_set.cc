#include "coordinator/router/replica_set.h"

#include <algorithm>
#include <limits>

#include "common/metrics/metric_names.h"

namespace lazykv::router {
namespace {

// How often a waiting request looks again without being woken: bounds the
// delay of affinity_wait running out and of cancelled() turning true.
constexpr auto kWaitPoll = std::chrono::milliseconds(20);

bool contains(const std::vector<int>& values, int value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

}  // namespace

ReplicaSet::ReplicaSet(std::vector<std::string> names, ReplicaSetOptions options)
    : options_(options), affinity_(options.affinity_capacity, options.affinity_ttl) {
  for (std::string& name : names) {
    if (options_.metrics) {
      metrics::Registry& m = *options_.metrics;
      gauges_.push_back({&m.gauge(metrics::kRouterReplicaUp, {name}), &m.gauge(metrics::kRouterInFlight, {name}),
                         &m.gauge(metrics::kRouterOutstandingTokens, {name})});
    }
    replicas_.push_back({std::move(name), false, 0, 0, {}});
  }
  std::lock_guard lock(mutex_);
  for (int r = 0; r < size(); ++r) publish_locked(r);
}

int ReplicaSet::choose_locked(const Waiter& w, Clock::time_point now) const {
  const RouteRequest& request = *w.request;
  auto usable = [&](int r) { return replicas_[size_t(r)].up && !contains(request.excluded, r); };
  int least = -1;
  int64_t least_load = std::numeric_limits<int64_t>::max();  // over usable replicas, full or not
  for (int i = 0; i < size(); ++i) {
    const int r = (rotation_ + i) % size();  // ties go round the replicas
    if (!usable(r)) continue;
    const ReplicaState& s = replicas_[size_t(r)];
    least_load = std::min(least_load, s.outstanding_tokens);
    if (s.in_flight >= options_.max_requests) continue;
    if (least < 0 || s.outstanding_tokens < replicas_[size_t(least)].outstanding_tokens) least = r;
  }
  const PrefixAffinity::Match match = affinity_.longest(request.keys, now, usable);
  if (match.replica >= 0) {
    const ReplicaState& s = replicas_[size_t(match.replica)];
    if (s.outstanding_tokens <= least_load + options_.affinity_slack_tokens) {
      if (s.in_flight < options_.max_requests) return match.replica;
      if (now - w.since < options_.affinity_wait) return -1;  // hold out for it
    }
  }
  return least;
}

bool ReplicaSet::has_free_slot_locked() const {
  return std::any_of(replicas_.begin(), replicas_.end(),
                     [this](const ReplicaState& s) { return s.up && s.in_flight < options_.max_requests; });
}

void ReplicaSet::assign_waiting_locked(Clock::time_point now) {
  scanned_at_ = now;
  scanned_version_ = version_;
  if (waiting_.empty() || !has_free_slot_locked()) return;  // a saturated router scans nothing
  bool any = false;
  // Two passes in arrival order: first the requests that can go to their
  // prefix's replica, and those that have waited affinity_wait already, so
  // a freed slot goes to a request at home there before one spilling over
  // from a full replica, and a request without a prefix is not passed over
  // for long; then the rest.
  for (const bool first_pass : {true, false}) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      Waiter& w = **it;
      const int r = choose_locked(w, now);
      const PrefixAffinity::Match match = affinity_.longest(w.request->keys, now, [r](int m) { return m == r; });
      const bool home = r >= 0 && match.replica == r;
      const bool due = home || now - w.since >= options_.affinity_wait;
      if (r < 0 || (first_pass && !due)) {
        ++it;  // a later request may prefer a replica that has a slot
        continue;
      }
      w.assigned = Assignment{r, home ? match.blocks : 0};
      affinity_.record(w.request->keys, r, now, /*keep_known=*/!home);
      ReplicaState& s = replicas_[size_t(r)];
      ++s.in_flight;
      s.outstanding_tokens += w.request->tokens;
      rotation_ = (r + 1) % size();
      publish_locked(r);
      it = waiting_.erase(it);
      any = true;
    }
  }
  if (any) changed_.notify_all();
}

ReplicaSet::Acquired ReplicaSet::acquire(const RouteRequest& request, Clock::time_point deadline,
                                         const std::function<bool()>& cancelled) {
  std::unique_lock lock(mutex_);
  auto any_usable = [&] {
    for (int r = 0; r < size(); ++r) {
      if (replicas_[size_t(r)].up && !contains(request.excluded, r)) return true;
    }
    return false;
  };
  auto none_left = [&] {
    const bool any_up = std::any_of(replicas_.begin(), replicas_.end(), [](const ReplicaState& s) { return s.up; });
    return any_up ? AcquireFailure::kEveryReplicaFailed : AcquireFailure::kNoReplicaUp;
  };
  if (!any_usable()) return {std::nullopt, none_left()};
  Waiter w{&request, Clock::now(), std::nullopt};
  waiting_.push_back(&w);
  ++version_;
  auto give_up = [&](AcquireFailure why) {
    waiting_.remove(&w);
    if (options_.metrics) options_.metrics->gauge(metrics::kRouterWaiting).set(double(waiting_.size()));
    return Acquired{std::nullopt, why};
  };
  try {
    for (bool first = true;; first = false) {
      const auto now = Clock::now();
      // One scan serves every waiter: run it when something changed or the
      // poll period passed (a hold-out may have run out), not per waiter.
      if (version_ != scanned_version_ || now - scanned_at_ >= kWaitPoll) assign_waiting_locked(now);
      if (w.assigned) return {w.assigned, AcquireFailure::kTimedOut};
      if (first && waiting_.size() > options_.max_waiting) return give_up(AcquireFailure::kQueueFull);
      if (options_.metrics) options_.metrics->gauge(metrics::kRouterWaiting).set(double(waiting_.size()));
      if (!any_usable()) return give_up(none_left());
      if (now >= deadline) return give_up(AcquireFailure::kTimedOut);
      if (cancelled && cancelled()) return give_up(AcquireFailure::kCancelled);
      changed_.wait_until(lock, std::min(deadline, now + kWaitPoll));
    }
  } catch (...) {
    if (!w.assigned) waiting_.remove(&w);  // never leave a pointer to this frame behind
    throw;
  }
}

int ReplicaSet::lightest_up(const std::vector<int>& excluded) const {
  std::lock_guard lock(mutex_);
  int lightest = -1;
  for (int r = 0; r < size(); ++r) {
    const ReplicaState& s = replicas_[size_t(r)];
    if (!s.up || contains(excluded, r)) continue;
    if (lightest < 0 || s.in_flight < replicas_[size_t(lightest)].in_flight) lightest = r;
  }
  return lightest;
}

void ReplicaSet::release(int replica, int64_t tokens) {
  std::lock_guard lock(mutex_);
  ReplicaState& s = replicas_[size_t(replica)];
  --s.in_flight;
  s.outstanding_tokens -= tokens;
  publish_locked(replica);
  ++version_;
  assign_waiting_locked(Clock::now());
}

bool ReplicaSet::set_up(int replica, bool up, Clock::time_point probed_at) {
  std::lock_guard lock(mutex_);
  ReplicaState& s = replicas_[size_t(replica)];
  if (!up) s.failed_at = std::max(s.failed_at, probed_at);
  if (s.up == up || (up && probed_at < s.failed_at)) return false;
  s.up = up;
  publish_locked(replica);
  ++version_;
  assign_waiting_locked(Clock::now());
  changed_.notify_all();  // waiters re-check whether any replica is left
  return true;
}

bool ReplicaSet::any_up() const {
  std::lock_guard lock(mutex_);
  return std::any_of(replicas_.begin(), replicas_.end(), [](const ReplicaState& s) { return s.up; });
}

std::vector<ReplicaSet::ReplicaState> ReplicaSet::snapshot() const {
  std::lock_guard lock(mutex_);
  return replicas_;
}

size_t ReplicaSet::waiting() const {
  std::lock_guard lock(mutex_);
  return waiting_.size();
}

void ReplicaSet::publish_locked(int replica) {
  if (gauges_.empty()) return;
  const ReplicaState& s = replicas_[size_t(replica)];
  const ReplicaGauges& g = gauges_[size_t(replica)];
  g.up->set(s.up ? 1 : 0);
  g.in_flight->set(s.in_flight);
  g.outstanding_tokens->set(double(s.outstanding_tokens));
}

}  // namespace lazykv::router
