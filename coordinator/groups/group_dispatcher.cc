#include "coordinator/groups/group_dispatcher.h"

#include <algorithm>
#include <limits>
#include <string_view>

#include "common/error.h"

namespace lazykv {
namespace {

// A prompt's chain keys: its token ids as bytes, so a 256-byte block of the
// router's is 64 tokens, the prefix cache's block.
std::vector<uint64_t> token_prefix_keys(const std::vector<int32_t>& prompt) {
  static_assert(router::kPrefixBlockBytes == 64 * sizeof(int32_t));
  return router::prefix_keys("", std::string_view(reinterpret_cast<const char*>(prompt.data()),
                                                  prompt.size() * sizeof(int32_t)));
}

void check_same_model(const WorkerInfo& first, const WorkerInfo& other, size_t g) {
  if (other.n_ctx == first.n_ctx && other.n_vocab == first.n_vocab &&
      other.kv_bytes_per_token == first.kv_bytes_per_token && other.kv_page_bytes == first.kv_page_bytes &&
      other.page_slots == first.page_slots && other.n_layer == first.n_layer && other.n_head_kv == first.n_head_kv &&
      other.n_group == first.n_group &&
      other.unavailable_policies == first.unavailable_policies) {
    return;
  }
  throw Error(ErrorCode::kInvalidArgument, "group " + std::to_string(g) +
                                               " serves a different model or context than group 0: start every "
                                               "group's workers with the same --model and --ctx");
}

}  // namespace

GroupDispatcher::GroupDispatcher(const std::vector<DispatchGroup>& groups, const Tokenizer& tokenizer,
                                 metrics::Registry& metrics, const SchedulerOptions& scheduler_options,
                                 const GroupDispatcherOptions& options)
    : options_(options), affinity_(options.affinity_capacity, options.affinity_ttl) {
  if (groups.empty()) throw Error(ErrorCode::kInvalidArgument, "a dispatcher needs at least one group");
  info_ = groups.front().executor->info();
  for (size_t g = 1; g < groups.size(); ++g) {
    const WorkerInfo other = groups[g].executor->info();
    check_same_model(info_, other, g);
    // 0 is unbounded: the smallest bounded capacity is what every group can take.
    if (info_.kv_capacity_bytes == 0 || (other.kv_capacity_bytes > 0 && other.kv_capacity_bytes < info_.kv_capacity_bytes)) {
      info_.kv_capacity_bytes = other.kv_capacity_bytes;
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    SchedulerOptions o = scheduler_options;
    o.worker_label = groups[g].label;
    o.first_id = g + 1;
    o.id_stride = groups.size();
    o.hand_over = [this, g](UnstartedSequence& s) { return hand_over(int(g), s); };
    schedulers_.push_back(std::make_unique<Scheduler>(*groups[g].executor, tokenizer, metrics, o));
  }
}

GroupDispatcher::~GroupDispatcher() { stop("the server is shutting down"); }

bool GroupDispatcher::usable(int g) const {
  const Scheduler& s = *schedulers_[size_t(g)];
  return s.worker_alive() && !s.draining();
}

std::vector<int> GroupDispatcher::by_load_locked(int except) const {
  std::vector<std::pair<int64_t, int>> loads;
  for (int i = 0; i < size(); ++i) {
    const int g = (rotation_ + i) % size();
    if (g != except && usable(g)) loads.emplace_back(schedulers_[size_t(g)]->outstanding_tokens(), g);
  }
  std::stable_sort(loads.begin(), loads.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<int> order;
  for (const auto& [load, g] : loads) order.push_back(g);
  return order;
}

int GroupDispatcher::choose_locked(const std::vector<uint64_t>& keys, router::PrefixAffinity::Clock::time_point now) {
  const std::vector<int> order = by_load_locked(-1);
  if (order.empty()) return -1;
  const int least = order.front();
  const auto match = affinity_.longest(keys, now, [this](int g) { return usable(g); });
  const int64_t slack = schedulers_[size_t(least)]->outstanding_tokens() + options_.affinity_slack_tokens;
  const bool home = match.replica >= 0 && schedulers_[size_t(match.replica)]->outstanding_tokens() <= slack;
  const int chosen = home ? match.replica : least;
  // A request spilling over from its busy home does not move its prefix's home.
  affinity_.record(keys, chosen, now, /*keep_known=*/!home);
  rotation_ = (chosen + 1) % size();
  return chosen;
}

int GroupDispatcher::choose(const std::vector<int32_t>& prompt) {
  const std::vector<uint64_t> keys = token_prefix_keys(prompt);
  std::lock_guard lock(mutex_);
  return choose_locked(keys, router::PrefixAffinity::Clock::now());
}

std::vector<SequenceHandle> GroupDispatcher::submit(std::vector<SequenceRequest> requests) {
  if (requests.empty()) return {};
  const int chosen = choose(requests.front().prompt);
  if (chosen < 0) throw Error(ErrorCode::kUnavailable, "no group's workers are up; retry later");
  try {
    return schedulers_[size_t(chosen)]->submit(requests);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kUnavailable) throw;  // it could run nowhere
    // Its queue is full or it began draining: the others, least loaded first.
    for (const int g : others_by_load(chosen)) {
      try {
        return schedulers_[size_t(g)]->submit(requests);
      } catch (const Error& other) {
        if (other.code() != ErrorCode::kUnavailable) throw;
      }
    }
    throw;
  }
}

std::vector<int> GroupDispatcher::others_by_load(int except) {
  std::lock_guard lock(mutex_);
  return by_load_locked(except);
}

bool GroupDispatcher::hand_over(int from, UnstartedSequence& s) {
  // Under the lock a cancel takes first: either it came before (the sequence
  // stays, and its own scheduler finishes it as cancelled) or it reaches the
  // new scheduler after the adoption.
  std::lock_guard lock(mutex_);
  if (recent_cancels_.contains(s.id)) return false;
  for (const int g : by_load_locked(from)) {
    if (schedulers_[size_t(g)]->adopt(s)) return true;
  }
  return false;
}

void GroupDispatcher::cancel(uint64_t id) {
  constexpr size_t kRecentCancels = 4096;
  std::lock_guard lock(mutex_);
  if (recent_cancels_.insert(id).second) cancel_order_.push_back(id);
  if (cancel_order_.size() > kRecentCancels) {
    recent_cancels_.erase(cancel_order_.front());
    cancel_order_.pop_front();
  }
  for (auto& s : schedulers_) s->cancel(id);
}

void GroupDispatcher::drain() {
  for (auto& s : schedulers_) s->drain();
}

void GroupDispatcher::stop(const std::string& reason) {
  for (auto& s : schedulers_) s->stop(reason);
}

size_t GroupDispatcher::running() const {
  size_t n = 0;
  for (const auto& s : schedulers_) n += s->running();
  return n;
}

size_t GroupDispatcher::waiting() const {
  size_t n = 0;
  for (const auto& s : schedulers_) n += s->waiting();
  return n;
}

}  // namespace lazykv
