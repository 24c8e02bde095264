#include "coordinator/worker_client/tensor_parallel_worker.h"

#include <algorithm>
#include <exception>
#include <future>
#include <utility>

#include "common/error.h"

namespace lazykv {
namespace {

std::vector<SeqId> failed_ids(const StepResult& r) {
  std::vector<SeqId> ids;
  for (const auto& f : r.failed) ids.push_back(f.first);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

TensorParallelWorker::TensorParallelWorker(std::vector<TensorParallelRank> ranks, FormGroup form_group)
    : ranks_(std::move(ranks)), form_group_(std::move(form_group)) {
  if (ranks_.empty()) throw Error(ErrorCode::kInvalidArgument, "tensor-parallel worker: no ranks");
  const int world = int(ranks_.size());
  for (int r = 0; r < world; ++r) {
    const WorkerInfo info = ranks_[size_t(r)].executor->info();
    if (info.rank != r || info.world != world) {
      throw Error(ErrorCode::kInvalidArgument,
                  ranks_[size_t(r)].name + " is rank " + std::to_string(info.rank) + " of " +
                      std::to_string(info.world) + ", but it is --worker number " + std::to_string(r) + " of " +
                      std::to_string(world) + ": give one --worker per rank, in rank order, to ranks started with "
                      "--world " + std::to_string(world));
    }
  }
  const WorkerInfo first = ranks_[0].executor->info();
  info_ = first;
  std::map<std::string, std::string> unavailable = first.unavailable_policies;  // on any rank
  for (size_t r = 1; r < ranks_.size(); ++r) {
    const WorkerInfo info = ranks_[r].executor->info();
    unavailable.insert(info.unavailable_policies.begin(), info.unavailable_policies.end());
    if (info.n_vocab != first.n_vocab || info.n_ctx != first.n_ctx || info.n_layer != first.n_layer ||
        info.n_group != first.n_group || info.page_slots != first.page_slots) {
      throw Error(ErrorCode::kInvalidArgument,
                  ranks_[r].name + " (rank " + std::to_string(r) + ") does not serve the same model as " +
                      ranks_[0].name + " (rank 0): start every rank with the same --model, --ctx and flags");
    }
    // Keep the tighter rank: fewer bytes of capacity per KV head it holds.
    const auto per_head = [](const WorkerInfo& i) { return double(i.kv_capacity_bytes) / double(i.n_head_kv); };
    if (info.kv_capacity_bytes > 0 && (info_.kv_capacity_bytes == 0 || per_head(info) < per_head(info_))) info_ = info;
  }
  info_.unavailable_policies = std::move(unavailable);
  if (form_group_) regroup_if_needed(StepPlan{});
}

std::vector<uint64_t> TensorParallelWorker::instances() const {
  std::vector<uint64_t> ids;
  for (const TensorParallelRank& rank : ranks_) ids.push_back(rank.instance ? rank.instance() : 0);
  return ids;
}

void TensorParallelWorker::regroup_if_needed(const StepPlan& plan) {
  if (!form_group_) return;
  const std::vector<uint64_t> now = instances();
  const std::vector<uint64_t> seen = std::exchange(seen_instances_, now);
  bool restart = false;
  std::string restarted;
  for (size_t r = 0; r < formed_instances_.size(); ++r) {
    if (now[r] == formed_instances_[r]) continue;
    restarted += (restarted.empty() ? "" : ", ") + ranks_[r].name;
    restart = restart || now[r] != seen[r];  // a new process, not a heartbeat older than the group
  }
  if (formed_ && !restart) return;
  formed_ = false;
  std::vector<uint64_t> joined = form_group_();  // throws: this step fails, the next one tries again
  formed_ = true;
  formed_instances_ = joined.size() == ranks_.size() ? std::move(joined) : now;
  ++groups_formed_;
  // Every rank dropped its sequences: a step that continues one cannot run.
  const bool continues = std::any_of(plan.items.begin(), plan.items.end(), [&](const StepItem& item) {
    return std::none_of(plan.start.begin(), plan.start.end(), [&](const SequenceStart& s) { return s.seq == item.seq; });
  });
  if (continues && groups_formed_ > 1) {
    throw Error(ErrorCode::kUnavailable,
                "the tensor-parallel group formed again" + (restarted.empty() ? "" : " after " + restarted + " restarted") +
                    "; the sequences it was running are lost");
  }
}

bool TensorParallelWorker::alive() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const TensorParallelRank& r) { return r.executor->alive(); });
}

StepResult TensorParallelWorker::step(const StepPlan& plan) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!ranks_[r].executor->alive()) {
      // Starting the others would leave them waiting for this one in their all-reduce.
      throw Error(ErrorCode::kUnavailable,
                  ranks_[r].name + " (tensor-parallel rank " + std::to_string(r) + ") is down");
    }
  }
  regroup_if_needed(plan);
  std::vector<std::future<StepResult>> others;
  for (size_t r = 1; r < ranks_.size(); ++r) {
    others.push_back(std::async(std::launch::async, [this, r, &plan] { return ranks_[r].executor->step(plan); }));
  }
  std::vector<StepResult> results(ranks_.size());
  std::string errors;
  auto note = [&](size_t r, const std::exception& e) {
    errors += (errors.empty() ? "" : "; ") + ranks_[r].name + " (rank " + std::to_string(r) + "): " + e.what();
  };
  try {
    results[0] = ranks_[0].executor->step(plan);
  } catch (const std::exception& e) {
    note(0, e);
  }
  for (size_t r = 1; r < ranks_.size(); ++r) {
    try {
      results[r] = others[r - 1].get();
    } catch (const std::exception& e) {
      note(r, e);
    }
  }
  // A failed step may have left a rank's communicator broken (a collective
  // timed out, a peer closed its connection): the group forms again before
  // the next step, so the ranks recover without a restart.
  if (!errors.empty()) {
    formed_ = false;
    throw Error(ErrorCode::kUnavailable, "tensor-parallel step failed: " + errors);
  }
  const StepResult& lead = results[0];
  for (size_t r = 1; r < ranks_.size(); ++r) {
    if (results[r].out_of_memory != lead.out_of_memory || failed_ids(results[r]) != failed_ids(lead) ||
        results[r].tokens.size() != lead.tokens.size()) {
      formed_ = false;
      throw Error(ErrorCode::kUnavailable, "tensor-parallel step failed: " + ranks_[r].name + " (rank " +
                                               std::to_string(r) + ") disagrees with " + ranks_[0].name +
                                               " (rank 0) on the step's outcome");
    }
  }
  StepResult result = std::move(results[0]);
  for (size_t r = 1; r < ranks_.size(); ++r) {  // a request any rank refused is invalid
    for (SeqId id : results[r].invalid) {
      if (std::find(result.invalid.begin(), result.invalid.end(), id) == result.invalid.end()) result.invalid.push_back(id);
    }
  }
  // Cache statistics are the group's: every rank holds its own heads' slots.
  for (size_t r = 1; r < ranks_.size(); ++r) {
    result.evicted_slots += results[r].evicted_slots;
    for (size_t t = 0; t < result.tokens.size(); ++t) result.tokens[t].evicted_slots += results[r].tokens[t].evicted_slots;
    result.demoted_slots += results[r].demoted_slots;
    result.promoted_slots += results[r].promoted_slots;
    result.promotion_hits += results[r].promotion_hits;
    result.kv_slots += results[r].kv_slots;
    result.kv_bytes = std::max(result.kv_bytes, results[r].kv_bytes);
    result.kv_pool_bytes = std::max(result.kv_pool_bytes, results[r].kv_pool_bytes);
    result.seconds = std::max(result.seconds, results[r].seconds);
  }
  return result;
}

}  // namespace lazykv
