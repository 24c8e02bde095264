// lazykv coordinator: the OpenAI-compatible HTTP API, tokenizer and
// continuous-batching scheduler, with the model running in a separate
// `lazykv worker` process reached over gRPC. The same serving stack as
// `lazykv serve`; only the StepExecutor is remote. Serves until SIGTERM or
// SIGINT, then drains like serve. Given `--worker` once per rank of a
// tensor-parallel group (in rank order), it sends every step to all of them.
// Given `--group` several times (each one group's ranks), it runs a scheduler
// per group and spreads requests over them (GroupDispatcher).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "cli/serving.h"
#include "common/error.h"
#include "common/model_registry.h"
#include "coordinator/groups/group_dispatcher.h"
#include "coordinator/worker_client/group_rendezvous.h"
#include "coordinator/worker_client/remote_worker.h"
#include "coordinator/worker_client/tensor_parallel_worker.h"
#include "eval/policy_grid.h"
#include "worker/format/gguf.h"
#include "worker/format/synthetic_model.h"

namespace lazykv {
namespace {

// Only the tokenizer (and chat template): the coordinator never runs the model,
// so its weights are not loaded.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (is_synthetic_name(path)) return std::make_unique<Tokenizer>(synthetic_model_tokenizer(path));
  if (std::filesystem::is_directory(path)) {
    return std::make_unique<Tokenizer>(Tokenizer::spec_from_hf_json(path + "/tokenizer.json"));
  }
  const GgufFile gguf = GgufFile::open(path);
  return std::make_unique<Tokenizer>(tokenizer_spec_from_gguf(gguf));
}

// One group's ranks: a RemoteWorker (with its own heartbeats) per rank and,
// with several, the tensor-parallel group that sends every step to all.
struct ConnectedGroup {
  std::vector<RemoteWorker*> ranks;
  std::unique_ptr<TensorParallelWorker> tensor_parallel;
  std::vector<std::unique_ptr<RemoteWorker>> single;  // the one rank when there is no tensor-parallel group
  StepExecutor* executor = nullptr;
  std::string label;  // its step metrics' `worker` label

  bool alive() const {
    for (const RemoteWorker* r : ranks) {
      if (!r->alive()) return false;
    }
    return true;
  }
};

// `prefix` names the group's ranks in the metrics: "" with one group (ranks
// "0", "1", ...), "G." with several.
ConnectedGroup connect_group(const std::vector<std::string>& addresses, const std::string& prefix,
                             RemoteWorkerOptions options, std::chrono::milliseconds tp_timeout) {
  ConnectedGroup group;
  group.label = prefix + "0";
  std::vector<std::unique_ptr<RemoteWorker>> owned;
  for (size_t r = 0; r < addresses.size(); ++r) {
    RemoteWorkerOptions rank_options = options;
    rank_options.label = prefix + std::to_string(r);
    std::fprintf(stderr, "lazykv coordinator: connecting to worker %s\n", addresses[r].c_str());
    owned.push_back(std::make_unique<RemoteWorker>(addresses[r], rank_options));
    group.ranks.push_back(owned.back().get());
  }
  if (owned.size() == 1) {
    const WorkerInfo info = owned[0]->info();
    if (info.world != 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "worker " + addresses[0] + " is rank " + std::to_string(info.rank) + " of " + std::to_string(info.world) +
                      ": give the coordinator one --worker per rank (or a --group of every rank), in rank order");
    }
    group.executor = owned[0].get();
    group.single = std::move(owned);
    return group;
  }
  std::vector<TensorParallelRank> members;
  std::vector<GroupRank> group_ranks;
  for (auto& r : owned) {
    RemoteWorker* raw = r.get();
    group_ranks.push_back({raw->channel(), "worker " + raw->address()});
    members.push_back({std::move(r), "worker " + raw->address(), [raw] { return raw->instance_id(); }});
  }
  auto form = [group_ranks, tp_timeout] {
    std::fprintf(stderr, "lazykv coordinator: forming the tensor-parallel group of %zu ranks\n", group_ranks.size());
    std::vector<uint64_t> instances = form_tensor_parallel_group(group_ranks, tp_timeout);
    std::fprintf(stderr, "lazykv coordinator: the tensor-parallel group formed\n");
    return instances;
  };
  group.tensor_parallel = std::make_unique<TensorParallelWorker>(std::move(members), form);
  group.executor = group.tensor_parallel.get();
  return group;
}

// --group "A,B" (repeated), or the --worker flags as one group.
std::vector<std::vector<std::string>> group_addresses(const Flags& flags) {
  std::vector<std::vector<std::string>> groups;
  for (const std::string& spec : flags.get_all("group")) {
    groups.push_back(eval::split_list(spec));
    if (groups.back().empty()) throw Error(ErrorCode::kInvalidArgument, "--group '" + spec + "' names no worker");
  }
  std::vector<std::string> workers = flags.get_all("worker");
  if (!groups.empty()) {
    if (!workers.empty()) throw Error(ErrorCode::kInvalidArgument, "give either --worker or --group, not both");
    return groups;
  }
  if (workers.empty()) workers.push_back(flags.get("worker"));
  return {workers};
}

}  // namespace

int run_coordinator(const std::vector<std::string>& args) {
  Flags flags("coordinator");
  flags.add("model", "default", "the model the worker serves (its tokenizer and chat template are read here)")
      .add("worker", "127.0.0.1:7001",
           "HOST:PORT of the `lazykv worker` to run steps on; repeat it for each rank of a tensor-parallel group, "
           "in rank order (`lazykv worker --rank R --world N`)")
      .add("group", "",
           "HOST:PORT[,HOST:PORT...]: the ranks of one group, in rank order; repeat it to drive several groups, "
           "each with its own batch, requests going to the group that ran their prompt's start recently or else "
           "the least loaded (instead of --worker)")
      .add("connect-timeout", "60", "seconds to wait for the worker at start")
      .add("step-timeout", "120", "seconds one step may take on the worker before it counts as failed")
      .add("heartbeat-interval-ms", "1000", "milliseconds between heartbeats to the worker")
      .add("heartbeat-misses", "3", "missed heartbeats in a row before the worker is declared dead")
      .add("tp-timeout", "30",
           "with several ranks in a group: seconds the ranks' rendezvous (arranged here) and each all-reduce may wait for a "
           "peer");
  add_serving_flags(flags);
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  RemoteWorkerOptions remote_options;
  remote_options.connect_timeout = millis_flag(flags, "connect-timeout", 1000);
  remote_options.step_timeout = millis_flag(flags, "step-timeout", 1000);
  remote_options.heartbeat_interval = millis_flag(flags, "heartbeat-interval-ms", 1);
  remote_options.heartbeat_misses = int(flags.get_int("heartbeat-misses"));

  const std::string model_path = resolve_model_path(flags.get("model"));
  const ServiceConfig service = service_config_from_flags(flags, model_path);
  const sigset_t signals = block_termination_signals();

  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(model_path);
  metrics::Registry registry;
  std::atomic<OpenAiService*> api_ready{nullptr};  // /ready follows the worker once the API exists
  remote_options.metrics = &registry;
  const auto addresses = group_addresses(flags);
  const bool several = addresses.size() > 1;
  // /ready: some group has all its ranks up. Heartbeats start before the
  // groups are all connected, so readiness updates wait for that.
  std::vector<ConnectedGroup> groups;
  std::atomic<bool> groups_ready{false};
  auto any_alive = [&groups] {
    return std::any_of(groups.begin(), groups.end(), [](const ConnectedGroup& g) { return g.alive(); });
  };
  remote_options.on_alive_change = [&api_ready, &groups_ready, &any_alive](bool) {
    if (!groups_ready.load()) return;
    if (OpenAiService* api = api_ready.load()) api->set_ready(any_alive());
  };
  groups.reserve(addresses.size());
  for (size_t g = 0; g < addresses.size(); ++g) {
    groups.push_back(connect_group(addresses[g], several ? std::to_string(g) + "." : "", remote_options,
                                   millis_flag(flags, "tp-timeout", 1000)));
  }
  groups_ready = true;
  // Stops the heartbeat callbacks' readiness updates before the ranks go away.
  struct StopReadyUpdates {
    std::atomic<bool>& flag;
    ~StopReadyUpdates() { flag = false; }
  } stop_ready_updates{groups_ready};
  const WorkerInfo info = groups[0].executor->info();
  if (info.n_vocab != tokenizer->n_vocab()) {
    throw Error(ErrorCode::kInvalidArgument,
                "worker " + groups[0].ranks[0]->address() + " samples from " + std::to_string(info.n_vocab) +
                    " tokens but --model's tokenizer has " + std::to_string(tokenizer->n_vocab()) +
                    ": start the worker and the coordinator with the same --model");
  }
  std::string worker_names;
  for (const ConnectedGroup& group : groups) {
    std::string names;
    for (const RemoteWorker* r : group.ranks) names += (names.empty() ? "" : ", ") + r->address();
    worker_names += (worker_names.empty() ? "" : "; ") + (several ? "[" + names + "]" : names);
  }

  SchedulerOptions scheduler_options = scheduler_options_from_flags(flags);
  std::unique_ptr<SequenceQueue> queue;
  if (several) {
    std::vector<DispatchGroup> dispatch;
    for (const ConnectedGroup& group : groups) dispatch.push_back({group.executor, group.label});
    queue = std::make_unique<GroupDispatcher>(dispatch, *tokenizer, registry, scheduler_options);
  } else {
    scheduler_options.worker_label = groups[0].label;
    queue = std::make_unique<Scheduler>(*groups[0].executor, *tokenizer, registry, scheduler_options);
  }
  ServeOptions options;
  options.role = "coordinator";
  const bool tensor_parallel = groups[0].ranks.size() > 1;
  options.detail = "kv policy " + service.default_policy.to_string() +
                   (several ? ", groups " : tensor_parallel ? ", tensor-parallel workers " : ", worker ") + worker_names;
  options.live_api = &api_ready;
  options.ready = any_alive();
  return serve_until_signal(flags, signals, *tokenizer, *queue, registry, service, options);
}

}  // namespace lazykv
