// lazykv coordinator: the OpenAI-compatible HTTP API, tokenizer and
// continuous-batching scheduler, with the model running in a separate
// `lazykv worker` process reached over gRPC. The same serving stack as
// `lazykv serve`; only the StepExecutor is remote. Serves until SIGTERM or
// SIGINT, then drains like serve. Given `--worker` once per rank of a
// tensor-parallel group (in rank order), it sends every step to all of them.
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
#include "coordinator/worker_client/group_rendezvous.h"
#include "coordinator/worker_client/remote_worker.h"
#include "coordinator/worker_client/tensor_parallel_worker.h"
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

}  // namespace

int run_coordinator(const std::vector<std::string>& args) {
  Flags flags("coordinator");
  flags.add("model", "default", "the model the worker serves (its tokenizer and chat template are read here)")
      .add("worker", "127.0.0.1:7001",
           "HOST:PORT of the `lazykv worker` to run steps on; repeat it for each rank of a tensor-parallel group, "
           "in rank order (`lazykv worker --rank R --world N`)")
      .add("connect-timeout", "60", "seconds to wait for the worker at start")
      .add("step-timeout", "120", "seconds one step may take on the worker before it counts as failed")
      .add("heartbeat-interval-ms", "1000", "milliseconds between heartbeats to the worker")
      .add("heartbeat-misses", "3", "missed heartbeats in a row before the worker is declared dead")
      .add("tp-timeout", "30",
           "with several --worker: seconds the ranks' rendezvous (arranged here) and each all-reduce may wait for a "
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
  remote_options.label = "0";
  remote_options.log = [](const std::string& line) { std::fprintf(stderr, "lazykv coordinator: %s\n", line.c_str()); };
  std::vector<std::string> addresses = flags.get_all("worker");
  if (addresses.empty()) addresses.push_back(flags.get("worker"));
  // One RemoteWorker (with its own heartbeats) per rank; /ready needs them all.
  std::vector<RemoteWorker*> ranks;
  std::vector<std::unique_ptr<RemoteWorker>> owned_ranks;
  auto all_alive = [&ranks] {
    for (const RemoteWorker* r : ranks) {
      if (!r->alive()) return false;
    }
    return true;
  };
  std::atomic<bool> ranks_ready{false};
  for (size_t r = 0; r < addresses.size(); ++r) {
    RemoteWorkerOptions rank_options = remote_options;
    rank_options.label = std::to_string(r);
    rank_options.on_alive_change = [&api_ready, &ranks_ready, &all_alive](bool) {
      if (!ranks_ready.load()) return;
      if (OpenAiService* api = api_ready.load()) api->set_ready(all_alive());
    };
    std::fprintf(stderr, "lazykv coordinator: connecting to worker %s\n", addresses[r].c_str());
    owned_ranks.push_back(std::make_unique<RemoteWorker>(addresses[r], rank_options));
    ranks.push_back(owned_ranks.back().get());
  }
  ranks_ready = true;
  std::unique_ptr<TensorParallelWorker> group;
  StepExecutor* executor = ranks[0];
  if (ranks.size() > 1) {
    std::vector<TensorParallelRank> members;
    std::vector<GroupRank> group_ranks;
    for (auto& r : owned_ranks) {
      RemoteWorker* raw = r.get();
      group_ranks.push_back({raw->channel(), "worker " + raw->address()});
      members.push_back({std::move(r), "worker " + raw->address(), [raw] { return raw->instance_id(); }});
    }
    const auto tp_timeout = millis_flag(flags, "tp-timeout", 1000);
    auto form = [group_ranks, tp_timeout] {
      std::fprintf(stderr, "lazykv coordinator: forming the tensor-parallel group of %zu ranks\n", group_ranks.size());
      std::vector<uint64_t> instances = form_tensor_parallel_group(group_ranks, tp_timeout);
      std::fprintf(stderr, "lazykv coordinator: the tensor-parallel group formed\n");
      return instances;
    };
    group = std::make_unique<TensorParallelWorker>(std::move(members), form);
    executor = group.get();
  } else if (ranks[0]->info().world != 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "worker " + ranks[0]->address() + " is rank " + std::to_string(ranks[0]->info().rank) + " of " +
                    std::to_string(ranks[0]->info().world) + ": give the coordinator one --worker per rank, in rank order");
  }
  // Stops the heartbeat callbacks' readiness updates before the ranks go away.
  struct StopReadyUpdates {
    std::atomic<bool>& flag;
    ~StopReadyUpdates() { flag = false; }
  } stop_ready_updates{ranks_ready};
  if (executor->info().n_vocab != tokenizer->n_vocab()) {
    throw Error(ErrorCode::kInvalidArgument,
                "worker " + ranks[0]->address() + " samples from " + std::to_string(executor->info().n_vocab) +
                    " tokens but --model's tokenizer has " + std::to_string(tokenizer->n_vocab()) +
                    ": start the worker and the coordinator with the same --model");
  }
  std::string worker_names;
  for (const RemoteWorker* r : ranks) worker_names += (worker_names.empty() ? "" : ", ") + r->address();

  SchedulerOptions scheduler_options = scheduler_options_from_flags(flags);
  scheduler_options.worker_label = remote_options.label;
  Scheduler scheduler(*executor, *tokenizer, registry, scheduler_options);
  ServeOptions options;
  options.role = "coordinator";
  options.detail = "kv policy " + service.default_policy.to_string() +
                   (ranks.size() > 1 ? ", tensor-parallel workers " : ", worker ") + worker_names;
  options.live_api = &api_ready;
  options.ready = all_alive();
  return serve_until_signal(flags, signals, *tokenizer, scheduler, registry, service, options);
}

}  // namespace lazykv
