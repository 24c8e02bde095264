// lazykv coordinator: the OpenAI-compatible HTTP API, tokenizer and
// continuous-batching scheduler, with the model running in a separate
// `lazykv worker` process reached over gRPC. The same serving stack as
// `lazykv serve`; only the StepExecutor is remote. Serves until SIGTERM or
// SIGINT, then drains like serve.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "cli/serving.h"
#include "common/error.h"
#include "common/model_registry.h"
#include "coordinator/worker_client/remote_worker.h"
#include "worker/format/gguf.h"

namespace lazykv {
namespace {

// Only the tokenizer (and chat template): the coordinator never runs the model,
// so its weights are not loaded.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (std::filesystem::is_directory(path)) {
    return std::make_unique<Tokenizer>(Tokenizer::spec_from_hf_json(path + "/tokenizer.json"));
  }
  const GgufFile gguf = GgufFile::open(path);
  return std::make_unique<Tokenizer>(tokenizer_spec_from_gguf(gguf));
}

std::chrono::milliseconds millis_flag(const Flags& flags, const std::string& name, double scale) {
  const double value = flags.get_double(name) * scale;
  if (!(value > 0)) throw Error(ErrorCode::kInvalidArgument, "--" + name + " must be > 0");
  return std::chrono::milliseconds(int64_t(value));
}

}  // namespace

int run_coordinator(const std::vector<std::string>& args) {
  Flags flags("coordinator");
  flags.add("model", "default", "the model the worker serves (its tokenizer and chat template are read here)")
      .add("worker", "127.0.0.1:7001", "HOST:PORT of the `lazykv worker` to run steps on")
      .add("connect-timeout", "60", "seconds to wait for the worker at start")
      .add("step-timeout", "120", "seconds one step may take on the worker before it counts as failed")
      .add("heartbeat-interval-ms", "1000", "milliseconds between heartbeats to the worker")
      .add("heartbeat-misses", "3", "missed heartbeats in a row before the worker is declared dead");
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
  remote_options.on_alive_change = [&api_ready](bool alive) {
    if (OpenAiService* api = api_ready.load()) api->set_ready(alive);
  };
  std::fprintf(stderr, "lazykv coordinator: connecting to worker %s\n", flags.get("worker").c_str());
  RemoteWorker worker(flags.get("worker"), remote_options);
  if (worker.info().n_vocab != tokenizer->n_vocab()) {
    throw Error(ErrorCode::kInvalidArgument,
                "worker " + worker.address() + " samples from " + std::to_string(worker.info().n_vocab) +
                    " tokens but --model's tokenizer has " + std::to_string(tokenizer->n_vocab()) +
                    ": start the worker and the coordinator with the same --model");
  }

  SchedulerOptions scheduler_options = scheduler_options_from_flags(flags);
  scheduler_options.worker_label = remote_options.label;
  Scheduler scheduler(worker, *tokenizer, registry, scheduler_options);
  ServeOptions options;
  options.role = "coordinator";
  options.detail = "kv policy " + service.default_policy.to_string() + ", worker " + worker.address();
  options.live_api = &api_ready;
  options.ready = worker.alive();
  return serve_until_signal(flags, signals, *tokenizer, scheduler, registry, service, options);
}

}  // namespace lazykv
